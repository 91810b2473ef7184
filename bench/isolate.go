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
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/migrate"
	"github.com/onceflow/onceflow/sink"
)

// Isolation is how a benchmark keeps off the user's tables: the tables
// the SQL handlers write, found in their plans, each cloned empty into a
// schema of the benchmark's own (cloneSchema of the run's schema), which
// is first on the search_path of the benchmark's connections, and the
// user's sequences those tables' defaults and the handlers' SQL call, each
// cloned there under its name. onceflow's tables are in the run's schema,
// apart from the clones, so a table of the user's may bear one of their
// names. Go handlers are built for the run's schema (they take it as a
// parameter, as `onceflow run` builds them for postgres.schema) and their
// tables made there by Config.Migrate.
// An Isolation is safe for concurrent use once made.
type Isolation struct {
	user       *pgxpool.Pool // the user's database, as configured
	searchPath string        // the user's connections' search_path
	tables     []pgx.Identifier
	seqs       []pgx.Identifier // the user's sequences cloned with the tables
	sql        []*sink.SQLHandler
	migrate    migrate.Func

	mu       sync.Mutex
	goTables []string             // the Go handlers' tables, set by Create
	guards   map[string]*runGuard // by the schema Create made, until Drop
}

// RefusedError is a benchmark that cannot keep off the user's tables: it
// names every table and why.
type RefusedError struct {
	Problems []string // each names a table (schema.name), a sequence or a function
}

func (e *RefusedError) Error() string {
	return "bench cannot isolate the handlers' writes from your tables, so it writes nothing:\n  " +
		strings.Join(e.Problems, "\n  ") +
		"\n  (bench clones the tables a SQL handler writes, found by their unqualified names, into a schema of its own)"
}

// benchSchemaComment marks the schemas Create makes, so that a run's
// guard leaves out every benchmark's, at once or kept.
const benchSchemaComment = "onceflow bench: a run's schema, dropped at its end"

// cloneSchema is the schema that holds the clones of the user's tables
// and sequences for a run whose own schema (onceflow's tables, the Go
// handlers') is schema. Create makes both; Drop drops both.
func cloneSchema(schema string) string { return schema + "_t" }

// Isolate finds the tables hs write and checks that the benchmark can
// redirect them: every problem is a *RefusedError, naming the tables.
// It refuses
//   - a written table that has a trigger or a rule (either may write
//     elsewhere, and a clone has neither); a statement that writes a
//     view or a table with a rule is refused before its plan, naming the
//     view or the rule;
//   - a written table whose default, generated column, constraint,
//     index (its expressions and predicate), extended statistics (which
//     ANALYZE computes) or column's domain calls a
//     function of the user's (not Postgres' own nor an extension's) that
//     is not IMMUTABLE, or IMMUTABLE but able to write all the same (in
//     another language than sql or plpgsql, running dynamic SQL, or
//     calling such a function): the clone would call it; or that calls
//     set_config, or uses a sequence anywhere but in a column's default;
//   - a statement that calls a volatile function of the user's, or one
//     of theirs that calls one, which may write anywhere;
//   - a statement that calls set_config, or a function of the user's
//     that can change the search_path or the role (set_config, SET,
//     RESET in it or in a function it calls): the isolation is the
//     search_path;
//   - a statement that calls nextval, setval or currval with a sequence
//     named with its schema ('public.seq') or at run time (not a
//     literal), or a function of the user's that calls nextval or
//     setval (in it or in one it calls);
//   - two written tables, or two cloned sequences, of one name in
//     different schemas;
//
// and, when a schema is made (Create), a statement that still writes
// outside it: a table named with its schema (public.payments).
// user is the user's pool; it is read, never written.
func Isolate(ctx context.Context, user *pgxpool.Pool, hs []sink.Handler, m migrate.Func) (*Isolation, error) {
	iso := &Isolation{user: user, migrate: m}
	if err := user.QueryRow(ctx, "SHOW search_path").Scan(&iso.searchPath); err != nil {
		return nil, fmt.Errorf("read search_path: %w", err)
	}
	fns, err := loadFuncs(ctx, user)
	if err != nil {
		return nil, err
	}
	var ps []string
	byName := map[string]pgx.Identifier{}
	seqs := map[string]pgx.Identifier{}
	addSeq := func(s pgx.Identifier) {
		if o, ok := seqs[s[1]]; ok && !slices.Equal(o, s) {
			ps = append(ps, fmt.Sprintf("sequences %s and %s: two sequences of one name to clone", name(o), name(s)))
			return
		} else if !ok {
			seqs[s[1]] = s
			iso.seqs = append(iso.seqs, s)
		}
	}
	for _, h := range hs {
		sh, ok := h.(*sink.SQLHandler)
		if !ok {
			continue
		}
		iso.sql = append(iso.sql, sh)
		rps, err := rewrittenTargets(ctx, user, sh.Name(), sh.SQL())
		if err != nil {
			return nil, err
		}
		if len(rps) > 0 { // its plan would name the tables behind them, or fail
			ps = append(ps, rps...)
			continue
		}
		ts, err := sh.Writes(ctx, readOnly{user})
		if pe := (*pgconn.PgError)(nil); errors.As(err, &pe) && pe.Code == "25006" { // read_only_sql_transaction
			ps = append(ps, fmt.Sprintf("handler %s: Postgres, planning its statement, had to write (%s): an IMMUTABLE function of yours that the statement or a written table's default calls with constant arguments (computed while planning) writes or calls nextval or setval", sh.Name(), pe.Message))
			continue
		}
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
		ps = append(ps, fns.handlerProblems(sh.Name(), sh.SQL())...)
		ss, sps, err := sequenceCalls(ctx, user, sh.Name(), sh.SQL())
		if err != nil {
			return nil, err
		}
		ps = append(ps, sps...)
		for _, s := range ss {
			addSeq(s)
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
		ss, eps, err := fns.expressionProblems(ctx, user, t)
		if err != nil {
			return nil, err
		}
		ps = append(ps, eps...)
		for _, s := range ss {
			addSeq(s)
		}
	}
	if len(ps) > 0 {
		return nil, &RefusedError{Problems: ps}
	}
	return iso, nil
}

// Tables returns the user's tables the SQL handlers write.
func (iso *Isolation) Tables() []pgx.Identifier { return slices.Clone(iso.tables) }

// Create makes schema, for onceflow's tables and the Go handlers' (the
// Migrate given to Isolate), and cloneSchema(schema), for the clones of
// the user's: each written table cloned empty (CREATE TABLE … (LIKE …
// INCLUDING ALL): columns, defaults, constraints but foreign keys,
// indexes; an identity column gets a sequence of the clone's) and each
// sequence its defaults or the SQL handlers call, cloned under its name
// with its definition, restarted at its START (the user's current value
// is not read, nor ever advanced); the clones' defaults call the cloned
// sequences. Neither schema may exist. It returns a pool of size
// connections whose search_path begins with cloneSchema(schema), and
// checks that every SQL handler writes there only; on that error (a
// *RefusedError) or any other, both schemas are dropped. It marks both
// (benchSchemaComment) and reads the guard of the run (Isolation.guard):
// the user's tables and sequences as they are then.
func (iso *Isolation) Create(ctx context.Context, schema string, size int) (_ *pgxpool.Pool, err error) {
	clones := cloneSchema(schema)
	for _, s := range []string{schema, clones} {
		// One transaction (the simple protocol's): a schema of a run is
		// never seen without its mark.
		if _, err := iso.user.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{s}.Sanitize()+"; COMMENT ON SCHEMA "+pgx.Identifier{s}.Sanitize()+" IS "+quoteLiteral(benchSchemaComment)); err != nil {
			err = fmt.Errorf("create schema %s: %w", s, err)
			if s == clones { // schema only: a clones schema that was there is not this run's
				if _, derr := iso.user.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); derr != nil {
					err = errors.Join(err, fmt.Errorf("drop schema %s: %w", schema, derr))
				}
			}
			return nil, err
		}
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, iso.Drop(context.WithoutCancel(ctx), schema))
		}
	}()
	// The sequences first: an identity column's sequence, named by
	// Postgres, then keeps off their names.
	for _, s := range iso.seqs {
		if err := cloneSequence(ctx, iso.user, s, pgx.Identifier{clones, s[1]}); err != nil {
			return nil, err
		}
	}
	for _, t := range iso.tables {
		if _, err := iso.user.Exec(ctx, fmt.Sprintf("CREATE TABLE %s (LIKE %s INCLUDING ALL)",
			pgx.Identifier{clones, t[1]}.Sanitize(), t.Sanitize())); err != nil {
			return nil, fmt.Errorf("clone %s: %w", t.Sanitize(), err)
		}
		if err := redirectDefaults(ctx, iso.user, pgx.Identifier{clones, t[1]}, clones); err != nil {
			return nil, err
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
	var ps []string
	goTables := []string{}
	for _, t := range all {
		if slices.Contains(own, t) {
			continue
		}
		goTables = append(goTables, t)
		if slices.ContainsFunc(iso.tables, func(c pgx.Identifier) bool { return c[1] == t }) {
			ps = append(ps, fmt.Sprintf("a Go handler's table %s and your %s, which a SQL handler writes: two written tables of one name", t, t))
		}
	}
	if len(ps) > 0 {
		return nil, &RefusedError{Problems: ps}
	}
	var written []string
	for _, t := range iso.tables {
		written = append(written, t[0])
	}
	g, err := newRunGuard(ctx, iso.user, written)
	if err != nil {
		return nil, err
	}
	iso.mu.Lock()
	iso.goTables = goTables
	if iso.guards == nil {
		iso.guards = map[string]*runGuard{}
	}
	iso.guards[schema] = g
	iso.mu.Unlock()
	pc := iso.user.Config().Copy()
	pc.MaxConns = int32(max(size, 1))
	if pc.ConnConfig.RuntimeParams == nil {
		pc.ConnConfig.RuntimeParams = map[string]string{}
	}
	pc.ConnConfig.RuntimeParams["search_path"] = pgx.Identifier{clones}.Sanitize() + ", " + iso.searchPath
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connect to the bench schema: %w", err)
	}
	for _, h := range iso.sql {
		ts, err := h.Writes(ctx, readOnly{pool})
		if err != nil {
			pool.Close()
			return nil, err
		}
		for _, t := range ts {
			if t[0] != clones {
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

// guard returns the guard of the run whose schema Create made: the
// user's tables and sequences as they were then (nil after Drop).
func (iso *Isolation) guard(schema string) *runGuard {
	iso.mu.Lock()
	defer iso.mu.Unlock()
	return iso.guards[schema]
}

// unmoved checks that no sequence of the user's moved since Create made
// schema (runGuard.moved).
func (iso *Isolation) unmoved(ctx context.Context, schema string) error {
	g := iso.guard(schema)
	if g == nil {
		return nil
	}
	return g.moved(ctx, iso.user)
}

// written returns the tables of a run whose schema Create made that the
// handlers write, by schema: the clones in cloneSchema(schema), the Go
// handlers' tables in schema (not onceflow's); a schema without any is
// left out.
func (iso *Isolation) written(schema string) map[string][]string {
	out := map[string][]string{}
	var cs []string
	for _, t := range iso.tables {
		cs = append(cs, t[1])
	}
	if len(cs) > 0 {
		slices.Sort(cs)
		out[cloneSchema(schema)] = cs
	}
	iso.mu.Lock()
	defer iso.mu.Unlock()
	if len(iso.goTables) > 0 {
		out[schema] = slices.Clone(iso.goTables)
	}
	return out
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

// Drop drops schema and cloneSchema(schema), and everything in them.
func (iso *Isolation) Drop(ctx context.Context, schema string) error {
	iso.mu.Lock()
	delete(iso.guards, schema)
	iso.mu.Unlock()
	if _, err := iso.user.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+", "+
		pgx.Identifier{cloneSchema(schema)}.Sanitize()+" CASCADE"); err != nil {
		return fmt.Errorf("drop schema %s: %w", schema, err)
	}
	return nil
}

// readOnly begins READ ONLY transactions, for the plans of the handlers'
// statements (sink.SQLHandler.Writes): planning computes the IMMUTABLE
// functions a statement calls with constant arguments, and the defaults
// of the table it writes, and one that calls nextval or setval then fails
// instead of advancing a sequence of the user's (what else it writes is
// rolled back).
type readOnly struct{ *pgxpool.Pool }

func (r readOnly) Begin(ctx context.Context) (pgx.Tx, error) {
	return r.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
}

// name is a table's schema.name as the user wrote it, unquoted.
func name(t pgx.Identifier) string { return strings.Join(t, ".") }

// userFunc is a function of the user's: not in pg_catalog,
// information_schema or another pg_ schema, nor an extension's.
type userFunc struct {
	OID          uint32
	Schema, Name string
	OnPath       bool   // its schema is on the search_path: called by its name alone
	Volatility   string // pg_proc.provolatile: i, s or v
	Lang         string
	Body         string // its source, or its SQL-standard body
}

// userFuncs are the user's functions with what each may do, found from
// their bodies: a call is a function's name (qualified, or alone when its
// schema is on the search_path) followed by "(", so a name in a string or
// a comment counts too; bench errs on refusing.
type userFuncs struct {
	fs    []userFunc
	re    []*regexp.Regexp // by fs's index: a call of it
	lower []string         // by fs's index: its name in lower case, to skip a text without it
	// setsPath: the function calls set_config, runs SET or RESET of the
	// search_path, the role or the session's authorization, or calls a
	// function of the user's that does.
	setsPath []bool
	// advancesSeq: the function calls nextval or setval (which Postgres
	// allows a function that is not volatile), or calls one of the user's
	// that does: a sequence named in a body is not redirected.
	advancesSeq []bool
	// callsVolatile: the function is volatile or calls one of the user's
	// that is, or calls one that does: the name of that one, or "".
	callsVolatile []string
	// unsafe: why the function may write although the statement calling
	// it cannot ("" when it cannot): Postgres keeps an IMMUTABLE (or
	// STABLE) sql or plpgsql function from writing itself, not what it
	// calls nor another language.
	unsafe []string
}

var (
	// setConfigCall is a call of set_config, Postgres' own, in SQL.
	setConfigCall = regexp.MustCompile(`(?i)(?:^|[^\w$.])(?:"?pg_catalog"?\s*\.\s*)?"?set_config"?\s*\(`)
	// setsPathSQL is a body that changes the search_path, the role or the
	// session's authorization (a column named role in UPDATE … SET role =
	// is not SET ROLE).
	setsPathSQL = regexp.MustCompile(`(?i)\bset_config"?\s*\(|\bset\s+(?:(?:local|session)\s+)?(?:search_path\b|role\s+[^=\s]|session\s+authorization\b)|\breset\s+(?:search_path|role|session\s+authorization|all)\b`)
	executeSQL  = regexp.MustCompile(`(?i)\bexecute\b`)
	// advancesSeqSQL is a call of nextval or setval in a body.
	advancesSeqSQL = regexp.MustCompile(`(?i)(?:^|[^\w$])"?(?:nextval|setval)"?\s*\(`)
)

// loadFuncs reads the user's functions and works out what each may do.
func loadFuncs(ctx context.Context, db *pgxpool.Pool) (*userFuncs, error) {
	rows, err := db.Query(ctx, `
SELECT p.oid, n.nspname, p.proname, n.nspname = ANY(current_schemas(false)), p.provolatile::text, l.lanname,
       CASE WHEN p.prosqlbody IS NULL THEN coalesce(p.prosrc, '') ELSE pg_get_functiondef(p.oid) END
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace JOIN pg_language l ON l.oid = p.prolang
WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\_%'
  AND p.prokind IN ('f', 'p')
  AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e')
ORDER BY 2, 3, 1`)
	if err != nil {
		return nil, fmt.Errorf("read functions: %w", err)
	}
	fs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[userFunc])
	if err != nil {
		return nil, fmt.Errorf("read functions: %w", err)
	}
	u := &userFuncs{fs: fs, re: make([]*regexp.Regexp, len(fs)), lower: make([]string, len(fs)), setsPath: make([]bool, len(fs)), advancesSeq: make([]bool, len(fs)),
		callsVolatile: make([]string, len(fs)), unsafe: make([]string, len(fs))}
	for i, f := range fs {
		prefix := `"?` + regexp.QuoteMeta(f.Schema) + `"?\s*\.\s*`
		if f.OnPath {
			prefix = "(?:" + prefix + ")?"
		}
		u.lower[i] = strings.ToLower(f.Name)
		u.re[i] = regexp.MustCompile(`(?i)(?:^|[^\w$.])` + prefix + `"?` + regexp.QuoteMeta(f.Name) + `"?\s*\(`)
	}
	calls := make([][]int, len(fs))
	for i, f := range fs {
		calls[i] = u.called(f.Body)
		u.setsPath[i] = setsPathSQL.MatchString(f.Body)
		u.advancesSeq[i] = advancesSeqSQL.MatchString(f.Body)
		if f.Volatility == "v" {
			u.callsVolatile[i] = f.Schema + "." + f.Name
		}
		switch {
		case f.Volatility != "i":
			u.unsafe[i] = "a function of yours that is not IMMUTABLE"
		case f.Lang != "sql" && f.Lang != "plpgsql":
			u.unsafe[i] = fmt.Sprintf("an IMMUTABLE function of yours in language %s, which Postgres does not keep from writing", f.Lang)
		case f.Lang == "plpgsql" && executeSQL.MatchString(f.Body):
			u.unsafe[i] = "an IMMUTABLE function of yours that runs dynamic SQL (EXECUTE)"
		case u.setsPath[i]:
			u.unsafe[i] = "an IMMUTABLE function of yours that can change the search_path bench relies on"
		case u.advancesSeq[i]:
			u.unsafe[i] = "an IMMUTABLE function of yours that calls nextval or setval, which advance a sequence of yours"
		}
	}
	// What a function calls, it may do: until nothing changes.
	for changed := true; changed; {
		changed = false
		for i := range fs {
			for _, j := range calls[i] {
				if u.setsPath[j] && !u.setsPath[i] {
					u.setsPath[i], changed = true, true
				}
				if u.advancesSeq[j] && !u.advancesSeq[i] {
					u.advancesSeq[i], changed = true, true
				}
				if u.callsVolatile[j] != "" && u.callsVolatile[i] == "" {
					u.callsVolatile[i], changed = fs[j].Schema+"."+fs[j].Name, true
				}
				if u.unsafe[j] != "" && u.unsafe[i] == "" {
					u.unsafe[i], changed = fmt.Sprintf("an IMMUTABLE function of yours that calls %s.%s(), %s", fs[j].Schema, fs[j].Name, u.unsafe[j]), true
				}
			}
		}
	}
	return u, nil
}

// called returns the indexes of the user's functions sql calls.
func (u *userFuncs) called(sql string) []int {
	var out []int
	lower := strings.ToLower(sql)
	for i, re := range u.re {
		if strings.Contains(lower, u.lower[i]) && re.MatchString(sql) {
			out = append(out, i)
		}
	}
	return out
}

// handlerProblems are what a SQL handler's statement calls that bench
// cannot isolate: set_config, and the user's functions that are volatile,
// call one that is, or can change the search_path.
func (u *userFuncs) handlerProblems(handler, sql string) []string {
	var ps []string
	if setConfigCall.MatchString(sql) {
		ps = append(ps, fmt.Sprintf("handler %s calls set_config(), which can change the search_path bench relies on (its writes would go to your tables)", handler))
	}
	seen := map[string]bool{}
	for _, i := range u.called(sql) {
		f := u.fs[i]
		fn := f.Schema + "." + f.Name
		if seen[fn] {
			continue // an overload
		}
		seen[fn] = true
		switch {
		case f.Volatility == "v":
			ps = append(ps, fmt.Sprintf("handler %s calls %s(), a volatile function of yours, which may write to any table", handler, fn))
		case u.setsPath[i]:
			ps = append(ps, fmt.Sprintf("handler %s calls %s(), a function of yours that can change the search_path bench relies on (set_config, SET or RESET, in it or in what it calls)", handler, fn))
		case u.advancesSeq[i]:
			ps = append(ps, fmt.Sprintf("handler %s calls %s(), a function of yours that calls nextval or setval (in it or in what it calls): bench cannot redirect a sequence a function names, and it would advance yours", handler, fn))
		case u.callsVolatile[i] != "":
			ps = append(ps, fmt.Sprintf("handler %s calls %s(), a function of yours that calls %s(), a volatile one, which may write to any table", handler, fn, u.callsVolatile[i]))
		}
	}
	return ps
}

// expressionProblems are what a clone of t (LIKE … INCLUDING ALL) would
// run that bench cannot isolate: the functions its defaults, generated
// columns, constraints, indexes and columns' domains call (through an
// operator too), which must be Postgres' own (but set_config), an
// extension's, or the user's and safe (userFuncs.unsafe); and the
// sequences they use, which only a column's own default may (the
// sequences returned, for Create to clone and redirect).
func (u *userFuncs) expressionProblems(ctx context.Context, db *pgxpool.Pool, t pgx.Identifier) ([]pgx.Identifier, []string, error) {
	rows, err := db.Query(ctx, cloneExprs+`
SELECT DISTINCT e.what, e.is_default, dep.refclassid = 'pg_class'::regclass,
       coalesce(o.oprcode::oid, dep.refobjid), coalesce(fn.nspname, sn.nspname), coalesce(p.proname, s.relname)
FROM exprs e
JOIN pg_depend dep ON dep.classid = e.classid AND dep.objid = e.objid
LEFT JOIN pg_operator o ON dep.refclassid = 'pg_operator'::regclass AND o.oid = dep.refobjid
LEFT JOIN pg_proc p ON p.oid = CASE WHEN dep.refclassid = 'pg_proc'::regclass THEN dep.refobjid ELSE o.oprcode::oid END
LEFT JOIN pg_namespace fn ON fn.oid = p.pronamespace
LEFT JOIN pg_class s ON dep.refclassid = 'pg_class'::regclass AND s.oid = dep.refobjid AND s.relkind = 'S'
LEFT JOIN pg_namespace sn ON sn.oid = s.relnamespace
WHERE p.oid IS NOT NULL OR s.oid IS NOT NULL
ORDER BY 1, 5, 6`, t.Sanitize())
	if err != nil {
		return nil, nil, fmt.Errorf("read the expressions of %s: %w", name(t), err)
	}
	type use struct {
		What         string
		IsDefault    bool
		IsSequence   bool
		OID          uint32
		Schema, Name string
	}
	us, err := pgx.CollectRows(rows, pgx.RowToStructByPos[use])
	if err != nil {
		return nil, nil, fmt.Errorf("read the expressions of %s: %w", name(t), err)
	}
	rows, err = db.Query(ctx, cloneExprs+`SELECT what, coalesce(def, '') FROM exprs ORDER BY 1`, t.Sanitize())
	if err != nil {
		return nil, nil, fmt.Errorf("read the expressions of %s: %w", name(t), err)
	}
	type expr struct{ What, Def string }
	es, err := pgx.CollectRows(rows, pgx.RowToStructByPos[expr])
	if err != nil {
		return nil, nil, fmt.Errorf("read the expressions of %s: %w", name(t), err)
	}
	var seqs []pgx.Identifier
	var ps []string
	for _, e := range es {
		if setConfigCall.MatchString(e.Def) {
			ps = append(ps, fmt.Sprintf("%s: %s calls set_config(), which changes the search_path bench relies on", name(t), e.What))
		}
	}
	for _, x := range us {
		switch {
		case x.IsSequence && x.IsDefault:
			seqs = append(seqs, pgx.Identifier{x.Schema, x.Name})
		case x.IsSequence:
			ps = append(ps, fmt.Sprintf("%s: %s uses sequence %s.%s, which bench clones only for a column's default", name(t), x.What, x.Schema, x.Name))
		default:
			i := slices.IndexFunc(u.fs, func(f userFunc) bool { return f.OID == x.OID })
			if i >= 0 && u.unsafe[i] != "" {
				ps = append(ps, fmt.Sprintf("%s: %s calls %s.%s(), %s: a clone would call it, and it may write to any table (bench accepts there only IMMUTABLE sql or plpgsql functions of yours, which Postgres keeps from writing, calling none that may)",
					name(t), x.What, x.Schema, x.Name, u.unsafe[i]))
			}
		}
	}
	return seqs, ps, nil
}

// cloneExprs is, for the table $1, the expressions a clone of it (LIKE …
// INCLUDING ALL) keeps: exprs(classid, objid, what, is_default, def), the
// object pg_depend knows the expression by, what it is for a message,
// whether it is a column's default, and its text. Postgres' own functions
// are not in pg_depend: they are found in def.
const cloneExprs = `
WITH RECURSIVE cols(col, typ) AS (
    SELECT a.attname::text, a.atttypid FROM pg_attribute a
    WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped
  UNION
    SELECT c.col, CASE WHEN ty.typtype = 'd' THEN ty.typbasetype ELSE ty.typelem END
    FROM cols c JOIN pg_type ty ON ty.oid = c.typ
    WHERE ty.typtype = 'd' OR (ty.typcategory = 'A' AND ty.typelem <> 0)
), doms AS (
    SELECT c.col, ty.oid, format('%s.%s', n.nspname, ty.typname) AS dom, ty.typdefaultbin IS NOT NULL AS has_default, ty.typdefault AS default_text
    FROM cols c JOIN pg_type ty ON ty.oid = c.typ JOIN pg_namespace n ON n.oid = ty.typnamespace
    WHERE ty.typtype = 'd'
), exprs(classid, objid, what, is_default, def) AS (
    SELECT 'pg_attrdef'::regclass, d.oid,
           CASE WHEN a.attgenerated <> '' THEN 'generated column ' ELSE 'the default of column ' END || a.attname,
           a.attgenerated = '', pg_get_expr(d.adbin, d.adrelid)
    FROM pg_attrdef d JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
    WHERE d.adrelid = $1::regclass
  UNION ALL
    SELECT 'pg_constraint'::regclass, c.oid, 'constraint ' || c.conname, false, pg_get_constraintdef(c.oid)
    FROM pg_constraint c WHERE c.conrelid = $1::regclass AND c.contype <> 'f'
  UNION ALL
    SELECT 'pg_class'::regclass, i.indexrelid, 'index ' || ic.relname, false, pg_get_indexdef(i.indexrelid)
    FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid WHERE i.indrelid = $1::regclass
  UNION ALL
    SELECT 'pg_statistic_ext'::regclass, x.oid, 'statistics ' || x.stxname, false, pg_get_statisticsobjdef(x.oid)
    FROM pg_statistic_ext x WHERE x.stxrelid = $1::regclass
  UNION ALL
    SELECT 'pg_constraint'::regclass, c.oid, format('the domain %s of column %s (its constraint %s)', d.dom, d.col, c.conname), false, pg_get_constraintdef(c.oid)
    FROM doms d JOIN pg_constraint c ON c.contypid = d.oid
  UNION ALL
    SELECT 'pg_type'::regclass, d.oid, format('the domain %s of column %s (its default)', d.dom, d.col), false, d.default_text
    FROM doms d WHERE d.has_default
)
`

// writeTarget is a relation a statement writes: the name after INSERT
// INTO, UPDATE, DELETE FROM or MERGE INTO, with its schema if any.
var writeTarget = regexp.MustCompile(`(?i)(?:^|[^\w$."])(?:insert\s+into|update|delete\s+from|merge\s+into)\s+(?:only\s+)?((?:"(?:[^"]|"")+"|[\pL_][\w$]*)(?:\s*\.\s*(?:"(?:[^"]|"")+"|[\pL_][\w$]*))?)`)

// rewrittenTargets are the problems of the relations a handler's
// statement writes that Postgres rewrites into writes elsewhere: a view
// (its rule, or its INSTEAD OF trigger, writes the tables behind it) and
// a table with a rule on INSERT, UPDATE or DELETE (DO ALSO or DO
// INSTEAD), each named with its rules. A clone has no rule, and a view is
// not cloned. A word that is not a relation is left to the plan.
func rewrittenTargets(ctx context.Context, db *pgxpool.Pool, handler, sql string) ([]string, error) {
	var ps []string
	seen := map[string]bool{}
	for _, m := range writeTarget.FindAllStringSubmatch(sql, -1) {
		if seen[m[1]] {
			continue
		}
		seen[m[1]] = true
		var rel, kind string
		var rules []string
		err := db.QueryRow(ctx, `SELECT format('%s.%s', c.relnamespace::regnamespace, c.relname), c.relkind::text,
  coalesce((SELECT array_agg(format('%s (ON %s DO %s)', r.rulename,
      CASE r.ev_type WHEN '2' THEN 'UPDATE' WHEN '3' THEN 'INSERT' ELSE 'DELETE' END,
      CASE WHEN r.is_instead THEN 'INSTEAD' ELSE 'ALSO' END) ORDER BY r.rulename)
    FROM pg_rewrite r WHERE r.ev_class = c.oid AND r.ev_type IN ('2', '3', '4')), '{}')
FROM pg_class c WHERE c.oid = to_regclass($1)`, m[1]).Scan(&rel, &kind, &rules)
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if pe := (*pgconn.PgError)(nil); errors.As(err, &pe) {
			continue // not a name Postgres parses (a word of a string): left to the plan
		}
		if err != nil {
			return nil, fmt.Errorf("handler %s: find %s: %w", handler, m[1], err)
		}
		switch {
		case kind == "v":
			ps = append(ps, fmt.Sprintf("handler %s writes %s, a view: bench clones tables, not views, and the view would write the tables behind it (write the table itself)", handler, rel))
		case len(rules) > 0:
			ps = append(ps, fmt.Sprintf("handler %s writes %s, which has rule %s: a rule may write elsewhere (a clone would not have it)", handler, rel, strings.Join(rules, ", ")))
		}
	}
	return ps, nil
}

// sequenceCall is a call of nextval, setval or currval in SQL, with its
// first argument when that is a string literal.
var sequenceCall = regexp.MustCompile(`(?i)(?:^|[^\w$.])(?:"?pg_catalog"?\s*\.\s*)?"?(nextval|setval|currval)"?\s*\(\s*(?:'((?:[^']|'')*)')?`)

// sequenceCalls returns the user's sequences a handler's statement calls
// by their names alone (to clone), and its calls that bench cannot
// redirect: a sequence named with its schema, or not by a literal.
func sequenceCalls(ctx context.Context, db *pgxpool.Pool, handler, sql string) ([]pgx.Identifier, []string, error) {
	var seqs []pgx.Identifier
	var ps []string
	for _, m := range sequenceCall.FindAllStringSubmatchIndex(sql, -1) {
		fn := strings.ToLower(sql[m[2]:m[3]])
		if m[4] < 0 {
			ps = append(ps, fmt.Sprintf("handler %s calls %s() with a sequence it names at run time, which bench cannot redirect (name it in a literal: %s('my_seq'))", handler, fn, fn))
			continue
		}
		lit := strings.ReplaceAll(sql[m[4]:m[5]], "''", "'")
		var qualified bool
		var s pgx.Identifier = make([]string, 2)
		err := db.QueryRow(ctx, `SELECT cardinality(parse_ident($1)) > 1, n.nspname, c.relname
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1) AND c.relkind = 'S'`, lit).Scan(&qualified, &s[0], &s[1])
		if errors.Is(err, pgx.ErrNoRows) {
			continue // not a sequence: the statement's plan would have failed
		}
		if err != nil {
			return nil, nil, fmt.Errorf("handler %s: find sequence %q: %w", handler, lit, err)
		}
		if qualified {
			ps = append(ps, fmt.Sprintf("handler %s calls %s('%s'): a sequence named with its schema, which bench cannot redirect (name it alone: search_path decides which)", handler, fn, lit))
			continue
		}
		if !slices.ContainsFunc(seqs, func(o pgx.Identifier) bool { return slices.Equal(o, s) }) {
			seqs = append(seqs, s)
		}
	}
	return seqs, ps, nil
}

// querier is a *pgxpool.Pool or a pgx.Tx (Begin: a savepoint): a
// temporary clone is made in the transaction of one connection.
type querier interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// cloneSequence creates to with from's definition (type, increment,
// bounds, start, cache, cycle), at its start.
func cloneSequence(ctx context.Context, db querier, from, to pgx.Identifier) error {
	var def string
	if err := db.QueryRow(ctx, `SELECT format('AS %s INCREMENT BY %s MINVALUE %s MAXVALUE %s START WITH %s CACHE %s %s',
  s.seqtypid::regtype, s.seqincrement, s.seqmin, s.seqmax, s.seqstart, s.seqcache, CASE WHEN s.seqcycle THEN 'CYCLE' ELSE 'NO CYCLE' END)
FROM pg_sequence s WHERE s.seqrelid = $1::regclass`, from.Sanitize()).Scan(&def); err != nil {
		return fmt.Errorf("read sequence %s: %w", name(from), err)
	}
	if _, err := db.Exec(ctx, "CREATE SEQUENCE "+to.Sanitize()+" "+def); err != nil {
		return fmt.Errorf("clone sequence %s: %w", name(from), err)
	}
	return nil
}

// redirectDefaults makes the defaults of clone (in schema clones) that
// call one of the user's sequences call its clone, of the same name in
// clones (cloneSequence), instead.
func redirectDefaults(ctx context.Context, db querier, clone pgx.Identifier, clones string) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("redirect the defaults of %s: %w", name(clone), err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit, a no-op
	// With pg_catalog alone on the search_path, every other name in the
	// expressions is written with its schema.
	if _, err := tx.Exec(ctx, "SET LOCAL search_path TO pg_catalog"); err != nil {
		return fmt.Errorf("redirect the defaults of %s: %w", name(clone), err)
	}
	rows, err := tx.Query(ctx, `
SELECT a.attname::text, pg_get_expr(d.adbin, d.adrelid), array_agg(s.oid::regclass::text ORDER BY s.oid), array_agg(s.relname::text ORDER BY s.oid)
FROM pg_attrdef d JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
JOIN pg_depend dep ON dep.classid = 'pg_attrdef'::regclass AND dep.objid = d.oid AND dep.refclassid = 'pg_class'::regclass
JOIN pg_class s ON s.oid = dep.refobjid AND s.relkind = 'S'
WHERE d.adrelid = $1::regclass AND a.attgenerated = ''
GROUP BY 1, 2`, clone.Sanitize())
	if err != nil {
		return fmt.Errorf("read the defaults of %s: %w", name(clone), err)
	}
	type def struct {
		Column, Expr string
		Seqs, Names  []string
	}
	ds, err := pgx.CollectRows(rows, pgx.RowToStructByPos[def])
	if err != nil {
		return fmt.Errorf("read the defaults of %s: %w", name(clone), err)
	}
	for _, d := range ds {
		expr := d.Expr
		for i, s := range d.Seqs {
			old := quoteLiteral(s) + "::regclass"
			if !strings.Contains(expr, old) {
				return fmt.Errorf("redirect the default of %s.%s (%s) to a clone of sequence %s: not found in it", name(clone), d.Column, d.Expr, s)
			}
			expr = strings.ReplaceAll(expr, old, quoteLiteral(pgx.Identifier{clones, d.Names[i]}.Sanitize())+"::regclass")
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf("ALTER TABLE %s ALTER COLUMN %s SET DEFAULT %s",
			clone.Sanitize(), pgx.Identifier{d.Column}.Sanitize(), expr)); err != nil {
			return fmt.Errorf("redirect the default of %s.%s: %w", name(clone), d.Column, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("redirect the defaults of %s: %w", name(clone), err)
	}
	return nil
}

// quoteLiteral is s as a SQL string literal (standard_conforming_strings).
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
