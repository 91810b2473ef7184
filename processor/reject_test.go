package processor_test

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/wire"
)

// A Go handler that rejects events with reasons Postgres cannot store as
// they are (invalid UTF-8, a NUL) does not stop the partition: each event
// is a dead letter with its reason sanitized, and the records after it
// apply.
func TestRejectReasonPostgresRefusesDoesNotStopThePartition(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 1)
		reasons := map[string]string{`"poison-1"`: "bad \xff\xfe bytes", `"poison-2"`: "a \x00 NUL"}
		reject := sink.HandlerFunc("rejecter", func(_ context.Context, _ pgx.Tx, evs []sink.Event) error {
			for _, ev := range evs {
				for marker, r := range reasons {
					if bytes.Contains(ev.Value, []byte(marker)) {
						return &sink.RejectError{EventID: ev.ID, Reason: r}
					}
				}
			}
			return nil
		})
		stream, err := orders.Generate(20, 0, 3)
		if err != nil {
			t.Fatal(err)
		}
		var recs []*kgo.Record
		poison := 0
		for i, m := range stream.Messages {
			recs = append(recs, wire.NewRecord(e.topic, m.ID, m.Value))
			if i == 4 || i == 12 {
				poison++
				recs = append(recs, wire.NewRecord(e.topic, uuid.New(),
					[]byte(`{"user_id":1,"items":["A"],"note":"poison-`+strconv.Itoa(poison)+`"}`)))
			}
		}
		e.produce(recs...)
		ends := e.logEnds()
		hs, err := orders.Handlers(e.schema)
		if err != nil {
			t.Fatal(err)
		}
		w, err := sink.New(e.pool, sink.Config{Schema: e.schema, Group: e.group, Handlers: append(hs, reject)})
		if err != nil {
			t.Fatal(err)
		}
		m := e.start(e.config("rejecting"), w)
		e.waitStored(ends, 60*time.Second)
		m.stop(t)
		e.checkExactlyOnce(stream.Unique)
		rows, err := e.pool.Query(t.Context(), `SELECT reason FROM `+e.schema+`.dead_letters ORDER BY "offset"`)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"rejected: bad \uFFFD bytes", "rejected: a \uFFFD NUL"}
		if strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("dead-letter reasons %q, want %q", got, want)
		}
		for _, r := range got {
			if !utf8.ValidString(r) {
				t.Errorf("reason %q is not valid UTF-8", r)
			}
		}
	})
}
