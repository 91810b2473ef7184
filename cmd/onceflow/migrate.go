package main

import (
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
)

func newMigrateCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "migrate",
		Short: "Create or upgrade onceflow's tables in postgres.schema",
		Long: `migrate creates the schema named by postgres.schema if needed, and in it
processed_events, sink_offsets, dead_letters, the outbox and orders (what
serve's API writes), and the tables of the configured handlers (the demo's:
emails_sent, inventory_reserved, analytics_counters, recommender_weights).
It is idempotent and safe to run concurrently; run also migrates at start.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withPool(cmd, func(a *app, pool *pgxpool.Pool) error {
				if err := a.migrate(cmd.Context(), pool, a.cfg.Postgres.Schema); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "schema %s is up to date\n", a.cfg.Postgres.Schema)
				return nil
			})
		},
	}
}
