// Package metrics is what the flow measures, in Prometheus form: records
// consumed, (event, handler) pairs applied and skipped by layer, dead
// letters, batch sizes and durations, rebalances, per-partition lag, time
// lag, committed offset and retrying, the member's readiness checks, and
// the dedup LRU, summed over every consumer of the process. It reads the
// counters processor and dedup keep; it changes nothing in the flow. The
// alert rules in deploy/prometheus and the dashboard in deploy/grafana
// read these series.
package metrics
