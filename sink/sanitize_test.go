package sink_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// rejectBytes rejects the events in reasons with their reason, raw bytes
// a Go handler made up: invalid UTF-8, a NUL.
type rejectBytes struct{ reasons map[uuid.UUID]string }

func (rejectBytes) Name() string { return "rejectBytes" }

func (h rejectBytes) Apply(_ context.Context, _ pgx.Tx, events []sink.Event) error {
	var errs []error
	for _, e := range events {
		if r, ok := h.reasons[e.ID]; ok {
			errs = append(errs, &sink.RejectError{EventID: e.ID, Reason: r})
		}
	}
	return errors.Join(errs...)
}

// A dead letter's reason is stored whatever bytes its writer put in it: a
// Go handler's rejection with invalid UTF-8 or a NUL, a decoder's reason
// likewise, one far too long. Each is stored valid UTF-8, without NUL,
// bounded; the batch commits and the rest of it applies.
func TestDeadLetterReasonsAreSanitized(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool, orders.Migrate)
	ctx := t.Context()
	invalid, nul := uuid.New(), uuid.New()
	w := newWriter(t, pool, schema, nil, rejectBytes{map[uuid.UUID]string{
		invalid: "bad \xff\xfe byte",
		nul:     "nul \x00 here",
	}})
	epoch := take(t, w)

	good := uuid.New()
	ids := []uuid.UUID{invalid, good, nul}
	vals := [][]byte{order(1, "A"), order(2, "B"), order(3, "C")}
	undecodable := []sink.DeadLetter{
		{Topic: "orders", Partition: 0, Offset: 3, Reason: "header \"\xc3\x28\" \x00 is not a UUID", Value: []byte("x")},
		{Topic: "orders", Partition: 0, Offset: 4, Reason: strings.Repeat("é", 100_000), Value: []byte("y")},
	}
	res, err := w.Write(ctx, &sink.Batch{Topic: "orders", Epoch: epoch, Fence: -1, NextOffset: 5,
		Events: events(0, ids, vals), DeadLetters: undecodable})
	if err != nil {
		t.Fatalf("write: %v (the partition is stuck on this batch)", err)
	}
	if res.Applied != 5 || len(res.Rejected) != 2 {
		t.Errorf("result %+v; want the good event applied by its 5 handlers and 2 events rejected", res)
	}
	if got := sinktest.Count(t, pool, `SELECT next_offset FROM `+schema+`.sink_offsets WHERE consumer_group = 'g'`); got != 5 {
		t.Errorf("stored offset = %d, want 5", got)
	}
	rows, err := pool.Query(ctx, `SELECT "offset", reason FROM `+schema+`.dead_letters ORDER BY "offset"`)
	if err != nil {
		t.Fatal(err)
	}
	reasons, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var off int64
		var s string
		err := r.Scan(&off, &s)
		return s, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(reasons) != 4 {
		t.Fatalf("dead letters %q, want 4", reasons)
	}
	want := []string{"rejected: bad \uFFFD byte", "rejected: nul \uFFFD here", "header \"\uFFFD(\" \uFFFD is not a UUID", ""}
	for i, r := range reasons {
		if !utf8.ValidString(r) || strings.ContainsRune(r, 0) || len(r) > sink.MaxReasonBytes {
			t.Errorf("dead letter %d: reason of %d bytes, valid UTF-8 %v: not sanitized", i, len(r), utf8.ValidString(r))
		}
		if want[i] != "" && r != want[i] {
			t.Errorf("dead letter %d: reason %q, want %q", i, r, want[i])
		}
	}
	if r := reasons[3]; !strings.HasPrefix(r, "ééé") || !strings.Contains(r, "bytes cut") {
		t.Errorf("long reason = %.40q…%q, want its start and a note of what was cut", r, r[max(0, len(r)-40):])
	}
}

// A handler's name is stored in every claim and dead-letter reason: a name
// Postgres cannot store as text is refused when the Writer is made, not
// found out batch by batch.
func TestNewRefusesHandlerNamesPostgresCannotStore(t *testing.T) {
	pool := sinktest.Pool(t)
	noop := func(context.Context, pgx.Tx, []sink.Event) error { return nil }
	_, err := sink.New(pool, sink.Config{Group: "g", Handlers: []sink.Handler{
		sink.HandlerFunc("bad\xffname", noop), sink.HandlerFunc("nul\x00name", noop)}})
	if err == nil {
		t.Fatal("New accepted handler names with invalid UTF-8 and a NUL")
	}
	for _, want := range []string{`handler "bad\xffname": the name is not valid UTF-8`, `handler "nul\x00name": the name contains a NUL`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}
