package replay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ErrGroupActive is returned (wrapped in a *GroupActiveError) when a rewind
// finds the group with members: a running member would go on from its own
// position, and its commits would undo the rewind; a static member that
// stopped for a restart would take its partitions back from where it was.
var ErrGroupActive = errors.New("consumer group has members")

// ErrNoSuchStaticMember is returned (wrapped) when an instance id given to
// RemoveStaticMembers or CheckStopped is held by no member of the group,
// and nothing else blocks a rewind.
var ErrNoSuchStaticMember = errors.New("no such static member")

// GroupActiveError names the group's state and the members that block a
// rewind, and says why each kind of member is still listed and how long it
// stays: a running member, one that crashed (listed until its session
// timeout expires: the brokers cannot tell it from a running one), a
// static member that stopped (kept for a restart, KIP-345).
type GroupActiveError struct {
	Group    string
	State    string
	Protocol string   // the group's protocol: "classic" or "consumer"
	Members  []string // client ids @ hosts, of the members not in Left
	// Static are the instance ids of the static members among Members.
	// Under the classic protocol a static member's stop does not leave
	// the group (KIP-345): whether one is running, stopped for a restart
	// or crashed, the brokers do not say. Under the consumer protocol a
	// static member among Members is running, or crashed.
	Static []string
	// Left are the instance ids of the static members that left for now
	// (consumer protocol, member epoch -2): stopped, their place and
	// partitions kept for a restart within the session timeout.
	Left []string
	// SessionTimeout is when a member that crashed (and a stopped static
	// member) expires. Under the consumer protocol it is the group's:
	// its consumer.session.timeout.ms, else the brokers'
	// group.consumer.session.timeout.ms. Under the classic protocol each
	// member chose its own, which the brokers do not tell: it is this
	// process's Config.SessionTimeout, quoted as such. 0 when unknown.
	SessionTimeout time.Duration
	// Remove are the instance ids the caller asked to remove
	// (RemoveStaticMembers, replay --remove-static-members): none was
	// removed. Unknown are those of them no member holds; NotLeft, under
	// the consumer protocol, those held by a member among Members (only
	// one that left can be removed).
	Remove, Unknown, NotLeft []string

	members []groupMember // as described, for the message
}

func (e *GroupActiveError) Error() string {
	var b strings.Builder
	listed := 0
	for _, m := range e.members {
		if !m.left {
			listed++
		}
	}
	switch {
	case listed > 0:
		var names []string
		for _, m := range e.members {
			if !m.left {
				names = append(names, m.label())
			}
		}
		fmt.Fprintf(&b, "replay: group %s is %s and lists %d member(s) (%s)", e.Group, e.State, listed, strings.Join(names, ", "))
	case len(e.Left) > 0:
		fmt.Fprintf(&b, "replay: group %s has no running member", e.Group)
	default:
		fmt.Fprintf(&b, "replay: group %s is %s, with no member listed", e.Group, e.State)
	}
	session := e.session()
	var dynamic, liveStatic int
	for _, m := range e.members {
		switch {
		case m.left:
		case m.instance == "":
			dynamic++
		default:
			liveStatic++
		}
	}
	if e.Protocol == "consumer" {
		if dynamic+liveStatic > 0 {
			fmt.Fprintf(&b, "; stop every `onceflow run` of the group before a rewind (a static member's stop leaves for now, and can then be removed); "+
				"a member that crashed (killed, its host lost) stays listed as running for %s after its last heartbeat: "+
				"if no `onceflow run` of the group is left on the host(s) named, wait that long and run replay again", session)
			if liveStatic > 0 {
				fmt.Fprintf(&b, " (--remove-static-members cannot remove %s: listed as running, it has not left)", strings.Join(e.Static, ", "))
			}
		}
		if len(e.Left) > 0 {
			fmt.Fprintf(&b, "; it still holds %d static member(s) that left for now, instance id(s) %s (a static member's stop keeps its place and partitions for a restart, KIP-345): "+
				"they expire after %s, or remove them with onceflow replay's --remove-static-members %s",
				len(e.Left), strings.Join(e.Left, ", "), session, strings.Join(e.Left, ","))
		}
	} else {
		if dynamic > 0 {
			fmt.Fprintf(&b, "; stop every `onceflow run` of the group (and wait for it to leave) before a rewind; "+
				"a member that crashed (killed, its host lost) stays listed for %s after its last heartbeat: "+
				"if no `onceflow run` of the group is left on the host(s) named, wait that long and run replay again", session)
		}
		if liveStatic > 0 {
			fmt.Fprintf(&b, "; static member(s) with instance id(s) %s stay in the group when stopped, to restart in place (KIP-345), and so does one that crashed, "+
				"for %s after their last heartbeat; the brokers cannot tell a stopped static member from a running one: "+
				"once every `onceflow run` of the group is stopped, wait that long, or remove them with onceflow replay's --remove-static-members %s",
				strings.Join(e.Static, ", "), session, strings.Join(e.Static, ","))
		}
	}
	if len(e.Remove) > 0 {
		fmt.Fprintf(&b, "; --remove-static-members %s: ", strings.Join(e.Remove, ","))
		var why []string
		if len(e.Unknown) > 0 {
			why = append(why, "no member has instance id(s) "+strings.Join(e.Unknown, ", "))
		}
		if len(e.NotLeft) > 0 {
			why = append(why, strings.Join(e.NotLeft, ", ")+" listed as running, not left (running, or crashed and listed until the session timeout): only a static member that left can be removed")
		}
		if len(why) == 0 {
			why = append(why, "the members above that it does not name would stay, and the rewind would still be refused: name them all, or stop them first")
		}
		fmt.Fprintf(&b, "%s; nothing removed", strings.Join(why, "; "))
	}
	fmt.Fprintf(&b, ": %v", ErrGroupActive)
	return b.String()
}

// session names the session timeout after which a crashed or stopped
// static member is no longer listed, and where that figure comes from.
func (e *GroupActiveError) session() string {
	if e.Protocol == "consumer" {
		where := "its consumer.session.timeout.ms, else group.consumer.session.timeout.ms on the brokers"
		if e.SessionTimeout > 0 {
			return "the group's session timeout, " + e.SessionTimeout.String() + " (" + where + ")"
		}
		return "the group's session timeout (" + where + "; not readable here)"
	}
	if e.SessionTimeout > 0 {
		return "the session timeout each member set, the members' kafka.session_timeout (this config: " + e.SessionTimeout.String() + "; the brokers do not tell a classic member's)"
	}
	return "the session timeout each member set, the members' kafka.session_timeout (the brokers do not tell a classic member's)"
}

func (e *GroupActiveError) Unwrap() error { return ErrGroupActive }

// groupMember is one member of a described group.
type groupMember struct {
	addr     string // client id @ host
	instance string // "" for a dynamic member
	memberID string
	left     bool // a static member that left for now (consumer protocol, epoch -2)
}

func (m groupMember) label() string {
	if m.instance == "" {
		return m.addr
	}
	return m.addr + " instance id " + m.instance
}

// described is a group as its coordinator describes it.
type described struct {
	state, protocol string
	members         []groupMember
	session         time.Duration // see GroupActiveError.SessionTimeout
}

// describe describes the group: a consumer-protocol group first (a broker
// may describe it as an empty classic group too), else a classic one.
func (r *Replayer) describe(ctx context.Context) (described, error) {
	if cg, err := r.adm.DescribeConsumerGroups(ctx, r.cfg.Group); err == nil {
		if g, ok := cg[r.cfg.Group]; ok && g.Err == nil {
			d := described{state: g.State, protocol: "consumer"}
			for _, m := range g.Members {
				gm := groupMember{addr: m.ClientID + "@" + m.ClientHost, memberID: m.MemberID}
				if m.InstanceID != nil {
					gm.instance, gm.left = *m.InstanceID, m.MemberEpoch == -2
				}
				d.members = append(d.members, gm)
			}
			if len(d.members) > 0 {
				d.session = r.consumerSession(ctx, g.Coordinator.NodeID)
			}
			return d, nil
		}
	}
	groups, err := r.adm.DescribeGroups(ctx, r.cfg.Group)
	if err != nil {
		return described{}, fmt.Errorf("replay: describe group %s: %w", r.cfg.Group, err)
	}
	d := described{state: "Dead", protocol: "classic", session: r.cfg.SessionTimeout}
	if g, ok := groups[r.cfg.Group]; ok && g.Err == nil {
		d.state = g.State
		for _, m := range g.Members {
			gm := groupMember{addr: m.ClientID + "@" + m.ClientHost, memberID: m.MemberID}
			if m.InstanceID != nil {
				gm.instance = *m.InstanceID
			}
			d.members = append(d.members, gm)
		}
	}
	return d, nil
}

// refusal returns nil when d, once the static members with the instance
// ids remove are removed, has no member; else a *GroupActiveError naming
// every member that blocks a rewind and every id of remove that cannot be
// removed; or, when only ids no member holds are wrong, an error wrapping
// ErrNoSuchStaticMember.
func (r *Replayer) refusal(d described, remove []string) error {
	byInstance := map[string]groupMember{}
	for _, m := range d.members {
		if m.instance != "" {
			byInstance[m.instance] = m
		}
	}
	slices.SortFunc(d.members, func(a, b groupMember) int {
		return cmp.Or(cmp.Compare(a.instance, b.instance), cmp.Compare(a.addr, b.addr))
	})
	e := &GroupActiveError{Group: r.cfg.Group, State: d.state, Protocol: d.protocol, SessionTimeout: d.session, members: d.members}
	want := map[string]bool{}
	for _, id := range remove {
		if want[id] {
			continue
		}
		want[id] = true
		e.Remove = append(e.Remove, id)
		switch m, ok := byInstance[id]; {
		case !ok:
			e.Unknown = append(e.Unknown, id)
		case d.protocol == "consumer" && !m.left:
			e.NotLeft = append(e.NotLeft, id)
		}
	}
	blocked := len(d.members) == 0 && !idle(d.state)
	for _, m := range d.members {
		if m.left {
			e.Left = append(e.Left, m.instance)
		} else {
			e.Members = append(e.Members, m.addr)
			if m.instance != "" {
				e.Static = append(e.Static, m.instance)
			}
		}
		removable := m.instance != "" && want[m.instance] && (d.protocol != "consumer" || m.left)
		if !removable {
			blocked = true
		}
	}
	switch {
	case blocked:
		return e
	case len(e.Unknown) > 0:
		var held []string
		for _, m := range d.members {
			if m.instance != "" {
				held = append(held, m.instance)
			}
		}
		listed := "none"
		if len(held) > 0 {
			listed = strings.Join(held, ", ")
		}
		return fmt.Errorf("replay: group %s has no static member with instance id %s (its static members: %s; one may have expired since): rerun without it; nothing removed: %w",
			r.cfg.Group, strings.Join(e.Unknown, ", "), listed, ErrNoSuchStaticMember)
	}
	return nil
}

// CheckStopped returns nil when the group has no member and is not
// rebalancing, per the group coordinator (classic groups, and KIP-848
// consumer groups), static members that stopped for a restart included,
// once the static members with the instance ids remove are removed (see
// RemoveStaticMembers; CheckStopped removes nothing). Otherwise it returns
// a *GroupActiveError naming every member that blocks a rewind and every
// id of remove that cannot be removed, or, when only ids no member holds
// are wrong, an error wrapping ErrNoSuchStaticMember. Other errors are
// failures to describe the group.
func (r *Replayer) CheckStopped(ctx context.Context, remove ...string) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
	defer cancel()
	d, err := r.describe(ctx)
	if err != nil {
		return err
	}
	return r.refusal(d, remove)
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
// given instance ids, what their session expiry would do, now. It first
// checks as CheckStopped(ctx, ids...) does, and removes nothing unless the
// group, once they are gone, has no member: an id no member holds, under
// the consumer protocol an id of a member that has not left (it is
// running, or it crashed and is listed until its session timeout), or a
// member the ids do not name makes it return that refusal, with the group
// unchanged. Under the classic protocol the brokers cannot tell a stopped
// static member from a running one: the caller vouches that the members
// are stopped (a running one that is removed rejoins, and a rewind after
// it fences its partitions in Postgres: it goes on from the rewound
// offsets). A member that joins between the check and the removal is not
// seen here; Rewind's own check refuses it.
func (r *Replayer) RemoveStaticMembers(ctx context.Context, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
	defer cancel()
	d, err := r.describe(ctx)
	if err != nil {
		return err
	}
	if err := r.refusal(d, ids); err != nil {
		return err
	}
	ids = slices.Compact(slices.Sorted(slices.Values(ids)))
	if d.protocol == "consumer" {
		holders := map[string]string{}
		for _, m := range d.members {
			holders[m.instance] = m.memberID
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

// idle reports whether a group state has no members: Empty, or Dead (the
// group does not exist).
func idle(state string) bool {
	s := strings.ToLower(state)
	return s == "empty" || s == "dead" || s == ""
}
