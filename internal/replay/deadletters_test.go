package replay_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/internal/replay"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
	"github.com/onceflow/onceflow/wire"
)

// A dry run of a range holding poison counts it as what the re-read will
// do, not as pairs to apply: an undecodable record is a dead letter again;
// an event Parse refuses is a dead letter again, for every handler that
// would have claimed it; an event a handler refused before (its dead
// letter is in dead_letters) is counted apart, since only running the
// handler tells whether it refuses it again.
func TestDryRunCountsDeadLetters(t *testing.T) {
	eachBroker(t, func(t *testing.T, seeds []string) {
		e := newEnv(t, seeds)
		s := stream(t, 30)
		e.produce(s.Messages, time.Now())
		notOrder, tooLong := uuid.New(), uuid.New()
		poison := []*kgo.Record{
			wire.NewRecord(e.topic, uuid.New(), []byte(`{"user_id":`)), // undecodable
			wire.NewRecord(e.topic, notOrder, []byte(`{"user_id":1,"items":[]}`)),
			wire.NewRecord(e.topic, tooLong, []byte(`{"user_id":1,"items":["`+randomLetters(10000)+`"]}`)), // index row too large
		}
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		defer cancel()
		if err := e.client().ProduceSync(ctx, poison...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		total := int64(len(s.Messages) + len(poison))
		e.runUntil(total)
		e.check(s.Unique)
		if n := sinktest.Count(t, e.pool, `SELECT count(*) FROM `+e.schema+`.dead_letters`); n != 3 {
			t.Fatalf("%d dead letters after the first read, want 3", n)
		}

		for _, tc := range []struct {
			name           string
			parse          func(sink.Event) (any, error)
			refused, again int64 // pairs per handler
		}{
			{"with Parse", orders.ParseEvent, 1, 1},
			{"without Parse", nil, 0, 2},
		} {
			t.Run(tc.name, func(t *testing.T) {
				r, err := replay.New(replay.Config{Pool: e.pool, Brokers: e.seeds, Schema: e.schema, Group: e.group,
					Topics: []string{e.topic}, Handlers: orders.Names, Parse: tc.parse,
					KafkaOptions: []kgo.Opt{kgo.MetadataMinAge(100 * time.Millisecond)}})
				if err != nil {
					t.Fatal(err)
				}
				defer r.Close()
				plan, err := r.Plan(t.Context(), replay.Request{Target: replay.Target{Start: true}})
				if err != nil {
					t.Fatal(err)
				}
				if err := r.Count(t.Context(), plan); err != nil {
					t.Fatal(err)
				}
				var records, undecodable, refused, before int64
				for _, p := range plan.Partitions {
					records, undecodable, refused, before = records+p.Records, undecodable+p.Undecodable, refused+p.Refused, before+p.DeadLetteredBefore
				}
				if records != total || undecodable != 1 || refused != tc.refused || before != tc.again {
					t.Errorf("records %d, undecodable %d, refused %d, dead-lettered before %d; want %d, 1, %d, %d",
						records, undecodable, refused, before, total, tc.refused, tc.again)
				}
				_, pairs := totals(plan)
				for _, h := range orders.Names {
					want := replay.PairCounts{Skipped: int64(len(s.Messages)), Refused: tc.refused, DeadLetteredBefore: tc.again}
					if got := pairs[h]; got != want {
						t.Errorf("%s: %+v, want %+v (nothing to apply)", h, got, want)
					}
				}
			})
		}
	})
}

// randomLetters returns n random letters: text no compression makes small.
func randomLetters(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = 'a' + byte(rand.IntN(26))
	}
	return string(b)
}
