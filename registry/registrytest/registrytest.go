// Package registrytest gives tests schema registries: franz-go's in-memory
// fake (srfake) always, and the real registry named by
// ONCEFLOW_TEST_SCHEMA_REGISTRY (infra/schema-registry.sh url) when set —
// required when CI is set, unless ONCEFLOW_TEST_KFAKE_ONLY is (the suite
// without Java: make test-kfake).
package registrytest

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
)

// EnvURL names the environment variable holding a real registry's URL.
const EnvURL = "ONCEFLOW_TEST_SCHEMA_REGISTRY"

// Registries returns the registries a test runs against, by name: "srfake"
// (a fresh fake, closed by t.Cleanup) and "real" when EnvURL is set. With
// CI set and EnvURL empty, the test fails.
func Registries(t testing.TB) map[string]string {
	t.Helper()
	fake := srfake.New()
	t.Cleanup(fake.Close)
	regs := map[string]string{"srfake": fake.URL()}
	switch u := os.Getenv(EnvURL); {
	case u != "":
		regs["real"] = u
	case os.Getenv("CI") != "" && os.Getenv("ONCEFLOW_TEST_KFAKE_ONLY") == "":
		t.Fatalf("%s is not set and CI is: start infra/schema-registry.sh and export %s=$(infra/schema-registry.sh url)", EnvURL, EnvURL)
	default:
		t.Logf("%s not set: srfake only", EnvURL)
	}
	return regs
}

// Register registers s under subject at the registry at url and returns
// its id. Apicurio (the real registry of the suite) has answered first
// registrations of new subjects "already exists" under load, as it does
// to registrations that lose a race: such a registration is looked up,
// then made again, a few times, as registry.NewEncoder's are.
func Register(t testing.TB, url, subject string, s sr.Schema) int {
	t.Helper()
	cl, err := sr.NewClient(sr.URLs(url))
	if err != nil {
		t.Fatal(err)
	}
	for attempt := 1; ; attempt++ {
		ss, err := cl.CreateSchema(context.Background(), subject, s)
		if err == nil {
			return ss.ID
		}
		if found, lerr := cl.LookupSchema(context.Background(), subject, s); lerr == nil {
			return found.ID
		}
		if attempt == 5 || !strings.Contains(err.Error(), "already exists") {
			t.Fatalf("register %s: %v", subject, err)
		}
		time.Sleep(time.Duration(attempt) * 100 * time.Millisecond)
	}
}

// Frame returns body framed in the Confluent wire format with id and, for
// Protobuf, the message index (nil for Avro).
func Frame(t testing.TB, id int, index []int, body []byte) []byte {
	t.Helper()
	var h sr.ConfluentHeader
	b, err := h.AppendEncode(nil, id, index)
	if err != nil {
		t.Fatal(err)
	}
	return append(b, body...)
}
