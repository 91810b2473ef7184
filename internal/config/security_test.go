package config

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writePEMs writes a self-signed certificate and its key in dir and
// returns their paths.
func writePEMs(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	for f, b := range map[string]*pem.Block{certFile: {Type: "CERTIFICATE", Bytes: der}, keyFile: {Type: "EC PRIVATE KEY", Bytes: kder}} {
		if err := os.WriteFile(f, pem.EncodeToMemory(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return certFile, keyFile
}

func writeSecret(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// kafka.tls and kafka.sasl load from file and environment, the password
// from a file or the environment, and build the client options.
func TestLoadKafkaSecurity(t *testing.T) {
	cert, key := writePEMs(t, t.TempDir())
	pwFile := writeSecret(t, "from-file-pw\n")
	for _, tc := range []struct {
		name, yaml string
		env        map[string]string
		wantPW     string
		wantOpts   int
	}{
		{name: "plaintext", yaml: "", wantOpts: 0},
		{name: "tls only", yaml: fmt.Sprintf("kafka:\n  tls:\n    enabled: true\n    ca_file: %s\n", cert), wantOpts: 1},
		{name: "mutual tls and scram from a file",
			yaml: fmt.Sprintf("kafka:\n  tls:\n    enabled: true\n    ca_file: %s\n    cert_file: %s\n    key_file: %s\n    server_name: broker.example\n"+
				"  sasl:\n    mechanism: SCRAM-SHA-512\n    username: u\n    password_file: %s\n", cert, cert, key, pwFile),
			wantPW: "from-file-pw", wantOpts: 2},
		{name: "plain with the password in the environment", yaml: "kafka:\n  sasl:\n    mechanism: PLAIN\n    username: u\n",
			env: map[string]string{"ONCEFLOW_KAFKA_SASL_PASSWORD": "from-env-pw"}, wantPW: "from-env-pw", wantOpts: 1},
		{name: "scram-sha-256 lower case, all from the environment",
			env: map[string]string{"ONCEFLOW_KAFKA_SASL_MECHANISM": "scram-sha-256", "ONCEFLOW_KAFKA_SASL_USERNAME": "u",
				"ONCEFLOW_KAFKA_SASL_PASSWORD_FILE": pwFile, "ONCEFLOW_KAFKA_TLS_ENABLED": "true"},
			wantPW: "from-file-pw", wantOpts: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			file := ""
			if tc.yaml != "" {
				file = writeFile(t, tc.yaml)
			}
			cfg, err := Load(file, nil, nil, handlers)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if got := cfg.Kafka.SASL.Password.Reveal(); got != tc.wantPW {
				t.Errorf("password = %q, want %q", got, tc.wantPW)
			}
			opts, err := cfg.Kafka.ClientOptions()
			if err != nil {
				t.Fatalf("ClientOptions: %v", err)
			}
			if len(opts) != tc.wantOpts {
				t.Errorf("%d client options, want %d", len(opts), tc.wantOpts)
			}
		})
	}
}

// Every problem of kafka.tls, kafka.sasl and the …_file keys names its
// key, and none shows a password.
func TestLoadKafkaSecurityProblems(t *testing.T) {
	dir := t.TempDir()
	cert, key := writePEMs(t, dir)
	notPEM := writeSecret(t, "not a certificate")
	pwFile := writeSecret(t, "s3cret-in-file")
	missing := filepath.Join(dir, "missing")
	for _, tc := range []struct {
		name, yaml string
		env        map[string]string
		want       []string
	}{
		{name: "tls keys without tls", yaml: fmt.Sprintf("kafka:\n  tls:\n    ca_file: %s\n    insecure_skip_verify: true\n", cert),
			want: []string{"kafka.tls.ca_file: is set but kafka.tls.enabled is false", "kafka.tls.insecure_skip_verify: is set but kafka.tls.enabled is false"}},
		{name: "unreadable ca", yaml: fmt.Sprintf("kafka:\n  tls:\n    enabled: true\n    ca_file: %s\n", missing),
			want: []string{"kafka.tls.ca_file: open " + missing}},
		{name: "ca not pem", yaml: fmt.Sprintf("kafka:\n  tls:\n    enabled: true\n    ca_file: %s\n", notPEM),
			want: []string{"kafka.tls.ca_file: no PEM certificate in " + notPEM}},
		{name: "cert without key", yaml: fmt.Sprintf("kafka:\n  tls:\n    enabled: true\n    cert_file: %s\n", cert),
			want: []string{"kafka.tls.key_file: is required with kafka.tls.cert_file"}},
		{name: "key is no key", yaml: fmt.Sprintf("kafka:\n  tls:\n    enabled: true\n    cert_file: %s\n    key_file: %s\n", key, cert),
			want: []string{"kafka.tls.cert_file, kafka.tls.key_file: tls:"}},
		{name: "unknown mechanism", yaml: "kafka:\n  sasl:\n    mechanism: GSSAPI\n    username: u\n    password: s3cret\n",
			want: []string{`kafka.sasl.mechanism: "GSSAPI" is not PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512`}},
		{name: "scram without user and password", yaml: "kafka:\n  sasl:\n    mechanism: SCRAM-SHA-256\n",
			want: []string{"kafka.sasl.username: is required with kafka.sasl.mechanism SCRAM-SHA-256",
				"kafka.sasl.password: is required with kafka.sasl.mechanism SCRAM-SHA-256 (or kafka.sasl.password_file, or ONCEFLOW_KAFKA_SASL_PASSWORD)"}},
		{name: "credentials without mechanism", yaml: "kafka:\n  sasl:\n    username: u\n    password: s3cret\n",
			want: []string{"kafka.sasl.username: is set but kafka.sasl.mechanism is empty", "kafka.sasl.password: is set but kafka.sasl.mechanism is empty"}},
		{name: "password twice", yaml: fmt.Sprintf("kafka:\n  sasl:\n    mechanism: PLAIN\n    username: u\n    password_file: %s\n", pwFile),
			env:  map[string]string{"ONCEFLOW_KAFKA_SASL_PASSWORD": "s3cret"},
			want: []string{"kafka.sasl.password_file: kafka.sasl.password is set too; set one of them"}},
		{name: "unreadable password file", yaml: fmt.Sprintf("kafka:\n  sasl:\n    mechanism: PLAIN\n    username: u\n    password_file: %s\n", missing),
			want: []string{"kafka.sasl.password_file: open " + missing}},
		{name: "dsn with an unreadable root certificate", yaml: "postgres:\n  dsn: postgres://u:s3cret@h/db?sslmode=verify-full&sslrootcert=" + missing + "\n",
			want: []string{"postgres.dsn: postgres://u:xxxxx@h/db?sslmode=verify-full&sslrootcert=" + missing + ": TLS settings: unable to read CA file: open " + missing}},
		{name: "dsn twice", yaml: fmt.Sprintf("postgres:\n  dsn: postgres://u:s3cret@h/db\n  dsn_file: %s\n", pwFile),
			want: []string{"postgres.dsn_file: postgres.dsn is set too; set one of them"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			_, err := Load(writeFile(t, tc.yaml), nil, nil, handlers)
			if err == nil {
				t.Fatal("Load: no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("error reveals a secret:\n%v", err)
			}
		})
	}
}

// postgres.dsn_file replaces the default DSN; its content is a secret in
// every dump.
func TestLoadDSNFile(t *testing.T) {
	ca, _ := writePEMs(t, t.TempDir())
	dsn := "postgres://u:s3cret@127.0.0.1:5443/db?sslmode=verify-full&sslrootcert=" + ca
	cfg, err := Load(writeFile(t, "postgres:\n  dsn_file: "+writeSecret(t, dsn+"\n")+"\n"), nil, nil, handlers)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Postgres.DSN != dsn {
		t.Errorf("dsn = %q, want the file's %q", cfg.Postgres.DSN, dsn)
	}
}

// The loaded configuration, printed, logged or encoded in any way, shows
// neither the SASL password nor the DSN's password; the TLS settings of
// the DSN stay visible.
func TestConfigDumpsRedactSecrets(t *testing.T) {
	ca, _ := writePEMs(t, t.TempDir())
	t.Setenv("ONCEFLOW_KAFKA_SASL_PASSWORD", "kafka-s3cret")
	t.Setenv("ONCEFLOW_POSTGRES_DSN", "postgres://u:pg-s3cret@127.0.0.1:5443/db?sslmode=verify-full&sslrootcert="+ca)
	cfg, err := Load(writeFile(t, "kafka:\n  sasl:\n    mechanism: SCRAM-SHA-256\n    username: u\n"), nil, nil, handlers)
	if err != nil {
		t.Fatal(err)
	}
	var text, js bytes.Buffer
	slog.New(slog.NewTextHandler(&text, nil)).Info("config", "config", cfg, "password", cfg.Kafka.SASL.Password, "sasl", cfg.Kafka.SASL)
	slog.New(slog.NewJSONHandler(&js, nil)).Info("config", "config", cfg, "password", cfg.Kafka.SASL.Password, "sasl", cfg.Kafka.SASL)
	encoded, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	saslJSON, err := json.Marshal(cfg.Kafka.SASL)
	if err != nil {
		t.Fatal(err)
	}
	dumps := map[string]string{
		"String": cfg.String(), "%v": fmt.Sprintf("%v", cfg), "%+v": fmt.Sprintf("%+v", cfg), "%#v": fmt.Sprintf("%#v", cfg),
		"%s": fmt.Sprintf("%s", cfg), "%q password": fmt.Sprintf("%q", cfg.Kafka.SASL.Password),
		"%+v sasl": fmt.Sprintf("%+v", cfg.Kafka.SASL), "%#v sasl": fmt.Sprintf("%#v", cfg.Kafka.SASL),
		"%x password": fmt.Sprintf("%x", cfg.Kafka.SASL.Password),
		"slog text":   text.String(), "slog json": js.String(), "json": string(encoded), "json sasl": string(saslJSON),
	}
	for name, d := range dumps {
		if strings.Contains(d, "s3cret") || strings.Contains(d, "6b61666b612d73337") { // hex of kafka-s3cret
			t.Errorf("%s reveals a secret: %s", name, d)
		}
		if !strings.Contains(d, "xxxxx") {
			t.Errorf("%s shows no redaction: %s", name, d)
		}
	}
	if s := cfg.String(); !strings.Contains(s, "sslmode=verify-full") || !strings.Contains(s, "sslrootcert=") {
		t.Errorf("String lost the DSN's TLS settings: %s", s)
	}
	if got := cfg.Kafka.SASL.Password.Reveal(); got != "kafka-s3cret" {
		t.Errorf("Reveal = %q", got)
	}
}

func TestRedactDSNParameters(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"postgres://u@h/db?password=pw&sslmode=verify-full", "postgres://u@h/db?password=xxxxx&sslmode=verify-full"},
		{"postgres://u:pw@h/db?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.crt&sslpassword=kp",
			"postgres://u:xxxxx@h/db?sslmode=verify-full&sslpassword=xxxxx&sslrootcert=%2Fetc%2Fca.crt"},
		{"postgres://u:pw@h/db?sslmode=verify-full&sslrootcert=/etc/ca.crt", "postgres://u:xxxxx@h/db?sslmode=verify-full&sslrootcert=/etc/ca.crt"},
		{"host=h sslmode=verify-full sslpassword=kp password=pw", "host=h sslmode=verify-full sslpassword=xxxxx password=xxxxx"},
	} {
		if got := RedactDSN(tc.in); got != tc.want {
			t.Errorf("RedactDSN(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// config.example.yaml documents every key of this file with its default,
// and loads.
func TestExampleDocumentsSecurityKeys(t *testing.T) {
	cfg, err := Load("../../config.example.yaml", nil, nil, handlers)
	if err != nil {
		t.Fatalf("config.example.yaml: %v", err)
	}
	if cfg.Kafka.TLS != (KafkaTLS{}) || cfg.Kafka.SASL != (KafkaSASL{}) || cfg.Postgres.DSNFile != "" {
		t.Errorf("config.example.yaml: security keys differ from their defaults: %+v %+v", cfg.Kafka.TLS, cfg.Kafka.SASL)
	}
	example, err := os.ReadFile("../../config.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for key := range securityDefaults {
		parts := strings.Split(key, ".")
		if !strings.Contains(string(example), "\n"+strings.Repeat("  ", len(parts)-1)+parts[len(parts)-1]+":") {
			t.Errorf("config.example.yaml lacks %s", key)
		}
	}
}
