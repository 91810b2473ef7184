package main

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/internal/orders"
)

// A small run: events a (partition 0) and b (partition 1, redelivered on
// partition 0), one poison record at 0@1.
var (
	evA    = uuid.MustParse("0aaaaaaa-0000-4000-8000-000000000000")
	evB    = uuid.MustParse("0bbbbbbb-0000-4000-8000-000000000000")
	poisID = uuid.MustParse("0ccccccc-0000-4000-8000-000000000000")
)

func smallExpectation() *expectation {
	poison := &record{Seq: 2, Kind: "rejected", ID: poisID}
	return &expectation{
		Orders: map[uuid.UUID]orders.Order{evA: {UserID: 1, Items: []string{"X"}}, evB: {UserID: 2, Items: []string{"Y", "Z"}}},
		Copies: map[uuid.UUID][]pos{evA: {{Partition: 0, Offset: 0}}, evB: {{Partition: 1, Offset: 0}, {Partition: 0, Offset: 2}}},
		Poison: map[pos]*record{{Partition: 0, Offset: 1}: poison},
		At: map[pos]*record{{Partition: 0, Offset: 0}: {Seq: 1, Kind: kindOrder, ID: evA}, {Partition: 0, Offset: 1}: poison,
			{Partition: 0, Offset: 2}: {Seq: 4, Kind: kindRedelivery, ID: evB}, {Partition: 1, Offset: 0}: {Seq: 3, Kind: kindOrder, ID: evB}},
		Ends: map[int32]int64{0: 3, 1: 1},
	}
}

// perfectObservation is what Postgres holds when every effect happened
// once.
func perfectObservation() *observed {
	all := func() map[string]int64 {
		m := map[string]int64{}
		for _, h := range orders.Names {
			m[h] = 1
		}
		return m
	}
	return &observed{
		Processed:   map[uuid.UUID]map[string]int64{evA: all(), evB: all()},
		Emails:      map[uuid.UUID]int64{evA: 1, evB: 1},
		Counters:    map[string]int64{"orders": 2, "items": 3},
		Inventory:   map[string]int64{"X": 1, "Y": 1, "Z": 1},
		Weights:     map[userItem]int64{{1, "X"}: 1, {2, "Y"}: 1, {2, "Z"}: 1},
		DeadLetters: map[pos]deadLetter{{Partition: 0, Offset: 1}: {Count: 1, Reason: "rejected"}},
		Stored:      map[int32]int64{0: 3, 1: 1},
	}
}

func TestJudge(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(o *observed)
		check  func(v *verdict) error
	}{
		{"every effect once", func(*observed) {}, func(v *verdict) error {
			if !v.pass() || v.DLOK != 1 || v.DLWant != 1 || v.Events != 2 {
				return fmt.Errorf("not a pass: %+v", v)
			}
			return nil
		}},
		{"an email missing behind the stored offset is lost", func(o *observed) { delete(o.Emails, evA) },
			wantEvents(func(v *verdict) []eventProblem { return v.Lost }, evA)},
		{"a handler's row missing is lost", func(o *observed) { delete(o.Processed[evB], orders.Recommender) },
			wantEvents(func(v *verdict) []eventProblem { return v.Lost }, evB)},
		{"an event not reached yet is unreached, not lost", func(o *observed) {
			delete(o.Processed, evA)
			delete(o.Emails, evA)
			o.Stored[0] = 0
		}, wantEvents(func(v *verdict) []eventProblem { return v.Unreached }, evA)},
		{"an event with one copy passed over is lost", func(o *observed) {
			delete(o.Processed, evB)
			delete(o.Emails, evB)
			o.Stored[1] = 0 // 1@0 not reached, but 0@2 passed
		}, wantEvents(func(v *verdict) []eventProblem { return v.Lost }, evB)},
		{"two emails are doubled", func(o *observed) { o.Emails[evB] = 2 },
			wantEvents(func(v *verdict) []eventProblem { return v.Doubled }, evB)},
		{"two processed rows are doubled", func(o *observed) { o.Processed[evA][orders.Email] = 2 },
			wantEvents(func(v *verdict) []eventProblem { return v.Doubled }, evA)},
		{"effects of poison are extra", func(o *observed) {
			o.Processed[poisID] = map[string]int64{orders.Email: 1}
			o.Emails[poisID] = 1
		}, wantEvents(func(v *verdict) []eventProblem { return v.Extra }, poisID)},
		{"a counter off by one", func(o *observed) { o.Counters["items"] = 4 }, wantCount(func(v *verdict) int { return len(v.Counters) }, 1)},
		{"an item reserved twice", func(o *observed) { o.Inventory["Y"] = 2 }, wantCount(func(v *verdict) int { return len(v.Counters) }, 1)},
		{"an unknown item reserved", func(o *observed) { o.Inventory["Q"] = 1 }, wantCount(func(v *verdict) int { return len(v.Counters) }, 1)},
		{"a weight missing", func(o *observed) { delete(o.Weights, userItem{2, "Z"}) }, wantCount(func(v *verdict) int { return len(v.Counters) }, 1)},
		{"a dead letter passed over", func(o *observed) { delete(o.DeadLetters, pos{Partition: 0, Offset: 1}) },
			wantPos(func(v *verdict) []pos { return v.DLMissing }, pos{Partition: 0, Offset: 1})},
		{"a dead letter not reached", func(o *observed) {
			delete(o.DeadLetters, pos{Partition: 0, Offset: 1})
			o.Stored[0] = 1
		}, wantPos(func(v *verdict) []pos { return v.DLUnreached }, pos{Partition: 0, Offset: 1})},
		{"a dead letter twice", func(o *observed) { o.DeadLetters[pos{Partition: 0, Offset: 1}] = deadLetter{Count: 2} },
			wantPos(func(v *verdict) []pos { return v.DLDoubled }, pos{Partition: 0, Offset: 1})},
		{"a good record dead-lettered", func(o *observed) { o.DeadLetters[pos{Partition: 0, Offset: 2}] = deadLetter{Count: 1} },
			wantPos(func(v *verdict) []pos { return v.DLUnexpected }, pos{Partition: 0, Offset: 2})},
		{"a partition behind its end", func(o *observed) { o.Stored[1] = 0 },
			wantParts(func(v *verdict) []partitionProblem { return v.Stuck }, partitionProblem{1, 0, 1})},
		{"a partition with no stored offset", func(o *observed) { delete(o.Stored, 1) },
			wantParts(func(v *verdict) []partitionProblem { return v.Stuck }, partitionProblem{1, -1, 1})},
		{"a stored offset past the end", func(o *observed) { o.Stored[1] = 5 },
			wantParts(func(v *verdict) []partitionProblem { return v.Ahead }, partitionProblem{1, 5, 1})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := perfectObservation()
			tc.mutate(o)
			v := judge(smallExpectation(), o, orders.Names)
			if err := tc.check(v); err != nil {
				t.Fatal(err)
			}
			if tc.name != "every effect once" && v.pass() {
				t.Fatalf("a broken observation passed: %+v", v)
			}
		})
	}
}

func wantEvents(get func(*verdict) []eventProblem, ids ...uuid.UUID) func(*verdict) error {
	return func(v *verdict) error {
		var got []uuid.UUID
		for _, p := range get(v) {
			got = append(got, p.ID)
		}
		if !slices.Equal(got, ids) {
			return fmt.Errorf("got events %v, want %v (verdict %+v)", got, ids, v)
		}
		return nil
	}
}

func wantPos(get func(*verdict) []pos, ps ...pos) func(*verdict) error {
	return func(v *verdict) error {
		if got := get(v); !slices.Equal(got, ps) {
			return fmt.Errorf("got %v, want %v (verdict %+v)", got, ps, v)
		}
		return nil
	}
}

func wantParts(get func(*verdict) []partitionProblem, ps ...partitionProblem) func(*verdict) error {
	return func(v *verdict) error {
		if got := get(v); !slices.Equal(got, ps) {
			return fmt.Errorf("got %v, want %v (verdict %+v)", got, ps, v)
		}
		return nil
	}
}

func wantCount(get func(*verdict) int, n int) func(*verdict) error {
	return func(v *verdict) error {
		if got := get(v); got != n {
			return fmt.Errorf("got %d, want %d (verdict %+v)", got, n, v)
		}
		return nil
	}
}

// TestExpect matches a topic's content to the ledger: what the broker lost
// or holds without an acknowledgement is told apart from what onceflow
// must apply.
func TestExpect(t *testing.T) {
	w := testWorkload(t, 11)
	l := newLedger(w)
	var found []landed
	next := map[int32]int64{}
	var lost, unacked int64
	for i, r := range w.Records {
		at := pos{Partition: r.Partition, Offset: next[r.Partition]}
		switch {
		case i == 10: // acknowledged, then lost by the broker
			l.answer(r.Seq, sent{Acked: true, Partition: at.Partition, Offset: at.Offset})
			lost = r.Seq
			continue
		case i == 11: // in the topic, though its produce failed
			l.answer(r.Seq, sent{Err: fmt.Errorf("broker down")})
			unacked = r.Seq
		default:
			l.answer(r.Seq, sent{Acked: true, Partition: at.Partition, Offset: at.Offset})
		}
		found = append(found, landed{Partition: at.Partition, Offset: at.Offset, Seq: r.Seq})
		next[r.Partition]++
	}
	found = append(found, landed{Partition: 0, Offset: next[0], Seq: 999999})
	e := expect(w, l, found, next, 0)
	if !slices.Equal(e.BrokerLost, []int64{lost}) {
		t.Errorf("broker lost %v, want [%d]", e.BrokerLost, lost)
	}
	if e.Unacked != 1 || len(e.Unknown) != 1 || len(e.Moved) != 0 {
		t.Errorf("unacked %d (seq %d), unknown %v, moved %v; want 1, 1, none", e.Unacked, unacked, e.Unknown, e.Moved)
	}
	lostRec, _ := l.record(lost)
	poison := 0
	for _, r := range w.Records {
		if r.poison() && r.Seq != lost {
			poison++
		}
	}
	if len(e.Poison) != poison {
		t.Errorf("%d poison expected, want %d", len(e.Poison), poison)
	}
	want := maps.Clone(w.Orders)
	if !lostRec.poison() && lostRec.Kind == kindOrder {
		if len(e.Copies[lostRec.ID]) == 0 {
			delete(want, lostRec.ID) // its only copy was lost
		}
	}
	if len(e.Orders) != len(want) {
		t.Errorf("%d good events expected, want %d", len(e.Orders), len(want))
	}
}
