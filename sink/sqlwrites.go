package sink

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// SQL returns the statement as configured (SQLHandlerConfig.SQL).
func (h *SQLHandler) SQL() string { return h.user }

// Writes returns the tables the statement writes (INSERT, UPDATE, DELETE,
// MERGE, in its own WITH clauses too), schema and name as Postgres
// resolves them on db's search_path, each once, in plan order. Like
// Check, it EXPLAINs the statement over an empty events in a transaction
// it rolls back, and runs nothing. What the plan does not show is not
// included: tables written by triggers, rules or the functions the
// statement calls. Its error is Check's (a *SQLError naming the handler)
// when Postgres refuses the statement.
func (h *SQLHandler) Writes(ctx context.Context, db TxBeginner) ([]pgx.Identifier, error) {
	if err := h.Check(ctx, db); err != nil {
		return nil, err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("plan handler %q: %w", h.name, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // only ever rolled back
	var plan []byte
	if err := tx.QueryRow(ctx, "EXPLAIN (VERBOSE, FORMAT JSON) "+h.stmt, h.args(nil)...).Scan(&plan); err != nil {
		return nil, fmt.Errorf("plan handler %q: %w", h.name, err)
	}
	var root any
	if err := json.Unmarshal(plan, &root); err != nil {
		return nil, fmt.Errorf("plan handler %q: %w", h.name, err)
	}
	var out []pgx.Identifier
	seen := map[[2]string]bool{}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case []any:
			for _, x := range v {
				walk(x)
			}
		case map[string]any:
			if v["Node Type"] == "ModifyTable" {
				s, _ := v["Schema"].(string)
				r, _ := v["Relation Name"].(string)
				if k := [2]string{s, r}; r != "" && !seen[k] {
					seen[k] = true
					out = append(out, pgx.Identifier{s, r})
				}
			}
			walk(v["Plan"])
			walk(v["Plans"])
		}
	}
	walk(root)
	return out, nil
}
