package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/onceflow/onceflow/registry"
)

// The records' formats (-format). With avro or protobuf, every record the
// workload builds as JSON is published framed for a schema registry (the
// Confluent wire format) by the writer schema chaosAvroOrder or
// chaosProtoOrder, registered in the run's own registry; the members run
// with decode.format avro or protobuf.
const (
	formatJSON     = "json"
	formatAvro     = "avro"
	formatProtobuf = "protobuf"
	formatSeed     = "seed" // see resolveFormat
)

// resolveFormat reads -format for seed: json, avro, protobuf, or seed,
// which picks by the seed so that make chaos, with a new seed each time,
// runs all three: json for an even seed; for an odd one, avro when the
// seed's second bit is 0, protobuf when it is 1. The seeds docs/chaos.md
// quotes for JSON are even: they replay as they ran.
func resolveFormat(flagValue string, seed uint64) (string, error) {
	switch flagValue {
	case formatJSON, formatAvro, formatProtobuf:
		return flagValue, nil
	case formatSeed, "":
		switch {
		case seed%2 == 0:
			return formatJSON, nil
		case seed>>1%2 == 0:
			return formatAvro, nil
		default:
			return formatProtobuf, nil
		}
	}
	return "", fmt.Errorf("%q: json, avro, protobuf, or seed (json for an even seed; for an odd one, avro or protobuf by its second bit)", flagValue)
}

// chaosAvroOrder is the writer schema of the seed's order in an Avro run.
// user_id is a union so that the rejected poison's "one" can be written
// (the handlers refuse it, as in JSON); pad carries the oversize
// poison's padding.
const chaosAvroOrder = `{"type":"record","name":"Order","namespace":"chaos","fields":[
	{"name":"user_id","type":["long","string"]},
	{"name":"items","type":{"type":"array","items":"string"}},
	{"name":"pad","type":["null","string"],"default":null}]}`

// chaosProtoOrder is the order's Protobuf schema. user_id is an int32
// (proto3's JSON mapping writes an int64 as a string, which the orders'
// parser does not take), in a oneof with user_name, which carries the
// rejected poison's "one" (the handlers, finding no user_id, refuse it);
// a oneof member is written even when 0, so the poison's user_id 0 stays.
const chaosProtoOrder = `syntax = "proto3";
package chaos;
message Order {
  oneof user {
    int32 user_id = 1;
    string user_name = 4;
  }
  repeated string items = 2;
  string pad = 3;
}
`

// Framed poison. In an Avro or Protobuf run the bad-json records, whose
// point (a value the decoder cannot read) JSON syntax no longer makes,
// become these in turn; the other kinds keep their content, framed (nul
// and nul-escape: a string holding U+0000, which Postgres cannot store).
const (
	avroUnknownID = "unknown-id" // framed with a schema id the registry does not know
	avroTruncated = "truncated"  // a good body cut short (its last 3 bytes)
	avroNotFramed = "not-framed" // the order as JSON text: no magic byte
	avroCorrupt   = "corrupt"    // a good body made unreadable: Avro, a union branch out of range; Protobuf, wire type 7
)

var avroPoison = []string{avroUnknownID, avroTruncated, avroNotFramed, avroCorrupt}

// unknownSchemaID is the first schema id the Avro poison names; the
// run's registry never gives ids this high.
const unknownSchemaID = 1<<31 - 1000

// chaosRegistry is the run's own schema registry, started and crashed
// through infra/chaos-schema-registry.sh; never the shared one on 18081.
type chaosRegistry struct {
	root, dir, workDir string
	port               int
	url                string
}

func (r *chaosRegistry) script(ctx context.Context, verb string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(r.root, "infra", "chaos-schema-registry.sh"), verb)
	cmd.Dir = r.workDir
	cmd.Env = append(os.Environ(), "CHAOS_SCHEMA_REGISTRY_PORT="+strconv.Itoa(r.port), "CHAOS_SCHEMA_REGISTRY_DIR="+r.dir)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("infra/chaos-schema-registry.sh %s: %w: %s", verb, err, strings.TrimSpace(errb.String()))
	}
	return strings.TrimSpace(out.String()), nil
}

// start starts the registry (or finds it running) and reads its URL.
func (r *chaosRegistry) start(ctx context.Context) error {
	url, err := r.script(ctx, "start")
	if err != nil {
		return err
	}
	r.url = url
	return nil
}

// avroRun is what an Avro or Protobuf run adds: the registry, the encoder
// of the order's schema, and what its restarts did.
type avroRun struct {
	kind     registry.Kind
	reg      *chaosRegistry
	enc      *registry.Encoder
	subject  string
	restarts int // registry restarts carried out
	killed   int // members killed while the registry was down
}

// startAvro starts the run's registry and sets up an Avro run
// (setupAvro). On an error the registry is stopped again.
func (c *chaos) startAvro(ctx context.Context, topic string, w *workload) (*avroRun, error) {
	reg := &chaosRegistry{root: c.svc.root, dir: c.o.registryDir, workDir: c.dir, port: c.o.registryPort}
	if err := reg.start(ctx); err != nil {
		return nil, err
	}
	a, err := setupAvro(ctx, reg, registry.Kind(c.o.format), topic, w, c.o.maxRecord)
	if err != nil {
		if !c.o.keep {
			reg.script(context.WithoutCancel(ctx), "stop")
		}
		return nil, err
	}
	c.tl.add("format %s: schema registry %s (%s), the order's schema id %d under subject %s; the bad-json poison is %s in turn",
		a.kind, reg.url, reg.dir, a.enc.ID(), a.subject, strings.Join(avroPoison, ", "))
	return a, nil
}

// stopRegistry stops an Avro run's registry (with the other services).
func (c *chaos) stopRegistry(ctx context.Context) {
	if c.avro == nil {
		return
	}
	if _, err := c.avro.reg.script(ctx, "stop"); err != nil {
		fmt.Fprintln(os.Stderr, "chaos: stop the schema registry:", err)
	}
}

// summary is what an Avro run adds to the summary line.
func (a *avroRun) summary() string {
	if a == nil {
		return ""
	}
	return fmt.Sprintf(" registry_restarts=%d", a.restarts)
}

// memberEnv is the members' decode configuration of an Avro run (none
// for JSON).
func (a *avroRun) memberEnv() []string {
	if a == nil {
		return nil
	}
	return []string{"ONCEFLOW_DECODE_FORMAT=" + string(a.kind), "ONCEFLOW_DECODE_SCHEMA_REGISTRY_URL=" + a.reg.url,
		"ONCEFLOW_DECODE_SCHEMA_REGISTRY_TIMEOUT=2s"}
}

// setupAvro registers the order's schema under topic's value subject in
// the run's registry and re-encodes w's records: good ones and poison
// framed by it, the bad-json poison made Avro poison (avroPoison in
// turn). It runs before the ledger is made, so that the ledger, the
// topic's read-back and the verdict see the records as published.
func setupAvro(ctx context.Context, reg *chaosRegistry, kind registry.Kind, topic string, w *workload, maxRecordBytes int) (*avroRun, error) {
	a := &avroRun{kind: kind, reg: reg, subject: topic + "-value"}
	src := registry.Source{Kind: kind, Text: chaosAvroOrder}
	if kind == registry.Protobuf {
		src.Text = chaosProtoOrder
	}
	var err error
	a.enc, err = registry.NewEncoder(ctx, registry.Config{URL: reg.url, Timeout: 10 * time.Second}, a.subject, src)
	if err != nil {
		return nil, fmt.Errorf("register the order's %s schema: %w", kind, err)
	}
	n := 0
	for _, recs := range [][]record{w.Records, w.Burst} {
		for i := range recs {
			if err := a.encode(&recs[i], &n, maxRecordBytes); err != nil {
				return nil, fmt.Errorf("record seq %d (%s): %w", recs[i].Seq, recs[i].Kind, err)
			}
		}
	}
	return a, nil
}

// encode replaces r's JSON value by its Avro form; n counts the bad-json
// records met so far, which become avroPoison in turn.
func (a *avroRun) encode(r *record, n *int, maxRecordBytes int) error {
	switch r.Kind {
	case "empty":
		return nil // no value at all: not framed either
	case "bad-json":
		kind := avroPoison[*n%len(avroPoison)]
		good, err := a.enc.Encode([]byte(fmt.Sprintf(`{"user_id":%d,"items":["SKU-%02d"]}`, 1+*n, *n%50)))
		if err != nil {
			return err
		}
		r.Kind, r.Value = kind, avroPoisonValue(a.kind, kind, good, *n)
		*n++
		return nil
	case "nul":
		// A raw NUL inside a JSON string is not JSON: say it as \u0000.
		r.Value = bytes.ReplaceAll(r.Value, []byte{0}, []byte(`\u0000`))
	}
	if a.kind == registry.Protobuf && bytes.Contains(r.Value, []byte(`"user_id":"`)) {
		// The rejected poison's user_id "one" is the oneof's user_name.
		r.Value = bytes.Replace(r.Value, []byte(`"user_id":"`), []byte(`"user_name":"`), 1)
	}
	v, err := a.enc.Encode(r.Value)
	if err != nil {
		return err
	}
	if r.Kind == "over-decoder" && len(v) <= maxRecordBytes {
		// The encoding is shorter than the JSON it came from: pad it past
		// the limit.
		var m map[string]any
		if err := json.Unmarshal(r.Value, &m); err != nil {
			return err
		}
		m["pad"] = m["pad"].(string) + strings.Repeat("x", maxRecordBytes+1-len(v))
		j, _ := json.Marshal(m)
		if v, err = a.enc.Encode(j); err != nil {
			return err
		}
	}
	r.Value = v
	return nil
}

// avroPoisonValue makes the poison kind of good, an order framed as
// format says; i tells the unknown ids apart.
func avroPoisonValue(format registry.Kind, kind string, good []byte, i int) []byte {
	v := bytes.Clone(good)
	switch kind {
	case avroUnknownID:
		binary.BigEndian.PutUint32(v[1:5], uint32(unknownSchemaID+i))
	case avroTruncated:
		v = v[:len(v)-3]
	case avroNotFramed:
		v = []byte(fmt.Sprintf(`{"user_id":%d,"items":["SKU-%02d"]}`, 1+i, i%50))
	case avroCorrupt:
		if format == registry.Protobuf {
			v[6] = 0x0f // after the message index (one 0 byte): field 1 with wire type 7, which does not exist
		} else {
			v[5] = 0x0a // user_id's union branch 5 (zigzag): the union has 2
		}
	}
	return v
}

// registryRestartShares are the points of the fault window, as shares of
// -duration, where an Avro run kills its registry. They are fixed, apart
// from the seeded schedule, so that a seed's other faults are those it
// has in a JSON run.
var registryRestartShares = []float64{0.15, 0.4, 0.65, 0.85}

// registryRestarts kills the registry (kill -9) at each of
// registryRestartShares of the window that begins now, kills a member
// 300ms later (it starts again 0.5s after, while the registry is down, so
// that it must fetch the writer schema from a registry that does not
// answer), and starts the registry again after 2–6s (drawn from seed).
// Other faults go on meanwhile, but not the edge faults (pg-latency,
// recreate), which have the window to themselves: a restart due during
// one waits for its end. It returns a function that waits for the
// restarts to end; ctx ends them early.
func (c *chaos) registryRestarts(ctx context.Context, a *avroRun) (wait func()) {
	if a == nil {
		return func() {}
	}
	rng := rand.New(rand.NewPCG(c.o.seed, 0x7265676973747279)) // "registry"
	begin := time.Now()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i, share := range registryRestartShares {
			down := 2*time.Second + time.Duration(rng.Int64N(int64(4*time.Second)))
			if !sleepCtx(ctx, time.Until(begin.Add(time.Duration(share*float64(c.o.duration))))) {
				return
			}
			// An edge fault has the window to itself (its checks time it,
			// and count on no member restarting): wait for it to end.
			c.edge.Lock()
			say := func(format string, args ...any) {
				c.tl.fault("registry restart %d: "+format, append([]any{i + 1}, args...)...)
			}
			say("kill -9 the schema registry; start it again in %v (other faults go on meanwhile)", down)
			if _, err := a.reg.script(ctx, "crash"); err != nil {
				say("crash: %v", err)
				c.edge.Unlock()
				continue
			}
			a.restarts++
			t0 := time.Now()
			if sleepCtx(ctx, 300*time.Millisecond) {
				if sl := c.members.pick(i); sl != nil && sl.current() != nil {
					if p, err := c.members.kill(sl, 500*time.Millisecond); err == nil {
						a.killed++
						say("SIGKILL %s (pid %d); it starts again in 0.5s, the registry down", p.name, p.pid)
					}
				}
			}
			up := a.restart(ctx, t0, down, say)
			c.edge.Unlock()
			if !up {
				return
			}
		}
	}()
	return wg.Wait
}

// restart starts the registry again down after t0, trying until it is
// up; false when ctx ended first.
func (a *avroRun) restart(ctx context.Context, t0 time.Time, down time.Duration, say func(string, ...any)) bool {
	if !sleepCtx(ctx, time.Until(t0.Add(down))) {
		return false
	}
	for {
		_, err := a.reg.script(ctx, "start")
		if err == nil {
			say("schema registry up again after %v", time.Since(t0).Round(time.Millisecond))
			return true
		}
		say("start: %v", err)
		if !sleepCtx(ctx, time.Second) {
			return false
		}
	}
}

// formatFailures are an Avro run's own checks on the dead letters: each
// Avro poison record's reason names what the decoder met (the unknown
// schema id; the schema id and subject of a truncated or corrupt body;
// "not framed"), and no dead letter says the registry was down or failed
// — a registry that is down never makes a dead letter.
func formatFailures(a *avroRun, e *expectation, o *observed) []string {
	if a == nil {
		return nil
	}
	var out []string
	for at, r := range e.Poison {
		dl, ok := o.DeadLetters[at]
		if !ok {
			continue // counted by the verdict
		}
		want := ""
		switch r.Kind {
		case avroUnknownID:
			want = "schema id " + strconv.FormatUint(uint64(binary.BigEndian.Uint32(r.Value[1:5])), 10) + ": the schema registry does not know"
		case avroTruncated, avroCorrupt:
			want = fmt.Sprintf("schema id %d ", a.enc.ID())
		case avroNotFramed:
			want = "not framed"
		}
		if want != "" && !strings.Contains(dl.Reason, want) {
			out = append(out, fmt.Sprintf("dead letter %s (%s): reason %q does not say %q", at, r.Kind, dl.Reason, want))
		}
	}
	for at, dl := range o.DeadLetters {
		if strings.Contains(dl.Reason, "schema registry unreachable") || strings.Contains(dl.Reason, "schema registry answered") {
			out = append(out, fmt.Sprintf("dead letter %s because the registry failed: %s", at, dl.Reason))
		}
	}
	slices.Sort(out)
	return out
}
