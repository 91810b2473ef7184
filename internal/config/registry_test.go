package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// decode.schema_registry: every problem at once, each naming its key.
func TestSchemaRegistryProblems(t *testing.T) {
	for _, tc := range []struct {
		name string
		yaml string
		want []string // empty: valid
	}{
		{"avro without registry", "decode:\n  format: avro\n", []string{"decode.schema_registry.url: is required with decode.format avro"}},
		{"registry with json", "decode:\n  schema_registry:\n    url: http://127.0.0.1:8081\n", []string{"decode.schema_registry.url: is set but decode.format is json"}},
		{"valid avro", "decode:\n  format: avro\n  schema_registry:\n    url: http://127.0.0.1:8081\n", nil},
		{"valid protobuf by field", "decode:\n  format: protobuf\n  event_id_source: field\n  event_id_field: id\n  schema_registry:\n    url: https://sr.example:8081\n    username: u\n    password: p\n", nil},
		{"every problem", `decode:
  format: protobuf
  schema_registry:
    url: ftp://x
    password: p
    timeout: -1s
    cache_size: 0
    tls:
      ca_file: /nonexistent
`, []string{
			`decode.schema_registry.url: "ftp://x" is not an http or https URL`,
			"decode.schema_registry.username: is required with decode.schema_registry.password",
			"decode.schema_registry.timeout: must be positive",
			"decode.schema_registry.cache_size: must be at least 1",
			"decode.schema_registry.tls.ca_file: is set but decode.schema_registry.tls.enabled is false",
		}},
		{"username without password", "decode:\n  format: avro\n  schema_registry:\n    url: http://h:1\n    username: u\n", []string{
			"decode.schema_registry.password: is required with decode.schema_registry.username (or decode.schema_registry.password_file, or ONCEFLOW_DECODE_SCHEMA_REGISTRY_PASSWORD)"}},
		{"credentials in the URL", "decode:\n  format: avro\n  schema_registry:\n    url: http://u:p@h:1\n", []string{"decode.schema_registry.url: holds credentials"}},
		{"tls on http", "decode:\n  format: avro\n  schema_registry:\n    url: http://h:1\n    tls:\n      enabled: true\n", []string{"decode.schema_registry.tls.enabled: is true but decode.schema_registry.url is not https"}},
		{"tls files", "decode:\n  format: avro\n  schema_registry:\n    url: https://h:1\n    tls:\n      enabled: true\n      ca_file: /nonexistent/ca.pem\n      cert_file: /x.pem\n", []string{
			"decode.schema_registry.tls.ca_file: open /nonexistent/ca.pem", "decode.schema_registry.tls.key_file: is required with decode.schema_registry.tls.cert_file"}},
		{"unknown format hides nothing", "decode:\n  format: avroo\n  schema_registry:\n    url: ftp://x\n    cache_size: 0\n", []string{
			`decode.format: "avroo" is not json, bytes, avro or protobuf`,
			`decode.schema_registry.url: "ftp://x" is not an http or https URL`,
			"decode.schema_registry.cache_size: must be at least 1",
		}},
		{"a value that does not parse hides nothing", "decode:\n  format: avro\n  schema_registry:\n    url: ftp://x\n    timeout: 5x\n    cache_size: 0\n", []string{
			`decode.schema_registry.timeout`, `unknown unit`,
			`decode.schema_registry.url: "ftp://x" is not an http or https URL`,
			"decode.schema_registry.cache_size: must be at least 1",
		}},
		{"field with bytes", "decode:\n  format: bytes\n  event_id_source: field\n  event_id_field: id\n", []string{"needs decode.format json, avro or protobuf, not bytes"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(writeFile(t, "kafka:\n  topics: [orders]\nhandlers: [emailHandler]\n"+tc.yaml), nil, nil, handlers)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Load: %v", err)
				}
				return
			}
			for _, w := range tc.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("Load error does not contain %q:\n%v", w, err)
				}
			}
		})
	}
}

// The password comes from password_file, never shown; RegistryConfig
// hands it to the registry package.
func TestSchemaRegistryPasswordFile(t *testing.T) {
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(writeFile(t, "kafka:\n  topics: [orders]\nhandlers: [emailHandler]\ndecode:\n  format: avro\n  schema_registry:\n    url: http://h:1\n    username: u\n    password_file: "+pw+"\n"), nil, nil, handlers)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(cfg.String(), "s3cret") {
		t.Errorf("Config.String shows the registry password: %s", cfg)
	}
	rc, err := cfg.Decode.RegistryConfig()
	if err != nil {
		t.Fatal(err)
	}
	if rc.Username != "u" || rc.Password != "s3cret" || rc.URL != "http://h:1" {
		t.Errorf("RegistryConfig = %+v, want u / s3cret at http://h:1", rc)
	}
	_, err = Load(writeFile(t, "kafka:\n  topics: [orders]\nhandlers: [emailHandler]\ndecode:\n  format: avro\n  schema_registry:\n    url: http://h:1\n    username: u\n    password: x\n    password_file: "+pw+"\n"), nil, nil, handlers)
	if err == nil || !strings.Contains(err.Error(), "decode.schema_registry.password_file: decode.schema_registry.password is set too") {
		t.Errorf("password and password_file: %v", err)
	}
}
