package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"time"

	"github.com/google/uuid"
)

// Payloads makes the value of each event: a sample's lines in turn
// ([ParseSample]) or a [Template]'s document with its placeholders
// replaced. Payloads are immutable and safe for concurrent use.
type Payloads struct {
	lines   [][]byte
	lineNos []int // each line's number in the sample, from 1
	tmpl    *Template
	desc    string // for the report
}

// String describes the payloads: a sample of N lines, or a template,
// with the file LoadPayloads read.
func (p *Payloads) String() string { return p.desc }

// SampleLineMax is the largest sample line, in bytes: an event's record
// (the line, its id header and key) must fit in the Kafka producer's
// batch (1 MB by default) and under a broker's default message.max.bytes
// (1 MiB).
const SampleLineMax = 900000

// utf8BOM is the byte order mark some editors put at a file's start.
var utf8BOM = []byte("\xEF\xBB\xBF")

// ParseSample reads a sample of JSON lines: each non-blank line one JSON
// value, used in turn (cycled) for the events' payloads. A UTF-8 byte
// order mark at its start is skipped. A line that is not JSON, or longer
// than SampleLineMax, is an error naming it; a sample without a line is
// an error.
func ParseSample(src []byte) (*Payloads, error) {
	p := &Payloads{}
	sc := bufio.NewScanner(bytes.NewReader(bytes.TrimPrefix(src, utf8BOM)))
	sc.Buffer(nil, max(len(src)+1, 64*1024)) // the whole file at most: a line's length is checked below
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		if len(line) > SampleLineMax {
			return nil, fmt.Errorf("sample line %d is %d bytes: at most %d bytes, so that its record fits in a Kafka producer's batch (1 MB)", n, len(line), SampleLineMax)
		}
		if err := json.Unmarshal(line, new(any)); err != nil {
			return nil, fmt.Errorf("sample line %d is not JSON: %w", n, err)
		}
		p.lines = append(p.lines, bytes.Clone(line))
		p.lineNos = append(p.lineNos, n)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read sample: %w", err)
	}
	if len(p.lines) == 0 {
		return nil, errors.New("the sample has no JSON line")
	}
	p.desc = fmt.Sprintf("a sample of %d lines", len(p.lines))
	return p, nil
}

// origin says where event i's payload (the i-th of a generated stream,
// from 0) comes from: its sample line, or the template's event number.
func (p *Payloads) origin(i int) string {
	if len(p.lines) == 0 {
		return fmt.Sprintf("the template's event %d", i+1)
	}
	return fmt.Sprintf("sample line %d", p.lineNos[i%len(p.lines)])
}

// FromTemplate returns the payloads of t.
func FromTemplate(t *Template) *Payloads { return &Payloads{tmpl: t, desc: "a template"} }

// LoadPayloads reads the payloads from a file: a template with template
// true, else a sample of JSON lines. Errors name the file.
func LoadPayloads(path string, template bool) (*Payloads, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if template {
		t, err := ParseTemplate(bytes.TrimPrefix(b, utf8BOM))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		p := FromTemplate(t)
		p.desc = "the template " + path
		return p, nil
	}
	p, err := ParseSample(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	p.desc = fmt.Sprintf("the sample %s (%d lines)", path, len(p.lines))
	return p, nil
}

// Event is one unique event of a generated stream.
type Event struct {
	ID        uuid.UUID
	Value     []byte
	Timestamp time.Time // the records' timestamp, the same for every delivery
	Partition int32     // of its first delivery
}

// Record is one delivery of an event: its first, or a redelivery.
type Record struct {
	Event      int // index in Stream.Events
	Partition  int32
	Redelivery bool
}

// Stream is a generated stream: the unique events and their deliveries in
// production order. It is read-only once generated.
type Stream struct {
	Events  []Event
	Records []Record
}

// DefaultOtherPartition is the share of redeliveries a stream sends to
// another partition than their event's first delivery, unless told.
// Those are the costly ones: a batch of the other partition may claim the
// event while the first delivery's transaction has not committed, and then
// waits for it (benchmarks/PROFILE.md).
const DefaultOtherPartition = 1.0 / 3

// otherPartition is share, or DefaultOtherPartition when nil.
func otherPartition(share *float64) float64 {
	if share == nil {
		return DefaultOtherPartition
	}
	return *share
}

// Redeliveries counts the records that are redeliveries.
func (s *Stream) Redeliveries() int { return len(s.Records) - len(s.Events) }

// GenerateConfig says what stream Generate makes.
type GenerateConfig struct {
	Events     int     // unique events, at least 1
	Duplicates float64 // redeliveries per event, 0 to 1: 0.3 adds 3 records per 10 events
	Partitions int     // partitions of the topic, at least 1
	// OtherPartition is the share of redeliveries sent to another
	// partition than the first delivery (a producer that changed its
	// partitioner, a re-keyed retry), 0 to 1; nil: DefaultOtherPartition.
	// With one partition there is no other.
	OtherPartition *float64
	Seed           uint64    // the same Seed, payloads and Now give the same stream
	Now            time.Time // the last event's timestamp; default time.Now()
}

// Generate makes a stream: cfg.Events unique events with ids (version 4,
// from the seed), payloads from p, timestamps a millisecond apart ending
// at cfg.Now, each on a partition of its own id; then round(Events ×
// Duplicates) redeliveries of random events, each placed after its
// event's first delivery (within the next few thousand records), with
// the same id, payload and timestamp, a share on another partition.
func Generate(p *Payloads, cfg GenerateConfig) (*Stream, error) {
	var ps []error
	if cfg.Events < 1 {
		ps = append(ps, fmt.Errorf("events %d: at least 1", cfg.Events))
	}
	if !(cfg.Duplicates >= 0 && cfg.Duplicates <= 1) { // NaN too
		ps = append(ps, fmt.Errorf("duplicates %g: a share from 0 to 1", cfg.Duplicates))
	}
	if cfg.Partitions < 1 {
		ps = append(ps, fmt.Errorf("partitions %d: at least 1", cfg.Partitions))
	}
	if n := float64(cfg.Events) * (1 + cfg.Duplicates); n > MaxRecords {
		ps = append(ps, fmt.Errorf("events %d with duplicates %g: %.0f records, at most %d (MaxRecords)", cfg.Events, cfg.Duplicates, n, MaxRecords))
	}
	other := otherPartition(cfg.OtherPartition)
	if !(other >= 0 && other <= 1) {
		ps = append(ps, fmt.Errorf("other partition %g: a share from 0 to 1", other))
	}
	if err := errors.Join(ps...); err != nil {
		return nil, err
	}
	if cfg.Now.IsZero() {
		cfg.Now = time.Now()
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6f6e6365666c6f77))
	s := &Stream{Events: make([]Event, cfg.Events)}
	start := cfg.Now.Add(-time.Duration(cfg.Events) * time.Millisecond).Truncate(time.Millisecond)
	var buf []byte
	for i := range s.Events {
		var id uuid.UUID
		for h := range 2 {
			v := rng.Uint64()
			for j := range 8 {
				id[h*8+j] = byte(v >> (8 * j))
			}
		}
		id[6] = id[6]&0x0f | 0x40
		id[8] = id[8]&0x3f | 0x80
		ts := start.Add(time.Duration(i) * time.Millisecond)
		if p.tmpl != nil {
			buf = p.tmpl.render(buf[:0], rng, id, int64(i+1), ts)
			s.Events[i] = Event{ID: id, Value: bytes.Clone(buf), Timestamp: ts}
		} else {
			s.Events[i] = Event{ID: id, Value: p.lines[i%len(p.lines)], Timestamp: ts}
		}
		s.Events[i].Partition = int32(uint32(id[0])<<8|uint32(id[1])) % int32(cfg.Partitions)
	}
	// Redeliveries, each placed after its event's first delivery.
	type dup struct {
		after int // the first delivery's index
		rec   Record
	}
	n := int(float64(cfg.Events)*cfg.Duplicates + 0.5)
	dups := make([]dup, n)
	for k := range dups {
		e := rng.IntN(cfg.Events)
		part := s.Events[e].Partition
		if cfg.Partitions > 1 && rng.Float64() < other {
			part = (part + 1 + int32(rng.IntN(cfg.Partitions-1))) % int32(cfg.Partitions)
		}
		dups[k] = dup{after: min(e+1+rng.IntN(4096), cfg.Events), rec: Record{Event: e, Partition: part, Redelivery: true}}
	}
	slices.SortStableFunc(dups, func(a, b dup) int { return a.after - b.after })
	s.Records = make([]Record, 0, cfg.Events+n)
	d := 0
	for i := range s.Events {
		for d < len(dups) && dups[d].after == i {
			s.Records = append(s.Records, dups[d].rec)
			d++
		}
		s.Records = append(s.Records, Record{Event: i, Partition: s.Events[i].Partition})
	}
	for ; d < len(dups); d++ {
		s.Records = append(s.Records, dups[d].rec)
	}
	return s, nil
}
