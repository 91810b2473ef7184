package sink_test

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/onceflow/onceflow/sink"
)

// A handler that books payments into a ledger: one statement for the whole
// batch (unnest over arrays), inside the batch's transaction, and a
// *RejectError for an event that can never apply, which becomes a dead
// letter while the rest of the batch applies.
func ExampleHandlerFunc() {
	ledger := sink.HandlerFunc("ledger", func(ctx context.Context, tx pgx.Tx, events []sink.Event) error {
		// pgtype.UUID, not uuid.UUID: arrays of it are also sent under the
		// exec and simple_protocol query modes (a transaction pooler).
		ids := make([]pgtype.UUID, 0, len(events))
		accounts := make([]string, 0, len(events))
		amounts := make([]int64, 0, len(events))
		for _, e := range events {
			var p struct {
				Account string `json:"account"`
				Cents   int64  `json:"cents"`
			}
			if err := json.Unmarshal(e.Value, &p); err != nil || p.Account == "" {
				return &sink.RejectError{EventID: e.ID, Reason: "not a payment"}
			}
			ids = append(ids, pgtype.UUID{Bytes: e.ID, Valid: true})
			accounts, amounts = append(accounts, p.Account), append(amounts, p.Cents)
		}
		_, err := tx.Exec(ctx, `INSERT INTO ledger (event_id, account, cents)
			SELECT * FROM unnest($1::uuid[], $2::text[], $3::bigint[])`, ids, accounts, amounts)
		return err
	})
	// The name is the handler column of processed_events: the dedup key is
	// (event_id, "ledger").
	fmt.Println(ledger.Name())
	// Output: ledger
}
