package registry

import (
	"bytes"
	"encoding/json"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/onceflow/onceflow/wire"
)

// decodeProtobuf reads body as the message index names and returns it in
// the canonical proto3 JSON mapping, with the .proto's field names and
// every field present (an unset scalar as its zero value, an unset message
// as null), so that a SQL handler finds each field it expects. proto2's
// required fields are not enforced (AllowPartial: a sink reads what was
// written; the check also cost an eighth of the decode).
func (s *schema) decodeProtobuf(index []int, body []byte) ([]byte, error) {
	md, err := s.message(index)
	if err != nil {
		return nil, err
	}
	if s.fast[md.FullName()] {
		if out, ok := fastProto(make([]byte, 0, 2*len(body)+16), md, body, 0); ok {
			return out, nil
		}
	}
	return s.slowProtobuf(md, body)
}

// slowProtobuf is decodeProtobuf through dynamicpb and protojson: every
// message, and the errors of a body that is not one.
func (s *schema) slowProtobuf(md protoreflect.MessageDescriptor, body []byte) ([]byte, error) {
	m := dynamicpb.NewMessage(md)
	if err := (proto.UnmarshalOptions{Resolver: s.types, RecursionLimit: maxDepth, AllowPartial: true}).Unmarshal(body, m); err != nil {
		return nil, s.dataError("the body is not a valid %s: %v", md.FullName(), err)
	}
	out, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true, Resolver: s.types, AllowPartial: true}.Marshal(m)
	if err != nil {
		return nil, s.dataError("%s cannot be written as JSON: %v", md.FullName(), err)
	}
	// protojson varies its whitespace from build to build on purpose; the
	// payload's digest (the dedup's conflict check) must not: one compact
	// form, the same from every version of onceflow.
	var compact bytes.Buffer
	if err := json.Compact(&compact, out); err != nil {
		return nil, s.dataError("%s written as JSON is not valid JSON: %v", md.FullName(), err)
	}
	out = compact.Bytes()
	if wire.HasNULEscape(out) {
		return nil, s.dataError(`%s holds a NUL character (\u0000), which Postgres cannot store`, md.FullName())
	}
	return out, nil
}

// message resolves a message-index array: the first index among the
// file's top-level messages, each next among the previous one's nested
// messages.
func (s *schema) message(index []int) (protoreflect.MessageDescriptor, error) {
	if len(index) == 0 {
		index = []int{0}
	}
	msgs := s.file.Messages()
	var md protoreflect.MessageDescriptor
	for depth, i := range index {
		if i < 0 || i >= msgs.Len() {
			return nil, s.dataError("message index %v: no message %d at depth %d (%d there)", index, i, depth, msgs.Len())
		}
		md = msgs.Get(i)
		msgs = md.Messages()
	}
	return md, nil
}
