package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	schemaregistry "github.com/onceflow/onceflow/registry"
	"github.com/onceflow/onceflow/registry/registrytest"
	"github.com/onceflow/onceflow/sink/sinktest"
	"github.com/onceflow/onceflow/wire"
)

const avroPaymentV1 = `{"type":"record","name":"Payment","namespace":"shop","fields":[
 {"name":"account","type":"string"},
 {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":12,"scale":2}},
 {"name":"at","type":{"type":"long","logicalType":"timestamp-millis"}},
 {"name":"method","type":{"type":"enum","name":"Method","symbols":["CARD","IBAN"]}},
 {"name":"memo","type":["null","string"]}]}`

// v2 adds currency with a default and drops memo.
const avroPaymentV2 = `{"type":"record","name":"Payment","namespace":"shop","fields":[
 {"name":"account","type":"string"},
 {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":12,"scale":2}},
 {"name":"at","type":{"type":"long","logicalType":"timestamp-millis"}},
 {"name":"method","type":{"type":"enum","name":"Method","symbols":["CARD","IBAN"]}},
 {"name":"currency","type":"string","default":"EUR"}]}`

// A SQL handler reads Avro records of two schema versions through the
// payload: a decimal as numeric, a timestamp as timestamptz, an enum as
// text, a field only one version has as NULL for the other; each applied
// once (the table has no unique key), the poison dead-lettered naming the
// schema id.
func TestBinaryRunsSQLHandlerOnAvroTopic(t *testing.T) {
	dsn := sinktest.DSN(t)
	pool := sinktest.Pool(t)
	bin := onceflowBinary(t)
	regs := registrytest.Registries(t)
	for name, start := range testBrokers(t) {
		t.Run(name, func(t *testing.T) {
			url := regs["srfake"]
			if u, ok := regs["real"]; ok {
				url = u
			}
			seeds := start(t)
			schema := freshSchema(t, pool, "test_avro_")
			topic := "payments-" + randomHex(4)
			createTopic(t, seeds, topic, 2)
			if _, err := pool.Exec(t.Context(), `CREATE SCHEMA `+schema+`;
CREATE TABLE `+schema+`.payments (event_id uuid, account text, amount numeric(12,2), at timestamptz, method text, currency text, memo text)`); err != nil {
				t.Fatal(err)
			}
			id1 := registrytest.Register(t, url, topic+"-value", sr.Schema{Schema: avroPaymentV1})
			id2 := registrytest.Register(t, url, topic+"-value", sr.Schema{Schema: avroPaymentV2})
			config := writeConfig(t, fmt.Sprintf(`kafka:
  brokers: [%s]
  topics: [%s]
  group: %s
  dead_letter_topic: ""
decode:
  format: avro
  schema_registry:
    url: %s
postgres:
  dsn: %s
  schema: %s
http:
  addr: 127.0.0.1:0
log:
  level: warn
sql_handlers:
  - name: payments
    sql: |
      INSERT INTO %s.payments (event_id, account, amount, at, method, currency, memo)
      SELECT event_id, payload->>'account', (payload->>'amount')::numeric, (payload->>'at')::timestamptz,
             payload->>'method', payload->>'currency', payload->>'memo'
      FROM events
`, strings.Join(seeds, ", "), topic, "g-"+topic, url, dsn, schema, schema))

			at := time.Date(2026, 3, 1, 12, 0, 0, 250_000_000, time.UTC)
			var recs []*kgo.Record
			const n = 10
			for i := range n {
				v := map[string]any{"account": fmt.Sprintf("acct-%d", i), "amount": big.NewRat(int64(100*i+5), 100), "at": at, "method": "CARD"}
				text, id := avroPaymentV1, id1
				if i%2 == 1 {
					text, id, v["currency"], v["method"] = avroPaymentV2, id2, "USD", "IBAN"
				} else {
					v["memo"] = "first"
				}
				b, err := avro.Marshal(avro.MustParse(text), v)
				if err != nil {
					t.Fatal(err)
				}
				recs = append(recs, wire.NewRecord(topic, eventID(i), registrytest.Frame(t, id, nil, b)))
			}
			again := *recs[3] // a redelivery: a record of its own (the client writes into each record it produces)
			again.Headers = slices.Clone(again.Headers)
			recs = append(recs, &again)
			recs = append(recs, wire.NewRecord(topic, eventID(99), registrytest.Frame(t, 424242, nil, []byte{2, 'x'})))
			truncated := slices.Clone(recs[0].Value[:len(recs[0].Value)-4]) // a v1 body cut short
			recs = append(recs, wire.NewRecord(topic, eventID(98), truncated))
			cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			if err := cl.ProduceSync(t.Context(), recs...).FirstErr(); err != nil {
				t.Fatal(err)
			}

			cmd, stderr, exited := startRun(t, bin, "run", "--config", config)
			waitApplied(t, pool, schema, topic, len(recs), exited, stderr)
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if err := <-exited; err != nil {
				exited <- err
				t.Fatalf("onceflow run after SIGTERM: %v\n%s", err, stderr.String())
			}
			exited <- nil
			for _, tc := range []struct {
				name string
				sql  string
				want int64
			}{
				{"rows", `SELECT count(*) FROM ` + schema + `.payments`, n},
				{"distinct events", `SELECT count(DISTINCT event_id) FROM ` + schema + `.payments`, n},
				{"amounts in cents", `SELECT sum(amount * 100)::bigint FROM ` + schema + `.payments`, 100*45 + 5*n},
				{"timestamps", `SELECT count(*) FROM ` + schema + `.payments WHERE at = '2026-03-01 12:00:00.25+00'`, n},
				{"v1 rows: memo, no currency", `SELECT count(*) FROM ` + schema + `.payments WHERE memo = 'first' AND currency IS NULL AND method = 'CARD'`, n / 2},
				{"v2 rows: currency, no memo", `SELECT count(*) FROM ` + schema + `.payments WHERE currency = 'USD' AND memo IS NULL AND method = 'IBAN'`, n / 2},
				{"dead letter naming the schema id", `SELECT count(*) FROM ` + schema + `.dead_letters WHERE reason LIKE '%schema id 424242%'`, 1},
				{"dead letter of the truncated body", `SELECT count(*) FROM ` + schema + `.dead_letters WHERE reason LIKE '%schema id ` + fmt.Sprint(id1) + ` %'`, 1},
			} {
				if got := sinktest.Count(t, pool, tc.sql); got != tc.want {
					t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
				}
			}

			// onceflow audit shows each dead letter's schema id, and the
			// subject where the registry named it (the real registry keeps
			// one schema under the subjects of every run that registered it,
			// and names one of them).
			for _, c := range []struct {
				event       int
				id          int
				subjectKnow bool // the registry knows the id: a subject is named
			}{{99, 424242, false}, {98, id1, true}} {
				out, err := exec.Command(bin, "audit", "--config", config, uuid.UUID(eventID(c.event)).String()).Output()
				if err != nil {
					t.Fatalf("onceflow audit of event %d: %v", c.event, err)
				}
				var a struct {
					DeadLetters []struct {
						Reason   string `json:"reason"`
						SchemaID int    `json:"schema_id"`
						Subject  string `json:"subject"`
					} `json:"dead_letters"`
				}
				if err := json.Unmarshal(out, &a); err != nil || len(a.DeadLetters) != 1 {
					t.Fatalf("onceflow audit of event %d: %v\n%s", c.event, err, out)
				}
				d := a.DeadLetters[0]
				named := c.subjectKnow && strings.HasPrefix(d.Subject, "payments-") && strings.HasSuffix(d.Subject, "-value") &&
					strings.Contains(d.Reason, "(subject "+d.Subject+")")
				if d.SchemaID != c.id || named != c.subjectKnow || (!c.subjectKnow && d.Subject != "") {
					t.Errorf("audit of event %d: schema_id %d subject %q (reason %q); want schema id %d, a subject named: %v", c.event, d.SchemaID, d.Subject, d.Reason, c.id, c.subjectKnow)
				}
			}
		})
	}
}

func eventID(i int) [16]byte {
	var id [16]byte
	copy(id[:], fmt.Sprintf("avro-event-%05d", i))
	return id
}

// A registry refusing the credentials ends run at once, naming the keys;
// the password is not in the error.
func TestRunSchemaRegistryRefusesCredentials(t *testing.T) {
	dsn := sinktest.DSN(t)
	pool := sinktest.Pool(t)
	schema := freshSchema(t, pool, "test_sr_auth_")
	fake := srfake.New(srfake.WithAuth("Basic b25jZWZsb3c6cmlnaHQ=")) // onceflow:right
	defer fake.Close()
	file := writeConfig(t, fmt.Sprintf(`kafka:
  brokers: [127.0.0.1:1]
decode:
  format: avro
  schema_registry:
    url: %s
    username: onceflow
postgres:
  dsn: %s
  schema: %s
http:
  addr: 127.0.0.1:0
`, fake.URL(), dsn, schema))
	t.Setenv("ONCEFLOW_DECODE_SCHEMA_REGISTRY_PASSWORD", "wrong-password")
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	root := newRoot()
	root.SetOut(io.Discard)
	root.SetErr(io.Discard)
	root.SetArgs([]string{"run", "--config", file})
	err := root.ExecuteContext(ctx)
	if ctx.Err() != nil {
		t.Fatalf("run waited instead of failing: %v", err)
	}
	if err == nil || !strings.Contains(err.Error(), "refused the credentials") || !strings.Contains(err.Error(), "decode.schema_registry.password") {
		t.Fatalf("run: %v, want an error saying the registry refused the credentials and naming decode.schema_registry.password", err)
	}
	if n := strings.Count(err.Error(), "check decode.schema_registry"); n != 1 {
		t.Errorf("the error names the keys to check %d times, want once: %v", n, err)
	}
	if strings.Contains(err.Error(), "wrong-password") {
		t.Errorf("the error reveals the password: %v", err)
	}
}

// onceflow produce --format avro|protobuf registers the schema and sends
// framed records that a registry.Decoder reads back as the JSON given.
func TestBinaryProducesFramedRecords(t *testing.T) {
	bin := onceflowBinary(t)
	regs := registrytest.Registries(t)
	url := regs["srfake"]
	if u, ok := regs["real"]; ok {
		url = u
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	seeds := c.ListenAddrs()
	dir := t.TempDir()
	avsc, proto := filepath.Join(dir, "payment.avsc"), filepath.Join(dir, "payment.proto")
	if err := os.WriteFile(avsc, []byte(avroPaymentV2), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(proto, []byte("syntax = \"proto3\";\npackage shop;\nmessage Payment { string account = 1; int32 cents = 2; }\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// An import beside the schema, in a directory no other run uses: it is
	// registered under its import path, and the registry is shared.
	pkg := "t" + randomHex(6)
	imported := filepath.Join(dir, "order.proto")
	if err := os.MkdirAll(filepath.Join(dir, pkg), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, pkg, "money.proto"), []byte("syntax = \"proto3\";\npackage common;\nmessage Money { string currency = 1; int64 units = 2; }\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(imported, []byte("syntax = \"proto3\";\npackage shop;\nimport \""+pkg+"/money.proto\";\nmessage Order { message Line { string sku = 1; common.Money price = 2; } repeated Line lines = 1; }\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, format string
		args         []string
		value        string
	}{
		{"avro", "avro", []string{"--schema", avsc}, `{"account":"acct-1","amount":12.50,"at":"2026-03-01T12:00:00.250Z","method":"IBAN","currency":"USD"}`},
		{"protobuf", "protobuf", []string{"--schema", proto, "--message", "Payment"}, `{"account":"acct-2","cents":1250}`},
		{"protobuf importing a file beside it", "protobuf", []string{"--schema", imported, "--message", "Order.Line"}, `{"sku":"s1","price":{"currency":"EUR","units":"5"}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			topic := "produce-" + tc.format + "-" + randomHex(4)
			createTopic(t, seeds, topic, 1)
			config := writeConfig(t, fmt.Sprintf("kafka:\n  brokers: [%s]\n  topics: [%s]\ndecode:\n  format: %s\n  schema_registry:\n    url: %s\n",
				strings.Join(seeds, ", "), topic, tc.format, url))
			args := append([]string{"produce", "--config", config, "--topic", topic, "--format", tc.format}, tc.args...)
			out, err := exec.Command(bin, append(args, tc.value)...).CombinedOutput()
			if err != nil {
				t.Fatalf("onceflow produce: %v\n%s", err, out)
			}
			cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			var rec *kgo.Record
			for rec == nil && ctx.Err() == nil {
				cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { rec = r })
			}
			if rec == nil {
				t.Fatal("no record within 30s")
			}
			d, err := schemaregistry.New(schemaregistry.Config{URL: url})
			if err != nil {
				t.Fatal(err)
			}
			got, err := d.Decode(t.Context(), schemaregistry.Kind(tc.format), rec.Value)
			if err != nil {
				t.Fatal(err)
			}
			if g, w := jsonCompact(t, got), jsonCompact(t, []byte(tc.value)); g != w {
				t.Errorf("decoded %s, want %s", g, w)
			}
		})
	}
}

// TestProduceSchemaNeedsFormat: --schema, --message or --subject without
// --format is refused, not ignored (the values would go out unencoded).
func TestProduceSchemaNeedsFormat(t *testing.T) {
	file := writeConfig(t, "kafka:\n  brokers: [127.0.0.1:1]\n  topics: [t]\n")
	for _, args := range [][]string{{"--schema", "order.avsc"}, {"--message", "Order"}, {"--subject", "s"}} {
		root := newRoot()
		root.SetOut(io.Discard)
		root.SetErr(io.Discard)
		root.SetArgs(append([]string{"produce", "--config", file}, append(args, `{"a":1}`)...))
		err := root.ExecuteContext(t.Context())
		if err == nil || !strings.Contains(err.Error(), "need --format") {
			t.Errorf("produce %v: %v, want an error saying it needs --format", args, err)
		}
	}
}

func jsonCompact(t *testing.T, b []byte) string {
	t.Helper()
	var v any
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		t.Fatalf("not JSON: %s", b)
	}
	out, _ := json.Marshal(v)
	return string(out)
}
