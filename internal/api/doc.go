// Package api is onceflow's HTTP surface: the seed's endpoints, where
// events enter the flow (POST /events-outbox/{bus} writes an order and its
// outbox row), where an event's path through every step is audited
// (GET /audit/event/{id}; 404 for an id onceflow has no record of) and
// where a broker redelivery is simulated
// (POST /demo/replay-event/{id}); plus /healthz, /readyz and /metrics.
//
// It needs Postgres (a pool and an outbox.Store) but not Kafka: the replay
// endpoint publishes through a [Publisher], which *outbox.Relay
// implements. [Start] runs a server and owns its goroutine until Stop.
package api
