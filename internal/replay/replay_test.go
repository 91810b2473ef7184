package replay_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/goleak"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/internal/members"
	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/internal/replay"
	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
	"github.com/onceflow/onceflow/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// envKafka names the variable with a real Kafka's brokers; the tests run
// on kfake always, and on that Kafka too when it is set (it must be in CI,
// unless ONCEFLOW_TEST_KFAKE_ONLY is set).
const envKafka = "ONCEFLOW_TEST_KAFKA_BROKERS"

type broker struct {
	name  string
	seeds func(t *testing.T) []string
}

func eachBroker(t *testing.T, f func(t *testing.T, seeds []string)) {
	bs := []broker{{"kfake", func(t *testing.T) []string {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(100*time.Millisecond))
		if err != nil {
			t.Fatalf("kfake: %v", err)
		}
		t.Cleanup(c.Close)
		return c.ListenAddrs()
	}}}
	switch addrs := os.Getenv(envKafka); {
	case addrs != "":
		bs = append(bs, broker{"kafka", func(*testing.T) []string { return strings.Split(addrs, ",") }})
	case os.Getenv("CI") != "" && os.Getenv("ONCEFLOW_TEST_KFAKE_ONLY") == "":
		t.Fatalf("%s is not set and CI is: the suite must also run on a real Kafka (infra/kafka.sh start)", envKafka)
	}
	for _, b := range bs {
		t.Run(b.name, func(t *testing.T) { f(t, b.seeds(t)) })
	}
}

// env is one test's topic (two partitions), group and schema.
type env struct {
	t      *testing.T
	seeds  []string
	topic  string
	group  string
	pool   *pgxpool.Pool
	schema string
	// session is the replayers' SessionTimeout (kafka.session_timeout).
	session time.Duration
}

func newEnv(t *testing.T, seeds []string) *env {
	suffix := uuid.NewString()[:8]
	pool := sinktest.Pool(t)
	e := &env{t: t, seeds: seeds, topic: "replay-" + suffix, group: "replay-" + suffix, pool: pool,
		schema: sinktest.Schema(t, pool, orders.Migrate)}
	cl := e.client()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, 2, 1, nil, e.topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("create topic %s: %v", e.topic, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = kadm.NewClient(cl).DeleteTopics(ctx, e.topic)
	})
	return e
}

func (e *env) client(opts ...kgo.Opt) *kgo.Client {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(e.seeds...), kgo.MetadataMinAge(100 * time.Millisecond)}, opts...)...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(cl.Close)
	return cl
}

// produce publishes msgs in order with the record timestamp at.
func (e *env) produce(msgs []orders.Message, at time.Time) {
	e.t.Helper()
	recs := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		recs[i] = wire.NewRecord(e.topic, m.ID, m.Value)
		recs[i].Key = m.ID[:] // spread over both partitions
		recs[i].Timestamp = at
	}
	ctx, cancel := context.WithTimeout(e.t.Context(), 60*time.Second)
	defer cancel()
	if err := e.client().ProduceSync(ctx, recs...).FirstErr(); err != nil {
		e.t.Fatalf("produce: %v", err)
	}
}

// start starts one in-process member running handlers.
func (e *env) start(handlers ...string) members.Member {
	e.t.Helper()
	return e.startAs("member-"+uuid.NewString()[:8], nil, handlers...)
}

// startAs starts one in-process member named name, its consumer config
// edited by edit when it is not nil.
func (e *env) startAs(name string, edit func(*processor.Config), handlers ...string) members.Member {
	e.t.Helper()
	return e.startWith(name, false, edit, handlers...)
}

// startWith is startAs, with the member's Crash a SIGKILL's when kill is
// set (it stays in the group until its session times out).
func (e *env) startWith(name string, kill bool, edit func(*processor.Config), handlers ...string) members.Member {
	e.t.Helper()
	hs, err := orders.Handlers(e.schema, handlers...)
	if err != nil {
		e.t.Fatal(err)
	}
	cc := members.Tuned(processor.Config{Brokers: e.seeds, Topics: []string{e.topic}, Group: e.group,
		BatchMaxRecords: 20, BatchLinger: 20 * time.Millisecond, CommitInterval: 200 * time.Millisecond,
		KafkaOptions: []kgo.Opt{kgo.FetchMaxWait(200 * time.Millisecond)}})
	if edit != nil {
		edit(&cc)
	}
	start := members.InProcess(members.InProcessConfig{
		Pool: e.pool, LRUSize: 1000, Consumer: cc,
		Writer: sink.Config{Schema: e.schema, Group: e.group, Handlers: hs}, Kill: kill,
	})
	m, err := start(e.t.Context(), name)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = m.Leave() })
	return m
}

// runUntil starts a member with handlers, waits until the group has
// committed n records in Postgres, stops it and returns its counters.
func (e *env) runUntil(n int64, handlers ...string) processor.Stats {
	e.t.Helper()
	m := e.start(handlers...)
	ctx, cancel := context.WithTimeout(e.t.Context(), 60*time.Second)
	defer cancel()
	if err := members.WaitCommitted(ctx, e.pool, e.schema, e.group, n, 50*time.Millisecond); err != nil {
		e.t.Fatal(err)
	}
	if err := m.Leave(); err != nil {
		e.t.Fatal(err)
	}
	return m.Stats()
}

func (e *env) replayer(horizon time.Duration, handlers ...string) *replay.Replayer {
	e.t.Helper()
	return e.replayerOn(e.pool, horizon, handlers...)
}

// replayerOn is replayer on pool.
func (e *env) replayerOn(pool *pgxpool.Pool, horizon time.Duration, handlers ...string) *replay.Replayer {
	e.t.Helper()
	if len(handlers) == 0 {
		handlers = orders.Names
	}
	r, err := replay.New(replay.Config{Pool: pool, Brokers: e.seeds, Schema: e.schema, Group: e.group,
		Topics: []string{e.topic}, Handlers: handlers, Horizon: horizon, SessionTimeout: e.session,
		KafkaOptions: []kgo.Opt{kgo.MetadataMinAge(100 * time.Millisecond)}})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(r.Close)
	return r
}

func (e *env) check(want map[uuid.UUID]orders.Order, handlers ...string) {
	e.t.Helper()
	rep, err := orders.Check(context.Background(), e.pool, e.schema, want, handlers...)
	if err != nil {
		e.t.Fatal(err)
	}
	if !rep.ExactlyOnce() {
		e.t.Fatalf("effects not exactly once:\n%s", strings.Join(rep.Problems, "\n"))
	}
}

func stream(t *testing.T, events int) orders.Stream {
	s, err := orders.Generate(events, 0.2, rand.Uint64())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func totals(p *replay.Plan) (records int64, pairs map[string]replay.PairCounts) {
	pairs = map[string]replay.PairCounts{}
	for _, x := range p.Partitions {
		records += x.Records
		for h, c := range x.Handlers {
			t := pairs[h]
			t.Add(*c)
			pairs[h] = t
		}
	}
	return records, pairs
}

// Replaying the last hour — records already applied — applies nothing
// twice: the dry run says every pair would be skipped, and after the
// rewind a fresh member (empty LRU) applies nothing and skips them all in
// Postgres. Effects are counted in emails_sent (no unique key) and the
// added-to counters.
func TestReplayTimeRangeAppliesNothingTwice(t *testing.T) {
	eachBroker(t, func(t *testing.T, seeds []string) {
		e := newEnv(t, seeds)
		s := stream(t, 60)
		old, recent := s.Messages[:40], s.Messages[40:]
		now := time.Now()
		e.produce(old, now.Add(-2*time.Hour))
		e.produce(recent, now.Add(-10*time.Minute))
		total := int64(len(s.Messages))
		e.runUntil(total)
		e.check(s.Unique)

		r := e.replayer(0)
		req := replay.Request{Target: replay.Target{Time: now.Add(-time.Hour)}}
		plan, err := r.Plan(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Count(t.Context(), plan); err != nil {
			t.Fatal(err)
		}
		records, pairs := totals(plan)
		if records != int64(len(recent)) {
			t.Errorf("dry run reads %d records, want %d (the last hour)", records, len(recent))
		}
		for _, h := range orders.Names {
			if c := pairs[h]; c.Applied != 0 || c.Skipped != int64(len(recent)) || c.Conflicts != 0 {
				t.Errorf("dry run for %s: %+v, want 0 applied, %d skipped", h, c, len(recent))
			}
		}
		if err := r.Rewind(t.Context(), plan, req); err != nil {
			t.Fatal(err)
		}
		if got := sinktest.Count(t, e.pool, `SELECT sum(next_offset) FROM `+e.schema+`.sink_offsets WHERE consumer_group = $1`, e.group); got != total-int64(len(recent)) {
			t.Fatalf("sink_offsets after the rewind sum to %d, want %d", got, total-int64(len(recent)))
		}
		st := e.runUntil(total)
		// Every pair is skipped; each event's first record is skipped by
		// Postgres (the member's LRU starts empty), and a redelivery of it
		// among the recent records either by Postgres too (in the same
		// batch) or by the LRU (in a later batch, once the first one is
		// known committed): how the records fall into batches decides.
		distinct := map[uuid.UUID]bool{}
		for _, m := range recent {
			distinct[m.ID] = true
		}
		hn := int64(len(orders.Names))
		if st.Applied != 0 || st.SkippedPostgres+st.SkippedLRU != int64(len(recent))*hn || st.SkippedPostgres < int64(len(distinct))*hn {
			t.Errorf("the replay applied %d pairs and skipped %d in Postgres and %d by the LRU; want 0, and %d in all, at least %d (every event once) in Postgres",
				st.Applied, st.SkippedPostgres, st.SkippedLRU, int64(len(recent))*hn, int64(len(distinct))*hn)
		}
		e.check(s.Unique)
	})
}

// A backfill of a handler added later applies exactly the history to it
// and nothing to the others.
func TestBackfillOneHandler(t *testing.T) {
	eachBroker(t, func(t *testing.T, seeds []string) {
		e := newEnv(t, seeds)
		s := stream(t, 50)
		e.produce(s.Messages, time.Now())
		total := int64(len(s.Messages))
		siblings := []string{orders.Email, orders.Inventory, orders.Analytics}
		e.runUntil(total, siblings...)
		e.check(s.Unique, siblings...)
		if n := sinktest.Count(t, e.pool, `SELECT count(*) FROM `+e.schema+`.recommender_weights`); n != 0 {
			t.Fatalf("recommender_weights has %d rows before the backfill", n)
		}

		r := e.replayer(0) // the group now runs all four
		req := replay.Request{Backfill: orders.Recommender}
		plan, err := r.Plan(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Count(t.Context(), plan); err != nil {
			t.Fatal(err)
		}
		records, pairs := totals(plan)
		if records != total {
			t.Errorf("dry run reads %d records, want the whole history %d", records, total)
		}
		if c := pairs[orders.Recommender]; c.Applied != int64(len(s.Unique)) || c.Skipped != total-int64(len(s.Unique)) {
			t.Errorf("dry run for the new handler: %+v, want %d applied and %d skipped (redeliveries)", c, len(s.Unique), total-int64(len(s.Unique)))
		}
		for _, h := range siblings {
			if c := pairs[h]; c.Applied != 0 {
				t.Errorf("dry run for sibling %s: %+v, want 0 applied", h, c)
			}
		}
		if err := r.Rewind(t.Context(), plan, req); err != nil {
			t.Fatal(err)
		}
		st := e.runUntil(total) // all four handlers
		if st.Applied != int64(len(s.Unique)) {
			t.Errorf("the backfill applied %d pairs, want %d (one per event, the new handler's)", st.Applied, len(s.Unique))
		}
		e.check(s.Unique) // all four, each exactly once
		if n := sinktest.Count(t, e.pool, `SELECT count(*) FROM `+e.schema+`.sink_replays WHERE consumer_group = $1 AND handler = $2`, e.group, orders.Recommender); n != 2 {
			t.Errorf("sink_replays rows for the backfill = %d, want 2 (one per partition)", n)
		}
		backfilled, err := sink.Audit(t.Context(), e.pool, e.schema, s.Messages[0].ID, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range backfilled.Processed {
			if (p.ReplayedBy != 0) != (p.Handler == orders.Recommender) {
				t.Errorf("audit: %s replayed_by = %d; want a replay id for the backfilled handler only", p.Handler, p.ReplayedBy)
			}
		}
	})
}

// A dry run counts whatever default_query_exec_mode the replayer's DSN
// sets: behind a transaction pooler (exec, simple_protocol) its look-up
// of processed_events sends the event ids as text.
func TestCountExecModes(t *testing.T) {
	eachBroker(t, func(t *testing.T, seeds []string) {
		e := newEnv(t, seeds)
		s := stream(t, 30)
		e.produce(s.Messages, time.Now())
		total := int64(len(s.Messages))
		siblings := []string{orders.Email, orders.Inventory, orders.Analytics}
		e.runUntil(total, siblings...)
		for _, mode := range []string{"cache_statement", "exec", "simple_protocol"} {
			t.Run(mode, func(t *testing.T) {
				r := e.replayerOn(sinktest.ModePool(t, mode), 0)
				req := replay.Request{Backfill: orders.Recommender}
				plan, err := r.Plan(t.Context(), req)
				if err != nil {
					t.Fatal(err)
				}
				if err := r.Count(t.Context(), plan); err != nil {
					t.Fatal(err)
				}
				if records, pairs := totals(plan); records != total || pairs[orders.Recommender].Applied != int64(len(s.Unique)) || pairs[orders.Email].Applied != 0 {
					t.Errorf("dry run: %d records, %+v; want %d records, %d applied for %s and none for the others",
						records, pairs, total, len(s.Unique), orders.Recommender)
				}
			})
		}
	})
}

// A rewind is refused while the group has a live member, and nothing is
// moved; once the member has left, it goes through.
func TestRewindRefusedWithLiveMembers(t *testing.T) {
	eachBroker(t, func(t *testing.T, seeds []string) {
		e := newEnv(t, seeds)
		s := stream(t, 20)
		e.produce(s.Messages, time.Now())
		total := int64(len(s.Messages))
		m := e.start()
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		defer cancel()
		if err := members.WaitCommitted(ctx, e.pool, e.schema, e.group, total, 50*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		r := e.replayer(0)
		req := replay.Request{Target: replay.Target{Start: true}}
		plan, err := r.Plan(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		err = r.Rewind(t.Context(), plan, req)
		var active *replay.GroupActiveError
		if !errors.Is(err, replay.ErrGroupActive) || !errors.As(err, &active) || len(active.Members) != 1 {
			t.Fatalf("rewind with a live member: err = %v, want a GroupActiveError naming one member", err)
		}
		t.Logf("refused: %v", err)
		if got := sinktest.Count(t, e.pool, `SELECT sum(next_offset) FROM `+e.schema+`.sink_offsets WHERE consumer_group = $1`, e.group); got != total {
			t.Errorf("sink_offsets moved by a refused rewind: sum %d, want %d", got, total)
		}
		if err := m.Leave(); err != nil {
			t.Fatal(err)
		}
		if err := r.Rewind(t.Context(), plan, req); err != nil {
			t.Fatalf("rewind once the member left: %v", err)
		}
		e.runUntil(total)
		e.check(s.Unique)
	})
}

// A static member's stop does not leave the group for good (KIP-345: it
// keeps its place for a restart within the session timeout), so a rewind
// right after it is refused, under both protocols; the refusal says that
// the group still holds static members, names their instance ids and the
// session timeout after which they expire. RemoveStaticMembers (replay
// --remove-static-members) removes them, refusing an id no member holds,
// and the rewind then goes through: the group replays, applying nothing
// twice.
func TestRewindRefusalNamesStaticMembers(t *testing.T) {
	for _, protocol := range []processor.GroupProtocol{processor.ClassicProtocol, processor.ConsumerProtocol} {
		t.Run(string(protocol), func(t *testing.T) {
			eachBroker(t, func(t *testing.T, seeds []string) {
				e := newEnv(t, seeds)
				e.session = 30 * time.Second
				if protocol == processor.ConsumerProtocol {
					e.groupSession(30 * time.Second)
				}
				s := stream(t, 20)
				e.produce(s.Messages, time.Now())
				total := int64(len(s.Messages))
				m := e.startAs("a", func(c *processor.Config) {
					c.GroupProtocol, c.InstanceID = protocol, "onceflow"
					c.SessionTimeout = 30 * time.Second // the group lists the stopped member for that long
				})
				ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
				defer cancel()
				if err := members.WaitCommitted(ctx, e.pool, e.schema, e.group, total, 50*time.Millisecond); err != nil {
					t.Fatal(err)
				}
				r := e.replayer(0)
				req := replay.Request{Target: replay.Target{Start: true}}
				plan, err := r.Plan(t.Context(), req)
				if err != nil {
					t.Fatal(err)
				}
				if err := m.Leave(); err != nil { // a SIGTERM's drain
					t.Fatal(err)
				}
				err = r.Rewind(t.Context(), plan, req)
				if !errors.Is(err, replay.ErrGroupActive) {
					t.Fatalf("rewind right after a static member's stop: err = %v, want ErrGroupActive", err)
				}
				t.Logf("refused: %v", err)
				for _, want := range []string{"static member", "onceflow-a", "session timeout", "30s"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("the refusal does not say %q", want)
					}
				}
				if got := sinktest.Count(t, e.pool, `SELECT sum(next_offset) FROM `+e.schema+`.sink_offsets WHERE consumer_group = $1`, e.group); got != total {
					t.Errorf("sink_offsets moved by a refused rewind: sum %d, want %d", got, total)
				}

				if err := r.RemoveStaticMembers(t.Context(), []string{"onceflow-a", "nosuch"}); err == nil || !strings.Contains(err.Error(), "nosuch") {
					t.Errorf("removing an instance id no member holds: err = %v, want one naming it", err)
				}
				if err := r.RemoveStaticMembers(t.Context(), []string{"onceflow-a"}); err != nil {
					t.Fatalf("remove the static member: %v", err)
				}
				if err := r.Rewind(t.Context(), plan, req); err != nil {
					t.Fatalf("rewind once the static member was removed: %v", err)
				}
				// The group replays, under its protocol.
				m = e.startAs("b", func(c *processor.Config) { c.GroupProtocol = protocol })
				if err := members.WaitCommitted(ctx, e.pool, e.schema, e.group, total, 50*time.Millisecond); err != nil {
					t.Fatal(err)
				}
				if err := m.Leave(); err != nil {
					t.Fatal(err)
				}
				if st := m.Stats(); st.RecordsConsumed != total || st.Applied != 0 {
					t.Errorf("the replay read %d records and applied %d events, want all %d read and none applied again", st.RecordsConsumed, st.Applied, total)
				}
				e.check(s.Unique)
			})
		})
	}
}

// groupSession sets the test group's consumer-protocol session timeout
// (the group config consumer.session.timeout.ms), where the broker has
// group configs (kfake has not: its default, 45s, stays).
func (e *env) groupSession(d time.Duration) {
	e.t.Helper()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeGroupConfig, e.group
	c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	c.Name, c.Value = "consumer.session.timeout.ms", kmsg.StringPtr(strconv.FormatInt(d.Milliseconds(), 10))
	res.Configs = append(res.Configs, c)
	req.Resources = append(req.Resources, res)
	ctx, cancel := context.WithTimeout(e.t.Context(), 10*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, e.client())
	if err == nil && len(resp.Resources) == 1 {
		err = kerr.ErrorForCode(resp.Resources[0].ErrorCode)
	}
	if err != nil {
		e.t.Logf("group config consumer.session.timeout.ms not set: %v", err)
	}
}

// A rewind that reaches records older than the dedup horizon is refused,
// unless forced; the forced rewind is recorded as such.
func TestRewindPastHorizon(t *testing.T) {
	eachBroker(t, func(t *testing.T, seeds []string) {
		e := newEnv(t, seeds)
		s := stream(t, 20)
		now := time.Now()
		e.produce(s.Messages[:10], now.Add(-3*time.Hour))
		e.produce(s.Messages[10:], now.Add(-time.Minute))
		total := int64(len(s.Messages))
		e.runUntil(total)

		r := e.replayer(time.Hour)
		within := replay.Request{Target: replay.Target{Time: now.Add(-30 * time.Minute)}}
		plan, err := r.Plan(t.Context(), within)
		if err != nil {
			t.Fatal(err)
		}
		if err := plan.CheckHorizon(within); err != nil {
			t.Errorf("a rewind within the horizon was refused: %v", err)
		}
		past := replay.Request{Target: replay.Target{Start: true}}
		plan, err = r.Plan(t.Context(), past)
		if err != nil {
			t.Fatal(err)
		}
		err = r.Rewind(t.Context(), plan, past)
		var he *replay.HorizonError
		if !errors.As(err, &he) || !strings.Contains(err.Error(), "--risk-reapplying-effects") {
			t.Fatalf("rewind past the horizon: err = %v, want a HorizonError naming the flag", err)
		}
		if got := sinktest.Count(t, e.pool, `SELECT count(*) FROM `+e.schema+`.sink_replays`); got != 0 {
			t.Errorf("a refused rewind left %d sink_replays rows", got)
		}
		// Unlimited horizon (no retention configured): the same rewind
		// needs no force.
		unlimited, err := e.replayer(0).Plan(t.Context(), past)
		if err != nil {
			t.Fatal(err)
		}
		if err := unlimited.CheckHorizon(past); err != nil {
			t.Errorf("with no horizon: %v", err)
		}
		// Members with a shorter dedup.retention dropped the slices
		// before two hours ago: a replayer configured with no horizon
		// still refuses to reach past what processed_events keeps.
		slices := e.schema + ".processed_events_slices"
		if _, err := e.pool.Exec(t.Context(), `UPDATE `+slices+` SET started_at = now() - interval '5 hours'`); err != nil {
			t.Fatal(err)
		}
		ret := dedup.Retention{Pool: e.pool, Schema: e.schema, Horizon: 2 * time.Hour}
		if _, err := ret.Step(t.Context()); err != nil { // slice 1 starts
			t.Fatal(err)
		}
		if _, err := e.pool.Exec(t.Context(), `UPDATE `+slices+` SET started_at = now() - interval '121 minutes' WHERE slice = 1`); err != nil {
			t.Fatal(err)
		}
		if res, err := ret.Step(t.Context()); err != nil || len(res.Dropped) != 1 {
			t.Fatalf("step = %+v, %v; want slice 0 dropped", res, err)
		}
		mustPlan := func(r *replay.Replayer, req replay.Request) *replay.Plan {
			t.Helper()
			p, err := r.Plan(t.Context(), req)
			if err != nil {
				t.Fatal(err)
			}
			return p
		}
		dropped := mustPlan(e.replayer(0), past)
		if err := dropped.CheckHorizon(past); !errors.As(err, &he) || he.KeptSince.IsZero() || !strings.Contains(err.Error(), "older slices were dropped") {
			t.Errorf("past the dropped slices, with no horizon configured: %v; want a HorizonError naming the dropped slices", err)
		}
		if err := mustPlan(e.replayer(0), within).CheckHorizon(within); err != nil {
			t.Errorf("a rewind to claims still kept was refused: %v", err)
		}
		if err := e.replayer(0).Rewind(t.Context(), dropped, past); !errors.As(err, &he) {
			t.Fatalf("rewind past the dropped slices, no horizon configured: %v; want a HorizonError", err)
		}
		forcedPast := past
		forcedPast.RiskReapplyingEffects = true
		if err := e.replayer(0).Rewind(t.Context(), dropped, forcedPast); err != nil {
			t.Fatalf("forced rewind past the dropped slices: %v", err)
		}
		if got := sinktest.Count(t, e.pool, `SELECT count(*) FROM `+e.schema+`.sink_replays WHERE forced`); got == 0 {
			t.Error("a forced rewind past the dropped slices, with no horizon configured, was not recorded as forced")
		}
		if _, err := e.pool.Exec(t.Context(), `DELETE FROM `+e.schema+`.sink_replays`); err != nil {
			t.Fatal(err)
		}
		// The next rewind starts from where the forced one left the group.
		e.runUntil(total)
		plan = mustPlan(r, past)
		past.RiskReapplyingEffects = true
		if err := r.Rewind(t.Context(), plan, past); err != nil {
			t.Fatalf("forced rewind: %v", err)
		}
		if got := sinktest.Count(t, e.pool, `SELECT count(*) FROM `+e.schema+`.sink_replays WHERE forced`); got == 0 {
			t.Error("the forced rewind is not recorded as forced")
		}
	})
}

// A plan made before the group consumed more is stale: Rewind refuses it
// and moves nothing.
func TestRewindRefusesAStalePlan(t *testing.T) {
	eachBroker(t, func(t *testing.T, seeds []string) {
		e := newEnv(t, seeds)
		s := stream(t, 20)
		e.produce(s.Messages, time.Now())
		total := int64(len(s.Messages))
		e.runUntil(total)
		r := e.replayer(0)
		req := replay.Request{Target: replay.Target{Start: true}}
		plan, err := r.Plan(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		// As if a member had stored another offset since the plan.
		if _, err := e.pool.Exec(t.Context(), `UPDATE `+e.schema+`.sink_offsets SET next_offset = next_offset - 1 WHERE consumer_group = $1 AND partition = 0 AND next_offset > 0`, e.group); err != nil {
			t.Fatal(err)
		}
		before := sinktest.Count(t, e.pool, `SELECT sum(next_offset) FROM `+e.schema+`.sink_offsets WHERE consumer_group = $1`, e.group)
		if err := r.Rewind(t.Context(), plan, req); err == nil || !strings.Contains(err.Error(), "plan again") {
			t.Fatalf("rewind with a stale plan: err = %v, want a refusal", err)
		}
		if got := sinktest.Count(t, e.pool, `SELECT sum(next_offset) FROM `+e.schema+`.sink_offsets WHERE consumer_group = $1`, e.group); got != before {
			t.Errorf("a refused rewind moved sink_offsets: sum %d, want %d", got, before)
		}
	})
}
