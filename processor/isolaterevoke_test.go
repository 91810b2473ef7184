package processor_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
	"github.com/onceflow/onceflow/wire"
)

// A partition whose batch of refused records takes longer to isolate than
// any member keeps the partition: the group's membership changes every few
// seconds (a member joins, then the partition's owner leaves, drained
// within a DrainTimeout far shorter than one isolation), as in a group
// whose rebalances come faster than the isolation. Each owner's revoke
// must commit what its isolation has settled so far, so that the next
// owner starts after it: every refused record is a dead letter once, the
// good record after them applies once, and it all takes a bounded number
// of changes of owner, not forever. (The isolation never reaches half of
// TxTimeout here: the revoke is the only thing that can cut it.)
func TestIsolationProgressesAcrossRebalances(t *testing.T) {
	eachPlainBroker(t, func(t *testing.T, b broker) {
		const (
			bad = 80
			// Each statement of the handler sleeps 100 ms: isolating the
			// bad records takes at least 8 s (a savepoint group per
			// record, nearly), twice as long as an owner keeps the
			// partition.
			sleep  = 100 * time.Millisecond
			tenure = 3 * time.Second // how long each owner keeps the partition
			// maxOwners bounds the changes of owner: each owner settles
			// several records before it is revoked.
			maxOwners = 20
		)
		e := newEnv(t, b, 1)
		payments := pgx.Identifier{e.schema, "payments"}.Sanitize()
		if _, err := e.pool.Exec(t.Context(), `CREATE TABLE `+payments+` (event_id uuid NOT NULL, amount numeric NOT NULL)`); err != nil {
			t.Fatal(err)
		}
		h, err := sink.NewSQLHandler(sink.SQLHandlerConfig{Name: "pay", SQL: fmt.Sprintf(
			`WITH s AS (SELECT pg_sleep(%g)) INSERT INTO %s SELECT event_id, (payload->>'amount')::numeric FROM events, s`,
			sleep.Seconds(), payments)})
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

		count := func(sql string, args ...any) int64 { return sinktest.Count(t, e.pool, sql, args...) }
		stored := func() int64 {
			return count(`SELECT coalesce(max(next_offset), -1) FROM `+e.schema+`.sink_offsets WHERE consumer_group = $1`, e.group)
		}
		start := func(i int) *member {
			cfg := e.config(fmt.Sprintf("m%d", i))
			cfg.BatchMaxRecords = bad + 1 // one batch, if the member reads them all at once
			cfg.BatchLinger = 200 * time.Millisecond
			cfg.RebalanceTimeout, cfg.DrainTimeout = 2*time.Second, time.Second
			// No transaction is cut by its own timeout: only the revoke.
			w, err := sink.New(e.pool, sink.Config{Schema: e.schema, Group: e.group, Handlers: []sink.Handler{h},
				TxTimeout: time.Minute, IdleTimeout: time.Minute, Logger: cfg.Logger})
			if err != nil {
				t.Fatal(err)
			}
			return e.start(cfg, w)
		}
		owner := start(0)
		var progress []int64
		for i := 1; stored() < bad+1; i++ {
			if i > maxOwners {
				t.Fatalf("after %d changes of owner, %v apart: stored offset %d of %d (after each change: %v), %d dead letters of %d: "+
					"each owner's isolation starts again from the same record and none gets through",
					maxOwners, tenure+tenure/3, stored(), bad+1, progress,
					count(`SELECT count(*) FROM `+e.schema+`.dead_letters WHERE consumer_group = $1`, e.group), bad)
			}
			time.Sleep(tenure)
			next := start(i) // joins; the partition stays with its owner
			time.Sleep(tenure / 3)
			owner.stop(t) // leaves, drained: the partition moves
			owner = next
			progress = append(progress, stored())
		}
		t.Logf("stored offset after each change of owner: %v", progress)
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
	})
}
