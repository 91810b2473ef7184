package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// /readyz's postgres reason names what is wrong and no connection detail.
func TestPostgresDownSaysWhatWithoutWhere(t *testing.T) {
	wrap := func(err error) error {
		return fmt.Errorf("failed to connect to `user=alice database=orders`: 10.0.0.7:5432 (db.internal): %w", err)
	}
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"refused", wrap(&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}), "connection refused"},
		{"timeout", wrap(context.DeadlineExceeded), "no answer in time"},
		{"dns", wrap(&net.DNSError{Err: "no such host", Name: "db.internal"}), "host name does not resolve"},
		{"password", wrap(&pgconn.PgError{Code: "28P01", Message: `password authentication failed for user "alice"`}), "refuses the login (SQLSTATE 28P01"},
		{"no database", wrap(&pgconn.PgError{Code: "3D000", Message: `database "orders" does not exist`}), "database does not exist"},
		{"starting", wrap(&pgconn.PgError{Code: "57P03"}), "starting up"},
		{"other", wrap(errors.New("db.internal: something")), "postgres does not answer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := postgresDown(tc.err)
			if !strings.Contains(got, tc.want) {
				t.Errorf("postgresDown = %q, want it to say %q", got, tc.want)
			}
			for _, detail := range []string{"alice", "orders", "10.0.0.7", "5432", "db.internal"} {
				if strings.Contains(got, detail) {
					t.Errorf("postgresDown = %q: reveals %q", got, detail)
				}
			}
		})
	}
}
