// Package wire is the record format both sides of onceflow agree on: the
// producer side (package outbox, the demo, the benchmark, a user's own
// producer) builds records with [NewRecord], and the consumer side
// (package processor) decodes them. It is the first step of the flow, the
// shape of an event on the broker:
//
//   - the value is the event's JSON payload;
//   - the event id, a UUID, is the [HeaderEventID] header and the key, so
//     every redelivery of an event lands on the same partition;
//   - trace context travels in the headers, through [RecordCarrier].
//
// It imports neither side.
package wire
