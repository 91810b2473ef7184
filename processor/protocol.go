package processor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// GroupProtocol is the consumer-group protocol a Consumer joins its group
// with.
type GroupProtocol string

const (
	// ClassicProtocol is Kafka's JoinGroup/SyncGroup protocol, with
	// franz-go's cooperative-sticky balancer: every membership change is a
	// group-wide round of joins, in which members keep the partitions
	// they are not asked to give up.
	ClassicProtocol GroupProtocol = "classic"
	// ConsumerProtocol is KIP-848's protocol (Kafka 4.0 and later): the
	// broker assigns partitions and each member reconciles through its
	// heartbeats, with no group-wide barrier. Its session timeout and
	// heartbeat interval are the broker's (group.consumer.session.timeout.ms,
	// 45s by default, and group.consumer.heartbeat.interval.ms, 5s), not
	// Config.SessionTimeout. A broker that does not offer it makes the
	// member fall back to ClassicProtocol, with a warning.
	ConsumerProtocol GroupProtocol = "consumer"
	// DefaultGroupProtocol is Config.GroupProtocol's default.
	DefaultGroupProtocol = ClassicProtocol
)

// ErrInstanceFenced is what Run returns when, under ClassicProtocol,
// another member joined the group with this member's InstanceID: the
// broker gave it this member's partitions and fences this one. The
// member stops rather than rejoin, which would take the partitions back
// and fence the other member in turn, the two taking turns for as long
// as both run.
var ErrInstanceFenced = errors.New("processor: another member joined the group with this member's instance id")

// ErrSessionRefused is returned by Run (wrapped, naming the session
// timeout) when the brokers refuse a ClassicProtocol member's
// SessionTimeout (INVALID_SESSION_TIMEOUT): it lies outside their
// group.min.session.timeout.ms and group.max.session.timeout.ms (6s and
// 30m by default). The member never joined; it stops rather than ask
// again for as long as it runs.
var ErrSessionRefused = errors.New("processor: the brokers refuse the group's session timeout")

// ErrInstanceHeld is what Ready returns (wrapped, naming the group and
// the instance id) while, under ConsumerProtocol, the broker refuses this
// member (UNRELEASED_INSTANCE_ID) because another live member holds its
// InstanceID: it owns no partition and cannot join until that member
// leaves or its session times out, which it goes on waiting for. Run
// does not return it.
var ErrInstanceHeld = errors.New("processor: another live member of the group holds this member's instance id")

// CheckInstanceID returns why id cannot be a Config.InstanceID, or nil:
// the broker holds a group.instance.id to a topic name's rules. The empty
// id, a member that is not static, is valid.
func CheckInstanceID(id string) error {
	switch {
	case id == "":
		return nil
	case len(id) > 249:
		return fmt.Errorf("%q is %d characters, more than 249", id, len(id))
	case id == "." || id == "..":
		return fmt.Errorf("%q may not be . or ..", id)
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return fmt.Errorf("%q has %q: only [a-zA-Z0-9._-] are allowed", id, r)
		}
	}
	return nil
}

// protocolOptions are the client options of cfg's group protocol and
// static membership.
//
// Under ConsumerProtocol franz-go runs the group as it runs a
// cooperative one: OnPartitionsAssigned is called with the partitions
// just added, OnPartitionsRevoked with those just taken away (after which
// the member tells the broker it released them), OnPartitionsLost with
// all the member had when its membership ends (a fenced epoch, a session
// that expired), each of them possibly empty. These are the calls the
// classic cooperative-sticky balancer makes, so workers start and stop
// the same way under both protocols.
func (c *Consumer) protocolOptions() []kgo.Opt {
	opts := []kgo.Opt{
		kgo.AutoCommitCallback(func(cl *kgo.Client, req *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
			_ = c.commitDone(cl, req, resp, err) // logged there; the next commit tries again
		}),
		kgo.WithHooks(groupErrors{c}),
	}
	if c.cfg.GroupProtocol == ConsumerProtocol {
		// With the default cooperative-sticky balancer, the broker's
		// "uniform" assignor.
		opts = append(opts, kgo.ServerSideBalancer())
	}
	if c.cfg.InstanceID != "" {
		opts = append(opts, kgo.InstanceID(c.cfg.InstanceID))
	}
	return opts
}

// groupErrors acts on the errors that end a group session.
type groupErrors struct{ c *Consumer }

// OnGroupManageError implements kgo.HookGroupManageError. It is called
// after OnPartitionsLost has stopped the workers.
func (h groupErrors) OnGroupManageError(err error) {
	c := h.c
	switch {
	case errors.Is(err, kerr.FencedInstanceID):
		// Classic protocol: the other member has our partitions now.
		// Stop here, saying nothing more to the brokers: a rejoin
		// would fence it in turn.
		ferr := fmt.Errorf("%w: %q in group %s (kafka.instance_id must differ between members)", ErrInstanceFenced, c.cfg.InstanceID, c.cfg.Group)
		if c.fencedBy.CompareAndSwap(nil, &ferr) {
			c.log.Error("another member joined with this member's instance id and took its partitions; this member stops",
				"group", c.cfg.Group, "instance_id", c.cfg.InstanceID, "err", err)
		}
		c.abort(true)
	case errors.Is(err, kerr.InvalidSessionTimeout):
		// A configuration error: asking again gets the same answer.
		serr := fmt.Errorf("%w: kafka.session_timeout %v is outside the brokers' group.min.session.timeout.ms .. group.max.session.timeout.ms (6s .. 30m by default) in group %s",
			ErrSessionRefused, c.cfg.SessionTimeout, c.cfg.Group)
		if c.fencedBy.CompareAndSwap(nil, &serr) {
			c.log.Error("the brokers refuse this member's session timeout; this member stops",
				"group", c.cfg.Group, "session_timeout", c.cfg.SessionTimeout, "err", err)
		}
		c.abort(true)
	case errors.Is(err, kerr.GroupIDNotFound) && c.cfg.GroupProtocol == ConsumerProtocol:
		// A classic group with members that the broker does not
		// convert to the consumer protocol: checkProtocol asks and
		// says so.
		c.groupMissing.Store(true)
	case errors.Is(err, kerr.UnreleasedInstanceID):
		// Consumer protocol: a live member holds our instance id; the
		// broker keeps refusing us until it leaves or its session
		// expires, and franz-go keeps asking.
		herr := fmt.Errorf("%w: %q in group %s (kafka.instance_id must differ between members); this member consumes nothing until that member leaves or its session times out",
			ErrInstanceHeld, c.cfg.InstanceID, c.cfg.Group)
		c.refused.Store(&herr)
		if ok, held := c.repeats.allow("unreleased instance id", time.Now()); ok {
			c.log.Error("another live member holds this member's instance id; this member consumes nothing until that member leaves or its session times out",
				"group", c.cfg.Group, "instance_id", c.cfg.InstanceID, "err", err, "repeated", held)
		}
	}
}

// refusal returns why the group refused the member last (ErrInstanceHeld,
// or a classic group refusing a consumer-protocol member) while it has
// not joined since (its client has no member epoch), else nil.
func (c *Consumer) refusal() error {
	p := c.refused.Load()
	if p == nil {
		return nil
	}
	c.mu.Lock()
	cl := c.cl
	c.mu.Unlock()
	if cl != nil {
		if _, gen := cl.GroupMetadata(); gen > 0 { // joined since
			c.refused.CompareAndSwap(p, nil)
			return nil
		}
	}
	return *p
}

// protocolEvery is how often a member asks the group's coordinator which
// protocols the group's members use.
const protocolEvery = 10 * time.Second

// Group states checkProtocol tells apart.
const (
	groupUnknown  = ""         // not joined, or the coordinator did not say
	groupSame     = "same"     // every member uses kafka.group_protocol
	groupMixed    = "mixed"    // members use both protocols
	groupFallback = "fallback" // asked for consumer, joined as classic
	groupRefused  = "refused"  // a consumer member refused by a classic group
)

// checkProtocol asks the group's coordinator, every protocolEvery while
// the member runs, which protocols the group's members use, and logs each
// change of the answer once: the group joined (info); a group mixing
// the classic and consumer protocols (warn, whichever joined first: Kafka
// 4.x turns a classic group into a consumer-protocol group that keeps its
// classic members when a consumer member joins, and lets a classic member
// join a consumer-protocol group; a broker that may not convert the group
// refuses the consumer member instead, which then owns nothing and reads
// not ready); franz-go's fall back to the classic protocol when the
// brokers do not offer KIP-848 (warn); one protocol again (info).
func (c *Consumer) checkProtocol(ctx context.Context, cl *kgo.Client) {
	said := groupUnknown
	for {
		state, attrs := c.groupProtocols(ctx, cl)
		if state != groupUnknown && state != said {
			c.sayProtocols(said, state, attrs)
			said = state
		}
		every := protocolEvery
		if _, gen := cl.GroupMetadata(); gen <= 0 { // joining: said as soon as joined
			every = time.Second
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

// groupProtocols describes the group and returns its state for
// checkProtocol with the attributes its log line names.
func (c *Consumer) groupProtocols(ctx context.Context, cl *kgo.Client) (string, []any) {
	own := c.cfg.GroupProtocol
	attrs := []any{"group", c.cfg.Group, "group_protocol", own}
	_, gen := cl.GroupMetadata()
	joined := gen > 0
	if !joined && !(own == ConsumerProtocol && c.groupMissing.Load()) {
		return groupUnknown, nil
	}
	dctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	defer cancel()
	adm := kadm.NewClient(cl)
	cg, err := adm.DescribeConsumerGroups(dctx, c.cfg.Group)
	if g, ok := cg[c.cfg.Group]; err == nil && ok && g.Err == nil && !idle(g.State) {
		var classic, consumer int
		for _, m := range g.Members {
			switch m.MemberType {
			case 0:
				classic++
			case 1:
				consumer++
			}
		}
		attrs = append(attrs, "running", ConsumerProtocol, "classic_members", classic, "consumer_members", consumer)
		switch {
		case !joined:
			return groupUnknown, nil
		case own == ClassicProtocol || classic > 0:
			return groupMixed, attrs
		}
		return groupSame, attrs
	}
	dg, err := adm.DescribeGroups(dctx, c.cfg.Group)
	if g, ok := dg[c.cfg.Group]; err == nil && ok && g.Err == nil && !idle(g.State) {
		attrs = append(attrs, "running", ClassicProtocol, "classic_members", len(g.Members))
		switch {
		case own == ClassicProtocol:
			return groupSame, attrs
		case joined:
			return groupFallback, attrs
		}
		// Refused (GROUP_ID_NOT_FOUND): the broker does not convert
		// a classic group with members to this member's protocol.
		err := fmt.Errorf("group %s runs the classic protocol and the brokers refuse this consumer-protocol member "+
			"(they convert a group with members only where group.consumer.migration.policy allows it); give every member the same kafka.group_protocol", c.cfg.Group)
		c.refused.Store(&err)
		return groupRefused, attrs
	}
	return groupUnknown, nil
}

// sayProtocols logs checkProtocol's change of state from was to now.
func (c *Consumer) sayProtocols(was, now string, attrs []any) {
	switch now {
	case groupMixed:
		c.log.Warn("the consumer group mixes the classic and consumer protocols (a rollout from one kafka.group_protocol to the other, half done): "+
			"Kafka runs it as a consumer-protocol group, its classic members rebalanced by rounds of joins, until its last classic member "+
			"leaves (or its last consumer member, when it turns classic again); give every member the same kafka.group_protocol", attrs...)
	case groupRefused:
		c.log.Warn("the consumer group mixes the classic and consumer protocols: it runs the classic protocol and the brokers refuse "+
			"this consumer-protocol member, which consumes nothing (they convert a group with members only where "+
			"group.consumer.migration.policy allows it); give every member the same kafka.group_protocol", attrs...)
	case groupFallback:
		c.log.Warn("the consumer group runs the classic protocol, not the consumer protocol kafka.group_protocol asks for: "+
			"the brokers do not offer it (it needs Kafka 4.0 or later with group.coordinator.rebalance.protocols including consumer)", attrs...)
	case groupSame:
		if was == groupUnknown {
			c.log.Info("consumer group joined", append(attrs, "instance_id", c.cfg.InstanceID)...)
		} else {
			c.log.Info("the consumer group runs one protocol again", attrs...)
		}
	}
}

// idle reports whether a group state is one with no members: Empty, or
// Dead (the group does not exist).
func idle(state string) bool {
	s := strings.ToLower(state)
	return s == "" || s == "empty" || s == "dead"
}

// reclaimInstance, under ConsumerProtocol with an InstanceID, makes the
// group's member that holds this member's instance id, if any, leave for
// now (member epoch -2, as a drained static member leaves), before this
// member joins. KIP-848's broker refuses a member with a static member's
// instance id until that member has left (UNRELEASED_INSTANCE_ID): a
// static member killed (SIGKILL, a crashed node) never sent its leave,
// and its restart would be refused until the broker's session timeout
// (45s by default) expired, when its partitions go to the other members.
// After this leave the restart takes the predecessor's place and its
// partitions, with no rebalance, as under ClassicProtocol.
//
// If the holder is alive (two members configured with one instance id),
// it is replaced all the same, as ClassicProtocol's broker fences the
// older of the two: its next heartbeat finds its membership gone, it
// loses its partitions (its workers stop; a batch it was writing is
// fenced by Postgres, not applied twice) and its rejoin is refused with
// UNRELEASED_INSTANCE_ID, which it logs.
//
// A failure is logged and the join goes ahead: franz-go then waits for
// the broker to release the instance id, as before.
func (c *Consumer) reclaimInstance(ctx context.Context, clientCtx context.Context) {
	if c.cfg.GroupProtocol != ConsumerProtocol || c.cfg.InstanceID == "" {
		return
	}
	opts := append(append([]kgo.Opt{kgo.SeedBrokers(c.cfg.Brokers...), kgo.ClientID(c.cfg.ClientID),
		kgo.WithLogger(kgoLogger{log: c.log, seen: &c.repeats})}, c.cfg.KafkaOptions...), kgo.WithContext(clientCtx))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		c.log.Warn("reclaim instance id: kafka client", "group", c.cfg.Group, "instance_id", c.cfg.InstanceID, "err", err)
		return
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	defer cancel()
	holder, epoch, err := c.instanceHolder(ctx, cl)
	if err != nil || holder == "" || epoch == -2 {
		if err != nil {
			c.log.Warn("reclaim instance id: describe group", "group", c.cfg.Group, "instance_id", c.cfg.InstanceID, "err", err)
		}
		return
	}
	req := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	req.Group, req.MemberID, req.MemberEpoch = c.cfg.Group, holder, -2
	req.InstanceID = kmsg.StringPtr(c.cfg.InstanceID)
	resp, err := req.RequestWith(ctx, cl)
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	if err != nil && !errors.Is(err, kerr.UnknownMemberID) { // gone meanwhile: nothing to replace
		c.log.Warn("reclaim instance id: the group's member with this member's instance id did not leave; the broker admits this member once it does or its session times out",
			"group", c.cfg.Group, "instance_id", c.cfg.InstanceID, "member_id", holder, "err", err)
		return
	}
	c.log.Warn("replaced the group's member with this member's instance id, which had not left (a crash, or another member with the same kafka.instance_id): this member takes its partitions",
		"group", c.cfg.Group, "instance_id", c.cfg.InstanceID, "member_id", holder, "member_epoch", epoch)
}

// instanceHolder returns the member id and epoch of the group's member
// with this member's instance id; an empty id when there is none (or no
// group yet).
func (c *Consumer) instanceHolder(ctx context.Context, cl *kgo.Client) (string, int32, error) {
	req := kmsg.NewPtrConsumerGroupDescribeRequest()
	req.Groups = []string{c.cfg.Group}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return "", 0, err
	}
	for _, g := range resp.Groups {
		if g.Group != c.cfg.Group {
			continue
		}
		if err := kerr.ErrorForCode(g.ErrorCode); err != nil {
			if errors.Is(err, kerr.GroupIDNotFound) {
				return "", 0, nil // a new group, or a classic one
			}
			return "", 0, err
		}
		for _, m := range g.Members {
			if m.InstanceID != nil && *m.InstanceID == c.cfg.InstanceID {
				return m.MemberID, m.MemberEpoch, nil
			}
		}
	}
	return "", 0, nil
}

// leaveGroup leaves the group at the end of Run's drain, logging a
// failure. A dynamic member leaves for good: its partitions are assigned
// again at once. A static member under ClassicProtocol sends nothing
// (franz-go's rule: the group keeps its place until the session timeout).
// A static member under ConsumerProtocol leaves for now (member epoch -2,
// with its instance id): the broker keeps its partitions for it until the
// session timeout, and a member with the same instance id that joins
// meanwhile takes them back with no rebalance.
//
// franz-go v1.22.3 sends that temporary leave without the instance id,
// which Kafka 4.1 refuses (INVALID_REQUEST: InstanceId can't be null): the
// member would stay in the group, and its restart be refused
// (UNRELEASED_INSTANCE_ID) until the session expired, its partitions then
// going to the other members. So once franz-go's leave has ended the
// member's heartbeats, the leave is sent again, complete.
//
// A member that another member replaced (its instance id held by that
// one: refused with UNRELEASED_INSTANCE_ID, or its leave answered
// FENCED_INSTANCE_ID) has no place of its own to leave: it says so, at
// info, and does not send the static leave.
func (c *Consumer) leaveGroup(ctx context.Context, cl *kgo.Client) {
	member, _ := cl.GroupMetadata()
	held := errors.Is(c.refusal(), ErrInstanceHeld)
	err := cl.LeaveGroupContext(ctx)
	if c.cfg.GroupProtocol == ConsumerProtocol && c.cfg.InstanceID != "" && member != "" && !held {
		req := kmsg.NewPtrConsumerGroupHeartbeatRequest()
		req.Group, req.MemberID, req.MemberEpoch = c.cfg.Group, member, -2
		req.InstanceID = kmsg.StringPtr(c.cfg.InstanceID)
		resp, rerr := req.RequestWith(ctx, cl)
		if rerr == nil {
			rerr = kerr.ErrorForCode(resp.ErrorCode)
		}
		switch {
		case rerr == nil || errors.Is(rerr, kerr.UnknownMemberID): // gone already: franz-go's leave was taken
			err = nil
		case errors.Is(rerr, kerr.FencedInstanceID):
			held = true // replaced meanwhile
		default:
			err = errors.Join(err, fmt.Errorf("static leave: %w", rerr))
		}
	}
	switch {
	case held:
		// Refused, or replaced: the group's member with this instance
		// id is the other one, whose place is not this one's to leave.
		// franz-go's own leave, refused as well, says nothing of use.
		c.log.Info("another member holds this member's instance id: this member had nothing to leave",
			"group", c.cfg.Group, "instance_id", c.cfg.InstanceID)
	case err != nil:
		c.log.Warn("leave group", "group", c.cfg.Group, "err", err)
	}
}
