package main

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// produceCLI runs `onceflow produce` with stdin, returning stdout, stderr
// and the error.
func produceCLI(t *testing.T, stdin io.Reader, args ...string) (string, string, error) {
	t.Helper()
	root := newRoot()
	var out, errOut bytes.Buffer
	root.SetIn(stdin)
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(append([]string{"produce"}, args...))
	err := root.ExecuteContext(t.Context())
	return out.String(), errOut.String(), err
}

// recordsIn counts the records on topic.
func recordsIn(t *testing.T, seeds []string, topic string) int64 {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(t.Context(), topic)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
	return n
}

// atTheLimit is the longest value produce sends to a topic of kfake's
// default max.message.bytes (1048588) with no key and no header.
const atTheLimit = 1048588 - 97

// One long line does not stop the others: of 20 000 lines, a 2 MB one and
// one just over decode.max_record_bytes are refused, each named by its
// line number with the limit, and every other line is sent — one of
// 1 000 000 bytes too, which the client's default batch limit refused, and
// one at the limit —
// and the command ends with a summary and an error.
func TestProduceSendsEveryLineUnderTheLimit(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "lines"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const lines = 20000
	long := map[int]int{7777: 2 << 20, 15000: 1<<20 + 1, 12000: 1000000, 13000: atTheLimit}
	var in bytes.Buffer
	for i := 1; i <= lines; i++ {
		if n, ok := long[i]; ok {
			in.WriteString(`"` + strings.Repeat("x", n-2) + `"` + "\n")
			continue
		}
		fmt.Fprintf(&in, `{"n":%d}`+"\n", i)
	}
	out, stderr, err := produceCLI(t, &in, "--brokers", strings.Join(c.ListenAddrs(), ","), "--topic", "lines")
	t.Logf("stderr:\n%.2000s\nerr: %v", stderr, err)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%d sent, 2 refused (lines 7777, 15000)", lines-2)) ||
		!strings.Contains(err.Error(), "7777") || !strings.Contains(err.Error(), "15000") {
		t.Errorf("err = %v, want a summary: %d sent, 2 refused, naming lines 7777 and 15000", err, lines-2)
	}
	for _, n := range []int{7777, 15000} {
		if !strings.Contains(stderr, fmt.Sprintf("line %d: not sent: %d bytes, over the limit of ", n, long[n])) {
			t.Errorf("stderr does not name line %d, its length and the limit:\n%.2000s", n, stderr)
		}
	}
	for _, n := range []int{12000, 13000} {
		if strings.Contains(stderr, fmt.Sprintf("line %d:", n)) {
			t.Errorf("the line %d of %d bytes was refused:\n%.2000s", n, long[n], stderr)
		}
	}
	if got := strings.Count(out, "\n"); got != lines-2 {
		t.Errorf("stdout has %d lines, want one per record sent (%d)", got, lines-2)
	}
	if got := recordsIn(t, c.ListenAddrs(), "lines"); got != lines-2 {
		t.Errorf("the topic has %d records, want %d", got, lines-2)
	}
}

// Values given as arguments are checked the same way, each named by its
// position.
func TestProduceArgumentOverTheLimit(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "args"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, stderr, err := produceCLI(t, strings.NewReader(""), "--brokers", strings.Join(c.ListenAddrs(), ","), "--topic", "args",
		`{"a":1}`, strings.Repeat("y", 2<<20), `{"a":3}`)
	if err == nil || !strings.Contains(err.Error(), "2 sent, 1 refused") || !strings.Contains(stderr, "argument 2: not sent") {
		t.Errorf("err = %v, stderr %q; want argument 2 refused and the other two sent", err, stderr)
	}
	if got := recordsIn(t, c.ListenAddrs(), "args"); got != 2 {
		t.Errorf("the topic has %d records, want 2", got)
	}
}

// endless is an input of n bytes of 'z' and then a short line, made as it
// is read.
type endless struct{ n, tail int }

func (e *endless) Read(p []byte) (int, error) {
	if e.n > 0 {
		k := min(len(p), e.n)
		for i := range p[:k] {
			p[i] = 'z'
		}
		e.n -= k
		return k, nil
	}
	const rest = "\nshort\r\nlast"
	if e.tail >= len(rest) {
		return 0, io.EOF
	}
	k := copy(p, rest[e.tail:])
	e.tail += k
	return k, nil
}

// A line over the limit is measured and skipped without being held: the
// reader's memory stays within the limit whatever the line's length.
func TestLineReaderSkipsALongLineWithoutHoldingIt(t *testing.T) {
	const limit = 1 << 10
	lr := newLineReader(&endless{n: 64 << 20}, limit)
	for _, want := range []struct {
		line string
		over int64
	}{{"", 64 << 20}, {"short", 0}, {"last", 0}} {
		line, over, err := lr.next()
		if err != nil || string(line) != want.line || over != want.over {
			t.Fatalf("next = %q, %d, %v; want %q, %d", line, over, err, want.line, want.over)
		}
		if cap(lr.buf) > 2*limit {
			t.Errorf("the reader holds %d bytes, over twice the limit of %d", cap(lr.buf), limit)
		}
	}
	if _, _, err := lr.next(); err != io.EOF {
		t.Errorf("after the last line: %v, want io.EOF", err)
	}
}

// A line's outcome is printed as it comes, while standard input stays
// open: produce reads a stream, not a file.
func TestProducePrintsWhileInputIsOpen(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "stream"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pr, pw := io.Pipe()
	root := newRoot()
	out := &syncBuffer{}
	root.SetIn(pr)
	root.SetOut(out)
	root.SetErr(io.Discard)
	root.SetArgs([]string{"produce", "--brokers", strings.Join(c.ListenAddrs(), ","), "--topic", "stream"})
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(t.Context()) }()
	// The write blocks until produce reads: a produce that failed before
	// reading ends the test instead of hanging it.
	wrote := make(chan error, 1)
	go func() { _, err := io.WriteString(pw, `{"n":1}`+"\n"); wrote <- err }()
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatal(err)
		}
	case err := <-done:
		t.Fatalf("produce ended before reading its input: %v", err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for out.String() != "stream/0@0\n" && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	got := out.String()
	pw.Close()
	if err := <-done; err != nil {
		t.Errorf("produce: %v", err)
	}
	if got != "stream/0@0\n" {
		t.Errorf("stdout while the input is open: %q, want the first record's place", got)
	}
}
