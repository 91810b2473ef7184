// Command benchmarks measures onceflow end to end: throughput while the
// consumer group rebalances and replays, against baselines on the same data
// and handlers, with a correctness check from the tables after every run.
//
//	go run ./benchmarks -short              # under 2 minutes; what make bench and CI run
//	go run ./benchmarks                     # the full run behind the README's figures
//	go run ./benchmarks -brokers 127.0.0.1:19092   # against a real Kafka instead of kfake
//
// Scenarios (the topic is pre-loaded with the seed's orders, duplicates
// included, then consumed by -members group members):
//
//   - steady: no membership change;
//   - storm: every -storm-every a member joins or leaves, and every third
//     change kills one hard (no commit: processor.Consumer.Abort);
//   - replay: half-way, the group is stopped, its Kafka and Postgres
//     offsets are rewound to the start, and it runs again: every record
//     is read twice, and the second pass must apply nothing.
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
// Output, in -out: results.json, results.md, and throughput-<scenario>.png
// (unique events applied per second over time, membership changes marked).
package main
