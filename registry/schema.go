package registry

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"

	"github.com/bufbuild/protocompile"
	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// schema is one compiled writer schema, shared read-only by every worker.
type schema struct {
	id      int
	subject string
	typ     sr.SchemaType
	kind    Kind
	broken  string // why it does not compile, if it does not

	avro avro.Schema // Avro

	file  protoreflect.FileDescriptor    // Protobuf
	types *dynamicpb.Types               // the file's and its imports' types, for Any and extensions
	fast  map[protoreflect.FullName]bool // the messages fastProto reads
}

func (s *schema) dataError(format string, args ...any) *DataError {
	return &DataError{SchemaID: s.id, Subject: s.subject, Reason: fmt.Sprintf(format, args...)}
}

// compile parses text, the schema's own, after refs.
func (s *schema) compile(text string, refs []reference) error {
	switch s.typ {
	case sr.TypeAvro:
		s.kind = Avro
		// A cache per schema: two versions of a subject name the same
		// types differently, and hamba's default cache is global.
		cache := &avro.SchemaCache{}
		for _, r := range refs {
			if _, err := avro.ParseWithCache(r.text, "", cache); err != nil {
				return fmt.Errorf("reference %q: %w", r.name, avroSchemaError(r.text, err))
			}
		}
		sch, err := avro.ParseWithCache(text, "", cache)
		if err != nil {
			return avroSchemaError(text, err)
		}
		s.avro = sch
		return nil
	case sr.TypeProtobuf:
		s.kind = Protobuf
		const self = "onceflow-registry-schema.proto"
		srcs := map[string]string{self: text}
		for _, r := range refs {
			srcs[r.name] = r.text
		}
		c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(sourceResolver(srcs))}
		fs, err := c.Compile(context.Background(), self)
		if err != nil {
			return err
		}
		s.file = fs[0]
		files := new(protoregistry.Files)
		if err := register(files, s.file); err != nil {
			return err
		}
		s.types = dynamicpb.NewTypes(files)
		s.fast = fastMessages(s.file)
		return nil
	default:
		s.kind = Kind(strings.ToLower(s.typ.String()))
		return nil // Decode says the kind does not match
	}
}

// sourceResolver resolves the files of a Protobuf schema and its
// references, each in either form a registry holds: .proto text, or a
// serialized FileDescriptorProto in base64 (what Confluent's Python
// serializer registers).
func sourceResolver(srcs map[string]string) protocompile.Resolver {
	text := &protocompile.SourceResolver{Accessor: protocompile.SourceAccessorFromMap(srcs)}
	return protocompile.ResolverFunc(func(path string) (protocompile.SearchResult, error) {
		src, ok := srcs[path]
		if !ok {
			return text.FindFileByPath(path)
		}
		fd, isDescriptor, err := descriptorForm(src)
		if err != nil {
			return protocompile.SearchResult{}, fmt.Errorf("%s: %w", path, err)
		}
		if !isDescriptor {
			return text.FindFileByPath(path)
		}
		fd.Name = proto.String(path) // the name the importer knows it by
		return protocompile.SearchResult{Proto: fd}, nil
	})
}

// descriptorForm reads src as a base64 FileDescriptorProto. It reports
// false for .proto text, which is never base64 (a .proto has spaces and
// semicolons); an error for base64 that is no FileDescriptorProto.
func descriptorForm(src string) (*descriptorpb.FileDescriptorProto, bool, error) {
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(src))
	if err != nil || len(b) == 0 {
		return nil, false, nil
	}
	fd := new(descriptorpb.FileDescriptorProto)
	if err := proto.Unmarshal(b, fd); err != nil {
		return nil, true, fmt.Errorf("the schema is base64 but not a serialized FileDescriptorProto: %w", err)
	}
	for _, m := range fd.MessageType {
		fillJSONNames(m)
	}
	return fd, true, nil
}

// fillJSONNames sets the json_name protoc sets on every field, where a
// descriptor left it out (Python's serialized_pb does): protocompile's
// linker takes an absent one for a custom "" and refuses two of them.
func fillJSONNames(m *descriptorpb.DescriptorProto) {
	for _, f := range append(m.Field, m.Extension...) {
		if f.JsonName == nil {
			f.JsonName = proto.String(jsonName(f.GetName()))
		}
	}
	for _, n := range m.NestedType {
		fillJSONNames(n)
	}
}

// jsonName is protoc's default JSON name of a field: each letter after an
// underscore upper-cased, the underscores dropped.
func jsonName(name string) string {
	var b strings.Builder
	up := false
	for _, r := range name {
		switch {
		case r == '_':
			up = true
		case up && 'a' <= r && r <= 'z':
			b.WriteRune(r - 'a' + 'A')
			up = false
		default:
			b.WriteRune(r)
			up = false
		}
	}
	return b.String()
}

// register adds f and its imports to files, once each.
func register(files *protoregistry.Files, f protoreflect.FileDescriptor) error {
	if _, err := files.FindFileByPath(f.Path()); err == nil {
		return nil
	}
	imps := f.Imports()
	for i := range imps.Len() {
		if err := register(files, imps.Get(i).FileDescriptor); err != nil {
			return err
		}
	}
	return files.RegisterFile(f)
}
