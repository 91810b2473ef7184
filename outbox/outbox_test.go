package outbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/onceflow/onceflow/sink/sinktest"
	"github.com/onceflow/onceflow/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const topic = "orders"

func setup(t *testing.T) (*pgxpool.Pool, string, []string) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool, Migrate)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, topic), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return pool, schema, c.ListenAddrs()
}

func store(t *testing.T, pool *pgxpool.Pool, schema string) *Store {
	s, err := NewStore(pool, StoreConfig{Schema: schema, Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func relay(t *testing.T, pool *pgxpool.Pool, cl *kgo.Client, cfg RelayConfig) *Relay {
	r, err := NewRelay(pool, cl, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func client(t *testing.T, brokers []string, opts ...kgo.Opt) *kgo.Client {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.MetadataMinAge(100 * time.Millisecond)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// enqueue puts n events with small payloads in the outbox.
func enqueue(t *testing.T, s *Store, n int) []uuid.UUID {
	ids := make([]uuid.UUID, n)
	for i := range ids {
		ids[i] = uuid.New()
		if _, err := s.Enqueue(t.Context(), Event{ID: ids[i], Payload: []byte(fmt.Sprintf(`{"n":%d}`, i))}, nil); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

// published reads want records of the topic and counts them per event id.
func published(t *testing.T, brokers []string, want int) map[uuid.UUID]int {
	cl := client(t, brokers, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	got := map[uuid.UUID]int{}
	n := 0
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for n < want && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			id, err := uuid.Parse(wire.RecordCarrier{Record: r}.Get(wire.HeaderEventID))
			if err != nil || string(r.Key) != id.String() {
				t.Errorf("relayed record has no event id header and key: %v", err)
				return
			}
			got[id]++
			n++
		})
	}
	return got
}

// Enqueue writes the outbox row and the business write together, once per
// event id: a repeated id with the same payload (as SamePayload sees it)
// writes nothing, another payload is ErrKeyReused, and a failing write
// leaves no outbox row.
func TestEnqueueIsIdempotent(t *testing.T) {
	pool, schema, _ := setup(t)
	ctx := t.Context()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+schema+`.things (event_id uuid)`); err != nil {
		t.Fatal(err)
	}
	s, err := NewStore(pool, StoreConfig{Schema: schema, Topic: topic, SamePayload: bytes.EqualFold})
	if err != nil {
		t.Fatal(err)
	}
	key := uuid.New()
	write := func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+schema+`.things VALUES ($1)`, key)
		return err
	}
	first, err := s.Enqueue(ctx, Event{ID: key, Payload: []byte(`{"a":"x"}`)}, write)
	if err != nil || first.Replayed {
		t.Fatalf("first: %+v, %v", first, err)
	}
	again, err := s.Enqueue(ctx, Event{ID: key, Payload: []byte(`{"A":"X"}`)}, write)
	if err != nil || !again.Replayed {
		t.Fatalf("same key, payload the same to SamePayload: %+v, %v; want replayed", again, err)
	}
	if _, err := s.Enqueue(ctx, Event{ID: key, Payload: []byte(`{"a":"y"}`)}, write); !errors.Is(err, ErrKeyReused) {
		t.Errorf("same key, other payload: err = %v, want ErrKeyReused", err)
	}
	boom := errors.New("business write failed")
	if _, err := s.Enqueue(ctx, Event{ID: uuid.New(), Payload: []byte(`{}`)},
		func(context.Context, pgx.Tx) error { return boom }); !errors.Is(err, boom) {
		t.Errorf("failing write: err = %v, want it returned", err)
	}
	for _, table := range []string{"things", "outbox"} {
		if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.`+table); n != 1 {
			t.Errorf("%s has %d rows, want 1", table, n)
		}
	}
}

func TestConfigsAreValidated(t *testing.T) {
	pool := sinktest.Pool(t)
	if _, err := NewStore(pool, StoreConfig{}); err == nil {
		t.Error("NewStore accepted a config without a topic")
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, cfg := range []RelayConfig{
		{BatchSize: -1},
		{Lease: time.Second, ProduceTimeout: time.Second},
		{QueryTimeout: -time.Second},
	} {
		if _, err := NewRelay(pool, cl, cfg); err == nil {
			t.Errorf("NewRelay accepted %+v", cfg)
		}
	}
}

func TestRelaysPublishEachEventOnce(t *testing.T) {
	pool, schema, brokers := setup(t)
	ctx := t.Context()
	const n = 600
	enqueue(t, store(t, pool, schema), n)
	// Three relays over one table at once, each with its own client.
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for range 3 {
		r := relay(t, pool, client(t, brokers), RelayConfig{Schema: schema, BatchSize: 50})
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
