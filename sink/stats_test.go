package sink_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// A dedup slice starts with no planner statistics, and autovacuum gives it
// some only on its next pass (a minute apart by default). Until then the
// planner takes a batch's look-up (`event_id = ANY(<1000 ids>)`) for one
// that matches nearly every row, and scans the whole slice, for every
// custom plan: the first five executions on each new connection, so every
// member that joins. In the benchmark's storm that was half of the
// look-ups' time. The Writer analyzes the slice its claims go to once it
// holds three times ANALYZE's sample; analyzed at its first claims, its
// first events would be taken for most common values, each "half a
// percent of the slice", and a look-up of those (the lookupPlan below
// has a hundred) would scan it again.
func TestNewSliceGetsPlannerStatistics(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool, orders.Migrate)
	ctx := t.Context()
	noAutovacuum(t, pool, schema, 0)
	w := newWriter(t, pool, schema, nil)
	epoch := take(t, w)

	next := int64(0)
	write := func(n int) {
		t.Helper()
		ids, vals := make([]uuid.UUID, n), make([][]byte, n)
		for i := range ids {
			ids[i], vals[i] = uuid.New(), order(int64(i%7+1), "A")
		}
		fence := next
		if next == 0 {
			fence = -1
		}
		if _, err := w.Write(ctx, &sink.Batch{Topic: "orders", Partition: 0, Epoch: epoch, Fence: fence,
			NextOffset: next + int64(n), Events: events(next, ids, vals)}); err != nil {
			t.Fatal(err)
		}
		next += int64(n)
	}
	// analyzed writes batches until slice n has statistics.
	analyzed := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !hasStats(t, pool, schema, n); {
			if time.Now().After(deadline) {
				t.Fatalf("processed_events_s%d holds %d rows and has no planner statistics", n,
					sinktest.Count(t, pool, `SELECT count(*) FROM `+sliceTable(schema, n)))
			}
			write(10)
			time.Sleep(100 * time.Millisecond)
		}
	}

	write(200)
	if hasStats(t, pool, schema, 0) {
		t.Fatal("processed_events_s0 was analyzed at its first claims: its first events are taken for most common values")
	}
	grow(t, pool, schema, 0, 100_000)
	analyzed(0)
	grow(t, pool, schema, 0, 400_000) // as the slice goes on growing
	probes(t, pool, schema, 0)

	// A rotation starts a slice with no statistics again.
	slices := pgx.Identifier{schema, "processed_events_slices"}.Sanitize()
	if _, err := pool.Exec(ctx, `UPDATE `+slices+` SET started_at = now() - interval '2 hours'`); err != nil {
		t.Fatal(err)
	}
	if res, err := (dedup.Retention{Pool: pool, Schema: schema, Horizon: time.Hour}).Step(ctx); err != nil || !res.Rotated {
		t.Fatalf("rotation: %+v, %v", res, err)
	}
	noAutovacuum(t, pool, schema, 1)
	write(200)
	grow(t, pool, schema, 1, 100_000)
	analyzed(1)
	grow(t, pool, schema, 1, 400_000)
	probes(t, pool, schema, 1)
}

func sliceTable(schema string, n int) string {
	return pgx.Identifier{schema, fmt.Sprintf("processed_events_s%d", n)}.Sanitize()
}

// noAutovacuum keeps autovacuum from analyzing slice n during the test.
func noAutovacuum(t *testing.T, pool *pgxpool.Pool, schema string, n int) {
	t.Helper()
	if _, err := pool.Exec(t.Context(), `ALTER TABLE `+sliceTable(schema, n)+` SET (autovacuum_enabled = false)`); err != nil {
		t.Fatal(err)
	}
}

func hasStats(t *testing.T, pool *pgxpool.Pool, schema string, n int) bool {
	t.Helper()
	return sinktest.Count(t, pool, `SELECT count(*) FROM pg_stats WHERE schemaname = $1 AND tablename = $2 AND attname = 'event_id'`,
		schema, fmt.Sprintf("processed_events_s%d", n)) > 0
}

// grow adds events claims of four handlers each to slice n, as later
// batches would.
func grow(t *testing.T, pool *pgxpool.Pool, schema string, n, events int) {
	t.Helper()
	if _, err := pool.Exec(t.Context(), `INSERT INTO `+sliceTable(schema, n)+` (event_id, handler, bus, payload_digest, slice)
SELECT e.id, h, 'kafka', decode(md5(e.id::text), 'hex'), $2
FROM (SELECT gen_random_uuid() AS id FROM generate_series(1, $1)) e,
     unnest(ARRAY['emailHandler', 'inventoryHandler', 'analyticsHandler', 'recommenderHandler']) h`, events/4, n); err != nil {
		t.Fatal(err)
	}
}

// probes checks that a batch's look-up of 1000 event ids (a hundred of
// them claimed, those of the slice's first events among them), planned as
// the first executions of the statement on a connection are, for its
// parameters, probes slice n's primary key and expects about as many rows
// as there are: not a scan of the slice.
func probes(t *testing.T, pool *pgxpool.Pool, schema string, n int) {
	t.Helper()
	ctx := t.Context()
	processed := pgx.Identifier{schema, "processed_events"}.Sanitize()
	rows, err := pool.Query(ctx, `SELECT event_id FROM `+sliceTable(schema, n)+` LIMIT 100`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[pgtype.UUID])
	if err != nil {
		t.Fatal(err)
	}
	for len(ids) < 1000 {
		ids = append(ids, pgtype.UUID{Bytes: uuid.New(), Valid: true})
	}
	var plan []struct{ Plan planNode }
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL plan_cache_mode = force_custom_plan`); err != nil {
			return err
		}
		var js []byte
		if err := tx.QueryRow(ctx, `EXPLAIN (FORMAT JSON) SELECT event_id, handler, payload_digest FROM `+processed+
			` WHERE event_id = ANY($1::uuid[])`, ids).Scan(&js); err != nil {
			return err
		}
		return json.Unmarshal(js, &plan)
	})
	if err != nil || len(plan) != 1 {
		t.Fatalf("explain the look-up: %v (%d plans)", err, len(plan))
	}
	total := sinktest.Count(t, pool, `SELECT count(*) FROM `+sliceTable(schema, n))
	var nodes []string
	plan[0].Plan.walk(func(p planNode) { nodes = append(nodes, p.Type) })
	if slices.Contains(nodes, "Seq Scan") || plan[0].Plan.Rows > float64(total)/10 {
		t.Fatalf("a batch's look-up in processed_events_s%d (%d rows) expects %.0f rows, and runs %v",
			n, total, plan[0].Plan.Rows, nodes)
	}
}

type planNode struct {
	Type  string     `json:"Node Type"`
	Rows  float64    `json:"Plan Rows"`
	Plans []planNode `json:"Plans"`
}

func (p planNode) walk(f func(planNode)) {
	f(p)
	for _, c := range p.Plans {
		c.walk(f)
	}
}
