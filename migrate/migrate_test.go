package migrate_test

import (
	"context"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/onceflow/onceflow/migrate"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// Apply runs each file once, in version order, and records it; a second
// run applies nothing, and a file added later is applied alone.
func TestApplyOnceInOrder(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool)
	ctx := t.Context()
	fsys := fstest.MapFS{
		"m/0002_fill.sql":  {Data: []byte(`INSERT INTO things (n) VALUES (1);`)},
		"m/0001_table.sql": {Data: []byte(`CREATE TABLE things (n int);`)},
	}
	for range 2 {
		if err := migrate.Apply(ctx, pool, schema, "test", fsys, "m"); err != nil {
			t.Fatal(err)
		}
	}
	if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.things`); n != 1 {
		t.Errorf("things has %d rows after two runs, want 1 (each file once)", n)
	}
	fsys["m/0003_more.sql"] = &fstest.MapFile{Data: []byte(`INSERT INTO things (n) VALUES (3);`)}
	if err := migrate.Apply(ctx, pool, schema, "test", fsys, "m"); err != nil {
		t.Fatal(err)
	}
	if n := sinktest.Count(t, pool, `SELECT count(*) FROM `+schema+`.schema_migrations WHERE component = 'test'`); n != 3 {
		t.Errorf("schema_migrations records %d versions, want 3", n)
	}
	if n := sinktest.Count(t, pool, `SELECT sum(n)::bigint FROM `+schema+`.things`); n != 4 {
		t.Errorf("sum(n) = %d, want 4 (1 and 3)", n)
	}
}

func TestApplyErrors(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool)
	for _, tc := range []struct {
		name string
		fsys fstest.MapFS
		want string
	}{
		{"no version", fstest.MapFS{"m/table.sql": {Data: []byte(`SELECT 1`)}}, "does not start with a version number"},
		{"bad sql", fstest.MapFS{"m/0001_bad.sql": {Data: []byte(`CREATE TABLE (`)}}, "migrate test m/0001_bad.sql in schema " + schema},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := migrate.Apply(context.Background(), pool, schema, "test", tc.fsys, "m")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want it to say %q", err, tc.want)
			}
		})
	}
}

// A migration of one schema never waits for another schema's: onceflow
// deployments in two schemas of one database migrate on their own (a
// member migrating over a slow link held one lock for every schema, and a
// migration elsewhere timed out behind it). Two migrations of one schema
// still wait for each other.
func TestApplyWaitsOnlyForItsSchema(t *testing.T) {
	pool := sinktest.Pool(t)
	busy, other := sinktest.Schema(t, pool), sinktest.Schema(t, pool)
	fsys := fstest.MapFS{"m/0001_table.sql": {Data: []byte(`CREATE TABLE things (n int);`)}}
	// A migration of busy holds the lock from here on, as a slow one would.
	held, err := pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Rollback(context.Background()) //nolint:errcheck
	if err := migrate.Hold(t.Context(), held, busy); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := migrate.Apply(ctx, pool, other, "test", fsys, "m"); err != nil {
		t.Fatalf("migrating %s while %s's migration runs: %v", other, busy, err)
	}
	short, cancelShort := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancelShort()
	if err := migrate.Apply(short, pool, busy, "test", fsys, "m"); err == nil {
		t.Errorf("a second migration of %s did not wait for the one running", busy)
	}
}
