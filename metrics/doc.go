// Package metrics is what the flow measures, in Prometheus form: records
// consumed, (event, handler) pairs applied and skipped by layer, dead
// letters, batch sizes and durations, rebalances, per-partition lag, time
// lag, committed offset and retrying, the member's readiness checks and
// the dedup LRU, summed over every consumer of the process; and the
// Postgres side: the pools' saturation, the age of the oldest outbox row
// and dead letter not yet published, and the dedup retention's slices
// (overdue rotations and drops, held drops). It reads the counters
// processor and dedup keep and the state Postgres holds; it changes
// nothing in the flow. The alert rules in deploy/prometheus and the
// dashboard in deploy/grafana read these series.
package metrics
