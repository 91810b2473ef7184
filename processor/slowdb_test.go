package processor_test

import (
	"bytes"
	"context"
	"fmt"
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

// A batch of a thousand records that all fail in a SQL handler (SQLSTATE
// 22P02) and one good record after them, on a Postgres link with 5 ms of
// latency each way: isolating them costs thousands of round trips, far
// more than one transaction's timeout allows, yet the partition gets out.
// Every bad record becomes a dead letter once, the good one applies once,
// and the stored offset reaches the end. (The fault is on the Postgres
// link: kfake alone serves the records.)
func TestIsolationProgressesOnSlowLink(t *testing.T) {
	const bad = 1000
	e := newEnv(t, broker{name: "kfake", start: startKfake}, 1)
	payments := pgx.Identifier{e.schema, "payments"}.Sanitize()
	if _, err := e.pool.Exec(t.Context(), `CREATE TABLE `+payments+` (event_id uuid NOT NULL, amount numeric NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	h, err := sink.NewSQLHandler(sink.SQLHandlerConfig{Name: "pay",
		SQL: `INSERT INTO ` + payments + ` SELECT event_id, (payload->>'amount')::numeric FROM events`})
	if err != nil {
		t.Fatal(err)
	}
	// At 10 ms a round trip, isolating a thousand bad records in one
	// transaction takes minutes: no transaction of 3 s can hold it.
	cfg := e.config("slow")
	cfg.BatchMaxRecords = bad + 1 // one batch, if the member reads them all at once
	cfg.BatchLinger = 200 * time.Millisecond
	w, err := sink.New(slowPool(t, 5*time.Millisecond), sink.Config{Schema: e.schema, Group: e.group,
		Handlers: []sink.Handler{h}, TxTimeout: 3 * time.Second, IdleTimeout: 3 * time.Second, Logger: cfg.Logger})
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

	e.start(cfg, w)

	const patience = 300 * time.Second
	count := func(sql string, args ...any) int64 { return sinktest.Count(t, e.pool, sql, args...) }
	deadline := time.Now().Add(patience)
	for {
		dead := count(`SELECT count(*) FROM `+e.schema+`.dead_letters WHERE consumer_group = $1`, e.group)
		applied := count(`SELECT count(*) FROM `+payments+` WHERE event_id = $1`, good)
		stored := count(`SELECT coalesce(max(next_offset), -1) FROM `+e.schema+`.sink_offsets WHERE consumer_group = $1`, e.group)
		if dead >= bad && applied >= 1 && stored >= bad+1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v on a link with 10 ms round trips: %d dead letters of %d, good record applied %d times, stored offset %d of %d: "+
				"the isolation of the bad records does not get through", patience, dead, bad, applied, stored, bad+1)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, c := range []struct {
		what string
		sql  string
		args []any
		want int64
	}{
		{"dead letters", `SELECT count(*) FROM ` + e.schema + `.dead_letters WHERE consumer_group = $1`, []any{e.group}, bad},
		{"bad records dead-lettered with SQLSTATE 22P02", `SELECT count(DISTINCT "offset") FROM ` + e.schema +
			`.dead_letters WHERE consumer_group = $1 AND "offset" < $2 AND reason LIKE '%SQLSTATE 22P02%'`, []any{e.group, bad}, bad},
		{"payments rows", `SELECT count(*) FROM ` + payments, nil, 1},
		{"payments rows of the good record", `SELECT count(*) FROM ` + payments + ` WHERE event_id = $1`, []any{good}, 1},
		{"claims", `SELECT count(*) FROM ` + e.schema + `.processed_events`, nil, 1},
		{"stored offset", `SELECT next_offset FROM ` + e.schema + `.sink_offsets WHERE consumer_group = $1`, []any{e.group}, bad + 1},
	} {
		if got := count(c.sql, c.args...); got != c.want {
			t.Errorf("%s: %d, want %d", c.what, got, c.want)
		}
	}
}
