package bench

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/onceflow/onceflow/processor"
)

// WriteTable writes res's summary as a table, then the price of
// exactly-once in one line.
func (res *Results) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "run\tevents/s\tvs effects-only\tvs raw-copy\texactly once\trounds\t\n")
	for _, l := range res.Summary {
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%s\t%s\t%s\t\n", l.Name, l.EventsPerSec, ratio(l.VsEffects), ratio(l.VsRawCopy), yes(l.ExactlyOnce), rounds(l.Rounds))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, res.PriceLine())
	return err
}

// PriceLine is the price of exactly-once in one line: 1 − steady /
// effects-only; with several group protocols, each one's.
func (res *Results) PriceLine() string {
	if !res.HasPrice {
		return "price of exactly-once: not measured (it needs steady and effects-only)"
	}
	line := fmt.Sprintf("price of exactly-once: 1 − steady/effects-only = %.1f %%", 100*res.Price)
	negative := res.Price < 0
	if len(res.PriceByProtocol) > 1 {
		var ps []string
		for _, p := range res.Settings.GroupProtocols {
			if v, ok := res.PriceByProtocol[p]; ok {
				ps = append(ps, fmt.Sprintf("%.1f %% (%s)", 100*v, p))
				negative = negative || v < 0
			}
		}
		line = "price of exactly-once: 1 − steady/effects-only = " + strings.Join(ps, ", ")
	}
	if negative {
		line += negativePrice
	}
	return line
}

// negativePrice follows a price below zero: steady outran effects-only,
// which writes the same effects without dedup rows, so effects-only lost
// more to something steady does not pay for.
const negativePrice = " (below zero: effects-only was the slower; when the handlers update a few hot rows its writers, " +
	"each with a batch of 1000 events, wait on one another's row locks, or deadlock when a statement's rows are not " +
	"in one order (Postgres breaks a deadlock after deadlock_timeout, 1 s by default), where steady's per-partition " +
	"batches are smaller; see \"A negative price\" in docs/benchmarks.md)"

func ratio(r float64) string {
	if r == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f×", r)
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "NO"
}

func rounds(rs []float64) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = fmt.Sprintf("%.0f", r)
	}
	return strings.Join(s, " ")
}

// WriteFiles writes results.json, results.md and a plot per scenario run
// (throughput-<scenario>-r<round>.png: records committed per second over
// time, the membership changes marked) into dir, created if missing; the
// plots of an earlier run there that this one does not make are removed,
// so that dir shows one run: files named as bench names its plots
// (plotName), and no other. command is the command line, quoted in
// results.md.
func (res *Results) WriteFiles(dir, command string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	plots, err := res.writePlots(dir)
	if err != nil {
		return err
	}
	old, err := filepath.Glob(filepath.Join(dir, "throughput-*.png"))
	if err != nil {
		return err
	}
	for _, f := range old {
		if plotName.MatchString(filepath.Base(f)) && !slices.Contains(plots, filepath.Base(f)) {
			if err := os.Remove(f); err != nil {
				return fmt.Errorf("remove an earlier run's plot: %w", err)
			}
		}
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	var md strings.Builder
	st := res.Settings
	fmt.Fprintf(&md, "# onceflow bench, %s\n\n", res.Started.Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(&md, "```\n%s\n```\n\n", command)
	fmt.Fprintf(&md, "Payloads: %s. %s, %s (%s), %s, %s, "+
		"batches of at most %d, %s, Kafka: %s. Handlers: %s. Tables written (cloned empty, yours untouched): %s. ",
		st.Payloads, count(st.Events, "unique event"), count(st.Records, "record"), redeliveries(st), count(st.Partitions, "partition"),
		count(st.Members, "member"), st.BatchMax, count(st.PoolSize, "Postgres connection"), st.Kafka,
		strings.Join(st.Handlers, ", "), orNone(st.Tables))
	if len(st.BaselineWriters) > 0 {
		fmt.Fprintf(&md, "Baselines' writers (%s): %s. ", writersHow(st), calibrationLine(st))
	}
	if st.StormChanges > 0 {
		pace := "spread over the stream"
		if st.StormEvery > 0 {
			pace = fmt.Sprintf("one every %gs", st.StormEvery)
		}
		static := ""
		if st.InstanceID {
			static = "; static members, whose kill is a restart under the same instance id"
		}
		fmt.Fprintf(&md, "Storm: %d membership changes, %s (a join, a leave, and every third a kill and a replacement%s). ", st.StormChanges, pace, static)
	}
	if len(st.GroupProtocols) > 0 {
		fmt.Fprintf(&md, "Group protocol: %s. ", strings.Join(st.GroupProtocols, ", "))
	}
	if len(st.Formats) > 0 {
		fmt.Fprintf(&md, "Payload formats besides JSON: %s. ", strings.Join(st.Formats, ", "))
	}
	if st.Build != "" {
		fmt.Fprintf(&md, "Build: %s.", st.Build)
	}
	md.WriteString("\n\n")
	fmt.Fprintf(&md, "| run | events/s | vs effects-only | vs raw-copy | exactly once | rounds |\n|---|---:|---:|---:|---|---|\n")
	for _, l := range res.Summary {
		fmt.Fprintf(&md, "| %s | %.0f | %s | %s | %s | %s |\n", l.Name, l.EventsPerSec, ratio(l.VsEffects), ratio(l.VsRawCopy), yes(l.ExactlyOnce), rounds(l.Rounds))
	}
	if st.Rounds > 1 {
		md.WriteString("\n" + medianNote(st.Rounds) + "\n")
	}
	fmt.Fprintf(&md, "\n**%s**\n\n", res.PriceLine())
	md.WriteString("effects-only: the handlers over the unique events in batches, no dedup rows, no Kafka. " +
		"raw-copy: the same plus the dedup rows (processed_events) by COPY. " +
		"Every run is checked from its tables: each unique event claimed once per handler, no dead letter, " +
		"and the written tables as effects-only left them.\n")
	md.WriteString("\n| run | round | events/s | seconds | batch p50 / p99 ms | changes | recovery median / max ms (n of m measured) | waits with no owner (n, median / max ms) | checkpoints | peak RSS MiB |\n" +
		"|---|---:|---:|---:|---:|---|---:|---:|---:|---:|\n")
	for _, r := range res.Runs {
		lat, rec, wait := "–", "–", "–"
		if r.Consumer != nil {
			lat = fmt.Sprintf("%.1f / %.1f", r.BatchP50Ms, r.BatchP99Ms)
			wait = noOwner(r.NoOwner)
		}
		switch {
		case r.Scenario == Storm && len(r.Changes) == 0: // none made: "changes" says why
		case r.Scenario == Storm && r.RecoveryMeasured == 0:
			rec = fmt.Sprintf("– (0 of %d measured)", len(r.Changes))
		case r.Scenario == Storm:
			rec = fmt.Sprintf("%.0f / %.0f (%d of %d measured)", r.RecoveryMedianMs, r.RecoveryMaxMs, r.RecoveryMeasured, len(r.Changes))
		case r.BackAtRateMs != nil:
			rec = fmt.Sprintf("%.0f (records rate)", *r.BackAtRateMs)
		}
		fmt.Fprintf(&md, "| %s | %d | %.0f | %.1f | %s | %s | %s | %s | %s | %.0f |\n", r.Name, r.Round, r.EventsPerSec, r.Seconds, lat,
			changeKinds(r), rec, wait, checkpointsCell(r, st.Checkpoint), r.PeakRSSMiB)
	}
	md.WriteString("\nBatch latency: a committed batch's, from its closing to its COMMIT. Recovery: after each membership change, the time until the applied rate " +
		"over half a second is back at 90 % of its rate before the change: the greater of its rate over the two seconds before and the run's median rate " +
		"(over the 250 ms samples since the first pair applied) up to the change, so that a change after a stall is not measured against the stall. " +
		"A change is not measured when it came before the run had a rate (before anything was applied for half a second) or when the stream ended " +
		"before the rate came back; the median and the maximum are of the changes measured, \"–\" when none was. " +
		"A replay's, the same of the records rate from the re-reading group's start, against the first group's last two seconds. " +
		"A wait with no owner runs from a partition's worker stopping on one member to one starting on any member (polled every 20 ms). " +
		"Checkpoints: those the server began during the run")
	if st.Checkpoint {
		md.WriteString("; each run starts right after a CHECKPOINT (unless \"not from one\": the role lacks pg_checkpoint), so runs that write the same WAL meet theirs at the same places")
	}
	md.WriteString(". Peak RSS: this process's (VmHWM), the members', the writers' and the generated stream's.\n")
	writeProtocols(&md, res.Protocols)
	if len(res.Formats) > 0 {
		md.WriteString("\n### Payload formats against JSON\n\n| scenario | format | events/s | JSON events/s | × JSON |\n|---|---|---:|---:|---:|\n")
		for _, f := range res.Formats {
			fmt.Fprintf(&md, "| %s | %s | %.0f | %.0f | %s |\n", f.Scenario, f.Format, f.Rate, f.JSONRate, ratio(f.Ratio))
		}
		md.WriteString("\nEach format's records are the JSON ones encoded for a schema registry before the runs, on an embedded cluster of their own, " +
			"and read by the members through the registry back into JSON; medians of the rounds, each format's runs after JSON's in every round.\n")
	}
	var scen []RunResult
	for _, r := range res.Runs {
		if r.Consumer != nil {
			scen = append(scen, r)
		}
	}
	if len(scen) > 0 {
		md.WriteString("\n| scenario run | records consumed | batches | mean batch | pairs applied | skipped (LRU) | skipped (Postgres) |\n|---|---:|---:|---:|---:|---:|---:|\n")
		for _, r := range scen {
			c := r.Consumer
			fmt.Fprintf(&md, "| %s r%d | %d | %d | %.0f | %d | %d | %d |\n", r.Name, r.Round, c.RecordsConsumed, c.Batches, c.MeanBatch, c.Applied, c.SkippedLRU, c.SkippedPostgres)
		}
	}
	for _, p := range plots {
		fmt.Fprintf(&md, "\n![%s](%s)\n", p, p)
	}
	if checks := tableChecks(res.Runs); checks != "" {
		md.WriteString("\nTables checked against effects-only: " + checks + ". " +
			"digest: the same rows (their count and a digest of every column without a default); " +
			"sums: rows that differ by the delivery applied (a counter per partition), with the same sums of the numeric columns " +
			"and the same distinct values in every other column. A column whose values change between runs (now(), random()) fails both.\n")
	}
	for _, r := range res.Runs {
		if len(r.Problems) > 0 {
			fmt.Fprintf(&md, "\n%s round %d: NOT EXACTLY ONCE: %s\n", r.Name, r.Round, strings.Join(r.Problems, "; "))
		}
	}
	return os.WriteFile(filepath.Join(dir, "results.md"), []byte(md.String()), 0o644)
}

// medianNote says which round a line's events/s is, of rounds.
func medianNote(rounds int) string {
	if rounds%2 == 0 {
		return fmt.Sprintf("events/s: the median of %d rounds, of an even number the lower of the middle two (a round that ran, and not the flattering one).", rounds)
	}
	return fmt.Sprintf("events/s: the median of %d rounds.", rounds)
}

// plotName matches the names of the plots WriteFiles writes:
// throughput-<scenario>[-<protocol or format>]-r<round>.png.
var plotName = regexp.MustCompile(`^throughput-(steady|storm|replay)(-(classic|consumer|avro|protobuf))?-r[0-9]+\.png$`)

// tableChecks says, per table, how it passed the check in each run:
// "payments by digest (every run); counters by sums (storm r1), by digest
// (steady r1)".
func tableChecks(runs []RunResult) string {
	by := map[string]map[string][]string{} // table, check: runs
	for _, r := range runs {
		for t, how := range r.TableChecks {
			if by[t] == nil {
				by[t] = map[string][]string{}
			}
			by[t][how] = append(by[t][how], fmt.Sprintf("%s r%d", r.Name, r.Round))
		}
	}
	var out []string
	for _, t := range slices.Sorted(maps.Keys(by)) {
		hows := slices.Sorted(maps.Keys(by[t]))
		var parts []string
		for _, h := range hows {
			if len(hows) == 1 {
				parts = append(parts, "by "+h+" (every run)")
			} else {
				parts = append(parts, "by "+h+" ("+strings.Join(by[t][h], ", ")+")")
			}
		}
		out = append(out, t+" "+strings.Join(parts, ", "))
	}
	return strings.Join(out, "; ")
}

// changeKinds counts a scenario run's membership changes by kind, and
// says how many of a storm's planned changes were made when the stream
// ended before the last.
func changeKinds(r RunResult) string {
	if len(r.Changes) == 0 && !r.StormShort {
		return "–"
	}
	n := map[string]int{}
	for _, c := range r.Changes {
		n[c.What]++
	}
	var kinds []string
	for _, k := range []string{"join", "leave", "kill", "restart", "reread"} {
		if n[k] > 0 {
			kinds = append(kinds, count(n[k], k))
		}
	}
	out := strings.Join(kinds, ", ")
	if r.StormShort {
		out = orDash(out) + fmt.Sprintf(" (**%d of %d changes made before the stream ended**: raise --events)", len(r.Changes), r.StormPlanned)
	}
	if r.StaticMoved != nil {
		out += fmt.Sprintf("; static: %d of %d partitions moved", *r.StaticMoved, r.StaticHeld)
	}
	return out
}

func checkpointsCell(r RunResult, asked bool) string {
	if r.Checkpoints == nil {
		return "–"
	}
	if asked && !r.FromCheckpoint {
		return fmt.Sprintf("%d (not from one)", *r.Checkpoints)
	}
	return fmt.Sprint(*r.Checkpoints)
}

// plural is one, or many (by default one + "s") when n is not 1.
func plural(n int, one string, many ...string) string {
	switch {
	case n == 1:
		return one
	case len(many) > 0:
		return many[0]
	}
	return one + "s"
}

// count is n and its noun: "1 partition", "12 partitions".
func count(n int, one string, many ...string) string {
	return fmt.Sprintf("%d %s", n, plural(n, one, many...))
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none (Go handlers' own tables only)"
	}
	return strings.Join(s, ", ")
}

// ReadResults reads a results.json that WriteFiles wrote; a JSON file
// with no summary of runs is refused as not one.
func ReadResults(path string) (*Results, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Results
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: not a results.json of onceflow bench: %w", path, err)
	}
	if len(r.Summary) == 0 {
		return nil, fmt.Errorf("%s: not a results.json of onceflow bench (no summary of runs)", path)
	}
	return &r, nil
}

// Compare writes, per scenario and baseline in either, the old and new
// rate and the change; then the price of exactly-once in both, and the
// settings that differ (a comparison across them measures those too).
// Runs are paired by what they measured: the baseline, or the scenario
// under its group protocol in its format. A run named without a protocol
// (one protocol ran) is so paired with the other side's run of that
// protocol (steady with steady-classic), and the pairing is said. The
// scenario lists are compared; the storm's settings only when both ran a
// storm.
func Compare(w io.Writer, old, cur *Results) error {
	oldKeys, curKeys := lineKeys(old), lineKeys(cur)
	rate := func(r *Results, keys map[string]runKey, k runKey) (string, float64, bool) {
		for _, l := range r.Summary {
			if keys[l.Name] == k {
				return l.Name, l.EventsPerSec, true
			}
		}
		return "", 0, false
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "run\tbefore events/s\tnow events/s\tchange\t\n")
	seen := map[runKey]bool{}
	var paired []string
	for _, side := range []struct {
		r    *Results
		keys map[string]runKey
	}{{cur, curKeys}, {old, oldKeys}} {
		for _, l := range side.r.Summary {
			k := side.keys[l.Name]
			if seen[k] {
				continue
			}
			seen[k] = true
			na, a, okA := rate(old, oldKeys, k)
			nb, b, okB := rate(cur, curKeys, k)
			switch {
			case okA && okB && a > 0:
				name := nb
				if na != nb {
					name = nb + " / " + na
					paired = append(paired, fmt.Sprintf("%s now with %s before (both %s)", nb, na, k.protocol))
				}
				fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%+.1f %%\t\n", name, a, b, 100*(b/a-1))
			case okB:
				fmt.Fprintf(tw, "%s\t-\t%.0f\t\t\n", nb, b)
			default:
				fmt.Fprintf(tw, "%s\t%.0f\t-\t\t\n", na, a)
			}
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(paired) > 0 {
		fmt.Fprintf(w, "paired by scenario and group protocol: %s\n", strings.Join(paired, "; "))
	}
	fmt.Fprintf(w, "before: %s\nnow:    %s\n", old.PriceLine(), cur.PriceLine())
	a, b := old.Settings, cur.Settings
	var diff []string
	show := func(v any) string {
		if l, ok := v.([]string); ok { // a list as the flags take it, not Go's [a b]
			return orDash(strings.Join(l, ","))
		}
		return fmt.Sprint(v)
	}
	add := func(k string, x, y any) {
		if show(x) != show(y) {
			diff = append(diff, fmt.Sprintf("%s %s → %s", k, show(x), show(y)))
		}
	}
	sa, sb := scenarios(oldKeys, old), scenarios(curKeys, cur)
	if !slices.Equal(sa, sb) {
		diff = append(diff, fmt.Sprintf("scenarios %s → %s", orDash(strings.Join(sa, ", ")), orDash(strings.Join(sb, ", "))))
	}
	add("payloads", a.Payloads, b.Payloads)
	add("events", a.Events, b.Events)
	add("duplicates", a.Duplicates, b.Duplicates)
	add("other_partition", percent(placedElsewhere(a))+" %", percent(placedElsewhere(b))+" %")
	add("partitions", a.Partitions, b.Partitions)
	add("members", a.Members, b.Members)
	add("rounds", a.Rounds, b.Rounds)
	add("batch_max_records", a.BatchMax, b.BatchMax)
	add("pool", a.PoolSize, b.PoolSize)
	add("baseline_writers", baselineWriters(a), baselineWriters(b))
	add("kafka", a.Kafka, b.Kafka)
	add("handlers", a.Handlers, b.Handlers)
	if slices.Contains(sa, Storm) && slices.Contains(sb, Storm) { // a run without a storm has no storm settings
		add("storm_changes", a.StormChanges, b.StormChanges)
		add("storm_every_s", a.StormEvery, b.StormEvery)
		add("instance_id", a.InstanceID, b.InstanceID)
	}
	add("group_protocols", a.GroupProtocols, b.GroupProtocols)
	add("checkpoint", a.Checkpoint, b.Checkpoint)
	add("formats", a.Formats, b.Formats)
	if len(diff) > 0 {
		fmt.Fprintf(w, "settings that differ: %s\n", strings.Join(diff, ", "))
	}
	return nil
}

// runKey is what a summary line measured: a baseline (its name alone), or
// a scenario under a group protocol in a format ("" for JSON).
type runKey struct{ scenario, protocol, format string }

// lineKeys says what each of r's summary lines measured, from its runs'
// fields, or, in a results.json whose runs lack them, from its name
// (steady, steady-consumer, steady-avro): a name without a protocol is
// of the one r ran, else the default (classic).
func lineKeys(r *Results) map[string]runKey {
	protocol := string(processor.DefaultGroupProtocol)
	if len(r.Settings.GroupProtocols) == 1 {
		protocol = r.Settings.GroupProtocols[0]
	}
	keys := map[string]runKey{}
	for _, l := range r.Summary {
		k := runKey{scenario: l.Name}
		if i := slices.IndexFunc(r.Runs, func(run RunResult) bool { return run.Name == l.Name }); i >= 0 && r.Runs[i].Scenario != "" {
			run := r.Runs[i]
			k = runKey{scenario: run.Scenario, protocol: cmp.Or(run.GroupProtocol, protocol), format: run.Format}
		} else if sc, rest, _ := strings.Cut(l.Name, "-"); slices.Contains([]string{Steady, Storm, Replay}, sc) {
			k = runKey{scenario: sc, protocol: protocol}
			switch rest {
			case string(processor.ClassicProtocol), string(processor.ConsumerProtocol):
				k.protocol = rest
			default:
				k.format = rest
			}
		}
		keys[l.Name] = k
	}
	return keys
}

// scenarios are the scenarios of r's lines (not the baselines), in order.
func scenarios(keys map[string]runKey, r *Results) []string {
	var out []string
	for _, l := range r.Summary {
		if k := keys[l.Name]; k.protocol != "" && !slices.Contains(out, k.scenario) {
			out = append(out, k.scenario)
		}
	}
	return out
}

// redeliveries says st's redeliveries and where they went.
func redeliveries(st Settings) string {
	if st.Duplicates == 0 {
		return "no redeliveries"
	}
	return fmt.Sprintf("%s %% redeliveries, %s", percent(st.Duplicates), where(st))
}

// where says where st's redeliveries went.
func where(st Settings) string {
	if other := placedElsewhere(st); other > 0 {
		return fmt.Sprintf("%s %% of them on another partition than the first delivery", percent(other))
	}
	return "each on its event's partition"
}

// placedElsewhere is the share of st's redeliveries that went to another
// partition than their event's first delivery (sharePlaced);
// DefaultOtherPartition in results of builds that did not say it (they
// all sent that share).
func placedElsewhere(st Settings) float64 {
	return sharePlaced(st.Duplicates, st.Partitions, st.OtherPartition)
}

// sharePlaced is the share of a stream's redeliveries on another
// partition than their event's first delivery, asked share (nil:
// DefaultOtherPartition): none without redeliveries or another partition.
func sharePlaced(duplicates float64, partitions int, share *float64) float64 {
	if duplicates == 0 || partitions < 2 {
		return 0
	}
	return otherPartition(share)
}

// percent is share in percent, to three significant digits: 33.3, 0.4, 100.
func percent(share float64) string {
	return strconv.FormatFloat(100*share, 'g', 3, 64)
}

// baselineWriters says st's baselines' writers as the flag takes them
// (effects-only 2, raw-copy 2).
func baselineWriters(st Settings) string {
	var ws []string
	for _, bw := range writersOf(st) {
		ws = append(ws, bw.String())
	}
	return orDash(strings.Join(ws, ", "))
}
