package replay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/onceflow/onceflow/dedup"
)

// ErrGroupActive is returned (wrapped in a *GroupActiveError) when a rewind
// finds the group with members: a running member would go on from its own
// position, and its commits would undo the rewind; a static member that
// stopped for a restart would take its partitions back from where it was.
var ErrGroupActive = errors.New("consumer group has members")

// GroupActiveError names the group's state and members.
type GroupActiveError struct {
	Group    string
	State    string
	Protocol string   // the group's protocol: "classic" or "consumer"
	Members  []string // client ids @ hosts, of the members not in Left
	// Static are the instance ids of the static members among Members.
	// Under the classic protocol a static member's stop does not leave
	// the group (KIP-345): whether one is running or stopped for a
	// restart, the brokers do not say.
	Static []string
	// Left are the instance ids of the static members that left for now
	// (consumer protocol, member epoch -2): stopped, their place and
	// partitions kept for a restart within the session timeout.
	Left []string
	// SessionTimeout is when Left (classic: stopped Static) members
	// expire: the group's consumer.session.timeout.ms, else the brokers'
	// group.consumer.session.timeout.ms, under the consumer protocol;
	// Config.SessionTimeout under the classic one. 0 when unknown.
	SessionTimeout time.Duration
}

func (e *GroupActiveError) Error() string {
	var b strings.Builder
	if e.Protocol != "consumer" && len(e.Static) > 0 && len(e.Static) == len(e.Members) {
		session := "their session timeout (kafka.session_timeout)"
		if e.SessionTimeout > 0 {
			session = "their session timeout (kafka.session_timeout: " + e.SessionTimeout.String() + ")"
		}
		fmt.Fprintf(&b, "replay: group %s still lists %d member(s), all static, instance id(s) %s (%s): a static member's stop keeps its place and partitions for a restart (KIP-345), "+
			"so a stopped one stays listed until %s expires; once every `onceflow run` of the group is stopped, wait that long or remove them with onceflow replay's --remove-static-members %s: %v",
			e.Group, len(e.Members), strings.Join(e.Static, ", "), strings.Join(e.Members, ", "), session, strings.Join(e.Static, ","), ErrGroupActive)
		return b.String()
	}
	if len(e.Members) > 0 {
		fmt.Fprintf(&b, "replay: group %s is %s with %d live member(s) (%s): stop every `onceflow run` of the group (and wait for it to leave) before a rewind",
			e.Group, e.State, len(e.Members), strings.Join(e.Members, ", "))
	} else {
		fmt.Fprintf(&b, "replay: group %s has no running member", e.Group)
	}
	session := "the group's session timeout"
	if e.SessionTimeout > 0 {
		session += " (" + e.SessionTimeout.String() + ")"
	}
	switch e.Protocol {
	case "consumer":
		if len(e.Left) > 0 {
			session = "the group's session timeout (the group's consumer.session.timeout.ms, else group.consumer.session.timeout.ms on the brokers)"
			if e.SessionTimeout > 0 {
				session = "the group's session timeout, " + e.SessionTimeout.String() + " (the group's consumer.session.timeout.ms, else group.consumer.session.timeout.ms on the brokers)"
			}
			fmt.Fprintf(&b, "; it still holds %d static member(s) that left for now, instance id(s) %s (a static member's stop keeps its place and partitions for a restart, KIP-345): "+
				"they expire after %s, or remove them with onceflow replay's --remove-static-members %s",
				len(e.Left), strings.Join(e.Left, ", "), session, strings.Join(e.Left, ","))
		}
	default:
		if len(e.Static) > 0 {
			if e.SessionTimeout > 0 {
				session = "their session timeout (kafka.session_timeout: " + e.SessionTimeout.String() + ")"
			} else {
				session = "their session timeout (kafka.session_timeout)"
			}
			fmt.Fprintf(&b, "; of them, static member(s) with instance id(s) %s stay in the group when stopped, to restart in place (KIP-345): "+
				"once stopped they expire after %s, or remove them with onceflow replay's --remove-static-members %s",
				strings.Join(e.Static, ", "), session, strings.Join(e.Static, ","))
		}
	}
	fmt.Fprintf(&b, ": %v", ErrGroupActive)
	return b.String()
}

func (e *GroupActiveError) Unwrap() error { return ErrGroupActive }

// CheckStopped returns a *GroupActiveError when the group has members or
// is rebalancing, per the group coordinator (classic groups, and KIP-848
// consumer groups), static members that stopped for a restart included.
func (r *Replayer) CheckStopped(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
	defer cancel()
	// A consumer group first: a broker may describe it as an empty
	// classic group too.
	if cg, err := r.adm.DescribeConsumerGroups(ctx, r.cfg.Group); err == nil {
		if g, ok := cg[r.cfg.Group]; ok && g.Err == nil {
			if len(g.Members) == 0 && idle(g.State) {
				return nil
			}
			ae := &GroupActiveError{Group: r.cfg.Group, State: g.State, Protocol: "consumer"}
			for _, m := range g.Members {
				if m.InstanceID != nil && m.MemberEpoch == -2 {
					ae.Left = append(ae.Left, *m.InstanceID)
					continue
				}
				ae.Members = append(ae.Members, m.ClientID+"@"+m.ClientHost)
				if m.InstanceID != nil {
					ae.Static = append(ae.Static, *m.InstanceID)
				}
			}
			if len(ae.Left) > 0 {
				ae.SessionTimeout = r.consumerSession(ctx, g.Coordinator.NodeID)
			}
			return ae
		}
	}
	described, err := r.adm.DescribeGroups(ctx, r.cfg.Group)
	if err != nil {
		return fmt.Errorf("replay: describe group %s: %w", r.cfg.Group, err)
	}
	if g, ok := described[r.cfg.Group]; ok && g.Err == nil && (len(g.Members) > 0 || !idle(g.State)) {
		ae := &GroupActiveError{Group: r.cfg.Group, State: g.State, Protocol: "classic", SessionTimeout: r.cfg.SessionTimeout}
		for _, m := range g.Members {
			ae.Members = append(ae.Members, m.ClientID+"@"+m.ClientHost)
			if m.InstanceID != nil {
				ae.Static = append(ae.Static, *m.InstanceID)
			}
		}
		return ae
	}
	return nil
}

// consumerSession returns the group's consumer-protocol session timeout:
// its group config consumer.session.timeout.ms, else the coordinator's
// group.consumer.session.timeout.ms; 0 when neither can be read.
func (r *Replayer) consumerSession(ctx context.Context, coordinator int32) time.Duration {
	ms := func(v *string) time.Duration {
		if v == nil {
			return 0
		}
		n, err := strconv.ParseInt(*v, 10, 64)
		if err != nil || n <= 0 {
			return 0
		}
		return time.Duration(n) * time.Millisecond
	}
	req := kmsg.NewPtrDescribeConfigsRequest()
	res := kmsg.NewDescribeConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeGroupConfig, r.cfg.Group
	res.ConfigNames = []string{"consumer.session.timeout.ms"}
	req.Resources = append(req.Resources, res)
	if resp, err := req.RequestWith(ctx, r.cl); err == nil {
		for _, rr := range resp.Resources {
			if rr.ErrorCode != 0 {
				continue
			}
			for _, c := range rr.Configs {
				if c.Name == "consumer.session.timeout.ms" && c.Source == kmsg.ConfigSourceGroupConfig {
					if d := ms(c.Value); d > 0 {
						return d
					}
				}
			}
		}
	}
	rcs, err := r.adm.DescribeBrokerConfigs(ctx, coordinator)
	if err != nil {
		return 0
	}
	for _, rc := range rcs {
		for _, c := range rc.Configs {
			if c.Key == "group.consumer.session.timeout.ms" {
				return ms(c.Value)
			}
		}
	}
	return 0
}

// RemoveStaticMembers removes from the group the static members with the
// given instance ids, each of which must be a member of the group that is
// not running: under the consumer protocol one that left for now (member
// epoch -2), which the brokers tell, and an error names a live one
// without removing anything; under the classic protocol the brokers
// cannot tell, and the caller vouches that the members are stopped (a
// running one that is removed rejoins, and a rewind after it fences its
// partitions in Postgres: it goes on from the rewound offsets). It is what
// a static member's session expiry would do, now.
func (r *Replayer) RemoveStaticMembers(ctx context.Context, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
	defer cancel()
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	if cg, err := r.adm.DescribeConsumerGroups(ctx, r.cfg.Group); err == nil {
		if g, ok := cg[r.cfg.Group]; ok && g.Err == nil {
			holders := map[string]string{}
			for _, m := range g.Members {
				if m.InstanceID == nil || !want[*m.InstanceID] {
					continue
				}
				if m.MemberEpoch != -2 {
					return fmt.Errorf("replay: group %s: static member %s (%s@%s) is running, not left: stop it, nothing removed",
						r.cfg.Group, *m.InstanceID, m.ClientID, m.ClientHost)
				}
				holders[*m.InstanceID] = m.MemberID
			}
			if err := r.missing(ids, holders); err != nil {
				return err
			}
			for _, id := range ids {
				// The leave the member would send (epoch -1: for good).
				req := kmsg.NewPtrConsumerGroupHeartbeatRequest()
				req.Group, req.MemberID, req.MemberEpoch = r.cfg.Group, holders[id], -1
				req.InstanceID = kmsg.StringPtr(id)
				resp, err := req.RequestWith(ctx, r.cl)
				if err == nil {
					err = kerr.ErrorForCode(resp.ErrorCode)
				}
				if err != nil && !errors.Is(err, kerr.UnknownMemberID) { // expired meanwhile
					return fmt.Errorf("replay: group %s: remove static member %s: %w", r.cfg.Group, id, err)
				}
				r.cfg.Logger.Info("replay: static member removed from the group", "group", r.cfg.Group, "instance_id", id)
			}
			return nil
		}
	}
	described, err := r.adm.DescribeGroups(ctx, r.cfg.Group)
	if err != nil {
		return fmt.Errorf("replay: describe group %s: %w", r.cfg.Group, err)
	}
	holders := map[string]string{}
	if g, ok := described[r.cfg.Group]; ok && g.Err == nil {
		for _, m := range g.Members {
			if m.InstanceID != nil && want[*m.InstanceID] {
				holders[*m.InstanceID] = m.MemberID
			}
		}
	}
	if err := r.missing(ids, holders); err != nil {
		return err
	}
	resps, err := r.adm.LeaveGroup(ctx, kadm.LeaveGroup(r.cfg.Group).InstanceIDs(ids...).Reason("onceflow replay --remove-static-members"))
	if err != nil {
		return fmt.Errorf("replay: group %s: remove static members: %w", r.cfg.Group, err)
	}
	for _, id := range ids {
		if lr, ok := resps[id]; ok && lr.Err != nil && !errors.Is(lr.Err, kerr.UnknownMemberID) {
			return fmt.Errorf("replay: group %s: remove static member %s: %w", r.cfg.Group, id, lr.Err)
		}
		r.cfg.Logger.Info("replay: static member removed from the group", "group", r.cfg.Group, "instance_id", id)
	}
	return nil
}

// missing returns an error naming the ids that no member of the group
// holds, or nil.
func (r *Replayer) missing(ids []string, holders map[string]string) error {
	var none []string
	for _, id := range ids {
		if _, ok := holders[id]; !ok {
			none = append(none, id)
		}
	}
	if len(none) > 0 {
		return fmt.Errorf("replay: group %s has no static member with instance id %s: nothing removed", r.cfg.Group, strings.Join(none, ", "))
	}
	return nil
}

// idle reports whether a group state has no members: Empty, or Dead (the
// group does not exist).
func idle(state string) bool {
	s := strings.ToLower(state)
	return s == "empty" || s == "dead" || s == ""
}

// Rewind performs plan: it checks that the group is stopped and that the
// plan stays within the dedup horizon (unless req forces it), then, for
// every partition that moves, in one Postgres transaction stores the
// target in sink_offsets with a new epoch and records a sink_replays row,
// and then commits the targets to Kafka for the group. A partition whose
// stored offset is no longer the plan's Current (the group consumed since
// the plan) makes the whole rewind fail with nothing changed.
//
// Postgres is written first because members resume from it: if the Kafka
// commit then fails, the rewind has still happened for every member (the
// error says so; Kafka's offsets then follow at the group's first commits). The new epoch fences any member that took a partition before the
// transaction, so none can store an offset over the rewind.
func (r *Replayer) Rewind(ctx context.Context, plan *Plan, req Request) error {
	if err := plan.CheckHorizon(req); err != nil {
		return err
	}
	if err := r.CheckStopped(ctx); err != nil {
		return err
	}
	moves := slices.DeleteFunc(slices.Clone(plan.Partitions), func(p Partition) bool { return p.Target >= p.Current })
	if len(moves) == 0 {
		return nil
	}
	forced := req.RiskReapplyingEffects && plan.checkHorizon(time.Now(), false) != nil
	var handler *string
	if plan.Backfill != "" {
		handler = &plan.Backfill
	}
	n := len(moves)
	topics, parts, targets, currents := make([]string, n), make([]int32, n), make([]int64, n), make([]int64, n)
	for i, p := range moves {
		topics[i], parts[i], targets[i], currents[i] = p.Topic, p.Partition, p.Target, p.Current
	}
	pctx, cancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
	defer cancel()
	err := pgx.BeginFunc(pctx, r.cfg.Pool, func(tx pgx.Tx) error {
		// Under the retention lock, no slice is dropped between reading
		// what is kept and recording the rewind; once recorded, drops
		// wait until the group has caught up (sink.ReplayInProgress).
		if err := dedup.LockRetention(pctx, tx, r.cfg.Schema); err != nil {
			return err
		}
		now := *plan
		kept, err := r.keptSince(pctx, tx)
		if err != nil {
			return err
		}
		now.KeptSince = kept
		if err := now.CheckHorizon(req); err != nil {
			return err
		}
		if err := r.checkUnmoved(pctx, tx, moves); err != nil {
			return err
		}
		if _, err := tx.Exec(pctx, `INSERT INTO `+r.table("sink_offsets")+` AS o (consumer_group, topic, partition, next_offset, epoch)
SELECT $1, m.topic, m.partition, m.target, 1 FROM unnest($2::text[], $3::int[], $4::bigint[]) AS m(topic, partition, target)
ORDER BY m.topic, m.partition
ON CONFLICT (consumer_group, topic, partition) DO UPDATE SET next_offset = excluded.next_offset, epoch = o.epoch + 1, updated_at = now()`,
			r.cfg.Group, topics, parts, targets); err != nil {
			return fmt.Errorf("store the targets in sink_offsets: %w", err)
		}
		if _, err := tx.Exec(pctx, `INSERT INTO `+r.table("sink_replays")+` (consumer_group, topic, partition, from_offset, to_offset, handler, forced)
SELECT $1, m.topic, m.partition, m.current, m.target, $5, $6 FROM unnest($2::text[], $3::int[], $4::bigint[], $7::bigint[]) AS m(topic, partition, target, current)`,
			r.cfg.Group, topics, parts, targets, handler, forced, currents); err != nil {
			return fmt.Errorf("record the rewind in sink_replays: %w", err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("replay: rewind group %s in Postgres (nothing changed): %w", r.cfg.Group, err)
	}
	offsets := kadm.Offsets{}
	for _, p := range moves {
		offsets.Add(kadm.Offset{Topic: p.Topic, Partition: p.Partition, At: p.Target, LeaderEpoch: -1})
	}
	kctx, kcancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
	defer kcancel()
	resp, err := r.adm.CommitOffsets(kctx, r.cfg.Group, offsets)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		return fmt.Errorf("replay: group %s is rewound in Postgres, where members resume, so the replay will happen; "+
			"its Kafka committed offsets are not rewound (%w) and follow once the group commits again", r.cfg.Group, err)
	}
	r.cfg.Logger.Info("replay: group rewound", "group", r.cfg.Group, "partitions", len(moves), "backfill", plan.Backfill, "forced", forced)
	return nil
}

// checkUnmoved locks the sink_offsets rows of moves and returns an error if
// one holds an offset other than the plan's Current: the group consumed
// since the plan, whose counts and targets are then stale.
func (r *Replayer) checkUnmoved(ctx context.Context, tx pgx.Tx, moves []Partition) error {
	topics, parts := make([]string, len(moves)), make([]int32, len(moves))
	planned := map[TopicPartition]int64{}
	for i, p := range moves {
		topics[i], parts[i] = p.Topic, p.Partition
		planned[p.TopicPartition] = p.Current
	}
	rows, err := tx.Query(ctx, `SELECT o.topic, o.partition, o.next_offset FROM `+r.table("sink_offsets")+` o
JOIN unnest($2::text[], $3::int[]) AS m(topic, partition) ON o.topic = m.topic AND o.partition = m.partition
WHERE o.consumer_group = $1 AND o.next_offset IS NOT NULL
ORDER BY o.topic, o.partition FOR UPDATE OF o`, r.cfg.Group, topics, parts)
	if err != nil {
		return fmt.Errorf("lock sink_offsets: %w", err)
	}
	var tp TopicPartition
	var next int64
	var moved error
	_, err = pgx.ForEachRow(rows, []any{&tp.Topic, &tp.Partition, &next}, func() error {
		if cur := planned[tp]; next != cur && moved == nil {
			moved = fmt.Errorf("%s is at offset %d, not %d as planned: the group consumed since the plan; plan again", tp, next, cur)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("lock sink_offsets: %w", err)
	}
	return moved
}
