package bench

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TableState is a written table after a run: its rows, a digest of them
// (order-free) over the columns without a default (a default — now(), a
// sequence — differs between runs of the same events), its numeric
// columns' sums, and a digest of each other column's distinct values.
type TableState struct {
	Rows   int64  `json:"rows"`
	Digest string `json:"digest"`
	// Sums are the sums of the numeric columns (without a default), by
	// column: what a table of counters split by partition (a shard per
	// batch's partition) keeps whichever delivery was applied.
	Sums map[string]string `json:"sums,omitempty"`
	// Columns are, for each other column (without a default), a digest
	// of its distinct values: a counter table's keys are the same
	// whichever delivery was applied, a column of now() is not.
	Columns map[string]string `json:"columns,omitempty"`
}

// How a table passed the check against effects-only (RunResult.TableChecks).
const (
	// CheckDigest: the same rows, count and digest of every column.
	CheckDigest = "digest"
	// CheckSums: rows that differ by delivery (a counter per partition),
	// with the same sums of the numeric columns and the same distinct
	// values in every other column.
	CheckSums = "sums"
)

// effects reads the state of tables (names in schema).
func effects(ctx context.Context, pool *pgxpool.Pool, schema string, tables []string) (map[string]TableState, error) {
	out := map[string]TableState{}
	for _, t := range tables {
		rows, err := pool.Query(ctx, `
SELECT quote_ident(a.attname), a.atttypid IN ('int2'::regtype, 'int4'::regtype, 'int8'::regtype, 'numeric'::regtype, 'float4'::regtype, 'float8'::regtype)
FROM pg_attribute a
WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped
  AND a.attidentity = '' AND a.attgenerated = ''
  AND NOT EXISTS (SELECT 1 FROM pg_attrdef d WHERE d.adrelid = a.attrelid AND d.adnum = a.attnum)
ORDER BY a.attnum`, pgx.Identifier{schema, t}.Sanitize())
		if err != nil {
			return nil, fmt.Errorf("read columns of %s: %w", t, err)
		}
		type column struct {
			Name    string
			Numeric bool
		}
		cols, err := pgx.CollectRows(rows, pgx.RowToStructByPos[column])
		if err != nil {
			return nil, fmt.Errorf("read columns of %s: %w", t, err)
		}
		var names, sums, distinct, numeric, others []string
		for _, c := range cols {
			names = append(names, c.Name)
			if c.Numeric {
				numeric = append(numeric, c.Name)
				sums = append(sums, fmt.Sprintf("coalesce(sum(%s), 0)::text", c.Name))
			} else {
				others = append(others, c.Name)
				distinct = append(distinct, fmt.Sprintf("coalesce(sum(DISTINCT hashtextextended(%s::text, 0)), 0)::text", c.Name))
			}
		}
		expr := "0"
		if len(names) > 0 {
			expr = "hashtextextended(ROW(" + strings.Join(names, ", ") + ")::text, 0)"
		}
		s := TableState{Sums: map[string]string{}, Columns: map[string]string{}}
		dest := []any{&s.Rows, &s.Digest}
		vals := make([]string, len(numeric)+len(others))
		for i := range vals {
			dest = append(dest, &vals[i])
		}
		q := fmt.Sprintf(`SELECT count(*), coalesce(sum(%s), 0)::text%s FROM %s`, expr,
			strings.Join(append(append([]string{""}, sums...), distinct...), ", "), pgx.Identifier{schema, t}.Sanitize())
		if err := pool.QueryRow(ctx, q).Scan(dest...); err != nil {
			return nil, fmt.Errorf("read %s: %w", t, err)
		}
		for i, c := range numeric {
			s.Sums[c] = vals[i]
		}
		for i, c := range others {
			s.Columns[c] = vals[len(numeric)+i]
		}
		out[t] = s
	}
	return out, nil
}

// check returns what is wrong with a run's tables, nil when it applied
// every unique event exactly once: processed_events holds one claim per
// (unique event, handler), no event of the stream is a dead letter, and
// the written tables are as the effects-only baseline left them (ref;
// nil: not compared; see compareTables). claims says whether the run
// writes claims (the effects-only baseline does not).
func check(ctx context.Context, pool *pgxpool.Pool, schema string, handlers []string, unique int, claims bool,
	got, ref map[string]TableState) ([]string, error) {
	var ps []string
	if claims {
		rows, err := pool.Query(ctx, `SELECT handler, count(*) FROM `+pgx.Identifier{schema, "processed_events"}.Sanitize()+` GROUP BY 1`)
		if err != nil {
			return nil, fmt.Errorf("count claims: %w", err)
		}
		n := map[string]int64{}
		for rows.Next() {
			var h string
			var c int64
			if err := rows.Scan(&h, &c); err != nil {
				rows.Close()
				return nil, fmt.Errorf("count claims: %w", err)
			}
			n[h] = c
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("count claims: %w", err)
		}
		for _, h := range handlers {
			if n[h] != int64(unique) {
				ps = append(ps, fmt.Sprintf("handler %s claimed %d events, want the %d unique ones", h, n[h], unique))
			}
		}
		var dl int64
		var reason *string
		if err := pool.QueryRow(ctx, `SELECT count(*), min(reason) FROM `+pgx.Identifier{schema, "dead_letters"}.Sanitize()).Scan(&dl, &reason); err != nil {
			return nil, fmt.Errorf("count dead letters: %w", err)
		}
		if dl > 0 {
			ps = append(ps, fmt.Sprintf("%d dead letters (one: %s): the payloads must apply without error", dl, *reason))
		}
	}
	if ref != nil {
		tps, _ := compareTables(got, ref)
		ps = append(ps, tps...)
	}
	return ps, nil
}

// compareTables compares a run's tables (got) with effects-only's (ref)
// and returns the problems, and how each table that passed passed:
// CheckDigest, the same rows (count and digest of every column without a
// default); else CheckSums, for rows that depend on the delivery (a
// counter per partition, where an event's redelivery on another
// partition may be the one applied): the same sums of the numeric
// columns and the same distinct values in every other column.
//
// A column whose values change between runs of the same events — now(),
// clock_timestamp(), random() written by the handler — fails the check
// whatever its table's other columns: effects-only's rows cannot be told
// from a doubled or lost effect then. The problem names the column; a
// column with a DEFAULT is left out of the check, so a handler that
// leaves such a value to the table's default (or writes the event's
// timestamp) is checked.
func compareTables(got, ref map[string]TableState) (problems []string, how map[string]string) {
	how = map[string]string{}
	names := slices.Sorted(maps.Keys(ref))
	for _, t := range names {
		w, g := ref[t], got[t]
		if g.Rows == w.Rows && g.Digest == w.Digest {
			how[t] = CheckDigest
			continue
		}
		var cols []string // the columns that differ
		volatile := false // a column other than a sum differs
		for _, c := range slices.Sorted(maps.Keys(w.Sums)) {
			if g.Sums[c] != w.Sums[c] {
				cols = append(cols, fmt.Sprintf("column %s sums to %s, effects-only's to %s", c, orZero(g.Sums[c]), orZero(w.Sums[c])))
			}
		}
		for _, c := range slices.Sorted(maps.Keys(w.Columns)) {
			if g.Columns[c] != w.Columns[c] {
				cols = append(cols, fmt.Sprintf("column %s holds other values", c))
				volatile = true
			}
		}
		if len(cols) == 0 && len(w.Sums) > 0 {
			how[t] = CheckSums
			continue
		}
		p := fmt.Sprintf("table %s has other contents than effects-only wrote (%d rows both)", t, g.Rows)
		if g.Rows != w.Rows {
			p = fmt.Sprintf("table %s has %d rows, effects-only wrote %d", t, g.Rows, w.Rows)
		}
		if len(cols) > 0 {
			p += ": " + strings.Join(cols, ", ")
		}
		if volatile && g.Rows == w.Rows {
			p += " (a value that changes between runs, now(), clock_timestamp() or random() written by the handler, cannot be checked: " +
				"leave it to a DEFAULT of the table, not checked, or write the event's timestamp)"
		}
		problems = append(problems, p)
	}
	return problems, how
}

func orZero(s string) string {
	if s == "" {
		return "0"
	}
	return s
}
