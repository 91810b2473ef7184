package orders

import (
	"cmp"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/migrate"
	"github.com/onceflow/onceflow/sink"
)

// The handler names, as in the seed; they are the processed_events.handler values.
const (
	Email       = "emailHandler"
	Inventory   = "inventoryHandler"
	Analytics   = "analyticsHandler"
	Recommender = "recommenderHandler"
)

// Names lists the four handlers in the order they run.
var Names = []string{Email, Inventory, Analytics, Recommender}

// Order is the seed's order event.
type Order struct {
	UserID int64    `json:"user_id"`
	Items  []string `json:"items"`
}

// Parse decodes and validates an order payload as encoding/json does.
// Unknown fields are ignored, so producers may add fields. The error names
// the problem. The shape producers write is read without encoding/json,
// at a tenth of its cost (see readOrder).
func Parse(value []byte) (Order, error) {
	o, ok := readOrder(value)
	if !ok {
		o = Order{}
		if err := json.Unmarshal(value, &o); err != nil {
			return o, fmt.Errorf("not an order: %w", err)
		}
	}
	if o.UserID <= 0 {
		return o, fmt.Errorf("not an order: user_id must be a positive integer, got %d", o.UserID)
	}
	if len(o.Items) == 0 {
		return o, fmt.Errorf("not an order: items is empty")
	}
	for i, it := range o.Items {
		if it == "" {
			return o, fmt.Errorf("not an order: items[%d] is empty", i)
		}
	}
	return o, nil
}

// ParseEvent is Parse for [sink.Config.Parse]: with it, a batch parses
// each order once for all four handlers, which then read Event.Parsed, and
// an event that is not an order becomes a dead letter before any handler
// runs. Without it, each handler parses the values itself.
func ParseEvent(e sink.Event) (any, error) { return Parse(e.Value) }

// orderOf is the order e carries: Event.Parsed when ParseEvent made it,
// else e's value parsed here.
func orderOf(e sink.Event) (Order, error) {
	if o, ok := e.Parsed.(Order); ok {
		return o, nil
	}
	return Parse(e.Value)
}

//go:embed migrations/*.sql migrations/producer/*.sql
var migrations embed.FS

// Migrate creates the demo business tables in schema: the producer's
// orders table (see [MigrateProducer]) and the four handlers' tables.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	if err := MigrateProducer(ctx, pool, schema); err != nil {
		return err
	}
	return migrate.Apply(ctx, pool, schema, "orders", migrations, "migrations")
}

// MigrateProducer creates only the orders table in schema: what [Insert]
// and [ID] need, for a program that takes orders (the seed's POST
// /events-outbox/{bus}) whichever handlers consume them.
func MigrateProducer(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	return migrate.Apply(ctx, pool, schema, "orders.producer", migrations, "migrations/producer")
}

// New returns the handler called name, writing to its table in schema,
// and false when name is not one of Names. Handlers are safe for
// concurrent use.
func New(name, schema string) (sink.Handler, bool) {
	t := func(table string) pgx.Identifier { return pgx.Identifier{schema, table} }
	switch name {
	case Email:
		return &handler{name: Email, table: t("emails_sent"), apply: applyEmail}, true
	case Inventory:
		return &handler{name: Inventory, table: t("inventory_reserved"), apply: applyInventory}, true
	case Analytics:
		return &handler{name: Analytics, table: t("analytics_counters"), apply: applyAnalytics}, true
	case Recommender:
		return &handler{name: Recommender, table: t("recommender_weights"), apply: applyRecommender}, true
	}
	return nil, false
}

// Handlers returns the handlers named in names (all four when names is
// empty), writing to tables in schema. An unknown name is an error that
// lists Names.
func Handlers(schema string, names ...string) ([]sink.Handler, error) {
	if len(names) == 0 {
		names = Names
	}
	out := make([]sink.Handler, 0, len(names))
	for _, n := range names {
		h, ok := New(n, schema)
		if !ok {
			return nil, fmt.Errorf("unknown handler %q (known: %s)", n, strings.Join(Names, ", "))
		}
		out = append(out, h)
	}
	return out, nil
}

// handler parses the batch's orders once and hands them to its apply.
type handler struct {
	name  string
	table pgx.Identifier
	apply func(ctx context.Context, tx pgx.Tx, table pgx.Identifier, events []sink.Event, orders []Order) error
}

func (h *handler) Name() string { return h.name }

func (h *handler) Apply(ctx context.Context, tx pgx.Tx, events []sink.Event) error {
	orders := make([]Order, len(events))
	var rejected []error
	for i, e := range events {
		o, err := orderOf(e)
		if err != nil {
			rejected = append(rejected, &sink.RejectError{EventID: e.ID, Reason: err.Error()})
		}
		orders[i] = o
	}
	if len(rejected) > 0 {
		return errors.Join(rejected...) // every bad order of the batch at once
	}
	return h.apply(ctx, tx, h.table, events, orders)
}

// Subject is the subject of the confirmation email emailHandler sends for o.
func Subject(o Order) string { return "Order confirmation: " + strconv.Itoa(len(o.Items)) + " item(s)" }

// applyEmail writes one emails_sent row per order by binary COPY, the
// cheapest insert Postgres has (the table has no unique key to conflict on).
func applyEmail(ctx context.Context, tx pgx.Tx, table pgx.Identifier, events []sink.Event, orders []Order) error {
	row := make([]any, 3) // reused: COPY encodes each row before asking for the next
	_, err := tx.CopyFrom(ctx, table, []string{"event_id", "user_id", "subject"},
		pgx.CopyFromSlice(len(events), func(i int) ([]any, error) {
			row[0], row[1], row[2] = pgtype.UUID{Bytes: events[i].ID, Valid: true}, orders[i].UserID, Subject(orders[i])
			return row, nil
		}))
	return err
}

func applyInventory(ctx context.Context, tx pgx.Tx, table pgx.Identifier, _ []sink.Event, orders []Order) error {
	qty := map[string]int64{}
	for _, o := range orders {
		for _, it := range o.Items {
			qty[it]++
		}
	}
	items := sortedKeys(qty, func(a, b string) int { return cmp.Compare(a, b) })
	counts := make([]int64, len(items))
	for i, it := range items {
		counts[i] = qty[it]
	}
	// Rows are upserted in item order so concurrent batches lock them in one
	// order.
	_, err := tx.Exec(ctx, `INSERT INTO `+table.Sanitize()+` AS t (item, reserved)
SELECT * FROM unnest($1::text[], $2::bigint[])
ON CONFLICT (item) DO UPDATE SET reserved = t.reserved + EXCLUDED.reserved`, items, counts)
	return err
}

func applyAnalytics(ctx context.Context, tx pgx.Tx, table pgx.Identifier, events []sink.Event, orders []Order) error {
	var items int64
	for _, o := range orders {
		items += int64(len(o.Items))
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+table.Sanitize()+` AS t (name, shard, value)
VALUES ('items', $1, $3), ('orders', $1, $2)
ON CONFLICT (name, shard) DO UPDATE SET value = t.value + EXCLUDED.value`,
		events[0].Partition, int64(len(orders)), items)
	return err
}

type userItem struct {
	user int64
	item string
}

func applyRecommender(ctx context.Context, tx pgx.Tx, table pgx.Identifier, _ []sink.Event, orders []Order) error {
	weights := map[userItem]int64{}
	for _, o := range orders {
		for _, it := range o.Items {
			weights[userItem{o.UserID, it}]++
		}
	}
	keys := sortedKeys(weights, func(a, b userItem) int {
		return cmp.Or(cmp.Compare(a.user, b.user), cmp.Compare(a.item, b.item))
	})
	users := make([]int64, len(keys))
	items := make([]string, len(keys))
	ws := make([]int64, len(keys))
	for i, k := range keys {
		users[i], items[i], ws[i] = k.user, k.item, weights[k]
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+table.Sanitize()+` AS t (user_id, item, weight)
SELECT * FROM unnest($1::bigint[], $2::text[], $3::bigint[])
ON CONFLICT (user_id, item) DO UPDATE SET weight = t.weight + EXCLUDED.weight`, users, items, ws)
	return err
}

func sortedKeys[K comparable, V any](m map[K]V, cmp func(a, b K) int) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, cmp)
	return keys
}

// EmailsSent counts the emails_sent rows of one event.
func EmailsSent(ctx context.Context, pool *pgxpool.Pool, schema string, id uuid.UUID) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{schema, "emails_sent"}.Sanitize()+
		` WHERE event_id = $1`, id).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count emails: %w", err)
	}
	return n, nil
}
