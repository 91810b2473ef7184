package api_test

import (
	"strings"
	"testing"

	"github.com/google/uuid"
)

// GET /audit/event/{id} of an id onceflow never saw (no outbox row, no
// processed row, no dead letter) is a 404 that says so; an id known only
// by its dead letter (a record refused while decoding) is a 200 listing it.
func TestAuditOfUnknownAndDeadLetteredIDs(t *testing.T) {
	s := newSeed(t)
	unknown := uuid.New()
	code, _, body := s.do("GET", "/audit/event/"+unknown.String(), nil, "")
	msg, _ := body["error"].(string)
	if code != 404 || !strings.Contains(msg, "no record of the event "+unknown.String()) {
		t.Errorf("audit of an unknown id: %d %v, want 404 saying onceflow has no record of it", code, body)
	}

	dead := uuid.New()
	if _, err := s.pool.Exec(t.Context(), `INSERT INTO `+s.schema+`.dead_letters
(consumer_group, topic, partition, "offset", event_id, reason) VALUES ('g', 'orders', 0, 7, $1, 'value contains \u0000')`, dead); err != nil {
		t.Fatal(err)
	}
	a := s.audit(dead.String())
	if dls, _ := a["dead_letters"].([]any); len(dls) != 1 {
		t.Errorf("audit of a dead-lettered id = %v, want its dead letter", a)
	}
}
