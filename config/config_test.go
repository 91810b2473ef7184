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
