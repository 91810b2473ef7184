// Package bench load-benchmarks a pipeline's own handlers, as `onceflow
// bench` runs them: a generated stream of the user's payloads is consumed
// by a consumer group of package pipeline members — the pipeline `onceflow
// run` is — while the group keeps still (steady), rebalances (storm) or
// re-reads half of the topic (replay), and the same unique events are
// written by the handlers directly (the effects-only and raw-copy
// baselines), so that each scenario's events/s is given with its ratio to
// both: 1 − steady/effects-only is the price of exactly-once.
//
// The steps, in the order a run takes them:
//
//   - payloads: a sample of JSON lines ([ParseSample]) or a template
//     ([ParseTemplate]); [Generate] makes the stream: unique events with
//     ids, and a share of redeliveries (same id, payload and timestamp),
//     some on another partition than the first delivery;
//   - isolation ([Isolate]): every run writes in a schema of its own,
//     created from the definitions of the tables the handlers write
//     (CREATE TABLE … (LIKE … INCLUDING ALL)) and first on the handlers'
//     search_path, with onceflow's own tables beside them; when the
//     handlers' writes cannot be redirected there, the benchmark refuses
//     and names the tables; a read-only probe of each SQL handler's
//     statement, and in every transaction a guard of the user's tables
//     ([WroteError]), stop what reaches them by another path (a view, a
//     function, an operator, a policy). The user's tables are never
//     written (a write is rolled back and ends the benchmark); a
//     sequence of the user's moved on a path the probe did not take is
//     named, not undone;
//   - the baselines' writers: the fastest of the pool's count, its half,
//     …, one, each timed over the stream's first events
//     ([CalibrationEvents]), unless [Config.BaselineWriters] sets them;
//   - the baselines and the scenarios ([Run]), each checked from the
//     tables: every handler claimed every unique event once, no dead
//     letter, and the written tables hold what the effects-only baseline
//     wrote (the same rows, counted and digested, or, for rows that
//     depend on the delivery applied, the same sums and distinct values;
//     [CheckDigest], [CheckSums]);
//   - what each run measures beside its rate: its committed batches'
//     latency, this process's peak RSS, the checkpoints the server began
//     during it (with [Config.Checkpoint], each run starts right after
//     one); a storm, defined by its membership changes
//     ([Config.StormChanges]: joins, leaves, kills), each change's
//     recovery time and the partitions' waits with no owner; a
//     replay's time back at rate after its re-read starts; the
//     scenarios under several group protocols side by side
//     ([Config.GroupProtocols]) and static members ([Config.InstanceID]);
//     the scenarios again with the payloads in Avro or Protobuf, framed
//     for a schema registry ([Config.Formats]);
//     a CPU profile of one run ([Config.CPUProfile]);
//   - the report ([Results]): a table, results.json and results.md, and
//     the difference with an earlier results.json ([Compare]).
//
// The project's own benchmark is this package on the demo's configs
// (benchmarks/demo.yaml, benchmarks/demo-4handlers.yaml) and the seed's
// orders (benchmarks/orders.jsonl): `make bench-full`.
package bench
