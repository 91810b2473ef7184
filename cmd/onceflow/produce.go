package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/config"
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
standard input, read as it comes) to --topic on kafka.brokers, with the
--key and --header given, and prints where each landed as
topic/partition@offset, in the order of the input. Each record must be
acknowledged within kafka.produce_timeout.

A value longer than the record limit is not sent: the smaller of
decode.max_record_bytes (what onceflow reads; a longer value would only be
dead-lettered) and what the topic's max.message.bytes leaves for the value.
Each value not sent is reported on standard error by its line number (or
argument position), with the reason; every other value is sent, and the
command then ends with a summary, N sent, M refused, and a non-zero exit.

To onceflow, a record sent twice with the same event id (the event_id
header, or wherever decode.event_id_source says) is one event delivered
twice, as after a producer's retry or a consumer's crash.

  onceflow produce --topic payments --header event_id=7f8a0000-0000-0000-0000-000000000001 '{"amount":"12.50"}'

With --format avro (--schema payment.avsc) or protobuf (--schema
payment.proto --message Payment), each VALUE is the JSON of a record —
the payload a SQL handler will see (docs/sql-handlers.md) — encoded with
that schema, which is registered first under --subject (default
TOPIC-value) at decode.schema_registry.url, and framed for the registry.
A .proto's imports are read relative to its directory and each registered
under its import path as subject, referenced as Confluent's serializers
do; --message resolves as protoc does (Order.Line in the file's package).
--schema, --message and --subject without --format are refused.
A value the schema refuses is not sent, and reported like one over the
limit.

  onceflow produce --format avro --schema payment.avsc --header event_id=7f8a0000-0000-0000-0000-000000000002 '{"account":"acct-1","amount":12.50}'`,
		RunE: func(cmd *cobra.Command, args []string) error {
			// --schema is produce's own (the value schema file), not
			// postgres.schema, which produce does not use.
			a, err := loadBinding(cmd, slices.DeleteFunc(slices.Clone(binds), func(f config.Flag) bool { return f.Name == "schema" }))
			if err != nil {
				return err
			}
			p := producer{topic: topic, timeout: a.cfg.Kafka.ProduceTimeout, out: cmd.OutOrStdout(), errOut: cmd.ErrOrStderr()}
			if p.topic == "" {
				p.topic = a.cfg.Kafka.Topics[0]
			}
			for _, h := range headers {
				k, v, ok := strings.Cut(h, "=")
				if !ok || k == "" {
					return fmt.Errorf("--header %q is not key=value", h)
				}
				p.headers = append(p.headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
			}
			if cmd.Flags().Changed("key") {
				p.key = []byte(key)
			}
			if framing != (framedValues{}) {
				if p.encode, err = framing.encoder(cmd.Context(), a, p.topic); err != nil {
					return err
				}
			}
			// The client may take a record up to decode.max_record_bytes
			// (its default batch limit is below 1 MiB); the topic's own
			// limit, asked below, may be lower.
			p.limit, p.limitWhy = a.cfg.Decode.MaxRecordBytes, "decode.max_record_bytes"
			if most := maxProduceBytes - p.overhead(); p.limit > most {
				p.limit, p.limitWhy = most, "the largest record batch produce builds, 64 MiB, less the record's overhead"
			}
			cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(a.cfg.Kafka.Brokers...),
				kgo.ClientID(a.cfg.Kafka.ClientID + "-produce"), kgo.AllowAutoTopicCreation(),
				kgo.ProducerBatchMaxBytes(int32(max(p.limit+p.overhead(), 512)))},
				a.kafkaOptions(a.cfg.Kafka.ClientID+"-produce")...)...)
			if err != nil {
				return fmt.Errorf("kafka producer: %w", err)
			}
			defer cl.Close()
			if err := a.pingKafka(cmd.Context(), cl); err != nil {
				return err
			}
			p.topicLimit(cmd.Context(), cl)
			if len(args) > 0 {
				return p.run(cmd.Context(), cl, &argReader{args: args, limit: p.limit}, "argument")
			}
			return p.run(cmd.Context(), cl, newLineReader(cmd.InOrStdin(), p.limit), "line")
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

// maxProduceBytes bounds the record batch produce builds: below the
// client's default largest write to a broker (100 MiB).
const maxProduceBytes = 64 << 20

// Produce holds at most windowBytes of values (or one value over that)
// between reading them and printing their outcome, counted in units of
// windowUnit bytes, at least one a record: its memory is bounded whatever
// the input's length, and at most windowBytes/windowUnit records are in
// flight.
const (
	windowBytes = 32 << 20
	windowUnit  = 4 << 10
)

// producer sends values as records to one topic, in the order read, and
// reports each one's outcome.
type producer struct {
	topic    string
	key      []byte
	headers  []kgo.RecordHeader
	timeout  time.Duration // each record's, from its produce
	limit    int           // the longest value sent
	limitWhy string        // where limit comes from, for the reports
	out      io.Writer     // where each record landed
	errOut   io.Writer     // each value not sent, and why
	// encode, when set, turns each value read into the record's value
	// (--format); a value it refuses is not sent.
	encode func([]byte) ([]byte, error)
}

// overhead bounds the bytes a record batch of one record adds to its
// value: the batch header (61 bytes), the record's varints, its key and
// headers.
func (p *producer) overhead() int {
	n := 61 + 5 + 1 + 10 + 5 + 5 + len(p.key) + 5 + 5
	for _, h := range p.headers {
		n += 5 + len(h.Key) + 5 + len(h.Value)
	}
	return n
}

// topicLimit lowers the limit to what the topic's max.message.bytes leaves
// for a value, when the broker says it; otherwise (a topic still to be
// created, no right to describe it) the broker's refusal of a record, if
// any, is reported on its line.
func (p *producer) topicLimit(ctx context.Context, cl *kgo.Client) {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	rcs, err := kadm.NewClient(cl).DescribeTopicConfigs(ctx, p.topic)
	if err != nil {
		return
	}
	rc, err := rcs.On(p.topic, nil)
	if err != nil || rc.Err != nil {
		return
	}
	for _, c := range rc.Configs {
		if c.Key != "max.message.bytes" || c.Value == nil {
			continue
		}
		if v, err := strconv.Atoi(*c.Value); err == nil && v-p.overhead() < p.limit && v > p.overhead() {
			p.limit = v - p.overhead()
			p.limitWhy = fmt.Sprintf("max.message.bytes of topic %s, %d, less %d bytes of record overhead", p.topic, v, p.overhead())
		}
	}
}

// values is where produce reads its values from: next returns the next
// value, or, when it is longer than the limit, its length in over and no
// value; io.EOF after the last.
type values interface {
	next() (value []byte, over int64, err error)
}

// inFlight is a value read whose outcome is not printed yet: a record
// produced, or a value over the limit.
type inFlight struct {
	n        int // its line or argument number
	rec      *kgo.Record
	over     int64 // the value's length when over the limit (no record)
	refusal  error // why encode refused the value (no record)
	units    int   // of the window it holds
	deadline time.Time
	done     chan error // buffered: the promise never blocks
}

// run sends every value of in that is within the limit, and reports each
// value's outcome in input order as it comes: where a record landed on out,
// a value not sent on errOut, by its number (what names it: line or
// argument). A printer goroutine, which run waits for, reports while run
// reads on. It returns an error with the summary when any value was not
// sent or reading failed.
func (p *producer) run(ctx context.Context, cl *kgo.Client, in values, what string) error {
	units := make(chan struct{}, max(windowBytes, p.limit+1)/windowUnit+1) // the window, see windowBytes
	// At most one entry per unit held, so a send never blocks.
	pending := make(chan *inFlight, cap(units))
	var sent, refused, unsure []int // the printer's until it is done
	printed := make(chan struct{})
	go func() {
		defer close(printed)
		for f := range pending {
			p.report(f, what, &sent, &refused, &unsure)
			for range f.units {
				<-units
			}
		}
	}()
	var readErr error
	for n := 1; ctx.Err() == nil; n++ {
		v, over, err := in.next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			readErr = fmt.Errorf("read %s %d: %w", what, n, err)
			break
		}
		f := &inFlight{n: n, over: over, units: max(len(v)/windowUnit, 1)}
		for range f.units {
			units <- struct{}{}
		}
		if over == 0 && p.encode != nil {
			if v, err = p.encode(v); err != nil {
				f.refusal = err
			} else if len(v) > p.limit {
				f.over = int64(len(v))
			}
		}
		if f.over == 0 && f.refusal == nil {
			f.rec = &kgo.Record{Topic: p.topic, Key: p.key, Value: v, Headers: p.headers}
			f.deadline, f.done = time.Now().Add(p.timeout), make(chan error, 1)
			cl.Produce(ctx, f.rec, func(_ *kgo.Record, err error) { f.done <- err })
		}
		pending <- f
	}
	close(pending)
	<-printed
	if readErr == nil {
		readErr = ctx.Err()
	}
	if len(refused) == 0 && len(unsure) == 0 && readErr == nil {
		return nil
	}
	summary := fmt.Sprintf("%d sent, %d refused", len(sent), len(refused))
	if len(refused) > 0 {
		summary += " (" + numbers(what, refused) + ")"
	}
	if len(unsure) > 0 {
		summary += fmt.Sprintf(", %d unacknowledged (%s)", len(unsure), numbers(what, unsure))
	}
	if readErr != nil {
		return fmt.Errorf("%s; then: %w", summary, readErr)
	}
	return errors.New(summary)
}

// report waits for f's outcome, at most until its deadline, prints it and
// counts it in sent, refused or unsure.
func (p *producer) report(f *inFlight, what string, sent, refused, unsure *[]int) {
	if f.rec == nil && f.refusal != nil {
		*refused = append(*refused, f.n)
		fmt.Fprintf(p.errOut, "%s %d: not sent: %v\n", what, f.n, f.refusal)
		return
	}
	if f.rec == nil {
		*refused = append(*refused, f.n)
		fmt.Fprintf(p.errOut, "%s %d: not sent: %d bytes, over the limit of %d bytes (%s)\n", what, f.n, f.over, p.limit, p.limitWhy)
		return
	}
	var err error
	t := time.NewTimer(time.Until(f.deadline))
	defer t.Stop()
	select {
	case err = <-f.done:
	case <-t.C:
		err = wire.ErrStillProducing
	}
	switch {
	case err == nil:
		*sent = append(*sent, f.n)
		fmt.Fprintf(p.out, "%s/%d@%d\n", f.rec.Topic, f.rec.Partition, f.rec.Offset)
	case errors.Is(err, wire.ErrStillProducing):
		*unsure = append(*unsure, f.n)
		fmt.Fprintf(p.errOut, "%s %d: not acknowledged within kafka.produce_timeout (%v): it may still reach the topic\n", what, f.n, p.timeout)
	default:
		*refused = append(*refused, f.n)
		fmt.Fprintf(p.errOut, "%s %d: not sent: %v\n", what, f.n, err)
	}
}

// numbers names ns, the first ten of them: "line 3", "lines 3, 5".
func numbers(what string, ns []int) string {
	var b strings.Builder
	b.WriteString(what)
	if len(ns) > 1 {
		b.WriteString("s")
	}
	b.WriteString(" ")
	for i, n := range ns {
		if i == 10 {
			fmt.Fprintf(&b, " and %d more", len(ns)-10)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Itoa(n))
	}
	return b.String()
}

// argReader is the values given as arguments.
type argReader struct {
	args  []string
	limit int
}

func (r *argReader) next() ([]byte, int64, error) {
	if len(r.args) == 0 {
		return nil, 0, io.EOF
	}
	v := r.args[0]
	r.args = r.args[1:]
	if r.limit > 0 && len(v) > r.limit {
		return nil, int64(len(v)), nil
	}
	return []byte(v), 0, nil
}

// lineReader reads lines (ended by \n or \r\n, the last one possibly by
// the end of the input), holding at most limit bytes of a line: a longer
// one is measured and skipped as it is read. It is not safe for
// concurrent use.
type lineReader struct {
	r     *bufio.Reader
	limit int
	buf   []byte // the line being read, up to limit+1 bytes (a \r may end it)
}

func newLineReader(r io.Reader, limit int) *lineReader {
	return &lineReader{r: bufio.NewReaderSize(r, 64<<10), limit: limit}
}

// next returns the next line, a copy the caller keeps, or its length in
// over when it is longer than the limit; io.EOF after the last line.
func (l *lineReader) next() ([]byte, int64, error) {
	l.buf = l.buf[:0]
	var total int64 // the line's bytes, its \n excluded
	for {
		chunk, err := l.r.ReadSlice('\n')
		ended := err == nil
		if ended {
			chunk = chunk[:len(chunk)-1]
		}
		total += int64(len(chunk))
		if room := l.limit + 1 - len(l.buf); room > 0 {
			l.buf = append(l.buf, chunk[:min(room, len(chunk))]...)
		}
		switch {
		case ended:
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF):
			if total == 0 {
				return nil, 0, io.EOF
			}
		default:
			return nil, 0, err
		}
		break
	}
	line := l.buf
	if total <= int64(l.limit)+1 && len(line) > 0 && line[len(line)-1] == '\r' {
		line, total = line[:len(line)-1], total-1
	}
	if total > int64(l.limit) {
		return nil, total, nil
	}
	return append([]byte(nil), line...), 0, nil
}
