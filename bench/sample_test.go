package bench

import (
	"bytes"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/sink"
)

// A sample may start with a UTF-8 byte order mark (an editor's), and a
// line too large for a Kafka record is refused at once, named, with the
// limit.
func TestSampleBOMAndLongLine(t *testing.T) {
	p, err := ParseSample([]byte("\xEF\xBB\xBF{\"a\": 1}\r\n{\"a\": 2}\r\n"))
	if err != nil || len(p.lines) != 2 || string(p.lines[0]) != `{"a": 1}` {
		t.Fatalf("a sample with a BOM: %v, %q", err, p)
	}
	big := `{"a": "` + strings.Repeat("x", SampleLineMax) + `"}`
	_, err = ParseSample([]byte("{\"a\": 1}\n\n" + big + "\n"))
	for _, w := range []string{"sample line 3", "900000 bytes"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("a line over the limit: %v; want it to say %q", err, w)
		}
	}
}

// A payload of the sample that a handler cannot apply fails the run with
// the sample line named and the database's error, without the other
// writers' "context canceled" first.
func TestBadSamplePayloadNamesTheLine(t *testing.T) {
	up, us, _ := userDB(t)
	var lines []string
	for i := range 20 {
		lines = append(lines, `{"account": "a", "amount": "`+strings.Repeat("1", 1+i%3)+`"}`)
	}
	lines[12] = `{"account": "a", "amount": "twelve"}`
	p, err := ParseSample([]byte("\n" + strings.Join(lines, "\n")))
	if err != nil {
		t.Fatal(err)
	}
	var progress bytes.Buffer
	_, err = Run(t.Context(), Config{Pool: up, Topic: "payments", Payloads: p, Events: 2000, Partitions: 4, Scenarios: []string{Steady},
		NoRawCopy: true, Schema: us + "_b", Progress: &progress, Consumer: processorBatch(50),
		Handlers: func(string) ([]sink.Handler, error) {
			return []sink.Handler{sqlHandler(t, "payments", paymentsSQL)}, nil
		}})
	if err == nil {
		t.Fatal("Run applied a payload of amount \"twelve\"")
	}
	for _, w := range []string{"sample line 14", "twelve", "invalid input syntax for type numeric"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("Run: %v\nwant it to say %q", err, w)
		}
	}
	if strings.Contains(err.Error(), "context canceled") {
		t.Errorf("Run: %v\nsays context canceled", err)
	}
}

func processorBatch(n int) processor.Config { return processor.Config{BatchMaxRecords: n} }
