package sinktest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/migrate"
	"github.com/onceflow/onceflow/sink"
)

// EnvDSN is the environment variable holding the test database's DSN.
const EnvDSN = "ONCEFLOW_TEST_POSTGRES_DSN"

// DSN returns the test database's DSN, skipping the test when there is none
// (failing it when CI is set).
func DSN(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv(EnvDSN)
	if dsn == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not set and CI is: the integration tests need Postgres (run infra/postgres.sh)", EnvDSN)
		}
		t.Skipf("%s not set: skipping a test that needs Postgres", EnvDSN)
	}
	return dsn
}

// Pool returns a pool on the test database, closed at cleanup. It fails the
// test if Postgres does not answer.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, DSN(t))
	if err != nil {
		t.Fatalf("connect to test Postgres: %v", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		t.Fatalf("ping test Postgres: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// SizedPool returns a pool of at most size connections on the test
// database, closed at cleanup: a test that takes them all sees a busy
// pool.
func SizedPool(t testing.TB, size int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = size
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// ModeDSN returns the test database's DSN with its default_query_exec_mode
// set to mode: cache_statement, cache_describe, describe_exec, exec or
// simple_protocol. Behind a transaction pooler a DSN sets exec or
// simple_protocol, where parameters are sent as text and a Go type with no
// text encoding (an array of [16]byte, say) fails.
func ModeDSN(t testing.TB, mode string) string {
	t.Helper()
	dsn := DSN(t)
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	return dsn + sep + "default_query_exec_mode=" + mode
}

// ModePool returns a pool on ModeDSN(t, mode), closed at cleanup.
func ModePool(t testing.TB, mode string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), ModeDSN(t, mode))
	if err != nil {
		t.Fatalf("connect to test Postgres in mode %s: %v", mode, err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Schema creates a uniquely named schema with sink's tables and those of
// every migration in also (for example orders.Migrate, outbox.Migrate), and
// drops it at cleanup unless the test failed and ONCEFLOW_TEST_KEEP_SCHEMA
// is set (to inspect it).
func Schema(t testing.TB, pool *pgxpool.Pool, also ...migrate.Func) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "test_" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, m := range append([]migrate.Func{sink.Migrate}, also...) {
		if err := m(ctx, pool, schema); err != nil {
			t.Fatalf("migrate schema %s: %v", schema, err)
		}
	}
	t.Cleanup(func() {
		if t.Failed() && os.Getenv("ONCEFLOW_TEST_KEEP_SCHEMA") != "" {
			t.Logf("kept schema %s", schema)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, `DROP SCHEMA `+pgx.Identifier{schema}.Sanitize()+` CASCADE`); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	return schema
}

// Count returns the result of a SELECT count(*) (or any single bigint) query.
func Count(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}
