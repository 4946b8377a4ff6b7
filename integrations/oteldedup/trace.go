package oteldedup

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/tierdedup/tierdedup/engine"
)

// Span attributes the Tracer sets.
const (
	// AttrNamespace is the call's namespace ("" is the default one).
	AttrNamespace = attribute.Key("tierdedup.namespace")
	// AttrOutcome is the claim's outcome (engine.Outcome's String: "new",
	// "duplicate", "in-flight", "conflict", "poison"); absent when the
	// call failed before a claim answered.
	AttrOutcome = attribute.Key("tierdedup.outcome")
	// AttrRan says whether the handler ran.
	AttrRan = attribute.Key("tierdedup.ran")
)

// Tracer returns an engine.Tracer (for engine.Options.Tracer) that makes
// a span of each Do and DoResult with tp's tracer named ScopeName: named
// "tierdedup.Do" or "tierdedup.DoResult", of kind internal, with the
// attributes AttrNamespace, AttrOutcome and AttrRan; a call that returns
// an error has the error recorded and status Error. The handler runs in
// the span's context, so its own spans are the span's children. The key
// is never recorded (it may be personal data).
//
// A nil tp returns nil: no tracer, so the engine makes no call at all.
func Tracer(tp trace.TracerProvider) engine.Tracer {
	if tp == nil {
		return nil
	}
	return tracer{tp.Tracer(ScopeName)}
}

type tracer struct{ t trace.Tracer }

// spanNames are the span names by op, built once.
var spanNames = map[string]string{"Do": "tierdedup.Do", "DoResult": "tierdedup.DoResult"}

// Start starts op's span; end ends it with the call's answer.
func (t tracer) Start(ctx context.Context, op, namespace string) (context.Context, func(engine.Outcome, bool, error)) {
	name, ok := spanNames[op]
	if !ok {
		name = "tierdedup." + op
	}
	ctx, span := t.t.Start(ctx, name, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(AttrNamespace.String(namespace)))
	return ctx, func(o engine.Outcome, ran bool, err error) {
		if o != 0 {
			span.SetAttributes(AttrOutcome.String(o.String()), AttrRan.Bool(ran))
		} else {
			span.SetAttributes(AttrRan.Bool(ran))
		}
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}
