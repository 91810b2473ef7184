// Command ceiling is an independent writer of the effects of the demo's
// emailHandler with their dedup rows: for each of -events unique events,
// one processed_events row and one emails_sent row, by binary COPY,
// -batch events per transaction, on -conns connections, nothing else.
// It shares no code with onceflow (only pgx), so that it can tell whether
// the benchmark's raw-copy baseline is the fastest writer of those rows:
// run both on one cluster minutes apart, alternating, and compare medians.
//
//	go run ./benchmarks/ceiling -dsn "$ONCEFLOW_TEST_POSTGRES_DSN" -events 1000000 -rounds 3
//
// It works in a schema of its own (ceiling_<random>), created with the
// tables and dropped at the end of each round, and starts each round after
// a CHECKPOINT (when the role may run one). Its variants measure the
// levers of a dedup row's width and of its key without touching onceflow:
//
//	-layout seed       processed_events as in the seed: (event_id, handler text,
//	                   bus, processed_at), PRIMARY KEY (event_id, handler)
//	-layout onceflow   onceflow's: partitioned by slice, trace_id, payload_digest,
//	                   the slice in the key; written into the slice (-parent: the parent)
//	-layout narrow     (event_id, handler smallint), PRIMARY KEY (event_id, handler):
//	                   no bus, no processed_at
//	-layout none       no processed_events: the effects alone (emails_sent and its
//	                   event_id index), what a drain costs without any dedup row
//	-slice-events N    with -layout onceflow: a new slice every N events, each batch
//	                   written into its slice after a look-up of its ids in the older
//	                   ones (a slice is analyzed when the next one starts), as a claim
//	                   does with retention's older slices
//	-ids v4|v7         random or time-ordered event ids
//	-handlers N        N processed_events rows per event (one emails_sent row still)
//	-lookup            before the COPY, look the batch's event ids up in processed_events
//	                   (SELECT event_id, handler, payload_digest … WHERE event_id = ANY($1)),
//	                   as a claim does to find redeliveries; the table is analyzed at 90 000
//	                   events, as onceflow's Writer does
//	-savepoint         COPY the dedup rows under a savepoint, released after, as a claim does
//	-insert            write the dedup rows with INSERT … SELECT FROM unnest(…) ON CONFLICT DO
//	                   NOTHING RETURNING, the look-up and the write in one statement, not COPY
//	                   (with -lookup: after the look-up, as onceflow's claims did before
//	                   InsertClaim)
//	-duplicates F      with -insert: F redeliveries per event (0.3: 3 in 10), each of an event
//	                   written a few batches before, among each batch's -batch records, as
//	                   onceflow's bench streams them; the insert skips them, their stored
//	                   digests are read (one SELECT, as a claim reads them for its conflict
//	                   check) and only the events inserted get an email
//	-every N           also print the rate over each N events committed (the first N, the
//	                   next N, …): whether the writer holds its rate as the tables grow, as a
//	                   drain of a backlog asks of onceflow
//
// It prints one line per round and the median, in events/s, with the CPU
// time each event cost this process and its Postgres backends (read from
// /proc, when Postgres runs on this machine and its processes are
// readable): on a machine whose cores are shared with other work, the CPU
// per event is the steadier figure, and on a machine where Go and Postgres
// share the cores, cores ÷ CPU per event bounds the rate.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"math/big"
	mrand "math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

type options struct {
	dsn       string
	events    int
	batch     int
	conns     int
	rounds    int
	layout    string
	ids       string
	handlers  int
	parent    bool
	keep      bool
	lookup    bool
	savepoint bool
	insert    bool
	every     int
	dups      float64
	sliceEv   int
}

func main() {
	var o options
	flag.StringVar(&o.dsn, "dsn", os.Getenv("ONCEFLOW_TEST_POSTGRES_DSN"), "PostgreSQL DSN (default $ONCEFLOW_TEST_POSTGRES_DSN)")
	flag.IntVar(&o.events, "events", 1_000_000, "unique events to write")
	flag.IntVar(&o.batch, "batch", 1000, "events per transaction")
	flag.IntVar(&o.conns, "conns", 2, "connections writing at once")
	flag.IntVar(&o.rounds, "rounds", 1, "rounds, each in a new schema; the median is reported")
	flag.StringVar(&o.layout, "layout", "seed", "processed_events layout: seed, onceflow or narrow; none writes only the effects")
	flag.StringVar(&o.ids, "ids", "v4", "event ids: v4 (random) or v7 (time-ordered)")
	flag.IntVar(&o.handlers, "handlers", 1, "processed_events rows per event (handlers)")
	flag.BoolVar(&o.parent, "parent", false, "with -layout onceflow: COPY into the partitioned parent, not the slice")
	flag.BoolVar(&o.keep, "keep", false, "keep each round's schema")
	flag.BoolVar(&o.lookup, "lookup", false, "look the batch's event ids up in processed_events before the COPY")
	flag.BoolVar(&o.savepoint, "savepoint", false, "COPY the dedup rows under a savepoint, released after")
	flag.BoolVar(&o.insert, "insert", false, "write the dedup rows by INSERT … ON CONFLICT DO NOTHING RETURNING, not COPY")
	flag.Float64Var(&o.dups, "duplicates", 0, "with -insert: redeliveries per event, 0 to 1")
	flag.IntVar(&o.every, "every", 0, "also print the rate over each this many events committed (0: not)")
	flag.IntVar(&o.sliceEv, "slice-events", 0, "with -layout onceflow: a new slice every this many events, the older ones looked up first (0: one slice)")
	flag.Parse()
	if err := run(context.Background(), o); err != nil {
		fmt.Fprintln(os.Stderr, "ceiling:", err)
		os.Exit(1)
	}
}

func (o options) validate() error {
	var errs []error
	if o.dsn == "" {
		errs = append(errs, errors.New("-dsn: required (or $ONCEFLOW_TEST_POSTGRES_DSN)"))
	}
	if o.events < 1 || o.batch < 1 || o.conns < 1 || o.rounds < 1 || o.handlers < 1 || o.handlers > 4 {
		errs = append(errs, errors.New("-events, -batch, -conns and -rounds: at least 1; -handlers: 1 to 4"))
	}
	if !(o.dups >= 0 && o.dups <= 1) || (o.dups > 0 && !o.insert) {
		errs = append(errs, errors.New("-duplicates: 0 to 1, with -insert"))
	}
	if o.every < 0 || (o.every > 0 && (o.every < o.batch || o.every > o.events)) {
		errs = append(errs, errors.New("-every: 0, or from -batch to -events"))
	}
	switch o.layout {
	case "seed", "onceflow", "narrow", "none":
	default:
		errs = append(errs, fmt.Errorf("-layout %q: seed, onceflow, narrow or none", o.layout))
	}
	if o.sliceEv < 0 || (o.sliceEv > 0 && (o.layout != "onceflow" || o.parent || o.insert || o.lookup || o.sliceEv%o.batch != 0)) {
		errs = append(errs, errors.New("-slice-events: with -layout onceflow, without -parent, -insert or -lookup, a multiple of -batch"))
	}
	if o.layout == "none" && (o.lookup || o.savepoint || o.insert || o.parent) {
		errs = append(errs, errors.New("-layout none: without -lookup, -savepoint, -insert or -parent"))
	}
	if o.ids != "v4" && o.ids != "v7" {
		errs = append(errs, fmt.Errorf("-ids %q: v4 or v7", o.ids))
	}
	if o.insert && (o.savepoint || o.handlers != 1) {
		errs = append(errs, errors.New("-insert: without -savepoint, and with one handler"))
	}
	if o.parent && o.layout != "onceflow" {
		errs = append(errs, errors.New("-parent: only with -layout onceflow"))
	}
	return errors.Join(errs...)
}

var handlerNames = []string{"emailHandler", "inventoryHandler", "analyticsHandler", "recommenderHandler"}

func run(ctx context.Context, o options) error {
	if err := o.validate(); err != nil {
		return err
	}
	cfg, err := pgxpool.ParseConfig(o.dsn)
	if err != nil {
		return fmt.Errorf("parse dsn: %w", err)
	}
	cfg.MaxConns = int32(o.conns)
	cfg.MinConns = int32(o.conns)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()
	fmt.Printf("ceiling: %d events, %d per transaction, %d connections, layout %s, ids %s, %d handler(s)%s%s%s%s%s\n",
		o.events, o.batch, o.conns, o.layout, o.ids, o.handlers, map[bool]string{true: ", into the parent"}[o.parent],
		map[bool]string{true: ", look-up first"}[o.lookup], map[bool]string{true: ", under a savepoint"}[o.savepoint],
		map[bool]string{true: ", by insert"}[o.insert], map[bool]string{true: fmt.Sprintf(", %g redeliveries per event", o.dups)}[o.dups > 0])
	var rates, gos, pgs []float64
	for r := 1; r <= o.rounds; r++ {
		rate, cpu, err := round(ctx, pool, o)
		if err != nil {
			return fmt.Errorf("round %d: %w", r, err)
		}
		fmt.Printf("round %d: %.0f events/s, CPU µs/event: go %.2f, postgres %s\n", r, rate, cpu.goPerEvent, cpu.pg())
		rates, gos, pgs = append(rates, rate), append(gos, cpu.goPerEvent), append(pgs, cpu.pgPerEvent)
	}
	fmt.Printf("median: %.0f events/s, CPU µs/event: go %.2f, postgres %.2f\n", median(rates), median(gos), median(pgs))
	return nil
}

func median(xs []float64) float64 {
	xs = slices.Clone(xs)
	slices.Sort(xs)
	return xs[len(xs)/2]
}

// cpuUse is the CPU time per event of this process and of the pool's
// Postgres backends (negative when unknown).
type cpuUse struct{ goPerEvent, pgPerEvent float64 }

func (c cpuUse) pg() string {
	if c.pgPerEvent < 0 {
		return "unknown"
	}
	return fmt.Sprintf("%.2f", c.pgPerEvent)
}

// processCPU is this process's user and system time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// backendsCPU is the user and system time of the pool's backends, read
// from /proc (false when a backend cannot be read there).
func backendsCPU(ctx context.Context, pool *pgxpool.Pool) (time.Duration, bool) {
	conns := pool.AcquireAllIdle(ctx)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	var total time.Duration
	for _, c := range conns {
		pid := c.Conn().PgConn().PID()
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return 0, false
		}
		// Fields after the command's closing parenthesis: utime and stime
		// are the 14th and 15th of the line, in clock ticks (100 a second).
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) < 13 {
			return 0, false
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		total += time.Duration(u+s) * 10 * time.Millisecond
	}
	return total, true
}

// job is one transaction's events and the slice they go to.
type job struct {
	events []event
	slice  int32
}

type event struct {
	id         pgtype.UUID
	userID     int64
	items      int
	redelivery bool
}

// stream returns evs with o.dups redeliveries per event among them, each
// of an event at least 2·conns+1 batches before it (committed by then,
// as a redelivery found in Postgres is) and within 4096 records more.
func stream(evs []event, o options) []event {
	if o.dups == 0 {
		return evs
	}
	gap := (2*o.conns + 1) * o.batch
	rng := mrand.New(mrand.NewPCG(1, 2))
	recs := make([]event, 0, int(float64(len(evs))*(1+o.dups))+1)
	for _, e := range evs {
		recs = append(recs, e)
		if n := len(recs); n > gap && rng.Float64() < o.dups {
			r := recs[n-gap-rng.IntN(min(4096, n-gap))]
			for r.redelivery { // a redelivery's own event
				r = recs[n-gap-rng.IntN(min(4096, n-gap))]
			}
			r.redelivery = true
			recs = append(recs, r)
		}
	}
	return recs
}

func round(ctx context.Context, pool *pgxpool.Pool, o options) (rate float64, cpu cpuUse, err error) {
	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	schema := "ceiling_" + hex.EncodeToString(suffix[:])
	if err := create(ctx, pool, schema, o.layout); err != nil {
		return 0, cpu, err
	}
	for k := 1; o.sliceEv > 0 && k*o.sliceEv < o.events; k++ {
		s := pgx.Identifier{schema}.Sanitize()
		if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s.processed_events_s%d PARTITION OF %s.processed_events FOR VALUES IN (%d)`, s, k, s, k)); err != nil {
			return 0, cpu, fmt.Errorf("create slice %d: %w", k, err)
		}
	}
	if !o.keep {
		defer func() {
			if _, derr := pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); derr != nil {
				err = errors.Join(err, fmt.Errorf("drop schema: %w", derr))
			}
		}()
	}
	evs := make([]event, o.events)
	for i := range evs {
		var id uuid.UUID
		if o.ids == "v7" {
			id = uuid.Must(uuid.NewV7())
		} else {
			id = uuid.New()
		}
		n, _ := rand.Int(rand.Reader, big.NewInt(100000))
		evs[i] = event{id: pgtype.UUID{Bytes: id, Valid: true}, userID: n.Int64() + 1, items: 2}
	}
	// Not fatal: the role may lack pg_checkpoint.
	_, _ = pool.Exec(ctx, "CHECKPOINT")

	processed := pgx.Identifier{schema, "processed_events"}
	cols := []string{"event_id", "handler", "bus"}
	switch {
	case o.layout == "onceflow" && !o.parent:
		processed = pgx.Identifier{schema, "processed_events_s0"}
		cols = []string{"event_id", "handler", "bus", "trace_id", "payload_digest", "slice"}
	case o.layout == "onceflow":
		cols = []string{"event_id", "handler", "bus", "trace_id", "payload_digest", "slice"}
	case o.layout == "narrow":
		cols = []string{"event_id", "handler"}
	}
	emails := pgx.Identifier{schema, "emails_sent"}
	progress := &windows{every: o.every}
	write := func(ctx context.Context, j job) error {
		b := j.events
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		processed := processed
		if j.slice > 0 {
			processed = pgx.Identifier{schema, fmt.Sprintf("processed_events_s%d", j.slice)}
			ids := make([]pgtype.UUID, len(b))
			for i, e := range b {
				ids[i] = e.id
			}
			rows, err := tx.Query(ctx, `SELECT event_id, handler FROM `+pgx.Identifier{schema, "processed_events"}.Sanitize()+
				` WHERE event_id = ANY($1::uuid[]) AND slice < $2::integer`, ids, j.slice)
			if err != nil {
				return fmt.Errorf("look up older slices: %w", err)
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return fmt.Errorf("look up older slices: %w", err)
			}
		}
		if o.lookup {
			ids := make([]pgtype.UUID, len(b))
			for i, e := range b {
				ids[i] = e.id
			}
			digest := "NULL::bytea"
			if o.layout == "onceflow" {
				digest = "payload_digest"
			}
			rows, err := tx.Query(ctx, `SELECT event_id, handler, `+digest+` FROM `+pgx.Identifier{schema, "processed_events"}.Sanitize()+
				` WHERE event_id = ANY($1::uuid[])`, ids)
			if err != nil {
				return fmt.Errorf("look up processed_events: %w", err)
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return fmt.Errorf("look up processed_events: %w", err)
			}
		}
		if o.savepoint {
			if _, err := tx.Exec(ctx, "SAVEPOINT claim"); err != nil {
				return err
			}
		}
		if o.insert {
			var err error
			if b, err = insertClaims(ctx, tx, processed, pgx.Identifier{schema, "processed_events"}, o.layout, b); err != nil {
				return err
			}
		}
		row := make([]any, len(cols))
		n := len(b) * o.handlers
		if !o.insert && o.layout != "none" {
			if _, err := tx.CopyFrom(ctx, processed, cols, pgx.CopyFromSlice(n, func(i int) ([]any, error) {
				e, h := b[i/o.handlers], i%o.handlers
				row[0] = e.id
				switch o.layout {
				case "narrow":
					row[1] = int16(h)
				case "seed":
					row[1], row[2] = handlerNames[h], "kafka"
				default:
					digest := make([]byte, 16) // as wide as onceflow's digest
					row[1], row[2], row[3], row[4], row[5] = handlerNames[h], "kafka", nil, digest, j.slice
				}
				return row, nil
			})); err != nil {
				return fmt.Errorf("copy processed_events: %w", err)
			}
		}
		if o.savepoint {
			if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT claim"); err != nil {
				return err
			}
		}
		erow := make([]any, 3)
		if _, err := tx.CopyFrom(ctx, emails, []string{"event_id", "user_id", "subject"}, pgx.CopyFromSlice(len(b), func(i int) ([]any, error) {
			erow[0], erow[1], erow[2] = b[i].id, b[i].userID, "Order confirmation: "+strconv.Itoa(b[i].items)+" item(s)"
			return erow, nil
		})); err != nil {
			return fmt.Errorf("copy emails_sent: %w", err)
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		progress.add(len(b))
		return nil
	}
	jobs := make(chan job)
	var wg sync.WaitGroup
	errs := make([]error, o.conns)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var feedErr error
	pg0, pgOK := backendsCPU(ctx, pool)
	go0 := processCPU()
	start := time.Now()
	progress.start = start
	for w := range o.conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range jobs {
				if err := write(ctx, b); err != nil {
					errs[w] = err
					cancel()
					for range jobs {
					}
					return
				}
			}
		}()
	}
	recs := stream(evs, o)
feed:
	for i := 0; i < len(recs); i += o.batch {
		if (o.lookup || o.dups > 0) && i == analyzeAt {
			// As onceflow's Writer does (a table with no statistics has
			// its look-ups planned as scans), and at the same size.
			if _, err := pool.Exec(ctx, "ANALYZE "+pgx.Identifier{schema, "processed_events"}.Sanitize()); err != nil {
				feedErr = fmt.Errorf("analyze: %w", err)
				cancel()
				break feed
			}
		}
		j := job{events: recs[i:min(i+o.batch, len(recs))]}
		if o.sliceEv > 0 {
			j.slice = int32(i / o.sliceEv)
			if i > 0 && i%o.sliceEv == 0 {
				// The slice that ends: analyzed, as a rotation leaves it
				// for the look-ups.
				prev := pgx.Identifier{schema, fmt.Sprintf("processed_events_s%d", j.slice-1)}
				if _, err := pool.Exec(ctx, "ANALYZE "+prev.Sanitize()); err != nil {
					feedErr = fmt.Errorf("analyze: %w", err)
					cancel()
					break feed
				}
			}
		}
		select {
		case jobs <- j:
		case <-ctx.Done():
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	el := time.Since(start)
	goCPU := processCPU() - go0
	pg1, pgOK1 := backendsCPU(ctx, pool)
	if err := errors.Join(append(errs, feedErr)...); err != nil {
		return 0, cpu, err
	}
	n := float64(len(evs))
	cpu = cpuUse{goPerEvent: float64(goCPU.Microseconds()) / n, pgPerEvent: -1}
	if pgOK && pgOK1 {
		cpu.pgPerEvent = float64((pg1 - pg0).Microseconds()) / n
	}
	var got int64
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+emails.Sanitize()).Scan(&got); err != nil {
		return 0, cpu, fmt.Errorf("count emails_sent: %w", err)
	}
	if got != int64(len(evs)) {
		return 0, cpu, fmt.Errorf("emails_sent has %d rows, want %d", got, len(evs))
	}
	progress.print()
	return n / el.Seconds(), cpu, nil
}

// windows times each -every events committed: it keeps when each
// transaction's events were counted committed, and places each window's
// end between the two commits around it, in proportion (a transaction
// commits many events at once, and a window rarely ends on one).
type windows struct {
	every   int
	start   time.Time
	mu      sync.Mutex
	done    int
	commits []commit
}

type commit struct {
	done int           // events committed in all, this transaction's included
	at   time.Duration // since start
}

func (w *windows) add(n int) {
	if w.every == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.done += n
	w.commits = append(w.commits, commit{w.done, time.Since(w.start)})
}

// end returns when the events committed reached n, interpolated between
// the commits around it.
func (w *windows) end(n int) time.Duration {
	i, _ := slices.BinarySearchFunc(w.commits, n, func(c commit, n int) int { return c.done - n })
	prev := commit{}
	if i > 0 {
		prev = w.commits[i-1]
	}
	c := w.commits[i]
	return prev.at + time.Duration(float64(c.at-prev.at)*float64(n-prev.done)/float64(c.done-prev.done))
}

// print writes the rate over each whole window, and the last window over
// the first.
func (w *windows) print() {
	if w.every == 0 {
		return
	}
	var prev time.Duration
	var rates []float64
	for k := 1; k*w.every <= w.done; k++ {
		end := w.end(k * w.every)
		rate := float64(w.every) / (end - prev).Seconds()
		rates = append(rates, rate)
		fmt.Printf("  events %d–%d: %.0f events/s\n", (k-1)*w.every+1, k*w.every, rate)
		prev = end
	}
	if len(rates) > 1 {
		fmt.Printf("  last %d over first %d: %.2f×\n", w.every, w.every, rates[len(rates)-1]/rates[0])
	}
}

// analyzeAt is the records written before a run with -lookup or
// -duplicates analyzes processed_events (it then reads it by event_id):
// three times what ANALYZE samples, as onceflow waits.
const analyzeAt = 90_000

// insertClaims writes b's dedup rows (one handler) by one INSERT … ON
// CONFLICT DO NOTHING RETURNING, reading what it returns.
//
// It returns the events of b it inserted; b's redeliveries (events whose
// keys were present) have their stored digests read, in one SELECT, as a
// claim reads them for its conflict check.
func insertClaims(ctx context.Context, tx pgx.Tx, processed, parent pgx.Identifier, layout string, b []event) ([]event, error) {
	ids := make([]pgtype.UUID, len(b))
	fresh := 0
	for i, e := range b {
		ids[i] = e.id
		if !e.redelivery {
			fresh++
		}
	}
	var q string
	switch layout {
	case "narrow":
		q = `INSERT INTO ` + processed.Sanitize() + ` (event_id, handler) SELECT id, 0 FROM unnest($1::uuid[]) AS id
ON CONFLICT DO NOTHING RETURNING event_id`
	case "seed":
		q = `INSERT INTO ` + processed.Sanitize() + ` (event_id, handler, bus) SELECT id, 'emailHandler', 'kafka' FROM unnest($1::uuid[]) AS id
ON CONFLICT DO NOTHING RETURNING event_id`
	default:
		q = `INSERT INTO ` + processed.Sanitize() + ` (event_id, handler, bus, payload_digest, slice)
SELECT id, 'emailHandler', 'kafka', '\x00112233445566778899aabbccddeeff'::bytea, 0 FROM unnest($1::uuid[]) AS id
ON CONFLICT DO NOTHING RETURNING event_id`
	}
	rows, err := tx.Query(ctx, q, ids)
	if err != nil {
		return nil, fmt.Errorf("insert processed_events: %w", err)
	}
	inserted := make(map[[16]byte]bool, fresh)
	var id pgtype.UUID
	for rows.Next() {
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, fmt.Errorf("insert processed_events: %w", err)
		}
		inserted[id.Bytes] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("insert processed_events: %w", err)
	}
	if len(inserted) != fresh {
		return nil, fmt.Errorf("insert processed_events: %d rows inserted, want %d", len(inserted), fresh)
	}
	if fresh == len(b) {
		return b, nil
	}
	claimed := make([]event, 0, fresh)
	var present []pgtype.UUID
	for _, e := range b {
		if inserted[e.id.Bytes] {
			claimed = append(claimed, e)
		} else {
			present = append(present, e.id)
		}
	}
	digest := "payload_digest"
	if layout != "onceflow" {
		digest = "NULL::bytea"
	}
	drows, err := tx.Query(ctx, `SELECT event_id, `+digest+` FROM `+parent.Sanitize()+` WHERE event_id = ANY($1::uuid[])`, present)
	if err != nil {
		return nil, fmt.Errorf("read digests: %w", err)
	}
	found := 0
	for drows.Next() {
		found++
	}
	if err := drows.Err(); err != nil {
		return nil, fmt.Errorf("read digests: %w", err)
	}
	distinct := map[[16]byte]bool{}
	for _, id := range present {
		distinct[id.Bytes] = true
	}
	if found != len(distinct) {
		return nil, fmt.Errorf("read digests: %d of %d redelivered events found", found, len(distinct))
	}
	return claimed, nil
}

// create makes schema with emails_sent as the demo defines it and
// processed_events in layout.
func create(ctx context.Context, pool *pgxpool.Pool, schema, layout string) error {
	s := pgx.Identifier{schema}.Sanitize()
	var processed string
	switch layout {
	case "seed":
		processed = `CREATE TABLE ` + s + `.processed_events (
    event_id     uuid        NOT NULL,
    handler      text        NOT NULL,
    bus          text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (event_id, handler)
);`
	case "narrow":
		processed = `CREATE TABLE ` + s + `.processed_events (
    event_id uuid     NOT NULL,
    handler  smallint NOT NULL,
    PRIMARY KEY (event_id, handler)
);`
	case "onceflow":
		processed = `CREATE TABLE ` + s + `.processed_events (
    event_id       uuid        NOT NULL,
    handler        text        NOT NULL,
    bus            text        NOT NULL,
    processed_at   timestamptz NOT NULL DEFAULT now(),
    trace_id       text,
    payload_digest bytea,
    slice          integer     NOT NULL DEFAULT 0,
    PRIMARY KEY (event_id, handler, slice)
) PARTITION BY LIST (slice);
CREATE TABLE ` + s + `.processed_events_s0 PARTITION OF ` + s + `.processed_events FOR VALUES IN (0);`
	case "none":
		processed = `CREATE TABLE ` + s + `.processed_events (event_id uuid); -- not written`
	}
	_, err := pool.Exec(ctx, `CREATE SCHEMA `+s+`;
`+processed+`
CREATE TABLE `+s+`.emails_sent (
    id       bigserial   PRIMARY KEY,
    event_id uuid        NOT NULL,
    user_id  bigint      NOT NULL,
    subject  text        NOT NULL,
    sent_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX emails_sent_event_id ON `+s+`.emails_sent (event_id);`)
	if err != nil {
		return fmt.Errorf("create schema %s: %w", schema, err)
	}
	return nil
}
