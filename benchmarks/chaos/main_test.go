package main

import (
	"testing"

	"go.uber.org/goleak"
)

// The proxy's links and the cut toxic's drains must end with their
// connections.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
