package oteldedup

import (
	"context"
	"errors"
	"math"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/statsmetrics"
)

// ScopeName is the instrumentation scope of the meter and tracer this
// package gets from a provider: its import path.
const ScopeName = "github.com/tierdedup/tierdedup/integrations/oteldedup"

// Option configures Register.
type Option func(*config)

type config struct {
	attrs []attribute.KeyValue
}

// WithAttributes adds attrs to every point Register's instruments report,
// to tell engines of one process apart (for example
// attribute.String("engine", "payments")), as promdedup's constant labels
// do.
func WithAttributes(attrs ...attribute.KeyValue) Option {
	return func(c *config) { c.attrs = append(c.attrs, attrs...) }
}

// Registration is the instruments and the callback Register made.
type Registration struct {
	once sync.Once
	reg  metric.Registration // nil without a provider
	err  error
}

// Unregister removes the callback: the instruments report nothing more
// and the engine is no longer read. It is safe to call more than once,
// and on the Registration of a nil provider; only the first call
// unregisters, and every call returns its error.
func (r *Registration) Unregister() error {
	r.once.Do(func() {
		if r.reg != nil {
			r.err = r.reg.Unregister()
		}
	})
	return r.err
}

// instruments are one metric's instruments: value for a Counter (int) or
// a Gauge (float); sum and count for a Histogram.
type instruments struct {
	count metric.Int64Observable
	value metric.Float64Observable
	sum   metric.Float64Observable
}

// Register makes an observable instrument of every metric of the set
// (the table in the package documentation) with mp's meter named
// ScopeName, and one callback that reads e.Stats once per collection and
// observes them all. A nil mp registers nothing and returns a
// Registration whose Unregister does nothing.
//
// Nothing runs between collections: no goroutine, no timer, nothing on
// the engine's calls. Unregister when the engine closes (a closed
// engine's points would stay as they were).
func Register(e *engine.Engine, mp metric.MeterProvider, opts ...Option) (*Registration, error) {
	if e == nil {
		return nil, errors.New("oteldedup: Register needs an engine")
	}
	if mp == nil {
		return &Registration{}, nil
	}
	var c config
	for _, o := range opts {
		o(&c)
	}
	meter := mp.Meter(ScopeName)
	insts := make(map[string]instruments, len(statsmetrics.Metrics))
	var all []metric.Observable
	var errs []error
	for _, m := range statsmetrics.Metrics {
		var in instruments
		var err error
		desc := metric.WithDescription(m.Help)
		switch m.Kind {
		case statsmetrics.Counter:
			in.count, err = meter.Int64ObservableCounter(m.OTel, desc, metric.WithUnit(m.Unit))
			all = append(all, in.count)
		case statsmetrics.Gauge:
			in.value, err = meter.Float64ObservableGauge(m.OTel, desc, metric.WithUnit(m.Unit))
			all = append(all, in.value)
		case statsmetrics.Histogram:
			// An asynchronous histogram does not exist in OpenTelemetry:
			// the distribution's sum and count, as counters.
			var err2 error
			in.sum, err = meter.Float64ObservableCounter(m.OTel+".sum", metric.WithDescription(m.Help+" Sum of the observations."), metric.WithUnit(m.Unit))
			in.count, err2 = meter.Int64ObservableCounter(m.OTel+".count", metric.WithDescription(m.Help+" Count of the observations."), metric.WithUnit(m.CountUnit))
			err = errors.Join(err, err2)
			all = append(all, in.sum, in.count)
		}
		errs = append(errs, err)
		insts[m.Name] = in
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	base := c.attrs
	reg, err := meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := e.Stats()
		statsmetrics.Each(&s, func(p statsmetrics.Point) {
			in := insts[p.Metric.Name]
			kvs := make([]attribute.KeyValue, len(base), len(base)+len(p.Labels))
			copy(kvs, base)
			for i, v := range p.Labels {
				kvs = append(kvs, attribute.String(p.Metric.Labels[i], v))
			}
			at := metric.WithAttributeSet(attribute.NewSet(kvs...))
			switch p.Metric.Kind {
			case statsmetrics.Counter:
				o.ObserveInt64(in.count, toInt64(p.Count), at)
			case statsmetrics.Gauge:
				o.ObserveFloat64(in.value, p.Value, at)
			case statsmetrics.Histogram:
				o.ObserveFloat64(in.sum, p.Histogram.Sum, at)
				o.ObserveInt64(in.count, toInt64(p.Histogram.Count), at)
			}
		})
		return nil
	}, all...)
	if err != nil {
		return nil, err
	}
	return &Registration{reg: reg}, nil
}

// toInt64 is n, at most math.MaxInt64 (OpenTelemetry's counters are
// signed; no engine counts that far).
func toInt64(n uint64) int64 {
	return int64(min(n, math.MaxInt64))
}
