package sink_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
)

func newWriter(t *testing.T, pool *pgxpool.Pool, schema string, cache *dedup.Cache, extra ...sink.Handler) *sink.Writer {
	t.Helper()
	return writerWith(t, pool, schema, sink.Config{Handlers: extra, Cache: cache})
}

// writerWith returns a Writer of group "g" in schema with the four orders
// handlers, then cfg.Handlers, and cfg's other fields.
func writerWith(t *testing.T, pool *pgxpool.Pool, schema string, cfg sink.Config) *sink.Writer {
	t.Helper()
	hs, err := orders.Handlers(schema)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Schema, cfg.Group, cfg.Handlers = schema, "g", append(hs, cfg.Handlers...)
	w, err := sink.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// take takes partition 0 of "orders" for w and returns its epoch.
func take(t *testing.T, w *sink.Writer) int64 {
	t.Helper()
	leases, err := w.Take(t.Context(), "orders", []int32{0})
	if err != nil {
		t.Fatal(err)
	}
	return leases[0].Epoch
}

func order(user int64, items ...string) []byte {
	b, _ := json.Marshal(orders.Order{UserID: user, Items: items})
	return b
}

// events builds events with consecutive offsets starting at first.
func events(first int64, ids []uuid.UUID, values [][]byte) []sink.Event {
	out := make([]sink.Event, len(ids))
	for i := range ids {
		out[i] = sink.Event{ID: ids[i], Value: values[i], Topic: "orders", Partition: 0, Offset: first + int64(i)}
	}
	return out
}

func TestWriteMixedBatch(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool, orders.Migrate)
	cache, _ := dedup.New(1000)
	w := newWriter(t, pool, schema, cache)
	ctx := t.Context()

	a, b, c, d, poison := uuid.New(), uuid.New(), uuid.New(), uuid.New(), uuid.New()
	want := map[uuid.UUID]orders.Order{
		a: {UserID: 1, Items: []string{"A"}},
		b: {UserID: 2, Items: []string{"A", "B"}},
		c: {UserID: 3, Items: []string{"C"}},
		d: {UserID: 1, Items: []string{"B", "B"}},
	}
	val := func(id uuid.UUID) []byte { o := want[id]; return order(o.UserID, o.Items...) }
	epoch := take(t, w)

	// Batch 1: a and b, new.
	b1 := &sink.Batch{Topic: "orders", Partition: 0, Epoch: epoch, Fence: -1, NextOffset: 2,
		Events: events(0, []uuid.UUID{a, b}, [][]byte{val(a), val(b)})}
	res, err := w.Write(ctx, b1)
	if err != nil {
		t.Fatalf("batch 1: %v", err)
	}
	if res.Applied != 8 {
		t.Errorf("batch 1 applied %d keys, want 8", res.Applied)
	}

	// Batch 2: a again (known to the cache), b again but with a cold cache
	// on another writer below, c twice inside the batch, d new, and an
	// event whose payload is not an order.
	b2 := &sink.Batch{Topic: "orders", Partition: 0, Epoch: epoch, Fence: 2, NextOffset: 7,
		Events: events(2, []uuid.UUID{a, c, c, d, poison},
			[][]byte{val(a), val(c), val(c), val(d), []byte(`{"user_id":"x"}`)})}
	res, err = w.Write(ctx, b2)
	if err != nil {
		t.Fatalf("batch 2: %v", err)
	}
	for _, tc := range []struct {
		name      string
		got, want int
	}{
		{"applied", res.Applied, 8},           // c and d, four handlers each
		{"skipped by lru", res.SkippedLRU, 4}, // a
		{"skipped by postgres", res.SkippedPostgres, 4},
		{"rejected", len(res.Rejected), 1},
		{"dead letters", res.DeadLetters, 1},
	} {
		if tc.got != tc.want {
			t.Errorf("batch 2 %s = %d, want %d", tc.name, tc.got, tc.want)
		}
	}

	if len(b2.DeadLetters) != 0 {
		t.Errorf("Write modified the batch: %d dead letters in it", len(b2.DeadLetters))
	}
	if len(res.Rejected) == 1 && (res.Rejected[0].EventID.UUID != poison || res.Rejected[0].Offset != 6) {
		t.Errorf("rejected = %+v, want the poison event at offset 6", res.Rejected[0])
	}

	// Batch 3, through a writer with no cache: b replayed must be stopped
	// by Postgres alone.
	cold := newWriter(t, pool, schema, nil)
	b3 := &sink.Batch{Topic: "orders", Partition: 0, Epoch: take(t, cold), Fence: 7, NextOffset: 8,
		Events: events(7, []uuid.UUID{b}, [][]byte{val(b)})}
	res, err = cold.Write(ctx, b3)
	if err != nil {
		t.Fatalf("batch 3: %v", err)
	}
	if res.Applied != 0 || res.SkippedPostgres != 4 {
		t.Errorf("batch 3 replay: applied %d, skipped by postgres %d; want 0 and 4", res.Applied, res.SkippedPostgres)
	}

	rep, err := orders.Check(ctx, pool, schema, want)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.ExactlyOnce() {
		t.Errorf("effects not exactly once: %v", rep.Problems)
	}
	if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.dead_letters WHERE event_id = $1 AND reason LIKE 'rejected: not an order%'`, poison); n != 1 {
		t.Errorf("dead letters for the poison event = %d, want 1", n)
	}
	if n := sinktest.Count(t, pool, `SELECT next_offset FROM `+schema+`.sink_offsets WHERE consumer_group = 'g' AND topic = 'orders' AND partition = 0`); n != 8 {
		t.Errorf("stored next offset = %d, want 8", n)
	}
}

// A zombie is fenced by the new owner's Take alone: its batch rolls back
// although the new owner has written nothing; a batch retried after its
// COMMIT went through is recognised as committed.
func TestWriteFencesZombie(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool, orders.Migrate)
	ctx := t.Context()
	zombie := newWriter(t, pool, schema, nil)
	owner := newWriter(t, pool, schema, nil)

	x, y, z := uuid.New(), uuid.New(), uuid.New()
	zepoch := take(t, zombie)
	if _, err := zombie.Write(ctx, &sink.Batch{Topic: "orders", Epoch: zepoch, Fence: -1, NextOffset: 1,
		Events: events(0, []uuid.UUID{x}, [][]byte{order(1, "A")})}); err != nil {
		t.Fatal(err)
	}
	oepoch := take(t, owner) // the partition moves; the owner has not written yet
	_, err := zombie.Write(ctx, &sink.Batch{Topic: "orders", Epoch: zepoch, Fence: 1, NextOffset: 3,
		Events: events(1, []uuid.UUID{y, z}, [][]byte{order(2, "B"), order(9, "Z")})})
	var fenced *sink.FencedError
	if !errors.As(err, &fenced) || !errors.Is(err, sink.ErrFenced) {
		t.Fatalf("zombie write: err = %v, want a *FencedError", err)
	}
	if fenced.StoredEpoch != oepoch || fenced.StoredOffset != 1 || fenced.Committed() {
		t.Errorf("fenced error = %+v, want stored epoch %d offset 1, not committed", fenced, oepoch)
	}
	if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.processed_events WHERE event_id = ANY($1)`, []uuid.UUID{y, z}); n != 0 {
		t.Errorf("zombie's events have %d processed rows, want 0 (its transaction must roll back)", n)
	}

	b := &sink.Batch{Topic: "orders", Epoch: oepoch, Fence: 1, NextOffset: 3,
		Events: events(1, []uuid.UUID{y, x}, [][]byte{order(2, "B"), order(1, "A")})}
	if _, err := owner.Write(ctx, b); err != nil {
		t.Fatal(err)
	}
	// The owner retries the same batch, as after a COMMIT whose outcome
	// it did not learn: fenced, and recognised as its own commit.
	_, err = owner.Write(ctx, b)
	if !errors.As(err, &fenced) || !fenced.Committed() {
		t.Errorf("retry of a committed batch: err = %v, want a *FencedError with Committed()", err)
	}
	rep, err := orders.Check(ctx, pool, schema, map[uuid.UUID]orders.Order{
		x: {UserID: 1, Items: []string{"A"}}, y: {UserID: 2, Items: []string{"B"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.ExactlyOnce() {
		t.Errorf("effects not exactly once: %v", rep.Problems)
	}
}

// commitBomb is a handler whose write makes the transaction's COMMIT fail
// while armed, with a serialization failure (a transient error): it
// inserts into a table guarded by a deferred constraint trigger, which runs
// at COMMIT, after every handler has run.
type commitBomb struct{ table string }

func (commitBomb) Name() string { return "commitBomb" }

func (h commitBomb) Apply(ctx context.Context, tx pgx.Tx, events []sink.Event) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+h.table+` (n) VALUES ($1)`, len(events))
	return err
}

func armCommitBomb(t *testing.T, pool *pgxpool.Pool, schema string) commitBomb {
	t.Helper()
	ctx := t.Context()
	table := schema + ".commit_bomb"
	for _, sql := range []string{
		`CREATE TABLE ` + table + ` (n int)`,
		`CREATE TABLE ` + schema + `.commit_bomb_armed (armed bool)`,
		`INSERT INTO ` + schema + `.commit_bomb_armed VALUES (true)`,
		`CREATE FUNCTION ` + schema + `.commit_bomb_fire() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF (SELECT armed FROM ` + schema + `.commit_bomb_armed) THEN
    RAISE EXCEPTION 'commit bomb: COMMIT refused' USING ERRCODE = '40001';
  END IF;
  RETURN NULL;
END $$`,
		`CREATE CONSTRAINT TRIGGER fire AFTER INSERT ON ` + table + `
DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION ` + schema + `.commit_bomb_fire()`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	return commitBomb{table: table}
}

func TestCommitFailureLeavesCacheUntouched(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool, orders.Migrate)
	ctx := t.Context()
	cache, _ := dedup.New(1000)
	bomb := armCommitBomb(t, pool, schema)
	w := newWriter(t, pool, schema, cache, bomb)

	ids := []uuid.UUID{uuid.New(), uuid.New(), uuid.New()}
	vals := [][]byte{order(1, "A"), order(2, "B"), order(3, "A", "C")}
	epoch := take(t, w)
	batch := func() *sink.Batch {
		return &sink.Batch{Topic: "orders", Epoch: epoch, Fence: -1, NextOffset: 3, Events: events(0, ids, vals)}
	}
	_, err := w.Write(ctx, batch())
	if err == nil || !sink.IsTransient(err) || !strings.Contains(err.Error(), "commit") {
		t.Fatalf("write with the bomb armed: err = %v, want a transient COMMIT error", err)
	}
	for _, id := range ids {
		for _, h := range append(orders.Names, "commitBomb") {
			if seen, _ := cache.Seen(dedup.Key{EventID: id, Handler: h}, dedup.Digest{}); seen {
				t.Fatalf("cache holds %s/%s after a failed COMMIT", id, h)
			}
		}
	}
	if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.emails_sent`); n != 0 {
		t.Fatalf("emails after a failed COMMIT = %d, want 0", n)
	}

	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.commit_bomb_armed SET armed = false`); err != nil {
		t.Fatal(err)
	}
	res, err := w.Write(ctx, batch())
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	if res.Applied != 15 || res.SkippedLRU != 0 {
		t.Errorf("retry applied %d keys, skipped %d by lru; want 15 and 0", res.Applied, res.SkippedLRU)
	}
	want := map[uuid.UUID]orders.Order{}
	for i, id := range ids {
		o, _ := orders.Parse(vals[i])
		want[id] = o
	}
	rep, err := orders.Check(ctx, pool, schema, want)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.ExactlyOnce() {
		t.Errorf("effects after retry not exactly once: %v", rep.Problems)
	}
}

func TestNewValidates(t *testing.T) {
	pool := sinktest.Pool(t)
	hs, _ := orders.Handlers("public", orders.Email)
	_, err := sink.New(pool, sink.Config{Handlers: append(hs, hs[0])})
	if err == nil {
		t.Fatal("New accepted a config with no group and a duplicate handler")
	}
	for _, want := range []string{"Group is required", `handler "emailHandler" registered twice`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

// TestWriteRemembersOnlyItsClaims: the cache learns the keys a batch
// claimed, not the ones it found claimed in Postgres — in a replay's
// re-read every key is found once, and remembering it would only evict
// the member's own recent claims.
func TestWriteRemembersOnlyItsClaims(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool, orders.Migrate)
	ctx := t.Context()
	a, e := uuid.New(), uuid.New()
	first, _ := dedup.New(100)
	w1 := newWriter(t, pool, schema, first)
	if _, err := w1.Write(ctx, &sink.Batch{Topic: "orders", Partition: 0, Epoch: take(t, w1), Fence: -1, NextOffset: 1,
		Events: events(0, []uuid.UUID{a}, [][]byte{order(1, "A")})}); err != nil {
		t.Fatal(err)
	}
	cache, _ := dedup.New(100)
	w2 := newWriter(t, pool, schema, cache)
	epoch := take(t, w2)
	for i, tc := range []struct {
		id               uuid.UUID
		applied, pg, lru int
	}{
		{a, 0, 4, 0}, // claimed by w1: found in Postgres
		{a, 0, 4, 0}, // found again: not remembered
		{e, 4, 0, 0}, // claimed here
		{e, 0, 0, 4}, // remembered
	} {
		off := int64(1 + i)
		res, err := w2.Write(ctx, &sink.Batch{Topic: "orders", Partition: 0, Epoch: epoch, Fence: off, NextOffset: off + 1,
			Events: events(off, []uuid.UUID{tc.id}, [][]byte{order(1, "A")})})
		if err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
		if res.Applied != tc.applied || res.SkippedPostgres != tc.pg || res.SkippedLRU != tc.lru {
			t.Errorf("batch %d: applied %d, skipped %d postgres %d lru; want %d, %d, %d",
				i, res.Applied, res.SkippedPostgres, res.SkippedLRU, tc.applied, tc.pg, tc.lru)
		}
	}
}
