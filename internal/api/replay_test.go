package api_test

import (
	"strings"
	"testing"

	"github.com/onceflow/onceflow/sink"
)

// A replay with another order as its body publishes that order under the
// same id and says the consumer will dead-letter it as a conflict; a body
// that is not an order is refused and publishes nothing.
func TestReplayWithAnotherPayload(t *testing.T) {
	s := newSeed(t)
	id := "7f8a0000-0000-0000-0000-000000000011"
	if code, _, body := s.post(id, order); code != 200 {
		t.Fatalf("POST: %d %v", code, body)
	}
	other := `{"user_id":2,"items":["B"]}`
	code, _, body := s.do("POST", "/demo/replay-event/"+id, nil, other)
	if code != 200 || body["expect"] != "conflict" || !strings.Contains(body["note"].(string), sink.ReasonConflict) {
		t.Fatalf("replay with another payload: %d %v", code, body)
	}
	if want := "orders/" + id + "/" + other; len(s.pub.recs) != 1 || s.pub.recs[0] != want {
		t.Errorf("published %v, want [%s]", s.pub.recs, want)
	}
	if code, _, body := s.do("POST", "/demo/replay-event/"+id, nil, order); code != 200 || body["expect"] != "skip" {
		t.Errorf("replay with the stored payload as body: %d %v, want expect skip", code, body)
	}
	if code, _, body := s.do("POST", "/demo/replay-event/"+id, nil, `{"nope":`); code != 400 {
		t.Errorf("replay with a bad body: %d %v, want 400", code, body)
	}
	if len(s.pub.recs) != 2 {
		t.Errorf("published %d records, want 2 (the bad body publishes nothing)", len(s.pub.recs))
	}
}

// The audit shows a conflicting delivery (conflict, on the event and on
// its dead letter) and which processed row a backfill applied (replayed_by
// on that handler's row only).
func TestAuditShowsConflictAndBackfill(t *testing.T) {
	s := newSeed(t)
	id := "7f8a0000-0000-0000-0000-000000000012"
	if code, _, body := s.post(id, order); code != 200 {
		t.Fatalf("POST: %d %v", code, body)
	}
	if a := s.audit(id); a["conflict"] != false {
		t.Fatalf("audit before any conflict: conflict = %v, want false", a["conflict"])
	}
	for _, q := range []string{
		`INSERT INTO ` + s.schema + `.processed_events (event_id, handler, bus, processed_at, payload_digest)
		 VALUES ($1, 'emailHandler', 'kafka', now() - interval '2 hours', '\x00112233445566778899aabbccddeeff')`,
		`INSERT INTO ` + s.schema + `.sink_replays (consumer_group, topic, partition, from_offset, to_offset, handler, created_at)
		 VALUES ('g', 'orders', 0, 10, 0, 'recommenderHandler', now() - interval '1 hour')`,
		`INSERT INTO ` + s.schema + `.processed_events (event_id, handler, bus) VALUES ($1, 'recommenderHandler', 'kafka')`,
		`INSERT INTO ` + s.schema + `.dead_letters (consumer_group, topic, partition, "offset", event_id, reason)
		 VALUES ('g', 'orders', 0, 7, $1, '` + sink.ReasonConflict + `')`,
	} {
		var args []any
		if strings.Contains(q, "$1") {
			args = append(args, id)
		}
		if _, err := s.pool.Exec(t.Context(), q, args...); err != nil {
			t.Fatal(err)
		}
	}
	a := s.audit(id)
	if a["conflict"] != true {
		t.Errorf("audit conflict = %v, want true", a["conflict"])
	}
	dls := a["dead_letters"].([]any)
	if len(dls) != 1 || dls[0].(map[string]any)["conflict"] != true {
		t.Errorf("audit dead letters = %v, want one marked conflict", dls)
	}
	for _, p := range a["processed"].([]any) {
		row := p.(map[string]any)
		switch row["handler"] {
		case "emailHandler":
			if row["replayed_by"] != nil || row["payload_digest"] != "00112233445566778899aabbccddeeff" {
				t.Errorf("emailHandler row = %v, want its digest and no replayed_by", row)
			}
		case "recommenderHandler":
			if row["replayed_by"] == nil {
				t.Errorf("recommenderHandler row = %v, want replayed_by (the backfill)", row)
			}
		}
	}
}
