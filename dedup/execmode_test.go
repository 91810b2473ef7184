package dedup_test

import (
	"encoding/hex"
	"slices"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// Claims, look-ups and unclaims work whatever query exec mode the user's
// DSN sets (default_query_exec_mode): a pool behind a transaction pooler
// is configured with simple_protocol or exec.
func TestClaimExecModes(t *testing.T) {
	base := sinktest.Pool(t)
	schema := sinktest.Schema(t, base)
	table := pgx.Identifier{schema, "processed_events"}.Sanitize()
	for _, mode := range []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			ctx := t.Context()
			pool := sinktest.ModePool(t, mode)
			x := dedup.Key{EventID: uuid.New(), Handler: "a"}
			y := dedup.Key{EventID: uuid.New(), Handler: "a"}
			d := dedup.PayloadDigest([]byte(mode))
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if got, err := dedup.Claim(ctx, tx, schema, "kafka", "0af7651916cd43dd8448eb211c80319c", []dedup.Key{x}, []dedup.Digest{d}); err != nil || !got[0] {
					t.Errorf("claim x: %v, %v", got, err)
					return err
				}
				// x present: the COPY conflicts, the look-up and the second COPY run.
				c, err := dedup.LookupClaim(ctx, tx, schema, "kafka", "", []dedup.Key{y, x}, []dedup.Digest{d, d})
				if err != nil {
					t.Errorf("lookup claim: %v", err)
					return err
				}
				if !c.Claimed[0] || c.Claimed[1] || !c.Found[1] || c.Stored[1] != d {
					t.Errorf("lookup claim of y, x: %+v", c)
				}
				// z new, y claimed just now, x before: the insert's parameters and
				// RETURNING rows; y and x present, so the claim is contended.
				z := dedup.Key{EventID: uuid.New(), Handler: "a"}
				w := dedup.Key{EventID: uuid.New(), Handler: "wide handler ü"}
				c, err = dedup.InsertClaim(ctx, tx, schema, "kafka", "0af7651916cd43dd8448eb211c80319c", []dedup.Key{z, y, x, z, w}, []dedup.Digest{d, {}, {}, d, {}})
				if err != nil {
					t.Errorf("insert claim: %v", err)
					return err
				}
				if !c.Claimed[0] || c.Claimed[1] || c.Claimed[2] || c.Claimed[3] || !c.Claimed[4] || c.Found[1] || c.Found[2] || !c.Contended {
					t.Errorf("insert claim of z, y, x, z, w: %+v", c)
				}
				// What the insert stored: its parameters, a NULL digest among them.
				var stored []string
				rows, err := tx.Query(ctx, `SELECT handler || ' ' || bus || ' ' || coalesce(trace_id, '-') || ' ' || coalesce(encode(payload_digest, 'hex'), 'NULL') || ' ' || slice
FROM `+table+` WHERE event_id = ANY($1::uuid[]) ORDER BY handler`, []string{z.EventID.String(), w.EventID.String()})
				if err == nil {
					stored, err = pgx.CollectRows(rows, pgx.RowTo[string])
				}
				want := []string{"a kafka 0af7651916cd43dd8448eb211c80319c " + hex.EncodeToString(d[:]) + " 0", "wide handler ü kafka 0af7651916cd43dd8448eb211c80319c NULL 0"}
				if err != nil || !slices.Equal(stored, want) {
					t.Errorf("stored by the insert: %q, %v; want %q", stored, err, want)
				}
				got, err := dedup.Claim(ctx, tx, schema, "kafka", "", []dedup.Key{y, x}, nil)
				if err != nil || got[0] || got[1] {
					t.Errorf("claim y, x again: %v, %v", got, err)
				}
				if err := dedup.Unclaim(ctx, tx, table, []dedup.Key{y}); err != nil {
					t.Errorf("unclaim: %v", err)
					return err
				}
				found, _, err := dedup.Lookup(ctx, tx, table, []dedup.Key{x, y})
				if err != nil || !found[0] || found[1] {
					t.Errorf("lookup after unclaim: %v, %v", found, err)
				}
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}
