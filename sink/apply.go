// Applying events inside a transaction: claim their keys, parse them once
// (Config.Parse), refuse conflicts and rejections, and run each handler on
// the events it claimed.

package sink

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/dedup"
)

// apply claims keys and runs each handler on the events it claimed.
//
// h is nil but in an isolating transaction (see claim).
func (w *Writer) apply(ctx context.Context, tx pgx.Tx, b *Batch, keys []pending, h *held) (outcome, error) {
	traceID := ""
	if sc := trace.SpanContextFromContext(ctx); sc.HasTraceID() {
		traceID = sc.TraceID().String()
	}
	won, stored, slice, err := w.claim(ctx, tx, keys, traceID, h)
	if err != nil {
		return outcome{}, err
	}
	conflicting := conflicts(keys, won, stored)
	parsed, rejected, err := w.parse(b, keys, won, conflicting)
	if err != nil {
		return outcome{}, err
	}
	again, reclaimed := reclaim(keys, won, stored, conflicting, rejected)
	// Each handler's events, in one allocation per handler.
	counts := make(map[string]int, len(w.cfg.Handlers))
	nwon := 0
	for i, p := range keys {
		if won[i] {
			counts[p.key.Handler]++
			nwon++
		}
	}
	// Sized by what the claim found: a replay's re-read claims nothing.
	out := outcome{claimed: make([]dedup.Key, 0, nwon), digests: make([]dedup.Digest, 0, nwon),
		already: make([]skip, 0, len(keys)-nwon), slice: slice}
	perHandler := make(map[string][]Event, len(counts))
	for h, n := range counts {
		perHandler[h] = getEvents(n)
	}
	defer func() {
		for _, evs := range perHandler {
			putEvents(evs)
		}
	}()
	for i, p := range keys {
		switch {
		case conflicting[p.event] || rejected[p.event] != nil:
			// Refused below, with any claim it made here taken back.
		case reclaimed[p.event]:
			// Claimed again below.
		case won[i]:
			out.claimed = append(out.claimed, p.key)
			out.digests = append(out.digests, p.digest)
			e := b.Events[p.event]
			if parsed != nil {
				e.Parsed = parsed[p.event]
			}
			perHandler[p.key.Handler] = append(perHandler[p.key.Handler], e)
		default:
			out.already = append(out.already, skip{p.key, p.event, "postgres", stored[i]})
		}
	}
	if len(conflicting) > 0 || len(rejected) > 0 {
		dead, err := w.refuse(ctx, tx, b, keys, won, conflicting, rejected)
		if err != nil {
			return outcome{}, err
		}
		out.dead = append(out.dead, dead...)
	}
	for _, h := range w.cfg.Handlers {
		events := perHandler[h.Name()]
		if len(events) == 0 {
			continue
		}
		hctx, span := w.tracer.Start(ctx, "handler "+h.Name(), trace.WithAttributes(
			attribute.String("onceflow.handler", h.Name()), attribute.Int("onceflow.events", len(events))))
		err := runHandler(hctx, h, tx, events)
		endSpan(span, err)
		if err != nil {
			return outcome{}, &handlerError{handler: h.Name(), err: err}
		}
	}
	if len(again) > 0 {
		o, err := w.apply(ctx, tx, b, again, h)
		if err != nil {
			return outcome{}, err
		}
		out.merge(o)
	}
	return out, nil
}

// eventSlices recycles the slices of events apply hands the handlers,
// which keep none of them past Apply (Handler's contract).
var eventSlices sync.Pool

// getEvents returns an empty slice of events with room for n.
func getEvents(n int) []Event {
	if p, ok := eventSlices.Get().(*[]Event); ok && cap(*p) >= n {
		return (*p)[:0]
	}
	return make([]Event, 0, n)
}

// putEvents clears evs, so that it holds on to no record, and recycles it.
func putEvents(evs []Event) {
	clear(evs)
	eventSlices.Put(&evs)
}

// reclaim finds the events that conflict only with claims that events
// Parse refused made in this transaction (a refused version then its
// correction, in one batch): those claims are taken back, so these events
// are no conflicting duplicates and claim again. It removes them from
// conflicting and returns their keys, and the events.
func reclaim(keys []pending, won []bool, stored []dedup.Digest, conflicting map[int]bool, rejected map[int]error) ([]pending, map[int]bool) {
	if len(conflicting) == 0 || len(rejected) == 0 {
		return nil, nil
	}
	refused := map[dedup.Key]bool{}
	for i, p := range keys {
		if won[i] && rejected[p.event] != nil {
			refused[p.key] = true
		}
	}
	only := map[int]bool{}
	for e := range conflicting {
		only[e] = true
	}
	for i, p := range keys {
		if won[i] || (stored[i].Conflicts(p.digest) && !refused[p.key]) {
			delete(only, p.event) // it claimed, or conflicts with a claim that stands
		}
	}
	var again []pending
	for _, p := range keys {
		if only[p.event] {
			again = append(again, p)
		}
	}
	for e := range only {
		delete(conflicting, e)
	}
	return again, only
}

// parse runs Config.Parse once on every event of b that won a claim in
// keys and is not conflicting. It returns the results by event index (nil
// without Parse) and the events Parse refused, with its errors. A panic
// in Parse is an error of the batch, as a handler's is: retried, not
// dead-lettered, since it may say more about Parse than about the event.
func (w *Writer) parse(b *Batch, keys []pending, won []bool, conflicting map[int]bool) (parsed []any, rejected map[int]error, err error) {
	if w.cfg.Parse == nil {
		return nil, nil, nil
	}
	defer func() {
		if p := recover(); p != nil {
			parsed, rejected, err = nil, nil, fmt.Errorf("parse: panic: %v\n%s", p, debug.Stack())
		}
	}()
	parsed = make([]any, len(b.Events))
	done := make([]bool, len(b.Events))
	for i, p := range keys {
		if !won[i] || done[p.event] || conflicting[p.event] {
			continue
		}
		done[p.event] = true
		v, err := w.cfg.Parse(b.Events[p.event])
		if err != nil {
			if rejected == nil {
				rejected = map[int]error{}
			}
			rejected[p.event] = err
			continue
		}
		parsed[p.event] = v
	}
	// A later copy of a refused event in b (same id and payload: another
	// payload conflicts) lost its keys to the refused copy's claims, which
	// are taken back: it is refused too, not a duplicate of a claim.
	if len(rejected) > 0 {
		refused := map[dedup.Key]error{}
		for i, p := range keys {
			if won[i] && rejected[p.event] != nil {
				refused[p.key] = rejected[p.event]
			}
		}
		for i, p := range keys {
			if perr, ok := refused[p.key]; ok && !won[i] && !conflicting[p.event] && rejected[p.event] == nil {
				rejected[p.event] = perr
			}
		}
	}
	return parsed, rejected, nil
}

// runHandler calls h.Apply, turning a panic into an error.
func runHandler(ctx context.Context, h Handler, tx pgx.Tx, events []Event) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v\n%s", p, debug.Stack())
		}
	}()
	return h.Apply(ctx, tx, events)
}
