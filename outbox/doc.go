// Package outbox is the producer side of onceflow, the first step of the
// flow and the first of its two idempotency layers: events enter the
// outbox table with the business change they announce, and relays publish
// them to Kafka.
//
// [Store.Enqueue] takes an event id (a client's Idempotency-Key) and, in
// one transaction, inserts the event's outbox row (event_id unique, ON
// CONFLICT DO NOTHING) and runs the caller's business write: a client that
// retries with the same key creates nothing new. The outbox knows nothing
// of the business; the seed's API passes the order insert.
//
// [Relay] publishes pending outbox rows without holding a transaction or a
// row lock while it produces: it claims rows with a lease (committed),
// produces them within a timeout, then marks them. A row the broker
// refuses (too large, invalid) is marked failed with the reason and never
// blocks the rows behind it. Several relays may run at once. A relay that
// dies between producing and marking leaves its rows leased; after the
// lease another relay publishes them again, and the consumer side (package
// sink) absorbs that duplicate. The records are built by package wire.
package outbox
