// Package pipeline is onceflow's consumer side assembled, for a program
// that embeds it: from the records of Kafka topics to the effects of the
// program's handlers in PostgreSQL, exactly once each. It wires the steps
// of the flow the way `onceflow run` does — processor (the consumer-group
// member), dedup (the LRU fast path), sink (one transaction per partition
// batch, running the program's [sink.Handler]s) — with the defaults a
// service in production wants:
//
//   - onceflow's own tables (processed_events, sink_offsets,
//     dead_letters) are created or upgraded at start, then the handlers'
//     own (Config.Migrate);
//   - Postgres is waited for with capped backoff while it is down or
//     starting, saying so in the log; an error waiting cannot cure (a
//     wrong password, an unknown database, a failing migration) ends Run
//     at once;
//   - with Config.Retention set (onceflow run sets dedup.retention, a
//     week by default; the zero Config keeps claims forever), the dedup
//     state is kept to that horizon while Run consumes (dedup.Retention),
//     and a consumed topic that keeps records longer is warned about;
//   - records that cannot be decoded or applied become dead letters, in
//     the batch's transaction, copied to Config.DeadLetterTopic when set;
//   - the end of Run's context drains: in-flight batches finish within
//     the drain timeout, offsets are committed, the member leaves the
//     group; [Runner.Abort] stops at once without committing, as a crash
//     would;
//   - tracing through a TracerProvider (the OpenTelemetry API only; the
//     program owns the SDK), Prometheus metrics through a
//     [metrics.Metrics], logs through log/slog — each optional.
//
// The shortest program is a handler and [Run]:
//
//	ledger := sink.HandlerFunc("ledger", applyPayments)
//	err := pipeline.Run(ctx, pipeline.Config{
//		Brokers: []string{"127.0.0.1:9092"}, Topics: []string{"payments"}, Group: "ledger",
//		DSN: os.Getenv("DATABASE_URL"), Handlers: []sink.Handler{ledger},
//	})
//
// examples/customhandler in the repository is a complete program.
package pipeline
