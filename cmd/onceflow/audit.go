package main

import (
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow/internal/api"
)

func newAuditCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "audit EVENT_ID",
		Short: "Show what happened to one event: outbox row, processed rows per handler, emails, dead letters",
		Long: `audit prints, as JSON, what onceflow recorded about one event: its outbox
row (where serve's API wrote it), its processed_events row per handler,
the demo's emails, and its dead letters, including one written while
decoding if its id could be read (the event_id header, or the
decode.event_id_field as far as the value parses).

An id onceflow has no record of (no outbox row, no processed row, no dead
letter) is said so on standard error, with nothing on standard output,
and audit exits 1.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, ok := api.ParseID(args[0])
			if !ok {
				return fmt.Errorf("event id %q is not a UUID (like 7f8a0000-0000-0000-0000-000000000001)", args[0])
			}
			return withPool(cmd, func(a *app, pool *pgxpool.Pool) error {
				store, err := a.outboxStore(pool)
				if err != nil {
					return err
				}
				res, err := api.Audit(cmd.Context(), pool, store, a.cfg.Postgres.Schema, a.handlerNames(), a.cfg.Dedup.Retention, id)
				if err != nil {
					return err
				}
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(res)
			})
		},
	}
}
