package bench

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// FindLeftovers lists, and with drop drops, the schemas of runs whose
// lock no session holds (a killed run's connection is gone), never those
// of a run that holds its lock, nor a schema not named as bench names
// them; once the live run's session ends, its schemas are listed too.
func TestFindLeftoversTellsLiveRunsFromDeadOnes(t *testing.T) {
	_, us, _ := userDB(t)
	pool := sinktest.Pool(t)
	ctx := t.Context()
	prefix := us + "_l"
	dead := []string{prefix + "_0000dead_steady_r1", prefix + "_0000dead_steady_r1_t", prefix + "_0000dead_raw_copy_r2",
		prefix + "_0000dead_calib_effects_only_w4", prefix + "_0000dead_calib_effects_only_w4_t", prefix + "_0000dead_run"}
	live := []string{prefix + "_0000a11e_storm_r1", prefix + "_0000a11e_storm_r1_t", prefix + "_0000a11e_run"}
	others := []string{prefix + "_0000dead_notes", prefix + "_notarun", prefix + "x_0000dead_steady_r1", prefix + "_0000DEAD_steady_r1"}
	unmarked := []string{prefix + "_000001d0_steady_r1", prefix + "_000001d0_steady_r1_t"} // an onceflow that took no lock made them
	all := slices.Concat(dead, live, others, unmarked)
	for _, s := range all {
		if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{s}.Sanitize()); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, s := range all {
			_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{s}.Sanitize()+" CASCADE")
		}
	})
	holder, err := pgx.Connect(ctx, sinktest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(context.Background())
	if _, err := holder.Exec(ctx, "SELECT pg_advisory_lock("+runLockKey+")", "0000a11e"); err != nil {
		t.Fatal(err)
	}
	c := Config{Pool: pool, Schema: prefix}
	l, err := FindLeftovers(ctx, c, "", false)
	if err != nil {
		t.Fatal(err)
	}
	if want := slices.Sorted(slices.Values(dead)); !slices.Equal(l.Schemas, want) {
		t.Errorf("leftovers %v, want %v (not the live run's, not the others)", l.Schemas, want)
	}
	if !slices.Equal(l.Unmarked, unmarked) {
		t.Errorf("unmarked %v, want %v", l.Unmarked, unmarked)
	}
	if r := l.Report(false); !strings.Contains(r, "made by an earlier onceflow, which took no lock") || !strings.Contains(r, "--drop-leftovers drops them") {
		t.Errorf("report:\n%s", r)
	}
	if cmds := l.Commands(); len(cmds) != 1 || !strings.HasPrefix(cmds[0], `DROP SCHEMA IF EXISTS "`+prefix+`_0000dead_calib_effects_only_w4", `) {
		t.Errorf("commands %q", cmds)
	}
	if _, err := FindLeftovers(ctx, c, "", true); err != nil {
		t.Fatal(err)
	}
	exists := func(s string) bool {
		var ok bool
		if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)", s).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	for _, s := range dead {
		if exists(s) {
			t.Errorf("%s not dropped", s)
		}
	}
	for _, s := range slices.Concat(live, others, unmarked) {
		if !exists(s) {
			t.Errorf("%s dropped: a live run's, or not bench's", s)
		}
	}
	pid := holder.PgConn().PID()
	if err := holder.Close(ctx); err != nil { // as a kill would: the session ends
		t.Fatal(err)
	}
	for gone := false; !gone; time.Sleep(10 * time.Millisecond) { // the server ends the session after the client has gone
		if err := pool.QueryRow(ctx, "SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)", pid).Scan(&gone); err != nil {
			t.Fatal(err)
		}
	}
	l, err = FindLeftovers(ctx, c, "", false)
	if err != nil {
		t.Fatal(err)
	}
	if want := slices.Sorted(slices.Values(live)); !slices.Equal(l.Schemas, want) {
		t.Errorf("after the run's session ended: leftovers %v, want %v", l.Schemas, want)
	}
}

// A run holds its lock while its schemas exist: another looking for
// leftovers meanwhile does not see them; and a run says at its start
// what an earlier one left.
func TestRunHoldsItsSchemasAndSaysLeftovers(t *testing.T) {
	up, us, _ := userDB(t)
	tm, err := ParseTemplate([]byte(paymentTemplate))
	if err != nil {
		t.Fatal(err)
	}
	prefix := us + "_h"
	marker, left := prefix+"_0000dead_run", prefix+"_0000dead_steady_r1"
	for _, s := range []string{marker, left} {
		if _, err := up.Exec(t.Context(), "CREATE SCHEMA "+s); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = up.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+s) })
	}
	c := Config{Pool: up, Topic: "payments", Payloads: FromTemplate(tm), Events: 300, Partitions: 3, Members: 2,
		Scenarios: []string{Steady}, NoRawCopy: true, Schema: prefix,
		Handlers: func(string) ([]sink.Handler, error) {
			return []sink.Handler{sqlHandler(t, "payments", paymentsSQL)}, nil
		}}
	var seen []string
	p := &onWrite{f: func(line string) {
		if !strings.Contains(line, "steady (round 1)") || seen != nil {
			return
		}
		l, err := FindLeftovers(t.Context(), c, "", false)
		if err != nil {
			t.Error(err)
			return
		}
		seen = append([]string{}, l.Schemas...)
	}}
	c.Progress = p
	if _, err := Run(t.Context(), c); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if !strings.Contains(p.String(), "(killed, or kept with --keep): schemas "+marker+", "+left+"; --drop-leftovers drops them, as does:\n  DROP SCHEMA IF EXISTS \""+marker+"\", \""+left+"\" CASCADE;") {
		t.Errorf("progress:\n%s\nwant it to say %s was left, and how to drop it", p.String(), left)
	}
	if seen == nil {
		t.Fatalf("no progress line of the steady run:\n%s", p.String())
	}
	if !slices.Equal(seen, []string{marker, left}) {
		t.Errorf("leftovers found during the run: %v, want only %s (not the running one's)", seen, left)
	}
	c.DropLeftovers, c.Progress = true, nil
	if _, err := Run(t.Context(), c); err != nil {
		t.Fatalf("Run: %v", err)
	}
	l, err := FindLeftovers(t.Context(), c, "", false)
	if err != nil || !l.Empty() {
		t.Errorf("after a run with DropLeftovers: %v, %v; want none", l, err)
	}
}

// onWrite is a progress writer that calls f with each write.
type onWrite struct {
	mu sync.Mutex
	b  bytes.Buffer
	f  func(string)
}

func (w *onWrite) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.f(string(p))
	return w.b.Write(p)
}

func (w *onWrite) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return fmt.Sprint(w.b.String())
}

// With Brokers, a dead run's topic (Topic-bench-<id>) is listed and
// dropped with its schemas; a topic whose id has no schema in this
// database (another database's run, alive or not) and another topic's
// are left alone.
func TestFindLeftoversTopics(t *testing.T) {
	_, us, _ := userDB(t)
	pool := sinktest.Pool(t)
	ctx := t.Context()
	prefix := us + "_k"
	schemas := []string{prefix + "_0000dead_run", prefix + "_0000dead_steady_r1"}
	for _, s := range schemas {
		if _, err := pool.Exec(ctx, "CREATE SCHEMA "+s); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+s) })
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "payments-bench-0000dead", "payments-bench-00e15e00", "orders-bench-0000dead", "payments"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cfg := Config{Pool: pool, Schema: prefix, Topic: "payments", Brokers: c.ListenAddrs()}
	l, err := FindLeftovers(ctx, cfg, "", false)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(l.Topics, []string{"payments-bench-0000dead"}) || !slices.Equal(l.Schemas, schemas) {
		t.Fatalf("leftovers %s; want schemas %v and topic payments-bench-0000dead", l, schemas)
	}
	if cmds := l.Commands(); len(cmds) != 2 || cmds[1] != "kafka-topics.sh --bootstrap-server "+c.ListenAddrs()[0]+" --delete --topic payments-bench-0000dead" {
		t.Errorf("commands %q", cmds)
	}
	if _, err := FindLeftovers(ctx, cfg, "", true); err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ts, err := kadm.NewClient(cl).ListTopics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ts.Names(), []string{"orders-bench-0000dead", "payments", "payments-bench-00e15e00"}; !slices.Equal(slices.Sorted(slices.Values(got)), want) {
		t.Errorf("topics after the drop %v, want %v", got, want)
	}
}

// At its end, a run on real brokers deletes its consumer groups (bench
// names them onceflow-bench-…-<id>…), and no other.
func TestDeleteGroupsOfTheRun(t *testing.T) {
	ctx := t.Context()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "payments-bench-abcd1234"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	groups := []string{"onceflow-bench-steady-r1-abcd1234", "onceflow-bench-replay-r1-abcd1234-2", "onceflow-bench-steady-r1-0000dead", "payments"}
	for _, g := range groups {
		var os kadm.Offsets
		os.Add(kadm.Offset{Topic: "payments-bench-abcd1234", Partition: 0, At: 0, LeaderEpoch: -1})
		if _, err := adm.CommitOffsets(ctx, g, os); err != nil {
			t.Fatalf("commit for %s: %v", g, err)
		}
	}
	deleteGroups(ctx, adm, "abcd1234")
	ls, err := adm.ListGroups(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := slices.Sorted(slices.Values(ls.Groups())), []string{"onceflow-bench-steady-r1-0000dead", "payments"}; !slices.Equal(got, want) {
		t.Errorf("groups after the run's end %v, want %v", got, want)
	}
}
