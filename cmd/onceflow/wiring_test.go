package main

import (
	"testing"

	"github.com/onceflow/onceflow/internal/config"
	"github.com/onceflow/onceflow/internal/orders"
	"github.com/onceflow/onceflow/processor"
	"github.com/onceflow/onceflow/sink"
)

// The fetch sizes that bound a member's memory reach its consumer, from
// the defaults and from the environment.
func TestConsumerTuningFetchSizes(t *testing.T) {
	load := func(t *testing.T) processor.Config {
		t.Helper()
		cfg, err := config.Load("", nil, binds, config.Default{Key: "handlers", Value: registry.names})
		if err != nil {
			t.Fatal(err)
		}
		return (&app{cfg: cfg}).consumerTuning("m")
	}
	t.Run("defaults", func(t *testing.T) {
		c := load(t)
		if c.FetchMaxBytes != processor.DefaultFetchMaxBytes || c.FetchMaxPartitionBytes != processor.DefaultFetchMaxPartitionBytes {
			t.Errorf("fetch sizes = %d, %d, want %d, %d", c.FetchMaxBytes, c.FetchMaxPartitionBytes,
				processor.DefaultFetchMaxBytes, processor.DefaultFetchMaxPartitionBytes)
		}
	})
	t.Run("environment", func(t *testing.T) {
		t.Setenv("ONCEFLOW_KAFKA_FETCH_MAX_BYTES", "4194304")
		t.Setenv("ONCEFLOW_KAFKA_FETCH_MAX_PARTITION_BYTES", "262144")
		c := load(t)
		if c.FetchMaxBytes != 4<<20 || c.FetchMaxPartitionBytes != 256<<10 {
			t.Errorf("fetch sizes = %d, %d, want %d, %d", c.FetchMaxBytes, c.FetchMaxPartitionBytes, 4<<20, 256<<10)
		}
	})
}

// kafka.group_protocol and kafka.instance_id reach the consumer, from the
// defaults and from the environment.
func TestConsumerTuningGroupProtocol(t *testing.T) {
	load := func(t *testing.T) processor.Config {
		t.Helper()
		cfg, err := config.Load("", nil, binds, config.Default{Key: "handlers", Value: registry.names})
		if err != nil {
			t.Fatal(err)
		}
		return (&app{cfg: cfg}).consumerTuning("m")
	}
	t.Run("defaults", func(t *testing.T) {
		c := load(t)
		if c.GroupProtocol != processor.ClassicProtocol || c.InstanceID != "" {
			t.Errorf("group protocol, instance id = %q, %q, want %q, \"\"", c.GroupProtocol, c.InstanceID, processor.ClassicProtocol)
		}
	})
	t.Run("environment", func(t *testing.T) {
		t.Setenv("ONCEFLOW_KAFKA_GROUP_PROTOCOL", "consumer")
		t.Setenv("ONCEFLOW_KAFKA_INSTANCE_ID", "onceflow-0")
		c := load(t)
		if c.GroupProtocol != processor.ConsumerProtocol || c.InstanceID != "onceflow-0" {
			t.Errorf("group protocol, instance id = %q, %q, want consumer, onceflow-0", c.GroupProtocol, c.InstanceID)
		}
	})
}

// The demo's handlers share one parse of each order (sink.Config.Parse);
// a configuration of SQL handlers only gets none.
func TestWriterTuningParse(t *testing.T) {
	order := sink.Event{Value: []byte(`{"user_id":1,"items":["A"]}`)}
	for _, tc := range []struct {
		handlers []string
		parse    bool
	}{
		{registry.names, true},
		{[]string{orders.Inventory}, true},
		{[]string{}, false},
	} {
		a := &app{cfg: config.Config{Handlers: tc.handlers}}
		p := a.writerTuning().Parse
		if (p != nil) != tc.parse {
			t.Errorf("handlers %v: Parse set %v, want %v", tc.handlers, p != nil, tc.parse)
			continue
		}
		if p == nil {
			continue
		}
		if v, err := p(order); err != nil || v.(orders.Order).UserID != 1 {
			t.Errorf("handlers %v: Parse(order) = %v, %v; want the order", tc.handlers, v, err)
		}
	}
}
