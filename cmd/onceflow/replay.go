package main

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow/internal/config"
	"github.com/onceflow/onceflow/internal/replay"
)

// dedupHorizon is how long processed_events rows are kept at least
// (dedup.retention): the age beyond which a rewind may re-apply effects;
// 0 (kept forever) is an unlimited horizon.
func dedupHorizon(c config.Config) time.Duration { return c.Dedup.Retention }

func newReplayCmd() *cobra.Command {
	var (
		toTime, backfill string
		toOffsets        []string
		toStart, dryRun  bool
		resetOutOfRange  bool
		risk             bool
		removeStatic     []string
	)
	cmd := &cobra.Command{
		Use:   "replay (--to-time T | --to-offset TOPIC:PARTITION=OFFSET... | --to-start | --reset-out-of-range | --backfill HANDLER) [--dry-run]",
		Short: "Rewind the consumer group (Postgres and Kafka offsets), or backfill one handler; --dry-run counts what it would do",
		Long: `replay moves the consumer group back, in sink_offsets (with a new epoch,
fencing any live writer) and in Kafka's committed offsets, so that the
next 'onceflow run' reads the records again. Every (event, handler) pair
already in processed_events is skipped, so nothing is applied twice.

  --to-time      the first record at or after a time: RFC 3339
                 (2026-12-02T10:00:00Z) or a duration ago (24h)
  --to-offset    an offset per partition, TOPIC:PARTITION=OFFSET, repeatable
  --to-start     the log start
  --reset-out-of-range
                 only the partitions whose stored offset is outside their
                 log today (below its start: deleted by retention; beyond
                 its end; or of a topic deleted and recreated since), to
                 their log start, as kafka.offset_out_of_range: earliest
                 would start them: what a partition left paused (pause)
                 waits for; the others stay where they are
  --backfill H   for a handler added to 'handlers' after the group ran:
                 rewind (to the log start unless --to-time is given) so that
                 H applies the history while its siblings skip it

A partition whose stored offset is out of range is reset by any target
that names it (--to-offset names only some): it goes to its log start,
where a member would start it, with the topic's id today stored; records
a recreated topic holds are read for the first time, not replayed.

The group must be stopped: replay refuses while it has members. A member
that crashed (killed, its host lost) stays listed until its session timeout
expires, and a static member (kafka.instance_id) that is stopped stays too,
to restart in place: the refusal names the members, says how long they stay
listed, and names static members' instance ids; --remove-static-members
ID,... removes them first (under the consumer protocol only members that
left, never one listed as running; under the classic protocol the brokers
cannot tell, so name only stopped members: a running one would rejoin, and
go on from the rewound offsets). It removes nothing when the rewind would be
refused anyway (an id no member holds, a member it does not name): name
them all. A rewind
that reaches records older than the dedup horizon (dedup.retention, a week
by default: processed_events rows older than that may be gone, so those
records' effects would apply again) is refused unless
--risk-reapplying-effects is given.

--dry-run reads the records between the target and the group's position and
prints, per partition and handler, what the re-read would do with each
(event, handler) pair: APPLY, SKIP (applied before), CONFLICT (the id was
applied with another payload: a dead letter), REFUSED (the handlers' shared
parse refuses the event: a dead letter), DL-BEFORE (a handler dead-lettered
the event on an earlier read: the handlers run on it again), and per
partition the UNDECODABLE records (dead letters), and whether the real
run would be refused for the group's members (checking the ids given to
--remove-static-members as the real run does). It changes nothing. What
it cannot know is what only running a handler tells: whether it refuses an
event (a sink.RejectError, a data error in Postgres) it has not refused
before, counted in APPLY, or accepts one it refused before, counted in
DL-BEFORE. A dead letter recorded before is not written again.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req, err := replayRequest(toTime, toOffsets, toStart, resetOutOfRange, backfill, risk, time.Now())
			if err != nil {
				return err
			}
			return withPool(cmd, func(a *app, pool *pgxpool.Pool) error {
				topics := map[string][]string{}
				for _, h := range a.cfg.SQLHandlers {
					if len(h.Topics) > 0 {
						topics[h.Name] = h.Topics
					}
				}
				r, err := replay.New(replay.Config{
					Pool: pool, Brokers: a.cfg.Kafka.Brokers, KafkaOptions: a.kafkaOptions(a.cfg.Kafka.ClientID + "-replay"),
					Schema: a.cfg.Postgres.Schema, Group: a.cfg.Kafka.Group, Topics: a.cfg.Kafka.Topics,
					Handlers: a.handlerNames(), HandlerTopics: topics, Decode: a.decodeConfig(), Parse: registry.parser(a.cfg.Handlers),
					Horizon: dedupHorizon(a.cfg), SessionTimeout: a.cfg.Kafka.SessionTimeout, CallTimeout: a.cfg.Postgres.CallTimeout, Logger: a.log,
				})
				if err != nil {
					return err
				}
				defer r.Close()
				ctx := cmd.Context()
				plan, err := r.Plan(ctx, req)
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				if dryRun && req.Target.OutOfRange && !plan.Moves() {
					fmt.Fprintf(out, "group %s: nothing to reset (no stored offset is outside its partition's log; dry run)\n", plan.Group)
					return nil
				}
				if dryRun {
					if err := r.Count(ctx, plan); err != nil {
						return err
					}
					// Whether the real run would be refused for the group's
					// members, checking the ids to remove as it would.
					members := r.CheckStopped(ctx, removeStatic...)
					refused := errors.Is(members, replay.ErrGroupActive) || errors.Is(members, replay.ErrNoSuchStaticMember)
					if members != nil && !refused {
						printPlan(out, plan, req, true)
						return members
					}
					printPlan(out, plan, req, true)
					switch {
					case errors.Is(members, replay.ErrGroupActive):
						fmt.Fprintf(out, "REFUSED while the group has members (the real run would stop here, changing nothing): %v\n", members)
					case refused:
						fmt.Fprintf(out, "REFUSED (the real run would stop here, changing nothing): %v\n", members)
					case len(removeStatic) > 0:
						fmt.Fprintf(out, "group members: the rewind would first remove static member(s) %s, and then find the group empty (the dry run removed nothing)\n", strings.Join(removeStatic, ","))
					default:
						fmt.Fprintln(out, "group members: none (the rewind would not be refused for members)")
					}
					return nil
				}
				if !plan.Moves() {
					if req.Target.OutOfRange {
						fmt.Fprintf(out, "group %s: nothing to reset (no stored offset is outside its partition's log)\n", plan.Group)
						return nil
					}
					fmt.Fprintf(out, "group %s: nothing to rewind (every partition is at or before the target)\n", plan.Group)
					return nil
				}
				if err := plan.CheckHorizon(req); err != nil { // before anything changes
					return err
				}
				if err := r.RemoveStaticMembers(ctx, removeStatic); err != nil {
					return err
				}
				if err := r.Rewind(ctx, plan, req); err != nil {
					return err
				}
				printPlan(out, plan, req, false)
				fmt.Fprintf(out, "rewound: start 'onceflow run' to replay\n")
				return nil
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&toTime, "to-time", "", "rewind to the first record at or after this time: RFC 3339, or a duration ago (24h)")
	f.StringArrayVar(&toOffsets, "to-offset", nil, "rewind TOPIC:PARTITION to OFFSET (TOPIC:PARTITION=OFFSET); repeatable")
	f.BoolVar(&toStart, "to-start", false, "rewind to the log start")
	f.BoolVar(&resetOutOfRange, "reset-out-of-range", false, "move only the partitions whose stored offset is outside their log (retention, a recreated topic) to their log start")
	f.StringVar(&backfill, "backfill", "", "backfill this handler: it applies the history its siblings already applied")
	f.BoolVar(&dryRun, "dry-run", false, "count what the rewind would read, apply and skip; change nothing")
	f.BoolVar(&risk, "risk-reapplying-effects", false, "allow a rewind older than the dedup horizon, whose effects may be applied again")
	f.StringSliceVar(&removeStatic, "remove-static-members", nil, "before the rewind, remove these stopped static members (instance ids, comma-separated) from the group; none is removed if the rewind would still be refused")
	return cmd
}

// replayRequest builds the request from the flags, with now for "ago".
func replayRequest(toTime string, toOffsets []string, toStart, resetOutOfRange bool, backfill string, risk bool, now time.Time) (replay.Request, error) {
	req := replay.Request{Backfill: backfill, RiskReapplyingEffects: risk}
	if toTime != "" {
		if d, err := time.ParseDuration(toTime); err == nil {
			if d <= 0 {
				return req, fmt.Errorf("--to-time %s: a duration ago must be positive", toTime)
			}
			req.Target.Time = now.Add(-d)
		} else if t, err := time.Parse(time.RFC3339, toTime); err == nil {
			req.Target.Time = t
		} else {
			return req, fmt.Errorf("--to-time %q: neither an RFC 3339 time (2026-12-02T10:00:00Z) nor a duration (24h)", toTime)
		}
	}
	for _, s := range toOffsets {
		tp, off, ok := strings.Cut(s, "=")
		topic, part, ok2 := cutLast(tp, ":")
		p, err1 := strconv.ParseInt(part, 10, 32)
		o, err2 := strconv.ParseInt(off, 10, 64)
		if !ok || !ok2 || topic == "" || err1 != nil || err2 != nil || p < 0 || o < 0 {
			return req, fmt.Errorf("--to-offset %q: want TOPIC:PARTITION=OFFSET, like orders:0=1200", s)
		}
		if req.Target.Offsets == nil {
			req.Target.Offsets = map[replay.TopicPartition]int64{}
		}
		req.Target.Offsets[replay.TopicPartition{Topic: topic, Partition: int32(p)}] = o
	}
	req.Target.Start = toStart
	req.Target.OutOfRange = resetOutOfRange
	n := 0
	for _, set := range []bool{toTime != "", len(toOffsets) > 0, toStart, resetOutOfRange} {
		if set {
			n++
		}
	}
	switch {
	case n > 1:
		return req, fmt.Errorf("give one of --to-time, --to-offset, --to-start, --reset-out-of-range")
	case n == 0 && backfill == "":
		return req, fmt.Errorf("say where to rewind: --to-time, --to-offset, --to-start or --reset-out-of-range (or --backfill HANDLER)")
	case resetOutOfRange && backfill != "":
		return req, fmt.Errorf("--backfill %s reads the history again: give it --to-time, --to-offset or --to-start, not --reset-out-of-range", backfill)
	}
	return req, nil
}

func cutLast(s, sep string) (string, string, bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}

// printPlan prints the plan per partition and, when counted, per handler.
func printPlan(w io.Writer, plan *replay.Plan, req replay.Request, dry bool) {
	what := "rewind"
	switch {
	case plan.Backfill != "":
		what = "backfill of " + plan.Backfill
	case req.Target.OutOfRange:
		what = "reset of the offsets out of range"
	}
	verb := "rewound"
	if dry {
		verb = "dry run, nothing changed"
	}
	fmt.Fprintf(w, "group %s: %s (%s)\n", plan.Group, what, verb)
	switch {
	case plan.Horizon <= 0 && plan.KeptSince.IsZero():
		fmt.Fprintln(w, "dedup horizon: unlimited (dedup.retention is 0 and no dedup slice was ever dropped: no rewind re-applies effects)")
	case plan.Horizon <= 0:
		fmt.Fprintf(w, "dedup horizon: unlimited here (dedup.retention is 0), but claims before %s were dropped\n", plan.KeptSince.UTC().Format(time.RFC3339))
	case !plan.KeptSince.IsZero():
		fmt.Fprintf(w, "dedup horizon: %v (dedup.retention); claims kept since %s\n", plan.Horizon, plan.KeptSince.UTC().Format(time.RFC3339))
	default:
		fmt.Fprintf(w, "dedup horizon: %v (dedup.retention)\n", plan.Horizon)
	}
	if err := plan.CheckHorizon(req); err != nil {
		fmt.Fprintf(w, "REFUSED without --risk-reapplying-effects: %v\n", err)
	}
	for _, p := range plan.Partitions {
		switch {
		case p.Reset:
			fmt.Fprintf(w, "%s: the stored offset %d is %s: to %d, the topic's id today stored with it; %d record(s) read again, %d read for the first time\n",
				p.TopicPartition, p.Current, p.OutOfRange, p.Target, max(0, p.Until-p.Target), max(0, p.End-max(p.Until, p.Target)))
		case p.OutOfRange != "":
			fmt.Fprintf(w, "%s: the stored offset %d is %s; not named, it stays so (a member starts it at its log start or leaves it paused, per kafka.offset_out_of_range)\n",
				p.TopicPartition, p.Current, p.OutOfRange)
		}
	}
	for _, g := range plan.Gone {
		fmt.Fprintf(w, "%s: the topic has no such partition any more (recreated with fewer): its stored offset %d is cleared, so that a partition %d added later starts from its log start\n",
			g.TopicPartition, g.Stored, g.Partition)
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	if !dry {
		fmt.Fprintln(tw, "TOPIC\tPARTITION\tFROM\tTO\tRECORDS")
		for _, p := range plan.Partitions {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\n", p.Topic, p.Partition, p.Current, p.Target, max(0, p.Until-p.Target))
		}
		tw.Flush()
		return
	}
	fmt.Fprintln(tw, "TOPIC\tPARTITION\tFROM\tTO\tRECORDS\tUNDECODABLE\tHANDLER\tAPPLY\tSKIP\tCONFLICT\tREFUSED\tDL-BEFORE")
	totals := map[string]*replay.PairCounts{}
	var records, undecodable int64
	for _, p := range plan.Partitions {
		records += p.Records
		undecodable += p.Undecodable
		for _, h := range handlerOrder(p) {
			c := p.Handlers[h]
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%d\t%d\t%d\t%d\t%d\n", p.Topic, p.Partition, p.Current, p.Target,
				p.Records, p.Undecodable, h, c.Applied, c.Skipped, c.Conflicts, c.Refused, c.DeadLetteredBefore)
			t := totals[h]
			if t == nil {
				t = &replay.PairCounts{}
				totals[h] = t
			}
			t.Add(*c)
		}
	}
	if len(plan.Partitions) > 0 {
		for _, h := range handlerOrder(plan.Partitions[0]) {
			t := totals[h]
			fmt.Fprintf(tw, "total\t\t\t\t%d\t%d\t%s\t%d\t%d\t%d\t%d\t%d\n", records, undecodable, h,
				t.Applied, t.Skipped, t.Conflicts, t.Refused, t.DeadLetteredBefore)
		}
	}
	tw.Flush()
	fmt.Fprint(w, `UNDECODABLE, CONFLICT, REFUSED: dead letters (not written again where recorded before).
DL-BEFORE: dead-lettered by a handler on an earlier read; its handlers run on it again.
APPLY and DL-BEFORE assume each handler answers as before: whether it refuses an event now
(a RejectError, a data error) is only known by running it.
`)
}

// handlerOrder lists a counted partition's handlers in a stable order.
func handlerOrder(p replay.Partition) []string {
	hs := make([]string, 0, len(p.Handlers))
	for h := range p.Handlers {
		hs = append(hs, h)
	}
	slices.Sort(hs)
	return hs
}
