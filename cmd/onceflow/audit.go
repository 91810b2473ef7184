package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow/orders"
	"github.com/onceflow/onceflow/sink"
)

// eventAudit is the answer of `onceflow audit` and GET /audit/event/{id}.
type eventAudit struct {
	sink.EventAudit
	EmailsSent int64 `json:"emails_sent"`
}

// auditEvent audits one event, listing processed rows in handlers' order.
func auditEvent(ctx context.Context, pool *pgxpool.Pool, schema string, handlers []string, id uuid.UUID) (eventAudit, error) {
	a, err := sink.Audit(ctx, pool, schema, id)
	if err != nil {
		return eventAudit{}, err
	}
	rank := func(h string) int {
		if i := slices.Index(handlers, h); i >= 0 {
			return i
		}
		return len(handlers)
	}
	slices.SortStableFunc(a.Processed, func(x, y sink.Processed) int { return cmp.Compare(rank(x.Handler), rank(y.Handler)) })
	n, err := orders.EmailsSent(ctx, pool, schema, id)
	if err != nil {
		return eventAudit{}, err
	}
	return eventAudit{EventAudit: a, EmailsSent: n}, nil
}

func newAuditCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "audit EVENT_ID",
		Short: "Show what happened to one event: processed rows per handler, emails, dead letters",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := uuid.Parse(args[0])
			if err != nil || len(args[0]) != 36 {
				return fmt.Errorf("event id %q is not a UUID (like 7f8a0000-0000-0000-0000-000000000001)", args[0])
			}
			a, err := load(cmd)
			if err != nil {
				return err
			}
			pool, err := a.openPool(cmd.Context(), 1)
			if err != nil {
				return err
			}
			defer pool.Close()
			res, err := auditEvent(cmd.Context(), pool, a.cfg.Postgres.Schema, a.cfg.Handlers, id)
			if err != nil {
				return err
			}
			enc := json.NewEncoder(cmd.OutOrStdout())
			enc.SetIndent("", "  ")
			return enc.Encode(res)
		},
	}
}
