package sink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// SQLHandlerConfig configures a [SQLHandler].
type SQLHandlerConfig struct {
	// Name is the handler's identity, its processed_events.handler value.
	// Required.
	Name string
	// SQL is one statement (INSERT, UPDATE, DELETE, MERGE or SELECT; it
	// may begin with its own WITH) over the relation events. Required.
	SQL string
	// Topics are the topics whose events the handler applies; empty means
	// every topic the Writer is given.
	Topics []string
	// RawValues says that record values are bytes, not JSON (the decoder's
	// processor.FormatBytes): events then has a value bytea column and
	// its payload is NULL.
	RawValues bool
}

// SQLHandler is a Handler whose effects are one SQL statement, run once per
// batch inside the batch's transaction, set-based: in the statement, the
// relation events holds exactly the events the handler newly claimed, in
// offset order, with the columns
//
//	event_id uuid, payload jsonb, key bytea, headers jsonb, topic text,
//	partition int, "offset" bigint, "timestamp" timestamptz
//
// and, with RawValues, value bytea (payload is then NULL). headers is a
// JSON object from each header's key to its value as a string (the last
// value of a repeated key; null for a value that is not UTF-8 text or
// holds a NUL byte). events is a common table expression over unnest of
// array parameters: the statement and the events travel in one round
// trip, and each connection prepares the statement once.
//
// A data error the statement raises (a failed cast, a violated
// constraint) makes the Writer isolate the events that cause it into dead
// letters; the others apply. A SQLHandler is immutable and safe for
// concurrent use.
type SQLHandler struct {
	name   string
	user   string // the statement as configured
	stmt   string // the statement run: user with the events CTE
	ins    int    // the CTE's position in stmt (bytes): user[:ins] precedes it
	insLen int    // the CTE's length (bytes)
	topics []string
	raw    bool
}

// NewSQLHandler returns the handler c describes. It does not touch the
// database: see [SQLHandler.Check].
func NewSQLHandler(c SQLHandlerConfig) (*SQLHandler, error) {
	var ps []error
	if c.Name == "" {
		ps = append(ps, errors.New("sink: SQLHandler: empty Name"))
	}
	if strings.TrimSpace(stripComments(c.SQL)) == "" {
		ps = append(ps, fmt.Errorf("sink: SQLHandler %q: empty SQL", c.Name))
	}
	if slices.Contains(c.Topics, "") {
		ps = append(ps, fmt.Errorf("sink: SQLHandler %q: an empty topic", c.Name))
	}
	if err := errors.Join(ps...); err != nil {
		return nil, err
	}
	h := &SQLHandler{name: c.Name, user: c.SQL, topics: slices.Clone(c.Topics), raw: c.RawValues}
	h.stmt, h.ins, h.insLen = compose(c.SQL, c.RawValues)
	return h, nil
}

// Name returns the handler's name.
func (h *SQLHandler) Name() string { return h.name }

// Consumes reports whether the handler applies events of topic: it
// implements [TopicFilter].
func (h *SQLHandler) Consumes(topic string) bool {
	return len(h.topics) == 0 || slices.Contains(h.topics, topic)
}

// Apply runs the statement over events in tx, in one round trip.
func (h *SQLHandler) Apply(ctx context.Context, tx pgx.Tx, events []Event) error {
	if len(events) == 0 {
		return nil
	}
	_, err := tx.Exec(ctx, h.stmt, h.args(events)...)
	return err
}

// TxBeginner is what [SQLHandler.Check] needs: a *pgxpool.Pool or a
// *pgx.Conn.
type TxBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Check asks Postgres whether the statement can run: in a transaction
// that it rolls back, it EXPLAINs the statement over an empty events, so
// the statement is parsed, its tables, columns, functions and types are
// resolved and its privileges checked, without running it. The error, a
// *SQLError, names the handler and carries Postgres' message with its
// position in the configured SQL.
func (h *SQLHandler) Check(ctx context.Context, db TxBeginner) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("check handler %q: %w", h.name, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // only ever rolled back
	rows, err := tx.Query(ctx, "EXPLAIN "+h.stmt, h.args(nil)...)
	if err == nil {
		rows.Close()
		err = rows.Err()
	}
	if err == nil {
		return nil
	}
	se := &SQLError{Handler: h.name, Err: err}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Position > 0 {
		se.Line, se.Column = h.position(int(pe.Position) - len([]rune("EXPLAIN ")))
	}
	return se
}

// SQLError is a SQL handler's statement that Postgres refuses.
type SQLError struct {
	Handler      string
	Line, Column int   // where in the configured SQL, from 1; 0 when unknown
	Err          error // Postgres' error (a *pgconn.PgError) or the connection's
}

func (e *SQLError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("handler %q: line %d column %d of its sql: %v", e.Handler, e.Line, e.Column, e.Err)
	}
	return fmt.Sprintf("handler %q: %v", e.Handler, e.Err)
}

func (e *SQLError) Unwrap() error { return e.Err }

// position maps a 1-based character position in stmt to a line and a
// column of the configured SQL; 0, 0 when it falls in the events CTE.
func (h *SQLHandler) position(p int) (line, col int) {
	before := utf8.RuneCountInString(h.stmt[:h.ins])
	cte := utf8.RuneCountInString(h.stmt[h.ins : h.ins+h.insLen])
	switch {
	case p < 1:
		return 0, 0
	case p > before && p <= before+cte:
		return 0, 0
	case p > before+cte:
		p -= cte
	}
	line, col = 1, 1
	for i, r := range []rune(h.user) {
		if i+1 == p {
			return line, col
		}
		if r == '\n' {
			line, col = line+1, 1
		} else {
			col++
		}
	}
	return 0, 0
}

// eventsColumns is the events relation, over the array parameters $1…$8
// ($9: value, with RawValues).
const eventsColumns = `SELECT * FROM unnest($1::uuid[], $2::jsonb[], $3::bytea[], $4::jsonb[], $5::text[], $6::int[], $7::bigint[], $8::timestamptz[]%s)
    AS e(event_id, payload, key, headers, topic, partition, "offset", "timestamp"%s)`

// compose returns the statement that runs sql with the events CTE, the
// byte offset where the CTE was inserted and its length. A statement that
// begins with WITH [RECURSIVE] gets events as its first CTE; any other is
// prefixed with WITH events AS (…).
func compose(sql string, raw bool) (stmt string, at, n int) {
	cols := fmt.Sprintf(eventsColumns, "", "")
	if raw {
		cols = fmt.Sprintf(eventsColumns, ", $9::bytea[]", ", value")
	}
	cte := "events AS (" + cols + ")"
	i := skipSpace(sql, 0)
	if j, ok := keyword(sql, i, "with"); ok {
		if k, ok := keyword(sql, skipSpace(sql, j), "recursive"); ok {
			j = k
		}
		ins := " " + cte + ",\n"
		return sql[:j] + ins + sql[j:], j, len(ins)
	}
	ins := "WITH " + cte + "\n"
	return ins + sql, 0, len(ins)
}

// skipSpace returns the index of the first byte of s at or after i that
// is neither white space nor in a comment.
func skipSpace(s string, i int) int {
	for i < len(s) {
		switch {
		case s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r' || s[i] == '\f':
			i++
		case strings.HasPrefix(s[i:], "--"):
			nl := strings.IndexByte(s[i:], '\n')
			if nl < 0 {
				return len(s)
			}
			i += nl + 1
		case strings.HasPrefix(s[i:], "/*"):
			depth := 0 // Postgres' block comments nest
			for i < len(s) {
				if strings.HasPrefix(s[i:], "/*") {
					depth, i = depth+1, i+2
				} else if strings.HasPrefix(s[i:], "*/") {
					depth, i = depth-1, i+2
					if depth == 0 {
						break
					}
				} else {
					i++
				}
			}
		default:
			return i
		}
	}
	return i
}

// stripComments is s without its leading comments, for emptiness checks.
func stripComments(s string) string { return s[skipSpace(s, 0):] }

// keyword reports whether s has the keyword kw (lower case) at i, not
// followed by an identifier character, and returns the index after it.
func keyword(s string, i int, kw string) (int, bool) {
	j := i + len(kw)
	if j > len(s) || !strings.EqualFold(s[i:j], kw) {
		return 0, false
	}
	if j < len(s) {
		r, _ := utf8.DecodeRuneInString(s[j:])
		if r == '_' || r == '$' || unicode.IsLetter(r) || unicode.IsDigit(r) {
			return 0, false
		}
	}
	return j, true
}

// args are the statement's parameters for events, in binary encodings.
func (h *SQLHandler) args(events []Event) []any {
	n := len(events)
	// pgtype.UUID: binary where the statement is described, and text under
	// the exec and simple_protocol query modes, where arrays of [16]byte
	// or uuid.UUID have no encoding.
	ids := make([]pgtype.UUID, n)
	// json.RawMessage, not []byte, for the jsonb columns: under the exec
	// and simple_protocol query modes a []byte is sent as a bytea literal,
	// which jsonb refuses.
	payloads := make([]json.RawMessage, n)
	keys := make([][]byte, n)
	headers := make([]json.RawMessage, n)
	topics := make([]string, n)
	parts := make([]int32, n)
	offsets := make([]int64, n)
	times := make([]pgtype.Timestamptz, n)
	for i, e := range events {
		ids[i] = pgtype.UUID{Bytes: e.ID, Valid: true}
		if !h.raw {
			payloads[i] = e.Value
		}
		keys[i], headers[i] = e.Key, headersJSON(e.Headers)
		topics[i], parts[i], offsets[i] = e.Topic, e.Partition, e.Offset
		times[i] = pgtype.Timestamptz{Time: e.Timestamp, Valid: !e.Timestamp.IsZero()}
	}
	args := []any{ids, payloads, keys, headers, topics, parts, offsets, times} // jsonb: each raw JSON, nil is NULL
	if h.raw {
		values := make([][]byte, n)
		for i, e := range events {
			values[i] = e.Value
		}
		args = append(args, values)
	}
	return args
}

func headersJSON(hs []Header) []byte {
	if len(hs) == 0 {
		return []byte("{}")
	}
	m := make(map[string]*string, len(hs))
	for _, h := range hs {
		if strings.ContainsRune(h.Key, 0) { // jsonb cannot hold it
			continue
		}
		if utf8.Valid(h.Value) && !strings.ContainsRune(string(h.Value), 0) {
			v := string(h.Value)
			m[h.Key] = &v
		} else {
			m[h.Key] = nil
		}
	}
	b, err := json.Marshal(m)
	if err != nil { // cannot happen: strings and nulls only
		return []byte("{}")
	}
	return b
}
