package sink

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Migrate creates or upgrades sink's tables (processed_events, sink_offsets,
// dead_letters) in schema, creating the schema if needed. It is idempotent
// and safe to run from several processes at once.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	return ApplyMigrations(ctx, pool, schema, "sink", migrations, "migrations")
}

// ApplyMigrations applies, in name order, every NNNN_name.sql file in the
// folder dir of fsys that schema_migrations does not yet record for
// component. Each file runs in
// its own transaction with search_path set to schema, under an advisory lock
// so that concurrent migrators wait for one another. Packages that own
// tables (sink, the demo handlers, outbox) call it with their own component.
func ApplyMigrations(ctx context.Context, pool *pgxpool.Pool, schema, component string, fsys fs.FS, dir string) error {
	files, err := fs.Glob(fsys, path.Join(dir, "*.sql"))
	if err != nil {
		return fmt.Errorf("migrate %s: %w", component, err)
	}
	slices.Sort(files)
	schemaID := pgx.Identifier{schema}.Sanitize()
	for _, name := range files {
		version, err := strconv.Atoi(strings.SplitN(path.Base(name), "_", 2)[0])
		if err != nil {
			return fmt.Errorf("migrate %s: file %s does not start with a version number", component, name)
		}
		body, err := fs.ReadFile(fsys, name)
		if err != nil {
			return fmt.Errorf("migrate %s: %w", component, err)
		}
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('onceflow.migrate'))`); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+schemaID); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `SET LOCAL search_path TO `+schemaID); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
    component  text        NOT NULL,
    version    integer     NOT NULL,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (component, version))`); err != nil {
				return err
			}
			var done bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM schema_migrations WHERE component = $1 AND version = $2)`,
				component, version).Scan(&done); err != nil {
				return err
			}
			if done {
				return nil
			}
			if _, err := tx.Exec(ctx, string(body)); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO schema_migrations (component, version, name) VALUES ($1, $2, $3)`,
				component, version, name)
			return err
		})
		if err != nil {
			return fmt.Errorf("migrate %s %s in schema %s: %w", component, name, schema, err)
		}
	}
	return nil
}
