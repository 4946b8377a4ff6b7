package httpdedup

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime/debug"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/sfv"
)

// Middleware runs each keyed request's handler once per client and key
// inside its engine's window. It is safe for concurrent use.
type Middleware struct {
	o     Options
	e     *engine.Engine
	ns    *engine.Namespace
	lease time.Duration
	keep  int // the longest stored response: the engine's MaxResultSize
	// archive is how long the engine's archive keeps the namespace's keys
	// (0 without one, or for a namespace with a shorter window of its own).
	archive time.Duration
	tracer  trace.Tracer // nil without Options.TracerProvider
	stats   struct {
		requests, passed, executed, replayed, stored, notStored, bodiesNotKept, released,
		conflicts, inFlight, waited, unknown, badRequests, unavailable, panics atomic.Uint64
	}
}

// Stats are a Middleware's counters since New.
type Stats struct {
	// Requests is every request the middleware saw; Passed those it let
	// through unhandled (a method it does not handle, or no key where
	// none is required).
	Requests, Passed uint64
	// Executed counts handler runs; Stored the responses committed with
	// their key (BodiesNotKept of them without the body, or without body
	// and headers, too long for the engine's MaxResultSize); NotStored those the engine could not
	// store (their keys answer 500 once their lease ends); Released the
	// runs whose claim was given back (Options.Store said no, or a panic).
	Executed, Stored, BodiesNotKept, NotStored, Released uint64
	// Replayed counts stored responses sent again; Waited the requests
	// that waited for a key in flight (Options.Wait).
	Replayed, Waited uint64
	// Conflicts (422), InFlight (409), Unknown (500, a claim that ended
	// without a commit), BadRequests (400, 403, 413), Unavailable (503)
	// and Panics count the other answers.
	Conflicts, InFlight, Unknown, BadRequests, Unavailable, Panics uint64
}

// New checks opts and its engine and returns a Middleware.
func New(opts *Options) (*Middleware, error) {
	if opts == nil {
		opts = &Options{}
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	ns, err := o.Engine.Namespace(o.Namespace)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrOptions, err)
	}
	eo := o.Engine.Options()
	m := &Middleware{o: o, e: o.Engine, ns: ns, lease: eo.Lease, keep: eo.MaxResultSize}
	if o.TracerProvider != nil {
		m.tracer = o.TracerProvider.Tracer(scopeName)
	}
	if nso := eo.Namespaces[o.Namespace]; eo.Archive != nil && nso.Window == 0 {
		m.archive = eo.ArchiveWindow
		if nso.ArchiveWindow != 0 {
			m.archive = nso.ArchiveWindow
		}
	}
	return m, nil
}

// Stats returns the Middleware's counters.
func (m *Middleware) Stats() Stats {
	s := &m.stats
	return Stats{
		Requests: s.requests.Load(), Passed: s.passed.Load(), Executed: s.executed.Load(), Stored: s.stored.Load(),
		BodiesNotKept: s.bodiesNotKept.Load(), NotStored: s.notStored.Load(), Released: s.released.Load(),
		Replayed: s.replayed.Load(), Waited: s.waited.Load(), Conflicts: s.conflicts.Load(), InFlight: s.inFlight.Load(),
		Unknown: s.unknown.Load(), BadRequests: s.badRequests.Load(), Unavailable: s.unavailable.Load(), Panics: s.panics.Load(),
	}
}

// Handler returns next behind the middleware.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.stats.requests.Add(1)
		if !m.handles(r) {
			m.stats.passed.Add(1)
			next.ServeHTTP(w, r)
			return
		}
		if m.tracer != nil {
			var sp *requestSpan
			r, sp = m.startSpan(r)
			defer sp.end()
		}
		key, ok := m.key(w, r)
		if !ok {
			return
		}
		digest, ok := m.fingerprint(w, r)
		if !ok {
			return
		}
		m.serve(w, r, next, key, digest)
	})
}

// handles reports whether the middleware handles r, rather than passing it
// through: its method is one of Methods, and it carries a key or its
// method requires one.
func (m *Middleware) handles(r *http.Request) bool {
	return slices.Contains(m.o.Methods, r.Method) &&
		(len(r.Header.Values(HeaderKey)) > 0 || slices.Contains(m.o.Require, r.Method))
}

// key returns the scoped key of a request the middleware handles; ok false
// when it was answered (400, 403).
func (m *Middleware) key(w http.ResponseWriter, r *http.Request) (key []byte, ok bool) {
	lines := r.Header.Values(HeaderKey)
	switch {
	case len(lines) == 0: // its method requires one (handles)
		m.refuse(w, r, http.StatusBadRequest, titleMissing, fmt.Sprintf("%s requests need an %s header", r.Method, HeaderKey))
		return nil, false
	case len(lines) > 1:
		m.refuse(w, r, http.StatusBadRequest, titleMalformed, fmt.Sprintf("%d %s header lines, want one", len(lines), HeaderKey))
		return nil, false
	}
	item, err := sfv.ParseItem(lines[0])
	switch {
	case err != nil:
		m.refuse(w, r, http.StatusBadRequest, titleMalformed, "the key must be a quoted string (RFC 8941), such as \"8e03978e-40d5-43e8-bc93-6894a57f9324\"")
		return nil, false
	case item.Kind != sfv.String:
		m.refuse(w, r, http.StatusBadRequest, titleMalformed, "the key must be a quoted string (RFC 8941), not a token or number")
		return nil, false
	case item.Str == "" || len(item.Str) > m.o.MaxKeyLength:
		m.refuse(w, r, http.StatusBadRequest, titleMalformed, fmt.Sprintf("the key has %d bytes, want 1 to %d", len(item.Str), m.o.MaxKeyLength))
		return nil, false
	}
	scope := ""
	if m.o.Scope != nil {
		if scope, err = m.o.Scope(r); err != nil {
			m.refuse(w, r, http.StatusForbidden, titleScope, err.Error())
			return nil, false
		}
	}
	// The scope's SHA-256, a fixed length, first: no scope and key meet
	// another's, and a long scope (a bearer token) costs 32 bytes.
	sum := sha256.Sum256([]byte(scope))
	return append(sum[:], item.Str...), true
}

// fingerprint reads the body (giving the handler a copy) and returns the
// request's digest; ok false when it was answered (400, 413).
func (m *Middleware) fingerprint(w http.ResponseWriter, r *http.Request) (engine.Digest, bool) {
	var body []byte
	if r.Body != nil && r.Body != http.NoBody {
		b, err := io.ReadAll(io.LimitReader(r.Body, m.o.MaxBody+1))
		_ = r.Body.Close()
		switch {
		case err != nil:
			m.refuse(w, r, http.StatusBadRequest, titleFingerprint, "the request body could not be read")
			return engine.Digest{}, false
		case int64(len(b)) > m.o.MaxBody:
			m.refuse(w, r, http.StatusRequestEntityTooLarge, titleTooLarge, fmt.Sprintf("a keyed request's body is at most %d bytes", m.o.MaxBody))
			return engine.Digest{}, false
		}
		body = b
	}
	r.Body = io.NopCloser(bytesReader(body))
	r.ContentLength = int64(len(body))
	var sum [sha256.Size]byte
	if m.o.Fingerprint != nil {
		fp, err := m.o.Fingerprint(r, body)
		if err != nil {
			m.refuse(w, r, http.StatusBadRequest, titleFingerprint, err.Error())
			return engine.Digest{}, false
		}
		sum = sha256.Sum256(fp)
	} else {
		h := sha256.New()
		for _, part := range []string{r.Method, r.URL.EscapedPath(), r.URL.RawQuery} {
			_, _ = io.WriteString(h, strconv.Itoa(len(part))+":"+part)
		}
		h.Write(body)
		h.Sum(sum[:0])
	}
	return engine.Digest(sum[:16]), true
}

// refuse answers a request the middleware will not run (400, 403, 413).
func (m *Middleware) refuse(w http.ResponseWriter, r *http.Request, status int, title, detail string) {
	m.stats.badRequests.Add(1)
	m.span(r).answered(answerRejected, status)
	m.problem(w, status, title, detail, 0)
}

// detailUnknown explains a 500 for a request whose outcome is unknown.
const detailUnknown = "the first request with this key did not complete (its server stopped, lost its claim or its upstream): whether it took effect is unknown, and it will not run again"

// settle is how a request that meets its key in flight retries its claim
// before answering 409 (about 100 ms in all): the other request may only
// be reading the key's stored response (a claim that is not New holds the
// key while the engine reads it), which takes a store read, or a little
// longer on a loaded machine.
var settle = []time.Duration{time.Millisecond, 2 * time.Millisecond, 4 * time.Millisecond, 8 * time.Millisecond,
	16 * time.Millisecond, 32 * time.Millisecond, 37 * time.Millisecond}

// serve claims key and answers as its outcome says.
func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler, key []byte, digest engine.Digest) {
	ctx := r.Context()
	var waitUntil time.Time
	for try := 0; ; try++ {
		cctx, cancel := context.WithTimeout(ctx, m.o.CommitTimeout)
		c, err := m.ns.ClaimDigest(cctx, key, digest)
		cancel()
		if err != nil {
			m.failed(w, r, err)
			return
		}
		switch c.Outcome {
		case engine.New:
			m.execute(w, r, next, c)
		case engine.Duplicate:
			m.replay(w, r, c.Result)
		case engine.Conflict:
			m.stats.conflicts.Add(1)
			m.span(r).answered(answerConflict, m.o.ConflictStatus)
			m.problem(w, m.o.ConflictStatus, titleConflict, "this key was used with another request (method, path, query or body)", 0)
		case engine.Poison:
			m.stats.unknown.Add(1)
			m.span(r).answered(answerUnknown, http.StatusInternalServerError)
			m.problem(w, http.StatusInternalServerError, titleUnknown, detailUnknown, 0)
		case engine.InFlight:
			if try < len(settle) {
				if !sleep(ctx, settle[try]) {
					m.span(r).answered(answerAbandoned, 0)
					return
				}
				continue
			}
			if m.o.Wait > 0 {
				if waitUntil.IsZero() {
					waitUntil = time.Now().Add(m.o.Wait)
					m.stats.waited.Add(1)
					m.span(r).setWaited()
				}
				if time.Now().Before(waitUntil) {
					if !sleep(ctx, min(50*time.Millisecond, time.Until(waitUntil))) {
						m.span(r).answered(answerAbandoned, 0)
						return
					}
					continue
				}
			}
			m.stats.inFlight.Add(1)
			m.span(r).answered(answerInFlight, http.StatusConflict)
			m.problem(w, http.StatusConflict, titleInFlight, "a request with this key is being processed; retry after it completes", time.Second)
		default:
			m.failed(w, r, fmt.Errorf("httpdedup: outcome %v", c.Outcome))
		}
		return
	}
}

// failed answers a claim the engine could not make: nothing ran.
func (m *Middleware) failed(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		m.span(r).answered(answerAbandoned, 0)
		return // the client left: nobody to answer
	}
	if errors.Is(err, engine.ErrKeyTooLong) || errors.Is(err, engine.ErrEmptyKey) {
		// New keeps MaxKeyLength within the engine's limit; this is the
		// request's fault if it happens, never the store's.
		m.refuse(w, r, http.StatusBadRequest, titleMalformed, "the key is longer than the store accepts")
		return
	}
	m.stats.unavailable.Add(1)
	m.span(r).answered(answerUnavailable, http.StatusServiceUnavailable)
	m.span(r).failed(err)
	m.o.Logger.Printf("httpdedup: %s %s: %v", r.Method, r.URL.Path, err)
	m.problem(w, http.StatusServiceUnavailable, titleUnavailable, "the request was not run: the idempotency store cannot answer now", time.Second)
}

// replay sends a stored response.
func (m *Middleware) replay(w http.ResponseWriter, r *http.Request, result []byte) {
	s, err := decodeStored(result)
	if err != nil {
		m.o.Logger.Printf("%v", err)
		m.stats.unknown.Add(1)
		m.span(r).answered(answerUnknown, http.StatusInternalServerError)
		m.span(r).failed(err)
		m.problem(w, http.StatusInternalServerError, titleDamaged, "the stored response of this key cannot be read; the request will not run again", 0)
		return
	}
	m.stats.replayed.Add(1)
	m.span(r).answered(answerReplayed, s.status)
	h := w.Header()
	for name, vs := range s.header {
		h[name] = vs
	}
	h.Set(HeaderReplayed, "true")
	if mark := storedMark(&s); mark != "" {
		h.Set(HeaderStored, mark)
	}
	if bodyAllowed(s.status) {
		h.Set("Content-Length", strconv.Itoa(len(s.body)))
	}
	w.WriteHeader(s.status)
	_, _ = w.Write(s.body)
}

// runState is what a handler tells the middleware about its request
// (Unknown), found in the request's context.
type runState struct{ unknown atomic.Bool }

type runStateKey struct{}

// Unknown tells the middleware, from a handler, that whether r took effect
// cannot be known (a proxy whose upstream connection broke after the
// request went out): the handler's own response is sent, and every retry
// of the key is answered 500 (outcome unknown) instead of running again.
// It does nothing to a request the middleware is not running.
func Unknown(r *http.Request) {
	if s, ok := r.Context().Value(runStateKey{}).(*runState); ok {
		s.unknown.Store(true)
	}
}

// errNotStored is a handler's run whose response is not stored (a
// status Options.Store refuses, or a panic): its claim is given back.
var errNotStored = errors.New("httpdedup: the response is not stored")

// execute runs the handler for a New claim in the engine's claim session
// (engine.Run: the lease kept while it runs, every third of it), then
// stores its response (or gives the claim back) and sends it.
func (m *Middleware) execute(w http.ResponseWriter, r *http.Request, next http.Handler, c engine.Claim) {
	m.stats.executed.Add(1)
	rec := newRecorder(w, m.keep)
	state := &runState{}
	var panicked any
	var s stored
	err := m.e.Run(r.Context(), &c, engine.SessionOptions{
		Heartbeat: engine.HeartbeatOptions{Lease: m.lease, Every: m.lease / 3},
		// The handler keeps the request's context: the claim's loss does
		// not abort it; its response is sent but not stored over another's.
		Uncanceled: true,
		// Nothing to replay: the retry runs again, and the give-back counts
		// no attempt. One that fails leaves the claim to end with its
		// lease, and the key then answers 500 (outcome unknown), never a
		// second run.
		NoAttempt:       true,
		GiveBackTimeout: m.o.CommitTimeout,
		GiveBackFailed: func(err error) {
			m.o.Logger.Printf("httpdedup: give back %s %s: %v", r.Method, r.URL.Path, err)
		},
	}, func(context.Context) error {
		panicked = m.run(next, rec, r.WithContext(context.WithValue(r.Context(), runStateKey{}, state)))
		// Unknown outranks a panic: a proxy whose upstream broke
		// mid-response aborts the handler after the request took effect.
		if !state.unknown.Load() && (panicked != nil || !m.o.Store(rec.finalStatus())) {
			return errNotStored
		}
		s = rec.stored(m.o.StoredHeaders)
		if state.unknown.Load() {
			// Retries get this, not the handler's response, which says
			// nothing of the request's effect.
			s = stored{status: http.StatusInternalServerError, bodyKept: true,
				header: http.Header{"Content-Type": {"application/problem+json"}, "Cache-Control": {"no-store"}},
				body:   m.problemBody(http.StatusInternalServerError, titleUnknown, detailUnknown)}
		}
		return nil
	}, func(ctx context.Context, c engine.Claim) error {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.o.CommitTimeout)
		defer cancel()
		return m.commit(ctx, &c, &s)
	})
	unknown := state.unknown.Load()
	if unknown {
		m.stats.unknown.Add(1)
	}
	extra := http.Header{}
	switch {
	case errors.Is(err, errNotStored):
		m.stats.released.Add(1)
		m.span(r).executed(rec.finalStatus(), false, true)
		if panicked != nil {
			m.panicked(rec, r, panicked, false)
			return
		}
		rec.send(nil)
		return
	case err != nil:
		// The handler ran; its response is sent, and the claim is left to
		// end: a retry is answered 500 (outcome unknown), never run again.
		m.stats.notStored.Add(1)
		m.span(r).failed(err)
		m.o.Logger.Printf("httpdedup: store %s %s: %v", r.Method, r.URL.Path, err)
		extra.Set(HeaderStored, "false")
	case storedMark(&s) != "":
		m.stats.stored.Add(1)
		m.stats.bodiesNotKept.Add(1)
		extra.Set(HeaderStored, storedMark(&s))
	default:
		m.stats.stored.Add(1)
	}
	m.span(r).executed(rec.finalStatus(), err == nil, false)
	if panicked != nil {
		m.panicked(rec, r, panicked, unknown)
		return
	}
	rec.send(extra)
}

// commit commits c with s as its result: without the body if the whole
// does not fit the engine's MaxResultSize, and without the headers if
// they alone do not (the status always does).
func (m *Middleware) commit(ctx context.Context, c *engine.Claim, s *stored) error {
	c.Result = s.encode(nil)
	if len(c.Result) > m.keep && s.bodyKept {
		s.bodyKept = false
		c.Result = s.encode(c.Result[:0])
	}
	if len(c.Result) > m.keep {
		s.header, s.headersDropped = nil, true
		c.Result = s.encode(c.Result[:0])
	}
	return m.e.Commit(ctx, *c)
}

// storedMark is the HeaderStored value of a response stored as s, "" when
// a replay has it whole.
func storedMark(s *stored) string {
	switch {
	case s.headersDropped:
		return "status"
	case !s.bodyKept:
		return "headers"
	}
	return ""
}

// run calls the handler and returns what it panicked with, if anything.
func (m *Middleware) run(next http.Handler, w http.ResponseWriter, r *http.Request) (panicked any) {
	defer func() {
		if p := recover(); p != nil {
			panicked = p
			if p != http.ErrAbortHandler {
				m.o.Logger.Printf("httpdedup: handler panic on %s %s: %v\n%s", r.Method, r.URL.Path, p, debug.Stack())
			}
		}
	}()
	next.ServeHTTP(w, r)
	return nil
}

// panicked answers a handler that panicked: 500 if nothing was sent yet
// (outcome unknown if it said so, otherwise its claim was given back);
// a response already streaming is aborted, as net/http aborts it, so the
// client never takes a cut body for a whole one. http.ErrAbortHandler is
// re-raised, as net/http expects.
func (m *Middleware) panicked(rec *recorder, r *http.Request, p any, unknown bool) {
	m.stats.panics.Add(1)
	switch {
	case p == http.ErrAbortHandler, rec.streaming:
		m.span(r).panicked(0)
		panic(http.ErrAbortHandler)
	case unknown:
		m.span(r).panicked(http.StatusInternalServerError)
		m.problem(rec.w, http.StatusInternalServerError, titleUnknown, detailUnknown, 0)
	default:
		m.span(r).panicked(http.StatusInternalServerError)
		m.problem(rec.w, http.StatusInternalServerError, titlePanic, "the handler failed; the request may be retried with the same key", 0)
	}
}

// sleep waits d, or until ctx ends (false).
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
