package main

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// logLine is one line of a member's log (or of the harness's timeline).
type logLine struct {
	member  string // the log's name: m2.3; "chaos" for the timeline
	at      time.Time
	text    string
	count   int       // identical lines collapsed into this one
	last    time.Time // when the last of them was written
	members int       // how many members' logs they came from, when more than one
}

var (
	reTime      = regexp.MustCompile(`^time=(\S+)`)
	rePartition = regexp.MustCompile(`\bpartition=(\d+)\b`)
	reOffsets   = regexp.MustCompile(`\b(?:offset|fence|kafka_committed)=(\d+)\b`)
	// Fields that differ between otherwise identical lines of a retry loop.
	reNoise = regexp.MustCompile(`^time=\S+ |\battempt=\d+ ?|\bspan_id=\S+ ?|\btrace_id=\S+ ?`)
)

// lineMatch says whether a log line is evidence for something.
type lineMatch func(text string) bool

// aboutOffsets matches lines naming partition p and an offset within
// [lo, hi] (any offset field: offset=, fence=, kafka_committed=); not the
// dedup.skip lines, which are about events (see aboutEvents).
func aboutOffsets(p int32, lo, hi int64) lineMatch {
	want := strconv.Itoa(int(p))
	return func(text string) bool {
		m := rePartition.FindStringSubmatch(text)
		if m == nil || m[1] != want || strings.Contains(text, "msg=dedup.skip") {
			return false
		}
		for _, o := range reOffsets.FindAllStringSubmatch(text, -1) {
			if off, err := strconv.ParseInt(o[1], 10, 64); err == nil && off >= lo && off <= hi {
				return true
			}
		}
		return false
	}
}

// aboutEvents matches lines naming one of ids.
func aboutEvents(ids ...uuid.UUID) lineMatch {
	ss := make([]string, len(ids))
	for i, id := range ids {
		ss[i] = id.String()
	}
	return func(text string) bool {
		for _, s := range ss {
			if strings.Contains(text, s) {
				return true
			}
		}
		return false
	}
}

// warnings matches WARN and ERROR lines, and what a Go program prints when
// it dies.
func warnings(text string) bool {
	return strings.Contains(text, "level=WARN") || strings.Contains(text, "level=ERROR") ||
		strings.HasPrefix(text, "panic:") || strings.HasPrefix(text, "fatal error:") || strings.HasPrefix(text, "onceflow:")
}

var reList = regexp.MustCompile(`partitions="?\[([0-9 ]*)\]`)

// assignment is the last time a member logged that it was assigned a
// partition.
type assignment struct {
	member string
	at     time.Time
	text   string
	log    string
}

// owners reads, from the member logs, which member was last assigned
// each partition ("partitions assigned" lines listing it, or assignment
// lines naming partition=N).
func owners(files []string) (map[int32]assignment, error) {
	out := map[int32]assignment{}
	for _, f := range files {
		lines, err := grepFile(f, func(text string) bool { return strings.Contains(text, "assigned") })
		if err != nil {
			return nil, err
		}
		for _, l := range lines {
			var parts []string
			if m := reList.FindStringSubmatch(l.text); m != nil {
				parts = strings.Fields(m[1])
			} else if m := rePartition.FindStringSubmatch(l.text); m != nil {
				parts = []string{m[1]}
			}
			for _, ps := range parts {
				n, err := strconv.Atoi(ps)
				if err != nil {
					continue
				}
				if cur, ok := out[int32(n)]; !ok || l.last.After(cur.at) {
					out[int32(n)] = assignment{member: l.member, at: l.last, text: l.text, log: f}
				}
			}
		}
	}
	return out, nil
}

func anyOf(ms ...lineMatch) lineMatch {
	return func(text string) bool {
		for _, m := range ms {
			if m(text) {
				return true
			}
		}
		return false
	}
}

// grepLogs returns the lines of files that match, in time order, with
// lines that differ only in time and attempt number collapsed into the
// first of them, in one member's log or across members (a record that
// every new owner of a partition fails on).
func grepLogs(files []string, match lineMatch) ([]logLine, error) {
	var all []logLine
	for _, f := range files {
		lines, err := grepFile(f, match)
		if err != nil {
			return nil, err
		}
		all = append(all, lines...)
	}
	slices.SortStableFunc(all, func(a, b logLine) int { return a.at.Compare(b.at) })
	var out []logLine
	index := map[string]int{}
	from := map[string]map[string]bool{} // collapsed text -> members
	for _, l := range all {
		key := reNoise.ReplaceAllString(l.text, "")
		i, ok := index[key]
		if !ok {
			index[key] = len(out)
			from[key] = map[string]bool{l.member: true}
			out = append(out, l)
			continue
		}
		out[i].count += l.count
		out[i].last = l.last
		from[key][l.member] = true
		if n := len(from[key]); n > 1 {
			out[i].members = n
		}
	}
	return out, nil
}

func grepFile(path string, match lineMatch) ([]logLine, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	member := strings.TrimSuffix(filepath.Base(path), ".log")
	var out []logLine
	index := map[string]int{} // collapsed text -> index in out
	r := bufio.NewReaderSize(f, 1<<20)
	for {
		line, err := r.ReadString('\n')
		if line != "" && match(line) {
			text := strings.TrimRight(line, "\n")
			at := lineTime(text)
			key := reNoise.ReplaceAllString(text, "")
			if i, ok := index[key]; ok {
				out[i].count++
				out[i].last = at
			} else {
				index[key] = len(out)
				out = append(out, logLine{member: member, at: at, text: text, count: 1, last: at})
			}
		}
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", path, err)
		}
	}
}

func lineTime(text string) time.Time {
	if m := reTime.FindStringSubmatch(text); m != nil {
		if t, err := time.Parse(time.RFC3339Nano, m[1]); err == nil {
			return t
		}
	}
	return time.Time{}
}

// withTimeline adds the harness's fault lines of the 10 seconds before
// each of lines, so that a member's lines show next to the faults that
// preceded them.
func withTimeline(lines []logLine, tl *timeline) []logLine {
	var times []time.Time
	for _, l := range lines {
		if !l.at.IsZero() {
			times = append(times, l.at)
		}
	}
	if len(times) == 0 {
		return lines
	}
	slices.SortFunc(times, time.Time.Compare)
	out := slices.Clone(lines)
	for _, t := range tl.faultsBetween(times[0].Add(-10*time.Second), times[len(times)-1]) {
		// Is there a member line in [t, t+10s]?
		i, _ := slices.BinarySearchFunc(times, t.at, time.Time.Compare)
		if i < len(times) && times[i].Sub(t.at) <= 10*time.Second {
			out = append(out, logLine{member: "chaos", at: t.at, text: t.text, count: 1, last: t.at})
		}
	}
	slices.SortStableFunc(out, func(a, b logLine) int { return a.at.Compare(b.at) })
	return out
}

// writeLines prints at most limit lines (the first and the last halves).
func writeLines(w io.Writer, lines []logLine, limit int) {
	show := func(l logLine) {
		text := l.text
		if len(text) > 400 {
			text = text[:400] + "…"
		}
		if l.member == "chaos" {
			fmt.Fprintf(w, "      %-6s %s  %s\n", "chaos", l.at.UTC().Format("15:04:05.000"), text)
			return
		}
		fmt.Fprintf(w, "      %-6s %s", l.member, text)
		switch {
		case l.members > 1:
			fmt.Fprintf(w, "   [×%d in %d members until %s]", l.count, l.members, l.last.UTC().Format("15:04:05.000"))
		case l.count > 1:
			fmt.Fprintf(w, "   [×%d until %s]", l.count, l.last.UTC().Format("15:04:05.000"))
		}
		fmt.Fprintln(w)
	}
	if len(lines) <= limit {
		for _, l := range lines {
			show(l)
		}
		return
	}
	for _, l := range lines[:limit/2] {
		show(l)
	}
	fmt.Fprintf(w, "      … %d lines …\n", len(lines)-limit)
	for _, l := range lines[len(lines)-limit/2:] {
		show(l)
	}
}

// span is a run of offsets of one partition.
type span struct {
	Partition int32
	Lo, Hi    int64
	N         int
}

// spans groups positions by partition, one span per partition from its
// lowest to its highest offset.
func spans(ps []pos) []span {
	by := map[int32]*span{}
	for _, p := range ps {
		s := by[p.Partition]
		if s == nil {
			s = &span{Partition: p.Partition, Lo: p.Offset, Hi: p.Offset}
			by[p.Partition] = s
		}
		s.Lo, s.Hi = min(s.Lo, p.Offset), max(s.Hi, p.Offset)
		s.N++
	}
	out := make([]span, 0, len(by))
	for _, s := range by {
		out = append(out, *s)
	}
	slices.SortFunc(out, func(a, b span) int { return cmp.Compare(a.Partition, b.Partition) })
	return out
}

// describe says what the record at a position is, for a reader.
func describe(r *record) string {
	if r == nil {
		return "no record the producer sent"
	}
	id := "no id"
	if r.IDHeader != nil {
		id = "event_id " + shorten(string(r.IDHeader))
	}
	return fmt.Sprintf("%s (seq %d, %s, value %d bytes)", r.Kind, r.Seq, id, len(r.Value))
}
