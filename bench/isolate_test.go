package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// userDB makes a schema standing for the user's, first on the search_path
// of the pool returned, with a payments table holding one row; both are
// dropped at cleanup. It returns the pool, the schema and the DSN.
func userDB(t *testing.T) (*pgxpool.Pool, string, string) {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	schema := "benchuser_" + hex.EncodeToString(b)
	dsn := sinktest.DSN(t)
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	dsn += sep + "search_path=" + schema
	pool := sinktest.Pool(t)
	ctx := t.Context()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
	})
	up, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(up.Close)
	for _, q := range []string{
		`CREATE TABLE payments (event_id uuid, account text NOT NULL, amount numeric(12,2) CHECK (amount > 0), paid_at timestamptz)`,
		`CREATE INDEX ON payments (account)`,
		`INSERT INTO payments VALUES ('7f8a0000-0000-4000-8000-000000000001', 'acct-0', 1.00, now())`,
	} {
		if _, err := up.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return up, schema, dsn
}

const paymentsSQL = `INSERT INTO payments (event_id, account, amount, paid_at)
SELECT event_id, payload->>'account', (payload->>'amount')::numeric, "timestamp" FROM events`

// pacedPaymentsSQL is paymentsSQL taking at least 60 ms a batch: a
// partition applies at most BatchMaxRecords records in that time, so a
// stream lasts long enough for a storm's changes however fast the
// machine, and the rest of it cannot drain between two samples.
const pacedPaymentsSQL = `WITH pace AS (SELECT pg_sleep(0.06))
INSERT INTO payments (event_id, account, amount, paid_at)
SELECT event_id, payload->>'account', (payload->>'amount')::numeric, "timestamp" FROM events CROSS JOIN pace`

func sqlHandler(t *testing.T, name, sql string) *sink.SQLHandler {
	t.Helper()
	h, err := sink.NewSQLHandler(sink.SQLHandlerConfig{Name: name, SQL: sql})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// userRows is the user's payments table, as text.
func userRows(t *testing.T, pool *pgxpool.Pool, schema string) []string {
	t.Helper()
	rows, err := pool.Query(t.Context(), "SELECT t::text FROM "+pgx.Identifier{schema, "payments"}.Sanitize()+" t ORDER BY 1")
	if err != nil {
		t.Fatal(err)
	}
	rs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func TestIsolationWritesTheCloneNotTheUsersTable(t *testing.T) {
	up, userSchema, _ := userDB(t)
	ctx := t.Context()
	before := userRows(t, up, userSchema)
	h := sqlHandler(t, "payments", paymentsSQL)
	iso, err := Isolate(ctx, up, []sink.Handler{h}, nil)
	if err != nil {
		t.Fatalf("Isolate: %v", err)
	}
	if got, want := iso.Tables(), (pgx.Identifier{userSchema, "payments"}).Sanitize(); len(got) != 1 || got[0].Sanitize() != want {
		t.Fatalf("Tables() = %v, want [%s.payments]", got, userSchema)
	}
	schema := userSchema + "_bench"
	pool, err := iso.Create(ctx, schema, 2)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { _ = iso.Drop(context.Background(), schema) })
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	evs := []sink.Event{{ID: uuid.New(), Value: []byte(`{"account":"acct-1","amount":"12.50"}`), Timestamp: time.Now()},
		{ID: uuid.New(), Value: []byte(`{"account":"acct-2","amount":"7"}`), Timestamp: time.Now()}}
	if err := h.Apply(ctx, tx, evs); err != nil {
		t.Fatalf("Apply in the bench schema: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	pool.Close()
	var n int
	if err := up.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{schema, "payments"}.Sanitize()).Scan(&n); err != nil || n != 2 {
		t.Fatalf("bench schema's payments: %d rows (%v), want 2", n, err)
	}
	// The clone keeps the columns' constraints.
	var checks int
	if err := up.QueryRow(ctx, `SELECT count(*) FROM pg_constraint WHERE conrelid = $1::regclass AND contype = 'c'`,
		pgx.Identifier{schema, "payments"}.Sanitize()).Scan(&checks); err != nil || checks != 1 {
		t.Fatalf("the clone has %d check constraints (%v), want 1", checks, err)
	}
	if after := userRows(t, up, userSchema); strings.Join(after, "\n") != strings.Join(before, "\n") {
		t.Fatalf("the user's payments changed:\nbefore %v\nafter  %v", before, after)
	}
	for _, tbl := range []string{"processed_events", "sink_offsets", "dead_letters"} {
		var ok bool
		if err := up.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", pgx.Identifier{schema, tbl}.Sanitize()).Scan(&ok); err != nil || !ok {
			t.Fatalf("%s.%s missing (%v)", schema, tbl, err)
		}
	}
	if err := iso.Drop(ctx, schema); err != nil {
		t.Fatal(err)
	}
	var exists bool
	if err := up.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", schema).Scan(&exists); err != nil || exists {
		t.Fatalf("schema %s still exists after Drop (%v)", schema, err)
	}
}

func TestIsolationRefuses(t *testing.T) {
	tests := []struct {
		name  string
		setup []string // run in the user's schema
		sql   string
		want  []string // in the refusal
		// atCreate: refused by Create rather than Isolate.
		atCreate bool
	}{
		{name: "schema-qualified table", sql: `INSERT INTO %s.payments (event_id, account, amount) SELECT event_id, 'a', 1 FROM events`,
			want: []string{"handler h still writes %s.payments, outside the bench schema: a schema-qualified name"}, atCreate: true},
		{name: "trigger", setup: []string{
			`CREATE TABLE audit (at timestamptz)`,
			`CREATE FUNCTION audit_f() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN INSERT INTO audit VALUES (now()); RETURN NEW; END$$`,
			`CREATE TRIGGER pay_audit AFTER INSERT ON payments FOR EACH ROW EXECUTE FUNCTION audit_f()`},
			sql: paymentsSQL, want: []string{"%s.payments has trigger pay_audit"}},
		{name: "rule", setup: []string{`CREATE TABLE audit (at timestamptz)`,
			`CREATE RULE pay_rule AS ON INSERT TO payments DO INSTEAD INSERT INTO audit VALUES (now())`},
			// The plan shows audit, not payments: audit is cloned, payments
			// is not, and the statement still writes the user's audit.
			sql: paymentsSQL, want: []string{"handler h still writes %s.audit, outside the bench schema"}, atCreate: true},
		{name: "volatile function", setup: []string{
			`CREATE FUNCTION book(a text) RETURNS numeric LANGUAGE sql VOLATILE AS $$SELECT 1::numeric$$`},
			sql:  `INSERT INTO payments (event_id, account, amount) SELECT event_id, 'a', Book ('x') FROM events`,
			want: []string{"handler h calls %s.book(), a volatile function"}},
		{name: "two tables of one name", setup: []string{`CREATE SCHEMA %s_other`, `CREATE TABLE %s_other.payments (event_id uuid)`},
			sql: `WITH a AS (INSERT INTO payments (event_id, account, amount) SELECT event_id, 'a', 1 FROM events)
INSERT INTO %s_other.payments SELECT event_id FROM events`,
			want: []string{"%s_other.payments and %s.payments: two written tables of one name"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up, us, _ := userDB(t)
			ctx := t.Context()
			sub := func(s string) string { return strings.ReplaceAll(s, "%s", us) }
			for _, q := range tt.setup {
				if _, err := up.Exec(ctx, sub(q)); err != nil {
					t.Fatalf("%s: %v", sub(q), err)
				}
			}
			t.Cleanup(func() { _, _ = up.Exec(context.Background(), sub("DROP SCHEMA IF EXISTS %s_other CASCADE")) })
			before := userRows(t, up, us)
			iso, err := Isolate(ctx, up, []sink.Handler{sqlHandler(t, "h", sub(tt.sql))}, nil)
			if tt.atCreate {
				if err != nil {
					t.Fatalf("Isolate: %v", err)
				}
				_, err = iso.Create(ctx, us+"_bench", 1)
				var exists bool
				if qerr := up.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", us+"_bench").Scan(&exists); qerr != nil || exists {
					t.Fatalf("a refused Create left schema %s_bench (%v)", us, qerr)
				}
			}
			var re *RefusedError
			if !errors.As(err, &re) {
				t.Fatalf("err = %v, want a *RefusedError", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), sub(w)) {
					t.Fatalf("refusal:\n%v\nwant it to say %q", err, sub(w))
				}
			}
			if after := userRows(t, up, us); strings.Join(after, "\n") != strings.Join(before, "\n") {
				t.Fatalf("the user's payments changed: before %v after %v", before, after)
			}
		})
	}
}
