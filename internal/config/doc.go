// Package config is onceflow's one configuration, set up before the flow
// starts: a Config loaded by Load from, in rising precedence, defaults
// (some of them the program's, such as the handlers it registers), a YAML
// file, ONCEFLOW_* environment variables and command-line flags, then
// validated with every problem named by its key. Only package main imports
// it; the flow's packages take plain structs built from it.
//
// Secrets (kafka.sasl.password, postgres.dsn) may also come from files
// (kafka.sasl.password_file, postgres.dsn_file), which Load reads. A
// Config prints, logs and encodes itself with every secret redacted; the
// Kafka client options for kafka.tls and kafka.sasl are
// Kafka.ClientOptions (security.go).
package config
