package main

import (
	"testing"

	"github.com/onceflow/onceflow/config"
	"github.com/onceflow/onceflow/processor"
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
