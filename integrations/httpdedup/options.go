package httpdedup

import (
	"errors"
	"fmt"
	"log"
	"net/http"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier"
)

// ErrOptions reports invalid Options, or an engine the middleware cannot
// keep its promise with.
var ErrOptions = errors.New("httpdedup: invalid options")

// Header names the middleware reads and writes.
const (
	// HeaderKey is the request header holding the idempotency key.
	HeaderKey = "Idempotency-Key"
	// HeaderReplayed is set to "true" on every replayed response.
	HeaderReplayed = "Idempotent-Replayed"
	// HeaderStored is set on a response that retries will not get whole:
	// "headers" when its body did not fit the engine's MaxResultSize (a
	// replay has the status and stored headers, no body), "status" when
	// its stored headers did not fit either (a replay has the status
	// alone), "false" when the engine could not store it (a retry is
	// answered 500, outcome unknown).
	HeaderStored = "Idempotency-Stored"
)

// Options configure a Middleware. The zero value of each field is its
// default.
type Options struct {
	// Engine holds the keys; required. It must be one that never runs a
	// request twice: not FailOpen, not memory-only or bloom-only,
	// MaxAttempts 1 (a claim that ended without a commit or a give-back
	// is an unknown outcome), and in the embedded store DurableClaims (so a
	// crash leaves its claims counted). Set its MaxResultSize to the
	// largest response to replay whole (1 MiB is a good start).
	Engine *engine.Engine
	// Namespace is the engine namespace of the keys; default "http". Give
	// it a window of its own with the engine's Namespaces (NamespaceOptions.Window) (24 hours
	// is common for APIs).
	Namespace string
	// Methods are the methods whose requests the middleware handles when
	// they carry a key; default POST, PUT, PATCH and DELETE. Other requests
	// pass through, their key ignored.
	Methods []string
	// Require are the methods whose requests must carry a key (400
	// otherwise); default POST and PATCH. Each must be in Methods.
	Require []string
	// MaxKeyLength bounds the key, in bytes; default 255. The engine key
	// is the scope's 32-byte SHA-256 and the key, so 32 + MaxKeyLength
	// must not exceed the engine's MaxKeySize (ErrOptions).
	MaxKeyLength int
	// MaxBody bounds the request body read for the fingerprint, in bytes;
	// default 1 MiB. A longer body is answered 413, the handler not run.
	MaxBody int64
	// Scope returns the client a request comes from (an API key's ID, a
	// tenant, an authenticated subject), so that two clients' keys are
	// never the same key (the draft's security considerations). nil puts
	// every request in one scope: only for a single client. An error
	// answers 403, the handler not run.
	Scope func(r *http.Request) (string, error)
	// Fingerprint returns the bytes that identify a request's content,
	// hashed into the claim's digest: the same key with another
	// fingerprint is answered 422. nil hashes the method, path, query and
	// body. An error answers 400.
	Fingerprint func(r *http.Request, body []byte) ([]byte, error)
	// Store says which responses are stored and replayed; the others give
	// the claim back so the retry runs again. nil stores 2xx, 3xx and 4xx
	// except 408, 425 and 429, which ask the client to retry the same
	// request: a 5xx says the server failed, and the handler is expected
	// to have undone its effect.
	Store func(status int) bool
	// StoredHeaders are the response headers a replay repeats; default
	// Content-Type, Content-Encoding, Content-Language, Content-Location,
	// Location, ETag, Last-Modified, Cache-Control, Expires, Link and Vary.
	StoredHeaders []string
	// Wait, if positive, makes a request that meets its key in flight wait
	// up to Wait (bounded by its context) for the first response and replay
	// it, or run if the first gave its claim back; zero answers 409 at
	// once.
	Wait time.Duration
	// ConflictStatus answers a key reused with another request; default
	// 422 (the draft's).
	ConflictStatus int
	// CommitTimeout bounds each call to the engine: a claim (a store that
	// does not answer in time is a 503), and the commit or give-back after
	// the handler, made whether or not the client is still there; default
	// 10 s.
	CommitTimeout time.Duration
	// ProblemBase prefixes the type of every problem+json body; default
	// DefaultProblemBase.
	ProblemBase string
	// Logger receives handler panics and store failures; nil means
	// log.Default.
	Logger *log.Logger
	// TracerProvider, when set, wraps each request the middleware handles
	// (its method is one of Methods, and it carries a key or its method
	// requires one) in a span "tierdedup.http" of its tracer named for
	// this package, the handler's spans its children. The span has the
	// attributes http.request.method, tierdedup.namespace, the answer
	// tierdedup.http.answer (executed, replayed, conflict, in-flight,
	// rejected: 400, 403 or 413; unknown: 500, outcome unknown or a stored
	// response unreadable; unavailable: 503; abandoned: the client left
	// first) with http.response.status_code (the status sent; none when
	// abandoned or a panic aborted the response), and for executed
	// tierdedup.http.stored (the response was committed with the key) and
	// tierdedup.http.released (the claim was given back, so a retry runs
	// again); tierdedup.http.waited when it waited for its key in flight
	// (Wait), tierdedup.http.panicked when the handler panicked. A 5xx, a
	// panic, or an error of the engine (a claim it could not make, a
	// response it could not store: the error is recorded) sets status
	// Error. The key is never recorded. Nil means no spans, and costs
	// nothing.
	TracerProvider trace.TracerProvider
}

// scopeBytes is the length of a scope's digest, which starts every key.
const scopeBytes = 32

// defaultStoredHeaders are the headers a replay repeats by default.
var defaultStoredHeaders = []string{"Content-Type", "Content-Encoding", "Content-Language", "Content-Location",
	"Location", "ETag", "Last-Modified", "Cache-Control", "Expires", "Link", "Vary"}

// DefaultStore is the default Options.Store: 2xx, 3xx and 4xx except 408,
// 425 and 429.
func DefaultStore(status int) bool {
	return status >= 200 && status < 500 && status != http.StatusRequestTimeout &&
		status != http.StatusTooEarly && status != http.StatusTooManyRequests
}

// withDefaults checks o against its engine and fills in the defaults.
func (o Options) withDefaults() (Options, error) {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrOptions}, args...)...))
	}
	if o.Engine == nil {
		return o, fmt.Errorf("%w: Engine is nil", ErrOptions)
	}
	eo := o.Engine.Options()
	checkEngine(eo, bad)
	if o.Namespace == "" {
		o.Namespace = "http"
	}
	if o.Methods == nil {
		o.Methods = []string{http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}
	}
	if o.Require == nil {
		o.Require = []string{http.MethodPost, http.MethodPatch}
	}
	for _, m := range o.Require {
		if !slices.Contains(o.Methods, m) {
			bad("Require names %s, which Methods does not", m)
		}
	}
	switch {
	case o.MaxKeyLength == 0:
		o.MaxKeyLength = 255
	case o.MaxKeyLength < 0:
		bad("MaxKeyLength %d is negative", o.MaxKeyLength)
	}
	if scoped := scopeBytes + o.MaxKeyLength; scoped > eo.MaxKeySize {
		bad("MaxKeyLength %d: a key and its scope's %d-byte digest make %d bytes, over the engine's MaxKeySize %d", o.MaxKeyLength, scopeBytes, scoped, eo.MaxKeySize)
	}
	switch {
	case o.MaxBody == 0:
		o.MaxBody = 1 << 20
	case o.MaxBody < 0:
		bad("MaxBody %d is negative", o.MaxBody)
	}
	if o.Store == nil {
		o.Store = DefaultStore
	}
	if o.StoredHeaders == nil {
		o.StoredHeaders = defaultStoredHeaders
	}
	o.StoredHeaders = slices.Clone(o.StoredHeaders) // the caller's stays theirs
	for i, h := range o.StoredHeaders {
		o.StoredHeaders[i] = http.CanonicalHeaderKey(h)
	}
	if o.Wait < 0 {
		bad("Wait %v is negative", o.Wait)
	}
	switch {
	case o.ConflictStatus == 0:
		o.ConflictStatus = http.StatusUnprocessableEntity
	case o.ConflictStatus < 400 || o.ConflictStatus > 499:
		bad("ConflictStatus %d is not a 4xx", o.ConflictStatus)
	}
	switch {
	case o.CommitTimeout == 0:
		o.CommitTimeout = 10 * time.Second
	case o.CommitTimeout < 0:
		bad("CommitTimeout %v is negative", o.CommitTimeout)
	}
	if o.ProblemBase == "" {
		o.ProblemBase = DefaultProblemBase
	}
	if o.Logger == nil {
		o.Logger = log.Default()
	}
	return o, errors.Join(errs...)
}

// checkEngine reports, through bad, an engine configuration under which a
// request could run twice, or whose responses could not be replayed.
func checkEngine(eo engine.Options, bad func(format string, args ...any)) {
	name := eo.Name()
	switch {
	case eo.Tiers != engine.Default:
		bad("engine %s: a request's claim and response must be durable (the embedded store, Redis or PostgreSQL)", name)
	case eo.Backend != nil && eo.Backend.Claims() == tier.ClaimsInEngine && !eo.DurableClaims:
		bad("engine %s without DurableClaims: a crash while a handler runs would leave its key New, and the retry would run it again", name)
	}
	if eo.FailOpen {
		bad("engine %s with FailOpen: a store outage would run every retried request again", name)
	}
	if eo.MaxAttempts != 1 {
		bad("engine %s with MaxAttempts %d, want 1: a claim that ends without a commit (a crash, a lost lease) is a request whose outcome is unknown, answered 500 and never run again", name, eo.MaxAttempts)
	}
}

// slug is the last part of a problem type's URI: the title, lower case,
// spaces as dashes.
func slug(title string) string {
	return strings.ReplaceAll(strings.ToLower(title), " ", "-")
}

// DefaultProblemBase is the default Options.ProblemBase: the problem
// types' entries in the repository's docs/idempotency.md, one heading a
// type, so that each type resolves to what it means.
const DefaultProblemBase = "https://github.com/tierdedup/tierdedup/blob/main/docs/idempotency.md#"
