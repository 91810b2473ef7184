package replay

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// read calls fn, in offset order per partition, for every record of each
// partition's range [from, to), with a client of its own that belongs to
// no group. It returns when every range is read (a range whose end lies
// beyond the records, such as transaction markers, ends at the partition's
// high watermark), fn fails, or ctx ends.
func (r *Replayer) read(ctx context.Context, ranges map[TopicPartition][2]int64, fn func(*kgo.Record) error) error {
	parts := map[string]map[int32]kgo.Offset{}
	left := map[TopicPartition]int64{} // end of each range not yet read
	for tp, rg := range ranges {
		if rg[0] >= rg[1] {
			continue
		}
		if parts[tp.Topic] == nil {
			parts[tp.Topic] = map[int32]kgo.Offset{}
		}
		parts[tp.Topic][tp.Partition] = kgo.NewOffset().At(rg[0])
		left[tp] = rg[1]
	}
	if len(left) == 0 {
		return nil
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(r.cfg.Brokers...), kgo.ConsumePartitions(parts),
		kgo.FetchMaxWait(500 * time.Millisecond)}, r.cfg.KafkaOptions...)...)
	if err != nil {
		return fmt.Errorf("replay: kafka client: %w", err)
	}
	defer cl.Close()
	for len(left) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("replay: read records: %d partitions not read to the end: %w", len(left), err)
		}
		var ferr error
		fs.EachError(func(t string, p int32, err error) {
			if ferr == nil {
				ferr = fmt.Errorf("replay: read %s/%d: %w", t, p, err)
			}
		})
		if ferr != nil {
			return ferr
		}
		var stop error
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			tp := TopicPartition{p.Topic, p.Partition}
			end, ok := left[tp]
			if !ok || stop != nil {
				return
			}
			next := int64(-1)
			for _, rec := range p.Records {
				next = rec.Offset + 1
				if rec.Offset >= end {
					break
				}
				if err := fn(rec); err != nil {
					stop = err
					return
				}
			}
			if next >= end || (p.HighWatermark >= 0 && p.HighWatermark <= max(next, 0) && next >= 0) {
				delete(left, tp)
			}
		})
		if stop != nil {
			return stop
		}
	}
	return nil
}
