// Package config is onceflow's one configuration, set up before the flow
// starts: a Config loaded by Load from, in rising precedence, defaults
// (some of them the program's, such as the handlers it registers), a YAML
// file, ONCEFLOW_* environment variables and command-line flags, then
// validated with every problem named by its key. Only package main imports
// it; the flow's packages take plain structs built from it.
package config
