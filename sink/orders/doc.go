// Package orders is the demo business of onceflow: the seed article's four
// handlers of an order event {"user_id":1,"items":["A"]}.
//
// None of their effects is idempotent by itself — a row per email with no
// unique key, counters that add — so an event applied twice shows in the
// tables. [Check] compares the tables with the effects a set of unique
// orders must have had, exactly once each.
package orders
