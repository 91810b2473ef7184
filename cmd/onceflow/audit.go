package main

import (
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow/api"
)

func newAuditCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "audit EVENT_ID",
		Short: "Show what happened to one event: outbox row, processed rows per handler, emails, dead letters",
		Args:  cobra.ExactArgs(1),
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
