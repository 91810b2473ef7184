package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A run's life is marked in its database by two things, both taken
// before it makes any schema or topic: a session advisory lock on its id
// (runLockKey), held on a connection of its own until Run returns, and
// a schema <Schema>_<id>_run (markerSchema) that says its topic's id is
// this database's. A killed run's connection closes, and the server
// releases its lock: a later run that can take the lock knows that no
// running bench holds what bears the id. Advisory locks are per
// database, so a topic is only judged by its marker here: a topic whose
// id has no schema in this database is another database's run's, alive
// or not, and is left alone.

// runLockKey is the advisory lock key of run id (hashtextextended of it).
const runLockKey = `hashtextextended('onceflow bench run ' || $1, 0)`

// markerSchema is the schema that marks run id as this database's.
func markerSchema(prefix, id string) string { return prefix + "_" + id + "_run" }

// Leftovers are the schemas and topics named as bench names them that no
// running bench holds: left by a run that was killed (SIGKILL, a lost
// connection) or kept with Keep.
type Leftovers struct {
	Schemas []string
	Topics  []string
	// Brokers the Topics are on.
	Brokers []string
}

// String lists l: "schemas a, b; topic t".
func (l *Leftovers) String() string {
	var parts []string
	if len(l.Schemas) > 0 {
		parts = append(parts, plural(len(l.Schemas), "schema")+" "+strings.Join(l.Schemas, ", "))
	}
	if len(l.Topics) > 0 {
		parts = append(parts, plural(len(l.Topics), "topic")+" "+strings.Join(l.Topics, ", "))
	}
	return strings.Join(parts, "; ")
}

// Empty says there are none.
func (l *Leftovers) Empty() bool { return len(l.Schemas) == 0 && len(l.Topics) == 0 }

// Commands are the commands that drop l: a DROP SCHEMA statement, and a
// kafka-topics.sh per topic.
func (l *Leftovers) Commands() []string {
	var out []string
	if len(l.Schemas) > 0 {
		ids := make([]string, len(l.Schemas))
		for i, s := range l.Schemas {
			ids[i] = pgx.Identifier{s}.Sanitize()
		}
		out = append(out, "DROP SCHEMA IF EXISTS "+strings.Join(ids, ", ")+" CASCADE;")
	}
	for _, t := range l.Topics {
		out = append(out, fmt.Sprintf("kafka-topics.sh --bootstrap-server %s --delete --topic %s", strings.Join(l.Brokers, ","), t))
	}
	return out
}

// runLock is the lock a run holds for its life, on a connection of its
// own (not the pool's, whose connections come and go).
type runLock struct {
	id   string
	conn *pgx.Conn
}

// lockRun picks a new run id and takes its lock; a taken id (a running
// bench's, by chance) is passed over.
func lockRun(ctx context.Context, pool *pgxpool.Pool) (*runLock, error) {
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	if err != nil {
		return nil, fmt.Errorf("connect for the run's lock: %w", err)
	}
	for range 8 {
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		id := hex.EncodeToString(b)
		var ok bool
		if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock("+runLockKey+")", id).Scan(&ok); err != nil {
			_ = conn.Close(context.WithoutCancel(ctx))
			return nil, fmt.Errorf("take the run's lock: %w", err)
		}
		if ok {
			return &runLock{id: id, conn: conn}, nil
		}
	}
	_ = conn.Close(context.WithoutCancel(ctx))
	return nil, errors.New("take the run's lock: every id tried is held")
}

// release ends the lock's session, which releases it.
func (l *runLock) release(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return l.conn.Close(ctx)
}

// FindLeftovers lists the schemas named <c.Schema>_<id>_… and, with
// c.Brokers, the topics <c.Topic>-bench-<id> whose run no running bench
// holds (its lock on id is free), and with drop drops them, each run's
// while holding its lock, so that none is a live run's. own is an id to
// pass over (the caller's run), "" for none. A topic is listed only when
// its id has a schema in c.Pool's database (see markerSchema).
func FindLeftovers(ctx context.Context, c Config, own string, drop bool) (*Leftovers, error) {
	c = c.withDefaults()
	if !validSchemaPrefix(c.Schema) {
		return nil, &ConfigError{Field: "Schema", Value: fmt.Sprintf("%q", c.Schema), Problem: "not a schema prefix of bench"}
	}
	re := regexp.MustCompile(`^` + c.Schema + `_([0-9a-f]{8})_(run|[a-z_]+_r[0-9]+(_t)?)$`)
	rows, err := c.Pool.Query(ctx, `SELECT nspname FROM pg_namespace WHERE starts_with(nspname, $1) ORDER BY 1`, c.Schema+"_")
	if err != nil {
		return nil, fmt.Errorf("list bench schemas: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list bench schemas: %w", err)
	}
	schemas := map[string][]string{} // by run id
	var ids []string
	for _, n := range names {
		if m := re.FindStringSubmatch(n); m != nil && m[1] != own {
			if _, ok := schemas[m[1]]; !ok {
				ids = append(ids, m[1])
			}
			schemas[m[1]] = append(schemas[m[1]], n)
		}
	}
	topics := map[string]string{}
	out := &Leftovers{}
	if len(c.Brokers) > 0 && c.Topic != "" && len(ids) > 0 {
		cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.Brokers...)}, c.KafkaOptions...)...)
		if err != nil {
			return nil, fmt.Errorf("kafka client: %w", err)
		}
		defer cl.Close()
		lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		ts, err := kadm.NewClient(cl).ListTopics(lctx)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("list topics: %w", err)
		}
		tre := regexp.MustCompile(`^` + regexp.QuoteMeta(c.Topic) + `-bench-([0-9a-f]{8})$`)
		for _, t := range ts.Names() {
			if m := tre.FindStringSubmatch(t); m != nil && schemas[m[1]] != nil {
				topics[m[1]] = t
			}
		}
		out.Brokers = c.Brokers
	}
	conn, err := c.Pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("check the runs' locks: %w", err)
	}
	defer conn.Release()
	for _, id := range ids {
		dead, err := leftover(ctx, conn, id, func() error {
			if !drop {
				return nil
			}
			return dropRun(ctx, c, conn, schemas[id], topics[id])
		})
		if err != nil {
			return out, err
		}
		if dead {
			out.Schemas = append(out.Schemas, schemas[id]...)
			if t := topics[id]; t != "" {
				out.Topics = append(out.Topics, t)
			}
		}
	}
	return out, nil
}

// leftover takes run id's lock if it is free (no running bench holds
// it), calls then while holding it, and releases it; dead says it was
// free.
func leftover(ctx context.Context, conn *pgxpool.Conn, id string, then func() error) (dead bool, err error) {
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock("+runLockKey+")", id).Scan(&dead); err != nil {
		return false, fmt.Errorf("check run %s's lock: %w", id, err)
	}
	if !dead {
		return false, nil
	}
	err = then()
	if _, uerr := conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock("+runLockKey+")", id); uerr != nil {
		err = errors.Join(err, fmt.Errorf("release run %s's lock: %w", id, uerr))
	}
	return true, err
}

// dropRun drops a dead run's schemas and its topic ("" for none).
func dropRun(ctx context.Context, c Config, conn *pgxpool.Conn, schemas []string, topic string) error {
	if topic != "" {
		cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.Brokers...)}, c.KafkaOptions...)...)
		if err != nil {
			return fmt.Errorf("kafka client: %w", err)
		}
		defer cl.Close()
		dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		rs, err := kadm.NewClient(cl).DeleteTopics(dctx, topic)
		if err == nil {
			err = rs.Error()
		}
		if err != nil {
			return fmt.Errorf("delete topic %s: %w", topic, err)
		}
	}
	ids := make([]string, len(schemas))
	for i, s := range schemas {
		ids[i] = pgx.Identifier{s}.Sanitize()
	}
	if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+strings.Join(ids, ", ")+" CASCADE"); err != nil {
		return fmt.Errorf("drop schemas %s: %w", strings.Join(schemas, ", "), err)
	}
	return nil
}
