// Package outbox is the producer side of onceflow: the first of the two
// idempotency layers.
//
// [Store.Enqueue] takes a client's Idempotency-Key as the event id and, in
// one transaction, inserts the order and its outbox row (event_id unique,
// ON CONFLICT DO NOTHING): a client that retries with the same key creates
// nothing new and gets the same answer. [Relay] publishes unpublished outbox
// rows to Kafka and marks them published; several relays may run at once
// (FOR UPDATE SKIP LOCKED). A relay that dies between publishing and
// marking publishes those rows again — the consumer side (package sink)
// absorbs that duplicate.
package outbox
