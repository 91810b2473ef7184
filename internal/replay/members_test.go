package replay_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/onceflow/onceflow/internal/members"
	"github.com/onceflow/onceflow/internal/replay"
	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// listed returns the instance ids of the static members the group lists,
// sorted, as its coordinator describes it.
func (e *env) listed() []string {
	e.t.Helper()
	ids, _ := e.describe()
	return ids
}

// waitOwners waits until the group is Stable, lists the static members
// ids and no other, and each of them owns a partition (describeOwners).
func (e *env) waitOwners(ctx context.Context, ids []string) {
	e.t.Helper()
	for got, state, owners := e.describeOwners(); !slices.Equal(got, ids) || state != "Stable" || owners != len(ids); got, state, owners = e.describeOwners() {
		select {
		case <-ctx.Done():
			e.t.Fatalf("the group is %s and lists %v, %d of them owning partitions, want it Stable with the static members %v owning one each", state, got, owners, ids)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// describe returns the instance ids of the static members the group lists,
// sorted, and the group's state.
func (e *env) describe() ([]string, string) {
	e.t.Helper()
	ids, state, _ := e.describeOwners()
	return ids, state
}

// describeOwners is describe, and how many of the listed members own at
// least one partition. Under the classic protocol's cooperative-sticky
// balancing the group is Stable, and lists a member that joined, after a
// first round in which the owner only revokes what the newcomer is to get;
// the newcomer is assigned it in the round that follows. A static member
// that stops between the two rounds leaves the group for good (its client
// sends LeaveGroup so that the revoked partitions get assigned), so a test
// that stops static members to see them stay listed waits for every member
// to own a partition.
func (e *env) describeOwners() ([]string, string, int) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), 10*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.seeds...))
	if err != nil {
		e.t.Fatal(err)
	}
	defer cl.Close() // describe runs in wait loops: a client each, closed at once
	adm := kadm.NewClient(cl)
	var ids []string
	owners := 0
	if cg, err := adm.DescribeConsumerGroups(ctx, e.group); err == nil && cg[e.group].Err == nil {
		for _, m := range cg[e.group].Members {
			if m.InstanceID != nil {
				ids = append(ids, *m.InstanceID)
			}
			if len(m.Assignment.Sorted()) > 0 {
				owners++
			}
		}
		slices.Sort(ids)
		return ids, cg[e.group].State, owners
	}
	gs, err := adm.DescribeGroups(ctx, e.group)
	if err != nil {
		e.t.Fatalf("describe group %s: %v", e.group, err)
	}
	for _, m := range gs[e.group].Members {
		if m.InstanceID != nil {
			ids = append(ids, *m.InstanceID)
		}
		if a, ok := m.Assigned.AsConsumer(); ok && slices.ContainsFunc(a.Topics, func(t kmsg.ConsumerMemberAssignmentTopic) bool { return len(t.Partitions) > 0 }) {
			owners++
		}
	}
	slices.Sort(ids)
	return ids, gs[e.group].State, owners
}

// A static member that crashed (a SIGKILL: it never leaves) stays listed
// as running until its session timeout expires. The refusal says so, with
// the session timeout the brokers apply (consumer protocol: the group's;
// classic: each member's own, which the brokers do not tell, so the
// refusal quotes this config's as such, not as the members'), and that if
// no run is left, waiting that long is the way. Under the consumer
// protocol, --remove-static-members refuses the crashed member, saying the
// same rather than only "running".
func TestRefusalSaysACrashedMemberStaysListed(t *testing.T) {
	for _, protocol := range []processor.GroupProtocol{processor.ClassicProtocol, processor.ConsumerProtocol} {
		t.Run(string(protocol), func(t *testing.T) {
			eachBroker(t, func(t *testing.T, seeds []string) {
				e := newEnv(t, seeds)
				e.session = 10 * time.Second // replay's own kafka.session_timeout, not the member's
				if protocol == processor.ConsumerProtocol {
					e.groupSession(30 * time.Second)
				}
				s := stream(t, 20)
				e.produce(s.Messages, time.Now())
				total := int64(len(s.Messages))
				m := e.startWith("s1", true, func(c *processor.Config) {
					c.GroupProtocol, c.InstanceID = protocol, "inst"
					c.SessionTimeout = 30 * time.Second
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
				_ = m.Crash() // kill -9
				err = r.Rewind(t.Context(), plan, req)
				if !errors.Is(err, replay.ErrGroupActive) {
					t.Fatalf("rewind right after a static member's crash: err = %v, want ErrGroupActive", err)
				}
				t.Logf("refused: %v", err)
				wants := []string{"inst-s1", "crashed", "wait that long"}
				if protocol == processor.ConsumerProtocol {
					wants = append(wants, "session timeout, 30s")
				} else {
					wants = append(wants, "the members' kafka.session_timeout (this config: 10s")
				}
				for _, want := range wants {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("the refusal does not say %q", want)
					}
				}
				if protocol == processor.ClassicProtocol && strings.Contains(err.Error(), "kafka.session_timeout: 10s") {
					t.Errorf("the refusal gives this config's session timeout as the members': %v", err)
				}
				if got := sinktest.Count(t, e.pool, `SELECT sum(next_offset) FROM `+e.schema+`.sink_offsets WHERE consumer_group = $1`, e.group); got != total {
					t.Errorf("sink_offsets moved by a refused rewind: sum %d, want %d", got, total)
				}
				if protocol != processor.ConsumerProtocol {
					return // classic: the caller vouches the member is stopped; it is removed
				}
				err = r.RemoveStaticMembers(t.Context(), []string{"inst-s1"})
				if err == nil {
					t.Fatal("the crashed member, listed as running, was removed: want a refusal")
				}
				t.Logf("removal refused: %v", err)
				for _, want := range []string{"inst-s1", "crashed", "30s", "nothing removed"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("the removal's refusal does not say %q", want)
					}
				}
				if got := e.listed(); !slices.Equal(got, []string{"inst-s1"}) {
					t.Errorf("the group lists static members %v after a refused removal, want [inst-s1]", got)
				}
			})
		})
	}
}

// --remove-static-members removes nothing when the rewind would be refused
// anyway: with two stopped static members, naming one leaves the group
// unchanged, and the refusal names the other so the user gives them all;
// naming both removes both and the rewind goes through.
func TestRemoveStaticMembersRemovesNothingWhenOthersStay(t *testing.T) {
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
				static := func(c *processor.Config) {
					c.GroupProtocol, c.InstanceID = protocol, "inst"
					c.SessionTimeout = 30 * time.Second
				}
				// k1 takes every partition, then k2 joins: under the classic
				// protocol, the two cooperative rounds each time.
				k1 := e.startAs("k1", static)
				ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
				defer cancel()
				if err := members.WaitCommitted(ctx, e.pool, e.schema, e.group, total, 50*time.Millisecond); err != nil {
					t.Fatal(err)
				}
				e.waitOwners(ctx, []string{"inst-k1"})
				k2 := e.startAs("k2", static)
				both := []string{"inst-k1", "inst-k2"}
				e.waitOwners(ctx, both)
				r := e.replayer(0)
				req := replay.Request{Target: replay.Target{Start: true}}
				plan, err := r.Plan(t.Context(), req)
				if err != nil {
					t.Fatal(err)
				}
				for _, m := range []members.Member{k1, k2} {
					if err := m.Leave(); err != nil { // a SIGTERM's drain: both stay in the group
						t.Fatal(err)
					}
				}
				err = r.RemoveStaticMembers(t.Context(), []string{"inst-k1"})
				if !errors.Is(err, replay.ErrGroupActive) {
					t.Fatalf("remove inst-k1 alone while inst-k2 stays: err = %v, want ErrGroupActive (the rewind would be refused)", err)
				}
				t.Logf("refused: %v", err)
				for _, want := range []string{"inst-k2", "--remove-static-members inst-k1,inst-k2", "nothing removed"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("the refusal does not say %q", want)
					}
				}
				if got := e.listed(); !slices.Equal(got, both) {
					t.Errorf("a refused removal changed the group: it lists %v, want %v", got, both)
				}
				if err := r.RemoveStaticMembers(t.Context(), both); err != nil {
					t.Fatalf("remove both static members: %v", err)
				}
				if err := r.Rewind(t.Context(), plan, req); err != nil {
					t.Fatalf("rewind once both static members were removed: %v", err)
				}
			})
		})
	}
}
