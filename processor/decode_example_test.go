package processor_test

import (
	"fmt"

	"github.com/onceflow/onceflow/processor"
)

// With IDFromOffset, the event id of a record is derived from where it is:
// the same record read again has the same id, so its redelivery is
// skipped; the same event produced twice is two records with two ids.
func ExampleOffsetID() {
	fmt.Println(processor.OffsetID("orders", 3, 42))
	fmt.Println(processor.OffsetID("orders", 3, 42) == processor.OffsetID("orders", 3, 43))
	// Output:
	// 5dfc2192-2560-5c70-965b-ca2d5512cde4
	// false
}
