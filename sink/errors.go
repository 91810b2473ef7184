package sink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrFenced is returned (wrapped in a *FencedError) when a batch's offset
// compare-and-set finds that sink_offsets no longer holds the offset the
// batch was built against: another member, or an earlier attempt whose
// COMMIT outcome was unknown, advanced the partition. Nothing of the batch
// was written. The caller must re-read the stored offset ([Writer.StoredOffsets])
// and resume from it.
var ErrFenced = errors.New("offset fenced")

// FencedError describes a failed offset compare-and-set.
type FencedError struct {
	Group     string
	Topic     string
	Partition int32
	Fence     int64 // the stored offset the batch expected (-1: no row)
}

func (e *FencedError) Error() string {
	return fmt.Sprintf("group %s topic %s partition %d: stored offset is no longer %d: %v",
		e.Group, e.Topic, e.Partition, e.Fence, ErrFenced)
}

// Unwrap makes errors.Is(err, ErrFenced) true.
func (e *FencedError) Unwrap() error { return ErrFenced }

// RejectError is what a Handler returns (possibly wrapped) for an event it
// can never apply, such as a payload that does not describe a valid order.
// The Writer rolls the transaction back, turns the event into a dead letter
// with Reason, and retries the batch without it.
type RejectError struct {
	EventID uuid.UUID
	Reason  string
}

func (e *RejectError) Error() string {
	return fmt.Sprintf("event %s rejected: %s", e.EventID, e.Reason)
}

// IsRetryable reports whether err is a transient failure after which the
// same batch may simply be written again: connection loss, serialization
// failure, deadlock, a server shutting down, a timeout. A fence, a rejected
// event or a canceled context is not retryable.
func IsRetryable(err error) bool {
	if err == nil || errors.Is(err, ErrFenced) || errors.Is(err, context.Canceled) {
		return false
	}
	var reject *RejectError
	if errors.As(err, &reject) {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) || pgconn.SafeToRetry(err) || pgconn.Timeout(err) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case pgErr.Code == "40001", pgErr.Code == "40P01": // serialization failure, deadlock
			return true
		case pgErr.Code[:2] == "08", pgErr.Code[:2] == "53", pgErr.Code[:2] == "57": // connection, resources, operator
			return true
		}
		return false
	}
	var connErr *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connErr) || errors.As(err, &netErr) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)
}
