package config

// decode.schema_registry: where decode.format avro and protobuf find the
// writer schemas, with basic auth and TLS as Kafka's.

import (
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/registry"
)

// SchemaRegistry is decode.schema_registry: a registry that speaks
// Confluent's REST API (Confluent Schema Registry, Apicurio's
// /apis/ccompat/v7, Karapace, Redpanda). Required with decode.format avro
// or protobuf.
type SchemaRegistry struct {
	// URL is the base URL under which /schemas/ids/{id} answers.
	URL      string `mapstructure:"url"`
	Username string `mapstructure:"username"`
	// Password is sent with Username as HTTP basic auth; give it in the
	// environment (ONCEFLOW_DECODE_SCHEMA_REGISTRY_PASSWORD) or through
	// PasswordFile rather than in the config file.
	Password     Secret `mapstructure:"password"`
	PasswordFile string `mapstructure:"password_file"`
	// TLS is for an https URL, with the keys of kafka.tls.
	TLS KafkaTLS `mapstructure:"tls"`
	// Timeout bounds one request to the registry.
	Timeout time.Duration `mapstructure:"timeout"`
	// CacheSize is how many compiled schemas are kept.
	CacheSize int `mapstructure:"cache_size"`
}

var registryDefaults = map[string]any{
	"decode.schema_registry.url":                      "",
	"decode.schema_registry.username":                 "",
	"decode.schema_registry.password":                 "",
	"decode.schema_registry.password_file":            "",
	"decode.schema_registry.timeout":                  registry.DefaultTimeout,
	"decode.schema_registry.cache_size":               registry.DefaultCacheSize,
	"decode.schema_registry.tls.enabled":              false,
	"decode.schema_registry.tls.ca_file":              "",
	"decode.schema_registry.tls.cert_file":            "",
	"decode.schema_registry.tls.key_file":             "",
	"decode.schema_registry.tls.server_name":          "",
	"decode.schema_registry.tls.insecure_skip_verify": false,
}

func init() { maps.Copy(defaults, registryDefaults) }

// framed reports whether format is read through a schema registry.
func framed(format string) bool {
	return format == string(processor.FormatAvro) || format == string(processor.FormatProtobuf)
}

// readRegistryPassword reads decode.schema_registry.password_file.
func (c *Config) readRegistryPassword() []error {
	r := &c.Decode.SchemaRegistry
	if r.PasswordFile == "" {
		return nil
	}
	if r.Password != "" {
		return []error{errors.New("decode.schema_registry.password_file: decode.schema_registry.password is set too; set one of them")}
	}
	b, err := os.ReadFile(r.PasswordFile)
	if err != nil {
		return []error{fmt.Errorf("decode.schema_registry.password_file: %w", err)}
	}
	r.Password = Secret(strings.TrimRight(string(b), "\r\n"))
	return nil
}

// validateRegistry returns the problems of decode.schema_registry, each
// naming its key. It is all unset unless decode.format needs it.
func (d Decode) validateRegistry() []error {
	var ps []error
	bad := func(key, format string, args ...any) {
		ps = append(ps, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
	}
	r := d.SchemaRegistry
	switch {
	case d.Format == string(processor.FormatJSON) || d.Format == string(processor.FormatBytes):
		if r.URL != "" {
			bad("decode.schema_registry.url", "is set but decode.format is %s (avro and protobuf use a schema registry)", d.Format)
		}
		return ps
	case !framed(d.Format) && r.URL == "":
		return ps
	}
	// An unknown decode.format (Validate names it) with a registry set is
	// most likely a misspelt avro or protobuf: its block is checked too,
	// so that every problem shows at once.
	if r.URL == "" {
		bad("decode.schema_registry.url", "is required with decode.format %s", d.Format)
	} else if u, err := url.Parse(r.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad("decode.schema_registry.url", "%q is not an http or https URL", r.URL)
	} else if u.User != nil {
		bad("decode.schema_registry.url", "holds credentials: set decode.schema_registry.username and password (or password_file) instead")
	} else if r.TLS.Enabled && u.Scheme != "https" {
		bad("decode.schema_registry.tls.enabled", "is true but decode.schema_registry.url is not https")
	}
	if r.Username == "" && (r.Password != "" || r.PasswordFile != "") {
		bad("decode.schema_registry.username", "is required with decode.schema_registry.password")
	}
	if r.Username != "" && r.Password == "" && r.PasswordFile == "" {
		bad("decode.schema_registry.password", "is required with decode.schema_registry.username (or decode.schema_registry.password_file, or %s)",
			EnvName("decode.schema_registry.password"))
	}
	if r.Timeout <= 0 {
		bad("decode.schema_registry.timeout", "must be positive, got %v", r.Timeout)
	}
	if r.CacheSize < 1 {
		bad("decode.schema_registry.cache_size", "must be at least 1, got %d", r.CacheSize)
	}
	ps = append(ps, r.TLS.validateAt("decode.schema_registry.tls")...)
	return ps
}

// RegistryConfig is decode.schema_registry as the registry package takes
// it, the password read. d must be valid (Config.Validate) with a format
// read through a registry. It holds the password: never log it.
func (d Decode) RegistryConfig() (registry.Config, error) {
	r := d.SchemaRegistry
	c := registry.Config{URL: r.URL, Username: r.Username, Password: r.Password.Reveal(), Timeout: r.Timeout, CacheSize: r.CacheSize}
	if r.Password == "" && r.PasswordFile != "" {
		b, err := os.ReadFile(r.PasswordFile)
		if err != nil {
			return c, fmt.Errorf("decode.schema_registry.password_file: %w", err)
		}
		c.Password = strings.TrimRight(string(b), "\r\n")
	}
	if r.TLS.Enabled {
		t, errs := r.TLS.configAt("decode.schema_registry.tls")
		if len(errs) > 0 {
			return c, errors.Join(errs...)
		}
		c.TLS = t
	}
	return c, nil
}
