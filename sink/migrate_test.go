package sink_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
	"testing/fstest"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/migrate"
	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// A schema from before retention (processed_events a plain table) is
// upgraded in place: its rows become slice 0, keep deduplicating, and the
// table can then be rotated and dropped like a new one.
func TestMigrateToSlices(t *testing.T) {
	pool := sinktest.Pool(t)
	ctx := t.Context()
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "test_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	})

	// The migrations before 0005, as an older onceflow applied them.
	old := fstest.MapFS{}
	for _, name := range []string{"0001_core.sql", "0002_epochs_and_dead_letter_relay.sql",
		"0003_payload_digest_and_replays.sql", "0004_topic_ids.sql"} {
		body, err := os.ReadFile(filepath.Join("migrations", name))
		if err != nil {
			t.Fatal(err)
		}
		old["migrations/"+name] = &fstest.MapFile{Data: body}
	}
	if err := migrate.Apply(ctx, pool, schema, "sink", old, "migrations"); err != nil {
		t.Fatal(err)
	}
	processed := pgx.Identifier{schema, "processed_events"}.Sanitize()
	kept := uuid.New()
	if _, err := pool.Exec(ctx, `INSERT INTO `+processed+` (event_id, handler, bus, processed_at)
VALUES ($1, 'emailHandler', 'kafka', now() - interval '3 days')`, kept); err != nil {
		t.Fatal(err)
	}

	// A writer role's privileges (PUBLIC here: tests cannot create roles).
	if _, err := pool.Exec(ctx, `GRANT SELECT, INSERT, DELETE ON `+processed+` TO PUBLIC`); err != nil {
		t.Fatal(err)
	}

	if err := sink.Migrate(ctx, pool, schema); err != nil {
		t.Fatalf("upgrade: %v", err)
	}
	granted := func(table, privilege string) bool {
		t.Helper()
		var ok bool
		if err := pool.QueryRow(ctx, `SELECT has_table_privilege('public', $1, $2)`,
			pgx.Identifier{schema, table}.Sanitize(), privilege).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	for _, p := range []struct{ table, privilege string }{
		{"processed_events", "INSERT"}, {"processed_events", "SELECT"}, {"processed_events", "DELETE"},
		{"processed_events_slices", "SELECT"},
	} {
		if !granted(p.table, p.privilege) {
			t.Errorf("after the upgrade, %s is not granted on %s as it was on the old table", p.privilege, p.table)
		}
	}
	var kind string
	if err := pool.QueryRow(ctx, `SELECT c.relkind::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = 'processed_events'`, schema).Scan(&kind); err != nil || kind != "p" {
		t.Fatalf("processed_events relkind = %q, %v; want p (partitioned)", kind, err)
	}
	var started time.Time
	if err := pool.QueryRow(ctx, `SELECT started_at FROM `+pgx.Identifier{schema, "processed_events_slices"}.Sanitize()+
		` WHERE slice = 0`).Scan(&started); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(started); d < 71*time.Hour || d > 73*time.Hour {
		t.Errorf("slice 0 started %v ago, want the oldest row's time (3 days)", d)
	}

	claim := func(k dedup.Key) bool {
		var got []bool
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			got, err = dedup.Claim(ctx, tx, schema, "kafka", "", []dedup.Key{k}, nil)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return got[0]
	}
	if claim(dedup.Key{EventID: kept, Handler: "emailHandler"}) {
		t.Fatal("a row from before the upgrade was claimed again")
	}
	// Rotated with a horizon of a week: the old row stays a duplicate.
	r := dedup.Retention{Pool: pool, Schema: schema, Horizon: 7 * 24 * time.Hour, Slices: 7}
	if res, err := r.Step(ctx); err != nil || !res.Rotated || len(res.Dropped) != 0 {
		t.Fatalf("step = %+v, %v; want a rotation (slice 0 is older than a day), nothing dropped", res, err)
	}
	if claim(dedup.Key{EventID: kept, Handler: "emailHandler"}) {
		t.Fatal("a row from before the upgrade was claimed again after a rotation")
	}
	if !granted("processed_events_s1", "INSERT") || !granted("processed_events_s1", "SELECT") {
		t.Error("the new slice lacks the privileges granted on processed_events: a writer role could not claim into it")
	}
	if !claim(dedup.Key{EventID: uuid.New(), Handler: "emailHandler"}) {
		t.Fatal("a new key was not claimed after the upgrade")
	}
	// Migrating again changes nothing.
	if err := sink.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
}
