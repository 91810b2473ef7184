package processor_test

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// A member aborted (a crash, as the demo's) once a batch's COMMIT went
// out counts that batch in its Stats: the batch is committed in Postgres,
// its next owner starts after it and reads none of it again, so a batch
// this member did not count is counted by no one (the demo's summary
// counted fewer skipped duplicates than it published). What the member
// counts is what Postgres holds: every pair below the stored offset,
// applied or skipped.
func TestAbortDuringCommitCountsTheBatch(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		e := newEnv(t, b, 1)
		pool, gate := sinktest.GatedPool(t)
		hs, err := orders.Handlers(e.schema)
		if err != nil {
			t.Fatal(err)
		}
		cache, _ := dedup.New(1000)
		w, err := sink.New(pool, sink.Config{Schema: e.schema, Group: e.group, Cache: cache, Handlers: hs})
		if err != nil {
			t.Fatal(err)
		}
		stream, err := orders.Generate(20, 0.5, 7)
		if err != nil {
			t.Fatal(err)
		}
		e.produceMessages(stream.Messages)
		gate.Arm()
		m := e.start(e.config("crashing"), w)
		select {
		case <-gate.Sent():
		case <-time.After(60 * time.Second):
			t.Fatal("no batch's COMMIT went out within 60s")
		}
		// Postgres commits the batch; its answer waits at the gate.
		var stored int64
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if stored = e.storedOffsets()[0]; stored > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("stored offset %d 30s after the COMMIT went out", stored)
			}
		}
		m.c.Abort()
		// Give a worker that gives the COMMIT up on the abort time to do
		// so before the answer comes through.
		select {
		case err := <-m.done:
			m.done <- err // for stop
		case <-time.After(200 * time.Millisecond):
		}
		gate.Release()
		m.stop(t)

		if got := e.storedOffsets()[0]; got != stored {
			t.Fatalf("stored offset %d after the abort, want %d: the member wrote after its abort", got, stored)
		}
		seen := map[uuid.UUID]bool{}
		var applied, skipped int64
		for _, msg := range stream.Messages[:stored] {
			if seen[msg.ID] {
				skipped += 4
			} else {
				applied += 4
			}
			seen[msg.ID] = true
		}
		s := m.c.Stats()
		if s.Batches != 1 || s.Applied != applied || s.SkippedLRU+s.SkippedPostgres != skipped {
			t.Errorf("aborted member's Stats: %d batches, %d pairs applied, %d+%d skipped; want 1 batch, %d applied, %d skipped (every pair below the stored offset %d)",
				s.Batches, s.Applied, s.SkippedLRU, s.SkippedPostgres, applied, skipped, stored)
		}
	})
}
