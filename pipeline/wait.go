package pipeline

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/sink"
)

// Backoff of the wait for Postgres.
const (
	waitFirst = 200 * time.Millisecond
	waitMax   = 5 * time.Second
	waitCall  = 10 * time.Second // bound of one attempt to connect
	// waitMigration bounds one attempt to migrate: an upgrade may rebuild
	// a large table's index (0005 rebuilds processed_events' primary key),
	// and a short bound would roll it back and start it again, for ever.
	waitMigration = time.Hour
)

// waiter runs the start's steps against one pool, waiting while Postgres
// is down.
//
// Waiting for Postgres is the library's, not the command's: a program
// that embeds onceflow is deployed like `onceflow run` — started by an
// orchestrator next to a database that may still be starting, restarted
// with it — and needs the same rule, written once: wait for what goes
// away by itself, fail at once on configuration. The command keeps only
// what is its own: the HTTP server whose /readyz shows the wait (through
// Runner.Ready), and the signals.
type waiter struct {
	where    string // host:port/database, never the password
	password string // removed from error messages
	log      *slog.Logger
}

func newWaiter(pool *pgxpool.Pool, log *slog.Logger) waiter {
	cc := pool.Config().ConnConfig
	return waiter{where: fmt.Sprintf("%s:%d/%s", cc.Host, cc.Port, cc.Database), password: cc.Password, log: log}
}

// wait runs f (a ping, a migration) until it succeeds, waiting with capped
// backoff while Postgres is down or starting, and logging what it waits
// for. An error that waiting cannot cure — a wrong password, an unknown
// database or role, a failing migration — is returned at once, as is
// ctx's end. Each attempt is bounded by bound (0: only by ctx).
func (w waiter) wait(ctx context.Context, what string, bound time.Duration, f func(context.Context) error) error {
	backoff := waitFirst
	for attempt := 1; ; attempt++ {
		cctx, cancel := ctx, context.CancelFunc(func() {})
		if bound > 0 {
			cctx, cancel = context.WithTimeout(ctx, bound)
		}
		err := f(cctx)
		cancel()
		switch {
		case err == nil:
			if attempt > 1 {
				w.log.Info("postgres answers", "step", what, "postgres", w.where)
			}
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case TLSProblem(err) != "":
			return fmt.Errorf("%s: postgres at %s: %s: %s", what, w.where, TLSProblem(err), w.redact(err))
		case !waitable(err):
			return fmt.Errorf("%s: postgres at %s: %s", what, w.where, w.redact(err))
		}
		w.log.Warn("waiting for postgres", "step", what, "postgres", w.where,
			"attempt", attempt, "retry_in", backoff, "err", w.redact(err))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, waitMax)
	}
}

// redact is err's message without the password.
func (w waiter) redact(err error) string {
	msg := err.Error()
	if w.password != "" {
		msg = strings.ReplaceAll(msg, w.password, "xxxxx")
	}
	return msg
}

// waitable reports whether err, from a call to Postgres at start, goes
// away by waiting: Postgres down, starting, restarting, or out of
// connections. Authentication failures and unknown database or role
// errors are configuration, not waited for; so is everything
// sink.IsTransient does not call transient.
func waitable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code[:2] {
		case "28", "3D": // invalid authorization, invalid catalog name
			return false
		}
	}
	return sink.IsTransient(err)
}

// TLSProblem says what to check when err, from connecting to Postgres, is
// a TLS failure that waiting does not cure — a server certificate that
// fails verification (an unknown CA, another host name, an expired
// certificate), a server that refuses TLS — or "" when it is not one.
func TLSProblem(err error) string {
	var (
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
	)
	switch {
	case errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &hostname) || errors.As(err, &invalid):
		return "TLS: the server's certificate is not trusted (check sslrootcert and the host in the DSN)"
	case strings.Contains(err.Error(), "server refused TLS connection"):
		return "TLS: the server does not accept TLS (check sslmode in the DSN)"
	}
	return ""
}
