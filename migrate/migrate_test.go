package migrate_test

import (
	"context"
	"strings"
	"testing"
	"testing/fstest"

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
