package processor_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
	"github.com/onceflow/onceflow/wire"
)

// A re-read of records already dead-lettered inserts no dead_letters row,
// and so neither logs them again nor raises Stats.DeadLetters
// (onceflow_dead_letters_total): the counters of the members that read a
// partition, summed, equal the table's rows, however often it was read.
func TestReReadCountsNoDeadLetterTwice(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 1)
		stream, err := orders.Generate(40, 0, 7)
		if err != nil {
			t.Fatal(err)
		}
		recs := make([]*kgo.Record, 0, len(stream.Messages)+4)
		for i, m := range stream.Messages {
			recs = append(recs, wire.NewRecord(e.topic, m.ID, m.Value))
			switch i {
			case 5: // undecodable: no event_id header
				recs = append(recs, &kgo.Record{Topic: e.topic, Value: []byte(`{"user_id":1,"items":["A"]}`)})
			case 12: // undecodable: not JSON
				recs = append(recs, wire.NewRecord(e.topic, uuid.New(), []byte(`{"user_id":`)))
			case 20, 30: // rejected by the handlers
				recs = append(recs, wire.NewRecord(e.topic, uuid.New(), []byte(`{"user_id":1,"items":[]}`)))
			}
		}
		e.produce(recs...)
		ends := e.logEnds()
		const poison = 4
		deadRows := func() int64 {
			return sinktest.Count(t, e.pool, `SELECT count(*) FROM `+e.schema+`.dead_letters WHERE consumer_group = $1`, e.group)
		}

		read := func(name string) (dead int64, logged int) {
			t.Helper()
			logs := &logRecorder{}
			cfg := e.config(name)
			cfg.Logger = slog.New(logs)
			hs, err := orders.Handlers(e.schema)
			if err != nil {
				t.Fatal(err)
			}
			w, err := sink.New(e.pool, sink.Config{Schema: e.schema, Group: e.group, Handlers: hs, Logger: cfg.Logger})
			if err != nil {
				t.Fatal(err)
			}
			m := e.start(cfg, w)
			e.waitStored(ends, 60*time.Second)
			m.stop(t)
			return m.c.Stats().DeadLetters, logs.count(slog.LevelWarn, "dead letter")
		}
		dead, logged := read("first")
		if rows := deadRows(); rows != poison || dead != poison || logged != poison {
			t.Fatalf("first read: %d dead_letters rows, Stats.DeadLetters %d, %d dead-letter warnings; want %d of each", rows, dead, logged, poison)
		}
		e.checkExactlyOnce(stream.Unique)

		e.rewind()
		dead, logged = read("rereading")
		if rows := deadRows(); rows != poison || dead != 0 || logged != 0 {
			t.Errorf("re-read: %d dead_letters rows, Stats.DeadLetters %d, %d dead-letter warnings; want %d rows, no dead letter counted or logged again",
				rows, dead, logged, poison)
		}
		e.checkExactlyOnce(stream.Unique)
	})
}
