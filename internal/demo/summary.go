package demo

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/members"
	"github.com/onceflow/onceflow/internal/orders"
)

// Summary is the demo's result. Counts marked (pairs) are
// (event, handler) pairs; the rest are read back from Postgres.
type Summary struct {
	RecordsPublished    int              `json:"records_published"`
	UniqueEvents        int              `json:"unique_events"`
	DuplicatesPublished int              `json:"duplicates_published"`
	ReplayedEvents      int              `json:"replayed_events"`
	RecordsConsumed     int64            `json:"records_consumed"`
	SkippedLRU          int64            `json:"duplicates_skipped_lru"`      // pairs
	SkippedPostgres     int64            `json:"duplicates_skipped_postgres"` // pairs
	DeadLetters         int64            `json:"dead_letters"`
	ProcessedRows       map[string]int64 `json:"processed_events_rows"`
	ProcessedTotal      int64            `json:"processed_events_total"`
	EmailsSent          int64            `json:"emails_sent"`
	OrdersCounter       int64            `json:"analytics_orders"`
	ItemsCounter        int64            `json:"analytics_items"`
	ItemsReserved       int64            `json:"inventory_reserved"`
	RecommenderWeight   int64            `json:"recommender_weight"`
	MembersStarted      int              `json:"members_started"`
	MembersLeft         int              `json:"members_left"`
	MembersCrashed      int              `json:"members_crashed"`
	PartitionsAssigned  int64            `json:"partitions_assigned"`
	Handlers            int              `json:"handlers"`
	Schema              string           `json:"schema"`
	ElapsedSeconds      float64          `json:"elapsed_seconds"`
	ExactlyOnce         bool             `json:"exactly_once"`
	Problems            []string         `json:"problems"`
}

// summarize reads the tables back and checks them against the stream.
func summarize(ctx context.Context, env Env, o Options, g *members.Group, stream orders.Stream, replayed int, start time.Time) (Summary, error) {
	rep, err := orders.Check(ctx, env.Pool, o.Schema, stream.Unique, env.Handlers...)
	if err != nil {
		return Summary{}, err
	}
	var dead int64
	if err := env.Pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{o.Schema, "dead_letters"}.Sanitize()).Scan(&dead); err != nil {
		return Summary{}, fmt.Errorf("count dead letters: %w", err)
	}
	s, c := g.Stats(), g.Counts()
	sum := Summary{
		RecordsPublished: len(stream.Messages) + replayed, UniqueEvents: o.Events,
		DuplicatesPublished: len(stream.Messages) - o.Events, ReplayedEvents: replayed,
		RecordsConsumed: s.RecordsConsumed, SkippedLRU: s.SkippedLRU, SkippedPostgres: s.SkippedPostgres,
		DeadLetters: dead, ProcessedRows: rep.ProcessedRows,
		EmailsSent: rep.EmailsSent, OrdersCounter: rep.OrdersCounter, ItemsCounter: rep.ItemsCounter,
		ItemsReserved: rep.ItemsReserved, RecommenderWeight: rep.RecommenderWeight,
		MembersStarted: c.Started, MembersLeft: c.Left, MembersCrashed: c.Crashed, PartitionsAssigned: s.Assigned,
		Handlers: len(env.Handlers), Schema: o.Schema, ElapsedSeconds: time.Since(start).Seconds(),
		ExactlyOnce: rep.ExactlyOnce(), Problems: rep.Problems,
	}
	for _, n := range rep.ProcessedRows {
		sum.ProcessedTotal += n
	}
	if sum.Problems == nil {
		sum.Problems = []string{}
	}
	return sum, nil
}

// Print writes the summary for a person to read.
func (s Summary) Print(w io.Writer) {
	yes := "yes: every event's effects happened exactly once"
	if !s.ExactlyOnce {
		yes = "NO"
	}
	fmt.Fprintf(w, `
onceflow demo summary (read back from Postgres schema %s)
  records published       %d  (%d unique events, %d redeliveries, %d replayed)
  records consumed        %d  (some read again after rebalances)
  duplicates skipped      %d by the LRU, %d by Postgres  ((event, handler) pairs)
  dead letters            %d
  members                 %d started, %d left, %d crashed without committing; %d partition assignments
  processed_events rows   %d  (%d handlers x %d events)
  emails_sent             %d
  analytics counters      orders %d, items %d
  inventory reserved      %d items
  recommender weight      %d
  exactly once            %s
`, s.Schema, s.RecordsPublished, s.UniqueEvents, s.DuplicatesPublished, s.ReplayedEvents,
		s.RecordsConsumed, s.SkippedLRU, s.SkippedPostgres, s.DeadLetters,
		s.MembersStarted, s.MembersLeft, s.MembersCrashed, s.PartitionsAssigned,
		s.ProcessedTotal, s.Handlers, s.UniqueEvents, s.EmailsSent, s.OrdersCounter, s.ItemsCounter,
		s.ItemsReserved, s.RecommenderWeight, yes)
	for _, p := range s.Problems {
		fmt.Fprintf(w, "  problem: %s\n", p)
	}
}
