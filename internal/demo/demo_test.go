package demo_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/onceflow/onceflow/internal/demo"
	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// env is the demo's wiring as cmd/onceflow does it, over a schema dropped
// at cleanup.
func env(t *testing.T) (demo.Env, demo.Options) {
	pool := sinktest.Pool(t)
	var b [4]byte
	_, _ = rand.Read(b[:])
	schema := "test_demo_" + hex.EncodeToString(b[:])
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`) })
	hs, err := orders.Handlers(schema)
	if err != nil {
		t.Fatal(err)
	}
	e := demo.Env{
		Pool: pool,
		Migrate: func(ctx context.Context, pool *pgxpool.Pool, schema string) error {
			if err := sink.Migrate(ctx, pool, schema); err != nil {
				return err
			}
			return orders.Migrate(ctx, pool, schema)
		},
		Consumer: processor.Config{Topics: []string{"orders"}, Group: "demo", BatchLinger: 10 * time.Millisecond},
		Writer:   sink.Config{Schema: schema, Group: "demo", Handlers: hs},
		LRUSize:  1000, Handlers: orders.Names, DeadLetterTopic: "orders.dlq",
	}
	o := demo.Options{Events: 1500, Duplicates: 0.3, Replay: 0.1, Partitions: 3, Members: 2,
		RebalanceEvery: 200 * time.Millisecond, Schema: schema, Seed: 1, Timeout: 2 * time.Minute}
	return e, o
}

func TestRunIsExactlyOnce(t *testing.T) {
	e, o := env(t)
	var progress strings.Builder
	e.Progress = &progress
	sum, err := demo.Run(t.Context(), e, o)
	if err != nil {
		t.Fatal(err)
	}
	if !sum.ExactlyOnce || sum.UniqueEvents != 1500 || sum.ProcessedTotal != 4*1500 || sum.EmailsSent != 1500 {
		t.Errorf("summary %+v", sum)
	}
	if sum.MembersStarted < 2 || !strings.Contains(progress.String(), "publishing") {
		t.Errorf("members started %d; progress:\n%s", sum.MembersStarted, progress.String())
	}
}

// Interrupted while it runs, the demo says so, and every member and the
// producer have stopped when it returns (goleak checks after the tests).
func TestRunInterrupted(t *testing.T) {
	e, o := env(t)
	o.Events = 200000 // far more than it can finish before the interruption
	ctx, cancel := context.WithTimeout(t.Context(), 1500*time.Millisecond)
	defer cancel()
	if _, err := demo.Run(ctx, e, o); !errors.Is(err, demo.ErrInterrupted) {
		t.Fatalf("Run = %v, want ErrInterrupted", err)
	}
}

func TestOptionsValidate(t *testing.T) {
	err := demo.Options{Events: 0, Partitions: 0, Members: 1, RebalanceEvery: time.Second, Schema: "public"}.Validate()
	for _, want := range []string{"--events 0", "--partitions 0", `--demo-schema "public"`, "--timeout 0s"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v, want it to name %s", err, want)
		}
	}
}

// At the default pace (a change a second) the demo shows what it is for:
// members leave and one crashes while records still arrive, however fast
// they are consumed, and every effect still happens once.
func TestRunChurnsBothWays(t *testing.T) {
	e, o := env(t)
	o.RebalanceEvery = time.Second // cmd/onceflow's default
	sum, err := demo.Run(t.Context(), e, o)
	if err != nil {
		t.Fatal(err)
	}
	if !sum.ExactlyOnce {
		t.Errorf("not exactly once: %+v", sum)
	}
	if sum.MembersCrashed < 1 || sum.MembersLeft < 1 {
		t.Errorf("members left %d, crashed %d; the demo must churn both ways before the stream ends", sum.MembersLeft, sum.MembersCrashed)
	}
}
