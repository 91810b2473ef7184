// Command benchmarks runs onceflow's experiments: measurements that are
// not the scenario benchmark. The scenario benchmark — the seed's orders
// consumed under steady, storm and replay, against the effects-only and
// raw-copy baselines, every run checked exactly once from the tables —
// is `onceflow bench` (package bench) on the demo's configs, the same
// command users run on theirs:
//
//	make build
//	bin/onceflow bench --config benchmarks/demo.yaml --sample benchmarks/orders.jsonl   # emailHandler
//	bin/onceflow bench --config benchmarks/demo-4handlers.yaml --sample benchmarks/orders.jsonl   # the four
//
// (make bench runs it short; make bench-full is the README's figures).
// benchmarks/orders.jsonl is the seed's orders, as internal/orders
// generates them (TestDemoSampleIsTheSeedsOrders keeps them so).
//
//	go run ./benchmarks backlog [flags]     # one onceflow run process draining a backlog (make bench-backlog, make bench-sustained)
//	go run ./benchmarks retention [flags]   # processed_events under dedup.retention (make bench-retention)
//
// Why these are experiments and not scenarios of onceflow bench: they
// measure onceflow itself, not a user's handlers, in ways a benchmark of
// the user's config cannot. backlog runs the built binary as a separate
// process, from outside (its /metrics, its /proc status: the peak RSS of
// one member, which an in-process group of members cannot give), on a
// backlog produced before it starts; with -prefill (the "sustained"
// runs) it writes tens of millions of rows straight into onceflow's
// dedup layout and the demo's emails_sent first — hours of a machine,
// gigabytes of disk, and knowledge of the demo's tables. retention writes
// through sink.Writer with no Kafka at a horizon of seconds, to watch
// processed_events' slices being dropped: a property of onceflow's dedup
// table, the same whatever the handlers.
//
// Results produced by the program this command was before (go run
// ./benchmarks -rounds 5 ..., its scenario runner since replaced by
// onceflow bench) keep that command in their results.md: they are
// history, indexed in benchmarks/HISTORY.md.
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
// out), then a raw copy on the same tables: fresh events by binary COPY
// (rawCopyOn), the reference on large tables. The rate against table size
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
