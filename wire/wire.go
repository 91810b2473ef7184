package wire

import (
	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"
)

// HeaderEventID is the record header that carries the event id by default.
const HeaderEventID = "event_id"

// NewRecord returns the record a producer publishes for an event: the JSON
// value, the event id in the event_id header and as the key (so every
// redelivery of an event lands on the same partition). The record is the
// caller's.
func NewRecord(topic string, id uuid.UUID, value []byte) *kgo.Record {
	s := id.String()
	return &kgo.Record{
		Topic:   topic,
		Key:     []byte(s),
		Value:   value,
		Headers: []kgo.RecordHeader{{Key: HeaderEventID, Value: []byte(s)}},
	}
}

// RecordCarrier adapts a record's headers to OpenTelemetry propagation, so
// producers can inject and the consumer extract trace context. It is not
// safe for concurrent use with other writers of the record.
type RecordCarrier struct{ *kgo.Record }

// Get returns the value of the first header named key, or "".
func (c RecordCarrier) Get(key string) string {
	for _, h := range c.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// Set replaces (or adds) the header named key.
func (c RecordCarrier) Set(key, value string) {
	for i, h := range c.Headers {
		if h.Key == key {
			c.Headers[i].Value = []byte(value)
			return
		}
	}
	c.Headers = append(c.Headers, kgo.RecordHeader{Key: key, Value: []byte(value)})
}

// Keys lists the header names.
func (c RecordCarrier) Keys() []string {
	keys := make([]string, len(c.Headers))
	for i, h := range c.Headers {
		keys[i] = h.Key
	}
	return keys
}
