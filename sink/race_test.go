package sink_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// Two members write batches of overlapping event ids on their partitions
// at once (cross-partition duplicates, in different orders), with handler
// names whose byte order differs from a linguistic collation's (en_US;
// under C they agree): each key is applied once, and no batch fails (no
// deadlock between the claims, which all write in byte order).
func TestWriteConcurrentDuplicates(t *testing.T) {
	testConcurrentDuplicates(t, false)
}

// The same with a handler that fails on some events, so that both members
// isolate them at once, each in its batch's order: no batch fails (no
// deadlock between the isolating transactions, nor between one and the
// other member's first transaction); the culprits are dead letters on both
// partitions and leave no claim, every other key applies once.
func TestWriteConcurrentDuplicatesIsolating(t *testing.T) {
	testConcurrentDuplicates(t, true)
}

// testConcurrentDuplicates runs the rounds; with failSome, handler "alpha"
// fails (a data error) on about one event in 40, so that both members
// isolate the same events, in their batches' (different) orders.
func testConcurrentDuplicates(t *testing.T, failSome bool) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool)
	effects := pgx.Identifier{schema, "effects"}.Sanitize()
	exec(t, pool, `CREATE TABLE `+effects+` (event_id uuid, handler text)`)
	var hs []sink.Handler
	for _, name := range []string{"Zeta", "alpha", "émail", "Émail", "ß", "b"} {
		hs = append(hs, sink.HandlerFunc(name, func(ctx context.Context, tx pgx.Tx, events []sink.Event) error {
			ids := make([]string, len(events))
			for i, e := range events {
				ids[i] = e.ID.String()
				if failSome && name == "alpha" && e.ID[0] < 6 {
					_, err := tx.Exec(ctx, `SELECT 1/0`)
					return err
				}
			}
			_, err := tx.Exec(ctx, `INSERT INTO `+effects+` SELECT unnest($1::uuid[]), $2`, ids, name)
			return err
		}))
	}
	w, err := sink.New(pool, sink.Config{Schema: schema, Group: "g", Handlers: hs})
	if err != nil {
		t.Fatal(err)
	}
	leases, err := w.Take(t.Context(), "dup", []int32{0, 1})
	if err != nil {
		t.Fatal(err)
	}
	const size = 120
	rounds := 15
	if failSome {
		rounds = 40 // two isolations interleave in some rounds only
	}
	all := make([]uuid.UUID, 0, rounds*size)
	var mu sync.Mutex
	var failures []error
	for r := 0; r < rounds; r++ {
		ids := make([]uuid.UUID, size)
		for i := range ids {
			ids[i] = uuid.New()
		}
		all = append(all, ids...)
		var wg sync.WaitGroup
		for p := int32(0); p < 2; p++ {
			order := append([]uuid.UUID(nil), ids...)
			rand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
			wg.Add(1)
			go func() {
				defer wg.Done()
				evs := make([]sink.Event, len(order))
				for i, id := range order {
					evs[i] = sink.Event{ID: id, Value: []byte(`{}`), Topic: "dup", Partition: p, Offset: int64(r*size + i)}
				}
				fence := int64(r * size)
				if r == 0 {
					fence = -1
				}
				_, err := w.Write(t.Context(), &sink.Batch{Topic: "dup", Partition: p, Epoch: leases[p].Epoch,
					Fence: fence, NextOffset: int64((r + 1) * size), Events: evs})
				if err != nil {
					mu.Lock()
					failures = append(failures, fmt.Errorf("round %d partition %d: %w", r, p, err))
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if len(failures) > 0 {
			break // the next rounds' fences would fail too
		}
	}
	for _, err := range failures {
		t.Error(err)
	}
	if n := sinktest.Count(t, pool, `SELECT count(*) FROM (SELECT event_id, handler FROM `+effects+` GROUP BY 1, 2 HAVING count(*) <> 1) d`); n != 0 {
		t.Errorf("%d keys applied more than once", n)
	}
	if len(failures) > 0 {
		return
	}
	// The events "alpha" fails on are dead letters on both partitions,
	// apply nothing and leave no claim; every other key applies once.
	var good, bad []uuid.UUID
	for _, id := range all {
		if failSome && id[0] < 6 {
			bad = append(bad, id)
		} else {
			good = append(good, id)
		}
	}
	processed := pgx.Identifier{schema, "processed_events"}.Sanitize()
	dead := pgx.Identifier{schema, "dead_letters"}.Sanitize()
	for _, c := range []struct {
		what, sql string
		ids       []uuid.UUID
		want      int
	}{
		{"effects of the events applied", `SELECT count(*) FROM ` + effects + ` WHERE event_id = ANY($1)`, good, len(good) * len(hs)},
		{"claims of the events applied", `SELECT count(*) FROM ` + processed + ` WHERE event_id = ANY($1)`, good, len(good) * len(hs)},
		{"effects of the dead letters", `SELECT count(*) FROM ` + effects + ` WHERE event_id = ANY($1)`, bad, 0},
		{"claims of the dead letters", `SELECT count(*) FROM ` + processed + ` WHERE event_id = ANY($1)`, bad, 0},
		{"dead letters", `SELECT count(*) FROM ` + dead + ` WHERE event_id = ANY($1)`, bad, 2 * len(bad)},
	} {
		if n := sinktest.Count(t, pool, c.sql, c.ids); n != int64(c.want) {
			t.Errorf("%s: %d, want %d", c.what, n, c.want)
		}
	}
}
