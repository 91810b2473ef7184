package sink_test

import (
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// The audit says which slice a claim is in and until when it is kept at
// least: now + horizon while its slice is current, its slice's end +
// horizon once closed, nothing with an unlimited horizon.
func TestAuditRetainedUntil(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool)
	ctx := t.Context()
	id := uuid.New()
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := dedup.Claim(ctx, tx, schema, "kafka", "", []dedup.Key{{EventID: id, Handler: "h"}}, nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	const horizon = time.Hour
	audit := func(h time.Duration) sink.Processed {
		t.Helper()
		a, err := sink.Audit(ctx, pool, schema, id, h)
		if err != nil || len(a.Processed) != 1 {
			t.Fatalf("audit: %+v, %v", a, err)
		}
		return a.Processed[0]
	}
	if p := audit(0); p.RetainedUntil != nil {
		t.Errorf("unlimited horizon: retained_until = %v, want none", p.RetainedUntil)
	}
	p := audit(horizon)
	if p.Slice != 0 || p.RetainedUntil == nil || time.Until(*p.RetainedUntil) < horizon-time.Minute || time.Until(*p.RetainedUntil) > horizon+time.Minute {
		t.Fatalf("current slice: slice %d retained_until %v, want slice 0 and about now + 1h", p.Slice, p.RetainedUntil)
	}

	// Slice 0 closes (rotated after being current for two hours).
	if _, err := pool.Exec(ctx, `UPDATE `+pgx.Identifier{schema, "processed_events_slices"}.Sanitize()+
		` SET started_at = now() - interval '2 hours'`); err != nil {
		t.Fatal(err)
	}
	r := dedup.Retention{Pool: pool, Schema: schema, Horizon: 2 * horizon}
	if res, err := r.Step(ctx); err != nil || !res.Rotated {
		t.Fatalf("step = %+v, %v; want a rotation", res, err)
	}
	var ended time.Time
	if err := pool.QueryRow(ctx, `SELECT started_at FROM `+pgx.Identifier{schema, "processed_events_slices"}.Sanitize()+
		` WHERE slice = 1`).Scan(&ended); err != nil {
		t.Fatal(err)
	}
	if p := audit(horizon); p.RetainedUntil == nil || !p.RetainedUntil.Equal(ended.Add(horizon)) {
		t.Errorf("closed slice: retained_until = %v, want its end + horizon = %v", p.RetainedUntil, ended.Add(horizon))
	}
}

// The audit gives each dead letter's topic id: the same event dead-lettered
// at one topic, partition and offset of two topics of one name (deleted
// and created again in between) is two rows told apart by it; a row with
// no id says none.
func TestAuditDeadLetterTopicIDs(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool)
	ctx := t.Context()
	id, old, now := uuid.New(), uuid.New(), uuid.New()
	for _, topicID := range []any{nil, old, now} {
		if _, err := pool.Exec(ctx, `INSERT INTO `+pgx.Identifier{schema, "dead_letters"}.Sanitize()+
			` (consumer_group, topic, partition, "offset", event_id, reason, topic_id) VALUES ('g', 'orders', 2, 24, $1, 'value is empty', $2)`,
			id, topicID); err != nil {
			t.Fatal(err)
		}
	}
	a, err := sink.Audit(ctx, pool, schema, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range a.DeadLetters {
		if d.TopicID == nil {
			got = append(got, "none")
		} else {
			got = append(got, d.TopicID.String())
		}
	}
	if want := []string{"none", old.String(), now.String()}; !slices.Equal(got, want) {
		t.Errorf("dead letters' topic ids %v, want %v", got, want)
	}
}
