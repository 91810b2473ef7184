package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/onceflow/onceflow/internal/config"
	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/sink/sinktest"
	"github.com/onceflow/onceflow/wire"
)

// EnvKafkaSecure names the client folder of a Kafka that clients reach only
// over SASL_SSL with a client certificate (infra/kafka-secure.sh client):
// brokers, ca.crt, client.crt, client.key, username, password. With CI set
// it must be, unless ONCEFLOW_TEST_KFAKE_ONLY is.
const EnvKafkaSecure = "ONCEFLOW_TEST_KAFKA_SECURE"

// secureKafka is the SASL_SSL broker's client folder, read.
type secureKafka struct {
	dir                    string
	brokers                []string
	ca, cert, key          string // file paths
	user, password, pwFile string
}

func secureBroker(t *testing.T) secureKafka {
	t.Helper()
	dir := os.Getenv(EnvKafkaSecure)
	if dir == "" {
		if os.Getenv("CI") != "" && os.Getenv("ONCEFLOW_TEST_KFAKE_ONLY") == "" {
			t.Fatalf("%s is not set and CI is: the suite must reach a SASL_SSL broker (infra/kafka-secure.sh start)", EnvKafkaSecure)
		}
		t.Skipf("%s not set: skipping a test that needs the SASL_SSL broker", EnvKafkaSecure)
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatalf("%s: %v", EnvKafkaSecure, err)
		}
		return strings.TrimSpace(string(b))
	}
	return secureKafka{dir: dir, brokers: strings.Split(read("brokers"), ","),
		ca: filepath.Join(dir, "ca.crt"), cert: filepath.Join(dir, "client.crt"), key: filepath.Join(dir, "client.key"),
		user: read("username"), password: read("password"), pwFile: filepath.Join(dir, "password")}
}

// client is a test's own client of the broker, built without package
// config: SCRAM-SHA-256 over TLS with the client certificate.
func (s secureKafka) client(t *testing.T, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	roots := x509.NewCertPool()
	pemCA, err := os.ReadFile(s.ca)
	if err != nil || !roots.AppendCertsFromPEM(pemCA) {
		t.Fatalf("CA %s: %v", s.ca, err)
	}
	cert, err := tls.LoadX509KeyPair(s.cert, s.key)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(s.brokers...), kgo.MetadataMinAge(100 * time.Millisecond),
		kgo.DialTLSConfig(&tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}),
		kgo.SASL(scram.Auth{User: s.user, Pass: s.password}.AsSha256Mechanism())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// topics creates a topic with partitions and its one-partition dead-letter
// topic, named for this test, and deletes them at cleanup.
func (s secureKafka) topics(t *testing.T, partitions int32) (topic, dlq string) {
	t.Helper()
	var r [4]byte
	_, _ = rand.Read(r[:])
	topic = "secure-" + hex.EncodeToString(r[:])
	dlq = topic + ".dlq"
	adm := kadm.NewClient(s.client(t))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for _, tp := range []struct {
		name string
		n    int32
	}{{topic, partitions}, {dlq, 1}} {
		resp, err := adm.CreateTopic(ctx, tp.n, 1, nil, tp.name)
		if err == nil {
			err = resp.Err
		}
		if err != nil {
			t.Fatalf("create topic %s over SASL_SSL: %v", tp.name, err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, topic, dlq)
	})
	return topic, dlq
}

// yaml is a config file's kafka section for the broker with mechanism,
// the password given by password_file.
func (s secureKafka) yaml(topic, dlq, group, mechanism string) string {
	return fmt.Sprintf(`kafka:
  brokers: [%s]
  topics: [%s]
  dead_letter_topic: %s
  group: %s
  tls:
    enabled: true
    ca_file: %s
    cert_file: %s
    key_file: %s
  sasl:
    mechanism: %s
    username: %s
    password_file: %s
`, strings.Join(s.brokers, ","), topic, dlq, group, s.ca, s.cert, s.key, mechanism, s.user, s.pwFile)
}

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "onceflow.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// `onceflow run`, configured by a file with kafka.tls and kafka.sasl
// (SCRAM-SHA-512, the password from a file), consumes from the SASL_SSL
// broker, applies each event once, dead-letters a bad record and publishes
// it to the dead-letter topic, and commits the group's offsets there.
func TestRunOverSASLSSL(t *testing.T) {
	k := secureBroker(t)
	dsn := sinktest.DSN(t)
	pool := sinktest.Pool(t)
	schema := freshSchema(t, pool, "test_secure_run_")
	topic, dlq := k.topics(t, 3)
	group := topic + "-group"

	stream, err := orders.Generate(300, 0.3, 12)
	if err != nil {
		t.Fatal(err)
	}
	recs := make([]*kgo.Record, 0, len(stream.Messages)+1)
	for _, m := range stream.Messages {
		recs = append(recs, wire.NewRecord(topic, m.ID, m.Value))
	}
	if err := k.client(t).ProduceSync(t.Context(), recs...).FirstErr(); err != nil {
		t.Fatalf("produce over SASL_SSL: %v", err)
	}
	file := writeConfig(t, k.yaml(topic, dlq, group, "SCRAM-SHA-512")+fmt.Sprintf(
		"postgres:\n  dsn: %s\n  schema: %s\nhttp:\n  addr: 127.0.0.1:0\nbatch:\n  linger: 10ms\nlog:\n  level: warn\n", dsn, schema))
	// The bad record through `onceflow produce`, over the same settings.
	bad := uuid.New()
	if out, err := runCLI(t, io.Discard, "produce", "--config", file, "--topic", topic,
		"--header", "event_id="+bad.String(), "not json"); err != nil {
		t.Fatalf("onceflow produce over SASL_SSL: %v\n%s", err, out)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stderr := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		root := newRoot()
		root.SetOut(io.Discard)
		root.SetErr(stderr)
		root.SetArgs([]string{"run", "--config", file})
		done <- root.ExecuteContext(ctx)
	}()

	// The dead letter reaches the dead-letter topic through the consumer's
	// own client.
	dl := k.client(t, kgo.ConsumeTopics(dlq), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	pctx, pcancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer pcancel()
	var got *kgo.Record
	for got == nil {
		fs := dl.PollFetches(pctx)
		if pctx.Err() != nil {
			select {
			case err := <-done:
				t.Fatalf("run returned early: %v\n%s", err, stderr)
			default:
			}
			t.Fatalf("no dead letter on %s within 90s\n%s", dlq, stderr)
		}
		fs.EachRecord(func(r *kgo.Record) { got = r })
	}
	if string(got.Value) != "not json" {
		t.Errorf("dead letter value = %q, want the bad record's", got.Value)
	}

	deadline := time.Now().Add(60 * time.Second)
	for {
		n := sinktest.Count(t, pool, `SELECT coalesce(sum(next_offset), 0)::bigint FROM `+schema+`.sink_offsets`)
		if n >= int64(len(recs)+1) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("run committed %d of %d records in 60s\n%s", n, len(recs), stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run after cancel: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not drain within 30s of cancel")
	}

	rep, err := orders.Check(t.Context(), pool, schema, stream.Unique)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.ExactlyOnce() {
		t.Errorf("effects not exactly once: %v", rep.Problems)
	}
	if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.dead_letters`); n != 1 {
		t.Errorf("%d dead letters, want 1", n)
	}
	// The group's offsets were committed to the SASL_SSL broker.
	committed, err := kadm.NewClient(k.client(t)).FetchOffsetsForTopics(t.Context(), group, topic)
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	committed.Each(func(o kadm.OffsetResponse) { sum += o.At })
	if want := int64(len(recs) + 1); sum != want { // the stream and the bad record
		t.Errorf("group %s committed offsets summing to %d, want %d", group, sum, want)
	}
	if strings.Contains(stderr.String(), k.password) {
		t.Errorf("the output reveals the SASL password:\n%s", stderr)
	}
}

// `onceflow serve` over SASL_SSL (SCRAM-SHA-256, the password from the
// environment): an order posted to the outbox is relayed to the broker and
// applied by the four handlers; nothing logged or served (/metrics,
// /readyz) shows the password.
func TestServeOverSASLSSL(t *testing.T) {
	k := secureBroker(t)
	dsn := sinktest.DSN(t)
	pool := sinktest.Pool(t)
	schema := freshSchema(t, pool, "test_secure_serve_")
	topic, dlq := k.topics(t, 2)

	y := strings.Replace(k.yaml(topic, dlq, topic+"-group", "SCRAM-SHA-256"), "    password_file: "+k.pwFile+"\n", "", 1)
	t.Setenv("ONCEFLOW_KAFKA_SASL_PASSWORD", k.password)
	cfg, err := config.Load(writeConfig(t, y), nil, nil, config.Default{Key: "handlers", Value: registry.names})
	if err != nil {
		t.Fatal(err)
	}
	security, err := cfg.Kafka.ClientOptions()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Postgres.DSN, cfg.Postgres.Schema, cfg.HTTP.Addr = dsn, schema, "127.0.0.1:0"
	cfg.Batch.Linger = 10 * time.Millisecond
	logs := &syncBuffer{}
	a := &app{cfg: cfg, log: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})), kafkaSecurity: security}
	a.log.Info("configuration", "config", cfg)
	ctx, cancel := context.WithCancel(context.Background())
	sv, err := a.startServe(ctx, serveOptions{})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	waitMigrated(t, sv)
	s := &seedServer{t: t, base: "http://" + sv.addr, logs: logs, pool: pool, schema: schema}
	id := "7f8a0000-0000-0000-0000-0000000005a5"
	if code, _, body := s.post(id, order); code != 200 {
		t.Fatalf("POST: %d %v", code, body)
	}
	s.audit(id, func(a map[string]any) bool { return len(processed(a)) == len(seedHandlers) })
	for _, path := range []string{"/metrics", "/readyz", "/healthz"} {
		resp, err := http.Get(s.base + path)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 {
			t.Errorf("GET %s: %d %s", path, resp.StatusCode, body)
		}
		if strings.Contains(string(body), k.password) {
			t.Errorf("GET %s reveals the SASL password", path)
		}
	}
	cancel()
	if err := sv.wait(); err != nil {
		t.Errorf("serve: %v", err)
	}
	if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.emails_sent`); n != 1 {
		t.Errorf("%d emails, want 1", n)
	}
	if strings.Contains(logs.String(), k.password) {
		t.Errorf("the logs reveal the SASL password:\n%s", logs)
	}
	if !strings.Contains(logs.String(), "xxxxx") {
		t.Errorf("the logged configuration shows no redacted password:\n%s", logs)
	}
}

// Each mechanism the config accepts reaches the broker; what waiting cannot
// cure fails at once, naming the keys to check and never the password.
func TestKafkaSecurityChecks(t *testing.T) {
	k := secureBroker(t)
	otherCA := writeOtherCA(t)
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string // "" for success
	}{
		{name: "PLAIN", env: map[string]string{"ONCEFLOW_KAFKA_SASL_MECHANISM": "PLAIN"}},
		{name: "SCRAM-SHA-256", env: map[string]string{"ONCEFLOW_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256"}},
		{name: "SCRAM-SHA-512", env: map[string]string{"ONCEFLOW_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512"}},
		{name: "wrong password", env: map[string]string{"ONCEFLOW_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512", "ONCEFLOW_KAFKA_SASL_PASSWORD": "wrong-" + k.password},
			want: `SASL authentication failed for user "` + k.user + `" with SCRAM-SHA-512 (check kafka.sasl.username and kafka.sasl.password)`},
		{name: "wrong PLAIN password", env: map[string]string{"ONCEFLOW_KAFKA_SASL_MECHANISM": "PLAIN", "ONCEFLOW_KAFKA_SASL_PASSWORD": "wrong-" + k.password},
			want: "SASL authentication failed"},
		{name: "unknown user", env: map[string]string{"ONCEFLOW_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256", "ONCEFLOW_KAFKA_SASL_USERNAME": "nobody"},
			want: `SASL authentication failed for user "nobody"`},
		{name: "untrusted broker certificate", env: map[string]string{"ONCEFLOW_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256", "ONCEFLOW_KAFKA_TLS_CA_FILE": otherCA},
			want: "TLS: the broker's certificate is not trusted (check kafka.tls.ca_file and kafka.tls.server_name)"},
		{name: "plaintext to the TLS listener", env: map[string]string{"ONCEFLOW_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256",
			"ONCEFLOW_KAFKA_TLS_ENABLED": "false", "ONCEFLOW_KAFKA_TLS_CA_FILE": "", "ONCEFLOW_KAFKA_TLS_CERT_FILE": "", "ONCEFLOW_KAFKA_TLS_KEY_FILE": ""},
			want: "TLS: the broker speaks TLS on this address (kafka.tls.enabled)"},
		{name: "wrong server name", env: map[string]string{"ONCEFLOW_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256", "ONCEFLOW_KAFKA_TLS_SERVER_NAME": "kafka.example.com"},
			want: "TLS: the broker's certificate is not trusted"},
		{name: "no client certificate", env: map[string]string{"ONCEFLOW_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256", "ONCEFLOW_KAFKA_TLS_CERT_FILE": "", "ONCEFLOW_KAFKA_TLS_KEY_FILE": ""},
			want: "TLS: the broker refused the handshake"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{"ONCEFLOW_KAFKA_BROKERS": strings.Join(k.brokers, ","), "ONCEFLOW_KAFKA_TLS_ENABLED": "true",
				"ONCEFLOW_KAFKA_TLS_CA_FILE": k.ca, "ONCEFLOW_KAFKA_TLS_CERT_FILE": k.cert, "ONCEFLOW_KAFKA_TLS_KEY_FILE": k.key,
				"ONCEFLOW_KAFKA_SASL_USERNAME": k.user, "ONCEFLOW_KAFKA_SASL_PASSWORD": k.password}
			for key, v := range tc.env {
				env[key] = v
			}
			for key, v := range env {
				t.Setenv(key, v)
			}
			cfg, err := config.Load("", nil, nil, config.Default{Key: "handlers", Value: registry.names})
			if err != nil {
				t.Fatal(err)
			}
			security, err := cfg.Kafka.ClientOptions()
			if err != nil {
				t.Fatal(err)
			}
			logs := &syncBuffer{}
			a := &app{cfg: cfg, log: slog.New(slog.NewTextHandler(logs, nil)), kafkaSecurity: security}
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			err = a.whenKafka(ctx, cfg.Kafka.Brokers)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("whenKafka: %v\n%s", err, logs)
			case tc.want != "" && err == nil:
				t.Fatalf("whenKafka: no error, want %q", tc.want)
			case tc.want != "" && ctx.Err() != nil:
				t.Fatalf("whenKafka waited instead of failing: %v\n%s", err, logs)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Errorf("error = %v\nwant it to contain %q", err, tc.want)
			}
			if err != nil && strings.Contains(err.Error(), k.password) {
				t.Errorf("the error reveals the password: %v", err)
			}
			if strings.Contains(logs.String(), k.password) {
				t.Errorf("the logs reveal the password:\n%s", logs)
			}
		})
	}
}

// `onceflow run` with a wrong SASL password ends at once with an error that
// names SASL authentication and the keys, not the password.
func TestRunWrongSASLPassword(t *testing.T) {
	k := secureBroker(t)
	dsn := sinktest.DSN(t)
	pool := sinktest.Pool(t)
	schema := freshSchema(t, pool, "test_secure_badpw_")
	wrong := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(wrong, []byte("not-"+k.password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	y := strings.Replace(k.yaml("orders", "orders.dlq", "secure-badpw", "SCRAM-SHA-256"), k.pwFile, wrong, 1)
	file := writeConfig(t, y+fmt.Sprintf("postgres:\n  dsn: %s\n  schema: %s\nhttp:\n  addr: 127.0.0.1:0\n", dsn, schema))
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
	if err == nil || !strings.Contains(err.Error(), "SASL authentication failed") || !strings.Contains(err.Error(), "kafka.sasl.password") {
		t.Fatalf("run: %v, want an error naming SASL authentication and kafka.sasl.password", err)
	}
	if strings.Contains(err.Error(), k.password) {
		t.Errorf("the error reveals the password: %v", err)
	}
}

// writeOtherCA writes a CA certificate that signed nothing the broker has.
func writeOtherCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "another CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "other-ca.crt")
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
