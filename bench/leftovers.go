package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"slices"
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
// a schema <Schema>_<id>_run (markerSchema), dropped last (kept with
// Keep), that says the id's lock tells its life and its topic is this
// database's. A killed run's connection closes, and the server releases
// its lock: a later run that can take the lock knows that no running
// bench holds what bears the id. Advisory locks are per database, so a
// topic is only judged by its marker here: a topic whose id has no
// marker in this database is another database's run's, alive or not, and
// is left alone. Schemas of bench's names without a marker were made by
// an onceflow that took no lock: whether that run is alive cannot be
// told, and they are listed apart (Leftovers.Unmarked), never dropped.

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
	// Unmarked are schemas of bench's names with no run marker: an
	// earlier onceflow's, which took no lock, so whether its run is alive
	// cannot be told; never dropped.
	Unmarked []string
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

// Report says what l holds, in lines for a person: what was dropped
// (dropped) or what to drop and how, and the Unmarked apart; "" for
// none.
func (l *Leftovers) Report(dropped bool) string {
	var b strings.Builder
	switch {
	case len(l.Schemas)+len(l.Topics) == 0:
	case dropped:
		fmt.Fprintf(&b, "dropped what earlier runs left (killed, or kept with --keep): %s\n", l)
	default:
		fmt.Fprintf(&b, "left by earlier runs that no running bench holds (killed, or kept with --keep): %s; "+
			"--drop-leftovers drops them, as does:\n  %s\n", l, strings.Join(l.Commands(), "\n  "))
	}
	if len(l.Unmarked) > 0 {
		fmt.Fprintf(&b, "%s %s: named as bench's, but made by an earlier onceflow, which took no lock: whether its run is alive "+
			"cannot be told, so they are not dropped; once it is not:\n  %s;\n", plural(len(l.Unmarked), "schema"), strings.Join(l.Unmarked, ", "), dropSchemas(l.Unmarked))
	}
	return b.String()
}

// dropSchemas is the statement that drops schemas and what they hold.
func dropSchemas(schemas []string) string {
	ids := make([]string, len(schemas))
	for i, s := range schemas {
		ids[i] = pgx.Identifier{s}.Sanitize()
	}
	return "DROP SCHEMA IF EXISTS " + strings.Join(ids, ", ") + " CASCADE"
}

// Empty says there are none.
func (l *Leftovers) Empty() bool {
	return len(l.Schemas) == 0 && len(l.Topics) == 0 && len(l.Unmarked) == 0
}

// Commands are the commands that drop l's Schemas and Topics (not
// Unmarked): a DROP SCHEMA statement, and a kafka-topics.sh per topic.
func (l *Leftovers) Commands() []string {
	var out []string
	if len(l.Schemas) > 0 {
		out = append(out, dropSchemas(l.Schemas)+";")
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
	re := regexp.MustCompile(`^` + c.Schema + `_([0-9a-f]{8})_(run|[a-z_]+_r[0-9]+(_t)?|calib_[a-z_]+_w[0-9]+(_t)?)$`)
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
	out := &Leftovers{}
	ids = slices.DeleteFunc(ids, func(id string) bool {
		if !slices.Contains(schemas[id], markerSchema(c.Schema, id)) {
			out.Unmarked = append(out.Unmarked, schemas[id]...)
			return true
		}
		return false
	})
	topics := map[string]string{}
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
			if m := tre.FindStringSubmatch(t); m != nil && slices.Contains(ids, m[1]) {
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
	if _, err := conn.Exec(ctx, dropSchemas(schemas)); err != nil {
		return fmt.Errorf("drop schemas %s: %w", strings.Join(schemas, ", "), err)
	}
	return nil
}
