// What a batch skips: the keys the LRU knows are committed (fromCache), and
// the dedup.skip log lines and span events for each key skipped.

package sink

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/dedup"
)

// pending is one (event, handler) pair that survived the cache.
type pending struct {
	key    dedup.Key
	event  int          // index into Batch.Events
	digest dedup.Digest // of the event's payload
}

// fromCache returns the (event, handler) keys of b for the handlers that
// consume b's topic, dropping those the cache knows are committed. An
// event the cache knows under another payload digest is a conflict: none
// of its keys is kept, and it is returned as a dead letter.
func (w *Writer) fromCache(b *Batch) ([]pending, []skip, []DeadLetter) {
	hs := w.cfg.Handlers
	if w.filtered {
		hs = nil
		for _, h := range w.cfg.Handlers {
			if f, ok := h.(TopicFilter); !ok || f.Consumes(b.Topic) {
				hs = append(hs, h)
			}
		}
	}
	todo := make([]pending, 0, len(b.Events)*len(hs))
	var skipped []skip
	var conflicts []DeadLetter
	for i := range b.Events {
		d := dedup.PayloadDigest(b.Events[i].Value)
		mark := len(todo)
		marks := len(skipped)
		conflict := false
		for _, h := range hs {
			k := dedup.Key{EventID: b.Events[i].ID, Handler: h.Name()}
			if seen, c := w.cfg.Cache.Seen(k, d); seen {
				conflict = conflict || c
				skipped = append(skipped, skip{k, i, "lru", d})
				continue
			}
			todo = append(todo, pending{k, i, d})
		}
		if conflict {
			todo, skipped = todo[:mark], skipped[:marks]
			conflicts = append(conflicts, w.conflictLetter(b, i, "lru"))
		}
	}
	return todo, skipped, conflicts
}

type skip struct {
	key    dedup.Key
	event  int
	layer  string       // lru | postgres
	digest dedup.Digest // the digest stored with the key
}

// logSkips logs dedup.skip for each skipped key (the first SkipLogLimit at
// Info, the rest at Debug) and records up to SkipEventLimit span events.
func (w *Writer) logSkips(ctx context.Context, b *Batch, skipped []skip) {
	if len(skipped) == 0 {
		return
	}
	span := trace.SpanFromContext(ctx)
	span.SetAttributes(attribute.Int("onceflow.skipped", len(skipped)))
	// Asked once a batch: at the usual Warn level, with no tracing, a
	// skipped key costs nothing more.
	info, debug, recording := w.log.Enabled(ctx, slog.LevelInfo), w.log.Enabled(ctx, slog.LevelDebug), span.IsRecording()
	for i, s := range skipped {
		if i >= w.cfg.SkipLogLimit && !debug && (i >= w.cfg.SkipEventLimit || !recording) {
			break
		}
		e := &b.Events[s.event]
		level, on := slog.LevelInfo, info
		if i >= w.cfg.SkipLogLimit {
			level, on = slog.LevelDebug, debug
		}
		if on {
			w.log.Log(ctx, level, "dedup.skip", "step", "dedup.skip", "event_id", s.key.EventID.String(),
				"bus", w.cfg.Bus, "handler", s.key.Handler, "layer", s.layer,
				"topic", e.Topic, "partition", e.Partition, "offset", e.Offset)
		}
		if i < w.cfg.SkipEventLimit && recording {
			span.AddEvent("dedup.skip", trace.WithAttributes(
				attribute.String("onceflow.event_id", s.key.EventID.String()),
				attribute.String("onceflow.handler", s.key.Handler),
				attribute.String("onceflow.layer", s.layer)))
		}
	}
}
