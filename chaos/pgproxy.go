package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
)

// The Postgres wire-protocol messages the cut toxic looks for. pgx sends
// BEGIN and COMMIT as simple queries; the server answers a COMMIT that
// committed with the CommandComplete tag COMMIT (one that rolled back
// answers ROLLBACK).
var (
	msgBegin     = []byte("Q\x00\x00\x00\x0abegin\x00")
	msgCommit    = []byte("Q\x00\x00\x00\x0bcommit\x00")
	msgCommitted = []byte("C\x00\x00\x00\x0bCOMMIT\x00")
)

// cutToxic is a toxiproxy toxic that severs connections at chosen points
// of the Postgres protocol, at most Budget of them while it is installed:
//
//   - midtx (upstream): after a BEGIN, let Skip writes of the client
//     through (a statement is one or two: prepare, execute), then drop the
//     next one and cut: it never reaches Postgres, which rolls the
//     transaction back;
//   - before (upstream): drop COMMIT and cut: Postgres rolls back, the
//     member cannot know whether it committed;
//   - after (downstream): Postgres committed; drop its reply and cut: the
//     member cannot know that it did;
//   - all (upstream): cut every connection at once, wherever it is.
//
// One instance serves every connection of the proxy (toxiproxy creates it
// once per toxic), so the budget and counters are shared and atomic.
type cutToxic struct {
	Mode   string `json:"mode"`
	Budget int64  `json:"budget"`
	Skip   int    `json:"skip"`

	cuts atomic.Int64 // connections severed
}

// cutState is one connection's progress through a transaction.
type cutState struct {
	inTx bool
	seen int // client writes of the current transaction passed through
}

func (t *cutToxic) NewState() any { return new(cutState) }

// take spends one unit of the budget, if any is left.
func (t *cutToxic) take() bool {
	if t.cuts.Add(1) <= t.Budget {
		return true
	}
	t.cuts.Add(-1)
	return false
}

func (t *cutToxic) Pipe(stub *toxics.ToxicStub) {
	st := stub.State.(*cutState)
	if t.Mode == cutAll && t.take() {
		t.sever(stub)
		return
	}
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
			if t.hit(st, c.Data) && t.take() {
				t.sever(stub) // c is dropped
				return
			}
			stub.Output <- c
		}
	}
}

// hit reports whether the chunk data is where this toxic cuts.
func (t *cutToxic) hit(st *cutState, data []byte) bool {
	switch t.Mode {
	case cutBefore:
		return bytes.Contains(data, msgCommit)
	case cutAfter:
		return bytes.Contains(data, msgCommitted)
	case cutMidTx:
		switch {
		case bytes.Contains(data, msgBegin):
			st.inTx, st.seen = true, 0
		case bytes.Contains(data, msgCommit):
			st.inTx = false
		case st.inTx:
			if st.seen >= t.Skip {
				return true
			}
			st.seen++
		}
	}
	return false
}

// sever closes the link: toxiproxy then closes both of its sockets. What
// still arrives from the previous toxic is read and dropped until that
// one closes too, so that no goroutine of the link stays blocked.
func (t *cutToxic) sever(stub *toxics.ToxicStub) {
	stub.Close()
	go func() {
		for c := range stub.Input {
			_ = c
		}
	}()
}

func init() { toxics.Register("chaos_cut", new(cutToxic)) }

// pgProxy is a toxiproxy proxy between the members and Postgres, run in
// this process. Its methods are safe for concurrent use.
type pgProxy struct {
	proxy *toxiproxy.Proxy
	seq   atomic.Int64
}

// startProxy listens on listen and forwards to upstream. The caller stops
// it with stop.
func startProxy(listen, upstream string) (*pgProxy, error) {
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "postgres", listen, upstream)
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("toxiproxy on %s: %w", listen, err)
	}
	return &pgProxy{proxy: p}, nil
}

func (p *pgProxy) stop() { p.proxy.Stop() }

// addr is the address the proxy listens on.
func (p *pgProxy) addr() string { return p.proxy.Listen }

// cut installs a cut toxic in mode for up to window, or until it has cut n
// connections, and returns how many it cut.
func (p *pgProxy) cut(ctx context.Context, mode string, n, skip int, window time.Duration) (int, error) {
	t, remove, err := p.install(mode, n, skip)
	if err != nil {
		return 0, err
	}
	if mode != cutAll {
		deadline := time.NewTimer(window)
		tick := time.NewTicker(10 * time.Millisecond)
	wait:
		for t.cuts.Load() < int64(n) {
			select {
			case <-ctx.Done():
				break wait
			case <-deadline.C:
				break wait
			case <-tick.C:
			}
		}
		deadline.Stop()
		tick.Stop()
	}
	err = remove()
	return int(t.cuts.Load()), err
}

// install adds a cut toxic to every connection, present and future, and
// returns it with the function that removes it.
func (p *pgProxy) install(mode string, n, skip int) (*cutToxic, func() error, error) {
	name := fmt.Sprintf("cut-%d", p.seq.Add(1))
	dir := "upstream"
	if mode == cutAfter {
		dir = "downstream"
	}
	spec, err := json.Marshal(map[string]any{"name": name, "type": "chaos_cut", "stream": dir, "toxicity": 1.0,
		"attributes": map[string]any{"mode": mode, "budget": n, "skip": skip}})
	if err != nil {
		return nil, nil, err
	}
	w, err := p.proxy.Toxics.AddToxicJson(bytes.NewReader(spec))
	if err != nil {
		return nil, nil, fmt.Errorf("add toxic %s: %w", name, err)
	}
	remove := func() error {
		if err := p.proxy.Toxics.RemoveToxic(context.Background(), name); err != nil {
			return fmt.Errorf("remove toxic %s: %w", name, err)
		}
		return nil
	}
	return w.Toxic.(*cutToxic), remove, nil
}

// terminateBackends calls pg_terminate_backend, straight on Postgres, on up
// to n backends of the members (application_name starting with prefix)
// caught idle inside a transaction or running COMMIT, watching for up to
// window. It returns how many it terminated, and how many of those were
// running COMMIT.
func terminateBackends(ctx context.Context, pool *pgxpool.Pool, prefix string, n int, window time.Duration) (killed, onCommit int, err error) {
	deadline := time.Now().Add(window)
	for killed < n && time.Now().Before(deadline) && ctx.Err() == nil {
		var pid int32
		var state, query string
		err := pool.QueryRow(ctx, `SELECT pid, state, query FROM pg_stat_activity
WHERE backend_type = 'client backend' AND application_name LIKE $1
  AND (state = 'idle in transaction' OR (state = 'active' AND query ILIKE 'commit%'))
ORDER BY random() LIMIT 1`, prefix+"%").Scan(&pid, &state, &query)
		if err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				time.Sleep(2 * time.Millisecond)
				continue
			}
			return killed, onCommit, fmt.Errorf("find backends: %w", err)
		}
		var ok bool
		if err := pool.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&ok); err != nil {
			return killed, onCommit, fmt.Errorf("pg_terminate_backend(%d): %w", pid, err)
		}
		if ok {
			killed++
			if state == "active" {
				onCommit++
			}
		}
	}
	return killed, onCommit, nil
}

var _ toxics.StatefulToxic = (*cutToxic)(nil)

// addLatency adds d to every chunk in both directions of every
// connection, present and future (toxiproxy's latency toxic), until the
// returned function removes it.
func (p *pgProxy) addLatency(d time.Duration) (func() error, error) {
	var names []string
	remove := func() error {
		var errs []error
		for _, name := range names {
			if err := p.proxy.Toxics.RemoveToxic(context.Background(), name); err != nil {
				errs = append(errs, fmt.Errorf("remove toxic %s: %w", name, err))
			}
		}
		return errors.Join(errs...)
	}
	for _, dir := range []string{"upstream", "downstream"} {
		name := fmt.Sprintf("latency-%d", p.seq.Add(1))
		spec, err := json.Marshal(map[string]any{"name": name, "type": "latency", "stream": dir, "toxicity": 1.0,
			"attributes": map[string]any{"latency": d.Milliseconds(), "jitter": 0}})
		if err == nil {
			_, err = p.proxy.Toxics.AddToxicJson(bytes.NewReader(spec))
		}
		if err != nil {
			return nil, errors.Join(fmt.Errorf("add toxic %s: %w", name, err), remove())
		}
		names = append(names, name)
	}
	return remove, nil
}
