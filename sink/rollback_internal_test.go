package sink

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// An isolation whose ROLLBACK TO SAVEPOINT timed out after a group's data
// error is a timeout, transient: the worker shrinks the batch and retries,
// it does not take the transaction's loss for the data's fault.
func TestRollbackFailedIsClassifiedByTheRollback(t *testing.T) {
	data := fmt.Errorf("handler pay: %w", &pgconn.PgError{Code: "22P02", Message: "invalid input syntax for type numeric"})
	err := rollbackFailed(fmt.Errorf("timeout: %w", context.DeadlineExceeded), data)
	if got := Classify(err); got != Transient {
		t.Errorf("Classify(%v) = %v, want transient", err, got)
	}
	if !IsTimeout(err) {
		t.Errorf("IsTimeout(%v) = false, want true", err)
	}
}
