package main

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/internal/orders"
)

// report turns a run's verdict into the evidence and the summary line.
type report struct {
	c         *chaos
	exp       *expectation
	obs       *observed
	v         *verdict
	check     orders.Report
	committed map[int32]int64 // Kafka's committed offsets of the group
	settled   time.Duration   // -1: not every partition reached its end
	slowStops []string        // members that did not exit within 30s of the final SIGTERM
	pubErr    error
	elapsed   time.Duration
	topic     string
	group     string
}

// Lines of member logs shown per item: on the terminal, and in
// evidence.txt.
const (
	shownLines = 30
	fileLines  = 400
	shownItems = 10
)

// write prints the evidence (a short form on stdout, the long one in
// evidence.txt) and the summary line, and returns the exit status.
func (r *report) write() int {
	invalid := r.invalid()
	var file bytes.Buffer
	r.evidence(&file, fileLines, 100)
	if len(invalid) > 0 {
		fmt.Fprintln(&file, "INVALID: this run proves nothing about onceflow:")
		for _, s := range invalid {
			fmt.Fprintln(&file, "  -", s)
		}
	}
	path := filepath.Join(r.c.dir, "evidence.txt")
	_ = os.WriteFile(path, file.Bytes(), 0o644)
	if !r.v.pass() || len(invalid) > 0 {
		fmt.Println()
		r.evidence(os.Stdout, shownLines, shownItems)
		fmt.Printf("the whole evidence: %s; member logs: %s; faults: %s\n", path,
			filepath.Join(r.c.dir, "logs"), filepath.Join(r.c.dir, "timeline.log"))
	}
	for _, s := range invalid {
		fmt.Println("INVALID:", s)
	}
	status, word := exitPass, "PASS"
	switch {
	case len(invalid) > 0:
		status, word = exitInvalid, "INVALID"
	case !r.v.pass():
		status, word = exitFail, "FAIL"
	}
	line := r.summary(word)
	_ = os.WriteFile(filepath.Join(r.c.dir, "summary.txt"), []byte(line+"\n"), 0o644)
	fmt.Println(line)
	return status
}

// invalid lists what makes the run unable to judge onceflow: data the
// broker lost, records nobody sent, a verdict that disagrees with
// orders.Check.
func (r *report) invalid() []string {
	var out []string
	e, v := r.exp, r.v
	if len(e.BrokerLost) > 0 {
		out = append(out, fmt.Sprintf("the broker lost %d records it had acknowledged (seqs %v…): the producer's ledger and the topic disagree", len(e.BrokerLost), first(e.BrokerLost, 5)))
	}
	if len(e.Moved) > 0 {
		out = append(out, fmt.Sprintf("%d acknowledged records are elsewhere in the topic than acknowledged (seqs %v…)", len(e.Moved), first(e.Moved, 5)))
	}
	if len(e.Unknown) > 0 {
		out = append(out, fmt.Sprintf("%d records in the topic were not sent by this run's producer (at %v…)", len(e.Unknown), first(e.Unknown, 5)))
	}
	effectsOK := len(v.Lost)+len(v.Unreached)+len(v.Doubled)+len(v.Extra)+len(v.Counters) == 0
	if r.check.ExactlyOnce() != effectsOK {
		out = append(out, fmt.Sprintf("the verdict (effects exactly once: %v) and orders.Check (%v: %s) disagree: one of them miscounts",
			effectsOK, r.check.ExactlyOnce(), strings.Join(r.check.Problems, "; ")))
	}
	return out
}

func (r *report) summary(word string) string {
	t, v, ms := &r.c.t, r.v, r.c.members
	counters := "ok"
	if len(v.Counters) > 0 {
		counters = fmt.Sprintf("%d-off", len(v.Counters))
	}
	settled := "no"
	if r.settled >= 0 {
		settled = r.settled.Round(100 * time.Millisecond).String()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "chaos: seed=%d protocol=%s format=%s events=%d records=%d kills=%d terms=%d stops=%d pg_restarts=%d broker_restarts=%d%s conn_cuts=%d commit_cuts=%d storms=%d replays=%d exits=%d",
		r.c.o.seed, r.c.o.protocol, r.c.o.format, v.Events, len(r.exp.At), t.kills, t.terms, t.stops, t.pgRestarts, t.brokerRestarts, r.c.avro.summary(), t.connCuts(), t.commitCuts(), t.storms, t.replays, ms.exits.Load())
	fmt.Fprintf(&b, " lost=%d", len(v.Lost))
	if n := len(v.Unreached); n > 0 {
		fmt.Fprintf(&b, " unreached=%d", n)
	}
	fmt.Fprintf(&b, " doubled=%d extra=%d counters=%s dead_letters=%d/%d", len(v.Doubled), len(v.Extra), counters, v.DLOK, v.DLWant)
	if n := len(v.DLUnexpected); n > 0 {
		fmt.Fprintf(&b, " unexpected_dead_letters=%d", n)
	}
	fmt.Fprintf(&b, " stuck=%d", len(v.Stuck))
	if n := len(v.Ahead); n > 0 {
		fmt.Fprintf(&b, " ahead=%d", n)
	}
	if l := r.c.lat; l != nil {
		took := "no"
		if l.Took >= 0 {
			took = l.Took.Round(100 * time.Millisecond).String()
		}
		fmt.Fprintf(&b, " latency_isolated=%d/%d latency_took=%s", l.Isolated, l.Records, took)
	}
	if rc := r.c.rec; rc != nil {
		consumed := "no"
		if rc.Consumed >= 0 {
			consumed = rc.Consumed.Round(100 * time.Millisecond).String()
		}
		fmt.Fprintf(&b, " recreate_partitions=%d->%d recreate_consumed=%s dl_reused=%d/%d", rc.OldParts, rc.NewParts, consumed, reusedOK(rc, r.obs), len(rc.Reused))
		if rc.GrownParts > 0 {
			grown := "no"
			if rc.Grown >= 0 {
				grown = rc.Grown.Round(100 * time.Millisecond).String()
			}
			fmt.Fprintf(&b, " grow_partitions=%d->%d grow_consumed=%s", rc.NewParts, rc.GrownParts, grown)
		}
	}
	fmt.Fprintf(&b, " settled=%s duration=%s %s", settled, r.elapsed.Round(time.Second), word)
	return b.String()
}

// evidence writes what went wrong, each item with the member log lines
// (and the harness's fault lines) around it: at most lines log lines and
// items listed entries per item. It is long on purpose: one block per kind
// of failure, in the order of the summary line.
func (r *report) evidence(w io.Writer, lines, items int) {
	e, v, o := r.exp, r.v, r.obs
	batch := int64(r.c.o.batch)
	logs := r.c.members.logs()
	show := func(title string, match lineMatch) {
		got, err := grepLogs(logs, match)
		if err != nil {
			fmt.Fprintf(w, "    (member logs: %v)\n", err)
			return
		}
		if len(got) == 0 {
			fmt.Fprintf(w, "    %s: no member log line\n", title)
			return
		}
		fmt.Fprintf(w, "    %s:\n", title)
		writeLines(w, withTimeline(got, r.c.tl), lines)
	}
	r.faultDetail(w)

	for _, s := range v.Edge {
		fmt.Fprintf(w, "EDGE: %s\n", s)
	}
	if l := r.c.lat; l != nil && l.Took < 0 && l.Err == nil {
		show(fmt.Sprintf("partition %d under latency (the burst)", l.Partition), aboutOffsets(l.Partition, max(0, l.Lo-int64(r.c.o.batch)), l.Hi))
	}

	if len(v.Lost) > 0 {
		fmt.Fprintf(w, "LOST: %d events have an effect missing, though the stored offset of their partition passed a copy of them (or they have only some of their effects):\n", len(v.Lost))
		var passed []pos
		var ids []uuid.UUID
		for _, p := range v.Lost {
			ids = append(ids, p.ID)
			for _, at := range e.Copies[p.ID] {
				if s, ok := o.Stored[at.Partition]; ok && at.Offset < s {
					passed = append(passed, at)
				}
			}
		}
		for _, s := range spans(passed) {
			fmt.Fprintf(w, "  partition %d: %d copies passed over at offsets %d–%d; stored offset now %s, Kafka committed %s\n",
				s.Partition, s.N, s.Lo, s.Hi, r.stored(s.Partition), r.kafka(s.Partition))
		}
		for _, p := range first(v.Lost, items) {
			fmt.Fprintf(w, "  %s at %v: %s\n", p.ID, e.Copies[p.ID], p.Detail)
		}
		for _, s := range first(spans(passed), 4) {
			show(fmt.Sprintf("partition %d, offsets %d–%d (the lost ones and the batches around them), and the first lost ids", s.Partition, max(0, s.Lo-4*batch), s.Hi+4*batch),
				anyOf(aboutOffsets(s.Partition, s.Lo-4*batch, s.Hi+4*batch), aboutEvents(first(ids, 3)...)))
		}
	}
	if len(v.Unreached) > 0 {
		var at []pos
		for _, p := range v.Unreached {
			at = append(at, e.Copies[p.ID]...)
		}
		var parts []string
		for _, s := range spans(at) {
			parts = append(parts, fmt.Sprintf("partition %d: %d copies at %d–%d", s.Partition, s.N, s.Lo, s.Hi))
		}
		fmt.Fprintf(w, "UNREACHED: %d events have no effect; every copy of them is at or after its partition's stored offset (see STUCK): %s\n",
			len(v.Unreached), strings.Join(parts, "; "))
	}
	if len(v.Doubled) > 0 {
		fmt.Fprintf(w, "DOUBLED: %d events have an effect more than once:\n", len(v.Doubled))
		var ids []uuid.UUID
		for _, p := range first(v.Doubled, items) {
			fmt.Fprintf(w, "  %s at %v: %s\n", p.ID, e.Copies[p.ID], p.Detail)
			ids = append(ids, p.ID)
		}
		match := []lineMatch{aboutEvents(first(ids, 5)...)}
		for _, id := range first(ids, 3) {
			for _, at := range e.Copies[id] {
				match = append(match, aboutOffsets(at.Partition, at.Offset-4*batch, at.Offset))
			}
		}
		show("the first doubled events' ids, and the batches before their copies", anyOf(match...))
	}
	if len(v.Extra) > 0 {
		fmt.Fprintf(w, "EXTRA: effects of %d events that are no good order:\n", len(v.Extra))
		for _, p := range first(v.Extra, items) {
			fmt.Fprintf(w, "  %s (%s): %s\n", p.ID, r.whatIs(p.ID), p.Detail)
		}
	}
	if len(v.Counters) > 0 {
		fmt.Fprintf(w, "COUNTERS: %d counters off their exact expected sums:\n", len(v.Counters))
		for _, s := range first(v.Counters, items) {
			fmt.Fprintln(w, "  "+s)
		}
	}
	if len(v.DLMissing)+len(v.DLDoubled)+len(v.DLUnreached) > 0 {
		fmt.Fprintf(w, "DEAD LETTERS: %d of %d poison records in dead_letters exactly once; passed over without one %d, more than once %d, not reached %d:\n",
			v.DLOK, v.DLWant, len(v.DLMissing), len(v.DLDoubled), len(v.DLUnreached))
		for _, at := range first(v.DLMissing, items) {
			fmt.Fprintf(w, "  passed over %v: %s\n", at, describe(e.At[at]))
		}
		for _, at := range first(v.DLDoubled, items) {
			fmt.Fprintf(w, "  ×%d %v: %s\n", o.DeadLetters[at].Count, at, describe(e.At[at]))
		}
		for _, at := range first(v.DLUnreached, items) {
			fmt.Fprintf(w, "  not reached %v: %s\n", at, describe(e.At[at]))
		}
		var match []lineMatch
		for _, at := range first(slices.Concat(v.DLMissing, v.DLDoubled), 4) {
			match = append(match, aboutOffsets(at.Partition, at.Offset-4*batch, at.Offset))
		}
		if len(match) > 0 {
			show("the first of those passed over or doubled (their batches' lines)", anyOf(match...))
		}
	}
	if len(v.DLUnexpected) > 0 {
		fmt.Fprintf(w, "UNEXPECTED DEAD LETTERS: %d dead letters of records that are no poison:\n", len(v.DLUnexpected))
		for _, at := range first(v.DLUnexpected, items) {
			fmt.Fprintf(w, "  %v: %s; reason %q\n", at, describe(e.At[at]), o.DeadLetters[at].Reason)
		}
	}
	if len(v.Stuck) > 0 {
		r.stuck(w, show, lines)
	}
	if len(v.Ahead) > 0 {
		fmt.Fprintf(w, "AHEAD: %d partitions have a stored offset past their end:\n", len(v.Ahead))
		for _, s := range v.Ahead {
			fmt.Fprintf(w, "  partition %d: stored %d, end %d\n", s.Partition, s.Stored, s.End)
		}
	}
	var ahead []string
	for _, p := range slices.Sorted(maps.Keys(r.committed)) {
		if s, ok := o.Stored[p]; !ok || r.committed[p] > s {
			ahead = append(ahead, fmt.Sprintf("%d: kafka %d > postgres %s", p, r.committed[p], r.stored(p)))
		}
	}
	if len(ahead) > 0 {
		fmt.Fprintf(w, "NOTE: Kafka's committed offset is ahead of the one stored in Postgres on %d partitions (a member that starts from Kafka's skips the records between): %s\n",
			len(ahead), strings.Join(ahead, "; "))
	}
	if n := r.c.members.slowEnd.Load(); n > 0 || len(r.slowStops) > 0 {
		fmt.Fprintf(w, "NOTE: %d members did not exit within %v of a SIGTERM during the run, %d at the end (%s): killed\n",
			n, drainBound, len(r.slowStops), strings.Join(r.slowStops, ", "))
	}
	if n := r.c.members.exits.Load(); n > 0 {
		fmt.Fprintf(w, "NOTE: members exited %d times without a signal from the harness (restarted after 1s); see the timeline\n", n)
	}
	if r.pubErr != nil {
		fmt.Fprintf(w, "NOTE: producer: %v\n", r.pubErr)
	}
}

// stuck explains the partitions that did not reach their end: what waits
// at their stored offset, which member last took them and what that
// member kept saying, and the lines about their offsets.
func (r *report) stuck(w io.Writer, show func(string, lineMatch), lines int) {
	e, v := r.exp, r.v
	batch := int64(r.c.o.batch)
	own, err := owners(r.c.members.logs())
	if err != nil {
		fmt.Fprintf(w, "    (member logs: %v)\n", err)
	}
	fmt.Fprintf(w, "STUCK: %d partitions did not reach their end within %v after the faults stopped:\n", len(v.Stuck), r.c.o.settle)
	byOwner := map[string][]int32{}
	for _, s := range v.Stuck {
		head := pos{s.Partition, max(0, s.Stored), r.exp.Inc}
		fmt.Fprintf(w, "  partition %d: stored offset %s, end %d, Kafka committed %s; next record %v: %s",
			s.Partition, r.stored(s.Partition), s.End, r.kafka(s.Partition), head, describe(e.At[head]))
		if p, ok := r.nextPoison(head); ok {
			fmt.Fprintf(w, "; first poison from there %v: %s", p, describe(e.At[p]))
		}
		if a, ok := own[s.Partition]; ok {
			fmt.Fprintf(w, "; last assigned to %s at %s", a.member, a.at.UTC().Format("15:04:05.000"))
			byOwner[a.log] = append(byOwner[a.log], s.Partition)
		}
		fmt.Fprintln(w)
	}
	for _, log := range slices.Sorted(maps.Keys(byOwner)) {
		got, err := grepFile(log, warnings)
		if err != nil {
			continue
		}
		// The last distinct warnings, in the order they were last seen.
		slices.SortStableFunc(got, func(a, b logLine) int { return a.last.Compare(b.last) })
		name := strings.TrimSuffix(filepath.Base(log), ".log")
		fmt.Fprintf(w, "    %s, last owner of partitions %v: its last distinct warnings (%d kinds):\n", name, byOwner[log], len(got))
		writeLines(w, first(slices.Clone(got[max(0, len(got)-8):]), 8), lines)
	}
	for _, s := range first(v.Stuck, 4) {
		from := max(0, s.Stored)
		show(fmt.Sprintf("partition %d from its stored offset %d", s.Partition, from),
			aboutOffsets(s.Partition, from, from+4*batch))
	}
}

// faultDetail says where the connection cuts landed.
func (r *report) faultDetail(w io.Writer) {
	t := &r.c.t
	fmt.Fprintf(w, "connection cuts: %d mid-transaction, %d on COMMIT before postgres got it, %d after postgres committed (outcome unknown to the member), "+
		"%d backends terminated (%d in COMMIT, %d idle in transaction), %d connections in %d cuts of every connection; %d faults found no member running\n",
		t.midTx, t.before, t.after, t.terminated, t.terminatedInCommit, t.terminated-t.terminatedInCommit, t.resetConns, t.resets, t.skipped)
}

func (r *report) stored(p int32) string {
	if s, ok := r.obs.Stored[p]; ok {
		return fmt.Sprint(s)
	}
	return "none"
}

func (r *report) kafka(p int32) string {
	if s, ok := r.committed[p]; ok {
		return fmt.Sprint(s)
	}
	return "none"
}

// nextPoison is the first poison record at or after at in its partition.
func (r *report) nextPoison(at pos) (pos, bool) {
	best, found := pos{}, false
	for p := range r.exp.Poison {
		if p.Partition == at.Partition && p.Inc == at.Inc && p.Offset >= at.Offset && (!found || p.Offset < best.Offset) {
			best, found = p, true
		}
	}
	return best, found
}

// whatIs says what the producer sent with id.
func (r *report) whatIs(id uuid.UUID) string {
	for at, rec := range r.exp.At {
		if rec.ID == id {
			return fmt.Sprintf("%s at %v", rec.Kind, at)
		}
	}
	return "an id the producer never sent"
}

func first[T any](xs []T, n int) []T { return xs[:min(n, len(xs))] }
