package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func newMigrateCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "migrate",
		Short: "Create or upgrade onceflow's tables in postgres.schema",
		Long: `migrate creates the schema named by postgres.schema if needed, and in it
processed_events, sink_offsets, dead_letters and the demo business tables
(emails_sent, inventory_reserved, analytics_counters, recommender_weights).
It is idempotent and safe to run concurrently; run also migrates at start.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			a, err := load(cmd)
			if err != nil {
				return err
			}
			pool, err := a.openPool(cmd.Context(), 1)
			if err != nil {
				return err
			}
			defer pool.Close()
			if err := migrate(cmd.Context(), pool, a.cfg.Postgres.Schema); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "schema %s is up to date\n", a.cfg.Postgres.Schema)
			return nil
		},
	}
}
