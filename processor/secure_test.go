package processor_test

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// EnvKafkaSecure names the client folder of a Kafka reached only over
// SASL_SSL with a client certificate (infra/kafka-secure.sh client):
// brokers, ca.crt, client.crt, client.key, username, password. When it is
// set the suite also runs on it (subtests /kafka-sasl_ssl), every client
// with TLS and SCRAM-SHA-512; with CI set it must be, unless
// ONCEFLOW_TEST_KFAKE_ONLY is.
const EnvKafkaSecure = "ONCEFLOW_TEST_KAFKA_SECURE"

// secureBroker is the SASL_SSL broker's seeds and client options, read
// once from EnvKafkaSecure.
var secureBroker = sync.OnceValues(func() (secure, error) {
	dir := os.Getenv(EnvKafkaSecure)
	if dir == "" {
		return secure{}, nil
	}
	read := func(name string) (string, error) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		return strings.TrimSpace(string(b)), err
	}
	seeds, err := read("brokers")
	if err != nil {
		return secure{}, fmt.Errorf("%s: %w", EnvKafkaSecure, err)
	}
	user, err := read("username")
	if err != nil {
		return secure{}, err
	}
	pass, err := read("password")
	if err != nil {
		return secure{}, err
	}
	ca, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return secure{}, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(ca) {
		return secure{}, fmt.Errorf("%s: no certificate in ca.crt", EnvKafkaSecure)
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key"))
	if err != nil {
		return secure{}, err
	}
	return secure{seeds: strings.Split(seeds, ","), opts: []kgo.Opt{
		kgo.DialTLSConfig(&tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}),
		kgo.SASL(scram.Auth{User: user, Pass: pass}.AsSha512Mechanism()),
	}}, nil
})

// secure is the SASL_SSL broker: its seeds and the options that reach it.
type secure struct {
	seeds []string
	opts  []kgo.Opt
}

// security returns the options that reach seeds: TLS and SASL for the
// SASL_SSL broker, none for the others.
func security(seeds []string) []kgo.Opt {
	s, err := secureBroker()
	if err != nil || s.seeds == nil || !slices.Equal(s.seeds, seeds) {
		return nil
	}
	return s.opts
}

// secureBrokerCase is the SASL_SSL broker for brokers(), if configured.
func secureBrokerCase(t *testing.T) (broker, bool) {
	s, err := secureBroker()
	seeds := s.seeds
	switch {
	case err != nil:
		t.Fatalf("%v", err)
	case seeds == nil:
		if os.Getenv("CI") != "" && os.Getenv("ONCEFLOW_TEST_KFAKE_ONLY") == "" {
			t.Fatalf("%s is not set and CI is: the suite must also run over SASL_SSL (infra/kafka-secure.sh start)", EnvKafkaSecure)
		}
		return broker{}, false
	}
	return broker{name: "kafka-sasl_ssl", start: func(t *testing.T, topic string, partitions int32, extra ...string) []string {
		createTopics(t, seeds, partitions, append([]string{topic}, extra...)...)
		return seeds
	}}, true
}

// seedClient is a client of seeds with their security and opts.
func seedClient(seeds []string, opts ...kgo.Opt) (*kgo.Client, error) {
	return kgo.NewClient(append(append([]kgo.Opt{kgo.SeedBrokers(seeds...), kgo.MetadataMinAge(100 * time.Millisecond)},
		security(seeds)...), opts...)...)
}
