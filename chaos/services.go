package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// services are the chaos run's own broker and Postgres cluster, started
// and crashed through infra/chaos-kafka.sh and infra/chaos-postgres.sh.
// They are never the shared ones (the scripts refuse their ports).
type services struct {
	root                string // repository root: the scripts are in infra/
	kafkaPort, ctrlPort int
	kafkaDir            string
	pgPort              int
	pgDSN               string // straight to Postgres, not through the proxy
	workDir             string // the scripts' working directory (the JVM tools may write there)
}

func (s *services) brokers() []string { return []string{"127.0.0.1:" + strconv.Itoa(s.kafkaPort)} }

// script runs one of the infra scripts with the run's ports, and returns
// its standard output. Its standard error is in the error.
func (s *services) script(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(s.root, "infra", name), args...)
	cmd.Dir = s.workDir
	cmd.Env = append(os.Environ(),
		"CHAOS_KAFKA_PORT="+strconv.Itoa(s.kafkaPort),
		"CHAOS_KAFKA_CONTROLLER_PORT="+strconv.Itoa(s.ctrlPort),
		"CHAOS_KAFKA_DIR="+s.kafkaDir,
		"CHAOS_PGPORT="+strconv.Itoa(s.pgPort),
	)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("infra/%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return strings.TrimSpace(out.String()), nil
}

// kafka runs infra/chaos-kafka.sh verb: start (and wait until ready),
// crash (kill -9: no shutdown, no flush) or stop.
func (s *services) kafka(ctx context.Context, verb string) error {
	_, err := s.script(ctx, "chaos-kafka.sh", verb)
	return err
}

// postgres runs infra/chaos-postgres.sh verb: start, crash (restart -m
// immediate: the server dies without a checkpoint and recovers from its
// WAL), kill (stop -m immediate and stay down) or stop.
func (s *services) postgres(ctx context.Context, verb string) error {
	_, err := s.script(ctx, "chaos-postgres.sh", verb)
	return err
}

// startPostgres starts Postgres the first time and reads its DSN.
func (s *services) startPostgres(ctx context.Context) error {
	dsn, err := s.script(ctx, "chaos-postgres.sh", "start")
	if err != nil {
		return err
	}
	s.pgDSN = dsn
	return nil
}

// resetSchema drops schema and everything in it. The members create their
// tables (onceflow migrate), so that a binary from another tree brings its
// own schema.
func resetSchema(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`); err != nil {
		return fmt.Errorf("drop schema %s: %w", schema, err)
	}
	return nil
}

// topicPrefix starts the name of every topic a chaos run creates; the
// next run deletes them.
const topicPrefix = "chaos-orders-"

// createTopics deletes earlier runs' topics and creates this run's source
// topic and dead-letter topic. Both fsync every message (flush.messages=1),
// so that a record the broker acknowledged survives its kill -9. The source
// topic takes records up to topicMaxBytes, so the oversize poison can be
// produced to it; the dead-letter topic keeps the broker's default limit.
func createTopics(ctx context.Context, brokers []string, topic, dlq string, partitions int) error {
	return withAdmin(ctx, brokers, time.Minute, func(ctx context.Context, adm *kadm.Client) error {
		listed, err := adm.ListTopics(ctx)
		if err != nil {
			return fmt.Errorf("list topics: %w", err)
		}
		var old []string
		for _, t := range listed.Names() {
			if strings.HasPrefix(t, topicPrefix) {
				old = append(old, t)
			}
		}
		if len(old) > 0 {
			if _, err := adm.DeleteTopics(ctx, old...); err != nil {
				return fmt.Errorf("delete earlier runs' topics: %w", err)
			}
		}
		res, err := adm.CreateTopic(ctx, int32(partitions), 1, sourceConfigs(), topic)
		if err == nil {
			err = res.Err
		}
		if err != nil {
			return fmt.Errorf("create topic %s: %w", topic, err)
		}
		flush := "1"
		res, err = adm.CreateTopic(ctx, 1, 1, map[string]*string{"flush.messages": &flush}, dlq)
		if err == nil {
			err = res.Err
		}
		if err != nil {
			return fmt.Errorf("create topic %s: %w", dlq, err)
		}
		return nil
	})
}

// sourceConfigs are the source topic's settings: every message fsynced,
// records up to topicMaxBytes.
func sourceConfigs() map[string]*string {
	flush, srcMax := "1", strconv.Itoa(topicMaxBytes)
	return map[string]*string{"flush.messages": &flush, "max.message.bytes": &srcMax}
}

// recreateTopic deletes topic and creates it again, with partitions
// partitions and the source topic's settings, and returns the new topic's
// Kafka topic id. The broker finishes a deletion asynchronously: the
// creation is tried again while it says the topic still exists.
func recreateTopic(ctx context.Context, brokers []string, topic string, partitions int) (uuid.UUID, error) {
	var id uuid.UUID
	err := withAdmin(ctx, brokers, time.Minute, func(ctx context.Context, adm *kadm.Client) error {
		del, err := adm.DeleteTopic(ctx, topic)
		if err == nil {
			err = del.Err
		}
		if err != nil {
			return fmt.Errorf("delete topic %s: %w", topic, err)
		}
		for {
			res, err := adm.CreateTopic(ctx, int32(partitions), 1, sourceConfigs(), topic)
			if err == nil {
				err = res.Err
			}
			if err == nil {
				id = uuid.UUID(res.ID)
				return nil
			}
			if !errors.Is(err, kerr.TopicAlreadyExists) || ctx.Err() != nil {
				return fmt.Errorf("create topic %s again: %w", topic, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	})
	return id, err
}

// addPartitions gives topic partitions partitions in all.
func addPartitions(ctx context.Context, brokers []string, topic string, partitions int) error {
	return withAdmin(ctx, brokers, time.Minute, func(ctx context.Context, adm *kadm.Client) error {
		resp, err := adm.UpdatePartitions(ctx, partitions, topic)
		if err == nil {
			err = resp.Error()
		}
		if err != nil {
			return fmt.Errorf("add partitions to topic %s: %w", topic, err)
		}
		return nil
	})
}

// withAdmin calls fn with an admin client of brokers, bounded by d.
func withAdmin(ctx context.Context, brokers []string, d time.Duration, fn func(context.Context, *kadm.Client) error) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return fn(ctx, kadm.NewClient(cl))
}

// endOffsets returns the end offset (high watermark) of each of topic's
// partitions.
func endOffsets(ctx context.Context, brokers []string, topic string) (map[int32]int64, error) {
	out := map[int32]int64{}
	err := withAdmin(ctx, brokers, 30*time.Second, func(ctx context.Context, adm *kadm.Client) error {
		ends, err := adm.ListEndOffsets(ctx, topic)
		if err == nil {
			err = ends.Error()
		}
		if err != nil {
			return fmt.Errorf("end offsets of %s: %w", topic, err)
		}
		ends.Each(func(o kadm.ListedOffset) { out[o.Partition] = o.Offset })
		return nil
	})
	return out, err
}

// committedOffsets returns the offsets group has committed to Kafka for
// topic (partitions with none are absent).
func committedOffsets(ctx context.Context, brokers []string, group, topic string) (map[int32]int64, error) {
	out := map[int32]int64{}
	err := withAdmin(ctx, brokers, 30*time.Second, func(ctx context.Context, adm *kadm.Client) error {
		got, err := adm.FetchOffsets(ctx, group)
		if err == nil {
			err = got.Error()
		}
		if err != nil {
			return fmt.Errorf("committed offsets of group %s: %w", group, err)
		}
		got.Each(func(o kadm.OffsetResponse) {
			if o.Topic == topic && o.At >= 0 {
				out[o.Partition] = o.At
			}
		})
		return nil
	})
	return out, err
}

// waitPostgres waits until pool answers, up to d.
func waitPostgres(ctx context.Context, pool *pgxpool.Pool, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := pool.Ping(pctx)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return errors.Join(ctx.Err(), fmt.Errorf("postgres does not answer: %w", err))
		}
		time.Sleep(200 * time.Millisecond)
	}
}
