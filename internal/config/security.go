package config

// How onceflow reaches a secured cluster: Kafka TLS and SASL, secrets read
// from files, and the redaction that keeps every secret out of logs,
// errors and dumps. Postgres TLS needs no key of its own: it is the DSN's
// sslmode, sslrootcert, sslcert and sslkey, which pgx reads as they are.

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// KafkaTLS is kafka.tls: how onceflow dials the brokers over TLS. The
// schema registry's TLS (decode.schema_registry.tls) has the same keys.
type KafkaTLS struct {
	// Enabled dials every broker over TLS. The other keys need it.
	Enabled bool `mapstructure:"enabled"`
	// CAFile is a PEM file of the CAs that sign the brokers' certificates;
	// empty means the system's roots.
	CAFile string `mapstructure:"ca_file"`
	// CertFile and KeyFile are a PEM client certificate and its key, for
	// brokers that require one (ssl.client.auth=required); both or none.
	CertFile string `mapstructure:"cert_file"`
	KeyFile  string `mapstructure:"key_file"`
	// ServerName is the name checked in the brokers' certificates; empty
	// means the host of each broker's address.
	ServerName string `mapstructure:"server_name"`
	// InsecureSkipVerify accepts any broker certificate. For tests only:
	// it makes TLS worthless against an active attacker.
	InsecureSkipVerify bool `mapstructure:"insecure_skip_verify"`
}

// KafkaSASL is kafka.sasl: how onceflow authenticates to the brokers.
type KafkaSASL struct {
	// Mechanism is PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; empty means no
	// SASL. PLAIN sends the password as it is: use it with kafka.tls.
	Mechanism string `mapstructure:"mechanism"`
	Username  string `mapstructure:"username"`
	// Password is the user's password; give it in the environment
	// (ONCEFLOW_KAFKA_SASL_PASSWORD) or through PasswordFile rather than
	// in the config file.
	Password Secret `mapstructure:"password"`
	// PasswordFile is a file whose content (without its trailing newline)
	// is the password; Load reads it into Password. Setting both is an
	// error.
	PasswordFile string `mapstructure:"password_file"`
}

// SASL mechanisms kafka.sasl.mechanism accepts.
const (
	SASLPlain       = "PLAIN"
	SASLScramSHA256 = "SCRAM-SHA-256"
	SASLScramSHA512 = "SCRAM-SHA-512"
)

// securityDefaults are the keys of this file, with their defaults; they
// join the list of known keys at init.
var securityDefaults = map[string]any{
	"kafka.tls.enabled":              false,
	"kafka.tls.ca_file":              "",
	"kafka.tls.cert_file":            "",
	"kafka.tls.key_file":             "",
	"kafka.tls.server_name":          "",
	"kafka.tls.insecure_skip_verify": false,
	"kafka.sasl.mechanism":           "",
	"kafka.sasl.username":            "",
	"kafka.sasl.password":            "",
	"kafka.sasl.password_file":       "",
	"postgres.dsn_file":              "",
}

func init() { maps.Copy(defaults, securityDefaults) }

// Secret is a setting that is never shown: fmt (every verb), log/slog,
// encoding/json and encoding.TextMarshaler users print it as "xxxxx", or
// "" when it is empty. Reveal returns the value itself.
type Secret string

const redacted = "xxxxx"

// Reveal returns the secret's value, for the one place that uses it.
func (s Secret) Reveal() string { return string(s) }

func (s Secret) shown() string {
	if s == "" {
		return ""
	}
	return redacted
}

// String returns "xxxxx", or "" for an empty secret.
func (s Secret) String() string { return s.shown() }

// GoString is String, for %#v.
func (s Secret) GoString() string { return s.shown() }

// Format prints the redacted form whatever the verb.
func (s Secret) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(s.shown())) }

// LogValue is the redacted form, for log/slog.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.shown()) }

// MarshalText is the redacted form, for encoding/json and friends.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.shown()), nil }

// redactedConfig is Config without its methods, for printing.
type redactedConfig Config

func (c Config) redacted() redactedConfig {
	r := redactedConfig(c)
	r.Postgres.DSN = RedactDSN(c.Postgres.DSN)
	return r
}

// String prints the whole configuration with every secret redacted: the
// postgres.dsn password and each Secret.
func (c Config) String() string { return fmt.Sprintf("%+v", c.redacted()) }

// GoString is String, for %#v.
func (c Config) GoString() string { return c.String() }

// LogValue is the redacted configuration, for log/slog.
func (c Config) LogValue() slog.Value { return slog.StringValue(c.String()) }

// MarshalJSON encodes the configuration with every secret redacted.
func (c Config) MarshalJSON() ([]byte, error) { return json.Marshal(c.redacted()) }

// dsnTLSProblem is why pgx could not set up the DSN's TLS (an unreadable
// sslrootcert, sslcert or sslkey), or "" for any other parse error, whose
// details may quote the DSN with its password.
func dsnTLSProblem(err error) string {
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) && strings.Contains(pe.Error(), "failed to configure TLS") && pe.Unwrap() != nil {
		return "TLS settings: " + pe.Unwrap().Error()
	}
	return ""
}

// readSecretFiles reads the …_file keys into the settings they stand for
// and returns a problem for each file that cannot be read and each pair
// set twice. Its messages name the keys and files, never a content.
func (c *Config) readSecretFiles() []error {
	var ps []error
	read := func(key, path string) (string, bool) {
		b, err := os.ReadFile(path)
		if err != nil {
			ps = append(ps, fmt.Errorf("%s: %w", key, err))
			return "", false
		}
		return strings.TrimRight(string(b), "\r\n"), true
	}
	if f := c.Kafka.SASL.PasswordFile; f != "" {
		if c.Kafka.SASL.Password != "" {
			ps = append(ps, errors.New("kafka.sasl.password_file: kafka.sasl.password is set too; set one of them"))
		} else if s, ok := read("kafka.sasl.password_file", f); ok {
			c.Kafka.SASL.Password = Secret(s)
		}
	}
	// postgres.dsn has a default, so "set too" means set to another DSN.
	if f := c.Postgres.DSNFile; f != "" {
		if c.Postgres.DSN != DefaultDSN {
			ps = append(ps, errors.New("postgres.dsn_file: postgres.dsn is set too; set one of them"))
		} else if s, ok := read("postgres.dsn_file", f); ok {
			c.Postgres.DSN = s
		}
	}
	return ps
}

// validateSecurity returns the problems of kafka.tls and kafka.sasl, each
// naming its key. The files named are read, so that an unreadable CA or
// key fails the start, not the first connection.
func (k Kafka) validateSecurity() []error {
	var ps []error
	bad := func(key, format string, args ...any) {
		ps = append(ps, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
	}
	ps = append(ps, k.TLS.validateAt("kafka.tls")...)
	s := k.SASL
	switch strings.ToUpper(s.Mechanism) {
	case "":
		if s.Username != "" {
			bad("kafka.sasl.username", "is set but kafka.sasl.mechanism is empty")
		}
		if s.Password != "" || s.PasswordFile != "" {
			bad("kafka.sasl.password", "is set but kafka.sasl.mechanism is empty")
		}
	case SASLPlain, SASLScramSHA256, SASLScramSHA512:
		if s.Username == "" {
			bad("kafka.sasl.username", "is required with kafka.sasl.mechanism %s", s.Mechanism)
		}
		if s.Password == "" && s.PasswordFile == "" {
			bad("kafka.sasl.password", "is required with kafka.sasl.mechanism %s (or kafka.sasl.password_file, or %s)",
				s.Mechanism, EnvName("kafka.sasl.password"))
		}
	default:
		bad("kafka.sasl.mechanism", "%q is not %s, %s or %s", s.Mechanism, SASLPlain, SASLScramSHA256, SASLScramSHA512)
	}
	return ps
}

// validateAt returns the problems of t, the TLS keys under prefix
// (kafka.tls, decode.schema_registry.tls), each naming its key.
func (t KafkaTLS) validateAt(prefix string) []error {
	if t.Enabled {
		_, errs := t.configAt(prefix)
		return errs
	}
	var ps []error
	for _, k := range []struct {
		key string
		set bool
	}{{"ca_file", t.CAFile != ""}, {"cert_file", t.CertFile != ""}, {"key_file", t.KeyFile != ""},
		{"server_name", t.ServerName != ""}, {"insecure_skip_verify", t.InsecureSkipVerify}} {
		if k.set {
			ps = append(ps, fmt.Errorf("%s.%s: is set but %s.enabled is false", prefix, k.key, prefix))
		}
	}
	return ps
}

// config builds the TLS configuration of kafka.tls, or returns one problem
// per key.
func (t KafkaTLS) config() (*tls.Config, []error) { return t.configAt("kafka.tls") }

// configAt builds the TLS configuration of the keys under prefix, or
// returns one problem per key.
func (t KafkaTLS) configAt(prefix string) (*tls.Config, []error) {
	var ps []error
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		switch {
		case err != nil:
			ps = append(ps, fmt.Errorf("%s.ca_file: %w", prefix, err))
		default:
			c.RootCAs = x509.NewCertPool()
			if !c.RootCAs.AppendCertsFromPEM(pem) {
				ps = append(ps, fmt.Errorf("%s.ca_file: no PEM certificate in %s", prefix, t.CAFile))
			}
		}
	}
	switch {
	case t.CertFile != "" && t.KeyFile == "":
		ps = append(ps, fmt.Errorf("%s.key_file: is required with %s.cert_file", prefix, prefix))
	case t.CertFile == "" && t.KeyFile != "":
		ps = append(ps, fmt.Errorf("%s.cert_file: is required with %s.key_file", prefix, prefix))
	case t.CertFile != "":
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			ps = append(ps, fmt.Errorf("%s.cert_file, %s.key_file: %w", prefix, prefix, err))
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, ps
}

// ClientOptions returns the kgo options that reach the brokers as
// kafka.tls and kafka.sasl say: kgo.DialTLSConfig and kgo.SASL, or none
// for a plaintext cluster. Every Kafka client onceflow creates for
// kafka.brokers takes them. k must be valid (Config.Validate); the
// password must have been read (Load reads kafka.sasl.password_file).
// The options hold the password: never log them.
func (k Kafka) ClientOptions() ([]kgo.Opt, error) {
	var opts []kgo.Opt
	if k.TLS.Enabled {
		c, errs := k.TLS.config()
		if len(errs) > 0 {
			return nil, errors.Join(errs...)
		}
		opts = append(opts, kgo.DialTLSConfig(c))
	}
	s := k.SASL
	if s.Mechanism != "" && s.Password == "" && s.PasswordFile != "" {
		b, err := os.ReadFile(s.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("kafka.sasl.password_file: %w", err)
		}
		s.Password = Secret(strings.TrimRight(string(b), "\r\n"))
	}
	var m sasl.Mechanism
	switch strings.ToUpper(s.Mechanism) {
	case "":
		return opts, nil
	case SASLPlain:
		m = plain.Auth{User: s.Username, Pass: s.Password.Reveal()}.AsMechanism()
	case SASLScramSHA256:
		m = scram.Auth{User: s.Username, Pass: s.Password.Reveal()}.AsSha256Mechanism()
	case SASLScramSHA512:
		m = scram.Auth{User: s.Username, Pass: s.Password.Reveal()}.AsSha512Mechanism()
	default:
		return nil, fmt.Errorf("kafka.sasl.mechanism: %q is not %s, %s or %s", s.Mechanism, SASLPlain, SASLScramSHA256, SASLScramSHA512)
	}
	return append(opts, kgo.SASL(m)), nil
}
