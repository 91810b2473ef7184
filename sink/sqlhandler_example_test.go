package sink_test

import (
	"fmt"
	"log"

	"github.com/onceflow/onceflow/sink"
)

// A SQL handler is a sink.Handler like any other: give it to sink.New in
// Config.Handlers, after checking it against the database with Check.
func ExampleNewSQLHandler() {
	h, err := sink.NewSQLHandler(sink.SQLHandlerConfig{
		Name:   "shipments",
		Topics: []string{"orders"},
		SQL: `INSERT INTO shipments (event_id, user_id, items)
SELECT event_id, (payload->>'user_id')::bigint, jsonb_array_length(payload->'items')
FROM events`,
	})
	if err != nil {
		log.Fatal(err)
	}
	// if err := h.Check(ctx, pool); err != nil { … } // a typo fails here, naming the handler
	fmt.Println(h.Name(), h.Consumes("orders"), h.Consumes("payments"))
	// Output: shipments true false
}
