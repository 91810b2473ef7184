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
// blocks the rows behind it. A row its Kafka client still holds when the
// timeout runs out (a broker that went silent) stays the relay's, its
// lease renewed, until the client delivers or gives it up. Several relays
// may run at once; each renews and releases only the leases it holds. A
// relay that dies between producing and marking, cannot reach Postgres
// to renew a lease, or holds a row for longer than a few leases leaves
// it to another relay once the lease runs out, which publishes it again;
// the consumer side (package sink) absorbs that duplicate. Run [Migrate]
// before a relay of a new version starts: its statements use the columns
// the migrations add. The records are built by package wire.
package outbox
