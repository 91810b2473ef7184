package processor

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// checkHorizon reads the consumed topics' retention.ms, retrying until the
// brokers answer or ctx ends, and logs a warning for each topic that keeps
// records longer than the dedup horizon.
func (c *Consumer) checkHorizon(ctx context.Context, cl *kgo.Client) {
	backoff := c.cfg.RetryBackoff
	for {
		tctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
		rcs, err := kadm.NewClient(cl).DescribeTopicConfigs(tctx, c.cfg.Topics...)
		cancel()
		if err == nil {
			retention := map[string]string{}
			for _, rc := range rcs {
				if rc.Err != nil {
					continue // a topic not created yet: not checked (the check runs once, at start)
				}
				for _, cfg := range rc.Configs {
					if cfg.Key == "retention.ms" && cfg.Value != nil {
						retention[rc.Name] = *cfg.Value
					}
				}
			}
			for _, w := range horizonWarnings(c.cfg.Topics, retention, c.cfg.DedupHorizon) {
				c.log.Warn(w.msg, "topic", w.topic, "retention_ms", w.retention, "dedup_horizon", c.cfg.DedupHorizon)
			}
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, c.cfg.MaxRetryBackoff)
	}
}

type horizonWarning struct {
	topic, retention, msg string
}

// horizonWarnings returns a warning for each topic whose retention.ms
// (from retention, by topic; absent for topics not described) is longer
// than horizon, or unlimited (-1).
func horizonWarnings(topics []string, retention map[string]string, horizon time.Duration) []horizonWarning {
	var ws []horizonWarning
	for _, t := range topics {
		v, ok := retention[t]
		if !ok {
			continue
		}
		ms, err := strconv.ParseInt(v, 10, 64)
		switch {
		case err != nil:
			continue
		case ms < 0 || ms > int64(math.MaxInt64/time.Millisecond):
			ws = append(ws, horizonWarning{t, v, "the topic keeps records forever (retention.ms=" + v + "), longer than the dedup horizon (dedup.retention): " +
				"a rewind or redelivery older than the horizon applies its events again"})
		case time.Duration(ms)*time.Millisecond > horizon:
			ws = append(ws, horizonWarning{t, v, fmt.Sprintf("the topic keeps records for %v, longer than the dedup horizon (dedup.retention): "+
				"a rewind or redelivery older than the horizon applies its events again", time.Duration(ms)*time.Millisecond)})
		}
	}
	return ws
}
