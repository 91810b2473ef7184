package bench

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/migrate"
	"github.com/onceflow/onceflow/sink"
)

// Isolation is how a benchmark keeps off the user's tables: the tables
// the SQL handlers write, found in their plans, each cloned empty into a
// schema of the benchmark's own, which is first on the search_path of
// the benchmark's connections. Go handlers are built for that schema
// (they take it as a parameter, as `onceflow run` builds them for
// postgres.schema) and their tables made there by Config.Migrate.
// An Isolation is safe for concurrent use once made.
type Isolation struct {
	user       *pgxpool.Pool // the user's database, as configured
	searchPath string        // the user's connections' search_path
	tables     []pgx.Identifier
	sql        []*sink.SQLHandler
	migrate    migrate.Func

	mu      sync.Mutex
	written []string // the clones' names and the Go handlers' tables, set by Create
}

// RefusedError is a benchmark that cannot keep off the user's tables: it
// names every table and why.
type RefusedError struct {
	Problems []string // each names a table (schema.name) or a function
}

func (e *RefusedError) Error() string {
	return "bench cannot isolate the handlers' writes from your tables, so it writes nothing:\n  " +
		strings.Join(e.Problems, "\n  ") +
		"\n  (bench clones the tables a SQL handler writes, found by their unqualified names, into a schema of its own)"
}

// Isolate finds the tables hs write and checks that the benchmark can
// redirect them: every problem is a *RefusedError, naming the tables.
// It refuses
//   - a written table that has a trigger or a rule (either may write
//     elsewhere, and a clone has neither);
//   - a statement that calls a volatile function of the user's (not
//     Postgres' own nor an extension's), which may write anywhere;
//   - two written tables of one name in different schemas;
//
// and, when a schema is made (Create), a statement that still writes
// outside it: a table named with its schema (public.payments).
// user is the user's pool; it is read, never written.
func Isolate(ctx context.Context, user *pgxpool.Pool, hs []sink.Handler, m migrate.Func) (*Isolation, error) {
	iso := &Isolation{user: user, migrate: m}
	if err := user.QueryRow(ctx, "SHOW search_path").Scan(&iso.searchPath); err != nil {
		return nil, fmt.Errorf("read search_path: %w", err)
	}
	var ps []string
	byName := map[string]pgx.Identifier{}
	for _, h := range hs {
		sh, ok := h.(*sink.SQLHandler)
		if !ok {
			continue
		}
		iso.sql = append(iso.sql, sh)
		ts, err := sh.Writes(ctx, user)
		if err != nil {
			return nil, err
		}
		for _, t := range ts {
			if o, ok := byName[t[1]]; ok && !slices.Equal(o, t) {
				ps = append(ps, fmt.Sprintf("%s and %s: two written tables of one name", name(o), name(t)))
				continue
			}
			if _, ok := byName[t[1]]; !ok {
				byName[t[1]] = t
				iso.tables = append(iso.tables, t)
			}
		}
		fs, err := volatileCalls(ctx, user, sh.SQL())
		if err != nil {
			return nil, err
		}
		for _, f := range fs {
			ps = append(ps, fmt.Sprintf("handler %s calls %s(), a volatile function of yours, which may write to any table", sh.Name(), f))
		}
	}
	for _, t := range iso.tables {
		rows, err := user.Query(ctx, `
SELECT 'trigger ' || tgname FROM pg_trigger WHERE tgrelid = $1::regclass AND NOT tgisinternal
UNION ALL
SELECT 'rule ' || rulename FROM pg_rules WHERE schemaname = $2 AND tablename = $3
ORDER BY 1`, t.Sanitize(), t[0], t[1])
		if err != nil {
			return nil, fmt.Errorf("read triggers of %s: %w", t.Sanitize(), err)
		}
		what, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, fmt.Errorf("read triggers of %s: %w", t.Sanitize(), err)
		}
		for _, w := range what {
			ps = append(ps, fmt.Sprintf("%s has %s, which may write elsewhere (a clone would not have it)", name(t), w))
		}
	}
	if len(ps) > 0 {
		return nil, &RefusedError{Problems: ps}
	}
	return iso, nil
}

// Tables returns the user's tables the SQL handlers write.
func (iso *Isolation) Tables() []pgx.Identifier { return slices.Clone(iso.tables) }

// Create makes schema (it must not exist): the written tables cloned
// empty (CREATE TABLE … (LIKE … INCLUDING ALL): columns, defaults,
// constraints but foreign keys, indexes), onceflow's tables, then the Go
// handlers' (the Migrate given to Isolate). It returns a pool of size
// connections whose search_path begins with schema, and checks that
// every SQL handler writes there only; on that error (a *RefusedError)
// or any other, the schema is dropped.
func (iso *Isolation) Create(ctx context.Context, schema string, size int) (_ *pgxpool.Pool, err error) {
	if _, err := iso.user.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return nil, fmt.Errorf("create schema %s: %w", schema, err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, iso.Drop(context.WithoutCancel(ctx), schema))
		}
	}()
	for _, t := range iso.tables {
		if _, err := iso.user.Exec(ctx, fmt.Sprintf("CREATE TABLE %s (LIKE %s INCLUDING ALL)",
			pgx.Identifier{schema, t[1]}.Sanitize(), t.Sanitize())); err != nil {
			return nil, fmt.Errorf("clone %s: %w", t.Sanitize(), err)
		}
	}
	if err := sink.Migrate(ctx, iso.user, schema); err != nil {
		return nil, err
	}
	own, err := tablesIn(ctx, iso.user, schema)
	if err != nil {
		return nil, err
	}
	if iso.migrate != nil {
		if err := iso.migrate(ctx, iso.user, schema); err != nil {
			return nil, fmt.Errorf("migrate the handlers' tables: %w", err)
		}
	}
	all, err := tablesIn(ctx, iso.user, schema)
	if err != nil {
		return nil, err
	}
	written := []string{}
	for _, t := range all {
		if !slices.Contains(own, t) || slices.ContainsFunc(iso.tables, func(c pgx.Identifier) bool { return c[1] == t }) {
			written = append(written, t)
		}
	}
	iso.mu.Lock()
	iso.written = written
	iso.mu.Unlock()
	pc := iso.user.Config().Copy()
	pc.MaxConns = int32(max(size, 1))
	if pc.ConnConfig.RuntimeParams == nil {
		pc.ConnConfig.RuntimeParams = map[string]string{}
	}
	pc.ConnConfig.RuntimeParams["search_path"] = pgx.Identifier{schema}.Sanitize() + ", " + iso.searchPath
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connect to the bench schema: %w", err)
	}
	var ps []string
	for _, h := range iso.sql {
		ts, err := h.Writes(ctx, pool)
		if err != nil {
			pool.Close()
			return nil, err
		}
		for _, t := range ts {
			if t[0] != schema {
				ps = append(ps, fmt.Sprintf("handler %s still writes %s, outside the bench schema: a schema-qualified name (write it unqualified: search_path decides where), or a rule", h.Name(), name(t)))
			}
		}
	}
	if len(ps) > 0 {
		pool.Close()
		return nil, &RefusedError{Problems: ps}
	}
	return pool, nil
}

// written returns the tables of a schema Create made that the handlers
// write: the clones and the Go handlers' tables (not onceflow's).
func (iso *Isolation) writtenTables() []string {
	iso.mu.Lock()
	defer iso.mu.Unlock()
	return slices.Clone(iso.written)
}

// tablesIn lists the ordinary and partitioned tables of schema that are
// not partitions.
func tablesIn(ctx context.Context, db *pgxpool.Pool, schema string) ([]string, error) {
	rows, err := db.Query(ctx, `SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') AND NOT c.relispartition ORDER BY 1`, schema)
	if err != nil {
		return nil, fmt.Errorf("list the tables of %s: %w", schema, err)
	}
	ts, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list the tables of %s: %w", schema, err)
	}
	return ts, nil
}

// Drop drops schema and everything in it.
func (iso *Isolation) Drop(ctx context.Context, schema string) error {
	if _, err := iso.user.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
		return fmt.Errorf("drop schema %s: %w", schema, err)
	}
	return nil
}

// volatileCalls returns the volatile functions of the user's (not in
// pg_catalog or information_schema, not an extension's) that sql calls —
// by name alone when the function's schema is on the search_path, else
// by its qualified name — each schema-qualified.
func volatileCalls(ctx context.Context, db *pgxpool.Pool, sql string) ([]string, error) {
	rows, err := db.Query(ctx, `
SELECT DISTINCT n.nspname, p.proname, n.nspname = ANY(current_schemas(false)) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\_%'
  AND p.provolatile = 'v' AND p.prokind IN ('f', 'p')
  AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e')
ORDER BY 1, 2`)
	if err != nil {
		return nil, fmt.Errorf("read functions: %w", err)
	}
	type fn struct {
		Schema, Name string
		OnPath       bool
	}
	fs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[fn])
	if err != nil {
		return nil, fmt.Errorf("read functions: %w", err)
	}
	var out []string
	for _, f := range fs {
		// Called by its name alone when its schema is on the search_path,
		// else by its qualified name.
		prefix := `"?` + regexp.QuoteMeta(f.Schema) + `"?\s*\.\s*`
		if f.OnPath {
			prefix = "(?:" + prefix + ")?"
		}
		re := regexp.MustCompile(`(?i)(^|[^\w$.])` + prefix + `"?` + regexp.QuoteMeta(f.Name) + `"?\s*\(`)
		if re.MatchString(sql) {
			out = append(out, f.Schema+"."+f.Name)
		}
	}
	return out, nil
}

// name is a table's schema.name as the user wrote it, unquoted.
func name(t pgx.Identifier) string { return strings.Join(t, ".") }
