package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/sink/sinktest"
	"github.com/onceflow/onceflow/wire"
)

// replay --dry-run counts what a rewind would apply and changes nothing;
// replay then rewinds sink_offsets with a new epoch, and Kafka's offsets.
func TestReplayCommand(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	seeds := cluster.ListenAddrs()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1, nil, "orders"); err != nil {
		t.Fatal(err)
	}
	s, err := orders.Generate(5, 0, 7)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range s.Messages {
		if err := cl.ProduceSync(ctx, wire.NewRecord("orders", m.ID, m.Value)).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool)
	// The group has applied all five with emailHandler only.
	if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.sink_offsets (consumer_group, topic, partition, next_offset, epoch) VALUES ('g', 'orders', 0, 5, 3)`); err != nil {
		t.Fatal(err)
	}
	for _, m := range s.Messages {
		if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.processed_events (event_id, handler, bus) VALUES ($1, 'emailHandler', 'kafka')`, m.ID); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"replay", "--dsn", sinktest.DSN(t), "--schema", schema, "--brokers", strings.Join(seeds, ","),
		"--topics", "orders", "--group", "g", "--handlers", "emailHandler,recommenderHandler"}

	out, err := runCLI(t, io.Discard, append(args, "--backfill", "recommenderHandler", "--dry-run")...)
	if err != nil {
		t.Fatalf("dry run: %v\n%s", err, out)
	}
	t.Logf("dry run:\n%s", out)
	for _, want := range []string{"dedup horizon: 168h0m0s (dedup.retention)", "orders  0          5     0   5", "total", "recommenderHandler  5      0     0", "emailHandler        0      5     0"} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run output lacks %q:\n%s", want, out)
		}
	}
	if n := sinktest.Count(t, pool, `SELECT next_offset FROM `+schema+`.sink_offsets`); n != 5 {
		t.Fatalf("the dry run moved sink_offsets to %d", n)
	}

	if _, err := runCLI(t, io.Discard, append(args, "--to-start", "--to-time", "1h")...); err == nil {
		t.Error("two targets were accepted")
	}
	if _, err := runCLI(t, io.Discard, append(args, "--backfill", "nosuchHandler")...); err == nil || !strings.Contains(err.Error(), "not among the group's handlers") {
		t.Errorf("backfill of an unknown handler: err = %v", err)
	}

	out, err = runCLI(t, io.Discard, append(args, "--to-offset", "orders:0=2")...)
	if err != nil {
		t.Fatalf("rewind: %v\n%s", err, out)
	}
	if n := sinktest.Count(t, pool, `SELECT next_offset FROM `+schema+`.sink_offsets`); n != 2 {
		t.Errorf("sink_offsets after the rewind = %d, want 2", n)
	}
	if n := sinktest.Count(t, pool, `SELECT epoch FROM `+schema+`.sink_offsets`); n != 4 {
		t.Errorf("epoch after the rewind = %d, want 4 (bumped, fencing any writer)", n)
	}
	got, err := kadm.NewClient(cl).FetchOffsets(ctx, "g")
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := got.Lookup("orders", 0); !ok || o.At != 2 {
		t.Errorf("Kafka committed offset after the rewind = %+v, want 2", o)
	}

	// --reset-out-of-range moves only a stored offset outside the log.
	if _, err := runCLI(t, io.Discard, append(args, "--reset-out-of-range", "--backfill", "recommenderHandler")...); err == nil || !strings.Contains(err.Error(), "not --reset-out-of-range") {
		t.Errorf("a backfill with --reset-out-of-range: err = %v", err)
	}
	out, err = runCLI(t, io.Discard, append(args, "--reset-out-of-range")...)
	if err != nil || !strings.Contains(out, "nothing to reset") {
		t.Errorf("reset with the offset in range: err = %v, output:\n%s", err, out)
	}
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.sink_offsets SET next_offset = 9`); err != nil {
		t.Fatal(err)
	}
	out, err = runCLI(t, io.Discard, append(args, "--reset-out-of-range", "--dry-run")...)
	if err != nil || !strings.Contains(out, "orders/0: the stored offset 9 is beyond the log end 5: to 0") {
		t.Errorf("reset dry run: err = %v, output:\n%s", err, out)
	}
	if n := sinktest.Count(t, pool, `SELECT next_offset FROM `+schema+`.sink_offsets`); n != 9 {
		t.Fatalf("the dry run moved sink_offsets to %d", n)
	}
	if out, err = runCLI(t, io.Discard, append(args, "--reset-out-of-range")...); err != nil {
		t.Fatalf("reset: %v\n%s", err, out)
	}
	if n := sinktest.Count(t, pool, `SELECT next_offset FROM `+schema+`.sink_offsets`); n != 0 {
		t.Errorf("sink_offsets after the reset = %d, want 0 (the log start)", n)
	}
	if out, err = runCLI(t, io.Discard, append(args, "--reset-out-of-range", "--dry-run")...); err != nil || !strings.Contains(out, "nothing to reset") {
		t.Errorf("reset dry run with nothing out of range: err = %v, output:\n%s", err, out)
	}
	// A topic of the group the brokers do not have is named.
	missing := append(slices.Clone(args), "--to-start")
	missing[slices.Index(missing, "orders")] = "orders,gone-topic"
	if _, err := runCLI(t, io.Discard, missing...); err == nil || !strings.Contains(err.Error(), "do not have the group's topic(s) [gone-topic]") {
		t.Errorf("replay of a group with a missing topic: err = %v", err)
	}
}

// `onceflow replay` right after a static member's stop (a SIGTERM's drain)
// is refused, under both protocols, naming the member's instance id and
// the option that removes it; --dry-run says so too, checking the ids
// given to --remove-static-members, and removes nothing; with
// --remove-static-members it rewinds.
func TestReplayAfterStaticMemberStop(t *testing.T) {
	for name, seeds := range testBrokers(t) {
		for _, protocol := range []string{"classic", "consumer"} {
			t.Run(name+"/"+protocol, func(t *testing.T) {
				brokers := seeds(t)
				pool := sinktest.Pool(t)
				schema := freshSchema(t, pool, "test_replay_static_")
				topic := "orders-" + randomHex(4)
				group := topic + "-group"
				createTopic(t, brokers, topic, 2)
				createTopic(t, brokers, topic+".dlq", 1)
				cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
				if err != nil {
					t.Fatal(err)
				}
				defer cl.Close()
				if protocol == "consumer" { // the stopped member stays 30s, not the test broker's 3s
					req := kmsg.NewPtrIncrementalAlterConfigsRequest()
					res := kmsg.NewIncrementalAlterConfigsRequestResource()
					res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeGroupConfig, group
					c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
					c.Name, c.Value = "consumer.session.timeout.ms", kmsg.StringPtr("30000")
					res.Configs = append(res.Configs, c)
					req.Resources = append(req.Resources, res)
					if _, err := req.RequestWith(t.Context(), cl); err != nil {
						t.Logf("group config not set: %v", err)
					}
				}
				s, err := orders.Generate(10, 0, 8)
				if err != nil {
					t.Fatal(err)
				}
				for _, m := range s.Messages {
					if err := cl.ProduceSync(t.Context(), wire.NewRecord(topic, m.ID, m.Value)).FirstErr(); err != nil {
						t.Fatal(err)
					}
				}
				file := writeConfig(t, fmt.Sprintf(`kafka:
  brokers: [%s]
  topics: [%s]
  dead_letter_topic: %s.dlq
  group: %s
  group_protocol: %s
  instance_id: onceflow-0
  session_timeout: 30s
  rebalance_timeout: 30s
postgres:
  dsn: %s
  schema: %s
log:
  level: error
`, strings.Join(brokers, ","), topic, topic, group, protocol, sinktest.DSN(t), schema))
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				done := make(chan error, 1)
				go func() {
					root := newRoot()
					root.SetOut(io.Discard)
					root.SetErr(io.Discard)
					root.SetArgs([]string{"run", "--config", file})
					done <- root.ExecuteContext(ctx)
				}()
				waitFor(t, 60*time.Second, "run applying every record", func() bool {
					migrated := sinktest.Count(t, pool, `SELECT count(*) FROM information_schema.tables WHERE table_schema = $1 AND table_name = 'sink_offsets'`, schema)
					return migrated == 1 && sinktest.Count(t, pool, `SELECT coalesce(sum(next_offset), 0)::bigint FROM `+schema+`.sink_offsets`) == int64(len(s.Messages))
				})
				cancel() // SIGTERM: drains, and stays in the group
				select {
				case err := <-done:
					if err != nil {
						t.Fatalf("run after cancel: %v", err)
					}
				case <-time.After(30 * time.Second):
					t.Fatal("run did not stop within 30s")
				}

				out, err := runCLI(t, io.Discard, "replay", "--config", file, "--to-start")
				if err == nil {
					t.Fatalf("replay right after a static member's stop was not refused:\n%s", out)
				}
				t.Logf("refused: %v", err)
				for _, want := range []string{"static member", "onceflow-0", "session timeout", "30s", "--remove-static-members onceflow-0"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("the refusal does not say %q", want)
					}
				}
				// The dry run says the real run would be refused, and why,
				// and checks the ids given to --remove-static-members as the
				// real run does; it still prints its counts and exits 0.
				for _, c := range []struct {
					remove string
					want   []string
					refuse bool
				}{
					{"", []string{"\nREFUSED while the group has members", "onceflow-0", "--remove-static-members onceflow-0"}, true},
					{"nosuch", []string{"\nREFUSED while the group has members", "nosuch", "onceflow-0"}, true},
					{"onceflow-0", []string{"would first remove static member(s) onceflow-0"}, false},
				} {
					args := []string{"replay", "--config", file, "--to-start", "--dry-run"}
					if c.remove != "" {
						args = append(args, "--remove-static-members", c.remove)
					}
					out, err := runCLI(t, io.Discard, args...)
					if err != nil {
						t.Fatalf("dry run --remove-static-members %q: %v\n%s", c.remove, err, out)
					}
					t.Logf("dry run --remove-static-members %q:\n%s", c.remove, out)
					for _, want := range append(c.want, "total") {
						if !strings.Contains(out, want) {
							t.Errorf("dry run --remove-static-members %q does not say %q", c.remove, want)
						}
					}
					if !c.refuse && strings.Contains(out, "\nREFUSED") {
						t.Errorf("dry run --remove-static-members %q says the rewind would be refused", c.remove)
					}
				}
				if _, err := runCLI(t, io.Discard, "replay", "--config", file, "--to-start"); err == nil || !strings.Contains(err.Error(), "onceflow-0") {
					t.Errorf("replay after the dry runs: err = %v, want still refused for onceflow-0 (a dry run removes nothing)", err)
				}
				out, err = runCLI(t, io.Discard, "replay", "--config", file, "--to-start", "--remove-static-members", "onceflow-0")
				if err != nil {
					t.Fatalf("replay --remove-static-members: %v\n%s", err, out)
				}
				if n := sinktest.Count(t, pool, `SELECT coalesce(sum(next_offset), 0)::bigint FROM `+schema+`.sink_offsets`); n != 0 {
					t.Errorf("sink_offsets after the rewind to the start sum to %d, want 0", n)
				}
			})
		}
	}
}
