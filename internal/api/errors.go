package api

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/sink"
	"github.com/onceflow/onceflow/wire"
)

// callTimeout bounds the Postgres work of a request that no outbox.Store
// call bounds (an audit).
const callTimeout = 5 * time.Second

// retryAfter is the Retry-After, in seconds, of a 503.
const retryAfter = "1"

// maxMessage bounds the Postgres message an answer repeats: its detail may
// echo the caller's row.
const maxMessage = 1000

// failure is the answer to a request whose Postgres work failed.
type failure struct {
	status int
	msg    string
}

// classify decides whose fault err is, for a request whose Postgres work
// (what) failed with it. It is the one place where the API does:
//
//   - transient (see sink.Classify: Postgres unreachable, restarting or
//     out of resources, a timeout, a serialization failure or a deadlock)
//     and a request canceled: 503, to be tried again (Retry-After);
//   - when input is true, the caller's data refused by Postgres: a data
//     exception (SQLSTATE class 22) is 400; a unique or exclusion
//     violation (23505, 23P01), a conflict with what is stored, is 409; any
//     other integrity violation (class 23), a program limit (class 54), an
//     error raised by a trigger (class P0) or a cardinality violation
//     (21000) is 422. The message names the SQLSTATE and Postgres' words;
//   - anything else, a data class where the caller sent no data (input
//     false) included, is the server's fault: 500.
func classify(what string, err error, input bool) failure {
	switch sink.Classify(err) {
	case sink.Transient:
		return failure{http.StatusServiceUnavailable, fmt.Sprintf("%s: Postgres is unavailable, try again: %v", what, err)}
	case sink.Canceled:
		return failure{http.StatusServiceUnavailable, fmt.Sprintf("%s: canceled: %v", what, err)}
	case sink.Data:
		var pgErr *pgconn.PgError
		if !input || !errors.As(err, &pgErr) {
			break
		}
		msg := err.Error()
		if pgErr.Detail != "" {
			msg += ": " + pgErr.Detail
		}
		if len(msg) > maxMessage {
			msg = strings.ToValidUTF8(msg[:maxMessage], "") + "…"
		}
		status := http.StatusUnprocessableEntity
		switch {
		case strings.HasPrefix(pgErr.Code, "22"):
			status = http.StatusBadRequest
		case pgErr.Code == "23505" || pgErr.Code == "23P01":
			status = http.StatusConflict
		}
		return failure{status, fmt.Sprintf("%s refused by Postgres: %s", what, msg)}
	}
	return failure{http.StatusInternalServerError, fmt.Sprintf("%s: %v", what, err)}
}

// fail answers a request whose Postgres work (what) failed with err, as
// classify says; input says whether the request's data was written. A
// failure that is not the caller's is logged.
func (s *Seed) fail(w http.ResponseWriter, r *http.Request, what string, err error, input bool) {
	f := classify(what, err, input)
	switch {
	case f.status == http.StatusServiceUnavailable:
		w.Header().Set("Retry-After", retryAfter)
		s.log.Warn("api: postgres unavailable", "method", r.Method, "path", r.URL.Path, "status", f.status, "err", err)
	case f.status >= 500:
		s.log.Error("api: request failed", "method", r.Method, "path", r.URL.Path, "status", f.status, "err", err)
	}
	writeError(w, f.status, "%s", f.msg)
}

// checkBody refuses a body Postgres could not store, or that the consumer
// would dead-letter before reading it (package processor's Decode): empty,
// with a NUL byte, not UTF-8, or with a \u0000 escape. Parse judges the
// rest; the storable query, what only Postgres knows (a number beyond
// numeric's range).
func checkBody(body []byte) error {
	switch {
	case len(bytes.TrimSpace(body)) == 0:
		return errors.New("body is empty")
	case bytes.IndexByte(body, 0) >= 0:
		return fmt.Errorf("body contains a NUL byte (at byte %d), which Postgres cannot store", bytes.IndexByte(body, 0))
	case !utf8.Valid(body):
		return fmt.Errorf("body is not valid UTF-8 (from byte %d)", invalidUTF8At(body))
	case wire.HasNULEscape(body):
		return errors.New(`body contains \u0000, which Postgres cannot store`)
	}
	return nil
}

// invalidUTF8At is the offset of the first byte of b that is not valid
// UTF-8.
func invalidUTF8At(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n <= 1 {
			return i
		}
		i += n
	}
	return len(b)
}

// storable is the query that has Postgres parse a body as jsonb, as the
// consumer's events relation will: its error is a data exception when
// Postgres cannot store the body.
const storable = `SELECT $1::text::jsonb IS NULL`

// short quotes what a caller sent for an answer: at most 64 bytes of it,
// and its length when it is longer.
func short(s string) string {
	if len(s) <= 64 {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%q… (%d bytes)", strings.ToValidUTF8(s[:64], ""), len(s))
}

// methodNotAllowed answers a method a route does not serve, naming the
// ones it does.
func methodNotAllowed(route, allow string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allow)
		writeError(w, http.StatusMethodNotAllowed, "method %s is not allowed on %s: use %s", r.Method, route, allow)
	}
}
