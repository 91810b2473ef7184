package replay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/sink"
)

// Config configures a Replayer. Zero values take the defaults noted.
type Config struct {
	Pool    *pgxpool.Pool // required; owned by the caller
	Brokers []string      // required
	// KafkaOptions are added to every Kafka client the Replayer makes
	// (TLS, SASL, client id...).
	KafkaOptions []kgo.Opt
	Schema       string   // where sink's tables are; default "public"
	Group        string   // the consumer group to rewind; required
	Topics       []string // the group's topics; required
	// Handlers are the handlers the group runs (config key handlers):
	// the dry run counts their pairs, and a backfill's handler must be
	// one of them. Required.
	Handlers []string
	// HandlerTopics, if set, limits a handler to the topics listed for it
	// (config key sql_handlers' topics): the dry run counts no pair of it
	// on other topics, as the sink claims none. A handler not in the map
	// consumes every topic.
	HandlerTopics map[string][]string
	// Decode is how the group decodes records (config keys decode.*); the
	// dry run reads event ids the same way.
	Decode processor.DecodeConfig
	// Parse, if set, is the group's sink.Config.Parse: the dry run calls
	// it on each event some handler would claim, and counts an event it
	// refuses as a dead letter (Refused), as the sink will, instead of as
	// pairs to apply. It must give the same answer for the same event (as
	// sink requires); a panic fails the dry run.
	Parse func(sink.Event) (any, error)
	// Horizon is how long processed_events rows are kept (dedup.retention):
	// a rewind reaching a record older than that is refused unless forced.
	// 0 means rows are kept for ever: no rewind is refused for its age.
	Horizon time.Duration
	// SessionTimeout is the members' session timeout under the classic
	// protocol (config key kafka.session_timeout), which the brokers do not
	// tell: a refusal names it as the time after which a stopped static
	// member leaves the group. 0: not said.
	SessionTimeout time.Duration
	// CallTimeout bounds each call to Kafka or Postgres; default 30s. The
	// dry run's read of the records is bounded by the caller's ctx only.
	CallTimeout time.Duration
	Logger      *slog.Logger // nil discards
}

// DefaultCallTimeout is Config.CallTimeout's default.
const DefaultCallTimeout = 30 * time.Second

func (c Config) withDefaults() Config {
	if c.Schema == "" {
		c.Schema = sink.DefaultSchema
	}
	if c.CallTimeout == 0 {
		c.CallTimeout = DefaultCallTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate returns every problem with c, each naming its field.
func (c Config) Validate() error {
	var ps []error
	if c.Pool == nil {
		ps = append(ps, errors.New("replay: Pool is required"))
	}
	if len(c.Brokers) == 0 {
		ps = append(ps, errors.New("replay: Brokers are required (kafka.brokers)"))
	}
	if c.Group == "" {
		ps = append(ps, errors.New("replay: Group is required (kafka.group)"))
	}
	if len(c.Topics) == 0 {
		ps = append(ps, errors.New("replay: Topics are required (kafka.topics)"))
	}
	if len(c.Handlers) == 0 {
		ps = append(ps, errors.New("replay: Handlers are required (handlers)"))
	}
	if c.Horizon < 0 {
		ps = append(ps, fmt.Errorf("replay: Horizon %v is negative", c.Horizon))
	}
	if c.CallTimeout < 0 {
		ps = append(ps, fmt.Errorf("replay: CallTimeout %v is negative", c.CallTimeout))
	}
	return errors.Join(ps...)
}

// Replayer plans, counts and performs rewinds of one group. Create it with
// New and Close it. It is safe for concurrent use, but two rewinds of one
// group at once make no sense.
type Replayer struct {
	cfg   Config
	cl    *kgo.Client // admin requests only; consumes nothing
	adm   *kadm.Client
	table func(string) string
}

// New returns a Replayer over cfg, or every problem with cfg. It connects
// lazily: a broker that does not answer fails the first call, not New.
func New(cfg Config) (*Replayer, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...)}, cfg.KafkaOptions...)...)
	if err != nil {
		return nil, fmt.Errorf("replay: kafka client: %w", err)
	}
	return &Replayer{cfg: cfg, cl: cl, adm: kadm.NewClient(cl),
		table: func(name string) string { return pgx.Identifier{cfg.Schema, name}.Sanitize() }}, nil
}

// Close releases the Kafka client. The pool is the caller's.
func (r *Replayer) Close() { r.cl.Close() }

// TopicPartition names one partition.
type TopicPartition struct {
	Topic     string
	Partition int32
}

func (tp TopicPartition) String() string { return fmt.Sprintf("%s/%d", tp.Topic, tp.Partition) }

// Target is where a rewind goes: exactly one of its fields is set.
type Target struct {
	// Time: the first record whose timestamp is at or after Time (the log
	// end, where no record is that recent).
	Time time.Time
	// Offsets: an offset per partition; partitions not listed are not
	// moved.
	Offsets map[TopicPartition]int64
	// Start: the log start of every partition.
	Start bool
	// OutOfRange: the log start of each partition whose stored offset is
	// outside its log (Partition.OutOfRange), as kafka.offset_out_of_range:
	// earliest would start it; the other partitions are not moved.
	OutOfRange bool
}

func (t Target) validate() error {
	n := 0
	for _, set := range []bool{!t.Time.IsZero(), t.Offsets != nil, t.Start, t.OutOfRange} {
		if set {
			n++
		}
	}
	if n != 1 {
		return errors.New("replay: give exactly one target: a time, offsets per partition, the log start, or the log start where the stored offset is out of range")
	}
	return nil
}

// Request is one rewind or backfill.
type Request struct {
	Target Target
	// Backfill names the one handler the rewind is for (it must be one of
	// Config.Handlers); empty for a rewind of the whole group. A backfill
	// with no Target goes to the log start.
	Backfill string
	// RiskReapplyingEffects lets a rewind reach records older than the
	// dedup horizon, whose processed_events rows may be gone: their
	// effects would be applied again.
	RiskReapplyingEffects bool
}

// Partition is one partition of a Plan: where the group is, where the
// rewind goes and, after Count, what replaying the range would do.
type Partition struct {
	TopicPartition
	// Current is the group's next offset now: sink_offsets where it has
	// one, else Kafka's committed offset, else the log start.
	Current int64
	// Target is the next offset after the rewind (Current when the
	// partition does not move).
	Target int64
	// OutOfRange, when not empty, says why the offset stored in
	// sink_offsets is not an offset of the partition's log today: below
	// its start (records deleted by retention or DeleteRecords), beyond
	// its end, or stored under another topic id (the topic deleted and
	// recreated since). A member starts such a partition from its log
	// start or leaves it paused (kafka.offset_out_of_range).
	OutOfRange string
	// Reset: the partition is out of range and the plan moves it
	// whatever its target (to its log start, or to an offset given for
	// it there), storing today's topic id with it, so that members resume
	// there. A partition out of range that a target does not name
	// (--to-offset of others) is not reset.
	Reset bool
	// End is the partition's log end today.
	End int64
	// Until is where the records the rewind reads again end: Current, or
	// for a Reset partition the end of what its log still holds of what
	// the group read (nothing when the topic was recreated). [Target,
	// Until) is what the group replays; a Reset partition's records from
	// Until to End are read for the first time.
	Until int64
	// TopicID is the topic's Kafka id today, stored with the target
	// (zero when the brokers give none).
	TopicID uuid.NullUUID
	// Oldest is the timestamp of the record at Target, read only when a
	// Horizon is set; zero otherwise or when the range is empty.
	Oldest time.Time

	// Filled by Count.
	Counted     bool
	Records     int64 // records in [Target, Current)
	Undecodable int64 // of which the decoder refuses: dead letters again
	// Refused counts the events of the range Config.Parse refuses: dead
	// letters again, applied by no handler.
	Refused int64
	// DeadLetteredBefore counts the events of the range some handler would
	// claim that have a dead letter at their offset already, from an
	// earlier read (a handler's RejectError or data error): the handlers
	// run on them again, and only running them tells whether they refuse
	// them again (a dead letter, recorded already) or now apply them.
	DeadLetteredBefore int64
	Handlers           map[string]*PairCounts // per handler
}

// PairCounts is what replaying a range would do for one handler. Applied
// counts what can be known without running the handler: a pair it will
// apply unless the handler refuses the event on the re-read (a
// RejectError or a data error, known only by running it).
type PairCounts struct {
	Applied   int64 `json:"applied"`   // pairs with no processed_events row: claimed and applied
	Skipped   int64 `json:"skipped"`   // pairs already applied (or earlier in the range): skipped as duplicates
	Conflicts int64 `json:"conflicts"` // pairs whose id was applied with another payload: dead-lettered
	// Refused counts the pairs of events Config.Parse refuses: dead
	// letters, not applied.
	Refused int64 `json:"refused"`
	// DeadLetteredBefore counts the pairs of events dead-lettered on an
	// earlier read (Partition.DeadLetteredBefore): applied only if the
	// handlers now accept them.
	DeadLetteredBefore int64 `json:"dead_lettered_before"`
}

// Add adds o's counts to c's.
func (c *PairCounts) Add(o PairCounts) {
	c.Applied += o.Applied
	c.Skipped += o.Skipped
	c.Conflicts += o.Conflicts
	c.Refused += o.Refused
	c.DeadLetteredBefore += o.DeadLetteredBefore
}

// Plan is a rewind resolved against the group's current position.
type Plan struct {
	Group    string
	Backfill string
	Horizon  time.Duration
	// KeptSince is when the oldest dedup slice still in processed_events
	// started, once slices have been dropped (zero while none was):
	// claims made before it may be gone, whatever this process's Horizon
	// says — the members that dropped them may use another
	// dedup.retention.
	KeptSince  time.Time
	Partitions []Partition // sorted by topic and partition
	// Gone are the partitions sink_offsets stores an offset for that
	// their topic no longer has (deleted and recreated with fewer):
	// a target of every partition (the log start, a time, or those out
	// of range) clears their offset, so that a partition of that number
	// added later starts from its log start rather than paused.
	Gone []Gone
}

// Gone is a partition sink_offsets stores an offset for that its topic no
// longer has.
type Gone struct {
	TopicPartition
	Stored int64
}

// Moves reports whether the plan moves any partition, or clears the
// offset of a Gone one.
func (p *Plan) Moves() bool {
	return slices.ContainsFunc(p.Partitions, Partition.Moves) || len(p.Gone) > 0
}

// Moves reports whether the rewind moves p: back, or, when its stored
// offset is out of range, to where its log is.
func (p Partition) Moves() bool { return p.Target < p.Current || p.Reset }

// Replays reports whether the rewind has the group read records of p again.
func (p Partition) Replays() bool { return p.Target < p.Until }

// Plan resolves req against the group's current position: per partition,
// where the group is and where it would go. It writes nothing. A target
// past the group's position is an error (that would skip records); so is
// a backfill of a handler the group does not run. A partition whose stored
// offset is out of range (Partition.OutOfRange) is where a member would
// start it, its log start, and goes there or to an offset given for it.
func (r *Replayer) Plan(ctx context.Context, req Request) (*Plan, error) {
	if req.Backfill != "" && req.Target.Time.IsZero() && req.Target.Offsets == nil && !req.Target.Start {
		req.Target.Start = true
	}
	if err := req.Target.validate(); err != nil {
		return nil, err
	}
	if req.Backfill != "" && req.Target.OutOfRange {
		return nil, errors.New("replay: a backfill reads the history again: give it a time, offsets or the log start, not only the partitions out of range")
	}
	if req.Backfill != "" && !slices.Contains(r.cfg.Handlers, req.Backfill) {
		return nil, fmt.Errorf("replay: handler %q is not among the group's handlers %v: add it to handlers (and deploy it) first, or the backfill would apply nothing for it",
			req.Backfill, r.cfg.Handlers)
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
	defer cancel()
	ids, err := r.topicIDs(ctx)
	if err != nil {
		return nil, err
	}
	starts, err := r.adm.ListStartOffsets(ctx, r.cfg.Topics...)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("replay: list start offsets of %v: %w", r.cfg.Topics, err)
	}
	ends, err := r.adm.ListEndOffsets(ctx, r.cfg.Topics...)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("replay: list end offsets of %v: %w", r.cfg.Topics, err)
	}
	var after kadm.ListedOffsets
	if !req.Target.Time.IsZero() {
		after, err = r.adm.ListOffsetsAfterMilli(ctx, req.Target.Time.UnixMilli(), r.cfg.Topics...)
		if err == nil {
			err = after.Error()
		}
		if err != nil {
			return nil, fmt.Errorf("replay: list offsets after %s: %w", req.Target.Time.Format(time.RFC3339), err)
		}
	}
	current, gone, err := r.current(ctx, starts)
	if err != nil {
		return nil, err
	}
	plan := &Plan{Group: r.cfg.Group, Backfill: req.Backfill, Horizon: r.cfg.Horizon, Gone: gone}
	for tp, pos := range current {
		cur := pos.next
		s, _ := starts.Lookup(tp.Topic, tp.Partition)
		e, _ := ends.Lookup(tp.Topic, tp.Partition)
		p := Partition{TopicPartition: tp, Current: cur, Target: cur, Until: cur, End: e.Offset, TopicID: ids[tp.Topic]}
		from := cur // where the group goes on from without the rewind
		if pos.stored {
			if p.OutOfRange = outOfRange(cur, pos.topicID, p.TopicID, s.Offset, e.Offset); p.OutOfRange != "" {
				from = s.Offset
			}
		}
		reset := func() {
			p.Reset, p.Target, p.Until = true, s.Offset, s.Offset
			if !recreated(pos.topicID, p.TopicID) {
				p.Until = max(s.Offset, min(cur, e.Offset))
			}
		}
		switch {
		case req.Target.Start, req.Target.OutOfRange:
			if p.OutOfRange != "" {
				reset()
			} else if req.Target.Start {
				// An offset only Kafka has, below the log start, moves
				// nothing: a member starts such a partition there itself.
				p.Target = min(s.Offset, cur)
			}
		case !req.Target.Time.IsZero():
			if p.OutOfRange != "" {
				reset()
				break
			}
			a, ok := after.Lookup(tp.Topic, tp.Partition)
			if !ok || a.Offset < 0 {
				a = e
			}
			p.Target = min(a.Offset, cur) // a time after the position moves nothing
		default:
			o, ok := req.Target.Offsets[tp]
			if !ok {
				break // not moved
			}
			switch {
			case o > from && p.OutOfRange != "":
				return nil, fmt.Errorf("replay: %s: offset %d is past the log start %d, where the group goes on from (its stored offset %d is %s): that would skip records", tp, o, from, cur, p.OutOfRange)
			case o > from:
				return nil, fmt.Errorf("replay: %s: offset %d is past the group's position %d: that would skip records, not replay them", tp, o, cur)
			case o < s.Offset || o > e.Offset:
				return nil, fmt.Errorf("replay: %s: offset %d is outside the log [%d, %d)", tp, o, s.Offset, e.Offset)
			}
			if p.OutOfRange != "" {
				reset()
			}
			p.Target = o
		}
		plan.Partitions = append(plan.Partitions, p)
	}
	if !req.Target.Start && !req.Target.OutOfRange && req.Target.Time.IsZero() {
		plan.Gone = nil // only a target of every partition clears them
	}
	for tp := range req.Target.Offsets {
		if _, ok := current[tp]; !ok {
			return nil, fmt.Errorf("replay: %s is not a partition of the group's topics %v", tp, r.cfg.Topics)
		}
	}
	slices.SortFunc(plan.Partitions, func(a, b Partition) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	if plan.KeptSince, err = r.keptSince(ctx, r.cfg.Pool); err != nil {
		return nil, err
	}
	if r.cfg.Horizon > 0 || !plan.KeptSince.IsZero() {
		if err := r.readOldest(ctx, plan); err != nil {
			return nil, err
		}
	}
	return plan, nil
}

// position is where the group is on one partition.
type position struct {
	next    int64
	stored  bool          // next is sink_offsets'
	topicID uuid.NullUUID // the topic id stored with next
}

// current is the group's next offset per partition of its topics:
// sink_offsets, else Kafka's committed offset, else the log start — where
// a member would start, unless the stored offset is out of range.
func (r *Replayer) current(ctx context.Context, starts kadm.ListedOffsets) (map[TopicPartition]position, []Gone, error) {
	out := map[TopicPartition]position{}
	starts.Each(func(o kadm.ListedOffset) {
		if o.Partition >= 0 {
			out[TopicPartition{o.Topic, o.Partition}] = position{next: o.Offset}
		}
	})
	committed, err := r.adm.FetchOffsetsForTopics(ctx, r.cfg.Group, r.cfg.Topics...)
	if errors.Is(err, kerr.GroupIDNotFound) {
		committed, err = nil, nil // the group never committed: nothing to read
	}
	if err != nil {
		return nil, nil, fmt.Errorf("replay: fetch the committed offsets of group %s: %w", r.cfg.Group, err)
	}
	committed.Each(func(o kadm.OffsetResponse) {
		tp := TopicPartition{o.Topic, o.Partition}
		if _, ok := out[tp]; ok && o.Err == nil && o.At >= 0 {
			out[tp] = position{next: o.At}
		}
	})
	rows, err := r.cfg.Pool.Query(ctx, `SELECT topic, partition, next_offset, topic_id FROM `+r.table("sink_offsets")+`
WHERE consumer_group = $1 AND topic = ANY($2) AND next_offset IS NOT NULL`, r.cfg.Group, r.cfg.Topics)
	if err != nil {
		return nil, nil, fmt.Errorf("replay: read sink_offsets: %w", err)
	}
	var gone []Gone
	var tp TopicPartition
	var pos position
	_, err = pgx.ForEachRow(rows, []any{&tp.Topic, &tp.Partition, &pos.next, &pos.topicID}, func() error {
		if _, ok := out[tp]; ok {
			pos.stored = true
			out[tp] = pos
		} else {
			gone = append(gone, Gone{tp, pos.next})
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("replay: read sink_offsets: %w", err)
	}
	slices.SortFunc(gone, func(a, b Gone) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	return out, gone, nil
}

// topicIDs is each of the group's topics' Kafka id, where the brokers give
// one.
func (r *Replayer) topicIDs(ctx context.Context) (map[string]uuid.NullUUID, error) {
	md, err := r.adm.Metadata(ctx, r.cfg.Topics...)
	if err != nil {
		return nil, fmt.Errorf("replay: read the metadata of %v: %w", r.cfg.Topics, err)
	}
	out := map[string]uuid.NullUUID{}
	var missing []string
	for _, name := range r.cfg.Topics {
		t, ok := md.Topics[name]
		switch {
		case !ok || errors.Is(t.Err, kerr.UnknownTopicOrPartition):
			missing = append(missing, name)
		case t.Err != nil:
			return nil, fmt.Errorf("replay: read the metadata of topic %s: %w", name, t.Err)
		case t.ID != (kadm.TopicID{}):
			out[name] = uuid.NullUUID{UUID: uuid.UUID(t.ID), Valid: true}
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("replay: the brokers do not have the group's topic(s) %v (deleted and not created again?): create them, or remove them from kafka.topics, and plan again", missing)
	}
	return out, nil
}

// recreated reports whether an offset stored under topic id stored is of
// another topic than the one of id today (both known and different).
func recreated(stored, id uuid.NullUUID) bool {
	return stored.Valid && id.Valid && stored.UUID != id.UUID
}

// outOfRange says why the offset stored for a partition, under topic id
// storedID, is not an offset of its log [start, end] today (id is the
// topic's id today), or returns "" when it is one: as a member judges it
// when it takes the partition.
func outOfRange(stored int64, storedID, id uuid.NullUUID, start, end int64) string {
	switch {
	case recreated(storedID, id):
		return fmt.Sprintf("of a topic deleted since and recreated under the same name (its topic id changed from %s to %s)", storedID.UUID, id.UUID)
	case stored < start:
		return fmt.Sprintf("below the log start %d: the records in between were deleted (retention, or DeleteRecords)", start)
	case stored > end:
		return fmt.Sprintf("beyond the log end %d", end)
	}
	return ""
}

// keptSince is the start of the oldest live dedup slice when slice 0 has
// been dropped, else zero (see Plan.KeptSince).
func (r *Replayer) keptSince(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (time.Time, error) {
	var slice int32
	var started time.Time
	err := q.QueryRow(ctx, `SELECT slice, started_at FROM `+r.table("processed_events_slices")+
		` ORDER BY slice LIMIT 1`).Scan(&slice, &started)
	switch {
	case err != nil:
		return time.Time{}, fmt.Errorf("replay: read processed_events_slices: %w", err)
	case slice == 0:
		return time.Time{}, nil
	}
	return started, nil
}

// readOldest sets Oldest, the timestamp of the record at Target, for every
// partition that moves.
func (r *Replayer) readOldest(ctx context.Context, plan *Plan) error {
	ranges := map[TopicPartition][2]int64{}
	for _, p := range plan.Partitions {
		if p.Replays() {
			ranges[p.TopicPartition] = [2]int64{p.Target, p.Target + 1}
		}
	}
	oldest := map[TopicPartition]time.Time{}
	err := r.read(ctx, ranges, func(rec *kgo.Record) error {
		tp := TopicPartition{rec.Topic, rec.Partition}
		if _, ok := oldest[tp]; !ok {
			oldest[tp] = rec.Timestamp
		}
		return nil
	})
	if err != nil {
		return err
	}
	for i := range plan.Partitions {
		plan.Partitions[i].Oldest = oldest[plan.Partitions[i].TopicPartition]
	}
	return nil
}

// HorizonError is a rewind refused because it reaches records older than
// the dedup horizon, or older than the claims processed_events still keeps.
type HorizonError struct {
	Partition TopicPartition
	Offset    int64
	Oldest    time.Time
	Horizon   time.Duration
	// KeptSince is set when the refusal comes from the slices already
	// dropped (Plan.KeptSince), not from Horizon.
	KeptSince time.Time
}

func (e *HorizonError) Error() string {
	why := fmt.Sprintf("older than the dedup horizon %v (dedup.retention)", e.Horizon)
	if !e.KeptSince.IsZero() {
		why = fmt.Sprintf("older than the oldest claims processed_events keeps (since %s: older slices were dropped, by members whose dedup.retention may be shorter than this one's)",
			e.KeptSince.UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf("replay: %s: the rewind to offset %d reaches a record of %s (%s ago), %s: "+
		"its processed_events rows may be gone, so its effects would be applied again; choose a later target, or pass --risk-reapplying-effects",
		e.Partition, e.Offset, e.Oldest.UTC().Format(time.RFC3339), time.Since(e.Oldest).Round(time.Second), why)
}

// checkHorizon returns a *HorizonError for the first partition whose
// rewind reaches past the horizon or past KeptSince, unless forced.
func (p *Plan) checkHorizon(now time.Time, forced bool) error {
	if forced {
		return nil
	}
	var cutoff time.Time
	if p.Horizon > 0 {
		cutoff = now.Add(-p.Horizon)
	}
	kept := !p.KeptSince.IsZero() && p.KeptSince.After(cutoff)
	if kept {
		cutoff = p.KeptSince
	}
	if cutoff.IsZero() {
		return nil
	}
	for _, x := range p.Partitions {
		if x.Replays() && !x.Oldest.IsZero() && x.Oldest.Before(cutoff) {
			e := &HorizonError{Partition: x.TopicPartition, Offset: x.Target, Oldest: x.Oldest, Horizon: p.Horizon}
			if kept {
				e.KeptSince = p.KeptSince
			}
			return e
		}
	}
	return nil
}

// CheckHorizon returns a *HorizonError when the plan reaches records older
// than the dedup horizon and req does not force it. Rewind calls it; a dry
// run calls it to report.
func (p *Plan) CheckHorizon(req Request) error {
	return p.checkHorizon(time.Now(), req.RiskReapplyingEffects)
}
