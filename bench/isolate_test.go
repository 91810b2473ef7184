package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
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
func userDB(t testing.TB) (*pgxpool.Pool, string, string) {
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

func sqlHandler(t testing.TB, name, sql string) *sink.SQLHandler {
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
	if err := up.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{cloneSchema(schema), "payments"}.Sanitize()).Scan(&n); err != nil || n != 2 {
		t.Fatalf("bench schema's payments: %d rows (%v), want 2", n, err)
	}
	// The clone keeps the columns' constraints.
	var checks int
	if err := up.QueryRow(ctx, `SELECT count(*) FROM pg_constraint WHERE conrelid = $1::regclass AND contype = 'c'`,
		pgx.Identifier{cloneSchema(schema), "payments"}.Sanitize()).Scan(&checks); err != nil || checks != 1 {
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
	if err := up.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname IN ($1, $2))", schema, cloneSchema(schema)).Scan(&exists); err != nil || exists {
		t.Fatalf("schema %s or %s still exists after Drop (%v)", schema, cloneSchema(schema), err)
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
			// Refused before the plan, which shows audit, not payments.
			sql: paymentsSQL, want: []string{"handler h writes %s.payments, which has rule pay_rule (ON INSERT DO INSTEAD)"}},
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
				if qerr := up.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname IN ($1, $2))", us+"_bench", cloneSchema(us+"_bench")).Scan(&exists); qerr != nil || exists {
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

// applyThrough makes schema with iso and applies each handler to two
// events in one transaction of its pool, twice (two batches): what a
// benchmark's run does to the database. It returns the first error.
func applyThrough(t *testing.T, up *pgxpool.Pool, iso *Isolation, schema string, hs ...*sink.SQLHandler) error {
	t.Helper()
	ctx := t.Context()
	pool, err := iso.Create(ctx, schema, 1)
	if err != nil {
		return err
	}
	t.Cleanup(func() { _ = iso.Drop(context.Background(), schema) })
	defer pool.Close()
	for range 2 {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		evs := []sink.Event{{ID: uuid.New(), Value: []byte(`{"account":"acct-1","amount":"12.50"}`), Timestamp: time.Now()},
			{ID: uuid.New(), Value: []byte(`{"account":"acct-2","amount":"7"}`), Timestamp: time.Now()}}
		for _, h := range hs {
			if err := h.Apply(ctx, tx, evs); err != nil {
				_ = tx.Rollback(ctx)
				return err
			}
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
	}
	return nil
}

// snapshot is what the user's schema holds: every table's rows and every
// sequence's state, as text, by name.
func snapshot(t *testing.T, pool *pgxpool.Pool, schema string) map[string]string {
	t.Helper()
	ctx := t.Context()
	rows, err := pool.Query(ctx, `SELECT c.relname, c.relkind::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'S') ORDER BY 1`, schema)
	if err != nil {
		t.Fatal(err)
	}
	type rel struct{ Name, Kind string }
	rels, err := pgx.CollectRows(rows, pgx.RowToStructByPos[rel])
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, r := range rels {
		id := pgx.Identifier{schema, r.Name}.Sanitize()
		q := "SELECT coalesce(string_agg(t::text, ' | ' ORDER BY t::text), '') FROM " + id + " t"
		if r.Kind == "S" {
			q = "SELECT last_value || ' ' || is_called FROM " + id
		}
		var s string
		if err := pool.QueryRow(ctx, q).Scan(&s); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		out[r.Name] = s
	}
	return out
}

// sameSnapshot fails t when the user's schema changed.
func sameSnapshot(t *testing.T, before, after map[string]string) {
	t.Helper()
	for k, b := range before {
		if a := after[k]; a != b {
			t.Errorf("the user's %s changed:\nbefore %s\nafter  %s", k, b, a)
		}
	}
	for k := range after {
		if _, ok := before[k]; !ok {
			t.Errorf("the user's schema has a new relation %s", k)
		}
	}
}

// A clone (LIKE … INCLUDING ALL) keeps its table's defaults, generated
// columns, checks, indexes and the domains of its columns: whatever
// function of the user's those call runs in the benchmark, and may write
// anywhere. bench refuses, naming the table, where and the function,
// unless the function is IMMUTABLE and Postgres keeps it from writing.
func TestIsolationRefusesFunctionsInTheClonesExpressions(t *testing.T) {
	audit := []string{
		`CREATE TABLE audit (note text)`,
		`CREATE FUNCTION audit_note(n text) RETURNS text LANGUAGE plpgsql VOLATILE AS $$BEGIN INSERT INTO audit VALUES (n); RETURN n; END$$`,
		// An IMMUTABLE function that calls a volatile one writes all the same.
		`CREATE FUNCTION tag(a text) RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$BEGIN PERFORM audit_note('tag'); RETURN a; END$$`,
		`CREATE FUNCTION ok(a numeric) RETURNS boolean LANGUAGE plpgsql AS $$BEGIN PERFORM audit_note('ok'); RETURN true; END$$`,
	}
	tests := []struct {
		name  string
		setup []string
		want  string
	}{
		{name: "default", setup: []string{`ALTER TABLE payments ADD COLUMN note text DEFAULT audit_note('default')`},
			want: "%s.payments: the default of column note calls %s.audit_note(), a function of yours that is not IMMUTABLE"},
		{name: "check", setup: []string{`ALTER TABLE payments ADD CONSTRAINT pay_ok CHECK (ok(amount))`},
			want: "%s.payments: constraint pay_ok calls %s.ok(), a function of yours that is not IMMUTABLE"},
		{name: "generated column", setup: []string{`ALTER TABLE payments ADD COLUMN t text GENERATED ALWAYS AS (tag(account)) STORED`},
			want: "%s.payments: generated column t calls %s.tag(), an IMMUTABLE function of yours that calls %s.audit_note()"},
		{name: "index expression", setup: []string{`CREATE INDEX pay_tag ON payments (tag(account))`},
			want: "%s.payments: index pay_tag calls %s.tag(), an IMMUTABLE function of yours that calls %s.audit_note()"},
		{name: "partial index", setup: []string{`CREATE INDEX pay_part ON payments (account) WHERE tag(account) <> ''`},
			want: "%s.payments: index pay_part calls %s.tag()"},
		{name: "statistics", setup: []string{`CREATE STATISTICS pay_stat ON (tag(account)), amount FROM payments`},
			want: "%s.payments: statistics pay_stat calls %s.tag()"},
		{name: "domain check", setup: []string{`CREATE DOMAIN amount_t AS numeric(12,2) CHECK (ok(VALUE))`,
			`ALTER TABLE payments ALTER COLUMN amount TYPE amount_t`},
			want: "%s.payments: the domain %s.amount_t of column amount (its constraint amount_t_check) calls %s.ok()"},
		{name: "domain default", setup: []string{`CREATE DOMAIN note_t AS text DEFAULT audit_note('domain')`,
			`ALTER TABLE payments ADD COLUMN n note_t`},
			want: "%s.payments: the domain %s.note_t of column n (its default) calls %s.audit_note(), a function of yours that is not IMMUTABLE"},
		{name: "sequence in a check", setup: []string{`CREATE SEQUENCE s2`, `ALTER TABLE payments ADD CONSTRAINT pay_seq CHECK (nextval('s2') > 0)`},
			want: "%s.payments: constraint pay_seq uses sequence %s.s2, which bench clones only for a column's default"},
		{name: "nextval in an immutable function", setup: []string{`CREATE SEQUENCE s3`,
			`CREATE FUNCTION next3() RETURNS bigint LANGUAGE plpgsql IMMUTABLE AS $$BEGIN RETURN nextval('s3'); END$$`,
			`ALTER TABLE payments ADD COLUMN n3 bigint DEFAULT next3()`},
			// Postgres computes the default while planning: bench's plan
			// of the statement, in a read-only transaction, fails.
			want: "handler h: Postgres, planning its statement, had to write (cannot execute nextval() in a read-only transaction)"},
		{name: "nextval in an immutable function called with a column", setup: []string{`CREATE SEQUENCE s4`,
			`CREATE FUNCTION next4(a text) RETURNS bigint LANGUAGE plpgsql IMMUTABLE AS $$BEGIN RETURN nextval('s4'); END$$`,
			`ALTER TABLE payments ADD COLUMN n4 bigint GENERATED ALWAYS AS (next4(account)) STORED`},
			want: "%s.payments: generated column n4 calls %s.next4(), an IMMUTABLE function of yours that calls nextval or setval"},
		{name: "operator", setup: []string{`CREATE FUNCTION pos(a numeric, b numeric) RETURNS boolean LANGUAGE sql AS $$SELECT audit_note('op') IS NOT NULL AND a > b$$`,
			`CREATE OPERATOR >>> (LEFTARG = numeric, RIGHTARG = numeric, FUNCTION = pos)`,
			`ALTER TABLE payments ADD CONSTRAINT pay_pos CHECK (amount >>> 0)`},
			want: "%s.payments: constraint pay_pos calls %s.pos(), a function of yours that is not IMMUTABLE"},
		{name: "set_config in a default", setup: []string{`ALTER TABLE payments ADD COLUMN sp text DEFAULT set_config('search_path', '%s', false)`},
			want: "%s.payments: the default of column sp calls set_config(), which changes the search_path bench relies on"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up, us, _ := userDB(t)
			ctx := t.Context()
			sub := func(s string) string { return strings.ReplaceAll(s, "%s", us) }
			for _, q := range append(slices.Clone(audit), tt.setup...) {
				if _, err := up.Exec(ctx, sub(q)); err != nil {
					t.Fatalf("%s: %v", sub(q), err)
				}
			}
			before := snapshot(t, up, us)
			h := sqlHandler(t, "h", paymentsSQL)
			iso, err := Isolate(ctx, up, []sink.Handler{h}, nil)
			wantRefused(t, err, sub(tt.want))
			if err == nil {
				// What a benchmark would have done.
				if err := applyThrough(t, up, iso, us+"_bench", h); err != nil {
					t.Logf("apply: %v", err)
				}
			}
			sameSnapshot(t, before, snapshot(t, up, us))
		})
	}
}

// An IMMUTABLE function that computes, in a default, a check, a generated
// column or an index, is the clone's as it is the table's.
func TestIsolationAcceptsImmutableFunctions(t *testing.T) {
	up, us, _ := userDB(t)
	ctx := t.Context()
	for _, q := range []string{
		`CREATE FUNCTION norm(a text) RETURNS text LANGUAGE sql IMMUTABLE AS $$SELECT lower(trim(a))$$`,
		`CREATE FUNCTION cents(a numeric) RETURNS bigint LANGUAGE plpgsql IMMUTABLE AS $$BEGIN RETURN (a * 100)::bigint; END$$`,
		`ALTER TABLE payments ADD COLUMN acct text GENERATED ALWAYS AS (norm(account)) STORED`,
		`ALTER TABLE payments ADD COLUMN c bigint DEFAULT cents(1) CHECK (c >= cents(0))`,
		`CREATE INDEX ON payments (norm(account))`,
	} {
		if _, err := up.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	before := snapshot(t, up, us)
	h := sqlHandler(t, "h", paymentsSQL)
	iso, err := Isolate(ctx, up, []sink.Handler{h}, nil)
	if err != nil {
		t.Fatalf("Isolate: %v", err)
	}
	if err := applyThrough(t, up, iso, us+"_bench", h); err != nil {
		t.Fatalf("apply: %v", err)
	}
	var n int
	if err := up.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{cloneSchema(us + "_bench"), "payments"}.Sanitize()+
		" WHERE acct = account AND c = 100").Scan(&n); err != nil || n != 4 {
		t.Fatalf("the clone has %d rows with the generated column and the default (%v), want 4", n, err)
	}
	sameSnapshot(t, before, snapshot(t, up, us))
}

// A cloned table's serial column, and a sequence the handler's SQL calls
// by its name, are the clone schema's: the user's sequences keep their
// values; an identity column's sequence is the clone's by LIKE.
func TestIsolationClonesSequences(t *testing.T) {
	up, us, _ := userDB(t)
	ctx := t.Context()
	for _, q := range []string{
		`CREATE SEQUENCE ref_seq START 1000`,
		`CREATE TABLE pay_serial (id bigserial PRIMARY KEY, event_id uuid, account text, ref bigint,
			no bigint GENERATED ALWAYS AS IDENTITY, code text DEFAULT 'P-' || nextval('ref_seq'))`,
		`INSERT INTO pay_serial (account, ref) SELECT 'acct-' || i, i FROM generate_series(1, 10) i`,
	} {
		if _, err := up.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	before := snapshot(t, up, us)
	h := sqlHandler(t, "h", `INSERT INTO pay_serial (event_id, account, ref) SELECT event_id, payload->>'account', nextval('ref_seq') FROM events`)
	iso, err := Isolate(ctx, up, []sink.Handler{h}, nil)
	if err != nil {
		t.Fatalf("Isolate: %v", err)
	}
	if err := applyThrough(t, up, iso, us+"_bench", h); err != nil {
		t.Fatalf("apply: %v", err)
	}
	sameSnapshot(t, before, snapshot(t, up, us))
	// The clone's sequences start again: ids 1…4, numbers 1…4, and the
	// handler's and the default's ref_seq from 1000.
	var ids, nos, refs string
	if err := up.QueryRow(ctx, "SELECT string_agg(id::text, ',' ORDER BY id), string_agg(no::text, ',' ORDER BY no), string_agg(ref::text || code, ',' ORDER BY ref) FROM "+
		pgx.Identifier{cloneSchema(us + "_bench"), "pay_serial"}.Sanitize()).Scan(&ids, &nos, &refs); err != nil {
		t.Fatal(err)
	}
	if ids != "1,2,3,4" || nos != "1,2,3,4" {
		t.Errorf("the clone's ids %s and numbers %s, want 1,2,3,4 each", ids, nos)
	}
	if len(strings.Split(refs, ",")) != 4 || !strings.Contains(refs, "1000") {
		t.Errorf("the clone's refs %s, want four from the cloned ref_seq (1000 on)", refs)
	}
}

// A sequence named with its schema, at run time or in a function cannot
// be redirected: refused, and nothing is written.
func TestIsolationRefusesQualifiedSequences(t *testing.T) {
	up, us, _ := userDB(t)
	ctx := t.Context()
	if _, err := up.Exec(ctx, `CREATE SEQUENCE ref_seq; ALTER TABLE payments ADD COLUMN ref bigint;
CREATE FUNCTION next_ref() RETURNS bigint LANGUAGE sql STABLE AS $$SELECT nextval('ref_seq')$$`); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ name, sql, want string }{
		{"qualified", `INSERT INTO payments (event_id, account, amount, ref) SELECT event_id, 'a', 1, nextval('%s.ref_seq') FROM events`,
			"handler h calls nextval('%s.ref_seq'): a sequence named with its schema"},
		{"at run time", `INSERT INTO payments (event_id, account, amount, ref) SELECT event_id, 'a', 1, nextval(('ref' || '_seq')::regclass) FROM events`,
			"handler h calls nextval() with a sequence it names at run time"},
		{"in a function of yours", `INSERT INTO payments (event_id, account, amount, ref) SELECT event_id, 'a', 1, next_ref() FROM events`,
			"handler h calls %s.next_ref(), a function of yours that calls nextval or setval"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sub := func(s string) string { return strings.ReplaceAll(s, "%s", us) }
			before := snapshot(t, up, us)
			h := sqlHandler(t, "h", sub(tt.sql))
			iso, err := Isolate(ctx, up, []sink.Handler{h}, nil)
			wantRefused(t, err, sub(tt.want))
			if err == nil {
				if err := applyThrough(t, up, iso, us+"_bench_"+strings.ReplaceAll(tt.name, " ", "_"), h); err != nil {
					t.Logf("apply: %v", err)
				}
			}
			sameSnapshot(t, before, snapshot(t, up, us))
		})
	}
}

// The isolation relies on the search_path: a handler that may change it
// (set_config, or a function of the user's that calls it or runs SET) is
// refused, naming the handler and the call.
func TestIsolationRefusesSearchPathChanges(t *testing.T) {
	for _, tt := range []struct {
		name  string
		setup []string
		sql   string
		want  string
		// syntax: Postgres refuses the statement (a *sink.SQLError), before bench.
		syntax bool
	}{
		{name: "SET", sql: `SET search_path = %s`, want: `syntax error at or near "SET"`, syntax: true},
		{name: "SET after a statement", sql: `INSERT INTO notes SELECT 'x', event_id FROM events; SET search_path = %s`,
			want: "cannot insert multiple commands into a prepared statement", syntax: true},
		{name: "set_config", sql: `INSERT INTO notes SELECT set_config('search_path', '%s', true), event_id FROM events`,
			want: "handler a calls set_config(), which can change the search_path bench relies on"},
		{name: "pg_catalog.set_config", sql: `INSERT INTO notes SELECT pg_catalog . set_config('search_path', '%s', false), event_id FROM events`,
			want: "handler a calls set_config(), which can change the search_path bench relies on"},
		{name: "a stable function of yours", setup: []string{
			`CREATE FUNCTION home() RETURNS text LANGUAGE plpgsql STABLE AS $$BEGIN PERFORM set_config('search_path', '%s', false); RETURN 'x'; END$$`},
			sql:  `INSERT INTO notes SELECT home(), event_id FROM events`,
			want: "handler a calls %s.home(), a function of yours that can change the search_path bench relies on"},
		{name: "SET in a function a function of yours calls", setup: []string{
			`CREATE FUNCTION go_home() RETURNS void LANGUAGE plpgsql VOLATILE AS $$BEGIN SET search_path = %s; END$$`,
			`CREATE FUNCTION home2() RETURNS text LANGUAGE plpgsql STABLE AS $$BEGIN PERFORM go_home(); RETURN 'x'; END$$`},
			sql:  `INSERT INTO notes SELECT home2(), event_id FROM events`,
			want: "handler a calls %s.home2(), a function of yours that can change the search_path bench relies on"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			up, us, _ := userDB(t)
			ctx := t.Context()
			sub := func(s string) string { return strings.ReplaceAll(s, "%s", us) }
			for _, q := range append([]string{`CREATE TABLE notes (note text, event_id uuid)`}, tt.setup...) {
				if _, err := up.Exec(ctx, sub(q)); err != nil {
					t.Fatalf("%s: %v", sub(q), err)
				}
			}
			before := snapshot(t, up, us)
			a, b := sqlHandler(t, "a", sub(tt.sql)), sqlHandler(t, "b", paymentsSQL)
			iso, err := Isolate(ctx, up, []sink.Handler{a, b}, nil)
			var re *RefusedError
			var se *sink.SQLError
			if tt.syntax {
				if !errors.As(err, &se) || !strings.Contains(err.Error(), tt.want) {
					t.Errorf("Isolate: err = %v, want a *sink.SQLError saying %q", err, tt.want)
				}
			} else if !errors.As(err, &re) {
				t.Errorf("Isolate: err = %v, want a *RefusedError", err)
			} else if !strings.Contains(err.Error(), sub(tt.want)) {
				t.Errorf("refusal:\n%v\nwant it to say %q", err, sub(tt.want))
			}
			if err == nil {
				if err := applyThrough(t, up, iso, us+"_bench", a, b); err != nil {
					t.Logf("apply: %v", err)
				}
			}
			sameSnapshot(t, before, snapshot(t, up, us))
		})
	}
}

// A user's table named like one of onceflow's own (dead_letters,
// processed_events, sink_offsets, sink_replays, schema_migrations) is
// cloned into a schema apart from onceflow's tables: both work.
func TestIsolationUserTablesNamedLikeOnceflows(t *testing.T) {
	up, us, _ := userDB(t)
	ctx := t.Context()
	own := []string{"processed_events", "processed_events_slices", "sink_offsets", "dead_letters", "sink_replays", "schema_migrations"}
	var hs []*sink.SQLHandler
	for _, n := range own {
		if _, err := up.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (event_id uuid, note text)`, n)); err != nil {
			t.Fatal(err)
		}
		hs = append(hs, sqlHandler(t, n, fmt.Sprintf(`INSERT INTO %s SELECT event_id, 'mine' FROM events`, n)))
	}
	before := snapshot(t, up, us)
	var shs []sink.Handler
	for _, h := range hs {
		shs = append(shs, h)
	}
	iso, err := Isolate(ctx, up, shs, nil)
	if err != nil {
		t.Fatalf("Isolate: %v", err)
	}
	schema := us + "_bench"
	if err := applyThrough(t, up, iso, schema, hs...); err != nil {
		t.Fatalf("apply: %v", err)
	}
	sameSnapshot(t, before, snapshot(t, up, us))
	for _, n := range own {
		var rows int
		if err := up.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{cloneSchema(schema), n}.Sanitize()+" WHERE note = 'mine'").Scan(&rows); err != nil || rows != 4 {
			t.Errorf("the clone of your %s has %d rows (%v), want 4", n, rows, err)
		}
	}
	// onceflow's tables are its own, in the run's schema.
	var ok bool
	if err := up.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = $1 AND table_name = 'dead_letters' AND column_name = 'consumer_group')`,
		schema).Scan(&ok); err != nil || !ok {
		t.Fatalf("onceflow's dead_letters missing from %s (%v)", schema, err)
	}
	if got, want := iso.written(schema), map[string][]string{cloneSchema(schema): slices.Sorted(slices.Values(own))}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("written(%s) = %v, want %v", schema, got, want)
	}
}

// A whole benchmark over user tables named like onceflow's and with a
// bigserial key: exactly once, every table the handlers write read from
// its clone, the user's tables and sequences as they were, no schema left.
func TestRunIsolatesNamesAndSequences(t *testing.T) {
	up, us, _ := userDB(t)
	ctx := t.Context()
	for _, q := range []string{
		`CREATE TABLE dead_letters (event_id uuid, note text)`,
		`CREATE TABLE pay_serial (id bigserial PRIMARY KEY, event_id uuid, account text)`,
		`INSERT INTO dead_letters VALUES (gen_random_uuid(), 'mine')`,
		`INSERT INTO pay_serial (event_id, account) SELECT gen_random_uuid(), 'acct-' || i FROM generate_series(1, 10) i`,
	} {
		if _, err := up.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	before := snapshot(t, up, us)
	tm, err := ParseTemplate([]byte(paymentTemplate))
	if err != nil {
		t.Fatal(err)
	}
	prefix := us + "_n"
	res, err := Run(ctx, Config{
		Pool: up,
		Handlers: func(string) ([]sink.Handler, error) {
			return []sink.Handler{
				sqlHandler(t, "notes", `INSERT INTO dead_letters SELECT event_id, payload->>'account' FROM events`),
				sqlHandler(t, "serial", `INSERT INTO pay_serial (event_id, account) SELECT event_id, payload->>'account' FROM events`),
			}, nil
		},
		Topic: "payments", Payloads: FromTemplate(tm), Events: 60, Duplicates: 0.2, Partitions: 2, Members: 1,
		Scenarios: []string{Steady}, NoRawCopy: true, Schema: prefix,
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	for _, r := range res.Runs {
		if !r.ExactlyOnce {
			t.Errorf("%s: not exactly once: %v", r.Name, r.Problems)
		}
		for _, tbl := range []string{"dead_letters", "pay_serial"} {
			if st := r.Tables[tbl]; st.Rows != 60 {
				t.Errorf("%s: %s has %d rows, want 60 (tables %v)", r.Name, tbl, st.Rows, r.Tables)
			}
		}
	}
	sameSnapshot(t, before, snapshot(t, up, us))
	var left int
	if err := up.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname LIKE $1`, prefix+"%").Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d bench schemas left (%v), want none", left, err)
	}
}

// A schema of the clones' name that is there already is not the run's:
// Create fails and leaves it, and drops the run's schema it made.
func TestIsolationCreateLeavesASchemaItDidNotMake(t *testing.T) {
	up, us, _ := userDB(t)
	ctx := t.Context()
	schema := us + "_bench"
	if _, err := up.Exec(ctx, "CREATE SCHEMA "+cloneSchema(schema)+"; CREATE TABLE "+cloneSchema(schema)+".keep (x int)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = up.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+cloneSchema(schema)+" CASCADE") })
	iso, err := Isolate(ctx, up, []sink.Handler{sqlHandler(t, "h", paymentsSQL)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := iso.Create(ctx, schema, 1); err == nil || !strings.Contains(err.Error(), "create schema "+cloneSchema(schema)) {
		t.Fatalf("Create = %v, want it to fail creating %s", err, cloneSchema(schema))
	}
	var ours, theirs bool
	if err := up.QueryRow(ctx, "SELECT to_regnamespace($1) IS NOT NULL, to_regclass($2) IS NOT NULL", schema, cloneSchema(schema)+".keep").Scan(&ours, &theirs); err != nil {
		t.Fatal(err)
	}
	if ours || !theirs {
		t.Fatalf("after a failed Create: %s exists %v (want false), %s.keep exists %v (want true)", schema, ours, cloneSchema(schema), theirs)
	}
}

// wantRefused reports an error unless err is a *RefusedError saying want.
func wantRefused(t *testing.T, err error, want string) {
	t.Helper()
	var re *RefusedError
	if !errors.As(err, &re) {
		t.Errorf("Isolate: err = %v, want a *RefusedError", err)
	} else if !strings.Contains(err.Error(), want) {
		t.Errorf("refusal:\n%v\nwant it to say %q", err, want)
	}
}
