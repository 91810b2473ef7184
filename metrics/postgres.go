package metrics

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/dedup"
)

// The Postgres half of Metrics: the connection pools, the rows waiting to
// be published (outbox, dead letters) and the dedup retention's slices.

var (
	descPoolMax      = prometheus.NewDesc("onceflow_postgres_pool_max_connections", "Connections the pool may open (its size).", []string{"pool"}, nil)
	descPoolAcquired = prometheus.NewDesc("onceflow_postgres_pool_acquired_connections", "Connections in use: acquired and not yet released.", []string{"pool"}, nil)
	descPoolIdle     = prometheus.NewDesc("onceflow_postgres_pool_idle_connections", "Connections open and idle.", []string{"pool"}, nil)
	descPoolTotal    = prometheus.NewDesc("onceflow_postgres_pool_connections", "Connections open, in use, idle or being opened.", []string{"pool"}, nil)
	descPoolAcquires = prometheus.NewDesc("onceflow_postgres_pool_acquires_total", "Connections acquired from the pool.", []string{"pool"}, nil)
	descPoolEmpty    = prometheus.NewDesc("onceflow_postgres_pool_empty_acquires_total", "Acquires that found no idle connection and waited for one to be opened or released.", []string{"pool"}, nil)
	descPoolWait     = prometheus.NewDesc("onceflow_postgres_pool_empty_acquire_wait_seconds_total", "Time spent by acquires that found no idle connection, waiting for one: its rate is how many callers wait on average.", []string{"pool"}, nil)
	descPoolCanceled = prometheus.NewDesc("onceflow_postgres_pool_canceled_acquires_total", "Acquires given up (their context ended) while waiting for a connection.", []string{"pool"}, nil)

	descOutboxAge = prometheus.NewDesc("onceflow_outbox_oldest_pending_age_seconds", "Age of the oldest outbox row neither published nor refused by the broker; 0 when none waits.", nil, nil)
	descDeadAge   = prometheus.NewDesc("onceflow_dead_letters_oldest_unpublished_age_seconds", "Age of the consumer group's oldest dead letter not yet on the dead-letter topic; 0 when none waits. Exported only with a dead-letter topic.", nil, nil)

	descSlices        = prometheus.NewDesc("onceflow_dedup_slices", "Live slices of processed_events, as the retention's last step read them.", []string{"schema"}, nil)
	descRotationLate  = prometheus.NewDesc("onceflow_dedup_rotation_overdue_seconds", "How long past due the current dedup slice's replacement is (a rotation blocked by locks or failing); 0 when not due.", []string{"schema"}, nil)
	descDropLate      = prometheus.NewDesc("onceflow_dedup_drop_overdue_seconds", "How long the oldest dedup slice has been kept past its drop (its claims all past the horizon): held by a replay, blocked by locks or failing; 0 when none is due.", []string{"schema"}, nil)
	descDropHeld      = prometheus.NewDesc("onceflow_dedup_drop_held", "1 while dropping dedup slices is held (a replay has not caught up), else 0.", []string{"schema"}, nil)
	descRetentionBusy = prometheus.NewDesc("onceflow_dedup_retention_busy_steps", "Retention steps in a row that could not take their locks within lock_timeout (another maintainer, or a long transaction on processed_events).", []string{"schema"}, nil)
	descRetentionFail = prometheus.NewDesc("onceflow_dedup_retention_failing", "1 while the retention's steps fail (their error is logged), else 0.", []string{"schema"}, nil)
)

// backlogTimeout bounds one backlog query during a scrape.
const backlogTimeout = 2 * time.Second

// postgres is the Postgres half of Metrics.
type postgres struct {
	now func() time.Time

	mu        sync.Mutex
	pools     map[string]*pgxpool.Pool
	outbox    func(context.Context) (time.Duration, error)
	dead      func(context.Context) (time.Duration, error)
	retention map[string]dedup.RetentionStatus
}

// AddPool exports pool's statistics as onceflow_postgres_pool_*{pool=name}
// for as long as m lives: its size, the connections in use and idle, and
// how often and how long acquires waited for a connection (saturation).
// A second pool under a name replaces the first.
func (m *Metrics) AddPool(name string, pool *pgxpool.Pool) {
	m.pg.mu.Lock()
	defer m.pg.mu.Unlock()
	if m.pg.pools == nil {
		m.pg.pools = map[string]*pgxpool.Pool{}
	}
	m.pg.pools[name] = pool
}

// AddOutbox exports oldest (outbox.Relay.OldestPending) as
// onceflow_outbox_oldest_pending_age_seconds. Each scrape calls it once,
// with a 2s deadline; a scrape where it fails omits the series. It must be
// safe for concurrent use.
func (m *Metrics) AddOutbox(oldest func(context.Context) (time.Duration, error)) {
	m.pg.mu.Lock()
	m.pg.outbox = oldest
	m.pg.mu.Unlock()
}

// AddDeadLetterTopic exports oldest (sink.Writer.OldestUnpublishedDeadLetter)
// as onceflow_dead_letters_oldest_unpublished_age_seconds, as AddOutbox
// does. Call it only when a dead-letter topic is configured: without one,
// no dead letter is ever published.
func (m *Metrics) AddDeadLetterTopic(oldest func(context.Context) (time.Duration, error)) {
	m.pg.mu.Lock()
	m.pg.dead = oldest
	m.pg.mu.Unlock()
}

// OnRetentionStep records a dedup retention step; it is a
// dedup.Retention.OnStep. The schema's onceflow_dedup_* series appear
// with the first step.
func (m *Metrics) OnRetentionStep(s dedup.RetentionStatus) {
	m.pg.mu.Lock()
	defer m.pg.mu.Unlock()
	if m.pg.retention == nil {
		m.pg.retention = map[string]dedup.RetentionStatus{}
	}
	m.pg.retention[s.Schema] = s
}

// Describe implements prometheus.Collector.
func (p *postgres) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPoolMax, descPoolAcquired, descPoolIdle, descPoolTotal, descPoolAcquires, descPoolEmpty,
		descPoolWait, descPoolCanceled, descOutboxAge, descDeadAge, descSlices, descRotationLate, descDropLate, descDropHeld,
		descRetentionBusy, descRetentionFail} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (p *postgres) Collect(ch chan<- prometheus.Metric) {
	p.mu.Lock()
	pools := make(map[string]*pgxpool.Pool, len(p.pools))
	for k, v := range p.pools {
		pools[k] = v
	}
	outbox, dead := p.outbox, p.dead
	retention := make([]dedup.RetentionStatus, 0, len(p.retention))
	for _, s := range p.retention {
		retention = append(retention, s)
	}
	p.mu.Unlock()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	for name, pool := range pools {
		s := pool.Stat()
		gauge(descPoolMax, float64(s.MaxConns()), name)
		gauge(descPoolAcquired, float64(s.AcquiredConns()), name)
		gauge(descPoolIdle, float64(s.IdleConns()), name)
		gauge(descPoolTotal, float64(s.TotalConns()), name)
		counter(descPoolAcquires, float64(s.AcquireCount()), name)
		counter(descPoolEmpty, float64(s.EmptyAcquireCount()), name)
		counter(descPoolWait, s.EmptyAcquireWaitTime().Seconds(), name)
		counter(descPoolCanceled, float64(s.CanceledAcquireCount()), name)
	}
	for _, b := range []struct {
		d      *prometheus.Desc
		oldest func(context.Context) (time.Duration, error)
	}{{descOutboxAge, outbox}, {descDeadAge, dead}} {
		if b.oldest == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), backlogTimeout)
		age, err := b.oldest(ctx)
		cancel()
		if err == nil {
			gauge(b.d, age.Seconds())
		}
	}
	now := p.now()
	late := func(due time.Time) float64 {
		if due.IsZero() || !now.After(due) {
			return 0
		}
		return now.Sub(due).Seconds()
	}
	for _, s := range retention {
		if s.Slices > 0 {
			gauge(descSlices, float64(s.Slices), s.Schema)
			gauge(descRotationLate, late(s.RotationDue), s.Schema)
			gauge(descDropLate, late(s.DropDue), s.Schema)
		}
		held, failing := 0.0, 0.0
		if s.Held != "" {
			held = 1
		}
		if s.Err != nil {
			failing = 1
		}
		gauge(descDropHeld, held, s.Schema)
		gauge(descRetentionBusy, float64(s.Busy), s.Schema)
		gauge(descRetentionFail, failing, s.Schema)
	}
}
