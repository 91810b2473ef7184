package processor

import (
	"fmt"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
)

// Only a refusal for the member's epoch is one that costs nothing.
func TestEpochRefused(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{kerr.StaleMemberEpoch, true},
		{kerr.FencedMemberEpoch, true},
		{fmt.Errorf("commit: %w", kerr.StaleMemberEpoch), true},
		{kerr.UnknownMemberID, false},
		{kerr.IllegalGeneration, false},
		{kerr.RebalanceInProgress, false},
		{kerr.UnknownTopicOrPartition, false},
		{nil, false},
	} {
		if got := epochRefused(tc.err); got != tc.want {
			t.Errorf("epochRefused(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// A partition's refusal is said once per epoch: again at a new epoch, and
// for each partition.
func TestCommitNotesSayOncePerPartitionAndEpoch(t *testing.T) {
	var n commitNotes
	p0, p1 := tp{"t", 0}, tp{"t", 1}
	for i, tc := range []struct {
		k     tp
		epoch int32
		want  bool
	}{
		{p0, 3, true}, {p0, 3, false}, {p1, 3, true}, {p0, 3, false}, {p0, 4, true}, {p0, 4, false}, {p1, 3, false},
	} {
		if got := n.first(tc.k, tc.epoch); got != tc.want {
			t.Errorf("call %d: first(%v, %d) = %v, want %v", i, tc.k, tc.epoch, got, tc.want)
		}
	}
}
