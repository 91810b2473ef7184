package sink_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// sqlWriter returns a writer over schema with only hs, and the epoch of
// partition 0 of topic.
func sqlWriter(t *testing.T, pool *pgxpool.Pool, schema, topic string, hs ...sink.Handler) (*sink.Writer, int64) {
	t.Helper()
	w, err := sink.New(pool, sink.Config{Schema: schema, Group: "g", Handlers: hs})
	if err != nil {
		t.Fatal(err)
	}
	leases, err := w.Take(t.Context(), topic, []int32{0})
	if err != nil {
		t.Fatal(err)
	}
	return w, leases[0].Epoch
}

func newSQLHandler(t *testing.T, c sink.SQLHandlerConfig) *sink.SQLHandler {
	t.Helper()
	h, err := sink.NewSQLHandler(c)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func exec(t *testing.T, pool *pgxpool.Pool, sql string) {
	t.Helper()
	if _, err := pool.Exec(t.Context(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// The relation events has the documented columns, filled from the events:
// a statement that copies it whole sees every field.
func TestSQLHandlerSeesEvents(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool)
	for _, raw := range []bool{false, true} {
		t.Run(fmt.Sprintf("raw=%v", raw), func(t *testing.T) {
			table := fmt.Sprintf("%s.seen_%v", schema, raw)
			cols := `event_id uuid, payload jsonb, key bytea, headers jsonb, topic text, partition int, "offset" bigint, "timestamp" timestamptz`
			if raw {
				cols += ", value bytea"
			}
			exec(t, pool, `CREATE TABLE `+table+` (`+cols+`)`)
			h := newSQLHandler(t, sink.SQLHandlerConfig{Name: "copy", SQL: `INSERT INTO ` + table + ` SELECT * FROM events`, RawValues: raw})
			if err := h.Check(t.Context(), pool); err != nil {
				t.Fatalf("Check: %v", err)
			}
			w, epoch := sqlWriter(t, pool, schema, fmt.Sprintf("t%v", raw), h)
			ts := time.Date(2026, 12, 3, 7, 0, 0, 0, time.UTC)
			id1, id2 := uuid.New(), uuid.New()
			evs := []sink.Event{
				{ID: id1, Value: []byte(`{"user_id":1}`), Key: []byte("k1"), Topic: fmt.Sprintf("t%v", raw), Offset: 0, Timestamp: ts,
					Headers: []sink.Header{{Key: "a", Value: []byte("1")}, {Key: "a", Value: []byte("2")}, {Key: "bin", Value: []byte{0xff, 0}}}},
				{ID: id2, Value: []byte(`[2]`), Topic: fmt.Sprintf("t%v", raw), Offset: 1},
			}
			res, err := w.Write(t.Context(), &sink.Batch{Topic: evs[0].Topic, Epoch: epoch, Fence: -1, NextOffset: 2, Events: evs})
			if err != nil {
				t.Fatal(err)
			}
			if res.Applied != 2 {
				t.Errorf("applied %d, want 2", res.Applied)
			}
			var (
				payload, headers, key, topic, value *string
				part                                int32
				offset                              int64
				when                                *time.Time
			)
			valueCol := "NULL::text"
			if raw {
				valueCol = "convert_from(value, 'UTF8')"
			}
			err = pool.QueryRow(t.Context(), `SELECT payload::text, headers::text, convert_from(key, 'UTF8'), topic, partition, "offset", "timestamp", `+valueCol+`
FROM `+table+` WHERE event_id = $1`, id1).Scan(&payload, &headers, &key, &topic, &part, &offset, &when, &value)
			if err != nil {
				t.Fatal(err)
			}
			wantPayload := `{"user_id": 1}`
			if raw {
				if payload != nil || value == nil || *value != `{"user_id":1}` {
					t.Errorf("raw: payload %v, value %v; want NULL and the record's bytes", deref(payload), deref(value))
				}
			} else if deref(payload) != wantPayload {
				t.Errorf("payload = %s, want %s", deref(payload), wantPayload)
			}
			if got, want := deref(headers), `{"a": "2", "bin": null}`; got != want {
				t.Errorf("headers = %s, want %s", got, want)
			}
			if deref(key) != "k1" || deref(topic) != evs[0].Topic || part != 0 || offset != 0 || when == nil || !when.Equal(ts) {
				t.Errorf("row = key %s topic %s partition %d offset %d timestamp %v, want k1 %s 0 0 %v",
					deref(key), deref(topic), part, offset, when, evs[0].Topic, ts)
			}
			if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+table+` WHERE event_id = $1 AND key IS NULL AND headers = '{}' AND "timestamp" IS NULL`, id2); n != 1 {
				t.Errorf("event without key, headers, timestamp: %d rows with NULL, {}, NULL; want 1", n)
			}
		})
	}
}

func deref(s *string) string {
	if s == nil {
		return "<NULL>"
	}
	return *s
}

// A cast that fails for one event, and a constraint another violates,
// dead-letter those two events alone: their neighbours apply, once each,
// and a redelivered batch applies nothing again. The effects table has no
// unique key, so a double apply shows.
func TestSQLHandlerIsolatesDataErrors(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool)
	exec(t, pool, `CREATE TABLE `+schema+`.shipments (event_id uuid, user_id bigint CHECK (user_id >= 0), items int)`)
	h := newSQLHandler(t, sink.SQLHandlerConfig{Name: "shipments", SQL: `
-- one row per order
WITH sized AS (SELECT event_id, payload, jsonb_array_length(payload->'items') AS n FROM events)
INSERT INTO ` + schema + `.shipments (event_id, user_id, items)
SELECT event_id, (payload->>'user_id')::bigint, n FROM sized;`})
	if err := h.Check(t.Context(), pool); err != nil {
		t.Fatalf("Check: %v", err)
	}
	w, epoch := sqlWriter(t, pool, schema, "orders", h)
	const n, badCast, badCheck = 50, 23, 41
	ids := make([]uuid.UUID, n)
	vals := make([][]byte, n)
	for i := range n {
		ids[i] = uuid.New()
		vals[i] = fmt.Appendf(nil, `{"user_id":%d,"items":["A","B"]}`, i)
	}
	vals[badCast] = []byte(`{"user_id":"five","items":["A"]}`)
	vals[badCheck] = []byte(`{"user_id":-1,"items":["A"]}`)
	b := &sink.Batch{Topic: "orders", Epoch: epoch, Fence: -1, NextOffset: n, Events: events(0, ids, vals)}
	res, err := w.Write(t.Context(), b)
	if err != nil {
		t.Fatal(err)
	}
	if res.Applied != n-2 || res.DeadLetters != 2 || len(res.Rejected) != 2 {
		t.Fatalf("result = %+v, want %d applied and 2 dead letters", res, n-2)
	}
	reasons := map[uuid.UUID]string{}
	for _, d := range res.Rejected {
		reasons[d.EventID.UUID] = d.Reason
	}
	for _, tc := range []struct {
		event int
		state string
	}{{badCast, "22P02"}, {badCheck, "23514"}} {
		if r, ok := reasons[ids[tc.event]]; !ok || !strings.Contains(r, tc.state) {
			t.Errorf("dead letter of event %d: reason %q (found %v), want SQLSTATE %s", tc.event, r, ok, tc.state)
		}
	}
	// The same records again, as after a rebalance: nothing applies twice.
	b2 := &sink.Batch{Topic: "orders", Epoch: epoch, Fence: n, NextOffset: 2 * n, Events: events(n, ids, vals)}
	if _, err := w.Write(t.Context(), b2); err != nil {
		t.Fatal(err)
	}
	bad := []uuid.UUID{ids[badCast], ids[badCheck]}
	for _, tc := range []struct {
		name string
		sql  string
		args []any
		want int64
	}{
		{"shipments", `SELECT count(*) FROM ` + schema + `.shipments`, nil, n - 2},
		{"distinct events in shipments", `SELECT count(DISTINCT event_id) FROM ` + schema + `.shipments`, nil, n - 2},
		{"shipments of the bad events", `SELECT count(*) FROM ` + schema + `.shipments WHERE event_id = ANY($1)`, []any{bad}, 0},
		{"dead letters of the bad events", `SELECT count(*) FROM ` + schema + `.dead_letters WHERE event_id = ANY($1)`, []any{bad}, 4}, // one per delivery
	} {
		if got := sinktest.Count(t, pool, tc.sql, tc.args...); got != tc.want {
			t.Errorf("%s = %d, want %d", tc.name, got, tc.want)
		}
	}
}

// An upsert that reaches the same row for two events of a batch fails as
// a whole (SQLSTATE 21000, a data error); the Writer then applies the
// batch in parts, so every event applies once and none is a dead letter.
func TestSQLHandlerUpsertSameRowTwice(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool)
	exec(t, pool, `CREATE TABLE `+schema+`.balances (account text PRIMARY KEY, total bigint)`)
	h := newSQLHandler(t, sink.SQLHandlerConfig{Name: "balances", SQL: `INSERT INTO ` + schema + `.balances
SELECT payload->>'account', (payload->>'amount')::bigint FROM events
ON CONFLICT (account) DO UPDATE SET total = balances.total + excluded.total`})
	w, epoch := sqlWriter(t, pool, schema, "orders", h)
	const n = 8
	ids := make([]uuid.UUID, n)
	vals := make([][]byte, n)
	for i := range n {
		ids[i] = uuid.New()
		vals[i] = fmt.Appendf(nil, `{"account":"acct-%d","amount":%d}`, i%3, i)
	}
	res, err := w.Write(t.Context(), &sink.Batch{Topic: "orders", Epoch: epoch, Fence: -1, NextOffset: n, Events: events(0, ids, vals)})
	if err != nil {
		t.Fatal(err)
	}
	if res.Applied != n || res.DeadLetters != 0 || res.Attempts != 2 {
		t.Errorf("result = %+v, want %d applied, no dead letter, in 2 attempts", res, n)
	}
	if got := sinktest.Count(t, pool, `SELECT sum(total)::bigint FROM `+schema+`.balances`); got != n*(n-1)/2 {
		t.Errorf("sum of balances = %d, want %d", got, n*(n-1)/2)
	}
}

// A handler limited to some topics neither claims nor applies events of
// another: no processed_events row is written for it, while a handler of
// every topic applies them.
func TestSQLHandlerTopics(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool)
	exec(t, pool, `CREATE TABLE `+schema+`.hits (handler text, event_id uuid)`)
	only := newSQLHandler(t, sink.SQLHandlerConfig{Name: "only_a", Topics: []string{"a"},
		SQL: `INSERT INTO ` + schema + `.hits SELECT 'only_a', event_id FROM events`})
	every := newSQLHandler(t, sink.SQLHandlerConfig{Name: "every",
		SQL: `INSERT INTO ` + schema + `.hits SELECT 'every', event_id FROM events`})
	w, err := sink.New(pool, sink.Config{Schema: schema, Group: "g", Handlers: []sink.Handler{only, every}})
	if err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{"a", "b"} {
		leases, err := w.Take(t.Context(), topic, []int32{0})
		if err != nil {
			t.Fatal(err)
		}
		evs := events(0, []uuid.UUID{uuid.New(), uuid.New()}, [][]byte{[]byte(`{}`), []byte(`{}`)})
		for i := range evs {
			evs[i].Topic = topic
		}
		if _, err := w.Write(t.Context(), &sink.Batch{Topic: topic, Epoch: leases[0].Epoch, Fence: -1, NextOffset: 2, Events: evs}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		sql  string
		want int64
	}{
		{`SELECT count(*) FROM ` + schema + `.hits WHERE handler = 'only_a'`, 2},
		{`SELECT count(*) FROM ` + schema + `.hits WHERE handler = 'every'`, 4},
		{`SELECT count(*) FROM ` + schema + `.processed_events WHERE handler = 'only_a'`, 2},
		{`SELECT count(*) FROM ` + schema + `.processed_events WHERE handler = 'every'`, 4},
	} {
		if got := sinktest.Count(t, pool, tc.sql); got != tc.want {
			t.Errorf("%s = %d, want %d", tc.sql, got, tc.want)
		}
	}
}

// Check refuses a statement Postgres cannot run, naming the handler,
// with Postgres' message and where in the configured SQL it is; it accepts
// statements with their own WITH, comments and a trailing semicolon.
func TestSQLHandlerCheck(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool)
	exec(t, pool, `CREATE TABLE `+schema+`.t (id uuid, n bigint)`)
	table := schema + ".t"
	for _, tc := range []struct {
		name string
		sql  string
		raw  bool
		want []string // in the error; none: accepted
	}{
		{"insert", `INSERT INTO ` + table + ` SELECT event_id, (payload->>'n')::bigint FROM events`, false, nil},
		{"own with", "/* lead */ -- comment\nWITH x AS (SELECT event_id FROM events) INSERT INTO " + table + " SELECT event_id, 1 FROM x;", false, nil},
		{"with recursive", `with recursive r(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM r WHERE i < 3) INSERT INTO ` + table + ` SELECT event_id, i FROM events, r`, false, nil},
		{"update", `UPDATE ` + table + ` SET n = n + 1 WHERE id IN (SELECT event_id FROM events)`, false, nil},
		{"raw value", `INSERT INTO ` + table + ` SELECT event_id, length(value) FROM events`, true, nil},
		{"syntax", "INSERT INTO " + table + "\nSELEC event_id FROM events", false, []string{`handler "h"`, `syntax error at or near "SELEC"`, "42601", "line 2 column 1"}},
		{"no table", `INSERT INTO ` + schema + `.nope SELECT event_id FROM events`, false, []string{`handler "h"`, `relation "` + schema + `.nope" does not exist`, "line 1 column 13"}},
		{"no column", `INSERT INTO ` + table + ` (id, m) SELECT event_id, 1 FROM events`, false, []string{`handler "h"`, `column "m" of relation "t" does not exist`}},
		{"value without bytes format", `INSERT INTO ` + table + ` SELECT event_id, length(value) FROM events`, false, []string{`handler "h"`, `column "value" does not exist`}},
		{"two statements", `INSERT INTO ` + table + ` SELECT event_id, 1 FROM events; SELECT 1`, false, []string{`handler "h"`, "multiple commands"}},
		{"events twice", `WITH events AS (SELECT 1) SELECT 1`, false, []string{`handler "h"`, `"events" specified more than once`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newSQLHandler(t, sink.SQLHandlerConfig{Name: "h", SQL: tc.sql, RawValues: tc.raw})
			err := h.Check(t.Context(), pool)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Check: %v", err)
				}
				return
			}
			var se *sink.SQLError
			if !errors.As(err, &se) {
				t.Fatalf("Check error = %v, want a *sink.SQLError", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Check error = %q, want it to contain %q", err, w)
				}
			}
		})
	}
	if got := sinktest.Count(t, pool, `SELECT count(*) FROM `+table); got != 0 {
		t.Errorf("Check left %d rows, want 0", got)
	}
}

func TestNewSQLHandlerValidates(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    sink.SQLHandlerConfig
		want string
	}{
		{"no name", sink.SQLHandlerConfig{SQL: "SELECT 1"}, "empty Name"},
		{"no sql", sink.SQLHandlerConfig{Name: "h", SQL: " -- nothing\n"}, "empty SQL"},
		{"empty topic", sink.SQLHandlerConfig{Name: "h", SQL: "SELECT 1", Topics: []string{""}}, "empty topic"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := sink.NewSQLHandler(tc.c)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("NewSQLHandler error = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

var _ sink.TxBeginner = (*pgxpool.Pool)(nil)

// BenchmarkSQLHandlerApply measures one SQL handler applying batches of
// 1000 events to a narrow table, one transaction per batch. (The other
// shape, a temporary table filled by COPY and then the statement, measured
// no faster on this 2-core machine, within its noise, for three round
// trips instead of one and a catalog entry per batch.)
func BenchmarkSQLHandlerApply(b *testing.B) {
	pool := sinktest.Pool(b)
	schema := sinktest.Schema(b, pool)
	if _, err := pool.Exec(b.Context(), `CREATE TABLE `+schema+`.t (event_id uuid, user_id bigint, topic text, off bigint)`); err != nil {
		b.Fatal(err)
	}
	const n = 1000
	evs := make([]sink.Event, n)
	for i := range evs {
		evs[i] = sink.Event{ID: uuid.New(), Value: fmt.Appendf(nil, `{"user_id":%d,"items":["A","B"]}`, i),
			Topic: "orders", Offset: int64(i), Timestamp: time.Now(),
			Headers: []sink.Header{{Key: "traceparent", Value: []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")}}}
	}
	h, err := sink.NewSQLHandler(sink.SQLHandlerConfig{Name: "h",
		SQL: `INSERT INTO ` + schema + `.t SELECT event_id, (payload->>'user_id')::bigint, topic, "offset" FROM events`})
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		tx, err := pool.Begin(b.Context())
		if err != nil {
			b.Fatal(err)
		}
		if err := h.Apply(b.Context(), tx, evs); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(b.Context()); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "events/s")
}
