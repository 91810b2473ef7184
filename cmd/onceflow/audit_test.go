package main

import (
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/sink/sinktest"
)

// `onceflow audit ID` of an id onceflow never saw says so and exits
// non-zero, printing nothing on standard output; an id known only by its
// dead letter is found.
func TestAuditOfUnknownAndDeadLetteredIDs(t *testing.T) {
	dsn := sinktest.DSN(t)
	pool := sinktest.Pool(t)
	schema := freshSchema(t, pool, "test_audit_")
	if _, err := runCLI(t, io.Discard, "migrate", "--dsn", dsn, "--schema", schema); err != nil {
		t.Fatal(err)
	}
	unknown := uuid.New().String()
	out, err := runCLI(t, io.Discard, "audit", unknown, "--dsn", dsn, "--schema", schema)
	if err == nil || !strings.Contains(err.Error(), "no record of the event "+unknown) || out != "" {
		t.Errorf("audit of an unknown id: error %v, output %q; want an error saying onceflow has no record of it, no output", err, out)
	}

	dead := uuid.New().String()
	if _, err := pool.Exec(t.Context(), `INSERT INTO `+schema+`.dead_letters
(consumer_group, topic, partition, "offset", event_id, reason) VALUES ('g', 'orders', 0, 7, $1, 'value is 2000 bytes, over the 1024-byte limit')`, dead); err != nil {
		t.Fatal(err)
	}
	out, err = runCLI(t, io.Discard, "audit", dead, "--dsn", dsn, "--schema", schema)
	if err != nil {
		t.Fatal(err)
	}
	var a struct {
		DeadLetters []struct {
			Reason string `json:"reason"`
		} `json:"dead_letters"`
	}
	if err := json.Unmarshal([]byte(out), &a); err != nil || len(a.DeadLetters) != 1 {
		t.Errorf("audit of a dead-lettered id: %v\n%s\nwant its dead letter", err, out)
	}
}

// `onceflow audit` in a schema onceflow never ran in says so, naming the
// schema, as `onceflow trace` does (it printed Postgres' "relation does not
// exist").
func TestAuditInASchemaWithoutOnceflow(t *testing.T) {
	_, err := runCLI(t, io.Discard, "audit", uuid.New().String(), "--dsn", sinktest.DSN(t), "--schema", "no_onceflow_here")
	if err == nil || !strings.Contains(err.Error(), `schema "no_onceflow_here" has no processed_events table`) {
		t.Errorf("audit in a schema without onceflow's tables: %v", err)
	}
}
