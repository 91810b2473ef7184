// Command onceflow turns Kafka's at-least-once delivery into effectively-once
// effects in PostgreSQL. See README.md; `onceflow help` lists the commands.
//
// It is the wiring of the flow and nothing more: flags and the environment
// become a config.Config, which becomes each step's own config — outbox
// (producer side), pipeline (the consumer side assembled: processor,
// dedup, sink), the handlers (a registry by name, where the demo business,
// package orders, is registered like any other), api (HTTP), metrics —
// and the OpenTelemetry SDK is set up here, the only place that imports
// it. `onceflow run` is pipeline.Runner plus the HTTP server and signals.
// The demo and its members live in packages demo and members.
package main
