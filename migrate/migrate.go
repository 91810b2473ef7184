package migrate

import (
	"context"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Func migrates one component's tables in schema; sink.Migrate,
// outbox.Migrate and orders.Migrate are Funcs.
type Func func(ctx context.Context, pool *pgxpool.Pool, schema string) error

// Apply applies, in name order, every NNNN_name.sql file in the folder dir
// of fsys that schema_migrations does not yet record for component,
// creating schema if needed. Each file runs in its own transaction with
// search_path set to schema, under an advisory lock of schema (Hold) so
// that concurrent migrators of it wait for one another. It is idempotent. The error names the
// component, the file and the schema.
func Apply(ctx context.Context, pool *pgxpool.Pool, schema, component string, fsys fs.FS, dir string) error {
	files, err := fs.Glob(fsys, path.Join(dir, "*.sql"))
	if err != nil {
		return fmt.Errorf("migrate %s: %w", component, err)
	}
	slices.Sort(files)
	for _, name := range files {
		version, err := strconv.Atoi(strings.SplitN(path.Base(name), "_", 2)[0])
		if err != nil {
			return fmt.Errorf("migrate %s: file %s does not start with a version number", component, name)
		}
		body, err := fs.ReadFile(fsys, name)
		if err != nil {
			return fmt.Errorf("migrate %s: %w", component, err)
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			return applyFile(ctx, tx, schema, component, version, name, string(body))
		}); err != nil {
			return fmt.Errorf("migrate %s %s in schema %s: %w", component, name, schema, err)
		}
	}
	return nil
}

// Hold takes, for the rest of tx, the lock migrations of schema take:
// migrations of one schema run one at a time; those of other schemas do
// not wait for them.
func Hold(ctx context.Context, tx pgx.Tx, schema string) error {
	_, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('onceflow.migrate/' || $1))`, schema)
	return err
}

// applyFile runs one migration in tx unless schema_migrations records it.
func applyFile(ctx context.Context, tx pgx.Tx, schema, component string, version int, name, body string) error {
	if err := Hold(ctx, tx, schema); err != nil {
		return err
	}
	schemaID := pgx.Identifier{schema}.Sanitize()
	for _, stmt := range []string{
		`CREATE SCHEMA IF NOT EXISTS ` + schemaID,
		`SET LOCAL search_path TO ` + schemaID,
		`CREATE TABLE IF NOT EXISTS schema_migrations (
    component  text        NOT NULL,
    version    integer     NOT NULL,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (component, version))`,
	} {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return err
		}
	}
	var done bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM schema_migrations WHERE component = $1 AND version = $2)`,
		component, version).Scan(&done); err != nil {
		return err
	}
	if done {
		return nil
	}
	if _, err := tx.Exec(ctx, body); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `INSERT INTO schema_migrations (component, version, name) VALUES ($1, $2, $3)`,
		component, version, name)
	return err
}
