package dedup

import (
	"context"
	"encoding/binary"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Postgres type oids of the parameters a claim sends.
const (
	oidText      = 25
	oidInt4      = 23
	oidUUIDArray = 2951
	oidTextArray = 1009
	oidByteaArr  = 1001
	oidUUID      = 2950
	oidBytea     = 17
)

// binaryParams are a statement's parameters in Postgres' binary format,
// encoded into one buffer (from copyBufs, returned by release): pgx's
// query builder drops a parameter buffer over 256 bytes after each
// statement and grows the next one from 256 bytes, so a claim's arrays (a
// thousand ids, handlers and digests) allocated their size about twice,
// a third of what a steady stream allocated (benchmarks/PROFILE.md).
type binaryParams struct {
	buf  []byte
	ends []int // ends[k]: where parameter k ends in buf; -1: NULL
	oids []uint32
}

func newBinaryParams(size int) *binaryParams {
	return &binaryParams{buf: getCopyBuf(size)}
}

// end closes parameter k, of type oid, at the buffer's end.
func (p *binaryParams) end(oid uint32) {
	p.ends = append(p.ends, len(p.buf))
	p.oids = append(p.oids, oid)
}

func (p *binaryParams) text(s string) {
	p.buf = append(p.buf, s...)
	p.end(oidText)
}

// nullableText is s, NULL when s is nil.
func (p *binaryParams) nullableText(s *string) {
	if s == nil {
		p.ends = append(p.ends, -1)
		p.oids = append(p.oids, oidText)
		return
	}
	p.text(*s)
}

func (p *binaryParams) int4(v int32) {
	p.buf = binary.BigEndian.AppendUint32(p.buf, uint32(v))
	p.end(oidInt4)
}

// array writes the header of a one-dimensional array of n elements of
// type elem; hasNull says whether an element is NULL. The elements follow,
// each by element.
func (p *binaryParams) array(n int, elem uint32, hasNull bool) {
	flags := uint32(0)
	if hasNull {
		flags = 1
	}
	p.buf = binary.BigEndian.AppendUint32(p.buf, 1) // dimensions
	p.buf = binary.BigEndian.AppendUint32(p.buf, flags)
	p.buf = binary.BigEndian.AppendUint32(p.buf, elem)
	p.buf = binary.BigEndian.AppendUint32(p.buf, uint32(n)) // length
	p.buf = binary.BigEndian.AppendUint32(p.buf, 1)         // lower bound
}

// element appends an array element; nil is NULL.
func (p *binaryParams) element(v []byte) {
	if v == nil {
		p.buf = binary.BigEndian.AppendUint32(p.buf, 0xffffffff)
		return
	}
	p.buf = binary.BigEndian.AppendUint32(p.buf, uint32(len(v)))
	p.buf = append(p.buf, v...)
}

// textElement appends a text array element.
func (p *binaryParams) textElement(s string) {
	p.buf = binary.BigEndian.AppendUint32(p.buf, uint32(len(s)))
	p.buf = append(p.buf, s...)
}

// values returns the parameters as pgconn takes them, slices of buf.
func (p *binaryParams) values() [][]byte {
	vs := make([][]byte, len(p.ends))
	start := 0
	for k, e := range p.ends {
		if e < 0 {
			continue // NULL
		}
		vs[k] = p.buf[start:e:e]
		start = e
	}
	return vs
}

// release returns the buffer for a later statement.
func (p *binaryParams) release() { putCopyBuf(p.buf) }

// binaryFormats is every parameter and result column in binary.
var binaryFormats = []int16{pgx.BinaryFormatCode}

// binaryConn is q's connection when statements can be sent on it with
// parameters encoded here: a pgx transaction whose connection uses the
// extended protocol. Under QueryExecModeSimpleProtocol (a DSN's
// default_query_exec_mode behind a pooler that takes only the simple
// protocol) it reports false, and the caller goes through pgx.
func binaryConn(q Querier) (*pgconn.PgConn, bool) {
	cq, ok := q.(interface{ Conn() *pgx.Conn })
	if !ok {
		return nil, false
	}
	conn := cq.Conn()
	if conn.Config().DefaultQueryExecMode == pgx.QueryExecModeSimpleProtocol {
		return nil, false
	}
	return conn.PgConn(), true
}

// execBinary runs sql on conn with p, all in binary, results in binary,
// under a span named as otelpgx names pgx's (the statement's first word),
// and returns its rows; the caller closes them. The statement is parsed
// unnamed, as QueryExecModeExec does: no prepared statement is left on
// the connection (a transaction pooler's server connection changes
// between transactions).
func execBinary(ctx context.Context, conn *pgconn.PgConn, op, sql string, p *binaryParams, rows int) *resultRows {
	ctx, span := trace.SpanFromContext(ctx).TracerProvider().Tracer("github.com/onceflow/onceflow/dedup").Start(ctx, op,
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("db.query.text", sql), attribute.Int("onceflow.rows", rows)))
	rr := conn.ExecParams(ctx, sql, p.values(), p.oids, binaryFormats, binaryFormats)
	return &resultRows{rr: rr, span: span}
}

// resultRows reads a pgconn result as the rows readers here take them
// (pgx.Rows' methods they use).
type resultRows struct {
	rr     *pgconn.ResultReader
	span   trace.Span
	closed bool
	err    error
}

func (r *resultRows) Next() bool                                   { return !r.closed && r.rr.NextRow() }
func (r *resultRows) RawValues() [][]byte                          { return r.rr.Values() }
func (r *resultRows) FieldDescriptions() []pgconn.FieldDescription { return r.rr.FieldDescriptions() }

// Close ends the result and its span.
func (r *resultRows) Close() {
	if r.closed {
		return
	}
	r.closed = true
	_, r.err = r.rr.Close()
	if r.err != nil {
		r.span.SetStatus(codes.Error, r.err.Error())
	}
	r.span.End()
}

// Err closes the result and returns its error.
func (r *resultRows) Err() error {
	r.Close()
	return r.err
}
