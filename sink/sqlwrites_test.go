package sink_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
)

func TestSQLHandlerWrites(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool)
	exec(t, pool, `CREATE TABLE `+schema+`.t (id uuid PRIMARY KEY, n bigint)`)
	exec(t, pool, `CREATE TABLE `+schema+`.u (id uuid)`)
	t1, u := schema+".t", schema+".u"
	for _, tc := range []struct {
		name, sql string
		want      []string
	}{
		{"insert", `INSERT INTO ` + t1 + ` SELECT event_id, 1 FROM events`, []string{t1}},
		{"upsert", `INSERT INTO ` + t1 + ` SELECT event_id, 1 FROM events ON CONFLICT (id) DO UPDATE SET n = t.n + 1`, []string{t1}},
		{"update", `UPDATE ` + t1 + ` SET n = n + 1 WHERE id IN (SELECT event_id FROM events)`, []string{t1}},
		{"delete", `DELETE FROM ` + u + ` WHERE id IN (SELECT event_id FROM events)`, []string{u}},
		{"merge", `MERGE INTO ` + t1 + ` USING events ON t.id = events.event_id WHEN NOT MATCHED THEN INSERT VALUES (events.event_id, 1)`, []string{t1}},
		{"writable with, twice", `WITH a AS (INSERT INTO ` + u + ` SELECT event_id FROM events), b AS (INSERT INTO ` + u + ` SELECT event_id FROM events)
INSERT INTO ` + t1 + ` SELECT event_id, 1 FROM events`, []string{t1, u}},
		{"select", `SELECT count(*) FROM events, ` + u, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newSQLHandler(t, sink.SQLHandlerConfig{Name: "h", SQL: tc.sql})
			ts, err := h.Writes(t.Context(), pool)
			if err != nil {
				t.Fatalf("Writes: %v", err)
			}
			var got []string
			for _, x := range ts {
				got = append(got, x[0]+"."+x[1])
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("Writes = %v, want %v", got, tc.want)
			}
			if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+t1); n != 0 {
				t.Fatalf("Writes ran the statement: %d rows", n)
			}
		})
	}
	h := newSQLHandler(t, sink.SQLHandlerConfig{Name: "h", SQL: `INSERT INTO ` + schema + `.nope SELECT event_id FROM events`})
	var se *sink.SQLError
	if _, err := h.Writes(t.Context(), pool); !errors.As(err, &se) {
		t.Fatalf("Writes of a statement Postgres refuses = %v, want a *sink.SQLError", err)
	}
}
