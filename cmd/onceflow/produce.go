package main

import (
	"bufio"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/config"
	"github.com/onceflow/onceflow/wire"
)

func newProduceCmd() *cobra.Command {
	var (
		topic, key string
		headers    []string
		framing    framedValues
	)
	cmd := &cobra.Command{
		Use:   "produce [VALUE...]",
		Short: "Send records to a topic: each VALUE, or each line of standard input",
		Long: `produce sends one record per VALUE argument (with none, one per line of
standard input) to --topic on kafka.brokers, with the --key and --header
given, and prints where each landed as topic/partition@offset. It waits
for every record to be acknowledged, at most kafka.produce_timeout.

To onceflow, a record sent twice with the same event id (the event_id
header, or wherever decode.event_id_source says) is one event delivered
twice, as after a producer's retry or a consumer's crash.

  onceflow produce --topic payments --header event_id=7f8a0000-0000-0000-0000-000000000001 '{"amount":"12.50"}'

With --format avro (--schema payment.avsc) or protobuf (--schema
payment.proto --message Payment), each VALUE is the JSON of a record —
the payload a SQL handler will see (docs/sql-handlers.md) — encoded with
that schema, which is registered first under --subject (default
TOPIC-value) at decode.schema_registry.url, and framed for the registry.

  onceflow produce --format avro --schema payment.avsc --header event_id=7f8a0000-0000-0000-0000-000000000002 '{"account":"acct-1","amount":12.50}'`,
		RunE: func(cmd *cobra.Command, args []string) error {
			// --schema is produce's own (the value schema file), not
			// postgres.schema, which produce does not use.
			a, err := loadBinding(cmd, slices.DeleteFunc(slices.Clone(binds), func(f config.Flag) bool { return f.Name == "schema" }))
			if err != nil {
				return err
			}
			if topic == "" {
				topic = a.cfg.Kafka.Topics[0]
			}
			var hs []kgo.RecordHeader
			for _, h := range headers {
				k, v, ok := strings.Cut(h, "=")
				if !ok || k == "" {
					return fmt.Errorf("--header %q is not key=value", h)
				}
				hs = append(hs, kgo.RecordHeader{Key: k, Value: []byte(v)})
			}
			values := args
			if len(values) == 0 {
				sc := bufio.NewScanner(cmd.InOrStdin())
				sc.Buffer(nil, a.cfg.Decode.MaxRecordBytes+1)
				for sc.Scan() {
					values = append(values, sc.Text())
				}
				if err := sc.Err(); err != nil {
					return fmt.Errorf("read standard input: %w", err)
				}
			}
			encode, err := framing.encoder(cmd.Context(), a, topic)
			if err != nil {
				return err
			}
			recs := make([]*kgo.Record, len(values))
			for i, v := range values {
				value, err := encode([]byte(v))
				if err != nil {
					return fmt.Errorf("value %d: %w", i+1, err)
				}
				recs[i] = &kgo.Record{Topic: topic, Value: value, Headers: hs}
				if cmd.Flags().Changed("key") {
					recs[i].Key = []byte(key)
				}
			}
			cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(a.cfg.Kafka.Brokers...),
				kgo.ClientID(a.cfg.Kafka.ClientID + "-produce"), kgo.AllowAutoTopicCreation()},
				a.kafkaOptions(a.cfg.Kafka.ClientID+"-produce")...)...)
			if err != nil {
				return fmt.Errorf("kafka producer: %w", err)
			}
			defer cl.Close()
			if err := a.pingKafka(cmd.Context(), cl); err != nil {
				return err
			}
			var ps []error
			for i, err := range wire.Produce(cmd.Context(), cl, recs, a.cfg.Kafka.ProduceTimeout) {
				if err != nil {
					ps = append(ps, fmt.Errorf("record %d: %w", i+1, err))
					continue
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s/%d@%d\n", recs[i].Topic, recs[i].Partition, recs[i].Offset)
			}
			return errors.Join(ps...)
		},
	}
	cmd.Flags().StringVar(&topic, "topic", "", "topic to send to (default: the first of kafka.topics)")
	cmd.Flags().StringVar(&key, "key", "", "record key (default: none)")
	cmd.Flags().StringArrayVar(&headers, "header", nil, "record header key=value, repeatable")
	cmd.Flags().StringVar(&framing.format, "format", "", "avro or protobuf: encode each JSON VALUE with --schema, framed for the schema registry (default: send VALUE as it is)")
	cmd.Flags().StringVar(&framing.schema, "schema", "", "the schema file of --format: Avro JSON (.avsc) or a .proto")
	cmd.Flags().StringVar(&framing.message, "message", "", "the Protobuf message of --schema (default: the file's first)")
	cmd.Flags().StringVar(&framing.subject, "subject", "", "the subject to register --schema under (default: TOPIC-value)")
	return cmd
}
