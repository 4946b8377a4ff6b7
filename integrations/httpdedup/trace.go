package httpdedup

import (
	"context"
	"fmt"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// scopeName is the instrumentation scope of the tracer the middleware
// gets from Options.TracerProvider: its import path.
const scopeName = "github.com/tierdedup/tierdedup/integrations/httpdedup"

// spanName names the span of each request the middleware handles.
const spanName = "tierdedup.http"

// The attributes of a request's span (Options.TracerProvider).
const (
	attrMethod    = attribute.Key("http.request.method")
	attrStatus    = attribute.Key("http.response.status_code")
	attrNamespace = attribute.Key("tierdedup.namespace")
	attrAnswer    = attribute.Key("tierdedup.http.answer")
	attrStored    = attribute.Key("tierdedup.http.stored")
	attrReleased  = attribute.Key("tierdedup.http.released")
	attrWaited    = attribute.Key("tierdedup.http.waited")
	attrPanicked  = attribute.Key("tierdedup.http.panicked")
)

// The answers a span's tierdedup.http.answer names.
const (
	answerExecuted    = "executed"
	answerReplayed    = "replayed"
	answerConflict    = "conflict"
	answerInFlight    = "in-flight"
	answerRejected    = "rejected"
	answerUnknown     = "unknown"
	answerUnavailable = "unavailable"
	answerAbandoned   = "abandoned"
)

// requestSpan is a handled request's span and what the middleware
// answered, set where each answer is decided (beside its Stats counter)
// and recorded once, as the request ends. Only the request's goroutine
// touches it. Its methods do nothing on nil: a request without a span.
type requestSpan struct {
	span                               trace.Span
	answer                             string
	status                             int
	stored, released, waited, didPanic bool
	err                                error
}

type requestSpanKey struct{}

// startSpan starts r's span (m.tracer is set) and returns r in its
// context, so the handler's spans are its children.
func (m *Middleware) startSpan(r *http.Request) (*http.Request, *requestSpan) {
	ctx, span := m.tracer.Start(r.Context(), spanName, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(attrMethod.String(r.Method), attrNamespace.String(m.o.Namespace)))
	sp := &requestSpan{span: span}
	return r.WithContext(context.WithValue(ctx, requestSpanKey{}, sp)), sp
}

// span returns r's span; nil without a TracerProvider.
func (m *Middleware) span(r *http.Request) *requestSpan {
	if m.tracer == nil {
		return nil
	}
	sp, _ := r.Context().Value(requestSpanKey{}).(*requestSpan)
	return sp
}

// answered records the answer, and its status (0: none was sent).
func (sp *requestSpan) answered(answer string, status int) {
	if sp != nil {
		sp.answer, sp.status = answer, status
	}
}

// executed records a handler's run: the status it answered, whether its
// response was stored, whether its claim was given back.
func (sp *requestSpan) executed(status int, stored, released bool) {
	if sp != nil {
		sp.answer, sp.status, sp.stored, sp.released = answerExecuted, status, stored, released
	}
}

// panicked records that the handler panicked, and the status sent (0: the
// response was aborted).
func (sp *requestSpan) panicked(status int) {
	if sp != nil {
		sp.didPanic, sp.status = true, status
	}
}

// setWaited records that the request waited for its key in flight.
func (sp *requestSpan) setWaited() {
	if sp != nil {
		sp.waited = true
	}
}

// failed records the engine's (or the store's) error.
func (sp *requestSpan) failed(err error) {
	if sp != nil {
		sp.err = err
	}
}

// end records the answer on the span and ends it: status Error for a
// panic, an error recorded (the engine's, or the store's), or a 5xx.
func (sp *requestSpan) end() {
	kvs := []attribute.KeyValue{attrAnswer.String(sp.answer)}
	if sp.status != 0 {
		kvs = append(kvs, attrStatus.Int(sp.status))
	}
	if sp.answer == answerExecuted {
		kvs = append(kvs, attrStored.Bool(sp.stored), attrReleased.Bool(sp.released))
	}
	if sp.waited {
		kvs = append(kvs, attrWaited.Bool(true))
	}
	if sp.didPanic {
		kvs = append(kvs, attrPanicked.Bool(true))
	}
	sp.span.SetAttributes(kvs...)
	if sp.err != nil {
		sp.span.RecordError(sp.err)
	}
	switch {
	case sp.didPanic:
		sp.span.SetStatus(codes.Error, "the handler panicked")
	case sp.err != nil:
		sp.span.SetStatus(codes.Error, sp.err.Error())
	case sp.status >= 500:
		sp.span.SetStatus(codes.Error, fmt.Sprintf("%s: %d", sp.answer, sp.status))
	}
	sp.span.End()
}
