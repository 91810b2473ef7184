package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// headerSeq is the header carrying a record's seq, so that the topic's
// content can be matched to what was sent.
const headerSeq = "chaos_seq"

// producerMaxBytes is the largest batch the chaos producer sends: enough
// for the largest poison record. The source topic's max.message.bytes is
// topicMaxBytes, above it.
const (
	producerMaxBytes = 3 << 20
	topicMaxBytes    = 4 << 20
)

// sent is the ledger's line for one record: what the broker said.
type sent struct {
	Acked     bool
	Partition int32
	Offset    int64
	Inc       int // the topic's incarnation the record went to: 0, 1 after a recreate
	Err       error
}

// ledger is the producer's record of what it sent: every record
// published (resends included) and the broker's answer to each. It is the
// truth the verdict starts from, checked against the topic's content. Safe
// for concurrent use.
type ledger struct {
	mu      sync.Mutex
	records map[int64]*record // by seq
	answers map[int64]sent
	nextSeq int64
}

func newLedger(w *workload) *ledger {
	l := &ledger{records: make(map[int64]*record, len(w.Records)), answers: map[int64]sent{}}
	for _, recs := range [][]record{w.Records, w.Burst} {
		for i := range recs {
			r := &recs[i]
			l.records[r.Seq] = r
			l.nextSeq = max(l.nextSeq, r.Seq+1)
		}
	}
	return l
}

// add records r, a new publication built during the run, under a new seq.
func (l *ledger) add(r record) *record {
	l.mu.Lock()
	defer l.mu.Unlock()
	r.Seq = l.nextSeq
	l.nextSeq++
	l.records[r.Seq] = &r
	return &r
}

func (l *ledger) answer(seq int64, s sent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.answers[seq] = s
}

// resend records a new publication of r's content and returns it.
func (l *ledger) resend(r *record) *record {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := *r
	c.Seq, c.ResendOf = l.nextSeq, r.Seq
	for o := r; o.ResendOf != 0; o = l.records[o.ResendOf] {
		c.ResendOf = o.ResendOf
	}
	l.nextSeq++
	l.records[c.Seq] = &c
	return &c
}

func (l *ledger) record(seq int64) (*record, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.records[seq]
	return r, ok
}

func (l *ledger) answerOf(seq int64) (sent, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.answers[seq]
	return s, ok
}

// each calls fn for every record published, in seq order, with the
// broker's answer (the zero sent if none came).
func (l *ledger) each(fn func(r *record, s sent)) {
	l.mu.Lock()
	seqs := slices.Sorted(maps.Keys(l.answers))
	recs := make([]*record, len(seqs))
	answers := make([]sent, len(seqs))
	for i, seq := range seqs {
		recs[i], answers[i] = l.records[seq], l.answers[seq]
	}
	l.mu.Unlock()
	for i := range recs {
		fn(recs[i], answers[i])
	}
}

// counts returns how many records were published, acknowledged and failed.
func (l *ledger) counts() (published, acked, failed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.answers {
		published++
		if s.Acked {
			acked++
		} else {
			failed++
		}
	}
	return published, acked, failed
}

// newProducerClient is the chaos producer: acks from all in-sync replicas,
// idempotent (franz-go's defaults, stated here because the verdict relies
// on them), records sent to the partition the workload chose, batches big
// enough for the largest poison.
func newProducerClient(brokers []string) (*kgo.Client, error) {
	return kgo.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.ClientID("onceflow-chaos-producer"),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerBatchMaxBytes(producerMaxBytes),
		kgo.MaxBufferedBytes(64<<20),
		kgo.ProducerLinger(5*time.Millisecond),
		kgo.MetadataMinAge(250*time.Millisecond),
	)
}

// producer is the chaos producer's client with a gate: the recreate
// fault closes it while the topic is deleted and created again, and
// gives the producer a new client for the new topic. Safe for concurrent
// use.
type producer struct {
	brokers []string
	gate    sync.RWMutex // held for writing while the producer is paused
	cl      *kgo.Client  // guarded by gate
	inc     int          // guarded by gate: the topic's incarnation
	// guarded by gate: the new topic's partitions, and the old one's:
	// records sent after a recreate that added partitions are spread
	// over them all.
	parts, origParts int32
}

func newProducer(brokers []string, partitions int) (*producer, error) {
	cl, err := newProducerClient(brokers)
	if err != nil {
		return nil, err
	}
	return &producer{brokers: brokers, cl: cl, parts: int32(partitions), origParts: int32(partitions)}, nil
}

// pause closes the gate and waits until every record sent has its answer;
// the caller calls resume, whatever pause returns.
func (p *producer) pause(ctx context.Context) error {
	p.gate.Lock()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return p.cl.Flush(ctx)
}

func (p *producer) resume() { p.gate.Unlock() }

// renew, called between pause and resume, replaces the client with a new
// one for the topic's next incarnation of partitions partitions.
func (p *producer) renew(partitions int) error {
	if err := p.grow(partitions); err != nil {
		return err
	}
	p.inc++
	return nil
}

// grow, called between pause and resume, replaces the client with a new
// one that knows the topic's partitions, now partitions (added to the
// same topic: the same incarnation).
func (p *producer) grow(partitions int) error {
	cl, err := newProducerClient(p.brokers)
	if err != nil {
		return err
	}
	p.cl.Close()
	p.cl, p.parts = cl, int32(partitions)
	return nil
}

func (p *producer) close() {
	p.gate.Lock()
	defer p.gate.Unlock()
	p.cl.Close()
}

// publish sends recs in order, paced so that the last is sent at about the
// end of window (0: at once), and resends the content of every record
// whose produce failed (at most 10 rounds). It returns when every record
// has an answer, or ctx ends. The ledger holds the answers. While the
// producer is paused, publish waits.
func publish(ctx context.Context, p *producer, topic string, recs []record, l *ledger, window time.Duration) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed []*record
	send := func(r *record) {
		p.gate.RLock()
		defer p.gate.RUnlock()
		part, inc := r.Partition, p.inc
		if p.parts > p.origParts && r.Seq%int64(p.parts) >= int64(p.origParts) {
			part = int32(r.Seq % int64(p.parts))
		}
		kr := toKgo(topic, part, r)
		wg.Add(1)
		p.cl.Produce(ctx, kr, func(kr *kgo.Record, err error) {
			defer wg.Done()
			if err != nil {
				l.answer(r.Seq, sent{Err: err, Inc: inc})
				mu.Lock()
				failed = append(failed, r)
				mu.Unlock()
				return
			}
			l.answer(r.Seq, sent{Acked: true, Partition: kr.Partition, Offset: kr.Offset, Inc: inc})
		})
	}
	start := time.Now()
	per := window / time.Duration(max(1, len(recs)))
	for i := range recs {
		if d := time.Until(start.Add(time.Duration(i) * per)); d > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(d):
			}
		}
		send(&recs[i])
	}
	for round := 0; ; round++ {
		wg.Wait()
		mu.Lock()
		again := failed
		failed = nil
		mu.Unlock()
		if len(again) == 0 {
			return nil
		}
		if round == 10 || ctx.Err() != nil {
			return errors.Join(ctx.Err(), fmt.Errorf("%d records still failing after %d rounds of resends", len(again), round))
		}
		time.Sleep(time.Second)
		for _, r := range again {
			send(l.resend(r))
		}
	}
}

// publishPaused sends recs, with the producer paused by the caller, and
// waits for their answers. The producer is idempotent, so the records of
// one partition land in order: on a new partition at offsets 0, 1, 2…. No
// resends: the verdict judges the records where they landed.
func publishPaused(ctx context.Context, p *producer, topic string, recs []*record, l *ledger) error {
	krs := make([]*kgo.Record, len(recs))
	seqOf := make(map[*kgo.Record]int64, len(recs)) // the results come in the order of their answers
	for i, r := range recs {
		krs[i] = toKgo(topic, r.Partition, r)
		seqOf[krs[i]] = r.Seq
	}
	var errs []error
	for _, res := range p.cl.ProduceSync(ctx, krs...) {
		seq := seqOf[res.Record]
		if res.Err != nil {
			l.answer(seq, sent{Err: res.Err, Inc: p.inc})
			errs = append(errs, fmt.Errorf("seq %d: %w", seq, res.Err))
			continue
		}
		l.answer(seq, sent{Acked: true, Partition: res.Record.Partition, Offset: res.Record.Offset, Inc: p.inc})
	}
	return errors.Join(errs...)
}

// toKgo is the Kafka record of r: its value, its seq and event_id headers.
func toKgo(topic string, partition int32, r *record) *kgo.Record {
	kr := &kgo.Record{Topic: topic, Partition: partition, Value: r.Value,
		Headers: []kgo.RecordHeader{{Key: headerSeq, Value: []byte(strconv.FormatInt(r.Seq, 10))}}}
	if r.IDHeader != nil {
		kr.Key = r.IDHeader
		kr.Headers = append(kr.Headers, kgo.RecordHeader{Key: "event_id", Value: r.IDHeader})
	}
	return kr
}

// landed is one record found in the topic.
type landed struct {
	Partition int32
	Offset    int64
	Inc       int   // the topic's incarnation: 0, 1 after a recreate
	Seq       int64 // 0: the record has no chaos_seq header
}

// readTopic reads every record of topic's partitions up to their end
// offsets, and returns them, marked with the topic's incarnation inc, with
// the end offsets.
func readTopic(ctx context.Context, brokers []string, topic string, partitions, inc int) ([]landed, map[int32]int64, error) {
	ends, err := endOffsets(ctx, brokers, topic)
	if err != nil {
		return nil, nil, err
	}
	start := map[string]map[int32]kgo.Offset{topic: {}}
	need := 0
	for p := range int32(partitions) {
		if ends[p] > 0 {
			start[topic][p] = kgo.NewOffset().AtStart()
			need++
		}
	}
	if need == 0 {
		return nil, ends, nil
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumePartitions(start),
		kgo.FetchMaxBytes(64<<20), kgo.FetchMaxPartitionBytes(8<<20))
	if err != nil {
		return nil, nil, fmt.Errorf("read back %s: %w", topic, err)
	}
	defer cl.Close()
	var out []landed
	done := map[int32]bool{}
	for len(done) < need {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, nil, fmt.Errorf("read back %s: %d of %d partitions read: %w", topic, len(done), need, err)
		}
		var ferr error
		fs.EachError(func(_ string, p int32, err error) { ferr = errors.Join(ferr, fmt.Errorf("partition %d: %w", p, err)) })
		if ferr != nil {
			return nil, nil, fmt.Errorf("read back %s: %w", topic, ferr)
		}
		fs.EachRecord(func(r *kgo.Record) {
			l := landed{Partition: r.Partition, Offset: r.Offset, Inc: inc}
			for _, h := range r.Headers {
				if h.Key == headerSeq {
					l.Seq, _ = strconv.ParseInt(string(h.Value), 10, 64)
				}
			}
			out = append(out, l)
			if r.Offset+1 >= ends[r.Partition] {
				done[r.Partition] = true
			}
		})
	}
	return out, ends, nil
}
