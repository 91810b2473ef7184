package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/onceflow/onceflow/orders"
	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const topic = "orders"

func setup(t *testing.T) (*pgxpool.Pool, string, []string) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool, orders.Migrate)
	if err := Migrate(t.Context(), pool, schema); err != nil {
		t.Fatal(err)
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, topic), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return pool, schema, c.ListenAddrs()
}

func client(t *testing.T, brokers []string, opts ...kgo.Opt) *kgo.Client {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.MetadataMinAge(100 * time.Millisecond)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// published reads every record of the topic and counts them per event id.
func published(t *testing.T, brokers []string, want int) map[uuid.UUID]int {
	cl := client(t, brokers, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	got := map[uuid.UUID]int{}
	n := 0
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for n < want && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			ev, err := processor.Decode(r, processor.DecodeConfig{})
			if err != nil {
				t.Errorf("relayed record does not decode: %v", err)
				return
			}
			got[ev.ID]++
			n++
		})
	}
	return got
}

func TestEnqueueIsIdempotent(t *testing.T) {
	pool, schema, _ := setup(t)
	s := NewStore(pool, schema, "kafka", topic)
	ctx := t.Context()
	key := uuid.New()
	first, err := s.Enqueue(ctx, key, []byte(`{"user_id":1,"items":["A"]}`), "")
	if err != nil {
		t.Fatal(err)
	}
	again, err := s.Enqueue(ctx, key, []byte(`{"items": ["A"], "user_id": 1}`), "")
	if err != nil {
		t.Fatalf("same key, same order (reformatted): %v", err)
	}
	if first.Replayed || !again.Replayed || first.OrderID != again.OrderID || again.EventID != key {
		t.Errorf("answers: first %+v, again %+v; want the same order, the second marked replayed", first, again)
	}
	if _, err := s.Enqueue(ctx, key, []byte(`{"user_id":2,"items":["B"]}`), ""); !errors.Is(err, ErrKeyReused) {
		t.Errorf("same key, other order: err = %v, want ErrKeyReused", err)
	}
	if _, err := s.Enqueue(ctx, uuid.New(), []byte(`{"user_id":1}`), ""); err == nil {
		t.Error("an order without items was accepted")
	}
	for _, table := range []string{"orders", "outbox"} {
		if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.`+table); n != 1 {
			t.Errorf("%s has %d rows, want 1", table, n)
		}
	}
}

func TestRelaysPublishEachEventOnce(t *testing.T) {
	pool, schema, brokers := setup(t)
	s := NewStore(pool, schema, "kafka", topic)
	ctx := t.Context()
	const n = 600
	for i := range n {
		if _, err := s.Enqueue(ctx, uuid.New(), []byte(fmt.Sprintf(`{"user_id":%d,"items":["A"]}`, i+1)), ""); err != nil {
			t.Fatal(err)
		}
	}
	// Three relays over one table at once, each with its own client.
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for range 3 {
		r := NewRelay(pool, client(t, brokers), RelayConfig{Schema: schema, BatchSize: 50})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				k, err := r.RelayOnce(ctx)
				if err != nil {
					errs <- err
					return
				}
				if k == 0 {
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	got := published(t, brokers, n)
	if len(got) != n {
		t.Fatalf("%d distinct events published, want %d", len(got), n)
	}
	for id, c := range got {
		if c != 1 {
			t.Errorf("event %s published %d times, want 1", id, c)
		}
	}
	if left := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.outbox WHERE published_at IS NULL`); left != 0 {
		t.Errorf("%d rows left unpublished", left)
	}
}

// A relay that dies after publishing but before marking publishes those
// events again; the consumer side applies each event once all the same.
func TestCrashBetweenPublishAndMarkIsAbsorbed(t *testing.T) {
	pool, schema, brokers := setup(t)
	s := NewStore(pool, schema, "kafka", topic)
	ctx := t.Context()
	want := map[uuid.UUID]orders.Order{}
	for i := range 100 {
		id := uuid.New()
		o := orders.Order{UserID: int64(i + 1), Items: []string{"A", "B"}}
		want[id] = o
		if _, err := s.Enqueue(ctx, id, []byte(fmt.Sprintf(`{"user_id":%d,"items":["A","B"]}`, o.UserID)), ""); err != nil {
			t.Fatal(err)
		}
	}
	r := NewRelay(pool, client(t, brokers), RelayConfig{Schema: schema})
	crashed := false
	r.afterPublish = func() error {
		if !crashed {
			crashed = true
			return errors.New("relay died before marking")
		}
		return nil
	}
	if _, err := r.RelayOnce(ctx); err == nil {
		t.Fatal("the first relay pass did not fail")
	}
	if k, err := r.RelayOnce(ctx); err != nil || k != 100 {
		t.Fatalf("second pass relayed %d rows (%v), want all 100 again", k, err)
	}
	for id, c := range published(t, brokers, 200) {
		if c != 2 {
			t.Fatalf("event %s is on the topic %d times, want 2 (published, not marked, published again)", id, c)
		}
	}

	hs, _ := orders.Handlers(schema)
	w, err := sink.New(pool, sink.Config{Schema: schema, Group: "g", Handlers: hs})
	if err != nil {
		t.Fatal(err)
	}
	c, err := processor.New(processor.Config{Brokers: brokers, Topics: []string{topic}, Group: "g",
		KafkaOptions: []kgo.Opt{kgo.MetadataMinAge(100 * time.Millisecond)}}, w)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(rctx) }()
	deadline := time.Now().Add(60 * time.Second)
	for sinktest.Count(t, pool, `SELECT coalesce(sum(next_offset), 0)::bigint FROM `+schema+`.sink_offsets`) < 200 {
		if time.Now().After(deadline) {
			t.Fatal("the consumer did not reach the end of the topic")
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	rep, err := orders.Check(ctx, pool, schema, want)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.ExactlyOnce() {
		t.Errorf("effects not exactly once: %v", rep.Problems)
	}
}
