package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/sink"
)

// What Isolate checks is static: it reads the handlers' statements and the
// written tables, and cannot follow every path a statement takes (a view
// that calls a function of the user's, an operator, an aggregate or a
// cast whose function writes, a row-level security policy). Three checks
// hold whatever the path:
//   - the probe (Isolation.probe), before anything is produced, runs each
//     SQL handler's statement over a few of the run's events in a READ
//     ONLY transaction whose written tables are temporary clones, and
//     rolls it back: Postgres refuses there any write to a table that is
//     not temporary and nextval or setval of a sequence that is not;
//   - the table guard (runGuard.wrote), in every transaction a run
//     applies the handlers in, after each handler's Apply and before the
//     COMMIT: the locks the transaction holds that only a writer takes
//     on the user's tables, and Postgres' counters of the system
//     catalogs' rows written meanwhile (DDL);
//   - the sequences' last values before and after each run
//     (runGuard.moved): a sequence is not transactional, so a path the
//     probe did not take is detected, not prevented.

// WroteError is a run that a handler's transaction wrote, or took a
// writer's lock on, a table outside the benchmark's schemas, or changed
// the database's catalog (DDL, GRANT, a role's settings, a large object):
// bench rolled that transaction back (nothing of it was kept) and ended
// the run.
type WroteError struct {
	Handler  string
	Tables   []string // schema.name, unquoted
	Catalogs []string // the system catalogs written (pg_class, pg_proc...)
}

func (e *WroteError) Error() string {
	var what []string
	if len(e.Tables) > 0 {
		what = append(what, "wrote your table or sequence "+strings.Join(e.Tables, ", "))
	}
	if len(e.Catalogs) > 0 {
		what = append(what, "changed the database's definitions (CREATE, ALTER, DROP, GRANT, COMMENT, a role's settings or a large object: it wrote the catalog "+strings.Join(e.Catalogs, ", ")+")")
	}
	kept := "nothing of it was kept"
	if slices.ContainsFunc(e.Tables, func(t string) bool { return strings.HasSuffix(t, " (a sequence)") }) {
		kept = "nothing of it was kept but the sequence's nextval or setval, which no rollback undoes"
	}
	return fmt.Sprintf("handler %s %s (through a view, a function, an operator, an aggregate, a cast or a policy its statement reaches): bench stopped and rolled that transaction back; %s",
		e.Handler, strings.Join(what, " and "), kept)
}

// runGuard is what one run (the schemas Create made) checks against: the
// user's tables and sequences as they were when the schemas were made.
// Tables created later are not covered. Safe for concurrent use.
type runGuard struct {
	tables []uint32          // every ordinary and partitioned table (partitions too) outside the benchmarks' schemas and Postgres' own
	names  map[uint32]string // tables' schema.name, which a table dropped in the transaction no longer has there
	oids   string            // tables as an oid[] literal: a text argument, whatever the connections' exec mode
	// catalogNames names the system catalogs (pg_catalog's tables),
	// catalogs is their oids as an oid[] literal.
	catalogNames map[uint32]string
	catalogs     string
	seqs         map[string]*int64 // the user's sequences' last values (nil: never called), by name
	schemas      []string          // whose sequences are in seqs, with the search_path's
}

// newRunGuard reads the tables outside Postgres' own schemas and the
// benchmarks' (benchSchemaComment: this run's and any other's), and the
// sequences of the schemas on the user's search_path and of schemas (the
// written tables'): those of other schemas move with the other sessions
// of the database, which bench cannot tell from its own. A sequence the
// user may not read is left out.
func newRunGuard(ctx context.Context, db *pgxpool.Pool, schemas []string) (*runGuard, error) {
	type table struct {
		OID  uint32
		Name string
	}
	// Sequences too: nextval, setval and currval lock theirs as a
	// writer to the transaction's end, so a handler's call on a path the
	// probe did not take is named at once, in any schema (the call itself
	// cannot be rolled back).
	rows, err := db.Query(ctx, `SELECT c.oid, format('%s.%s', n.nspname, c.relname) || CASE WHEN c.relkind = 'S' THEN ' (a sequence)' ELSE '' END
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p', 'S') AND n.nspname <> 'information_schema' AND n.nspname NOT LIKE 'pg\_%'
  AND coalesce(obj_description(n.oid, 'pg_namespace'), '') <> $1`, benchSchemaComment)
	if err != nil {
		return nil, fmt.Errorf("list your tables: %w", err)
	}
	ts, err := pgx.CollectRows(rows, pgx.RowToStructByPos[table])
	if err != nil {
		return nil, fmt.Errorf("list your tables: %w", err)
	}
	g := &runGuard{names: make(map[uint32]string, len(ts))}
	for _, t := range ts {
		g.tables = append(g.tables, t.OID)
		g.names[t.OID] = t.Name
	}
	rows, err = db.Query(ctx, `SELECT c.oid, c.relname::text FROM pg_class c WHERE c.relnamespace = 'pg_catalog'::regnamespace AND c.relkind = 'r'`)
	if err != nil {
		return nil, fmt.Errorf("list the system catalogs: %w", err)
	}
	cs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[table])
	if err != nil {
		return nil, fmt.Errorf("list the system catalogs: %w", err)
	}
	g.catalogNames = make(map[uint32]string, len(cs))
	var co []uint32
	for _, c := range cs {
		g.catalogNames[c.OID] = c.Name
		co = append(co, c.OID)
	}
	g.oids, g.catalogs = oidArray(g.tables), oidArray(co)
	g.schemas = schemas
	if g.seqs, err = lastValues(ctx, db, schemas); err != nil {
		return nil, err
	}
	return g, nil
}

// oidArray is os as an oid[] literal.
func oidArray(os []uint32) string {
	var lit strings.Builder
	lit.WriteByte('{')
	for i, o := range os {
		if i > 0 {
			lit.WriteByte(',')
		}
		fmt.Fprint(&lit, o)
	}
	lit.WriteByte('}')
	return lit.String()
}

// lastValues reads the last value of every sequence of schemas and of the
// schemas on db's search_path, but Postgres' own and the benchmarks'.
func lastValues(ctx context.Context, db *pgxpool.Pool, schemas []string) (map[string]*int64, error) {
	rows, err := db.Query(ctx, `WITH s AS MATERIALIZED (
  SELECT c.oid, format('%s.%s', n.nspname, c.relname) AS name FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
  WHERE c.relkind = 'S' AND n.nspname <> 'information_schema' AND n.nspname NOT LIKE 'pg\_%'
    AND coalesce(obj_description(n.oid, 'pg_namespace'), '') <> $1
    AND (n.nspname = ANY (current_schemas(false)) OR n.nspname = ANY ($2))
), readable AS MATERIALIZED (SELECT * FROM s WHERE has_sequence_privilege(s.oid, 'SELECT'))
SELECT name, pg_sequence_last_value(oid) FROM readable`, benchSchemaComment, schemas)
	if err != nil {
		return nil, fmt.Errorf("read your sequences: %w", err)
	}
	type seq struct {
		Name string
		Last *int64
	}
	ss, err := pgx.CollectRows(rows, pgx.RowToStructByPos[seq])
	if err != nil {
		return nil, fmt.Errorf("read your sequences: %w", err)
	}
	out := make(map[string]*int64, len(ss))
	for _, s := range ss {
		out[s.Name] = s.Last
	}
	return out, nil
}

// locksSQL returns the user's tables of $1 that the transaction holds a
// lock on that only a writer takes: an INSERT, UPDATE, DELETE or MERGE
// (RowExclusiveLock, whatever view, function, rule or policy made it, and
// whether it changed a row or not), TRUNCATE, ALTER and DROP. A
// transaction holds its locks on tables to its end, and only its own.
const locksSQL = `SELECT DISTINCT l.relation, NULL::bigint FROM pg_locks l
WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation' AND l.relation = ANY ($1::text::oid[])
  AND l.mode IN ('RowExclusiveLock', 'ShareUpdateExclusiveLock', 'ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')`

// catalogSQL returns the system catalogs of $1 with rows inserted,
// updated or deleted by Postgres' counters: any DDL, GRANT, COMMENT,
// ALTER ROLE or large object writes one (and releases its lock on the
// catalog at once, so locksSQL cannot see it). The counters are the
// backend's not yet reported, which also hold a connection's earlier
// writes (the benchmark's own ANALYZE of a dedup slice writes
// pg_statistic): a handler's are what grew while it ran.
const catalogSQL = `SELECT o, n FROM unnest($1::text::oid[]) o,
  LATERAL (SELECT pg_stat_get_xact_tuples_inserted(o) + pg_stat_get_xact_tuples_updated(o) + pg_stat_get_xact_tuples_deleted(o) AS n) x
WHERE n > 0`

// guardSQL is locksSQL of $1 (the user's tables) and catalogSQL of $2
// (the catalogs), in one query.
var guardSQL = locksSQL + "\nUNION ALL\n" + strings.ReplaceAll(catalogSQL, "$1", "$2")

// catalogCounts returns catalogSQL in tx, by catalog.
func (g *runGuard) catalogCounts(ctx context.Context, tx pgx.Tx) (map[uint32]int64, error) {
	rows, err := tx.Query(ctx, catalogSQL, g.catalogs)
	if err != nil {
		return nil, err
	}
	out := map[uint32]int64{}
	var o uint32
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&o, &n}, func() error {
		out[o] = n
		return nil
	})
	return out, err
}

// wrote returns the user's tables tx has written or locked as a writer,
// by name as they were when g was made (a table dropped in tx too), and
// the system catalogs whose counts grew from before (catalogCounts
// earlier in tx; nil: from none) (guardSQL): one query.
func (g *runGuard) wrote(ctx context.Context, tx pgx.Tx, before map[uint32]int64) (tables, catalogs []string, err error) {
	rows, err := tx.Query(ctx, guardSQL, g.oids, g.catalogs)
	if err != nil {
		return nil, nil, err
	}
	var o uint32
	var n *int64
	_, err = pgx.ForEachRow(rows, []any{&o, &n}, func() error {
		switch {
		case n == nil: // a writer's lock
			tables = append(tables, g.names[o])
		case *n > before[o]:
			catalogs = append(catalogs, g.catalogNames[o])
		}
		return nil
	})
	slices.Sort(tables)
	slices.Sort(catalogs)
	return tables, catalogs, err
}

// moved returns an error naming each of the user's sequences whose last
// value is not what it was when the guard was made.
func (g *runGuard) moved(ctx context.Context, db *pgxpool.Pool) error {
	now, err := lastValues(ctx, db, g.schemas)
	if err != nil {
		return err
	}
	var ms []string
	for _, n := range slices.Sorted(maps.Keys(g.seqs)) {
		was := g.seqs[n]
		is, ok := now[n]
		if !ok || (was == nil && is == nil) || (was != nil && is != nil && *was == *is) {
			continue // dropped, or unmoved
		}
		if is == nil { // ALTER SEQUENCE … RESTART, or setval(…, false)
			ms = append(ms, fmt.Sprintf("%s reset from %s (not called since)", n, lastValue(was)))
			continue
		}
		ms = append(ms, fmt.Sprintf("%s moved from %s to %s", n, lastValue(was), lastValue(is)))
	}
	if len(ms) > 0 {
		return fmt.Errorf("your sequence %s during the run: a handler's statement reached nextval or setval on a path the probe did not take (or another session of yours called it); a sequence cannot be rolled back, so bench stopped", strings.Join(ms, ", "))
	}
	return nil
}

func lastValue(v *int64) string {
	if v == nil {
		return "never called"
	}
	return fmt.Sprint(*v)
}

// guardHandlers wraps the SQL handlers of hs so that, after each one's
// Apply in a transaction, g checks it wrote none of the user's tables;
// when it did, Apply returns a *WroteError (the Writer rolls the
// transaction back, and retries: the error is neither transient nor data,
// so nothing is dead-lettered) and calls stop with it, when not nil, to
// end the run. What each of hs implements of sink.TopicFilter is kept.
// Go handlers are left as they are: they are the user's program, built
// for the run's schema, whose other writes (another connection of its
// own, say) no guard could see; the guard's two queries a batch would
// only weigh on their figures (a tenth of effects-only's rate).
func guardHandlers(hs []sink.Handler, g *runGuard, stop func(error)) []sink.Handler {
	out := make([]sink.Handler, len(hs))
	for i, h := range hs {
		if _, ok := h.(*sink.SQLHandler); !ok {
			out[i] = h
			continue
		}
		out[i] = wrap(h, guarded{Handler: h, g: g, stop: stop}.Apply, nil)
	}
	return out
}

type guarded struct {
	sink.Handler
	g    *runGuard
	stop func(error)
}

func (h guarded) Apply(ctx context.Context, tx pgx.Tx, events []sink.Event) error {
	before, err := h.g.catalogCounts(ctx, tx)
	if err != nil {
		return fmt.Errorf("check that handler %s wrote none of your tables: %w", h.Name(), err)
	}
	if err := h.Handler.Apply(ctx, tx, events); err != nil {
		return err
	}
	ts, cs, err := h.g.wrote(ctx, tx, before)
	if err != nil {
		return fmt.Errorf("check that handler %s wrote none of your tables: %w", h.Name(), err)
	}
	if len(ts) == 0 && len(cs) == 0 {
		return nil
	}
	werr := &WroteError{Handler: h.Name(), Tables: ts, Catalogs: cs}
	if h.stop != nil {
		h.stop(werr)
	}
	return werr
}

// guardQuiet drops the members' log records of a batch the guard failed
// (an attribute holding an error that is a *WroteError): bench ends the
// run with that error and says so itself, where a member would log it as
// an error it retries until someone fixes it.
type guardQuiet struct{ slog.Handler }

func (h guardQuiet) Handle(ctx context.Context, r slog.Record) error {
	hit := false
	r.Attrs(func(a slog.Attr) bool {
		if a.Value.Kind() == slog.KindAny {
			err, ok := a.Value.Any().(error)
			hit = ok && errors.As(err, new(*WroteError))
		}
		return !hit
	})
	if hit {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h guardQuiet) WithAttrs(as []slog.Attr) slog.Handler {
	return guardQuiet{h.Handler.WithAttrs(as)}
}
func (h guardQuiet) WithGroup(name string) slog.Handler { return guardQuiet{h.Handler.WithGroup(name)} }

// probeEvents is how many of the run's events the probe applies.
const probeEvents = 16

// probe runs each SQL handler's statement once over up to probeEvents of
// evs (those of topics it consumes), on one connection of the user's, in
// a transaction that it makes READ ONLY after cloning the written tables
// and their sequences as temporary ones (first on the search_path), and
// rolls back. Postgres refuses there a write to any table or nextval or
// setval of any sequence that is not temporary, whatever the path
// (SECURITY DEFINER functions included): a refusal is a *RefusedError
// naming the handler. Another failure of the statement is left to the
// runs, which say it with the payload. Paths the sample does not take are
// not probed.
func (iso *Isolation) probe(ctx context.Context, evs []sink.Event) error {
	var ps []string
	for _, h := range iso.sql {
		var sample []sink.Event
		for _, e := range evs {
			if len(sample) == probeEvents {
				break
			}
			if h.Consumes(e.Topic) {
				sample = append(sample, e)
			}
		}
		if len(sample) == 0 {
			continue
		}
		refused, err := iso.probeOne(ctx, h, sample)
		if err != nil {
			return err
		}
		if refused != "" {
			ps = append(ps, refused)
		}
	}
	if len(ps) > 0 {
		return &RefusedError{Problems: ps}
	}
	return nil
}

// probeOne is probe of one handler: the problem, naming the handler, when
// its plan writes a table outside the temporary clones (a schema-qualified
// name) or Postgres refused a write; "" when not.
func (iso *Isolation) probeOne(ctx context.Context, h *sink.SQLHandler, sample []sink.Event) (string, error) {
	conn, err := iso.user.Acquire(ctx)
	if err != nil {
		return "", fmt.Errorf("probe handler %s: %w", h.Name(), err)
	}
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return "", fmt.Errorf("probe handler %s: %w", h.Name(), err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // only ever rolled back
	for _, s := range iso.seqs {
		if err := cloneSequence(ctx, tx, s, pgx.Identifier{"pg_temp", s[1]}); err != nil {
			return "", fmt.Errorf("probe handler %s: %w", h.Name(), err)
		}
	}
	for _, t := range iso.tables {
		clone := pgx.Identifier{"pg_temp", t[1]}
		if _, err := tx.Exec(ctx, fmt.Sprintf("CREATE TABLE %s (LIKE %s INCLUDING ALL)", clone.Sanitize(), t.Sanitize())); err != nil {
			return "", fmt.Errorf("probe handler %s: clone %s: %w", h.Name(), name(t), err)
		}
		if err := redirectDefaults(ctx, tx, clone, "pg_temp"); err != nil {
			return "", fmt.Errorf("probe handler %s: %w", h.Name(), err)
		}
	}
	// After the clones: redirectDefaults sets its own search_path.
	if _, err := tx.Exec(ctx, "SET LOCAL search_path TO pg_temp, "+iso.searchPath); err != nil {
		return "", fmt.Errorf("probe handler %s: %w", h.Name(), err)
	}
	ts, err := h.Writes(ctx, tx)
	if err != nil {
		return "", err
	}
	for _, t := range ts {
		if !strings.HasPrefix(t[0], "pg_temp") {
			return fmt.Sprintf("handler %s still writes %s, outside the bench schema: a schema-qualified name (write it unqualified: search_path decides where)", h.Name(), name(t)), nil
		}
	}
	if _, err := tx.Exec(ctx, "SET TRANSACTION READ ONLY"); err != nil {
		return "", fmt.Errorf("probe handler %s: %w", h.Name(), err)
	}
	err = h.Apply(ctx, tx, sample)
	if pe := (*pgconn.PgError)(nil); errors.As(err, &pe) && pe.Code == "25006" { // read_only_sql_transaction
		return fmt.Sprintf("handler %s, run over %d of the run's events in a read-only transaction whose written tables were temporary clones, had to write outside them (Postgres: %s): "+
			"its statement, or a view, function, operator, aggregate, cast or policy it reaches, writes a table of yours, advances a sequence of yours, "+
			"locks rows of a table it reads (SELECT … FOR UPDATE or FOR SHARE), creates a temporary table, or changes a definition",
			h.Name(), len(sample), pe.Message), nil
	}
	if ctx.Err() != nil {
		return "", ctx.Err()
	}
	return "", nil
}
