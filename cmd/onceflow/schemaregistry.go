package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/onceflow/onceflow/internal/config"
	"github.com/onceflow/onceflow/processor"
	schemaregistry "github.com/onceflow/onceflow/registry"
)

// newSchemaDecoder builds the decoder of decode.format avro and protobuf
// from decode.schema_registry; nil for json and bytes.
func newSchemaDecoder(d config.Decode) (*schemaregistry.Decoder, error) {
	if d.Format != string(processor.FormatAvro) && d.Format != string(processor.FormatProtobuf) {
		return nil, nil
	}
	rc, err := d.RegistryConfig()
	if err != nil {
		return nil, err
	}
	dec, err := schemaregistry.New(rc)
	if err != nil {
		return nil, fmt.Errorf("decode.schema_registry: %w", err)
	}
	return dec, nil
}

// registryKeys are the keys to check when the registry refuses onceflow.
const registryKeys = "decode.schema_registry.username and decode.schema_registry.password (or password_file, or ONCEFLOW_DECODE_SCHEMA_REGISTRY_PASSWORD)"

// checkSchemaRegistry asks the schema registry once, before consuming:
// refused credentials or a URL that is not a registry end run at once,
// naming the keys; a registry that is down is only logged — the workers
// wait for it, retrying, and dead-letter nothing because of it.
func (a *app) checkSchemaRegistry(ctx context.Context) error {
	if a.schemas == nil {
		return nil
	}
	err := a.schemas.Check(ctx)
	switch {
	case err == nil:
		return nil
	case schemaregistry.IsTransient(err):
		a.log.Warn("schema registry unreachable at start; records wait for it", "url", a.cfg.Decode.SchemaRegistry.URL, "err", err)
		return nil
	}
	return schemaRegistryRefused(fmt.Errorf("decode.schema_registry.url %s: %w", a.cfg.Decode.SchemaRegistry.URL, err))
}

// schemaRegistryRefused names the keys to check when err is the registry
// refusing the credentials, once however many times err passes here;
// other errors pass as they are.
func schemaRegistryRefused(err error) error {
	var named *keysNamed
	if schemaregistry.IsAuth(err) && !errors.As(err, &named) {
		return &keysNamed{err}
	}
	return err
}

// keysNamed is the registry refusing the credentials, with the keys to
// check.
type keysNamed struct{ err error }

func (e *keysNamed) Error() string { return fmt.Sprintf("%v; check %s", e.err, registryKeys) }
func (e *keysNamed) Unwrap() error { return e.err }

// framedValues are produce's --format, --schema, --message and --subject.
type framedValues struct{ format, schema, message, subject string }

// encoder returns how produce turns a VALUE into a record value: as it is,
// or, with --format, encoded with --schema registered under the subject.
func (f framedValues) encoder(ctx context.Context, a *app, topic string) (func([]byte) ([]byte, error), error) {
	switch f.format {
	case "":
		if f.schema != "" || f.message != "" || f.subject != "" {
			return nil, fmt.Errorf("--schema, --message and --subject need --format avro or protobuf (the values would be sent as they are)")
		}
		return func(v []byte) ([]byte, error) { return v, nil }, nil
	case string(schemaregistry.Avro), string(schemaregistry.Protobuf):
	default:
		return nil, fmt.Errorf("--format %q is not avro or protobuf", f.format)
	}
	if f.schema == "" {
		return nil, fmt.Errorf("--format %s needs --schema FILE", f.format)
	}
	if f.message != "" && f.format != string(schemaregistry.Protobuf) {
		return nil, fmt.Errorf("--message is for --format protobuf")
	}
	if a.cfg.Decode.SchemaRegistry.URL == "" {
		return nil, fmt.Errorf("--format %s needs decode.schema_registry.url (set it with decode.format avro or protobuf)", f.format)
	}
	text, err := os.ReadFile(f.schema)
	if err != nil {
		return nil, fmt.Errorf("--schema: %w", err)
	}
	rc, err := a.cfg.Decode.RegistryConfig()
	if err != nil {
		return nil, err
	}
	subject := f.subject
	if subject == "" {
		subject = topic + "-value"
	}
	e, err := schemaregistry.NewEncoder(ctx, rc, subject, schemaregistry.Source{Kind: schemaregistry.Kind(f.format), Text: string(text), Path: f.schema, Message: f.message})
	if err != nil {
		return nil, schemaRegistryRefused(err)
	}
	return e.Encode, nil
}
