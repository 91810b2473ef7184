package orders

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"

	"github.com/google/uuid"
)

// Message is one message to publish: an event id and its order payload.
// Several messages may share an id — redeliveries of one event.
type Message struct {
	ID    uuid.UUID
	Value []byte
}

// Stream is a generated stream of orders with redeliveries.
type Stream struct {
	Messages []Message           // in publish order
	Unique   map[uuid.UUID]Order // the events behind the messages
}

// Generate returns events unique orders (user ids 1..1000, one to three of
// 50 items) followed, interleaved, by round(events*dupRatio) redeliveries
// of earlier events. The same seed gives the same stream, ids included.
func Generate(events int, dupRatio float64, seed uint64) (Stream, error) {
	if events < 0 {
		return Stream{}, fmt.Errorf("events %d: must be >= 0", events)
	}
	if dupRatio < 0 {
		return Stream{}, fmt.Errorf("duplicate ratio %v: must be >= 0", dupRatio)
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	s := Stream{Unique: make(map[uuid.UUID]Order, events)}
	dups := int(float64(events)*dupRatio + 0.5)
	if events == 0 {
		dups = 0
	}
	s.Messages = make([]Message, 0, events+dups)
	ids := make([]uuid.UUID, 0, events)
	for len(ids) < events || dups > 0 {
		// A redelivery with probability dups/(remaining), once an event exists.
		remaining := events - len(ids) + dups
		if len(ids) > 0 && dups > 0 && rng.IntN(remaining) < dups {
			dups--
			id := ids[rng.IntN(len(ids))]
			s.Messages = append(s.Messages, Message{ID: id, Value: mustJSON(s.Unique[id])})
			continue
		}
		var id uuid.UUID
		for i := range id {
			id[i] = byte(rng.Uint32())
		}
		id[6] = id[6]&0x0f | 0x40 // version 4
		id[8] = id[8]&0x3f | 0x80 // RFC 4122 variant
		o := Order{UserID: 1 + rng.Int64N(1000)}
		for range 1 + rng.IntN(3) {
			o.Items = append(o.Items, fmt.Sprintf("SKU-%02d", rng.IntN(50)))
		}
		s.Unique[id] = o
		ids = append(ids, id)
		s.Messages = append(s.Messages, Message{ID: id, Value: mustJSON(o)})
	}
	return s, nil
}

func mustJSON(o Order) []byte {
	b, err := json.Marshal(o)
	if err != nil {
		panic(err) // an Order always marshals
	}
	return b
}
