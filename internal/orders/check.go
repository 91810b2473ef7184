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
	c := &checker{pool: pool, schema: schema, want: want, exp: expect(want),
		r: Report{UniqueEvents: len(want), ProcessedRows: map[string]int64{}}}
	steps := []struct {
		handler string // "" : always
		check   func(context.Context) error
	}{
		{"", func(ctx context.Context) error { return c.processed(ctx, handlers) }},
		{Email, c.emails},
		{Analytics, c.analytics},
		{Inventory, c.inventory},
		{Recommender, c.recommender},
	}
	for _, s := range steps {
		if s.handler != "" && !slices.Contains(handlers, s.handler) {
			continue
		}
		if err := s.check(ctx); err != nil {
			return c.r, err
		}
	}
	return c.r, nil
}

// expected is what applying every wanted order once adds up to.
type expected struct {
	items  int64              // items over all orders
	qty    map[string]int64   // per item
	weight map[userItem]int64 // per (user, item)
}

func expect(want map[uuid.UUID]Order) expected {
	e := expected{qty: map[string]int64{}, weight: map[userItem]int64{}}
	for _, o := range want {
		e.items += int64(len(o.Items))
		for _, it := range o.Items {
			e.qty[it]++
			e.weight[userItem{o.UserID, it}]++
		}
	}
	return e
}

// checker holds one Check's inputs and the Report it fills.
type checker struct {
	pool   *pgxpool.Pool
	schema string
	want   map[uuid.UUID]Order
	exp    expected
	r      Report
}

func (c *checker) table(name string) string { return pgx.Identifier{c.schema, name}.Sanitize() }

func (c *checker) problem(format string, args ...any) {
	c.r.Problems = append(c.r.Problems, fmt.Sprintf(format, args...))
}

// counts runs sql, whose rows are (key, count), into a map.
func counts[K comparable](ctx context.Context, pool *pgxpool.Pool, what, sql string) (map[K]int64, error) {
	rows, err := pool.Query(ctx, sql)
	if err != nil {
		return nil, fmt.Errorf("check %s: %w", what, err)
	}
	out := map[K]int64{}
	var k K
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&k, &n}, func() error { out[k] = n; return nil }); err != nil {
		return nil, fmt.Errorf("check %s: %w", what, err)
	}
	return out, nil
}

// processed: one processed_events row per wanted event and handler.
func (c *checker) processed(ctx context.Context, handlers []string) error {
	rows, err := counts[string](ctx, c.pool, "processed_events",
		`SELECT handler, count(*) FROM `+c.table("processed_events")+` GROUP BY handler`)
	if err != nil {
		return err
	}
	c.r.ProcessedRows = rows
	for _, name := range handlers {
		if got := rows[name]; got != int64(len(c.want)) {
			c.problem("processed_events: %d rows for %s, want %d", got, name, len(c.want))
		}
	}
	return nil
}

// emails: exactly one emails_sent row per wanted event, and no other.
func (c *checker) emails(ctx context.Context) error {
	perEvent, err := counts[uuid.UUID](ctx, c.pool, "emails_sent",
		`SELECT event_id, count(*) FROM `+c.table("emails_sent")+` GROUP BY event_id`)
	if err != nil {
		return err
	}
	for _, n := range perEvent {
		c.r.EmailsSent += n
	}
	listed := 0
	for id := range c.want {
		switch got := perEvent[id]; {
		case got == 1:
			c.r.EventsEmailedOnce++
		case listed < maxListed:
			listed++
			c.problem("emails_sent: %d emails for event %s, want 1", got, id)
		}
	}
	if c.r.EmailsSent != int64(len(c.want)) {
		c.problem("emails_sent: %d rows, want %d", c.r.EmailsSent, len(c.want))
	}
	return nil
}

// analytics: the orders and items counters, summed over shards.
func (c *checker) analytics(ctx context.Context) error {
	counters, err := counts[string](ctx, c.pool, "analytics_counters",
		`SELECT name, sum(value)::bigint FROM `+c.table("analytics_counters")+` GROUP BY name`)
	if err != nil {
		return err
	}
	c.r.OrdersCounter, c.r.ItemsCounter = counters["orders"], counters["items"]
	if c.r.OrdersCounter != int64(len(c.want)) {
		c.problem("analytics_counters: orders = %d, want %d", c.r.OrdersCounter, len(c.want))
	}
	if c.r.ItemsCounter != c.exp.items {
		c.problem("analytics_counters: items = %d, want %d", c.r.ItemsCounter, c.exp.items)
	}
	return nil
}

// inventory: the quantity reserved per item.
func (c *checker) inventory(ctx context.Context) error {
	got, err := counts[string](ctx, c.pool, "inventory_reserved", `SELECT item, reserved FROM `+c.table("inventory_reserved"))
	if err != nil {
		return err
	}
	for _, n := range got {
		c.r.ItemsReserved += n
	}
	diffCounts(got, c.exp.qty, func(item string, g, w int64) {
		c.problem("inventory_reserved: item %s reserved %d, want %d", item, g, w)
	})
	return nil
}

// recommender: the weight per (user, item).
func (c *checker) recommender(ctx context.Context) error {
	rows, err := c.pool.Query(ctx, `SELECT user_id, item, weight FROM `+c.table("recommender_weights"))
	if err != nil {
		return fmt.Errorf("check recommender_weights: %w", err)
	}
	got := map[userItem]int64{}
	var k userItem
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&k.user, &k.item, &n}, func() error {
		got[k] = n
		c.r.RecommenderWeight += n
		return nil
	}); err != nil {
		return fmt.Errorf("check recommender_weights: %w", err)
	}
	diffCounts(got, c.exp.weight, func(k userItem, g, w int64) {
		c.problem("recommender_weights: user %d item %s weight %d, want %d", k.user, k.item, g, w)
	})
	return nil
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
