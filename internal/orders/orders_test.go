package orders_test

import (
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// apply runs every handler over events in one transaction, recording the
// processed_events rows as sink would.
func apply(t *testing.T, pool *pgxpool.Pool, schema string, events []sink.Event) {
	t.Helper()
	hs, err := orders.Handlers(schema)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit
	for _, h := range hs {
		if err := h.Apply(ctx, tx, events); err != nil {
			t.Fatalf("%s: %v", h.Name(), err)
		}
		for _, e := range events {
			if _, err := tx.Exec(ctx, `INSERT INTO `+schema+`.processed_events (event_id, handler, bus) VALUES ($1, $2, 'kafka')
ON CONFLICT DO NOTHING`, e.ID, h.Name()); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// Check passes when every order was applied once by every handler, and
// names each effect that was doubled or is missing.
func TestCheckFindsDoubleAndMissingEffects(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool, orders.Migrate)
	stream, err := orders.Generate(50, 0, 3)
	if err != nil {
		t.Fatal(err)
	}
	var events []sink.Event
	for i, m := range stream.Messages {
		events = append(events, sink.Event{ID: m.ID, Value: m.Value, Topic: "orders", Offset: int64(i)})
	}
	apply(t, pool, schema, events)
	rep, err := orders.Check(t.Context(), pool, schema, stream.Unique)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.ExactlyOnce() || rep.EmailsSent != 50 || rep.ProcessedRows[orders.Email] != 50 {
		t.Fatalf("after one apply: %+v", rep)
	}

	// The first event applied again: every handler's effect doubles.
	apply(t, pool, schema, events[:1])
	// And an order that never arrived.
	missing := uuid.New()
	want := map[uuid.UUID]orders.Order{missing: {UserID: 1, Items: []string{"SKU-99"}}}
	for id, o := range stream.Unique {
		want[id] = o
	}
	rep, err = orders.Check(t.Context(), pool, schema, want)
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(rep.Problems, "\n")
	for _, w := range []string{
		"emails_sent: 2 emails for event " + events[0].ID.String(),
		"emails_sent: 0 emails for event " + missing.String(),
		"processed_events: 50 rows for emailHandler, want 51",
		"inventory_reserved: item SKU-99 reserved 0, want 1",
	} {
		if !strings.Contains(all, w) {
			t.Errorf("problems lack %q:\n%s", w, all)
		}
	}
}
