package main

import (
	"bytes"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/internal/orders"
)

// Record kinds. Orders and redeliveries are good events; every other kind
// is poison and must end in dead_letters exactly once per copy in the topic.
const (
	kindOrder      = "order"      // an event's first publication
	kindRedelivery = "redelivery" // the same id and payload again, maybe on another partition
)

// poisonKind is one way a record can be bad. Each must become a dead letter.
type poisonKind struct {
	Name  string
	Count int    // copies in a run at -poison-scale 1
	Why   string // what onceflow should say about it
}

// poisonKinds lists every kind of poison the producer injects.
var poisonKinds = []poisonKind{
	{"no-id", 4, "no event_id header"},
	{"bad-id", 4, "event_id header is not a UUID"},
	{"bad-json", 4, "value is not valid JSON"},
	{"nul", 3, "value contains a NUL byte"},
	{"nul-escape", 3, `value contains \u0000, which Postgres cannot store`},
	{"empty", 2, "value is empty"},
	{"over-decoder", 2, "value over decode.max_record_bytes (and over the dead-letter topic's limit)"},
	{"over-dlq", 2, "no event_id header, value under decode.max_record_bytes but over the producer's 1000012-byte limit for the dead-letter topic"},
	{"rejected", 5, `the handlers reject it (user_id "one", user_id 0, no items)`},
	{"data-error", 3, "an item of 10000 characters: inventory_reserved's primary-key index refuses it (SQLSTATE 54000)"},
}

// franzMaxRecord is franz-go's default ProducerBatchMaxBytes, the largest
// record a member can produce to the dead-letter topic without tuning.
const franzMaxRecord = 1000012

// record is one record the producer publishes.
type record struct {
	Seq       int64     // unique per publication; the chaos_seq header
	Kind      string    // kindOrder, kindRedelivery or a poison kind's name
	ID        uuid.UUID // the event id, when the record carries a valid one
	IDHeader  []byte    // the event_id header; nil: none
	Value     []byte
	Partition int32
	ResendOf  int64 // the seq this one repeats after a failed produce; 0 if none
}

// hasID reports whether onceflow can read an event id from r.
func (r *record) hasID() bool { return r.ID != uuid.Nil }

// poison reports whether r must become a dead letter.
func (r *record) poison() bool { return r.Kind != kindOrder && r.Kind != kindRedelivery }

// workload is what one seed publishes: the seed's orders with
// redeliveries, and poison at random places among them.
type workload struct {
	Records []record
	Orders  map[uuid.UUID]orders.Order // every good event
	// Burst is published by the pg-latency fault, all on one partition in
	// a row: records a handler refuses with a data error, so that a batch
	// of them is isolated under savepoints.
	Burst []record
}

// kindBurst is the poison kind of the pg-latency fault's burst: an item of
// burstItem random characters, over the 2704 bytes a btree index entry may
// hold, so that inventory_reserved's primary key refuses it (SQLSTATE
// 54000) as the data-error kind's 10000 do, in a record small enough for
// a fetch to bring many.
const (
	kindBurst = "burst"
	burstItem = 3000
)

type workloadConfig struct {
	Events         int     // unique good events
	Duplicates     float64 // redeliveries per event
	OtherPartition float64 // share of redeliveries published to another partition than the first copy
	Partitions     int
	Poison         []string // poison kinds to inject (names)
	PoisonScale    int      // copies of each kind = Count * PoisonScale
	MaxRecordBytes int      // the members' decode.max_record_bytes
}

// newWorkload builds seed's workload. The same seed and config give the
// same records, ids and values included.
func newWorkload(seed uint64, c workloadConfig) (*workload, error) {
	s, err := orders.Generate(c.Events, c.Duplicates, seed)
	if err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(seed, 0x706f69736f6e)) // "poison"
	w := &workload{Orders: s.Unique}
	home := func(id uuid.UUID) int32 {
		h := fnv.New32a()
		h.Write(id[:])
		return int32(h.Sum32() % uint32(c.Partitions))
	}
	seen := make(map[uuid.UUID]bool, len(s.Unique))
	for _, m := range s.Messages {
		r := record{Kind: kindOrder, ID: m.ID, IDHeader: []byte(m.ID.String()), Value: m.Value, Partition: home(m.ID)}
		if seen[m.ID] {
			r.Kind = kindRedelivery
			if c.Partitions > 1 && rng.Float64() < c.OtherPartition {
				r.Partition = (r.Partition + 1 + rng.Int32N(int32(c.Partitions-1))) % int32(c.Partitions)
			}
		}
		seen[m.ID] = true
		w.Records = append(w.Records, r)
	}
	var bad []record
	for _, k := range poisonKinds {
		if !slices.Contains(c.Poison, k.Name) {
			continue
		}
		for i := range k.Count * c.PoisonScale {
			r, err := newPoison(rng, k.Name, i, c.MaxRecordBytes)
			if err != nil {
				return nil, err
			}
			r.Partition = rng.Int32N(int32(c.Partitions))
			bad = append(bad, r)
		}
	}
	// Spread the poison over the stream (never first, so that a member is
	// busy with good records when it meets one).
	for _, r := range bad {
		at := 1 + rng.IntN(len(w.Records))
		w.Records = slices.Insert(w.Records, at, r)
	}
	for i := range w.Records {
		w.Records[i].Seq = int64(i + 1)
	}
	brng := rand.New(rand.NewPCG(seed, 0x6275727374)) // "burst": apart, so that the records above stay those of the seed
	for i := range latencyBurst {
		r, err := newPoison(brng, kindBurst, i, c.MaxRecordBytes)
		if err != nil {
			return nil, err
		}
		r.Seq = int64(len(w.Records) + 1 + i)
		w.Burst = append(w.Burst, r)
	}
	return w, nil
}

// newPoison builds the i-th record of a poison kind.
func newPoison(rng *rand.Rand, kind string, i, maxRecordBytes int) (record, error) {
	var id uuid.UUID
	for j := range id {
		id[j] = byte(rng.Uint32())
	}
	id[6] = id[6]&0x0f | 0x40
	id[8] = id[8]&0x3f | 0x80
	r := record{Kind: kind, ID: id, IDHeader: []byte(id.String())}
	user := 1 + rng.IntN(1000)
	order := fmt.Sprintf(`{"user_id":%d,"items":["SKU-%02d"]}`, user, rng.IntN(50))
	switch kind {
	case "no-id":
		r.ID, r.IDHeader, r.Value = uuid.Nil, nil, []byte(order)
	case "bad-id":
		r.ID, r.Value = uuid.Nil, []byte(order)
		r.IDHeader = []byte([]string{"order-17", "not-a-uuid", id.String()[:35], "{" + id.String() + "}"}[i%4])
	case "bad-json":
		r.Value = []byte([]string{order[:len(order)-1], "user_id=1;items=A", `{"user_id":1,"items":["A",]}`, "\xff\xfe{}"}[i%4])
	case "nul":
		r.Value = []byte(fmt.Sprintf("{\"user_id\":%d,\"items\":[\"SKU\x00%02d\"]}", user, i))
	case "nul-escape":
		r.Value = []byte(fmt.Sprintf(`{"user_id":%d,"items":["SKU\u0000%02d"]}`, user, i))
	case "empty":
		r.Value = []byte{}
	case "over-decoder":
		r.Value = padded(order, maxRecordBytes+1+rng.IntN(64<<10))
	case "over-dlq":
		// Under the decoder's limit and under the dead-letter topic's
		// max.message.bytes (1048588 by default), over what a member's
		// producer takes by default. It is poison for its missing id.
		size := franzMaxRecord + 30000 + rng.IntN(8000)
		if size >= maxRecordBytes {
			return record{}, fmt.Errorf("poison over-dlq: decode.max_record_bytes %d leaves no room above the producer's %d-byte limit", maxRecordBytes, franzMaxRecord)
		}
		r.ID, r.IDHeader, r.Value = uuid.Nil, nil, padded(order, size)
	case "rejected":
		r.Value = []byte([]string{`{"user_id":"one","items":["SKU-01"]}`, `{"user_id":0,"items":["SKU-02"]}`,
			fmt.Sprintf(`{"user_id":%d,"items":[]}`, user), fmt.Sprintf(`{"user_id":%d,"items":["SKU-03",""]}`, user)}[i%4])
	case "data-error", kindBurst:
		// Random letters, so that Postgres cannot compress the index entry
		// below its limit.
		item := make([]byte, 10000)
		if kind == kindBurst {
			item = item[:burstItem]
		}
		for j := range item {
			item[j] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"[rng.IntN(62)]
		}
		r.Value = []byte(fmt.Sprintf(`{"user_id":%d,"items":["%s"]}`, user, item))
	default:
		return record{}, fmt.Errorf("unknown poison kind %q", kind)
	}
	return r, nil
}

// padded returns order with a "pad" field added so that the value is size
// bytes of valid JSON.
func padded(order string, size int) []byte {
	head := strings.TrimSuffix(order, "}") + `,"pad":"`
	n := max(0, size-len(head)-2)
	var b bytes.Buffer
	b.Grow(size)
	b.WriteString(head)
	b.Write(bytes.Repeat([]byte{'x'}, n))
	b.WriteString(`"}`)
	return b.Bytes()
}

// parsePoison reads -poison: "all", "none" or comma-separated kinds.
func parsePoison(s string) ([]string, error) {
	var names []string
	for _, k := range poisonKinds {
		names = append(names, k.Name)
	}
	switch strings.TrimSpace(s) {
	case "all":
		return names, nil
	case "", "none":
		return nil, nil
	}
	var out []string
	for _, n := range strings.Split(s, ",") {
		n = strings.TrimSpace(n)
		if !slices.Contains(names, n) {
			return nil, fmt.Errorf("unknown poison kind %q (known: %s, all, none)", n, strings.Join(names, ", "))
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out, nil
}
