package processor_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/processor"
)

// A partition's next owner commits to Kafka the offset stored in Postgres
// when Kafka's committed offset is behind it (a commit refused with
// UNKNOWN_MEMBER_ID, lost in a crash, or never made), without waiting for
// a new record: on an idle partition, lag tools reading the group's
// committed offsets otherwise report lag on a caught-up group for as
// long as the partition stays idle, through restarts. The commit goes
// through the member's marks, so a batch's later mark is never undone.
func TestKafkaOffsetCatchesUpOnIdlePartition(t *testing.T) {
	cases := []struct {
		name     string
		protocol processor.GroupProtocol
		// lose makes Kafka's committed offset lag behind the stored end:
		// "older" commits an older offset with an admin client while no
		// member runs; "abort" aborts the member before any commit.
		// "ahead" commits an offset past the stored one instead, which the
		// next owner leaves alone: a catch-up never moves Kafka back.
		lose string
		// stopAtOnce stops the next owner as soon as it has the partition,
		// before any background commit: its shutdown commits the offset.
		stopAtOnce bool
		// more records are produced once the next owner has the partition:
		// its first batch's commit must not be undone by the catch-up.
		more int
	}{
		{name: "older commit, classic", protocol: processor.ClassicProtocol, lose: "older"},
		{name: "older commit, consumer", protocol: processor.ConsumerProtocol, lose: "older"},
		{name: "aborted before commit, classic", protocol: processor.ClassicProtocol, lose: "abort"},
		{name: "aborted before commit, consumer", protocol: processor.ConsumerProtocol, lose: "abort"},
		{name: "stopped at once", protocol: processor.ClassicProtocol, lose: "older", stopAtOnce: true},
		{name: "records after the catch-up", protocol: processor.ConsumerProtocol, lose: "older", more: 10},
		{name: "kafka ahead", protocol: processor.ClassicProtocol, lose: "ahead", stopAtOnce: true},
	}
	eachPlainBroker(t, func(t *testing.T, b broker) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				e := newEnv(t, b, 1)
				stream, err := orders.Generate(30, 0, 11)
				if err != nil {
					t.Fatal(err)
				}
				e.produceMessages(stream.Messages)
				end := e.logEnds()[0]

				cfg := e.config("first")
				cfg.GroupProtocol = tc.protocol
				if tc.lose == "abort" {
					cfg.CommitInterval = time.Hour // no background commit before the abort
				}
				first := e.start(cfg, e.writer(1000))
				e.waitStored(map[int32]int64{0: end}, 60*time.Second)
				switch tc.lose {
				case "abort":
					first.c.Abort()
					first.stop(t)
				case "older", "ahead":
					first.stop(t)
					at := end / 3
					if tc.lose == "ahead" {
						at = end + 5
					}
					set := kadm.Offsets{}
					set.AddOffset(e.topic, 0, at, -1)
					if err := kadm.NewClient(e.client()).CommitAllOffsets(t.Context(), e.group, set); err != nil {
						t.Fatalf("commit offset %d with an admin client: %v", at, err)
					}
				}
				before := e.kafkaCommitted()
				if before >= end && tc.lose != "ahead" {
					t.Fatalf("Kafka committed %d before the next owner starts, want less than the stored %d", before, end)
				}

				cfg = e.config("next")
				cfg.GroupProtocol = tc.protocol
				if tc.stopAtOnce {
					cfg.CommitInterval = time.Hour
				}
				next := e.start(cfg, e.writer(1000))
				want := end
				switch {
				case tc.stopAtOnce:
					waitAssigned(t, next)
					next.stop(t)
				case tc.more > 0:
					waitAssigned(t, next)
					more, err := orders.Generate(tc.more, 0, 12)
					if err != nil {
						t.Fatal(err)
					}
					e.produceMessages(more.Messages)
					want = e.logEnds()[0]
					e.waitStored(map[int32]int64{0: want}, 60*time.Second)
				}
				if tc.lose == "ahead" {
					// The owner's shutdown committed whatever it had marked.
					if got := e.kafkaCommitted(); got != before {
						t.Errorf("Kafka committed %d after the next owner stopped, want %d still: moved back to the stored %d", got, before, end)
					}
				} else {
					e.waitKafkaCommitted(want, before)
				}
				if !tc.stopAtOnce {
					next.stop(t)
					if got := e.kafkaCommitted(); got != want {
						t.Errorf("Kafka committed %d after the next owner stopped, want %d", got, want)
					}
				}
				if got := e.storedOffsets()[0]; got != want {
					t.Errorf("stored offset %d, want %d", got, want)
				}
			})
		}
	})
}

// waitAssigned waits until m has a worker for a partition.
func waitAssigned(t *testing.T, m *member) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); m.c.Stats().Workers == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no partition assigned within 60s")
		}
	}
}

// kafkaCommitted is the group's committed offset in Kafka for partition 0
// (-1: none).
func (e *env) kafkaCommitted() int64 {
	e.t.Helper()
	return e.kafkaCommittedBy(kadm.NewClient(e.client()))
}

func (e *env) kafkaCommittedBy(adm *kadm.Client) int64 {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), 10*time.Second)
	defer cancel()
	committed, err := adm.FetchOffsets(ctx, e.group)
	if err != nil {
		e.t.Fatalf("fetch committed offsets: %v", err)
	}
	if o, ok := committed.Lookup(e.topic, 0); ok && o.Err == nil {
		return o.At
	}
	return -1
}

// waitKafkaCommitted waits until the group's committed offset in Kafka for
// partition 0 is want, failing after 30s; before is what it was when the
// member started, for the message.
func (e *env) waitKafkaCommitted(want, before int64) {
	e.t.Helper()
	adm := kadm.NewClient(e.client())
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := e.kafkaCommittedBy(adm)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("Kafka committed %d within 30s of the next owner's start (%d before it), want the stored offset %d", got, before, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
