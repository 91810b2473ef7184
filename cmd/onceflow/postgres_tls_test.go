package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/wire"
)

// EnvPostgresTLS names the DSN of a Postgres that accepts TCP connections
// only over TLS, with sslmode=verify-full and sslrootcert
// (infra/postgres-tls.sh dsn). With CI set it must be.
const EnvPostgresTLS = "ONCEFLOW_TEST_POSTGRES_TLS_DSN"

func postgresTLS(t *testing.T) (dsn string, pool *pgxpool.Pool) {
	t.Helper()
	dsn = os.Getenv(EnvPostgresTLS)
	if dsn == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not set and CI is: the suite must reach Postgres over TLS (infra/postgres-tls.sh start)", EnvPostgresTLS)
		}
		t.Skipf("%s not set: skipping a test that needs Postgres with ssl=on", EnvPostgresTLS)
	}
	pool, err := pgxpool.New(t.Context(), dsn)
	if err == nil {
		err = pool.Ping(t.Context())
	}
	if err != nil {
		t.Fatalf("Postgres over TLS: %v", err)
	}
	t.Cleanup(pool.Close)
	return dsn, pool
}

// withParam returns dsn with a query parameter set.
func withParam(t *testing.T, dsn, key, value string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set(key, value)
	u.RawQuery = q.Encode()
	return u.String()
}

// `onceflow run` reaches Postgres with sslmode=verify-full, the DSN read
// from postgres.dsn_file, and applies what it consumes there; every
// connection it made is encrypted (the server refuses others).
func TestRunWithPostgresTLS(t *testing.T) {
	dsn, pool := postgresTLS(t)
	schema := freshSchema(t, pool, "test_pgtls_run_")
	var ssl bool
	if err := pool.QueryRow(t.Context(), `SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).Scan(&ssl); err != nil || !ssl {
		t.Fatalf("the test's own connection: ssl = %v, err = %v", ssl, err)
	}

	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "orders"), kfake.SeedTopics(1, "orders.dlq"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	stream, err := orders.Generate(200, 0.3, 5)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	recs := make([]*kgo.Record, len(stream.Messages))
	for i, m := range stream.Messages {
		recs[i] = wire.NewRecord("orders", m.ID, m.Value)
	}
	if err := cl.ProduceSync(t.Context(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cl.Close()

	dsnFile := filepath.Join(t.TempDir(), "dsn")
	if err := os.WriteFile(dsnFile, []byte(dsn+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	file := writeConfig(t, fmt.Sprintf("kafka:\n  brokers: [%s]\n  group: pgtls-run\npostgres:\n  dsn_file: %s\n  schema: %s\nhttp:\n  addr: 127.0.0.1:0\nlog:\n  level: warn\n",
		c.ListenAddrs()[0], dsnFile, schema))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		root := newRoot()
		root.SetOut(io.Discard)
		root.SetErr(io.Discard)
		root.SetArgs([]string{"run", "--config", file})
		done <- root.ExecuteContext(ctx)
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		var n int64
		_ = pool.QueryRow(t.Context(), `SELECT coalesce(sum(next_offset), 0)::bigint FROM `+schema+`.sink_offsets`).Scan(&n)
		if n >= int64(len(recs)) {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("run returned early: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("run committed %d of %d records in 60s", n, len(recs))
		}
		time.Sleep(50 * time.Millisecond)
	}
	var plain int64
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
		WHERE a.datname = current_database() AND a.client_addr IS NOT NULL AND NOT s.ssl`).Scan(&plain); err != nil {
		t.Fatal(err)
	}
	if plain != 0 {
		t.Errorf("%d connections without TLS", plain)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run after cancel: %v", err)
	}
	rep, err := orders.Check(t.Context(), pool, schema, stream.Unique)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.ExactlyOnce() {
		t.Errorf("effects not exactly once: %v", rep.Problems)
	}
}

// Without the right CA, or without TLS, the
// commands fail at once with an error that says what to check, and never
// show the password.
func TestPostgresTLSFailuresAreClear(t *testing.T) {
	dsn, _ := postgresTLS(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	// The password does not matter before TLS succeeds: a distinctive one
	// shows whether an error reveals it.
	u.User = url.UserPassword(u.User.Username(), "pw-s3cret-tls")
	secretDSN := u.String()
	for _, tc := range []struct {
		name, dsn string
		want      []string
	}{
		{name: "another CA", dsn: withParam(t, secretDSN, "sslrootcert", writeOtherCA(t)),
			want: []string{"TLS: the server's certificate is not trusted (check sslrootcert and the host in", "x509"}},
		{name: "system roots", dsn: withParam(t, secretDSN, "sslrootcert", "system"),
			want: []string{"TLS: the server's certificate is not trusted"}},
		{name: "no TLS", dsn: withParam(t, secretDSN, "sslmode", "disable"),
			want: []string{"no encryption"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, cmd := range [][]string{{"migrate"}, {"run", "--brokers", "127.0.0.1:1", "--http-addr", ""}} {
				ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
				root := newRoot()
				root.SetOut(io.Discard)
				root.SetErr(io.Discard)
				root.SetArgs(append(cmd, "--dsn", tc.dsn, "--schema", "test_pgtls_fail"))
				err := root.ExecuteContext(ctx)
				waited := ctx.Err() != nil
				cancel()
				switch {
				case waited:
					t.Fatalf("%s waited instead of failing: %v", cmd[0], err)
				case err == nil:
					t.Fatalf("%s: no error", cmd[0])
				}
				for _, w := range tc.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("%s: %v\nwant it to contain %q", cmd[0], err, w)
					}
				}
				if strings.Contains(err.Error(), "pw-s3cret-tls") {
					t.Errorf("%s: the error reveals the password: %v", cmd[0], err)
				}
			}
		})
	}
}
