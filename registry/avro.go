package registry

// Avro values are read by walking the writer schema that
// github.com/hamba/avro/v2 parsed (named types, references, logical types
// resolved), writing JSON as the bytes are read. hamba/avro was chosen over
// github.com/twmb/avro for its parser: mature, it resolves named types
// across referenced schemas through a SchemaCache and knows every logical
// type of the specification. Its own generic decoding (into any) is not
// used because its shape depends on the schema: a union's branch comes
// back bare when it is a primitive but wrapped as {"full.Name": value}
// when it is a record, enum or fixed, and decimals, dates and durations
// come back as Go values that encoding/json would write differently again.
// One walk of the schema gives the payload one shape, the table in
// docs/sql-handlers.md, and writes it without an intermediate map.

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/hamba/avro/v2"
)

// maxDepth bounds how deep a value nests (records in records, arrays of
// arrays): a recursive schema may describe any depth.
const maxDepth = 100

// maxZeroSizeItems bounds the items of one array or map block whose items
// may take no bytes (null, an empty record): a few bytes could otherwise
// announce billions of them.
const maxZeroSizeItems = 1 << 16

// avroReader reads one Avro binary value.
type avroReader struct {
	b   []byte
	pos int
	out []byte
	err string // the first problem; reading stops at it
}

func (s *schema) decodeAvro(body []byte) ([]byte, error) {
	r := &avroReader{b: body, out: make([]byte, 0, 2*len(body)+16)}
	r.value(s.avro, 0)
	if r.err == "" && r.pos != len(r.b) {
		r.err = fmt.Sprintf("%d bytes left after the value: the body is corrupt or written with another schema", len(r.b)-r.pos)
	}
	if r.err != "" {
		return nil, s.dataError("%s", r.err)
	}
	return r.out, nil
}

func (r *avroReader) fail(format string, args ...any) {
	if r.err == "" {
		r.err = fmt.Sprintf(format, args...)
	}
}

func (r *avroReader) truncated(what string) {
	r.fail("the body is truncated: it ends inside %s at byte %d", what, r.pos)
}

// long reads a zig-zag varint.
func (r *avroReader) long(what string) int64 {
	if r.err != "" {
		return 0
	}
	u, n := binary.Uvarint(r.b[r.pos:])
	switch {
	case n == 0:
		r.truncated(what)
		return 0
	case n < 0:
		r.fail("%s at byte %d is not a valid varint", what, r.pos)
		return 0
	}
	r.pos += n
	return int64(u>>1) ^ -int64(u&1)
}

func (r *avroReader) int(what string) int32 {
	v := r.long(what)
	if v < math.MinInt32 || v > math.MaxInt32 {
		r.fail("%s %d is out of the int range", what, v)
	}
	return int32(v)
}

func (r *avroReader) fixed(n int, what string) []byte {
	if r.err != "" {
		return nil
	}
	if n < 0 || len(r.b)-r.pos < n {
		r.truncated(what)
		return nil
	}
	b := r.b[r.pos : r.pos+n]
	r.pos += n
	return b
}

func (r *avroReader) bytes(what string) []byte {
	n := r.long(what + "'s length")
	if r.err == "" && n < 0 {
		r.fail("%s has a negative length %d", what, n)
		return nil
	}
	if n > int64(len(r.b)-r.pos) {
		r.truncated(what)
		return nil
	}
	return r.fixed(int(n), what)
}

func (r *avroReader) string(what string) string {
	b := r.bytes(what)
	if r.err != "" {
		return ""
	}
	if !utf8.Valid(b) {
		r.fail("%s is not valid UTF-8", what)
	}
	return string(b)
}

// dayMillis is the milliseconds of a day: a time-millis is below it.
const dayMillis = 24 * 60 * 60 * 1000

// time writes t, a date or timestamp of type logical, in layout. A year
// before 1 fails: Go would write it as year 0000 or -0001, which
// Postgres's date and timestamp refuse, so a handler could not read it.
func (r *avroReader) time(logical avro.LogicalType, t time.Time, layout string) {
	t = t.UTC()
	if t.Year() < 1 {
		r.fail("%s %s is before year 1", logical, t.Format("2006-01-02"))
		return
	}
	r.out = appendQuoted(r.out, t.AppendFormat(nil, layout))
}

// timeOfDay writes v, a time of type logical counted in unit since
// midnight, in layout; a value outside the day (0 to day-1) fails rather
// than wrap.
func (r *avroReader) timeOfDay(logical avro.LogicalType, v, day int64, unit time.Duration, layout string) {
	if v < 0 || v >= day {
		r.fail("%s %d is outside the day (0 to %d)", logical, v, day-1)
		return
	}
	r.out = appendQuoted(r.out, time.Unix(0, 0).Add(time.Duration(v)*unit).UTC().AppendFormat(nil, layout))
}

// value reads one value of s and writes its JSON.
func (r *avroReader) value(s avro.Schema, depth int) {
	if r.err != "" {
		return
	}
	if depth > maxDepth {
		r.fail("the value nests deeper than %d", maxDepth)
		return
	}
	if ref, ok := s.(*avro.RefSchema); ok {
		s = ref.Schema()
	}
	switch s := s.(type) {
	case *avro.NullSchema:
		r.out = append(r.out, "null"...)
	case *avro.PrimitiveSchema:
		r.primitive(s)
	case *avro.RecordSchema:
		r.out = append(r.out, '{')
		for i, f := range s.Fields() {
			if i > 0 {
				r.out = append(r.out, ',')
			}
			r.out = appendJSONString(r.out, f.Name())
			r.out = append(r.out, ':')
			r.value(f.Type(), depth+1)
		}
		r.out = append(r.out, '}')
	case *avro.EnumSchema:
		i := r.int("enum " + s.FullName())
		if r.err == "" && (i < 0 || int(i) >= len(s.Symbols())) {
			r.fail("enum %s index %d is out of its %d symbols", s.FullName(), i, len(s.Symbols()))
		}
		if r.err == "" {
			r.out = appendJSONString(r.out, s.Symbols()[i])
		}
	case *avro.ArraySchema:
		r.out = append(r.out, '[')
		r.blocks("array", func(first bool) {
			if !first {
				r.out = append(r.out, ',')
			}
			r.value(s.Items(), depth+1)
		})
		r.out = append(r.out, ']')
	case *avro.MapSchema:
		r.out = append(r.out, '{')
		r.blocks("map", func(first bool) {
			if !first {
				r.out = append(r.out, ',')
			}
			k := r.string("map key")
			if r.err == "" && hasNUL(k) {
				r.fail(`a map key holds a NUL character (\u0000), which Postgres cannot store`)
			}
			if r.err != "" {
				return
			}
			r.out = appendJSONString(r.out, k)
			r.out = append(r.out, ':')
			r.value(s.Values(), depth+1)
		})
		r.out = append(r.out, '}')
	case *avro.UnionSchema:
		i := r.long("union branch")
		if r.err == "" && (i < 0 || i >= int64(len(s.Types()))) {
			r.fail("union branch %d is out of its %d types", i, len(s.Types()))
		}
		if r.err == "" {
			r.value(s.Types()[i], depth+1)
		}
	case *avro.FixedSchema:
		b := r.fixed(s.Size(), "fixed "+s.FullName())
		if r.err != "" {
			return
		}
		switch l := s.Logical(); {
		case l != nil && l.Type() == avro.Decimal:
			r.decimal(b, l.(*avro.DecimalLogicalSchema).Scale())
		case l != nil && l.Type() == avro.Duration && len(b) == 12:
			r.out = fmt.Appendf(r.out, `{"months":%d,"days":%d,"milliseconds":%d}`,
				binary.LittleEndian.Uint32(b), binary.LittleEndian.Uint32(b[4:]), binary.LittleEndian.Uint32(b[8:]))
		default:
			r.out = appendBase64(r.out, b)
		}
	default:
		r.fail("schema type %s is not supported", s.Type())
	}
}

// blocks reads an array's or a map's blocks, calling item for each item.
func (r *avroReader) blocks(what string, item func(first bool)) {
	first := true
	for r.err == "" {
		n := r.long(what + " block count")
		if n == 0 || r.err != "" {
			return
		}
		if n < 0 {
			n = -n
			r.long(what + " block size") // the block's byte size, for skipping; not needed
		}
		if n < 0 { // it was math.MinInt64
			r.fail("%s block count is out of range", what)
			return
		}
		if n > int64(len(r.b)-r.pos) && n > maxZeroSizeItems {
			r.fail("%s block announces %d items in %d bytes left", what, n, len(r.b)-r.pos)
			return
		}
		for range n {
			if r.err != "" {
				return
			}
			item(first)
			first = false
		}
	}
}

func (r *avroReader) primitive(s *avro.PrimitiveSchema) {
	var logical avro.LogicalType
	if l := s.Logical(); l != nil {
		logical = l.Type()
	}
	switch s.Type() {
	case avro.Boolean:
		b := r.fixed(1, "boolean")
		if r.err == "" {
			switch b[0] {
			case 0:
				r.out = append(r.out, "false"...)
			case 1:
				r.out = append(r.out, "true"...)
			default:
				r.fail("boolean byte 0x%02x is not 0 or 1", b[0])
			}
		}
	case avro.Int:
		v := r.int("int")
		if r.err != "" {
			return
		}
		switch logical {
		case avro.Date:
			r.time(logical, time.Unix(int64(v)*86400, 0), "2006-01-02")
		case avro.TimeMillis:
			r.timeOfDay(logical, int64(v), int64(dayMillis), time.Millisecond, "15:04:05.000")
		default:
			r.out = strconv.AppendInt(r.out, int64(v), 10)
		}
	case avro.Long:
		v := r.long("long")
		if r.err != "" {
			return
		}
		switch logical {
		case avro.TimeMicros:
			r.timeOfDay(logical, v, dayMillis*1000, time.Microsecond, "15:04:05.000000")
		case avro.TimestampMillis:
			r.time(logical, time.UnixMilli(v), "2006-01-02T15:04:05.000Z")
		case avro.TimestampMicros:
			r.time(logical, time.UnixMicro(v), "2006-01-02T15:04:05.000000Z")
		case avro.LocalTimestampMillis:
			r.time(logical, time.UnixMilli(v), "2006-01-02T15:04:05.000")
		case avro.LocalTimestampMicros:
			r.time(logical, time.UnixMicro(v), "2006-01-02T15:04:05.000000")
		default:
			r.out = strconv.AppendInt(r.out, v, 10)
		}
	case avro.Float:
		b := r.fixed(4, "float")
		if r.err == "" {
			r.out = appendFloat(r.out, float64(math.Float32frombits(binary.LittleEndian.Uint32(b))), 32)
		}
	case avro.Double:
		b := r.fixed(8, "double")
		if r.err == "" {
			r.out = appendFloat(r.out, math.Float64frombits(binary.LittleEndian.Uint64(b)), 64)
		}
	case avro.String:
		v := r.string("string")
		if r.err != "" {
			return
		}
		if hasNUL(v) {
			r.fail(`a string holds a NUL character (\u0000), which Postgres cannot store`)
			return
		}
		r.out = appendJSONString(r.out, v)
	case avro.Bytes:
		b := r.bytes("bytes")
		if r.err != "" {
			return
		}
		if logical == avro.Decimal {
			r.decimal(b, s.Logical().(*avro.DecimalLogicalSchema).Scale())
			return
		}
		r.out = appendBase64(r.out, b)
	case avro.Null:
		r.out = append(r.out, "null"...)
	default:
		r.fail("primitive type %s is not supported", s.Type())
	}
}

// decimal writes the two's-complement big-endian unscaled value b at scale
// as an exact JSON number.
func (r *avroReader) decimal(b []byte, scale int) {
	if len(b) == 0 {
		r.fail("decimal has no bytes")
		return
	}
	n := new(big.Int).SetBytes(b)
	if b[0]&0x80 != 0 { // negative: n - 2^(8·len)
		n.Sub(n, new(big.Int).Lsh(big.NewInt(1), uint(len(b)*8)))
		r.out = append(r.out, '-')
	}
	digits := n.Abs(n).String()
	if scale <= 0 {
		r.out = append(r.out, digits...)
		return
	}
	for len(digits) <= scale {
		digits = "0" + digits
	}
	r.out = append(r.out, digits[:len(digits)-scale]...)
	r.out = append(r.out, '.')
	r.out = append(r.out, digits[len(digits)-scale:]...)
}

func appendQuoted(dst, s []byte) []byte {
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"')
}

func appendBase64(dst, b []byte) []byte {
	dst = append(dst, '"')
	dst = base64.StdEncoding.AppendEncode(dst, b)
	return append(dst, '"')
}

// appendFloat writes f as a JSON number, or NaN and the infinities as the
// strings "NaN", "Infinity" and "-Infinity" (as protojson does).
func appendFloat(dst []byte, f float64, bits int) []byte {
	switch {
	case math.IsNaN(f):
		return append(dst, `"NaN"`...)
	case math.IsInf(f, 1):
		return append(dst, `"Infinity"`...)
	case math.IsInf(f, -1):
		return append(dst, `"-Infinity"`...)
	}
	return strconv.AppendFloat(dst, f, 'g', -1, bits)
}

func hasNUL(s string) bool {
	for i := range len(s) {
		if s[i] == 0 {
			return true
		}
	}
	return false
}

// appendJSONString writes s, valid UTF-8, as a JSON string.
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		start = i + 1
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
