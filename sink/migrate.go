package sink

import (
	"context"
	"embed"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/migrate"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Migrate creates or upgrades sink's tables (processed_events, sink_offsets,
// dead_letters) in schema, creating the schema if needed. It is idempotent
// and safe to run from several processes at once.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	return migrate.Apply(ctx, pool, schema, "sink", migrations, "migrations")
}
