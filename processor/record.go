package processor

import (
	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"
)

// NewRecord returns the record a producer publishes for an event: the JSON
// value, the event id in the event_id header and as the key (so every
// redelivery of an event lands on the same partition).
func NewRecord(topic string, id uuid.UUID, value []byte) *kgo.Record {
	s := id.String()
	return &kgo.Record{
		Topic:   topic,
		Key:     []byte(s),
		Value:   value,
		Headers: []kgo.RecordHeader{{Key: HeaderEventID, Value: []byte(s)}},
	}
}
