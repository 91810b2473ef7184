package sink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrFenced is returned (wrapped in a *FencedError) when a batch's offset
// compare-and-set finds that sink_offsets no longer holds the epoch and
// offset the batch was built against. Nothing of the batch was written.
//
// When the stored epoch is the batch's own and the stored offset is the
// batch's NextOffset, an earlier attempt of this very batch committed (its
// COMMIT outcome was unknown to the caller): see [FencedError.Committed].
// Otherwise another writer took the partition: the caller must stop
// writing it, and never adopt the other writer's offset.
var ErrFenced = errors.New("offset fenced")

// FencedError describes a failed offset compare-and-set: what the batch
// expected and what sink_offsets held.
type FencedError struct {
	Group     string
	Topic     string
	Partition int32
	Epoch     int64 // the batch's epoch
	Fence     int64 // the stored offset the batch expected (-1: none)
	Next      int64 // the batch's NextOffset

	StoredEpoch  int64 // what sink_offsets held (-1 epoch: no row)
	StoredOffset int64 // -1: no offset
}

func (e *FencedError) Error() string {
	return fmt.Sprintf("group %s topic %s partition %d: batch of epoch %d expected stored offset %d, found epoch %d offset %d: %v",
		e.Group, e.Topic, e.Partition, e.Epoch, e.Fence, e.StoredEpoch, e.StoredOffset, ErrFenced)
}

// Unwrap makes errors.Is(err, ErrFenced) true.
func (e *FencedError) Unwrap() error { return ErrFenced }

// Committed reports whether the stored state is exactly what the batch
// itself would have written: same epoch, offset at the batch's end. Only
// the batch's own earlier attempt can have written it, so the batch is
// committed.
func (e *FencedError) Committed() bool {
	return e.StoredEpoch == e.Epoch && e.StoredOffset == e.Next
}

// RejectError is what a Handler returns (possibly wrapped) for an event it
// can never apply, such as a payload that does not describe a valid order.
// The Writer rolls back what the event did, turns it into a dead letter
// with Reason, and applies the rest of the batch. A handler that finds
// several such events in one batch returns them all, joined
// (errors.Join): they are set aside in one step, without bisecting.
type RejectError struct {
	EventID uuid.UUID
	Reason  string
}

func (e *RejectError) Error() string {
	return fmt.Sprintf("event %s rejected: %s", e.EventID, e.Reason)
}

// Class is the kind of a failed batch write, which decides what happens
// next. See [Classify].
type Class int

const (
	// Transient failures go away by themselves: the same batch is written
	// again after a backoff. Nothing is dead-lettered.
	Transient Class = iota
	// Data failures are caused by some events of the batch: the Writer
	// isolates those events into dead letters and applies the rest.
	Data
	// Fenced: another writer holds the partition; stop writing it.
	Fenced
	// Canceled: the caller's context ended; nothing more to do.
	Canceled
	// Unknown failures are neither transient by nature nor tied to
	// events: a handler's own error, a missing table or column, a
	// permission. They are retried with backoff and logged as errors, so
	// an operator can fix the cause; nothing is dead-lettered, so nothing
	// is lost when the cause is not the data.
	Unknown
)

func (c Class) String() string {
	switch c {
	case Transient:
		return "transient"
	case Data:
		return "data"
	case Fenced:
		return "fenced"
	case Canceled:
		return "canceled"
	}
	return "unknown"
}

// Classify returns the class of an error returned by [Writer.Write] or by a
// Handler. It is the one place where onceflow decides what is retried and
// what becomes a dead letter:
//
//   - Transient: lost or refused connections (SQLSTATE class 08, network
//     errors, EOF, a closed connection), the server shutting down or
//     starting (57P01-57P03), a connection the server ended for being idle
//     in a transaction, in a session or for a transaction's length (25P03
//     idle_in_transaction_session_timeout, as after a frozen process
//     resumes; 57P05 idle_session_timeout; 25P04 transaction_timeout),
//     whatever step of the batch met it, serialization failures and deadlocks (40001, 40P01, 40003), lock
//     and statement timeouts (55P03, 57014), insufficient resources (class
//     53), system and I/O errors (class 58), a read-only transaction during
//     a failover (25006), and the transaction's own deadline.
//   - Data: data exceptions (class 22), integrity violations (class 23),
//     program limits such as an index row too large (class 54),
//     cardinality violations (21000), errors raised by PL/pgSQL (class
//     P0, e.g. RAISE EXCEPTION in a trigger), and a [RejectError].
//   - Fenced: [ErrFenced]. Canceled: context.Canceled.
//   - Unknown: everything else.
func Classify(err error) Class {
	switch {
	case err == nil:
		return Unknown
	case errors.Is(err, ErrFenced):
		return Fenced
	}
	var ite *IsolationTimeoutError
	if errors.As(err, &ite) {
		return Transient
	}
	var reject *RejectError
	if errors.As(err, &reject) {
		return Data
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return classifySQLState(pgErr.Code)
	}
	switch {
	case errors.Is(err, context.Canceled):
		return Canceled
	case errors.Is(err, context.DeadlineExceeded), pgconn.Timeout(err), pgconn.SafeToRetry(err):
		return Transient
	}
	var connErr *pgconn.ConnectError
	var netErr net.Error
	if errors.As(err, &connErr) || errors.As(err, &netErr) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EPIPE) ||
		strings.Contains(err.Error(), "conn closed") {
		return Transient
	}
	return Unknown
}

func classifySQLState(code string) Class {
	if len(code) != 5 {
		return Unknown
	}
	switch code {
	case "40001", "40P01", "40003", "55P03", "57014", "25006",
		// The server ended the connection: shutting down or starting,
		// an administrator's pg_terminate_backend, or a timeout on an
		// idle transaction, an idle session, a transaction's length.
		"57P01", "57P02", "57P03", "25P03", "57P05", "25P04":
		return Transient
	case "21000":
		return Data
	}
	switch code[:2] {
	case "08", "53", "58":
		return Transient
	case "22", "23", "54", "P0":
		return Data
	}
	return Unknown
}

// IsTransient reports whether err is a transient failure after which the
// same batch may simply be written again.
func IsTransient(err error) bool { return Classify(err) == Transient }

// IsData reports whether err was caused by the data of some events, which
// the Writer isolates into dead letters.
func IsData(err error) bool { return Classify(err) == Data }

// IsTimeout reports whether err, a [Transient] failure, is a transaction
// that ran out of time: its own deadline ([Config.TxTimeout]) or a
// statement timeout (57014). It says nothing about the events: a caller
// retries, and may retry fewer events at a time, as processor does.
func IsTimeout(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	var ite *IsolationTimeoutError
	if errors.As(err, &ite) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "57014"
	}
	return errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err)
}

// reason is the dead-letter reason for an event that failed with err.
func reason(err error) string {
	var reject *RejectError
	if errors.As(err, &reject) {
		return "rejected: " + reject.Reason
	}
	var he *handlerError
	prefix := ""
	if errors.As(err, &he) {
		prefix = "handler " + he.handler + ": "
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		msg := pgErr.Message
		if pgErr.Detail != "" {
			msg += " (" + pgErr.Detail + ")"
		}
		return prefix + "SQLSTATE " + pgErr.Code + ": " + msg
	}
	return prefix + err.Error()
}

// handlerError is a handler's failure, with the handler's name.
type handlerError struct {
	handler string
	err     error
}

func (e *handlerError) Error() string { return "handler " + e.handler + ": " + e.err.Error() }
func (e *handlerError) Unwrap() error { return e.err }

// rejects returns every *RejectError in err's tree (errors.Join, %w).
func rejects(err error) []*RejectError {
	var out []*RejectError
	var walk func(error)
	walk = func(err error) {
		if err == nil {
			return
		}
		if r, ok := err.(*RejectError); ok {
			out = append(out, r)
			return
		}
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		}
	}
	walk(err)
	return out
}

// IsolationTimeoutError is a Write whose isolation of culprits (the
// batch's second transaction, or its first with [Batch.Isolate]) ran out of
// its transaction's time (Config.TxTimeout) before it committed: its round
// trips are long against TxTimeout, and halving the batch's events down to
// its first one, before any can be committed, took more of them than the
// transaction had. It is a [Transient] timeout ([IsTimeout]): the caller
// retries the batch smaller and with Batch.Isolate, which settles the
// events one by one from the first once a group fails, so that each
// transaction commits a prefix (Batch.AllowPrefix) as long as one event
// and the commit fit in TxTimeout.
type IsolationTimeoutError struct {
	TxTimeout time.Duration
	Err       error // what the isolation's transaction failed with
}

func (e *IsolationTimeoutError) Error() string {
	return fmt.Sprintf("isolating the batch's culprits ran out of its transaction's time (postgres.tx_timeout %v): %v", e.TxTimeout, e.Err)
}

func (e *IsolationTimeoutError) Unwrap() error { return e.Err }
