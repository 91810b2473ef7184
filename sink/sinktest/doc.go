// Package sinktest gives tests a real Postgres: a pool and a fresh schema
// per test, migrated for sink (and whatever else the test names), dropped
// at cleanup.
//
// The database is named by ONCEFLOW_TEST_POSTGRES_DSN. When it is unset the
// test is skipped — unless CI is set, where a missing database fails the
// test, so a CI run can never pass by skipping.
package sinktest
