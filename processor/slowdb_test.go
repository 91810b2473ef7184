package processor_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
	"github.com/onceflow/onceflow/wire"
)

// slowPool returns a pool on the test database through an in-process
// toxiproxy that delays every chunk by latency in each direction (a round
// trip costs twice latency), closed and stopped at cleanup.
func slowPool(t *testing.T, latency time.Duration) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(sinktest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	upstream := net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	proxy := toxiproxy.NewProxy(srv, "postgres", "127.0.0.1:0", upstream)
	if err := proxy.Start(); err != nil {
		t.Fatalf("toxiproxy: %v", err)
	}
	t.Cleanup(proxy.Stop)
	for _, stream := range []string{"upstream", "downstream"} {
		spec := fmt.Sprintf(`{"name":"latency-%s","type":"latency","stream":%q,"toxicity":1,"attributes":{"latency":%d}}`,
			stream, stream, latency.Milliseconds())
		if _, err := proxy.Toxics.AddToxicJson(bytes.NewReader([]byte(spec))); err != nil {
			t.Fatalf("add latency toxic: %v", err)
		}
	}
	host, port, err := net.SplitHostPort(proxy.Listen)
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	cfg.ConnConfig.Fallbacks = nil
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connect through toxiproxy: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// A batch of bad records that all fail in a SQL handler (SQLSTATE 22P02)
// and one good record after them, where isolating the bad ones in one
// transaction takes far longer than the transaction's timeout allows:
// over a link with 5 ms of latency each way (a thousand records, each
// savepoint group a few round trips), or behind a statement that takes
// 20 ms. The partition gets out all the same: every bad record becomes a
// dead letter once, the good one applies once, and the stored offset
// reaches the end. (The fault is on the Postgres side: kfake alone
// serves the records.) The time it took is logged: the README quotes it.
func TestIsolationProgressesOnSlowDatabase(t *testing.T) {
	for _, c := range []struct {
		name    string
		latency time.Duration // each way, through toxiproxy; 0: no proxy
		bad     int
		sql     string // the handler's statement; %s is the payments table
		tx      time.Duration
	}{
		// At 10 ms a round trip, isolating a thousand bad records in one
		// transaction takes minutes: no transaction of 3 s can hold it.
		{"link with 10ms round trips", 5 * time.Millisecond, 1000,
			`INSERT INTO %s SELECT event_id, (payload->>'amount')::numeric FROM events`, 3 * time.Second},
		// The same records on the local link: the figure to compare with.
		{"local link", 0, 1000, `INSERT INTO %s SELECT event_id, (payload->>'amount')::numeric FROM events`, 3 * time.Second},
		// Each statement sleeps 20 ms: isolating 200 bad records in one
		// transaction takes about 8 s, against 1 s.
		{"statement of 20ms", 0, 200,
			`WITH s AS (SELECT pg_sleep(0.02)) INSERT INTO %s SELECT event_id, (payload->>'amount')::numeric FROM events, s`, time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, broker{name: "kfake", start: startKfake}, 1)
			pool := e.pool
			if c.latency > 0 {
				pool = slowPool(t, c.latency)
			}
			isolationGetsOut(t, e, pool, c.bad, c.sql, c.tx)
		})
	}
}

// isolationGetsOut runs one member whose single handler runs sql (with %s
// the payments table) over bad records then a good one, all in one batch
// if the member reads them at once, and checks that every bad record is a
// dead letter once and the good one applied once, within a bounded wait.
func isolationGetsOut(t *testing.T, e *env, pool *pgxpool.Pool, bad int, sql string, txTimeout time.Duration) {
	payments, h := paymentsHandler(t, e, sql)
	cfg := e.config("slow")
	cfg.BatchMaxRecords = bad + 1 // one batch, if the member reads them all at once
	cfg.BatchLinger = 200 * time.Millisecond
	w, err := sink.New(pool, sink.Config{Schema: e.schema, Group: e.group,
		Handlers: []sink.Handler{h}, TxTimeout: txTimeout, IdleTimeout: txTimeout, Logger: cfg.Logger})
	if err != nil {
		t.Fatal(err)
	}
	recs := make([]*kgo.Record, 0, bad+1)
	for i := range bad {
		recs = append(recs, wire.NewRecord(e.topic, uuid.New(), fmt.Appendf(nil, `{"amount":"bad-%d"}`, i)))
	}
	good := uuid.New()
	recs = append(recs, wire.NewRecord(e.topic, good, []byte(`{"amount":"12.50"}`)))
	e.produce(recs...)

	start := time.Now()
	e.start(cfg, w)
	const patience = 300 * time.Second
	count := func(sql string, args ...any) int64 { return sinktest.Count(t, e.pool, sql, args...) }
	deadline := time.Now().Add(patience)
	for {
		dead := count(`SELECT count(*) FROM `+e.schema+`.dead_letters WHERE consumer_group = $1`, e.group)
		applied := count(`SELECT count(*) FROM `+payments+` WHERE event_id = $1`, good)
		stored := count(`SELECT coalesce(max(next_offset), -1) FROM `+e.schema+`.sink_offsets WHERE consumer_group = $1`, e.group)
		if dead >= int64(bad) && applied >= 1 && stored >= int64(bad+1) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %d dead letters of %d, good record applied %d times, stored offset %d of %d: "+
				"the isolation of the bad records does not get through", patience, dead, bad, applied, stored, bad+1)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("%d bad records isolated and the good one applied in %v", bad, time.Since(start).Round(100*time.Millisecond))
	for _, c := range []struct {
		what string
		sql  string
		args []any
		want int64
	}{
		{"dead letters", `SELECT count(*) FROM ` + e.schema + `.dead_letters WHERE consumer_group = $1`, []any{e.group}, int64(bad)},
		{"bad records dead-lettered with SQLSTATE 22P02", `SELECT count(DISTINCT "offset") FROM ` + e.schema +
			`.dead_letters WHERE consumer_group = $1 AND "offset" < $2 AND reason LIKE '%SQLSTATE 22P02%'`, []any{e.group, bad}, int64(bad)},
		{"payments rows", `SELECT count(*) FROM ` + payments, nil, 1},
		{"payments rows of the good record", `SELECT count(*) FROM ` + payments + ` WHERE event_id = $1`, []any{good}, 1},
		{"claims", `SELECT count(*) FROM ` + e.schema + `.processed_events`, nil, 1},
		{"stored offset", `SELECT next_offset FROM ` + e.schema + `.sink_offsets WHERE consumer_group = $1`, []any{e.group}, int64(bad + 1)},
	} {
		if got := count(c.sql, c.args...); got != c.want {
			t.Errorf("%s: %d, want %d", c.what, got, c.want)
		}
	}
}

// A batch whose plain transaction takes longer than TxTimeout (a statement
// that sleeps 5 ms per event, 400 events, against a timeout of 1 s) is
// written again in smaller batches, halved after each timeout, until they
// fit: every event applies once, none is dead-lettered, and the stored
// offset reaches the end.
func TestTimedOutBatchIsWrittenSmaller(t *testing.T) {
	const n = 400
	e := newEnv(t, broker{name: "kfake", start: startKfake}, 1)
	payments, h := paymentsHandler(t, e, `INSERT INTO %s SELECT event_id, (payload->>'amount')::numeric FROM events WHERE pg_sleep(0.005) IS NOT NULL`)
	log := &logRecorder{}
	cfg := e.config("slow")
	cfg.Logger = slog.New(log)
	cfg.BatchMaxRecords = n
	cfg.BatchLinger = 200 * time.Millisecond
	w, err := sink.New(e.pool, sink.Config{Schema: e.schema, Group: e.group,
		Handlers: []sink.Handler{h}, TxTimeout: time.Second, IdleTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = wire.NewRecord(e.topic, uuid.New(), []byte(`{"amount":"1"}`))
	}
	e.produce(recs...)
	e.start(cfg, w)
	const patience = 120 * time.Second
	deadline := time.Now().Add(patience)
	for {
		stored := sinktest.Count(t, e.pool, `SELECT coalesce(max(next_offset), -1) FROM `+e.schema+`.sink_offsets WHERE consumer_group = $1`, e.group)
		if stored >= n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: stored offset %d of %d, %d payments: a batch that takes longer than its transaction's timeout never gets through",
				patience, stored, n, sinktest.Count(t, e.pool, `SELECT count(*) FROM `+payments))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := sinktest.Count(t, e.pool, `SELECT count(*) FROM `+payments); got != n {
		t.Errorf("payments: %d, want %d", got, n)
	}
	if got := sinktest.Count(t, e.pool, `SELECT count(DISTINCT event_id) FROM `+payments); got != n {
		t.Errorf("distinct events paid: %d, want %d", got, n)
	}
	if got := sinktest.Count(t, e.pool, `SELECT count(*) FROM `+e.schema+`.dead_letters`); got != 0 {
		t.Errorf("dead letters: %d, want none: a timeout is no evidence against a record", got)
	}
	if log.count(slog.LevelWarn, "batch timed out; retrying its records in smaller batches") == 0 {
		t.Errorf("no batch was retried smaller; log: %v", log.messages())
	}
}

// Round trips long against the transaction's time (40 ms each way: a
// transaction of 2 s has some 25 round trips, one of 1.2 s some 15), and
// one record in ten bad: an isolation that halves its way down to the
// batch's first event takes more round trips than a transaction has, so
// it timed out before it could commit anything, and the batch was tried
// again whole, for ever. A timed-out isolation now has the batch retried
// smaller and isolated from the start, event by event — but a single
// record in the plain transaction, the cheapest (isolating a lone good
// record took more round trips than 15 allow: it was retried for ever):
// every good record applies once, every bad one is a dead letter once,
// and the stored offset reaches the end.
func TestIsolationOnLongRoundTrips(t *testing.T) {
	for _, c := range []struct {
		name string
		n    int
		tx   time.Duration
	}{
		{"25 round trips", 40, 2 * time.Second},
		{"15 round trips", 20, 1200 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) { isolateOnLongRoundTrips(t, c.n, c.tx) })
	}
}

func isolateOnLongRoundTrips(t *testing.T, n int, tx time.Duration) {
	e := newEnv(t, broker{name: "kfake", start: startKfake}, 1)
	payments, h := paymentsHandler(t, e, `INSERT INTO %s SELECT event_id, (payload->>'amount')::numeric FROM events`)
	log := &logRecorder{}
	cfg := e.config("slow")
	cfg.Logger = slog.New(log)
	cfg.BatchMaxRecords = n
	cfg.BatchLinger = 200 * time.Millisecond
	w, err := sink.New(slowPool(t, 40*time.Millisecond), sink.Config{Schema: e.schema, Group: e.group,
		Handlers: []sink.Handler{h}, TxTimeout: tx, IdleTimeout: tx})
	if err != nil {
		t.Fatal(err)
	}
	recs := make([]*kgo.Record, n)
	bad := 0
	for i := range recs {
		v := []byte(`{"amount":"1"}`)
		if i%10 == 3 {
			v, bad = fmt.Appendf(nil, `{"amount":"bad-%d"}`, i), bad+1
		}
		recs[i] = wire.NewRecord(e.topic, uuid.New(), v)
	}
	e.produce(recs...)
	start := time.Now()
	e.start(cfg, w)
	const patience = 240 * time.Second
	for deadline := time.Now().Add(patience); ; time.Sleep(100 * time.Millisecond) {
		stored := sinktest.Count(t, e.pool, `SELECT coalesce(max(next_offset), -1) FROM `+e.schema+`.sink_offsets WHERE consumer_group = $1`, e.group)
		if stored >= int64(n) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: stored offset %d of %d, %d payments, %d dead letters: the batch does not get through", patience, stored, n,
				sinktest.Count(t, e.pool, `SELECT count(*) FROM `+payments),
				sinktest.Count(t, e.pool, `SELECT count(*) FROM `+e.schema+`.dead_letters`))
		}
	}
	t.Logf("%d records, %d bad, through in %v", n, bad, time.Since(start).Round(100*time.Millisecond))
	if got := sinktest.Count(t, e.pool, `SELECT count(DISTINCT event_id) FROM `+payments); got != int64(n-bad) {
		t.Errorf("distinct events paid: %d, want %d", got, n-bad)
	}
	if got := sinktest.Count(t, e.pool, `SELECT count(*) FROM `+payments); got != int64(n-bad) {
		t.Errorf("payments: %d, want %d", got, n-bad)
	}
	if got := sinktest.Count(t, e.pool, `SELECT count(DISTINCT "offset") FROM `+e.schema+`.dead_letters WHERE reason LIKE '%SQLSTATE 22P02%'`); got != int64(bad) {
		t.Errorf("bad records dead-lettered: %d, want %d", got, bad)
	}
	if got := sinktest.Count(t, e.pool, `SELECT count(*) FROM `+e.schema+`.dead_letters`); got != int64(bad) {
		t.Errorf("dead letters: %d, want %d", got, bad)
	}
}

// paymentsHandler creates e's payments table (no unique key) and returns it
// with a SQL handler "pay" running sql, %s the table.
func paymentsHandler(t *testing.T, e *env, sql string) (string, *sink.SQLHandler) {
	t.Helper()
	payments := pgx.Identifier{e.schema, "payments"}.Sanitize()
	if _, err := e.pool.Exec(t.Context(), `CREATE TABLE `+payments+` (event_id uuid NOT NULL, amount numeric NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	h, err := sink.NewSQLHandler(sink.SQLHandlerConfig{Name: "pay", SQL: fmt.Sprintf(sql, payments)})
	if err != nil {
		t.Fatal(err)
	}
	return payments, h
}
