package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "onceflow.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// handlers is the program's default for the handlers key, as main passes it.
var handlers = Default{Key: "handlers", Value: []string{"emailHandler", "inventoryHandler"}}

func TestLoadDefaultsAreValid(t *testing.T) {
	cfg, err := Load("", nil, nil, handlers)
	if err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if cfg.Batch.MaxRecords != 1000 || cfg.Kafka.Group != "onceflow" || len(cfg.Handlers) != 2 {
		t.Errorf("defaults = %+v", cfg)
	}
}

// No dead-letter topic unless one is named: a default topic fits only the
// topic it was named after (orders.dlq did not exist for a config of
// payments), so by default dead letters stay in the dead_letters table.
func TestDeadLetterTopicDefaultIsNone(t *testing.T) {
	file := writeFile(t, "kafka:\n  topics: [payments]\n")
	cfg, err := Load(file, nil, nil, handlers)
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Kafka.DeadLetterTopic; got != "" {
		t.Errorf("kafka.dead_letter_topic = %q for topics [payments] and no key, want \"\" (the table only)", got)
	}
}

// Without a program's default, handlers is empty, which is invalid; a
// default for a key that does not exist is a problem too.
func TestLoadDefaults(t *testing.T) {
	if _, err := Load("", nil, nil); err == nil || !strings.Contains(err.Error(), "handlers: at least one handler is required") {
		t.Errorf("no handlers: err = %v", err)
	}
	if _, err := Load("", nil, nil, handlers, Default{Key: "handler", Value: "x"}); err == nil ||
		!strings.Contains(err.Error(), "default for handler: no such setting") {
		t.Errorf("unknown key: err = %v", err)
	}
}

func TestLoadPrecedence(t *testing.T) {
	file := writeFile(t, "kafka:\n  group: from-file\n  brokers: [file:9092]\nbatch:\n  linger: 5ms\n")
	t.Setenv("ONCEFLOW_KAFKA_GROUP", "from-env")
	t.Setenv("ONCEFLOW_KAFKA_BROKERS", "a:9092,b:9093")
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	fs.String("group", "", "")
	if err := fs.Parse([]string{"--group=from-flag"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(file, fs, []Flag{{Name: "group", Key: "kafka.group"}}, handlers)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, got, want string }{
		{"group: flag over env over file", cfg.Kafka.Group, "from-flag"},
		{"brokers: env list", strings.Join(cfg.Kafka.Brokers, ","), "a:9092,b:9093"},
		{"linger: file", cfg.Batch.Linger.String(), (5 * time.Millisecond).String()},
	} {
		if tc.got != tc.want {
			t.Errorf("%s = %q, want %q", tc.name, tc.got, tc.want)
		}
	}
}

func TestLoadListsEveryProblem(t *testing.T) {
	for _, tc := range []struct {
		name string
		file string
		env  map[string]string
		want []string
	}{
		{
			name: "misspelled key",
			file: "kafka:\n  bokers: [x:1]\n",
			want: []string{"bokers"},
		},
		{
			name: "bad values",
			file: "kafka:\n  brokers: [localhost]\nbatch:\n  max_records: 0\nlog:\n  level: loud\nhandlers: [emailHandler, smsHandler, emailHandler]\n",
			want: []string{`kafka.brokers: "localhost" is not host:port`, "batch.max_records: must be 1..100000, got 0",
				`log.level: "loud"`, `handlers: handler "emailHandler" listed twice`},
		},
		{
			name: "fetch sizes",
			file: "kafka:\n  fetch_max_bytes: 1048576\n  fetch_max_partition_bytes: 2097152\n",
			want: []string{"kafka.fetch_max_partition_bytes: must be 1024..kafka.fetch_max_bytes (1048576), got 2097152"},
		},
		{
			name: "fetch size over the limit",
			env:  map[string]string{"ONCEFLOW_KAFKA_FETCH_MAX_BYTES": "209715200"},
			want: []string{"kafka.fetch_max_bytes: must be 1024..104857600, got 209715200"},
		},
		{
			name: "group protocol and instance id",
			file: "kafka:\n  group_protocol: next-gen\n  instance_id: \"pod 0/a\"\n",
			want: []string{`kafka.group_protocol: "next-gen" is not classic or consumer`,
				`kafka.instance_id: "pod 0/a" has ' ': only [a-zA-Z0-9._-] are allowed`},
		},
		{
			name: "instance id too long",
			env:  map[string]string{"ONCEFLOW_KAFKA_INSTANCE_ID": strings.Repeat("a", 250)},
			want: []string{"kafka.instance_id: \"" + strings.Repeat("a", 250) + "\" is 250 characters, more than 249"},
		},
		{
			name: "commit interval below the client's floor",
			file: "kafka:\n  commit_interval: 50ms\n",
			want: []string{"kafka.commit_interval: 50ms is below 100ms"},
		},
		{
			name: "a duration without a unit",
			file: "dedup:\n  retention: 604800\n",
			want: []string{"'dedup.retention' 604800 is a number without a unit"},
		},
		{
			name: "retention too short, slices out of range",
			file: "dedup:\n  retention: 500ms\n  retention_slices: 25\n",
			want: []string{"dedup.retention: must be 0 (keep the dedup state forever) or at least 1s, got 500ms",
				"dedup.retention_slices: must be between 1 and 24, got 25"},
		},
		{
			name: "unknown environment variable",
			env:  map[string]string{"ONCEFLOW_KAFKA_BROKRES": "x:1"},
			want: []string{"ONCEFLOW_KAFKA_BROKRES: no such setting"},
		},
		{
			name: "wrong type",
			file: "batch:\n  linger: soon\n",
			want: []string{"linger"},
		},
		{
			// A value that does not decode names where it came from: the
			// variable, not the file beside it.
			name: "environment values that do not decode",
			file: "log:\n  level: info\n",
			env:  map[string]string{"ONCEFLOW_BATCH_MAX_RECORDS": "abc", "ONCEFLOW_DEDUP_RETENTION": "forever"},
			want: []string{"environment ONCEFLOW_BATCH_MAX_RECORDS: 'batch.max_records' cannot parse",
				"environment ONCEFLOW_DEDUP_RETENTION: 'dedup.retention'"},
		},
		{
			name: "dsn password stays secret",
			env:  map[string]string{"ONCEFLOW_POSTGRES_DSN": "postgres://u:s3cret@host:notaport/db"},
			want: []string{"postgres.dsn"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			file := ""
			if tc.file != "" {
				file = writeFile(t, tc.file)
			}
			_, err := Load(file, nil, nil, handlers)
			if err == nil {
				t.Fatal("Load accepted an invalid config")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not mention %q:\n%v", w, err)
				}
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("error reveals the password: %v", err)
			}
		})
	}
}

// sql_handlers are read with their topics; when the user sets no
// handlers, the program's default handlers do not run beside them.
func TestLoadSQLHandlers(t *testing.T) {
	body := `kafka:
  topics: [payments, refunds]
sql_handlers:
  - name: ledger
    topics: [payments]
    sql: |
      INSERT INTO ledger SELECT event_id FROM events
  - name: audit
    sql: INSERT INTO audit SELECT event_id FROM events
decode:
  format: bytes
  event_id_source: offset
`
	for _, tc := range []struct {
		name     string
		extra    string
		handlers []string
	}{
		{"handlers unset", "", nil},
		{"handlers empty", "handlers: []\n", nil},
		{"handlers set", "handlers: [emailHandler]\n", []string{"emailHandler"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Load(writeFile(t, body+tc.extra), nil, nil, handlers)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(cfg.Handlers, ",") != strings.Join(tc.handlers, ",") {
				t.Errorf("handlers = %v, want %v", cfg.Handlers, tc.handlers)
			}
			if len(cfg.SQLHandlers) != 2 || cfg.SQLHandlers[0].Name != "ledger" || strings.Join(cfg.SQLHandlers[0].Topics, ",") != "payments" ||
				!strings.HasPrefix(cfg.SQLHandlers[0].SQL, "INSERT INTO ledger") || len(cfg.SQLHandlers[1].Topics) != 0 {
				t.Errorf("sql_handlers = %+v", cfg.SQLHandlers)
			}
			if cfg.Decode.Format != "bytes" || cfg.Decode.EventIDSource != "offset" || cfg.Decode.EventIDHeader != "event_id" {
				t.Errorf("decode = %+v", cfg.Decode)
			}
		})
	}
}

func TestLoadSQLHandlerProblems(t *testing.T) {
	file := writeFile(t, `kafka:
  topics: [orders]
handlers: [emailHandler]
sql_handlers:
  - name: emailHandler
    sql: SELECT 1
  - name: dup
    sql: SELECT 1
  - name: dup
    sql: " "
    topics: [ordres]
  - sql: SELECT 1
    topic: [orders]
decode:
  format: xml
  event_id_source: body
`)
	_, err := Load(file, nil, nil, handlers)
	if err == nil {
		t.Fatal("Load accepted an invalid config")
	}
	// The misspelled item key is a decoding problem, reported alone.
	if !strings.Contains(err.Error(), "'sql_handlers[3]' has invalid keys: topic") {
		t.Errorf("error does not mention the misspelled key topic:\n%v", err)
	}
	file = writeFile(t, `kafka:
  topics: [orders]
handlers: [emailHandler]
sql_handlers:
  - name: emailHandler
    sql: SELECT 1
  - name: dup
    sql: SELECT 1
  - name: dup
    sql: " "
    topics: [ordres]
  - sql: SELECT 1
decode:
  format: xml
  event_id_source: body
`)
	_, err = Load(file, nil, nil, handlers)
	if err == nil {
		t.Fatal("Load accepted an invalid config")
	}
	for _, w := range []string{
		`sql_handlers[0].name: "emailHandler" is also in handlers`,
		`sql_handlers[2].name: "dup" is used twice`,
		`sql_handlers[2].sql: is required`,
		`sql_handlers[2].topics: "ordres" is not a consumed topic`,
		`sql_handlers[3].name: is required`,
		`decode.format: "xml" is not json, bytes, avro or protobuf`,
		`decode.event_id_source: "body" is not one of header, field, key, offset`,
	} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error does not mention %q:\n%v", w, err)
		}
	}
}

func TestLoadDecodeProblems(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{"decode:\n  event_id_field: id\n", `decode.event_id_field: "id" is set but decode.event_id_source is header`},
		{"decode:\n  event_id_source: field\n", "decode.event_id_field: is required with decode.event_id_source field"},
		{"decode:\n  event_id_source: field\n  event_id_field: id\n  format: bytes\n", "decode.event_id_source: field needs decode.format json"},
		{"decode:\n  event_id_header: \"\"\n", "decode.event_id_header: is required"},
	} {
		_, err := Load(writeFile(t, tc.file), nil, nil, handlers)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error = %v, want it to mention %q", tc.file, err, tc.want)
		}
	}
}

func TestRedactDSN(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"postgres://u:pw@h:5432/db?sslmode=disable", "postgres://u:xxxxx@h:5432/db?sslmode=disable"},
		{"host=h user=u password=pw dbname=d", "host=h user=u password=xxxxx dbname=d"},
		{"postgres://h/db", "postgres://h/db"},
	} {
		if got := RedactDSN(tc.in); got != tc.want {
			t.Errorf("RedactDSN(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// The documented example loads as it is, and names every key.
func TestExampleConfigLoads(t *testing.T) {
	if _, err := Load("../../config.example.yaml", nil, nil, handlers); err != nil {
		t.Fatalf("config.example.yaml: %v", err)
	}
	body, err := os.ReadFile("../../config.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range Keys() {
		leaf := k[strings.LastIndex(k, ".")+1:]
		if !strings.Contains(string(body), leaf+":") {
			t.Errorf("config.example.yaml does not document %s", k)
		}
	}
}

// With only SQL handlers, a consumed topic none of them takes is a problem:
// its records would be skipped.
func TestLoadTopicWithoutHandler(t *testing.T) {
	file := writeFile(t, `kafka:
  topics: [payments, refunds]
sql_handlers:
  - name: ledger
    topics: [payments]
    sql: SELECT 1 FROM events
`)
	_, err := Load(file, nil, nil, handlers)
	if want := `kafka.topics: no handler consumes "refunds"`; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("error = %v, want it to mention %q", err, want)
	}
}

// A tx_timeout below the idle bound's default lowers the idle bound with
// it; an idle bound set above tx_timeout is still refused, naming it.
func TestShortTxTimeoutLowersTheIdleDefault(t *testing.T) {
	cfg, err := Load(writeFile(t, "postgres:\n  tx_timeout: 300ms\n"), nil, nil, handlers)
	if err != nil {
		t.Fatalf("tx_timeout 300ms alone: %v", err)
	}
	if cfg.Postgres.IdleTimeout != 300*time.Millisecond {
		t.Errorf("postgres.idle_in_transaction_timeout = %v, want 300ms (tx_timeout's)", cfg.Postgres.IdleTimeout)
	}
	_, err = Load(writeFile(t, "postgres:\n  tx_timeout: 300ms\n  idle_in_transaction_timeout: 1s\n"), nil, nil, handlers)
	if err == nil || !strings.Contains(err.Error(), "postgres.idle_in_transaction_timeout") {
		t.Errorf("idle 1s above tx_timeout 300ms: err = %v, want it named", err)
	}
}

// The heartbeat interval follows a short session unless it is set: a
// third of kafka.session_timeout, at most 3s; one set above a third of the
// session is refused, naming both keys, with the other problems.
func TestHeartbeatIntervalFollowsTheSession(t *testing.T) {
	for _, tc := range []struct {
		name string
		file string
		want time.Duration
	}{
		{"defaults", "", 3 * time.Second},
		{"a 3s session", "kafka:\n  session_timeout: 3s\n  rebalance_timeout: 15s\n", time.Second},
		{"a 45s session", "kafka:\n  session_timeout: 45s\n  rebalance_timeout: 60s\n", 3 * time.Second},
		{"set", "kafka:\n  session_timeout: 3s\n  heartbeat_interval: 500ms\n", 500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Load(writeFile(t, tc.file), nil, nil, handlers)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Kafka.HeartbeatInterval != tc.want {
				t.Errorf("kafka.heartbeat_interval = %v, want %v", cfg.Kafka.HeartbeatInterval, tc.want)
			}
		})
	}
	_, err := Load(writeFile(t, "kafka:\n  session_timeout: 3s\n  heartbeat_interval: 3s\nbatch:\n  max_records: 0\n"), nil, nil, handlers)
	for _, want := range []string{
		"kafka.heartbeat_interval: 3s is above a third of kafka.session_timeout 3s (1s)",
		"batch.max_records",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("heartbeat 3s with a 3s session: err = %v, want it to say %q", err, want)
		}
	}
	_, err = Load(writeFile(t, "kafka:\n  heartbeat_interval: 0s\n"), nil, nil, handlers)
	if err == nil || !strings.Contains(err.Error(), "kafka.heartbeat_interval: must be positive") {
		t.Errorf("heartbeat 0s: err = %v, want it refused", err)
	}
}
