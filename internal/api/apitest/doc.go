// Package apitest calls onceflow's HTTP API (package api) from tests: the
// seed's endpoints answer JSON, which Client decodes.
package apitest
