package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow/internal/api"
)

func newTraceCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "trace EVENT_ID",
		Short: "Print one event's story from Postgres and Jaeger: its ingest, the batches that applied, re-read or dead-lettered it, its replays",
		Long: `trace asks Postgres which traces touched one event — its outbox row's
trace (the ingest request, the relay, the publish), the trace of the batch
that applied it for each handler (processed_events.trace_id), and for each
of its dead letters the batch that wrote it (found in Jaeger by topic,
partition and offset) — then asks Jaeger (--jaeger, its query API) for
those traces and for the others that name the event: its publishes again
(replays, messaging.message.id) and the batches that read it again and
skipped it as a duplicate (onceflow.event_id on their dedup.skip events).
It prints the story as one tree per trace, in time order, with each span's
duration and a link to the trace in Jaeger's UI; --json prints the same
as JSON for scripts.

Traces are searched in --service (OTEL_SERVICE_NAME, else "onceflow"), from
a minute before the event's first row in Postgres (or --lookback ago) to
now. A trace Postgres names that Jaeger does not hold (sampled out, past
Jaeger's retention) is listed as not found; a trace exported under another
service than --service, or a --service Jaeger does not know, is pointed
out, since the searches would miss its replays and re-reads. When Jaeger
does not answer, trace still prints what Postgres knows, each trace marked
"Jaeger unreachable", warns on standard error (jaeger_error in --json) and
exits 0. The outbox table is optional: a schema only "onceflow run" has
used has none. An id onceflow has no record of (no outbox row, no
processed row, no dead letter) is said so on standard error, and trace
exits 1.`,
		Args: cobra.ExactArgs(1),
	}
	f := cmd.Flags()
	jaegerURL := f.String("jaeger", envOr("ONCEFLOW_JAEGER_QUERY", "http://127.0.0.1:16686"), "Jaeger's query address (ONCEFLOW_JAEGER_QUERY)")
	service := f.String("service", envOr("OTEL_SERVICE_NAME", "onceflow"), "service name the traces were exported under (OTEL_SERVICE_NAME)")
	lookback := f.Duration("lookback", 24*time.Hour, "how far back to search Jaeger when Postgres gives no time")
	asJSON := f.Bool("json", false, "print JSON instead of a tree")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		id, ok := api.ParseID(args[0])
		if !ok {
			return fmt.Errorf("event id %q is not a UUID (like 7f8a0000-0000-0000-0000-000000000001)", args[0])
		}
		base, err := url.Parse(*jaegerURL)
		if err != nil || base.Scheme == "" || base.Host == "" {
			return fmt.Errorf("--jaeger %q: want the query address, like http://127.0.0.1:16686", *jaegerURL)
		}
		return withPool(cmd, func(a *app, pool *pgxpool.Pool) error {
			ctx := cmd.Context()
			st, err := eventRecords(ctx, pool, a.cfg.Postgres.Schema, id)
			if err != nil {
				return err
			}
			if st.unknown() {
				fmt.Fprintf(cmd.ErrOrStderr(), "event %s: onceflow has no record of it in schema %q (no outbox row, no processed_events row, no dead letter)\n",
					id, a.cfg.Postgres.Schema)
				return exitError(1)
			}
			j := &jaeger{base: strings.TrimSuffix(base.String(), "/"), service: *service, http: &http.Client{Timeout: 10 * time.Second}}
			if err := st.gather(ctx, j, *lookback); err != nil {
				if ctx.Err() != nil {
					return err
				}
				// What Postgres knows stands without Jaeger: print it.
				st.JaegerError = err.Error()
				fmt.Fprintf(cmd.ErrOrStderr(), "onceflow trace: %v; printing what Postgres knows\n", err)
			}
			if *asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(st)
			}
			st.print(cmd.OutOrStdout())
			return nil
		})
	}
	return cmd
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// story is what onceflow knows of one event, and the traces that tell it.
type story struct {
	EventID     string            `json:"event_id"`
	Outbox      *outboxRecord     `json:"outbox,omitempty"`
	Processed   []processedRecord `json:"processed"`
	DeadLetters []deadRecord      `json:"dead_letters"`
	Traces      []*storyTrace     `json:"traces"`
	// Notes say what may be missing from the story and why (another
	// service name, a search that hit its limit).
	Notes []string `json:"notes,omitempty"`
	// JaegerError is set when Jaeger could not be asked: the traces are
	// those Postgres names, none found.
	JaegerError string `json:"jaeger_error,omitempty"`
}

type outboxRecord struct {
	CreatedAt   time.Time  `json:"created_at"`
	PublishedAt *time.Time `json:"published_at"`
	Publishes   int        `json:"publishes"`
	TraceID     string     `json:"trace_id,omitempty"`
}

type processedRecord struct {
	Handler     string    `json:"handler"`
	ProcessedAt time.Time `json:"processed_at"`
	TraceID     string    `json:"trace_id,omitempty"`
}

type deadRecord struct {
	Topic     string    `json:"topic"`
	Partition int32     `json:"partition"`
	Offset    int64     `json:"offset"`
	Reason    string    `json:"reason"`
	CreatedAt time.Time `json:"created_at"`
	TraceID   string    `json:"trace_id,omitempty"` // the batch that wrote it, found in Jaeger
}

// storyTrace is one trace of the story: why it belongs (Role, Detail), and
// its spans as trees, roots first in time order.
type storyTrace struct {
	Role    string       `json:"role"`
	Detail  string       `json:"detail,omitempty"`
	TraceID string       `json:"trace_id"`
	URL     string       `json:"url"`
	Found   bool         `json:"found"`
	Service string       `json:"service,omitempty"` // the service its spans were exported under
	Start   time.Time    `json:"start,omitzero"`
	Spans   []*storySpan `json:"spans,omitempty"`
	at      time.Time    // where it sorts: its first span, else the row's time
}

type storySpan struct {
	Name     string            `json:"name"`
	SpanID   string            `json:"span_id"`
	Start    time.Time         `json:"start"`
	Duration float64           `json:"duration_ms"`
	Error    string            `json:"error,omitempty"`
	Attrs    map[string]string `json:"attributes,omitempty"`
	Children []*storySpan      `json:"children,omitempty"`
	parent   string
}

func (s *story) unknown() bool {
	return s.Outbox == nil && len(s.Processed) == 0 && len(s.DeadLetters) == 0
}

// eventRecords reads the event's outbox row, processed rows and dead
// letters. The outbox table is optional (only serve and migrate create
// it); sink's tables are not: a schema without them is an error naming it.
func eventRecords(ctx context.Context, pool *pgxpool.Pool, schema string, id uuid.UUID) (*story, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s := &story{EventID: id.String(), Processed: []processedRecord{}, DeadLetters: []deadRecord{}, Traces: []*storyTrace{}}
	q := pgx.Identifier{schema}.Sanitize()
	var hasOutbox, hasSink bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL`,
		q+".outbox", q+".processed_events").Scan(&hasOutbox, &hasSink); err != nil {
		return nil, fmt.Errorf("look for onceflow's tables in schema %q: %w", schema, err)
	}
	if !hasSink {
		return nil, fmt.Errorf("schema %q has no processed_events table: onceflow has not run there (check postgres.schema, --schema)", schema)
	}
	var o outboxRecord
	var traceparent *string
	err := pgx.ErrNoRows
	if hasOutbox {
		err = pool.QueryRow(ctx, `SELECT created_at, published_at, publishes, traceparent FROM `+q+`.outbox WHERE event_id = $1`, id).
			Scan(&o.CreatedAt, &o.PublishedAt, &o.Publishes, &traceparent)
	}
	switch {
	case err == nil:
		if traceparent != nil {
			o.TraceID = traceIDOf(*traceparent)
		}
		s.Outbox = &o
	case !errors.Is(err, pgx.ErrNoRows):
		return nil, fmt.Errorf("read the outbox row: %w", err)
	}
	rows, err := pool.Query(ctx, `SELECT handler, processed_at, coalesce(trace_id, '') FROM `+q+`.processed_events WHERE event_id = $1 ORDER BY processed_at, handler`, id)
	if err != nil {
		return nil, fmt.Errorf("read processed_events: %w", err)
	}
	s.Processed, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (processedRecord, error) {
		var p processedRecord
		return p, r.Scan(&p.Handler, &p.ProcessedAt, &p.TraceID)
	})
	if err != nil {
		return nil, fmt.Errorf("read processed_events: %w", err)
	}
	rows, err = pool.Query(ctx, `SELECT topic, partition, "offset", reason, created_at FROM `+q+`.dead_letters WHERE event_id = $1 ORDER BY created_at, id`, id)
	if err != nil {
		return nil, fmt.Errorf("read dead_letters: %w", err)
	}
	s.DeadLetters, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (deadRecord, error) {
		var d deadRecord
		return d, r.Scan(&d.Topic, &d.Partition, &d.Offset, &d.Reason, &d.CreatedAt)
	})
	if err != nil {
		return nil, fmt.Errorf("read dead_letters: %w", err)
	}
	return s, nil
}

// traceIDOf returns the trace id of a W3C traceparent, "" if it has none.
func traceIDOf(traceparent string) string {
	parts := strings.Split(traceparent, "-")
	if len(parts) != 4 || len(parts[1]) != 32 {
		return ""
	}
	return parts[1]
}

// gather collects the story's traces: those Postgres names, then those
// Jaeger finds by the event's id, then the batches of its dead letters.
func (s *story) gather(ctx context.Context, j *jaeger, lookback time.Duration) error {
	seen := map[string]*storyTrace{}
	add := func(role, detail, id string, at time.Time) *storyTrace {
		if id == "" {
			return nil
		}
		if t := seen[id]; t != nil {
			return t // found again by a search: its first role says more
		}
		t := &storyTrace{Role: role, Detail: detail, TraceID: id, URL: j.base + "/trace/" + id, at: at}
		seen[id] = t
		s.Traces = append(s.Traces, t)
		return t
	}
	since := time.Now().Add(-lookback)
	first := time.Time{}
	note := func(t time.Time) {
		if first.IsZero() || t.Before(first) {
			first = t
		}
	}
	if o := s.Outbox; o != nil {
		note(o.CreatedAt)
		add("ingest", "the outbox row's request, relay and publish", o.TraceID, o.CreatedAt)
	}
	byTrace := map[string][]string{}
	var order []string
	for _, p := range s.Processed {
		note(p.ProcessedAt)
		if _, ok := byTrace[p.TraceID]; !ok {
			order = append(order, p.TraceID)
		}
		byTrace[p.TraceID] = append(byTrace[p.TraceID], p.Handler)
	}
	for _, id := range order {
		at := time.Time{}
		for _, p := range s.Processed {
			if p.TraceID == id {
				at = p.ProcessedAt
				break
			}
		}
		add("applied", "the batch that applied it for "+strings.Join(byTrace[id], ", "), id, at)
	}
	for _, d := range s.DeadLetters {
		note(d.CreatedAt)
	}
	if !first.IsZero() {
		since = first.Add(-time.Minute)
	}
	until := time.Now().Add(time.Minute)

	published, err := j.find(ctx, "", map[string]string{"messaging.message.id": s.EventID}, since, until)
	if err != nil {
		return err
	}
	for _, id := range published {
		add("published", "a publish of the event (a replay or a redelivery)", id, time.Time{})
	}
	reread, err := j.find(ctx, "onceflow.batch", map[string]string{"onceflow.event_id": s.EventID}, since, until)
	if err != nil {
		return err
	}
	for _, id := range reread {
		add("re-read", "a batch that read it again and skipped it as a duplicate", id, time.Time{})
	}
	for i := range s.DeadLetters {
		d := &s.DeadLetters[i]
		id, rereads, complete, err := j.deadLetterBatches(ctx, d, until)
		if err != nil {
			return err
		}
		d.TraceID = id
		add("dead letter", fmt.Sprintf("the batch that dead-lettered %s/%d@%d: %s", d.Topic, d.Partition, d.Offset, d.Reason), id, d.CreatedAt)
		for _, r := range rereads {
			add("re-read", fmt.Sprintf("another batch that read %s/%d@%d (a replay, a redelivery; the dead letter is recorded once)", d.Topic, d.Partition, d.Offset), r, time.Time{})
		}
		if !complete {
			s.Notes = append(s.Notes, fmt.Sprintf("Jaeger returned its limit of %d traces for the batches of %s/%d since the dead letter: later re-reads of it may be missing",
				searchLimit, d.Topic, d.Partition))
		}
	}
	// A service name Jaeger does not know finds nothing: say so when the
	// searches found nothing (Jaeger lists a new service a moment after
	// its first spans are searchable, so a search that found some wins).
	if len(published) == 0 && len(reread) == 0 && !slices.ContainsFunc(s.DeadLetters, func(d deadRecord) bool { return d.TraceID != "" }) {
		if known, err := j.services(ctx); err != nil {
			return err
		} else if known != nil && !slices.Contains(known, j.service) {
			list := strings.Join(known, ", ")
			if len(known) > 10 {
				list = strings.Join(known[:10], ", ") + fmt.Sprintf(" and %d more", len(known)-10)
			}
			if len(known) == 0 {
				list = "none"
			}
			s.Notes = append(s.Notes, fmt.Sprintf("Jaeger knows no service %q (--service, OTEL_SERVICE_NAME): the searches for publishes, re-reads and dead-letter batches found nothing; it knows %s",
				j.service, list))
		}
	}
	for _, t := range s.Traces {
		spans, service, err := j.trace(ctx, t.TraceID)
		if err != nil {
			return err
		}
		if len(spans) > 0 {
			t.Found = true
			t.Service = service
			if service != "" && service != j.service {
				s.Notes = append(s.Notes, fmt.Sprintf("trace %s was exported under service %q, not %q (--service): the searches for its publishes, re-reads and dead-letter batches looked in %q; run again with --service %s",
					t.TraceID, service, j.service, j.service, service))
			}
			t.Spans = spanTree(spans)
			t.Start = t.Spans[0].Start
			t.at = t.Start
		}
	}
	slices.SortStableFunc(s.Traces, func(a, b *storyTrace) int {
		switch {
		case a.at.IsZero() && b.at.IsZero():
			return 0
		case a.at.IsZero():
			return 1
		case b.at.IsZero():
			return -1
		}
		return a.at.Compare(b.at)
	})
	return nil
}

// spanTree links spans to their parents (a span whose parent is not in the
// trace is a root) and sorts each level by start time.
func spanTree(spans []*storySpan) []*storySpan {
	byID := map[string]*storySpan{}
	for _, sp := range spans {
		byID[sp.SpanID] = sp
	}
	var roots []*storySpan
	for _, sp := range spans {
		if p := byID[sp.parent]; p != nil && sp.parent != "" && p != sp {
			p.Children = append(p.Children, sp)
		} else {
			roots = append(roots, sp)
		}
	}
	var sortLevel func([]*storySpan)
	sortLevel = func(l []*storySpan) {
		slices.SortStableFunc(l, func(a, b *storySpan) int { return a.Start.Compare(b.Start) })
		for _, sp := range l {
			sortLevel(sp.Children)
		}
	}
	sortLevel(roots)
	return roots
}

// print writes the story as text: what Postgres holds, then each trace as
// a tree.
func (s *story) print(w io.Writer) {
	fmt.Fprintf(w, "event %s\n", s.EventID)
	if o := s.Outbox; o != nil {
		pub := "not published"
		if o.PublishedAt != nil {
			pub = "published " + o.PublishedAt.UTC().Format(time.RFC3339Nano)
		}
		fmt.Fprintf(w, "  outbox: written %s, %s, %d publish(es)\n", o.CreatedAt.UTC().Format(time.RFC3339Nano), pub, o.Publishes)
	}
	for _, p := range s.Processed {
		fmt.Fprintf(w, "  applied: %s at %s, trace %s\n", p.Handler, p.ProcessedAt.UTC().Format(time.RFC3339Nano), orNone(p.TraceID))
	}
	for _, d := range s.DeadLetters {
		fmt.Fprintf(w, "  dead letter: %s/%d@%d at %s: %s\n", d.Topic, d.Partition, d.Offset, d.CreatedAt.UTC().Format(time.RFC3339Nano), d.Reason)
	}
	for _, t := range s.Traces {
		fmt.Fprintf(w, "\n%s — %s\n  trace %s  %s\n", t.Role, t.Detail, t.TraceID, t.URL)
		if !t.Found {
			if s.JaegerError != "" {
				fmt.Fprintln(w, "  (Jaeger unreachable: its spans are not shown)")
			} else {
				fmt.Fprintln(w, "  (not in Jaeger: not sampled, not exported, or past its retention)")
			}
			continue
		}
		for i, sp := range t.Spans {
			printSpan(w, sp, "  ", i == len(t.Spans)-1)
		}
	}
	if s.JaegerError != "" {
		fmt.Fprintf(w, "\nJaeger unreachable: %s\n  the traces above are those Postgres names; the publishes, re-reads and dead-letter batches Jaeger would find are missing\n", s.JaegerError)
	}
	for _, n := range s.Notes {
		fmt.Fprintf(w, "\nnote: %s\n", n)
	}
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

func printSpan(w io.Writer, sp *storySpan, indent string, last bool) {
	branch, next := "├─ ", "│  "
	if last {
		branch, next = "└─ ", "   "
	}
	line := fmt.Sprintf("%s%s%s  %s%s", indent, branch, sp.Name, fmtMillis(sp.Duration), spanNote(sp))
	if sp.Error != "" {
		line += "  ERROR " + sp.Error
	}
	fmt.Fprintln(w, line)
	for i, c := range sp.Children {
		printSpan(w, c, indent+next, i == len(sp.Children)-1)
	}
}

// spanNote says where a batch span read: its topic, partition and
// offsets, and what it did with them.
func spanNote(sp *storySpan) string {
	if sp.Name != "onceflow.batch" {
		return ""
	}
	a := sp.Attrs
	first, err1 := strconv.ParseInt(a["onceflow.first_offset"], 10, 64)
	next, err2 := strconv.ParseInt(a["onceflow.next_offset"], 10, 64)
	if err1 != nil || err2 != nil {
		return ""
	}
	note := fmt.Sprintf("  %s/%s offsets %d-%d", a["messaging.destination.name"], a["messaging.destination.partition.id"], first, next-1)
	for _, k := range []string{"onceflow.applied", "onceflow.skipped", "onceflow.attempts"} {
		if v := a[k]; v != "" && v != "0" && !(k == "onceflow.attempts" && v == "1") {
			note += fmt.Sprintf(", %s %s", strings.TrimPrefix(k, "onceflow."), v)
		}
	}
	return note
}

func fmtMillis(ms float64) string {
	return strconv.FormatFloat(ms, 'f', 3, 64) + "ms"
}

// jaeger is a client of Jaeger's query service: its search (/api/traces,
// which takes tags) and its OTLP trace API (/api/v3/traces/{id}).
type jaeger struct {
	base    string
	service string
	http    *http.Client
}

func (j *jaeger) get(ctx context.Context, path string, q url.Values, out any) (found bool, err error) {
	u := j.base + path
	if q != nil {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return false, fmt.Errorf("jaeger at %s: %w", j.base, err)
	}
	resp, err := j.http.Do(req)
	if err != nil {
		return false, fmt.Errorf("jaeger at %s does not answer (--jaeger): %w", j.base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return false, nil
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return false, fmt.Errorf("jaeger at %s: read %s: %w", j.base, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Errorf("jaeger at %s: %s: %s: %s", j.base, path, resp.Status, strings.TrimSpace(string(body)))
	}
	if err := json.Unmarshal(body, out); err != nil {
		return false, fmt.Errorf("jaeger at %s: %s: %w", j.base, path, err)
	}
	return true, nil
}

// find returns the ids of the traces of j.service with a span (of
// operation, if not "") whose attributes or events' attributes hold tags,
// started between since and until.
func (j *jaeger) find(ctx context.Context, operation string, tags map[string]string, since, until time.Time) ([]string, error) {
	ids, _, err := j.search(ctx, operation, tags, since, until, 100)
	return ids, err
}

// searchLimit is how many traces a search for a partition's batches asks
// Jaeger for.
const searchLimit = 1000

// search is find with a limit; complete is false when Jaeger returned
// limit traces (there may be more).
func (j *jaeger) search(ctx context.Context, operation string, tags map[string]string, since, until time.Time, limit int) (ids []string, complete bool, err error) {
	tj, _ := json.Marshal(tags)
	q := url.Values{
		"service": {j.service},
		"tags":    {string(tj)},
		"start":   {strconv.FormatInt(since.UnixMicro(), 10)},
		"end":     {strconv.FormatInt(until.UnixMicro(), 10)},
		"limit":   {strconv.Itoa(limit)},
	}
	if operation != "" {
		q.Set("operation", operation)
	}
	var body struct {
		Data []struct {
			TraceID string `json:"traceID"`
		} `json:"data"`
	}
	if _, err := j.get(ctx, "/api/traces", q, &body); err != nil {
		return nil, false, err
	}
	var out []string
	for _, t := range body.Data {
		out = append(out, t.TraceID)
	}
	slices.Sort(out)
	return slices.Compact(out), len(body.Data) < limit, nil
}

// services returns the service names Jaeger holds traces of (none: an
// empty list), nil if this Jaeger does not list them.
func (j *jaeger) services(ctx context.Context) ([]string, error) {
	var body struct {
		Data []string `json:"data"`
	}
	found, err := j.get(ctx, "/api/services", nil, &body)
	if err != nil || !found {
		return nil, err
	}
	slices.Sort(body.Data)
	return append([]string{}, body.Data...), nil
}

// deadLetterBatches returns the trace id of the batch that wrote d — of
// the onceflow.batch spans of its topic and partition whose offsets hold
// d's, the one that started nearest to d's created_at ("" if Jaeger has
// none) — and those of the other batches that read d's record, up to
// until: a replay's, a redelivery's (the dead letter is recorded once).
// complete is false when the search hit its limit.
func (j *jaeger) deadLetterBatches(ctx context.Context, d *deadRecord, until time.Time) (writer string, rereads []string, complete bool, err error) {
	ids, complete, err := j.search(ctx, "onceflow.batch", map[string]string{
		"messaging.destination.name":         d.Topic,
		"messaging.destination.partition.id": strconv.Itoa(int(d.Partition)),
	}, d.CreatedAt.Add(-2*time.Minute), until, searchLimit)
	if err != nil {
		return "", nil, false, err
	}
	// created_at is the writing transaction's start, just after its batch
	// span's start; the nearest start, on either side, allows for the
	// clocks of onceflow and Postgres being apart.
	bestGap := time.Duration(-1)
	readers := map[string]bool{}
	for _, id := range ids {
		spans, _, err := j.trace(ctx, id)
		if err != nil {
			return "", nil, false, err
		}
		for _, sp := range spans {
			if sp.Name != "onceflow.batch" || sp.Attrs["messaging.destination.name"] != d.Topic ||
				sp.Attrs["messaging.destination.partition.id"] != strconv.Itoa(int(d.Partition)) {
				continue
			}
			first, err1 := strconv.ParseInt(sp.Attrs["onceflow.first_offset"], 10, 64)
			next, err2 := strconv.ParseInt(sp.Attrs["onceflow.next_offset"], 10, 64)
			if err1 != nil || err2 != nil || d.Offset < first || d.Offset >= next {
				continue
			}
			readers[id] = true
			gap := sp.Start.Sub(d.CreatedAt).Abs()
			if bestGap < 0 || gap < bestGap {
				writer, bestGap = id, gap
			}
		}
	}
	delete(readers, writer)
	for id := range readers {
		rereads = append(rereads, id)
	}
	slices.Sort(rereads)
	return writer, rereads, complete, nil
}

// otlpAny is an OTLP JSON attribute value.
type otlpAny struct {
	StringValue *string  `json:"stringValue"`
	IntValue    *string  `json:"intValue"` // int64 as a JSON string
	BoolValue   *bool    `json:"boolValue"`
	DoubleValue *float64 `json:"doubleValue"`
}

func (v otlpAny) String() string {
	switch {
	case v.StringValue != nil:
		return *v.StringValue
	case v.IntValue != nil:
		return *v.IntValue
	case v.BoolValue != nil:
		return strconv.FormatBool(*v.BoolValue)
	case v.DoubleValue != nil:
		return strconv.FormatFloat(*v.DoubleValue, 'g', -1, 64)
	}
	return ""
}

// trace returns the spans of trace id and the service they were exported
// under (the first span's, if several), nil when Jaeger does not hold it.
func (j *jaeger) trace(ctx context.Context, id string) (_ []*storySpan, service string, _ error) {
	type kv struct {
		Key   string  `json:"key"`
		Value otlpAny `json:"value"`
	}
	var body struct {
		Result struct {
			ResourceSpans []struct {
				Resource struct {
					Attributes []kv `json:"attributes"`
				} `json:"resource"`
				ScopeSpans []struct {
					Spans []struct {
						SpanID       string `json:"spanId"`
						ParentSpanID string `json:"parentSpanId"`
						Name         string `json:"name"`
						Start        string `json:"startTimeUnixNano"`
						End          string `json:"endTimeUnixNano"`
						Attributes   []kv   `json:"attributes"`
						Status       struct {
							Code    any    `json:"code"`
							Message string `json:"message"`
						} `json:"status"`
					} `json:"spans"`
				} `json:"scopeSpans"`
			} `json:"resourceSpans"`
		} `json:"result"`
	}
	found, err := j.get(ctx, "/api/v3/traces/"+url.PathEscape(id), nil, &body)
	if err != nil || !found {
		return nil, "", err
	}
	var out []*storySpan
	for _, rs := range body.Result.ResourceSpans {
		for _, a := range rs.Resource.Attributes {
			if a.Key == "service.name" && service == "" {
				service = a.Value.String()
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, sp := range ss.Spans {
				start, _ := strconv.ParseInt(sp.Start, 10, 64)
				end, _ := strconv.ParseInt(sp.End, 10, 64)
				s := &storySpan{Name: sp.Name, SpanID: sp.SpanID, parent: sp.ParentSpanID,
					Start: time.Unix(0, start).UTC(), Duration: float64(end-start) / 1e6, Attrs: map[string]string{}}
				for _, a := range sp.Attributes {
					s.Attrs[a.Key] = a.Value.String()
				}
				if c := fmt.Sprint(sp.Status.Code); c == "2" || c == "STATUS_CODE_ERROR" {
					s.Error = orNone(sp.Status.Message)
				}
				out = append(out, s)
			}
		}
	}
	return out, service, nil
}
