// Package migrate applies the SQL migrations that packages owning tables
// embed: sink (processed_events, sink_offsets, dead_letters), outbox, and a
// business such as the demo's orders. It is set-up, before the flow: every
// component's tables exist before the first event is enqueued or consumed.
//
// Applied versions are recorded per component in the schema's
// schema_migrations table; an advisory lock of the schema lets several
// processes migrate one schema at once, and migrations of other schemas in
// the database do not wait for them.
package migrate
