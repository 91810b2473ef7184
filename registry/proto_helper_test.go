package registry_test

import (
	"context"
	"testing"

	"github.com/bufbuild/protocompile"
	"google.golang.org/protobuf/reflect/protoreflect"
)

type protoreflectMessageDescriptor = protoreflect.MessageDescriptor

func compileProto(t testing.TB, text, name string) protoreflect.MessageDescriptor {
	t.Helper()
	c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
		Accessor: protocompile.SourceAccessorFromMap(map[string]string{"order.proto": text})})}
	fs, err := c.Compile(context.Background(), "order.proto")
	if err != nil {
		t.Fatal(err)
	}
	d := fs[0].FindDescriptorByName(protoreflect.FullName(name))
	if d == nil {
		t.Fatalf("no %s", name)
	}
	return d.(protoreflect.MessageDescriptor)
}

func protoreflectValueOfInt64(v int64) protoreflect.Value   { return protoreflect.ValueOfInt64(v) }
func protoreflectValueOfString(v string) protoreflect.Value { return protoreflect.ValueOfString(v) }
