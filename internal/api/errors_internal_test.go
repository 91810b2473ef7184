package api

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// Each class of failure gets its status: the caller's data refused is a
// 4xx naming the SQLSTATE only where the caller sent data; what waiting
// cures is 503; the rest is the server's.
func TestClassify(t *testing.T) {
	pg := func(code string) error {
		return fmt.Errorf("insert order: %w", &pgconn.PgError{Code: code, Message: "msg " + code, Detail: "detail " + code})
	}
	for _, tc := range []struct {
		name  string
		err   error
		input bool
		want  int
	}{
		{"unsupported unicode escape", pg("22P05"), true, 400},
		{"invalid byte sequence", pg("22021"), true, 400},
		{"numeric out of range", pg("22003"), true, 400},
		{"unique violation", pg("23505"), true, 409},
		{"exclusion violation", pg("23P01"), true, 409},
		{"check violation", pg("23514"), true, 422},
		{"not null violation", pg("23502"), true, 422},
		{"index row too large", pg("54000"), true, 422},
		{"raised by a trigger", pg("P0001"), true, 422},
		{"data exception where no data was sent", pg("22P05"), false, 500},
		{"connection failure", pg("08006"), true, 503},
		{"deadlock", pg("40P01"), true, 503},
		{"serialization failure", pg("40001"), false, 503},
		{"statement timeout", pg("57014"), true, 503},
		{"admin shutdown", pg("57P01"), false, 503},
		{"too many connections", pg("53300"), false, 503},
		{"deadline", fmt.Errorf("enqueue: %w", context.DeadlineExceeded), true, 503},
		{"canceled", context.Canceled, true, 503},
		{"missing table", pg("42P01"), true, 500},
		{"permission", pg("42501"), true, 500},
		{"other", errors.New("boom"), true, 500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := classify("order", tc.err, tc.input)
			if f.status != tc.want {
				t.Errorf("status %d (%s), want %d", f.status, f.msg, tc.want)
			}
			var pgErr *pgconn.PgError
			if f.status < 500 && errors.As(tc.err, &pgErr) &&
				(!strings.Contains(f.msg, pgErr.Code) || !strings.Contains(f.msg, pgErr.Detail) || !strings.HasPrefix(f.msg, "order refused by Postgres")) {
				t.Errorf("message %q: want the SQLSTATE, Postgres' detail, and what was refused", f.msg)
			}
		})
	}
	long := &pgconn.PgError{Code: "23514", Message: "violates check", Detail: "Failing row contains (" + strings.Repeat("é", 1<<20) + ")"}
	if f := classify("order", long, true); len(f.msg) > maxMessage+100 {
		t.Errorf("a message of %d bytes: a detail echoing the row is cut", len(f.msg))
	}
}
