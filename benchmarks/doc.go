// Command benchmarks measures onceflow end to end: throughput while the
// consumer group rebalances and replays, against baselines on the same data
// and handlers, with a correctness check from the tables after every run.
//
//	go run ./benchmarks -short              # under 2 minutes; what make bench and CI run
//	go run ./benchmarks -rounds 3           # the full run behind the README's figures (make bench-full)
//	go run ./benchmarks -brokers 127.0.0.1:19092   # against a real Kafka instead of kfake
//
// Scenarios (the topic is pre-loaded with the seed's orders, duplicates
// included, then consumed by -members group members):
//
//   - steady: no membership change;
//   - storm: a storm is its membership changes, not its events: it makes
//     -storm-changes of them (12), one every -storm-every (a change due
//     while another runs starts when that one returns): a member joins, the
//     oldest leaves, and every third change kills the oldest and starts a
//     replacement. Its backlog is sized so that the stream outlasts the
//     changes: -events, or, when more, twice the changes' span at the steady
//     run's rate of the same protocol (steady runs first; 5 M events at
//     most). On the real broker 500 000 events once drained in 5 s, in
//     which a storm of one change every 2 s saw two. If the stream still
//     runs out before the last change, the run says so (storm_short, and
//     "the stream ran out first" in results.md). -crash kill (the default,
//     processor.Consumer.Kill) stops a member as SIGKILL would: no commit,
//     no leave, its partitions wait for the 3s session timeout; -crash
//     abort (processor.Consumer.Abort, the crash of results before
//     562cb71) rolls its transactions back and its client leaves the group
//     as it closes. Under -group-protocol consumer (KIP-848; classic by
//     default) the session timeout a killed member's partitions wait for
//     is the broker's group.consumer.session.timeout.ms (45s by default,
//     3s on infra/kafka.sh's broker and the embedded kfake). With
//     -instance-id the storm's members are static (kafka.instance_id
//     bench-member-N) and its crashes are restarts: the member is killed
//     and started again under its id at once; each restart's mark counts
//     the partitions the member ran (held) and how many of them another
//     member ran before the restart took them back (moved: 0 is static
//     membership working). A static member's leave keeps its partitions
//     for the session timeout. kfake never expires a static member that
//     left under the consumer protocol, so -instance-id with consumer
//     needs -brokers;
//   - replay: half-way, the group is stopped, its Kafka and Postgres
//     offsets are rewound to the start, and it runs again: every record
//     is read twice, and the second pass must apply nothing.
//
// -group-protocol classic,consumer runs the scenarios under each protocol
// in turn, round by round, in one results file: the runs are named
// steady-classic, storm-consumer..., and results.md has a table of the
// protocols side by side (results.json "protocols"): each scenario's
// median rate and its ratio to steady; the storm's changes by kind and
// its median recovery after a change (over the rounds); how long
// partitions waited with no owner (a worker stopped on one member until
// one started on any member, polled every 20 ms: the storm's, and the
// replay's, which include its stop and rewind); the replay's recovery
// from its restart (the time from the group's start after the rewind
// until the applied rate is back at 90 % of the rate before the stop,
// median over the rounds); with -instance-id, the partitions moved.
//
//	go run ./benchmarks -brokers 127.0.0.1:19092 -group-protocol classic,consumer -rounds 3 -events 300000 \
//	    -storm-every 1s -storm-changes 12 -baselines=false -out benchmarks/results/protocols
//
// Baselines: raw-copy (what Postgres can write for the same effects by the
// cheapest path: the unique events' processed_events and emails_sent rows
// by binary COPY, the counters by set-based upserts, no dedup, no Kafka,
// no offsets; every scenario's ratio to it is in results.json "ratios"),
// ceiling (the same rows written by sink.Writer with no Kafka),
// per-record transactions with dedup (the pipeline with one-record
// batches) and a naive per-record consumer (each handler's write
// autocommitted, no dedup: at-least-once, so duplicates double effects).
//
// Each run starts right after a CHECKPOINT (when the role may: it needs
// pg_checkpoint), so that runs writing the same WAL meet the server's
// checkpoints at the same places; the checkpoints begun during a run are
// reported. -rounds N runs the scenarios, raw-copy and ceiling N times,
// round by round, and reports each one's median run with every round's
// rate (rates move 10–20 % between identical runs on a small machine).
//
// Output, in -out: results.json, results.md, and throughput-<scenario>.png
// (unique events applied per second over time, membership changes marked).
//
// # Where a batch's time goes
//
// -spans traces the members in this process with an OpenTelemetry SDK
// TracerProvider that exports nothing: a SpanProcessor keeps each ended
// span's duration by name (the processor's onceflow.batch, sink's
// dedup.claim, "handler <name>", sink.offset_cas, sink.commit, and every
// pgx call through otelpgx, named "query INSERT emails_sent", "batch
// query SELECT pg_advisory_xact_lock_shared", "pool.acquire"...). Each
// scenario's results.json run then has span_stats (count, mean, p50, p95,
// total, and the total per batch), cpu (this process's CPU time, the
// run's Postgres backends', the server's background processes', the
// broker's with -broker-pid, and the machine's), pg_tables
// (pg_stat_user_tables and pg_statio_user_tables of the run's schema) and
// wal (pg_stat_wal, the whole cluster's); results.md has them as tables.
// -cpuprofile writes a CPU profile of this process during the scenario
// -cpuprofile-of names (steady by default; replay-reread: only the
// replay's re-read of the half it had applied). benchmarks/PROFILE.md is
// what they showed.
//
//	go run ./benchmarks -events 200000 -scenarios steady -baselines=false -spans -cpuprofile cpu.prof
//	go run ./benchmarks -brokers 127.0.0.1:19092 -scenarios replay -baselines=false -cpuprofile reread.prof -cpuprofile-of replay-reread
//
// # Backlog and sustained runs
//
// `benchmarks backlog` measures the built binary as a user runs it: one
// `onceflow run` process (go build ./cmd/onceflow, or -bin), default
// settings unless -member-env says otherwise, draining a backlog that was
// produced before it started (franz-go producer, -records records with
// -duplicates redeliveries, -partitions partitions, snappy batches). With
// -prefill N, processed_events first gets N rows (and emails_sent one row
// per event) generated in Postgres, indexed after the insert and
// vacuumed: the state of a pipeline that has run for a while. Every
// -sample (1 s) it records the records committed (sum of
// sink_offsets.next_offset), the pairs applied and records consumed (the
// member's /metrics), the sizes of processed_events' heap and indexes
// and of emails_sent, and the member's VmRSS; VmHWM once the last record
// is committed. Then orders.Check (through views that leave the pre-fill
// out), then raw-copy on the same tables: fresh events by binary COPY, as
// the main benchmark's raw-copy writes them. The rate against table size
// is given per span of equal table growth, between the first applied
// batch and the first partition done (start-up and tail left out);
// -reference names the results.json of an earlier run (the empty-table
// one) whose median span rate this run's is compared with.
//
//	# memory: onceflow run's peak RSS on a 5-million-record backlog, real broker (make bench-backlog)
//	go run ./benchmarks backlog -brokers 127.0.0.1:19092 -records 5000000 -raw-copy=false -out benchmarks/out/backlog-rss
//	# the same with the knobs turned down
//	go run ./benchmarks backlog -brokers 127.0.0.1:19092 -records 5000000 -raw-copy=false -out benchmarks/out/backlog-rss-limited \
//	    -member-env GOMEMLIMIT=160MiB -member-env ONCEFLOW_KAFKA_FETCH_MAX_BYTES=4194304
//
//	# sustained: the empty-table reference, then 10 M and 50 M dedup rows (make bench-sustained PREFILL=...),
//	# on the cluster sized for them (infra/postgres-bench.sh: shared_buffers 6GB, checkpoints 15 min apart)
//	DSN=$(infra/postgres-bench.sh start)
//	go run ./benchmarks backlog -brokers 127.0.0.1:19092 -dsn "$DSN" -records 2000000 -prefill 0        -out benchmarks/out/sustained-0
//	go run ./benchmarks backlog -brokers 127.0.0.1:19092 -dsn "$DSN" -records 2000000 -prefill 50000000 -out benchmarks/out/sustained-50000000 \
//	    -reference benchmarks/out/sustained-0/results.json
//	# the pre-fill as an older dedup slice (dedup.retention_slices > 1): claims write a new, small slice and probe it
//	go run ./benchmarks backlog -brokers 127.0.0.1:19092 -dsn "$DSN" -records 2000000 -prefill 50000000 -prefill-older -out benchmarks/out/sustained-50000000-older \
//	    -reference benchmarks/out/sustained-0/results.json
//	# how much time-ordered ids help
//	go run ./benchmarks backlog -brokers 127.0.0.1:19092 -dsn "$DSN" -records 2000000 -prefill 50000000 -ids v7 -out benchmarks/out/sustained-50000000-v7
//
// Before the run the pre-fill's indexes are read into shared_buffers
// (-prefill-warm, on by default): a pipeline that has run a while has the
// pages its claims touch cached, and a run on a cold cache measures the
// warm-up (on 50 M rows, its first minute ran at a quarter of the
// empty-table rate, still climbing).
//
// Output, in -out: results.json (every sample), results.md (the run, the
// rate-by-size table, the raw copy, the Postgres settings the figures
// depend on: shared_buffers, effective_cache_size...), rate-by-size.png,
// rss.png and member.log (the binary is built in a temporary
// directory and removed). A 50 M pre-fill needs about 15 GB
// of disk for processed_events and emails_sent with their indexes, plus
// WAL, and the harness
// holds the generated backlog's events in memory (about 1 GB at 5 M
// records) for the check. CHECKPOINT after the pre-fill needs a superuser
// or pg_checkpoint; without it the next checkpoint writes the pre-fill
// during the run (the harness says so). -keep leaves the schema and the
// topic in place.
package main
