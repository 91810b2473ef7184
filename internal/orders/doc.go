// Package orders is the demo business of onceflow, a plug-in like a
// user's: the seed article's four handlers of an order event
// {"user_id":1,"items":["A"]}. It is the last step of the flow, the
// business writes a batch's transaction makes for the events it claimed
// (and, on the producer side, the order row the seed's API writes next to
// its outbox row).
//
// None of the handlers' effects is idempotent by itself — a row per email
// with no unique key, counters that add — so an event applied twice shows
// in the tables. [Check] compares the tables with the effects a set of
// unique orders must have had, exactly once each; [Generate] makes such a
// set, with redeliveries.
package orders
