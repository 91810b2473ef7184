package orders

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Report is what Check found in the tables, next to what a single
// application of every wanted order implies.
type Report struct {
	UniqueEvents      int   `json:"unique_events"`       // orders wanted
	EmailsSent        int64 `json:"emails_sent"`         // rows in emails_sent
	EventsEmailedOnce int   `json:"events_emailed_once"` // wanted events with exactly one email
	OrdersCounter     int64 `json:"orders_counter"`      // analytics "orders"
	ItemsCounter      int64 `json:"items_counter"`       // analytics "items"
	ItemsReserved     int64 `json:"items_reserved"`      // sum of inventory_reserved
	RecommenderWeight int64 `json:"recommender_weight"`  // sum of recommender_weights
	// ProcessedRows counts processed_events rows per handler.
	ProcessedRows map[string]int64 `json:"processed_rows"`
	// Problems lists every effect that is missing, doubled or unexpected;
	// empty means every effect happened exactly once.
	Problems []string `json:"problems"`
}

// ExactlyOnce reports whether no problem was found.
func (r Report) ExactlyOnce() bool { return len(r.Problems) == 0 }

// maxListed bounds the per-key problems reported for one table.
const maxListed = 10

// Check compares the demo tables in schema with the effects of applying
// every order in want exactly once, by the handlers named (all four when
// none), and lists each difference. processed_events is read from schema
// too. It reads only; a Report with problems is not an error.
func Check(ctx context.Context, pool *pgxpool.Pool, schema string, want map[uuid.UUID]Order, handlers ...string) (Report, error) {
	if len(handlers) == 0 {
		handlers = Names
	}
	t := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	r := Report{UniqueEvents: len(want), ProcessedRows: map[string]int64{}}
	problem := func(format string, args ...any) { r.Problems = append(r.Problems, fmt.Sprintf(format, args...)) }

	var wantItems int64
	wantQty := map[string]int64{}
	wantWeight := map[userItem]int64{}
	for _, o := range want {
		wantItems += int64(len(o.Items))
		for _, it := range o.Items {
			wantQty[it]++
			wantWeight[userItem{o.UserID, it}]++
		}
	}

	// processed_events: one row per wanted event and handler, no other.
	rows, err := pool.Query(ctx, `SELECT handler, count(*) FROM `+t("processed_events")+` GROUP BY handler`)
	if err != nil {
		return r, fmt.Errorf("check processed_events: %w", err)
	}
	var h string
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&h, &n}, func() error { r.ProcessedRows[h] = n; return nil }); err != nil {
		return r, fmt.Errorf("check processed_events: %w", err)
	}
	for _, name := range handlers {
		if got := r.ProcessedRows[name]; got != int64(len(want)) {
			problem("processed_events: %d rows for %s, want %d", got, name, len(want))
		}
	}

	has := func(name string) bool { return slices.Contains(handlers, name) }
	if has(Email) {
		perEvent := map[uuid.UUID]int64{}
		rows, err := pool.Query(ctx, `SELECT event_id, count(*) FROM `+t("emails_sent")+` GROUP BY event_id`)
		if err != nil {
			return r, fmt.Errorf("check emails_sent: %w", err)
		}
		var id uuid.UUID
		if _, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error { perEvent[id] = n; r.EmailsSent += n; return nil }); err != nil {
			return r, fmt.Errorf("check emails_sent: %w", err)
		}
		listed := 0
		for id := range want {
			switch got := perEvent[id]; {
			case got == 1:
				r.EventsEmailedOnce++
			case listed < maxListed:
				listed++
				problem("emails_sent: %d emails for event %s, want 1", got, id)
			}
		}
		if r.EmailsSent != int64(len(want)) {
			problem("emails_sent: %d rows, want %d", r.EmailsSent, len(want))
		}
	}
	if has(Analytics) {
		rows, err := pool.Query(ctx, `SELECT name, sum(value)::bigint FROM `+t("analytics_counters")+` GROUP BY name`)
		if err != nil {
			return r, fmt.Errorf("check analytics_counters: %w", err)
		}
		counters := map[string]int64{}
		if _, err := pgx.ForEachRow(rows, []any{&h, &n}, func() error { counters[h] = n; return nil }); err != nil {
			return r, fmt.Errorf("check analytics_counters: %w", err)
		}
		r.OrdersCounter, r.ItemsCounter = counters["orders"], counters["items"]
		if r.OrdersCounter != int64(len(want)) {
			problem("analytics_counters: orders = %d, want %d", r.OrdersCounter, len(want))
		}
		if r.ItemsCounter != wantItems {
			problem("analytics_counters: items = %d, want %d", r.ItemsCounter, wantItems)
		}
	}
	if has(Inventory) {
		got := map[string]int64{}
		rows, err := pool.Query(ctx, `SELECT item, reserved FROM `+t("inventory_reserved"))
		if err != nil {
			return r, fmt.Errorf("check inventory_reserved: %w", err)
		}
		if _, err := pgx.ForEachRow(rows, []any{&h, &n}, func() error { got[h] = n; r.ItemsReserved += n; return nil }); err != nil {
			return r, fmt.Errorf("check inventory_reserved: %w", err)
		}
		diffCounts(got, wantQty, func(item string, g, w int64) {
			problem("inventory_reserved: item %s reserved %d, want %d", item, g, w)
		})
	}
	if has(Recommender) {
		got := map[userItem]int64{}
		rows, err := pool.Query(ctx, `SELECT user_id, item, weight FROM `+t("recommender_weights"))
		if err != nil {
			return r, fmt.Errorf("check recommender_weights: %w", err)
		}
		var k userItem
		if _, err := pgx.ForEachRow(rows, []any{&k.user, &k.item, &n}, func() error { got[k] = n; r.RecommenderWeight += n; return nil }); err != nil {
			return r, fmt.Errorf("check recommender_weights: %w", err)
		}
		diffCounts(got, wantWeight, func(k userItem, g, w int64) {
			problem("recommender_weights: user %d item %s weight %d, want %d", k.user, k.item, g, w)
		})
	}
	return r, nil
}

// diffCounts calls report for up to maxListed keys whose counts differ.
func diffCounts[K comparable](got, want map[K]int64, report func(k K, got, want int64)) {
	keys := maps.Collect(maps.All(want))
	for k := range got {
		keys[k] = want[k]
	}
	listed := 0
	for k := range keys {
		if got[k] != want[k] && listed < maxListed {
			listed++
			report(k, got[k], want[k])
		}
	}
}
