package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/sink"
)

// indirectDB is userDB with the paths by which a statement that bench
// accepts statically reaches a write of the user's: audit (two rows)
// written by wr(), ref_seq (at 100) advanced by a view, and an operator,
// an aggregate, a cast and a STABLE function over wr(); audit dropped by
// dd() (DDL by EXECUTE) through a view. wr() and dd() write only where
// when allows it (a SQL condition; "true": always).
func indirectDB(t *testing.T, when string) (*pgxpool.Pool, string) {
	t.Helper()
	up, us, _ := userDB(t)
	for _, q := range []string{
		`CREATE TABLE audit (n int, note text)`,
		`INSERT INTO audit VALUES (1, 'mine'), (2, 'mine')`,
		`CREATE SEQUENCE ref_seq`,
		`SELECT setval('ref_seq', 100)`,
		fmt.Sprintf(`CREATE FUNCTION wr(a int, b int) RETURNS int LANGUAGE plpgsql VOLATILE AS $$
BEGIN IF %s THEN INSERT INTO %s.audit VALUES (a, 'bench'); END IF; RETURN a + b; END $$`, when, us),
		fmt.Sprintf(`CREATE FUNCTION nv() RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
BEGIN IF %s THEN RETURN nextval('%s.ref_seq'); END IF; RETURN 0; END $$`, when, us),
		fmt.Sprintf(`CREATE FUNCTION dd() RETURNS int LANGUAGE plpgsql VOLATILE AS $$
BEGIN IF %s THEN EXECUTE 'DROP TABLE %s.audit'; END IF; RETURN 0; END $$`, when, us),
		`CREATE VIEW volv AS SELECT wr(1, 1) AS x`,
		`CREATE VIEW ddlv AS SELECT dd() AS x`,
		`CREATE VIEW seqv AS SELECT nv() AS x`,
		`CREATE OPERATOR @+@ (LEFTARG = int, RIGHTARG = int, FUNCTION = wr)`,
		`CREATE AGGREGATE wsum(int) (SFUNC = wr, STYPE = int, INITCOND = '0')`,
		`CREATE TYPE m2 AS (v numeric)`,
		fmt.Sprintf(`CREATE FUNCTION to_m2(x numeric) RETURNS m2 LANGUAGE plpgsql VOLATILE AS $$
BEGIN PERFORM %s.wr(1, 0); RETURN ROW(x)::m2; END $$`, us),
		`CREATE CAST (numeric AS m2) WITH FUNCTION to_m2(numeric)`,
		`CREATE FUNCTION st2(x int) RETURNS int LANGUAGE plpgsql STABLE AS $$ BEGIN RETURN x @+@ 1; END $$`,
		// In a schema of its own, which snapshot does not read: reading
		// rates writes audit.
		fmt.Sprintf(`CREATE SCHEMA %s_rls`, us),
		fmt.Sprintf(`CREATE TABLE %s_rls.rates (k int)`, us),
		fmt.Sprintf(`INSERT INTO %s_rls.rates VALUES (1)`, us),
		fmt.Sprintf(`ALTER TABLE %s_rls.rates ENABLE ROW LEVEL SECURITY`, us),
		fmt.Sprintf(`ALTER TABLE %s_rls.rates FORCE ROW LEVEL SECURITY`, us),
		fmt.Sprintf(`CREATE POLICY rates_all ON %s_rls.rates USING (%s.wr(k, 0) > 0)`, us, us),
	} {
		if _, err := up.Exec(t.Context(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() { _, _ = up.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+us+"_rls CASCADE") })
	return up, us
}

// indirectSQL is sql of indirect for the user's schema us.
func indirectSQL(sql, us string) string { return strings.ReplaceAll(sql, "{{rls}}", us+"_rls") }

// indirect are the handlers' statements that reach wr() or nv() other
// than by calling them: what Isolate cannot see.
var indirect = []struct{ name, sql string }{
	{"view", `INSERT INTO payments (event_id, account, amount, paid_at) SELECT event_id, 'a' || v.x, 1, "timestamp" FROM events, volv v`},
	{"view-nextval", `INSERT INTO payments (event_id, account, amount, paid_at) SELECT event_id, 'a' || v.x, 1, "timestamp" FROM events, seqv v`},
	{"operator", `INSERT INTO payments (event_id, account, amount, paid_at) SELECT event_id, 'a' || (1 @+@ 1), 1, "timestamp" FROM events`},
	{"aggregate", `INSERT INTO payments (event_id, account, amount, paid_at) SELECT event_id, 'a' || wsum(1), 1, min("timestamp") FROM events GROUP BY event_id`},
	{"cast", `INSERT INTO payments (event_id, account, amount, paid_at) SELECT event_id, 'a', (((payload->>'amount')::numeric)::m2).v, "timestamp" FROM events`},
	{"stable", `INSERT INTO payments (event_id, account, amount, paid_at) SELECT event_id, 'a' || st2(1), 1, "timestamp" FROM events`},
	{"ddl", `INSERT INTO payments (event_id, account, amount, paid_at) SELECT event_id, 'a' || v.x, 1, "timestamp" FROM events, ddlv v`},
	{"policy", `INSERT INTO payments (event_id, account, amount, paid_at) SELECT event_id, 'a' || r.k, 1, "timestamp" FROM events, {{rls}}.rates r`},
}

// runIndirect runs a small benchmark of the handler sql on up, the
// members logging to log (nil: nowhere).
func runIndirect(t *testing.T, up *pgxpool.Pool, us, name, sql string, log *slog.Logger) error {
	t.Helper()
	tm, err := ParseTemplate([]byte(paymentTemplate))
	if err != nil {
		t.Fatal(err)
	}
	prefix := us + "_g"
	_, err = Run(t.Context(), Config{
		Pool:     up,
		Handlers: func(string) ([]sink.Handler, error) { return []sink.Handler{sqlHandler(t, name, sql)}, nil },
		Topic:    "payments", Payloads: FromTemplate(tm), Events: 40, Duplicates: 0.1, Partitions: 2, Members: 1,
		Scenarios: []string{Steady}, NoRawCopy: true, Schema: prefix, Logger: log,
	})
	var left int
	if qerr := up.QueryRow(context.WithoutCancel(t.Context()), `SELECT count(*) FROM pg_namespace WHERE nspname LIKE $1`, prefix+"%").Scan(&left); qerr != nil || left != 0 {
		t.Errorf("%d bench schemas left (%v), want none", left, qerr)
	}
	return err
}

// Each indirect path, reached on every event: the probe refuses it,
// naming the handler, before anything is produced; the user's tables and
// sequence are as they were.
func TestRunRefusesIndirectWrites(t *testing.T) {
	up, us := indirectDB(t, "true")
	for _, c := range indirect {
		t.Run(c.name, func(t *testing.T) {
			before := snapshot(t, up, us)
			err := runIndirect(t, up, us, "h_"+strings.ReplaceAll(c.name, "-", "_"), indirectSQL(c.sql, us), nil)
			var re *RefusedError
			if !errors.As(err, &re) || !strings.Contains(err.Error(), "handler h_") || !strings.Contains(err.Error(), "read-only") {
				t.Errorf("Run: %v; want a *RefusedError naming the handler and the read-only probe", err)
			}
			sameSnapshot(t, before, snapshot(t, up, us))
		})
	}
}

// A statement that locks rows of a table it reads (FOR UPDATE, FOR SHARE)
// or reaches the creation of a temporary table writes nothing of the
// user's, but not inside the clones either: the probe refuses it, and its
// message names those causes too, not only the user's tables.
func TestRunRefusesRowLocksAndTemporaryTables(t *testing.T) {
	up, us := indirectDB(t, "true")
	for _, q := range []string{
		`CREATE FUNCTION mk() RETURNS int LANGUAGE plpgsql VOLATILE AS $$
BEGIN EXECUTE 'CREATE TEMP TABLE IF NOT EXISTS scratch (x int)'; RETURN 1; END $$`,
		`CREATE VIEW tmpv AS SELECT mk() AS x`,
	} {
		if _, err := up.Exec(t.Context(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for _, c := range []struct{ name, sql, want string }{
		{"for update", `INSERT INTO payments (event_id, account, amount, paid_at) SELECT event_id, a.note, 1, "timestamp" FROM events, audit a WHERE a.n = 1 FOR UPDATE OF a`, "FOR UPDATE or FOR SHARE"},
		{"for share", `INSERT INTO payments (event_id, account, amount, paid_at) SELECT event_id, a.note, 1, "timestamp" FROM events, audit a WHERE a.n = 1 FOR SHARE OF a`, "FOR UPDATE or FOR SHARE"},
		{"temporary table", `INSERT INTO payments (event_id, account, amount, paid_at) SELECT event_id, 'a' || v.x, 1, "timestamp" FROM events, tmpv v`, "creates a temporary table"},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := snapshot(t, up, us)
			err := runIndirect(t, up, us, "h_"+strings.ReplaceAll(c.name, " ", "_"), c.sql, nil)
			var re *RefusedError
			if !errors.As(err, &re) || !strings.Contains(err.Error(), "read-only") || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Run: %v; want a *RefusedError of the read-only probe saying %q", err, c.want)
			}
			sameSnapshot(t, before, snapshot(t, up, us))
		})
	}
}

// The same paths, taken only in the pipeline's transactions (those that
// claimed events), which the probe does not take: the table guard stops
// the run naming the handler and the table, and nothing of the
// transactions is kept; a sequence moved is named (it cannot be rolled
// back).
func TestRunStopsIndirectWritesTheProbeMissed(t *testing.T) {
	up, us := indirectDB(t, `current_setting('transaction_read_only') = 'off'
  AND EXISTS (SELECT 1 FROM pg_stat_xact_user_tables WHERE relname LIKE 'processed_events%' AND n_tup_ins > 0)`)
	for _, c := range indirect {
		t.Run(c.name, func(t *testing.T) {
			before := snapshot(t, up, us)
			h := "h_" + strings.ReplaceAll(c.name, "-", "_")
			var logs bytes.Buffer
			err := runIndirect(t, up, us, h, indirectSQL(c.sql, us), slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
			after := snapshot(t, up, us)
			// bench says what the guard met; the members do not log it as
			// a batch they retry until it is fixed.
			if strings.Contains(logs.String(), "retrying") || strings.Contains(logs.String(), "bench stopped") {
				t.Errorf("the members logged the guard's hit:\n%s", logs.String())
			}
			if c.name == "view-nextval" {
				if err == nil || !(strings.Contains(err.Error(), us+".ref_seq moved") || strings.Contains(err.Error(), us+".ref_seq (a sequence)")) {
					t.Errorf("Run: %v; want it to name %s.ref_seq, moved", err, us)
				}
				delete(before, "ref_seq")
				delete(after, "ref_seq")
			} else {
				var we *WroteError
				if !errors.As(err, &we) || we.Handler != h || !strings.Contains(err.Error(), us+".audit") {
					t.Errorf("Run: %v; want a *WroteError naming %s and %s.audit", err, h, us)
				}
				if c.name == "ddl" && (we == nil || !slices.Contains(we.Catalogs, "pg_class")) {
					t.Errorf("Run: %v; want the catalog pg_class named (audit dropped)", err)
				}
			}
			sameSnapshot(t, before, after)
		})
	}
}

// The guard in a transaction of the run's schema: the handler that
// wrote a table of the user's (a TRUNCATE too, which Postgres' counters
// do not see) is named with the table; writes of the clones and of a Go
// handler's table in the run's schema are not the user's.
func TestGuardSeesWritesOutsideTheRunsSchemas(t *testing.T) {
	up, us := indirectDB(t, "true")
	ctx := t.Context()
	schema := us + "_guard"
	iso, err := Isolate(ctx, up, []sink.Handler{sqlHandler(t, "payments", paymentsSQL)},
		func(ctx context.Context, db *pgxpool.Pool, schema string) error {
			_, err := db.Exec(ctx, fmt.Sprintf(`CREATE TABLE %q.counters (n int)`, schema))
			return err
		})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := iso.Create(ctx, schema, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = iso.Drop(context.Background(), schema) })
	defer pool.Close()
	g := iso.guard(schema)
	evs := []sink.Event{{ID: uuid.New(), Value: []byte(`{"account":"acct-1","amount":"12.50"}`), Timestamp: time.Now()}}
	before := snapshot(t, up, us)
	for _, c := range []struct {
		name, sql string
		wrote     string // the table named; "": none
	}{
		{"clone", paymentsSQL, ""},
		{"go-table", fmt.Sprintf(`INSERT INTO %q.counters SELECT 1 FROM events`, schema), ""},
		{"read", `INSERT INTO payments (event_id, account, amount) SELECT e.event_id, a.note, 1 FROM events e, audit a LIMIT 1`, ""},
		{"view", indirect[0].sql, us + ".audit"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var stopped error
			h := guardHandlers([]sink.Handler{sqlHandler(t, c.name, c.sql)}, g, func(err error) { stopped = err })[0]
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(context.Background()) //nolint:errcheck
			err = h.Apply(ctx, tx, evs)
			var we *WroteError
			switch {
			case c.wrote == "" && err != nil:
				t.Fatalf("Apply: %v; want no error", err)
			case c.wrote != "" && (!errors.As(err, &we) || we.Handler != c.name || !strings.Contains(err.Error(), c.wrote) || stopped != err):
				t.Fatalf("Apply: %v (stop given %v); want a *WroteError naming %s and %s, given to stop", err, stopped, c.name, c.wrote)
			}
		})
	}
	// A TRUNCATE leaves the counters at 0: the lock is seen.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf("TRUNCATE %q.audit", us)); err != nil {
		t.Fatal(err)
	}
	ts, cs, err := g.wrote(ctx, tx, nil)
	_ = tx.Rollback(ctx)
	if err != nil || len(ts) != 1 || ts[0] != us+".audit" || !slices.Contains(cs, "pg_class") {
		t.Errorf("after TRUNCATE the guard saw %v and catalogs %v (%v), want [%s.audit] and pg_class (its new file)", ts, cs, err, us)
	}
	// Definitions changed by a function the statement reaches (a
	// handler could run any of these through EXECUTE) are seen in the
	// catalogs they write, a table dropped by its name as it was.
	for _, c := range []struct {
		ddl, table, catalog string
	}{
		{fmt.Sprintf(`DROP TABLE %q.audit`, us), us + ".audit", "pg_class"},
		{fmt.Sprintf(`CREATE OR REPLACE FUNCTION %q.guard_fn() RETURNS int LANGUAGE sql AS 'SELECT 2'`, us), "", "pg_proc"},
		{fmt.Sprintf(`GRANT ALL ON %q.audit TO PUBLIC`, us), "", "pg_class"},
		{fmt.Sprintf(`CREATE TABLE %q.guard_new (n int)`, us), "", "pg_class"},
		{fmt.Sprintf(`ALTER SEQUENCE %q.ref_seq RESTART WITH 5`, us), "", "pg_sequence"},
		{fmt.Sprintf(`SELECT setval('%s.ref_seq', 7)`, us), us + ".ref_seq (a sequence)", ""},
	} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, c.ddl); err != nil {
			_ = tx.Rollback(ctx)
			t.Fatalf("%s: %v", c.ddl, err)
		}
		ts, cs, err := g.wrote(ctx, tx, nil)
		_ = tx.Rollback(ctx)
		if err != nil || (c.table != "" && !slices.Contains(ts, c.table)) || (c.catalog != "" && !slices.Contains(cs, c.catalog)) {
			t.Errorf("after %s the guard saw tables %v and catalogs %v (%v), want %q and the catalog %s", c.ddl, ts, cs, err, c.table, c.catalog)
		}
	}
	// What the connection's earlier transactions wrote of the catalogs
	// (bench's own ANALYZE of a dedup slice, say) can still be in the
	// counters: a handler is blamed only for what grew while it ran.
	tx, err = pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `CREATE TEMP TABLE earlier (n int)`); err != nil {
		t.Fatal(err)
	}
	h := guardHandlers([]sink.Handler{sqlHandler(t, "payments", paymentsSQL)}, g, nil)[0]
	if f, ok := h.(sink.TopicFilter); !ok || !f.Consumes("payments") {
		t.Errorf("the guarded SQL handler lost its topic filter (%T)", h)
	}
	err = h.Apply(ctx, tx, evs)
	_ = tx.Rollback(ctx)
	if err != nil {
		t.Errorf("a handler that wrote only its clone, after DDL earlier in the transaction: %v; want none", err)
	}
	// The setval above is not rolled back: ref_seq as indirectDB left it.
	if _, err := up.Exec(ctx, fmt.Sprintf(`SELECT setval('%s.ref_seq', 100)`, us)); err != nil {
		t.Fatal(err)
	}
	sameSnapshot(t, before, snapshot(t, up, us))
}

// Rules and views a statement writes are refused by name, before the
// plan: a DO ALSO rule, a DO INSTEAD rule and an updatable view.
func TestIsolationNamesRulesAndViews(t *testing.T) {
	up, us, _ := userDB(t)
	ctx := t.Context()
	for _, q := range []string{
		`CREATE TABLE audit2 (event_id uuid, account text)`,
		`CREATE TABLE audit3 (event_id uuid, account text)`,
		`CREATE RULE also_pay AS ON INSERT TO audit2 DO ALSO INSERT INTO payments (event_id, account, amount) VALUES (NEW.event_id, NEW.account, 1)`,
		`CREATE RULE instead_pay AS ON INSERT TO audit3 DO INSTEAD INSERT INTO payments (event_id, account, amount) VALUES (NEW.event_id, NEW.account, 1)`,
		`CREATE VIEW pay_v AS SELECT event_id, account, amount FROM payments`,
	} {
		if _, err := up.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for _, c := range []struct{ target, want string }{
		{"audit2", "rule also_pay (ON INSERT DO ALSO)"},
		{"audit3", "rule instead_pay (ON INSERT DO INSTEAD)"},
		{"pay_v", "a view"},
	} {
		sql := fmt.Sprintf(`INSERT INTO %s (event_id, account) SELECT event_id, payload->>'account' FROM events`, c.target)
		if c.target == "pay_v" {
			sql = `INSERT INTO pay_v (event_id, account, amount) SELECT event_id, payload->>'account', 1 FROM events`
		}
		_, err := Isolate(ctx, up, []sink.Handler{sqlHandler(t, "h", sql)}, nil)
		var re *RefusedError
		if !errors.As(err, &re) || !strings.Contains(err.Error(), "handler h writes "+us+"."+c.target) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Isolate writing %s: %v; want a refusal naming %s.%s and %q", c.target, err, us, c.target, c.want)
		}
	}
}

// BenchmarkGuard is the table guard's query, run once a batch: in a
// transaction that wrote 1000 rows to a clone, with 30 tables of the
// user's besides the other tables of the test database (logged).
func BenchmarkGuard(b *testing.B) {
	up, us, _ := userDB(b)
	ctx := b.Context()
	for i := range 30 {
		if _, err := up.Exec(ctx, fmt.Sprintf("CREATE TABLE t%d (id bigint PRIMARY KEY, v text)", i)); err != nil {
			b.Fatal(err)
		}
	}
	iso, err := Isolate(ctx, up, []sink.Handler{sqlHandler(b, "payments", paymentsSQL)}, nil)
	if err != nil {
		b.Fatal(err)
	}
	schema := us + "_guard"
	pool, err := iso.Create(ctx, schema, 1)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = iso.Drop(context.Background(), schema) })
	defer pool.Close()
	g := iso.guard(schema)
	b.Logf("the guard covers %d tables", len(g.tables))
	tx, err := pool.Begin(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck
	if _, err := tx.Exec(ctx, "INSERT INTO payments (event_id, account, amount) SELECT gen_random_uuid(), 'a', 1 FROM generate_series(1, 1000)"); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if ts, cs, err := g.wrote(ctx, tx, nil); err != nil || len(ts) > 0 || len(cs) > 0 {
			b.Fatalf("wrote: %v %v %v", ts, cs, err)
		}
	}
}
