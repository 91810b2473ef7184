package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// checkDeadLetterTopic runs once brokers answer, before consuming. With no
// kafka.dead_letter_topic it says once that dead letters stay in the
// dead_letters table. Otherwise it asks the brokers about the topic,
// without creating it (a broker's auto-creation would pick partitions
// and replication for the user): one they do not have, or whose metadata
// they refuse, is a configuration error returned at once, naming the key —
// the copies would never be published, and the relay would warn for ever.
// When the brokers do not say (a timeout, a leader election), the start
// goes on: the relay retries from the table, warning.
func (a *app) checkDeadLetterTopic(ctx context.Context, brokers []string) error {
	topic := a.cfg.Kafka.DeadLetterTopic
	if topic == "" {
		a.log.Info("no dead-letter topic (kafka.dead_letter_topic is empty): dead letters are kept in the dead_letters table only")
		return nil
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.ClientID(a.cfg.Kafka.ClientID + "-check")},
		a.kafkaSecurity...)...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	req := kmsg.NewPtrMetadataRequest()
	req.AllowAutoTopicCreation = false
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	mctx, cancel := context.WithTimeout(ctx, a.cfg.Postgres.CallTimeout)
	resp, err := req.RequestWith(mctx, cl)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		a.log.Warn("could not check that the dead-letter topic exists; its copies are retried from the dead_letters table",
			"dead_letter_topic", topic, "err", a.redactKafka(err.Error()))
		return nil
	}
	terr := errors.New("the brokers did not say")
	for _, t := range resp.Topics {
		if t.Topic != nil && *t.Topic == topic {
			terr = kerr.ErrorForCode(t.ErrorCode)
		}
	}
	switch {
	case terr == nil:
		a.log.Info("dead letters are copied to the dead-letter topic", "dead_letter_topic", topic)
		return nil
	case errors.Is(terr, kerr.UnknownTopicOrPartition):
		return fmt.Errorf("kafka.dead_letter_topic: topic %q does not exist on kafka brokers %v: create it, "+
			`or set kafka.dead_letter_topic to "" to keep dead letters in the dead_letters table only`, topic, brokers)
	case errors.Is(terr, kerr.TopicAuthorizationFailed):
		return fmt.Errorf("kafka.dead_letter_topic: the brokers refuse topic %q to this client (%v): "+
			`grant it Describe and Write on the topic, or set kafka.dead_letter_topic to "" to keep dead letters in the dead_letters table only`,
			topic, terr)
	}
	a.log.Warn("could not check that the dead-letter topic exists; its copies are retried from the dead_letters table",
		"dead_letter_topic", topic, "err", terr)
	return nil
}
