package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kotel"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// startTracing sets up tracing for a and returns the flush function.
func (a *app) startTracing(ctx context.Context) (func(context.Context) error, error) {
	tp, on, shutdown, err := tracing(ctx)
	if err != nil {
		return nil, err
	}
	a.tp, a.tracing = tp, on
	if on {
		a.log.Info("tracing on", "service", serviceName())
	}
	return shutdown, nil
}

// kafkaTracing returns the kgo options that trace produce and receive
// through kotel, when tracing is on.
func (a *app) kafkaTracing(clientID string) []kgo.Opt {
	if !a.tracing {
		return nil
	}
	k := kotel.NewKotel(kotel.WithTracer(kotel.NewTracer(kotel.TracerProvider(a.tp),
		kotel.ClientID(clientID), kotel.ConsumerGroup(a.cfg.Kafka.Group))))
	return []kgo.Opt{kgo.WithHooks(k.Hooks()...)}
}

// tracing returns the TracerProvider the pipeline uses, configured by
// the standard OpenTelemetry environment: tracing is on when
// OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set
// (and OTEL_TRACES_EXPORTER is not "none"), over OTLP/HTTP by default or
// gRPC with OTEL_EXPORTER_OTLP_PROTOCOL=grpc. Off, it is a no-op provider
// that costs nothing. shutdown flushes pending spans.
func tracing(ctx context.Context) (tp trace.TracerProvider, on bool, shutdown func(context.Context) error, err error) {
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	endpoint := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") + os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	if endpoint == "" || os.Getenv("OTEL_TRACES_EXPORTER") == "none" {
		return noop.NewTracerProvider(), false, func(context.Context) error { return nil }, nil
	}
	protocol := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if protocol == "" {
		protocol = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	var exp sdktrace.SpanExporter
	switch strings.ToLower(protocol) {
	case "", "http/protobuf", "http":
		exp, err = otlptracehttp.New(ctx)
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		return nil, false, nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL %q: want grpc or http/protobuf", protocol)
	}
	if err != nil {
		return nil, false, nil, fmt.Errorf("otlp trace exporter: %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attribute.String("service.name", serviceName())))
	if err != nil {
		res = resource.Default()
	}
	provider := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(provider)
	return provider, true, provider.Shutdown, nil
}

func serviceName() string {
	if s := os.Getenv("OTEL_SERVICE_NAME"); s != "" {
		return s
	}
	return "onceflow"
}

// traceHandler adds trace_id and span_id to records logged with a context
// that carries a span.
type traceHandler struct{ slog.Handler }

func (h traceHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h traceHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return traceHandler{h.Handler.WithAttrs(as)}
}
func (h traceHandler) WithGroup(name string) slog.Handler {
	return traceHandler{h.Handler.WithGroup(name)}
}
