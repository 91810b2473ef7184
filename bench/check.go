package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// tableState is a written table after a run: its rows, and a digest of
// them (order-free) over the columns without a default (a default —
// now(), a sequence — differs between runs of the same events).
type tableState struct {
	Rows   int64  `json:"rows"`
	Digest string `json:"digest"`
}

// effects reads the state of tables (names in schema).
func effects(ctx context.Context, pool *pgxpool.Pool, schema string, tables []string) (map[string]tableState, error) {
	out := map[string]tableState{}
	for _, t := range tables {
		rows, err := pool.Query(ctx, `
SELECT quote_ident(a.attname) FROM pg_attribute a
WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped
  AND a.attidentity = '' AND a.attgenerated = ''
  AND NOT EXISTS (SELECT 1 FROM pg_attrdef d WHERE d.adrelid = a.attrelid AND d.adnum = a.attnum)
ORDER BY a.attnum`, pgx.Identifier{schema, t}.Sanitize())
		if err != nil {
			return nil, fmt.Errorf("read columns of %s: %w", t, err)
		}
		cols, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, fmt.Errorf("read columns of %s: %w", t, err)
		}
		expr := "0"
		if len(cols) > 0 {
			expr = "hashtextextended(ROW(" + strings.Join(cols, ", ") + ")::text, 0)"
		}
		var s tableState
		if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*), coalesce(sum(%s), 0)::text FROM %s`, expr,
			pgx.Identifier{schema, t}.Sanitize())).Scan(&s.Rows, &s.Digest); err != nil {
			return nil, fmt.Errorf("read %s: %w", t, err)
		}
		out[t] = s
	}
	return out, nil
}

// check returns what is wrong with a run's tables, nil when it applied
// every unique event exactly once: processed_events holds one claim per
// (unique event, handler), no event of the stream is a dead letter, and
// the written tables are as the effects-only baseline left them (ref;
// nil: not compared). claims says whether the run writes claims (the
// effects-only baseline does not).
func check(ctx context.Context, pool *pgxpool.Pool, schema string, handlers []string, unique int, claims bool,
	got, ref map[string]tableState) ([]string, error) {
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
		names := make([]string, 0, len(ref))
		for t := range ref {
			names = append(names, t)
		}
		slices.Sort(names)
		for _, t := range names {
			w, g := ref[t], got[t]
			switch {
			case g.Rows != w.Rows:
				ps = append(ps, fmt.Sprintf("table %s has %d rows, effects-only wrote %d", t, g.Rows, w.Rows))
			case g.Digest != w.Digest:
				ps = append(ps, fmt.Sprintf("table %s has other contents than effects-only wrote (%d rows both): an effect applied twice, or a column that differs by run (partition, offset)", t, g.Rows))
			}
		}
	}
	return ps, nil
}
