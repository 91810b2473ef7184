package main

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/members"
	"github.com/onceflow/onceflow/internal/orders"
)

// pos is where a record is in the source topic: in its first incarnation,
// or (Inc 1) in the topic created again by the recreate fault.
type pos struct {
	Partition int32
	Offset    int64
	Inc       int
}

func (p pos) String() string {
	if p.Inc > 0 {
		return fmt.Sprintf("%d@%d(new topic)", p.Partition, p.Offset)
	}
	return fmt.Sprintf("%d@%d", p.Partition, p.Offset)
}

// expectation is what onceflow was given, from the topic's real content
// matched to the producer's ledger: the good events and where each copy
// is, the poison and where it is, and each partition's end.
type expectation struct {
	Orders map[uuid.UUID]orders.Order // good events present in the topic
	Copies map[uuid.UUID][]pos        // where each good event's copies are
	Poison map[pos]*record            // every poison record in the topic
	At     map[pos]*record            // every record in the topic
	Ends   map[int32]int64            // end offset per partition (of the topic's last incarnation)
	// Inc is the topic's last incarnation: 1 after a recreate. Records of
	// an earlier one were all consumed before it was deleted (the
	// recreate fault waits for that), so their partitions' stored
	// offsets passed them.
	Inc int

	// What the broker did with the producer's records; none of it is
	// onceflow's doing.
	Published, Acked int
	BrokerLost       []int64 // acknowledged, yet not in the topic
	Moved            []int64 // in the topic elsewhere than acknowledged
	Unacked          int     // in the topic though their produce failed or was not answered
	Unknown          []pos   // records in the topic the ledger does not know
}

// expect matches the records found in the topic to the ledger.
func expect(w *workload, l *ledger, found []landed, ends map[int32]int64, inc int) *expectation {
	e := &expectation{Orders: map[uuid.UUID]orders.Order{}, Copies: map[uuid.UUID][]pos{},
		Poison: map[pos]*record{}, At: map[pos]*record{}, Ends: ends, Inc: inc}
	e.Published, e.Acked, _ = l.counts()
	inTopic := map[int64]pos{}
	for _, f := range found {
		at := pos{f.Partition, f.Offset, f.Inc}
		r, ok := l.record(f.Seq)
		if !ok {
			e.Unknown = append(e.Unknown, at)
			continue
		}
		inTopic[f.Seq] = at
		e.At[at] = r
		if s, ok := l.answerOf(f.Seq); !ok || !s.Acked {
			e.Unacked++
		}
		if r.poison() {
			e.Poison[at] = r
			continue
		}
		e.Orders[r.ID] = w.Orders[r.ID]
		e.Copies[r.ID] = append(e.Copies[r.ID], at)
	}
	l.each(func(r *record, s sent) {
		if !s.Acked {
			return
		}
		switch at, ok := inTopic[r.Seq]; {
		case !ok:
			e.BrokerLost = append(e.BrokerLost, r.Seq)
		case at != pos{s.Partition, s.Offset, s.Inc}:
			e.Moved = append(e.Moved, r.Seq)
		}
	})
	return e
}

// observed is what Postgres holds at the end.
type observed struct {
	Processed   map[uuid.UUID]map[string]int64 // rows per (event, handler)
	Emails      map[uuid.UUID]int64
	Counters    map[string]int64 // analytics_counters summed over shards
	Inventory   map[string]int64
	Weights     map[userItem]int64
	DeadLetters map[pos]deadLetter // of the run's group and topic
	Stored      map[int32]int64    // sink_offsets.next_offset (of the topic's last incarnation)
}

type userItem struct {
	User int64
	Item string
}

type deadLetter struct {
	Count   int
	Reason  string
	EventID uuid.NullUUID
}

// incarnation tells the rows of a recreated topic's incarnations apart:
// dead letters whose id is above DLMark are of the new topic, the others
// of the old one (every old one was in before the old topic was deleted);
// sink_offsets rows count only with the new topic's id. The zero value:
// the topic was never recreated.
type incarnation struct {
	DLMark  int64
	TopicID string // the new topic's Kafka topic id, as Postgres prints a uuid
}

// observe reads the tables of schema for group and topic.
func observe(ctx context.Context, pool *pgxpool.Pool, schema, group, topic string, inc incarnation) (*observed, error) {
	t := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	o := &observed{Processed: map[uuid.UUID]map[string]int64{}, Emails: map[uuid.UUID]int64{},
		Counters: map[string]int64{}, Inventory: map[string]int64{}, Weights: map[userItem]int64{},
		DeadLetters: map[pos]deadLetter{}, Stored: map[int32]int64{}}
	var id uuid.UUID
	var s string
	var n int64
	read := func(what, sql string, scans []any, fn func(), args ...any) error {
		rows, err := pool.Query(ctx, sql, args...)
		if err != nil {
			return fmt.Errorf("read %s: %w", what, err)
		}
		if _, err := pgx.ForEachRow(rows, scans, func() error { fn(); return nil }); err != nil {
			return fmt.Errorf("read %s: %w", what, err)
		}
		return nil
	}
	if err := read("processed_events", `SELECT event_id, handler, count(*) FROM `+t("processed_events")+` GROUP BY 1, 2`,
		[]any{&id, &s, &n}, func() {
			if o.Processed[id] == nil {
				o.Processed[id] = map[string]int64{}
			}
			o.Processed[id][s] = n
		}); err != nil {
		return nil, err
	}
	if err := read("emails_sent", `SELECT event_id, count(*) FROM `+t("emails_sent")+` GROUP BY 1`,
		[]any{&id, &n}, func() { o.Emails[id] = n }); err != nil {
		return nil, err
	}
	if err := read("analytics_counters", `SELECT name, sum(value)::bigint FROM `+t("analytics_counters")+` GROUP BY 1`,
		[]any{&s, &n}, func() { o.Counters[s] = n }); err != nil {
		return nil, err
	}
	if err := read("inventory_reserved", `SELECT item, reserved FROM `+t("inventory_reserved"),
		[]any{&s, &n}, func() { o.Inventory[s] = n }); err != nil {
		return nil, err
	}
	var user int64
	if err := read("recommender_weights", `SELECT user_id, item, weight FROM `+t("recommender_weights"),
		[]any{&user, &s, &n}, func() { o.Weights[userItem{user, s}] = n }); err != nil {
		return nil, err
	}
	var part int32
	var off int64
	var gen int
	var reason string
	var eid uuid.NullUUID
	if err := read("dead_letters", `SELECT partition, "offset", CASE WHEN $3 > 0 AND id > $3 THEN 1 ELSE 0 END, count(*), min(reason), (array_agg(event_id))[1]
FROM `+t("dead_letters")+` WHERE consumer_group = $1 AND topic = $2 GROUP BY 1, 2, 3`,
		[]any{&part, &off, &gen, &n, &reason, &eid}, func() {
			o.DeadLetters[pos{part, off, gen}] = deadLetter{Count: int(n), Reason: reason, EventID: eid}
		}, group, topic, inc.DLMark); err != nil {
		return nil, err
	}
	stored, err := members.StoredOffsets(ctx, pool, schema, group, topic, inc.TopicID)
	if err != nil {
		return nil, err
	}
	o.Stored = stored
	return o, nil
}

// eventProblem is one event whose effects are wrong.
type eventProblem struct {
	ID     uuid.UUID
	Detail string
}

// partitionProblem is a partition whose stored offset is not its end.
type partitionProblem struct {
	Partition int32
	Stored    int64 // -1: no sink_offsets row
	End       int64
}

// verdict is the comparison of what Postgres holds with what the topic
// held. Every list is complete (the printing limits itself).
type verdict struct {
	Events       int
	Lost         []eventProblem // a good event with an effect missing though its partition's stored offset passed a copy of it, or with only some of its effects
	Unreached    []eventProblem // a good event with no effect, all of whose copies are at or after their partitions' stored offsets
	Doubled      []eventProblem // a good event with an effect more than once
	Extra        []eventProblem // effects of an event that is not a good order (poison, or unknown)
	Counters     []string       // counters off their exact expected sums
	DLWant, DLOK int            // poison records in the topic; those in dead_letters exactly once
	DLMissing    []pos          // poison passed over by the stored offset, with no dead letter
	DLUnreached  []pos          // poison at or after its partition's stored offset, with no dead letter
	DLDoubled    []pos
	DLUnexpected []pos // dead letters of records that are not poison
	Stuck        []partitionProblem
	Ahead        []partitionProblem // stored offset beyond the end: impossible unless the sink lies
	Edge         []string           // the edge faults' own checks that failed (see edges.go)
}

func (v *verdict) pass() bool {
	return len(v.Lost)+len(v.Unreached)+len(v.Doubled)+len(v.Extra)+len(v.Counters)+len(v.DLMissing)+
		len(v.DLUnreached)+len(v.DLDoubled)+len(v.DLUnexpected)+len(v.Stuck)+len(v.Ahead)+len(v.Edge) == 0
}

// judge compares o with e for the given handlers (the members run them
// all on every event). It is long on purpose: one block per field of the
// verdict, each reading only e and o.
func judge(e *expectation, o *observed, handlers []string) *verdict {
	v := &verdict{Events: len(e.Orders)}
	has := func(h string) bool { return slices.Contains(handlers, h) }
	passed := func(at pos) bool {
		if at.Inc < e.Inc {
			return true // the old topic was consumed to its end before it was deleted
		}
		s, ok := o.Stored[at.Partition]
		return ok && at.Offset < s
	}
	for _, id := range sortedIDs(e.Orders) {
		var missing, twice []string
		effects := len(o.Processed[id]) > 0 || o.Emails[id] > 0
		for _, h := range handlers {
			switch n := o.Processed[id][h]; {
			case n == 0:
				missing = append(missing, "processed_events "+h)
			case n > 1:
				twice = append(twice, fmt.Sprintf("processed_events %s ×%d", h, n))
			}
		}
		if has(orders.Email) {
			switch n := o.Emails[id]; {
			case n == 0:
				missing = append(missing, "email")
			case n > 1:
				twice = append(twice, fmt.Sprintf("email ×%d", n))
			}
		}
		switch {
		case len(missing) == 0:
		case effects || slices.ContainsFunc(e.Copies[id], passed):
			v.Lost = append(v.Lost, eventProblem{id, "no " + joinList(missing)})
		default:
			v.Unreached = append(v.Unreached, eventProblem{id, "no effect yet"})
		}
		if len(twice) > 0 {
			v.Doubled = append(v.Doubled, eventProblem{id, joinList(twice)})
		}
	}
	extra := map[uuid.UUID][]string{}
	for id, hs := range o.Processed {
		if _, ok := e.Orders[id]; !ok {
			for _, h := range slices.Sorted(maps.Keys(hs)) {
				extra[id] = append(extra[id], "processed_events "+h)
			}
		}
	}
	for id, n := range o.Emails {
		if _, ok := e.Orders[id]; !ok {
			extra[id] = append(extra[id], fmt.Sprintf("email ×%d", n))
		}
	}
	for _, id := range slices.SortedFunc(maps.Keys(extra), func(a, b uuid.UUID) int { return cmp.Compare(a.String(), b.String()) }) {
		v.Extra = append(v.Extra, eventProblem{id, joinList(extra[id])})
	}

	var items int64
	wantQty := map[string]int64{}
	wantWeight := map[userItem]int64{}
	for _, od := range e.Orders {
		items += int64(len(od.Items))
		for _, it := range od.Items {
			wantQty[it]++
			wantWeight[userItem{od.UserID, it}]++
		}
	}
	if has(orders.Analytics) {
		for _, c := range []struct {
			name string
			want int64
		}{{"orders", int64(len(e.Orders))}, {"items", items}} {
			if got := o.Counters[c.name]; got != c.want {
				v.Counters = append(v.Counters, fmt.Sprintf("analytics_counters %s = %d, want %d", c.name, got, c.want))
			}
		}
	}
	if has(orders.Inventory) {
		for _, k := range unionKeys(o.Inventory, wantQty, cmp.Compare[string]) {
			if got, want := o.Inventory[k], wantQty[k]; got != want {
				v.Counters = append(v.Counters, fmt.Sprintf("inventory_reserved %s = %d, want %d", shorten(k), got, want))
			}
		}
	}
	if has(orders.Recommender) {
		byUserItem := func(a, b userItem) int { return cmp.Or(cmp.Compare(a.User, b.User), cmp.Compare(a.Item, b.Item)) }
		for _, k := range unionKeys(o.Weights, wantWeight, byUserItem) {
			if got, want := o.Weights[k], wantWeight[k]; got != want {
				v.Counters = append(v.Counters, fmt.Sprintf("recommender_weights (%d, %s) = %d, want %d", k.User, shorten(k.Item), got, want))
			}
		}
	}

	v.DLWant = len(e.Poison)
	for _, at := range sortedPos(e.Poison) {
		switch n := o.DeadLetters[at].Count; {
		case n == 1:
			v.DLOK++
		case n == 0 && passed(at):
			v.DLMissing = append(v.DLMissing, at)
		case n == 0:
			v.DLUnreached = append(v.DLUnreached, at)
		default:
			v.DLDoubled = append(v.DLDoubled, at)
		}
	}
	for _, at := range sortedPos(o.DeadLetters) {
		if _, ok := e.Poison[at]; !ok {
			v.DLUnexpected = append(v.DLUnexpected, at)
		}
	}

	for _, p := range slices.Sorted(maps.Keys(e.Ends)) {
		end := e.Ends[p]
		stored, ok := o.Stored[p]
		if !ok && end == 0 {
			continue // an empty partition no member wrote an offset for
		}
		if !ok {
			stored = -1
		}
		switch {
		case stored < end:
			v.Stuck = append(v.Stuck, partitionProblem{p, stored, end})
		case stored > end:
			v.Ahead = append(v.Ahead, partitionProblem{p, stored, end})
		}
	}
	return v
}

func sortedIDs[V any](m map[uuid.UUID]V) []uuid.UUID {
	return slices.SortedFunc(maps.Keys(m), func(a, b uuid.UUID) int { return cmp.Compare(a.String(), b.String()) })
}

func sortedPos[V any](m map[pos]V) []pos {
	return slices.SortedFunc(maps.Keys(m), func(a, b pos) int {
		return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
	})
}

func unionKeys[K comparable](a, b map[K]int64, order func(x, y K) int) []K {
	keys := map[K]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	return slices.SortedFunc(maps.Keys(keys), order)
}

func joinList(xs []string) string { return strings.Join(xs, ", ") }

// shorten keeps long items (the 10000-character poison) readable.
func shorten(s string) string {
	if len(s) > 40 {
		return s[:20] + "…(" + strconv.Itoa(len(s)) + " chars)"
	}
	return s
}
