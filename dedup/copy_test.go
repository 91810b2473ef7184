package dedup_test

import (
	"bytes"
	"slices"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/dedup"
	"github.com/onceflow/onceflow/sink/sinktest"
)

// hiddenConn is a transaction without its Conn method: Claim then COPYs
// through pgx's CopyFrom, not its own encoding.
type hiddenConn struct{ dedup.Querier }

// A claim's COPY encodes its rows itself on a pgx transaction; each column
// must come out as pgx's CopyFrom writes it, NULLs included.
func TestClaimCopyWritesEveryColumn(t *testing.T) {
	pool := sinktest.Pool(t)
	schema := sinktest.Schema(t, pool)
	ctx := t.Context()
	type row struct {
		id      uuid.UUID
		handler string
		bus     string
		trace   *string
		digest  []byte
		slice   int32
	}
	claim := func(q func(pgx.Tx) dedup.Querier, traceID string, keys []dedup.Key, ds []dedup.Digest) []row {
		t.Helper()
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			c, err := dedup.LookupClaim(ctx, q(tx), schema, "kafka-é", traceID, keys, ds)
			if err == nil && slices.Contains(c.Claimed, false) {
				t.Errorf("claimed %v of new keys", c.Claimed)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		ids := make([]uuid.UUID, len(keys))
		for i, k := range keys {
			ids[i] = k.EventID
		}
		rows, err := pool.Query(ctx, `SELECT event_id, handler, bus, trace_id, payload_digest, slice FROM `+
			pgx.Identifier{schema, "processed_events"}.Sanitize()+` WHERE event_id = ANY($1) ORDER BY event_id, handler`, ids)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
			var x row
			err := r.Scan(&x.id, &x.handler, &x.bus, &x.trace, &x.digest, &x.slice)
			return x, err
		})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	keysOf := func() ([]dedup.Key, []dedup.Digest) {
		id := uuid.New()
		return []dedup.Key{{EventID: id, Handler: "a"}, {EventID: id, Handler: "handler-ü"}},
			[]dedup.Digest{dedup.PayloadDigest([]byte(`{"x":1}`)), {}}
	}
	direct := func(tx pgx.Tx) dedup.Querier { return tx }
	viaPgx := func(tx pgx.Tx) dedup.Querier { return hiddenConn{tx} }
	for _, traceID := range []string{"", "4bf92f3577b34da6a3ce929d0e0e4736"} {
		ks, ds := keysOf()
		own := claim(direct, traceID, ks, ds)
		ks2, _ := keysOf()
		pgxs := claim(viaPgx, traceID, ks2, ds)
		if len(own) != 2 || len(pgxs) != 2 {
			t.Fatalf("trace %q: %d and %d rows, want 2 and 2", traceID, len(own), len(pgxs))
		}
		for i := range own {
			a, b := own[i], pgxs[i]
			same := a.handler == b.handler && a.bus == b.bus && a.slice == b.slice && bytes.Equal(a.digest, b.digest) &&
				(a.digest == nil) == (b.digest == nil) && (a.trace == nil) == (b.trace == nil) &&
				(a.trace == nil || *a.trace == *b.trace)
			if !same || a.id != ks[0].EventID || b.id != ks2[0].EventID {
				t.Errorf("trace %q: the claim's own COPY wrote %+v, pgx's CopyFrom %+v", traceID, a, b)
			}
		}
		if own[0].digest == nil || own[1].digest != nil || (traceID == "") != (own[0].trace == nil) {
			t.Errorf("trace %q: digests %x, %x and trace %v: want one digest, one NULL, and the trace id", traceID, own[0].digest, own[1].digest, own[0].trace)
		}
	}
}
