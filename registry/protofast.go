package registry

// A faster path for the common Protobuf message: proto3, fields of scalar,
// string, bytes, enum, repeated and nested such messages — no oneof, no
// map, no well-known type, no extension. It reads the wire format and
// writes the JSON of decodeProtobuf's mapping directly, where
// dynamicpb + protojson cost four times an Avro decode (BenchmarkDecodeOrder).
// Its result is trusted only when it succeeds: any problem with the
// body makes decodeProtobuf take the general path, whose error names it.
// FuzzProtobufFastPath checks both paths give the same JSON.

import (
	"math"
	"strconv"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// fastMessages returns the messages of f (nested ones too) that the fast
// path reads.
func fastMessages(f protoreflect.FileDescriptor) map[protoreflect.FullName]bool {
	state := map[protoreflect.FullName]int8{} // 1 yes, 2 no, 3 being looked at
	var ok func(md protoreflect.MessageDescriptor) bool
	ok = func(md protoreflect.MessageDescriptor) bool {
		switch state[md.FullName()] {
		case 1, 3:
			return true // a recursive reference is as good as its message
		case 2:
			return false
		}
		state[md.FullName()] = 3
		good := md.Syntax() == protoreflect.Proto3 && md.ParentFile().Package() != "google.protobuf" && md.ExtensionRanges().Len() == 0
		fs := md.Fields()
		for i := 0; good && i < fs.Len(); i++ {
			fd := fs.Get(i)
			switch {
			case fd.ContainingOneof() != nil, fd.IsMap(), fd.Kind() == protoreflect.GroupKind, fd.IsExtension():
				good = false
			case fd.Kind() == protoreflect.MessageKind:
				good = ok(fd.Message())
			}
		}
		state[md.FullName()] = 2
		if good {
			state[md.FullName()] = 1
		}
		return good
	}
	var walk func(ms protoreflect.MessageDescriptors)
	walk = func(ms protoreflect.MessageDescriptors) {
		for i := range ms.Len() {
			ok(ms.Get(i))
			walk(ms.Get(i).Messages())
		}
	}
	walk(f.Messages())
	fast := map[protoreflect.FullName]bool{}
	for name, st := range state {
		if st == 1 {
			fast[name] = true
		}
	}
	return fast
}

// fastField is what one field's occurrences in a body left.
type fastField struct {
	scalar uint64   // the last varint or fixed value
	set    bool     // scalar or bytes was seen
	bytes  []byte   // the last string or bytes; a message's, all occurrences (merged)
	merged bool     // bytes is a copy, safe to append to
	list   []uint64 // repeated numbers
	items  [][]byte // repeated strings, bytes, messages
}

// fastProto appends the JSON of body read as md, or returns false for
// anything it does not read exactly as proto.Unmarshal and protojson
// would.
func fastProto(out []byte, md protoreflect.MessageDescriptor, body []byte, depth int) ([]byte, bool) {
	if depth > maxDepth {
		return nil, false
	}
	fs := md.Fields()
	vals := make([]fastField, fs.Len())
	for len(body) > 0 {
		num, typ, n := protowire.ConsumeTag(body)
		if n < 0 || num > protowire.MaxValidNumber {
			return nil, false
		}
		body = body[n:]
		fd := fs.ByNumber(num)
		if fd == nil || !wireFits(fd, typ) {
			if n = protowire.ConsumeFieldValue(num, typ, body); n < 0 {
				return nil, false
			}
			body = body[n:]
			continue
		}
		v := &vals[fd.Index()]
		switch typ {
		case protowire.VarintType:
			x, n := protowire.ConsumeVarint(body)
			if n < 0 {
				return nil, false
			}
			body = body[n:]
			v.add(fd, x)
		case protowire.Fixed32Type:
			x, n := protowire.ConsumeFixed32(body)
			if n < 0 {
				return nil, false
			}
			body = body[n:]
			v.add(fd, uint64(x))
		case protowire.Fixed64Type:
			x, n := protowire.ConsumeFixed64(body)
			if n < 0 {
				return nil, false
			}
			body = body[n:]
			v.add(fd, x)
		case protowire.BytesType:
			b, n := protowire.ConsumeBytes(body)
			if n < 0 {
				return nil, false
			}
			body = body[n:]
			switch {
			case fd.IsList() && isNumeric(fd.Kind()): // packed
				if !v.packed(fd, b) {
					return nil, false
				}
			case fd.IsList():
				v.items = append(v.items, b)
			case fd.Kind() == protoreflect.MessageKind && v.set:
				if !v.merged { // a message seen again merges with the first
					v.bytes, v.merged = append([]byte(nil), v.bytes...), true
				}
				v.bytes = append(v.bytes, b...)
			default:
				v.bytes, v.set, v.merged = b, true, false
			}
		default:
			return nil, false
		}
	}
	out = append(out, '{')
	for i := range fs.Len() {
		fd := fs.Get(i)
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, '"')
		out = append(out, fd.Name()...)
		out = append(out, '"', ':')
		v := &vals[i]
		var ok bool
		switch {
		case fd.IsList():
			out = append(out, '[')
			if isNumeric(fd.Kind()) {
				for j, x := range v.list {
					if j > 0 {
						out = append(out, ',')
					}
					out = appendScalar(out, fd, x)
				}
			} else {
				for j, b := range v.items {
					if j > 0 {
						out = append(out, ',')
					}
					if out, ok = appendBytesKind(out, fd, b, depth); !ok {
						return nil, false
					}
				}
			}
			out = append(out, ']')
		case fd.Kind() == protoreflect.MessageKind && !v.set:
			out = append(out, "null"...)
		case isNumeric(fd.Kind()):
			out = appendScalar(out, fd, v.scalar) // 0 when unset: proto3's default
		default:
			if out, ok = appendBytesKind(out, fd, v.bytes, depth); !ok {
				return nil, false
			}
		}
	}
	return append(out, '}'), true
}

func (v *fastField) add(fd protoreflect.FieldDescriptor, x uint64) {
	if fd.IsList() {
		v.list = append(v.list, x)
		return
	}
	v.scalar, v.set = x, true
}

// packed reads a packed run of fd's numbers.
func (v *fastField) packed(fd protoreflect.FieldDescriptor, b []byte) bool {
	for len(b) > 0 {
		var x uint64
		var n int
		switch wireOf(fd.Kind()) {
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(b)
		case protowire.Fixed32Type:
			var y uint32
			y, n = protowire.ConsumeFixed32(b)
			x = uint64(y)
		default:
			x, n = protowire.ConsumeFixed64(b)
		}
		if n < 0 {
			return false
		}
		b = b[n:]
		v.list = append(v.list, x)
	}
	return true
}

func isNumeric(k protoreflect.Kind) bool {
	switch k {
	case protoreflect.StringKind, protoreflect.BytesKind, protoreflect.MessageKind, protoreflect.GroupKind:
		return false
	}
	return true
}

func wireOf(k protoreflect.Kind) protowire.Type {
	switch k {
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		return protowire.Fixed32Type
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
		return protowire.Fixed64Type
	case protoreflect.StringKind, protoreflect.BytesKind, protoreflect.MessageKind:
		return protowire.BytesType
	}
	return protowire.VarintType
}

// wireFits reports whether typ is a wire type fd is read from; others are
// unknown fields, skipped as proto.Unmarshal does.
func wireFits(fd protoreflect.FieldDescriptor, typ protowire.Type) bool {
	w := wireOf(fd.Kind())
	return typ == w || (fd.IsList() && isNumeric(fd.Kind()) && typ == protowire.BytesType)
}

func appendScalar(out []byte, fd protoreflect.FieldDescriptor, x uint64) []byte {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return strconv.AppendBool(out, x != 0)
	case protoreflect.Int32Kind, protoreflect.Sfixed32Kind:
		return strconv.AppendInt(out, int64(int32(x)), 10)
	case protoreflect.Sint32Kind:
		return strconv.AppendInt(out, int64(int32(protowire.DecodeZigZag(x&math.MaxUint32))), 10)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return strconv.AppendUint(out, uint64(uint32(x)), 10)
	case protoreflect.Int64Kind, protoreflect.Sfixed64Kind:
		return appendQuoted(out, strconv.AppendInt(nil, int64(x), 10))
	case protoreflect.Sint64Kind:
		return appendQuoted(out, strconv.AppendInt(nil, protowire.DecodeZigZag(x), 10))
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return appendQuoted(out, strconv.AppendUint(nil, x, 10))
	case protoreflect.FloatKind:
		return appendProtoFloat(out, float64(math.Float32frombits(uint32(x))), 32)
	case protoreflect.DoubleKind:
		return appendProtoFloat(out, math.Float64frombits(x), 64)
	case protoreflect.EnumKind:
		n := protoreflect.EnumNumber(int32(x))
		if ev := fd.Enum().Values().ByNumber(n); ev != nil {
			return appendJSONString(out, string(ev.Name()))
		}
		return strconv.AppendInt(out, int64(n), 10)
	}
	return out
}

// appendBytesKind appends a string, bytes or message field's value.
func appendBytesKind(out []byte, fd protoreflect.FieldDescriptor, b []byte, depth int) ([]byte, bool) {
	switch fd.Kind() {
	case protoreflect.StringKind:
		if !utf8.Valid(b) {
			return nil, false
		}
		for _, c := range b {
			if c == 0 {
				return nil, false // the general path says why
			}
		}
		return appendJSONString(out, string(b)), true
	case protoreflect.BytesKind:
		return appendBase64(out, b), true
	case protoreflect.MessageKind:
		return fastProto(out, fd.Message(), b, depth+1)
	}
	return nil, false
}

// appendProtoFloat writes f as protojson does (encoding/json's rules:
// exponent form below 1e-6 and from 1e21 on).
func appendProtoFloat(out []byte, f float64, bits int) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return appendFloat(out, f, bits)
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 {
		if bits == 64 && (abs < 1e-6 || abs >= 1e21) || bits == 32 && (float32(abs) < 1e-6 || float32(abs) >= 1e21) {
			format = 'e'
		}
	}
	out = strconv.AppendFloat(out, f, format, -1, bits)
	if format == 'e' {
		n := len(out)
		if n >= 4 && out[n-4] == 'e' && out[n-3] == '-' && out[n-2] == '0' {
			out[n-2] = out[n-1]
			out = out[:n-1]
		}
	}
	return out
}
