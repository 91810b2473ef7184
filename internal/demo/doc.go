// Package demo is onceflow's demo, end to end: it publishes the seed's
// orders with redeliveries to an embedded Kafka, runs a consumer group
// through the whole flow (processor, dedup, sink, the orders business)
// while members join, leave and crash (package members), replays part of
// the stream, and checks from the tables that every effect happened
// exactly once (orders.Check).
package demo
