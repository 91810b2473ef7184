package outbox

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
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
		return produceError(req.(*kmsg.ProduceRequest), kerr.NotEnoughReplicas), nil, true
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

// A produce the broker answers only after the produce timeout and the
// lease have both run out (a link that went silent mid-produce, then came
// back) is published once: the relay keeps the row while the client still
// holds it, renewing its lease and leaving it out of its claims, and marks
// it published when the client delivers it. It used to take the row again
// each time the lease ran out and produce it anew, a copy for each lease.
func TestSilentBrokerPublishesOnce(t *testing.T) {
	pool, schema, _ := setup(t)
	c := stalledCluster(t, 2*time.Second)
	ids := enqueue(t, store(t, pool, schema), 3)
	r := relay(t, pool, client(t, c.ListenAddrs()), RelayConfig{Schema: schema, Poll: 20 * time.Millisecond,
		ProduceTimeout: 200 * time.Millisecond, QueryTimeout: 100 * time.Millisecond, Lease: 500 * time.Millisecond})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	untilPublished(t, pool, schema, func() {})
	time.Sleep(time.Second) // a copy produced again would land by now
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ends, err := kadm.NewClient(client(t, c.ListenAddrs())).ListEndOffsets(t.Context(), topic)
	if err != nil {
		t.Fatal(err)
	}
	var records int64
	ends.Each(func(o kadm.ListedOffset) { records += o.Offset })
	if records != int64(len(ids)) {
		t.Errorf("%d records on the topic, want %d", records, len(ids))
	}
	got := published(t, c.ListenAddrs(), len(ids))
	for _, id := range ids {
		if got[id] != 1 {
			t.Errorf("event %s on the topic %d times, want 1", id, got[id])
		}
	}
	if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.outbox
WHERE publishes = 1 AND failed_at IS NULL AND lease_until IS NULL`); n != int64(len(ids)) {
		t.Errorf("%d of %d rows published once, lease released", n, len(ids))
	}
}

// A row the client held past its pass and then failed is marked by the
// next pass: refused by the broker, failed with the reason; failed
// otherwise, its lease released, and the row left to other relays for a
// lease (a relay whose link to the brokers went silent took such rows
// straight back, pass after pass, out of a healthy relay's reach).
func TestLateFailureIsMarked(t *testing.T) {
	pool, schema, brokers := setup(t)
	ids := enqueue(t, store(t, pool, schema), 2)
	r := relay(t, pool, client(t, brokers), RelayConfig{Schema: schema})
	rows, err := r.claim(t.Context(), nil) // leased, as a pass leaves them
	if err != nil || len(rows) != 2 {
		t.Fatalf("claim = %d rows, %v", len(rows), err)
	}
	r.hold(rows[0], nil)
	r.settled(rows[0], kerr.MessageTooLarge)
	r.settled(rows[1], errors.New("connection reset by peer")) // before its pass held it
	if n, err := r.RelayOnce(t.Context()); err != nil || n != 0 {
		t.Fatalf("RelayOnce = %d, %v; want nothing: the row that failed otherwise is left to other relays", n, err)
	}
	if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.outbox WHERE id = $1 AND lease_until IS NULL AND published_at IS NULL`, rows[1].id); n != 1 {
		t.Error("the row that failed otherwise is not released")
	}
	other := relay(t, pool, client(t, brokers), RelayConfig{Schema: schema})
	if n, err := other.RelayOnce(t.Context()); err != nil || n != 1 {
		t.Fatalf("another relay's pass = %d, %v; want the released row published", n, err)
	}
	if got := published(t, brokers, 1); got[ids[1]] != 1 || len(got) != 1 {
		t.Errorf("on the topic: %v, want %s once", got, ids[1])
	}
	if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.outbox WHERE id = $1
AND failed_at IS NOT NULL AND fail_reason LIKE '%MESSAGE_TOO_LARGE%' AND lease_until IS NULL AND publishes = 0`, rows[0].id); n != 1 {
		t.Error("the refused row is not marked failed with its reason")
	}
	if settled, holding, _ := r.heldRows(); len(settled)+len(holding) != 0 {
		t.Errorf("still held: %d settled, %d in the client", len(settled), len(holding))
	}
}

// produceError answers req with code for every partition it names.
func produceError(req *kmsg.ProduceRequest, code *kerr.Error) *kmsg.ProduceResponse {
	resp := req.ResponseKind().(*kmsg.ProduceResponse)
	for _, rt := range req.Topics {
		st := kmsg.NewProduceResponseTopic()
		st.Topic = rt.Topic
		for _, rp := range rt.Partitions {
			sp := kmsg.NewProduceResponseTopicPartition()
			sp.Partition = rp.Partition
			sp.ErrorCode = code.Code
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp
}

// A relay whose lease ran out while its client held a row (Postgres
// unreachable for longer than the lease, so the lease was not renewed),
// and which another relay then claimed, does not release that relay's
// lease when its own client gives the row up: the row stays the other
// relay's, not claimed and produced a third time.
func TestLateFailureLeavesAnotherRelaysLease(t *testing.T) {
	pool, schema, brokers := setup(t)
	enqueue(t, store(t, pool, schema), 1)
	a := relay(t, pool, client(t, brokers), RelayConfig{Schema: schema})
	b := relay(t, pool, client(t, brokers), RelayConfig{Schema: schema})
	ctx := t.Context()
	rows, err := a.claim(ctx, nil)
	if err != nil || len(rows) != 1 {
		t.Fatalf("a's claim = %d rows, %v", len(rows), err)
	}
	a.hold(rows[0], nil) // a's client holds it
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.outbox SET lease_until = now() - interval '1 second'`); err != nil {
		t.Fatal(err) // a could not renew it
	}
	if got, err := b.claim(ctx, nil); err != nil || len(got) != 1 {
		t.Fatalf("b's claim after the lease = %d rows, %v", len(got), err)
	}
	b.hold(rows[0], nil)                                       // and b's client holds it now
	a.settled(rows[0], errors.New("connection reset by peer")) // a's client gives it up
	if n, err := a.RelayOnce(ctx); err != nil || n != 0 {
		t.Fatalf("a's pass = %d published, %v; want nothing: the row is b's", n, err)
	}
	if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.outbox WHERE lease_until > now()`); n != 1 {
		t.Error("b's lease was released by a")
	}
}

// A row the relay's client holds for longer than maxHoldLeases leases (its
// link to the brokers cut, another relay's not) has its lease left to run
// out, so that another relay can take it over; the relay still does not
// produce it again itself.
func TestHeldTooLongIsLeftToAnotherRelay(t *testing.T) {
	pool, schema, brokers := setup(t)
	enqueue(t, store(t, pool, schema), 1)
	const lease = 400 * time.Millisecond
	cfg := RelayConfig{Schema: schema, Lease: lease, ProduceTimeout: 100 * time.Millisecond, QueryTimeout: 100 * time.Millisecond}
	a := relay(t, pool, client(t, brokers), cfg)
	ctx := t.Context()
	rows, err := a.claim(ctx, nil)
	if err != nil || len(rows) != 1 {
		t.Fatalf("a's claim = %d rows, %v", len(rows), err)
	}
	a.hold(rows[0], nil) // a's client holds it
	leaseEnd := func() time.Time {
		var at time.Time
		if err := pool.QueryRow(ctx, `SELECT lease_until FROM `+schema+`.outbox`).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at
	}
	// a's passes: nothing published, and why.
	pass := func(when string) {
		t.Helper()
		if n, err := a.RelayOnce(ctx); n != 0 || err == nil || !strings.Contains(err.Error(), "1 outbox rows still in the kafka client") {
			t.Fatalf("a's pass %s = %d, %v; want nothing produced again, and why", when, n, err)
		}
	}
	first := leaseEnd()
	time.Sleep(10 * time.Millisecond)
	pass("while it holds the row")
	if renewed := leaseEnd(); !renewed.After(first) {
		t.Fatalf("a held row's lease was not renewed: %v, then %v", first, renewed)
	}
	a.heldMu.Lock()
	a.held[rows[0].id].since = time.Now().Add(-maxHoldLeases * lease) // held that long
	a.heldMu.Unlock()
	last := leaseEnd()
	pass("after holding it maxHoldLeases leases")
	if got := leaseEnd(); !got.Equal(last) {
		t.Errorf("the lease was renewed after %d leases: %v, then %v", maxHoldLeases, last, got)
	}
	time.Sleep(time.Until(last) + 50*time.Millisecond)
	pass("after the lease ran out")
	b := relay(t, pool, client(t, brokers), cfg)
	if n, err := b.RelayOnce(ctx); err != nil || n != 1 {
		t.Errorf("another relay's pass after the lease ran out = %d, %v; want the row published", n, err)
	}
}

// While a batch's worth of rows is still in the client (a broker that does
// not answer), the relay claims no more: the rows behind wait in the
// outbox, unleased, for this relay or another; once the client delivers,
// every row is published once.
func TestHeldBatchHoldsBackClaims(t *testing.T) {
	pool, schema, _ := setup(t)
	c := stalledCluster(t, 2*time.Second)
	ids := enqueue(t, store(t, pool, schema), 5)
	r := relay(t, pool, client(t, c.ListenAddrs()), RelayConfig{Schema: schema, BatchSize: 2,
		ProduceTimeout: 200 * time.Millisecond, QueryTimeout: time.Second, Lease: 3 * time.Second})
	ctx := t.Context()
	if _, err := r.RelayOnce(ctx); err == nil {
		t.Fatal("the first pass: no error, want its rows still producing")
	}
	n, err := r.RelayOnce(ctx)
	if n != 0 || err == nil || !strings.Contains(err.Error(), "2 outbox rows still in the kafka client") {
		t.Fatalf("a pass while 2 rows are held = %d, %v; want nothing claimed, and why", n, err)
	}
	if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.outbox WHERE lease_until IS NULL AND published_at IS NULL`); n != 3 {
		t.Errorf("%d rows unleased while the client holds 2, want 3", n)
	}
	untilPublished(t, pool, schema, func() { _, _ = r.RelayOnce(ctx) })
	got := published(t, c.ListenAddrs(), len(ids))
	for _, id := range ids {
		if got[id] != 1 {
			t.Errorf("event %s on the topic %d times, want 1", id, got[id])
		}
	}
}

// An outbox topic deleted and created again while the relay runs gets the
// rows written after: franz-go keeps a topic's first id for the client's
// life (every produce to the new topic failed with UNKNOWN_TOPIC_ID, for
// ever); the relay makes it forget the topic, and it learns the new id.
func TestRecreatedTopicIsPublished(t *testing.T) {
	pool, schema, brokers := setup(t)
	s := store(t, pool, schema)
	r := relay(t, pool, client(t, brokers), RelayConfig{Schema: schema})
	ctx := t.Context()
	enqueue(t, s, 1)
	if n, err := r.RelayOnce(ctx); err != nil || n != 1 {
		t.Fatalf("before the topic is recreated: %d, %v", n, err)
	}
	adm := kadm.NewClient(client(t, brokers))
	if _, err := adm.DeleteTopics(ctx, topic); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := adm.CreateTopic(ctx, 3, 1, nil, topic)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("create the topic again: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // the deletion may still be under way
	}
	after := enqueue(t, s, 2)
	untilPublished(t, pool, schema, func() { _, _ = r.RelayOnce(ctx) })
	got := published(t, brokers, len(after))
	for _, id := range after {
		if got[id] != 1 {
			t.Errorf("event %s on the recreated topic %d times, want 1", id, got[id])
		}
	}
}

// stalledCluster is a kfake cluster with the topic that answers its first
// produce request after d: a broker link that went silent mid-produce,
// then came back.
func stalledCluster(t *testing.T, d time.Duration) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	var once sync.Once
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		once.Do(func() { c.SleepControl(func() { time.Sleep(d) }) })
		return nil, nil, false
	})
	return c
}

// untilPublished runs pass every 50 ms until schema's outbox has no row
// left unpublished, failing t after 30 s.
func untilPublished(t *testing.T, pool *pgxpool.Pool, schema string, pass func()) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.outbox WHERE published_at IS NULL`) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("rows unpublished after 30 s")
		}
		pass()
		time.Sleep(50 * time.Millisecond)
	}
}
