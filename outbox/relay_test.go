package outbox

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/onceflow/onceflow/sink/sinktest"
)

// A row the broker refuses (over franz-go's 1000012-byte record limit) is
// marked failed with its reason, and the rows behind it are published
// once each instead of waiting behind it forever.
func TestRefusedRowDoesNotBlockTheRest(t *testing.T) {
	pool, schema, brokers := setup(t)
	s := store(t, pool, schema)
	ctx := t.Context()
	normal := enqueue(t, s, 5)
	huge := uuid.New()
	if _, err := s.Enqueue(ctx, Event{ID: huge, Payload: []byte(`{"items":["` + strings.Repeat("A", 1_000_100) + `"]}`)}, nil); err != nil {
		t.Fatal(err)
	}
	normal = append(normal, enqueue(t, s, 5)...)
	r := relay(t, pool, client(t, brokers), RelayConfig{Schema: schema, BatchSize: 4})
	for range 10 {
		_, _ = r.RelayOnce(ctx) // errors are the relay's to log; what counts is the table
	}
	got := published(t, brokers, len(normal))
	for _, id := range normal {
		if got[id] != 1 {
			t.Errorf("event %s published %d times, want 1", id, got[id])
		}
	}
	st, err := s.Status(ctx, huge)
	if err != nil {
		t.Fatal(err)
	}
	if st.FailedAt == nil || st.Published || !strings.Contains(st.FailReason, "MESSAGE_TOO_LARGE") {
		t.Errorf("the oversize row: %+v; want failed with MESSAGE_TOO_LARGE, unpublished", st)
	}
	if n, err := r.RelayOnce(ctx); n != 0 || err != nil {
		t.Errorf("a pass after everything was relayed: %d, %v; the failed row must not be tried again", n, err)
	}
}

// While the relay waits for the broker, no outbox row is locked: another
// transaction can lock every row at once without waiting.
func TestRelayHoldsNoLocksWhileProducing(t *testing.T) {
	pool, schema, _ := setup(t)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	enqueue(t, store(t, pool, schema), 3)
	var (
		mu       sync.Mutex
		lockErrs []error
	)
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		lctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := pool.Exec(lctx, `SELECT id FROM `+schema+`.outbox FOR UPDATE NOWAIT`)
		mu.Lock()
		lockErrs = append(lockErrs, err)
		mu.Unlock()
		return nil, nil, false // kfake answers the produce itself
	})
	r := relay(t, pool, client(t, c.ListenAddrs()), RelayConfig{Schema: schema})
	if n, err := r.RelayOnce(t.Context()); err != nil || n != 3 {
		t.Fatalf("RelayOnce = %d, %v; want 3 rows", n, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(lockErrs) == 0 {
		t.Fatal("the broker saw no produce request")
	}
	for _, err := range lockErrs {
		if err != nil {
			t.Errorf("locking the outbox rows while the relay produced: %v", err)
		}
	}
}

// A produce the broker keeps failing with a retriable error (the client
// retrying it past the produce timeout) does not hold the relay: RelayOnce
// returns, the rows stay leased, and once the lease has run out they are
// published; none is marked failed.
func TestProduceTimeoutBoundsTheRelay(t *testing.T) {
	pool, schema, _ := setup(t)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	ids := enqueue(t, store(t, pool, schema), 2)
	var mu sync.Mutex
	refuse := true
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		mu.Lock()
		defer mu.Unlock()
		if !refuse {
			return nil, nil, false
		}
		// A broker that is not ready: retriable, not a refusal of the record.
		preq := req.(*kmsg.ProduceRequest)
		resp := preq.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range preq.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.NotEnoughReplicas.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	cl := client(t, c.ListenAddrs(), kgo.RetryBackoffFn(func(int) time.Duration { return 10 * time.Millisecond }))
	r := relay(t, pool, cl, RelayConfig{Schema: schema, ProduceTimeout: 300 * time.Millisecond})
	if n, err := r.RelayOnce(t.Context()); err == nil || n != 0 {
		t.Fatalf("RelayOnce against a broker that keeps failing = %d, %v; want 0 and an error", n, err)
	}
	if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.outbox WHERE lease_until > now()`); n != int64(len(ids)) {
		t.Errorf("%d rows leased after the timeout, want %d", n, len(ids))
	}
	mu.Lock()
	refuse = false
	mu.Unlock()
	if _, err := pool.Exec(t.Context(), `UPDATE `+schema+`.outbox SET lease_until = now() - interval '1 second'`); err != nil {
		t.Fatal(err) // the lease runs out
	}
	next := relay(t, pool, client(t, c.ListenAddrs()), RelayConfig{Schema: schema})
	if n, err := next.RelayOnce(t.Context()); err != nil || n != len(ids) {
		t.Fatalf("after the lease = %d, %v; want the %d rows published", n, err, len(ids))
	}
	if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.outbox WHERE failed_at IS NOT NULL`); n != 0 {
		t.Errorf("%d rows marked failed for a retriable broker error", n)
	}
}

// OldestPending is the age of the oldest row not yet on the topic (a row
// the broker refused does not count: no relay tries it again), and 0 once
// the relay published them.
func TestOldestPendingIsTheHeadOfTheQueue(t *testing.T) {
	pool, schema, brokers := setup(t)
	s := store(t, pool, schema)
	ctx := t.Context()
	r := relay(t, pool, client(t, brokers), RelayConfig{Schema: schema})
	if age, err := r.OldestPending(ctx); err != nil || age != 0 {
		t.Fatalf("empty outbox: OldestPending = %v, %v; want 0", age, err)
	}
	enqueue(t, s, 3)
	// The first row was written an hour ago, the second refused two hours ago.
	for _, q := range []string{
		`UPDATE ` + schema + `.outbox SET created_at = now() - interval '1 hour' WHERE id = (SELECT min(id) FROM ` + schema + `.outbox)`,
		`UPDATE ` + schema + `.outbox SET created_at = now() - interval '2 hours', failed_at = now(), fail_reason = 'refused'
  WHERE id = (SELECT min(id) + 1 FROM ` + schema + `.outbox)`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	age, err := r.OldestPending(ctx)
	if err != nil || age < 59*time.Minute || age > 61*time.Minute {
		t.Fatalf("OldestPending = %v, %v; want an hour (the oldest row not refused)", age, err)
	}
	if n, err := r.RelayOnce(ctx); err != nil || n != 2 {
		t.Fatalf("RelayOnce = %d, %v; want 2 rows", n, err)
	}
	if age, err := r.OldestPending(ctx); err != nil || age != 0 {
		t.Errorf("after publishing: OldestPending = %v, %v; want 0", age, err)
	}
}
