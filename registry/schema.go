package registry

import (
	"context"
	"fmt"
	"strings"

	"github.com/bufbuild/protocompile"
	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
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
				return fmt.Errorf("reference %q: %w", r.name, err)
			}
		}
		sch, err := avro.ParseWithCache(text, "", cache)
		if err != nil {
			return err
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
		c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
			Accessor: protocompile.SourceAccessorFromMap(srcs)})}
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
