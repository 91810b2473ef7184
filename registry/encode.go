package registry

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/bufbuild/protocompile"
	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

// Encoder is the producer's side of a Decoder: it registers one schema
// under a subject and turns JSON values — the payloads of the mapping a
// Decoder writes — into framed records of that schema. It is what
// `onceflow produce --format avro|protobuf` uses. Safe for concurrent use
// once made.
type Encoder struct {
	id    int
	kind  Kind
	avro  avro.Schema
	msg   protoreflect.MessageDescriptor
	index []int
}

// Source is the schema an Encoder writes with.
type Source struct {
	Kind Kind
	// Text is the schema: Avro JSON, or a .proto file.
	Text string
	// Path is the file Text was read from, named in errors; a .proto's
	// imports are resolved relative to its directory (google/protobuf/*
	// are built in). Empty: Text imports google/protobuf/* only.
	Path string
	// Message names the Protobuf message: relative to the file's package
	// as protoc resolves it (Order.Line), full (shop.Order.Line or
	// .shop.Order.Line), or its name alone when that is unique in the
	// file; default the file's first.
	Message string
}

// NewEncoder compiles src and registers it under subject at the registry
// cfg names (a schema already there keeps its id). Errors name what is
// wrong with src, or are the registry's (IsAuth, IsTransient).
func NewEncoder(ctx context.Context, cfg Config, subject string, src Source) (*Encoder, error) {
	e := &Encoder{kind: src.Kind}
	var (
		typ   sr.SchemaType
		files *protoFiles                 // Protobuf: the files read
		root  protoreflect.FileDescriptor // Protobuf: the compiled schema
	)
	switch src.Kind {
	case Avro:
		typ = sr.TypeAvro
		name := src.Path
		if name == "" {
			name = "avro schema"
		}
		s, err := avro.ParseWithCache(src.Text, "", &avro.SchemaCache{})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, avroSchemaError(src.Text, err))
		}
		e.avro = s
	case Protobuf:
		typ = sr.TypeProtobuf
		files = &protoFiles{self: "schema.proto", text: src.Text, read: map[string]string{}}
		if src.Path != "" {
			files.self, files.dir = filepath.Base(src.Path), filepath.Dir(src.Path)
		}
		c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{Accessor: files.open})}
		compiled, err := c.Compile(ctx, files.self)
		if err != nil {
			return nil, fmt.Errorf("protobuf schema: %w", err)
		}
		root = compiled[0]
		if e.msg, e.index, err = findMessage(root, src.Message); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("registry: unknown kind %q", src.Kind)
	}
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d, err := New(cfg)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	rctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	schema := sr.Schema{Schema: src.Text, Type: typ}
	if files != nil {
		refs := map[string]sr.SchemaReference{}
		if schema.References, err = files.register(ctx, d.cl, d.timeout, root, refs); err != nil {
			return nil, err
		}
	}
	ss, err := createSchema(rctx, d.cl, subject, schema)
	if err != nil {
		return nil, fmt.Errorf("register the schema under subject %s: %w", subject, classify(err, false, 0, false))
	}
	e.id = ss.ID
	return e, nil
}

// createSchema registers schema under subject. A registration the
// registry refuses with 409 stands as registered if the very schema is
// there under the subject. Apicurio answers "An artifact with ID … already
// exists" to registrations of a new subject that lose the race to create
// it, and "An artifact version … already exists" to those that lose the
// race to add a version, where a Confluent registry gives the existing
// schema's id or adds a version: while the refusals say "already exists"
// and the schema is not there, the registration is made again, up to
// createAttempts times. Any other refusal (an incompatible schema, also
// 409; auth; the registry's own failure) is returned at once.
func createSchema(ctx context.Context, cl *sr.Client, subject string, schema sr.Schema) (sr.SubjectSchema, error) {
	for attempt := 1; ; attempt++ {
		ss, err := cl.CreateSchema(ctx, subject, schema)
		var re *sr.ResponseError
		if err == nil || !errors.As(err, &re) || re.StatusCode != http.StatusConflict {
			return ss, err
		}
		if found, lerr := cl.LookupSchema(ctx, subject, schema); lerr == nil {
			return found, nil
		}
		if attempt == createAttempts || !strings.Contains(re.Message, "already exists") {
			return ss, err
		}
		select {
		case <-ctx.Done():
			return ss, err
		case <-time.After(time.Duration(attempt) * 50 * time.Millisecond):
		}
	}
}

// createAttempts bounds the registrations createSchema makes of one schema
// while the registry answers that another registration raced it.
const createAttempts = 5

// protoFiles are the .proto files an Encoder's schema is compiled from:
// the schema's own text, and the files it imports, read from its
// directory.
type protoFiles struct {
	self string            // the schema's name
	text string            // its text
	dir  string            // where its imports are; "" when it has no file
	read map[string]string // the imports read from dir, by import path
}

// open is the compiler's accessor: the schema, or an import from dir.
// google/protobuf/* not found there are the compiler's built-ins.
func (p *protoFiles) open(path string) (io.ReadCloser, error) {
	if path == p.self {
		return io.NopCloser(strings.NewReader(p.text)), nil
	}
	if p.dir == "" || !filepath.IsLocal(filepath.FromSlash(path)) {
		return nil, fs.ErrNotExist
	}
	b, err := os.ReadFile(filepath.Join(p.dir, filepath.FromSlash(path)))
	if err != nil {
		return nil, err
	}
	p.read[path] = string(b)
	return io.NopCloser(bytes.NewReader(b)), nil
}

// register registers each file f imports from dir (and theirs first)
// under a subject named by its import path, as Confluent's serializers
// do, and returns f's references to them. done holds the references made
// so far, by import path.
// Each request is bounded by timeout.
func (p *protoFiles) register(ctx context.Context, cl *sr.Client, timeout time.Duration, f protoreflect.FileDescriptor, done map[string]sr.SchemaReference) ([]sr.SchemaReference, error) {
	var refs []sr.SchemaReference
	imps := f.Imports()
	for i := range imps.Len() {
		imp := imps.Get(i).FileDescriptor
		path := imp.Path()
		text, ok := p.read[path]
		if !ok {
			continue // a built-in google/protobuf/* file
		}
		if ref, ok := done[path]; ok {
			refs = append(refs, ref)
			continue
		}
		theirs, err := p.register(ctx, cl, timeout, imp, done)
		if err != nil {
			return nil, err
		}
		rctx, cancel := context.WithTimeout(ctx, timeout)
		ss, err := createSchema(rctx, cl, path, sr.Schema{Schema: text, Type: sr.TypeProtobuf, References: theirs})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("register import %s under subject %s: %w", path, path, classify(err, false, 0, false))
		}
		ref := sr.SchemaReference{Name: path, Subject: path, Version: ss.Version}
		done[path] = ref
		refs = append(refs, ref)
	}
	return refs, nil
}

// avroSchemaError is err, hamba/avro's for text, or where text stops
// being JSON when it does (hamba/avro reports JSON that does not parse as
// an unknown type; it also takes a bare primitive name, so JSON is not
// asked for first).
func avroSchemaError(text string, err error) error {
	if jerr := checkJSON(text); jerr != nil {
		return jerr
	}
	return err
}

// checkJSON returns an error saying where text stops being JSON, if it
// does.
func checkJSON(text string) error {
	var v any
	err := json.Unmarshal([]byte(text), &v)
	var se *json.SyntaxError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &se):
		line := 1 + strings.Count(text[:se.Offset], "\n")
		col := int(se.Offset) - strings.LastIndex(text[:se.Offset], "\n") - 1
		return fmt.Errorf("not valid JSON at line %d, column %d: %w", line, col+1, err)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("not valid JSON: it ends before the schema does (truncated?)")
	default:
		return fmt.Errorf("not valid JSON: %w", err)
	}
}

// ID is the schema id the registry gave the schema.
func (e *Encoder) ID() int { return e.id }

// findMessage returns the message named name (full, or short when unique)
// in f, and its message-index path.
func findMessage(f protoreflect.FileDescriptor, name string) (protoreflect.MessageDescriptor, []int, error) {
	type found struct {
		md    protoreflect.MessageDescriptor
		index []int
	}
	var all []found
	var walk func(ms protoreflect.MessageDescriptors, path []int)
	walk = func(ms protoreflect.MessageDescriptors, path []int) {
		for i := range ms.Len() {
			p := append(slices.Clone(path), i)
			all = append(all, found{ms.Get(i), p})
			walk(ms.Get(i).Messages(), p)
		}
	}
	walk(f.Messages(), nil)
	if len(all) == 0 {
		return nil, nil, fmt.Errorf("protobuf schema: the file has no message")
	}
	if name == "" {
		return all[0].md, all[0].index, nil
	}
	var hits []found
	// As protoc resolves a name: full (a leading dot says so), else
	// relative to the file's package.
	inPkg := name
	if pkg := f.Package(); pkg != "" && !strings.HasPrefix(name, ".") {
		inPkg = string(pkg) + "." + name
	}
	for _, m := range all {
		if full := string(m.md.FullName()); full == inPkg || full == name || full == strings.TrimPrefix(name, ".") {
			return m.md, m.index, nil
		}
		if string(m.md.Name()) == name {
			hits = append(hits, m)
		}
	}
	switch len(hits) {
	case 1:
		return hits[0].md, hits[0].index, nil
	case 0:
		return nil, nil, fmt.Errorf("protobuf schema: no message %q", name)
	default:
		return nil, nil, fmt.Errorf("protobuf schema: %d messages named %q: give the full name", len(hits), name)
	}
}

// Encode turns value, JSON as the Decoder's mapping writes it (Protobuf:
// proto3's JSON mapping, which also takes camelCase names), into a framed
// record. A field of an Avro record that value omits takes the schema's
// default; a field the schema does not have is an error.
func (e *Encoder) Encode(value []byte) ([]byte, error) {
	var h sr.ConfluentHeader
	out, _ := h.AppendEncode(nil, e.id, e.index)
	switch e.kind {
	case Avro:
		d := json.NewDecoder(bytes.NewReader(value))
		d.UseNumber()
		var v any
		if err := d.Decode(&v); err != nil {
			return nil, fmt.Errorf("not JSON: %w", err)
		}
		return appendAvro(out, e.avro, v, "value")
	default:
		m := dynamicpb.NewMessage(e.msg)
		if err := protojson.Unmarshal(value, m); err != nil {
			return nil, fmt.Errorf("not a %s in JSON: %w", e.msg.FullName(), err)
		}
		b, err := proto.Marshal(m)
		if err != nil {
			return nil, err
		}
		return append(out, b...), nil
	}
}

func appendLong(b []byte, v int64) []byte { return binary.AppendVarint(b, v) }

// appendAvro appends v, decoded JSON (numbers as json.Number), encoded as
// s; at names the place in the value for errors.
func appendAvro(b []byte, s avro.Schema, v any, at string) ([]byte, error) {
	if ref, ok := s.(*avro.RefSchema); ok {
		s = ref.Schema()
	}
	bad := func(want string) ([]byte, error) {
		return nil, fmt.Errorf("%s: %s, want %s", at, describe(v), want)
	}
	switch s := s.(type) {
	case *avro.NullSchema:
		if v != nil {
			return bad("null")
		}
		return b, nil
	case *avro.PrimitiveSchema:
		return appendPrimitive(b, s, v, at)
	case *avro.RecordSchema:
		m, ok := v.(map[string]any)
		if !ok {
			return bad("an object (record " + s.FullName() + ")")
		}
		known := map[string]bool{}
		for _, f := range s.Fields() {
			known[f.Name()] = true
			fv, ok := m[f.Name()]
			if !ok {
				if !f.HasDefault() {
					return nil, fmt.Errorf("%s: no field %q, which has no default", at, f.Name())
				}
				j, err := json.Marshal(f.Default())
				if err != nil {
					return nil, fmt.Errorf("%s.%s: default: %w", at, f.Name(), err)
				}
				d := json.NewDecoder(bytes.NewReader(j))
				d.UseNumber()
				if err := d.Decode(&fv); err != nil {
					return nil, err
				}
			}
			var err error
			if b, err = appendAvro(b, f.Type(), fv, at+"."+f.Name()); err != nil {
				return nil, err
			}
		}
		for k := range m {
			if !known[k] {
				return nil, fmt.Errorf("%s: field %q is not in record %s", at, k, s.FullName())
			}
		}
		return b, nil
	case *avro.EnumSchema:
		str, _ := v.(string)
		i := slices.Index(s.Symbols(), str)
		if i < 0 {
			return bad("one of " + strings.Join(s.Symbols(), ", "))
		}
		return appendLong(b, int64(i)), nil
	case *avro.ArraySchema:
		a, ok := v.([]any)
		if !ok {
			return bad("an array")
		}
		if len(a) > 0 {
			b = appendLong(b, int64(len(a)))
			for i, x := range a {
				var err error
				if b, err = appendAvro(b, s.Items(), x, fmt.Sprintf("%s[%d]", at, i)); err != nil {
					return nil, err
				}
			}
		}
		return appendLong(b, 0), nil
	case *avro.MapSchema:
		m, ok := v.(map[string]any)
		if !ok {
			return bad("an object (map)")
		}
		if len(m) > 0 {
			b = appendLong(b, int64(len(m)))
			keys := slices.Sorted(func(yield func(string) bool) {
				for k := range m {
					if !yield(k) {
						return
					}
				}
			})
			for _, k := range keys {
				b = appendLong(b, int64(len(k)))
				b = append(b, k...)
				var err error
				if b, err = appendAvro(b, s.Values(), m[k], at+"."+k); err != nil {
					return nil, err
				}
			}
		}
		return appendLong(b, 0), nil
	case *avro.UnionSchema:
		var errs []string
		for i, t := range s.Types() {
			out, err := appendAvro(appendLong(slices.Clone(b), int64(i)), t, v, at)
			if err == nil {
				return out, nil
			}
			errs = append(errs, err.Error())
		}
		return nil, fmt.Errorf("%s: %s fits no branch of the union: %s", at, describe(v), strings.Join(errs, "; "))
	case *avro.FixedSchema:
		if l := s.Logical(); l != nil && l.Type() == avro.Decimal {
			u, err := unscaled(v, l.(*avro.DecimalLogicalSchema), at)
			if err != nil {
				return nil, err
			}
			tc, ok := twosComplement(u, s.Size())
			if !ok {
				return nil, fmt.Errorf("%s: %s does not fit %d bytes", at, describe(v), s.Size())
			}
			return append(b, tc...), nil
		}
		if l := s.Logical(); l != nil && l.Type() == avro.Duration {
			m, ok := v.(map[string]any)
			if !ok {
				return bad(`{"months":…,"days":…,"milliseconds":…}`)
			}
			for _, k := range []string{"months", "days", "milliseconds"} {
				n, err := strconv.ParseUint(fmt.Sprint(m[k]), 10, 32)
				if err != nil {
					return nil, fmt.Errorf("%s.%s: %s is not a uint32", at, k, describe(m[k]))
				}
				b = binary.LittleEndian.AppendUint32(b, uint32(n))
			}
			return b, nil
		}
		str, _ := v.(string)
		raw, err := base64.StdEncoding.DecodeString(str)
		if _, isStr := v.(string); !isStr || err != nil || len(raw) != s.Size() {
			return bad(fmt.Sprintf("%d bytes in base64", s.Size()))
		}
		return append(b, raw...), nil
	}
	return nil, fmt.Errorf("%s: schema type %s is not supported", at, s.Type())
}

func appendPrimitive(b []byte, s *avro.PrimitiveSchema, v any, at string) ([]byte, error) {
	var logical avro.LogicalType
	if l := s.Logical(); l != nil {
		logical = l.Type()
	}
	bad := func(want string) ([]byte, error) {
		return nil, fmt.Errorf("%s: %s, want %s", at, describe(v), want)
	}
	str, isStr := v.(string)
	num, isNum := v.(json.Number)
	parseTime := func(layout string) (time.Time, bool) {
		t, err := time.Parse(layout, str)
		return t, isStr && err == nil
	}
	below := func(unit time.Duration) ([]byte, error) {
		name := map[time.Duration]string{time.Millisecond: "millisecond", time.Microsecond: "microsecond"}[unit]
		return nil, fmt.Errorf("%s: %s has digits below the %s, which %s cannot hold", at, describe(v), name, logical)
	}
	switch s.Type() {
	case avro.Null:
		if v != nil {
			return bad("null")
		}
		return b, nil
	case avro.Boolean:
		x, ok := v.(bool)
		if !ok {
			return bad("true or false")
		}
		if x {
			return append(b, 1), nil
		}
		return append(b, 0), nil
	case avro.Int:
		switch logical {
		case avro.Date:
			t, ok := parseTime("2006-01-02")
			if !ok {
				return bad(`a date, "2006-01-02"`)
			}
			return appendLong(b, t.Unix()/86400), nil
		case avro.TimeMillis:
			t, ok := parseTime("15:04:05.999999999")
			if !ok {
				return bad(`a time of day, "15:04:05.000"`)
			}
			if t.Nanosecond()%int(time.Millisecond) != 0 {
				return below(time.Millisecond)
			}
			return appendLong(b, t.Sub(time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC)).Milliseconds()), nil
		}
		n, err := strconv.ParseInt(string(num), 10, 32)
		if !isNum || err != nil {
			return bad("an int")
		}
		return appendLong(b, n), nil
	case avro.Long:
		switch logical {
		case avro.TimeMicros:
			t, ok := parseTime("15:04:05.999999999")
			if !ok {
				return bad(`a time of day, "15:04:05.000000"`)
			}
			if t.Nanosecond()%int(time.Microsecond) != 0 {
				return below(time.Microsecond)
			}
			return appendLong(b, t.Sub(time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC)).Microseconds()), nil
		case avro.TimestampMillis, avro.TimestampMicros:
			t, ok := parseTime(time.RFC3339Nano)
			if !ok {
				return bad(`a timestamp, "2006-01-02T15:04:05.000Z"`)
			}
			if unit := time.Microsecond; logical == avro.TimestampMillis && t.Nanosecond()%int(time.Millisecond) != 0 {
				return below(time.Millisecond)
			} else if t.Nanosecond()%int(unit) != 0 {
				return below(unit)
			}
			if logical == avro.TimestampMillis {
				return appendLong(b, t.UnixMilli()), nil
			}
			return appendLong(b, t.UnixMicro()), nil
		case avro.LocalTimestampMillis, avro.LocalTimestampMicros:
			t, ok := parseTime("2006-01-02T15:04:05.999999999")
			if !ok {
				return bad(`a local timestamp, "2006-01-02T15:04:05.000"`)
			}
			if unit := time.Microsecond; logical == avro.LocalTimestampMillis && t.Nanosecond()%int(time.Millisecond) != 0 {
				return below(time.Millisecond)
			} else if t.Nanosecond()%int(unit) != 0 {
				return below(unit)
			}
			if logical == avro.LocalTimestampMillis {
				return appendLong(b, t.UnixMilli()), nil
			}
			return appendLong(b, t.UnixMicro()), nil
		}
		n, err := strconv.ParseInt(string(num), 10, 64)
		if isStr {
			n, err = strconv.ParseInt(str, 10, 64)
		}
		if (!isNum && !isStr) || err != nil {
			return bad("a long")
		}
		return appendLong(b, n), nil
	case avro.Float, avro.Double:
		var f float64
		switch {
		case isNum:
			x, err := num.Float64()
			if err != nil {
				return bad("a number")
			}
			f = x
		case str == "NaN":
			f = math.NaN()
		case str == "Infinity":
			f = math.Inf(1)
		case str == "-Infinity":
			f = math.Inf(-1)
		default:
			return bad("a number")
		}
		if s.Type() == avro.Float {
			return binary.LittleEndian.AppendUint32(b, math.Float32bits(float32(f))), nil
		}
		return binary.LittleEndian.AppendUint64(b, math.Float64bits(f)), nil
	case avro.String:
		if !isStr {
			return bad("a string")
		}
		b = appendLong(b, int64(len(str)))
		return append(b, str...), nil
	case avro.Bytes:
		var raw []byte
		if logical == avro.Decimal {
			u, err := unscaled(v, s.Logical().(*avro.DecimalLogicalSchema), at)
			if err != nil {
				return nil, err
			}
			raw, _ = twosComplement(u, 0)
		} else {
			var err error
			if raw, err = base64.StdEncoding.DecodeString(str); !isStr || err != nil {
				return bad("bytes in base64")
			}
		}
		b = appendLong(b, int64(len(raw)))
		return append(b, raw...), nil
	}
	return nil, fmt.Errorf("%s: primitive type %s is not supported", at, s.Type())
}

// unscaled is v, a decimal as a number or a string, times 10^scale: an
// integer, or an error when v has more decimals than the scale or more
// digits than the precision (Java's Avro refuses both).
func unscaled(v any, d *avro.DecimalLogicalSchema, at string) (*big.Int, error) {
	scale, precision := d.Scale(), d.Precision()
	var text string
	switch x := v.(type) {
	case json.Number:
		text = string(x)
	case string:
		text = x
	default:
		return nil, fmt.Errorf("%s: %s, want a decimal", at, describe(v))
	}
	r, ok := new(big.Rat).SetString(text)
	if !ok {
		return nil, fmt.Errorf("%s: %q is not a decimal", at, text)
	}
	r.Mul(r, new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(scale)), nil)))
	if !r.IsInt() {
		return nil, fmt.Errorf("%s: %s has more than %d decimals", at, text, scale)
	}
	if digits := len(new(big.Int).Abs(r.Num()).String()); precision > 0 && digits > precision {
		return nil, fmt.Errorf("%s: %s has %d digits, more than the decimal's precision %d (scale %d: at most %d before the point)",
			at, text, digits, precision, scale, precision-scale)
	}
	return r.Num(), nil
}

// twosComplement is n in big-endian two's complement: in size bytes
// (false if it does not fit), or in as few as it takes when size is 0.
func twosComplement(n *big.Int, size int) ([]byte, bool) {
	bits := n.BitLen() + 1 // a sign bit
	need := (bits + 7) / 8
	if size == 0 {
		size = need
	}
	if need > size {
		return nil, false
	}
	m := new(big.Int).Set(n)
	if n.Sign() < 0 {
		m.Add(m, new(big.Int).Lsh(big.NewInt(1), uint(size*8)))
	}
	out := make([]byte, size)
	return m.FillBytes(out), true
}

func describe(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case string:
		return strconv.Quote(x)
	case json.Number:
		return string(x)
	case bool:
		return strconv.FormatBool(x)
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}
