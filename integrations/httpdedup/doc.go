// Package httpdedup makes HTTP requests idempotent under an Idempotency-Key
// header (the IETF httpapi draft "The Idempotency-Key HTTP Header Field"):
// a net/http middleware over a tierdedup engine that runs the handler once
// per key and client inside the engine's window, and answers every retry
// with the first response, and a client http.RoundTripper that gives each
// logical request one key and retries it.
//
// It owns the mapping from HTTP to the engine's claims:
//
//   - the key: the header parsed as an RFC 8941 String (at most
//     Options.MaxKeyLength bytes), scoped per client by Options.Scope, so
//     two clients' keys never meet;
//   - the request's fingerprint (method, path, query and body by default,
//     Options.Fingerprint otherwise), stored as the claim's digest: the
//     same key with another request is a Conflict, answered 422;
//   - New: the handler runs, its lease kept alive by Extend; its response
//     is buffered and, if Options.Store says so, committed with the key
//     (status, the headers Options.StoredHeaders names, and the body when
//     the whole fits the engine's MaxResultSize) before it is sent;
//     otherwise (a 5xx, 408, 425, 429 or a panic by default) the claim is
//     given back uncounted and the retry runs again;
//   - Duplicate: the stored response replayed, marked Idempotent-Replayed;
//   - InFlight: 409 with Retry-After, or, with Options.Wait, the first
//     response once it is stored;
//   - Poison: the first request's claim ended without a commit or a give
//     back (its process crashed, or its lease was lost), so its outcome is
//     unknown: 500, never a second execution;
//   - an engine that cannot answer (a store down, a closed engine): 503,
//     the handler not run.
//
// Every refusal has an application/problem+json body (RFC 9457) whose type
// names the case. With Options.TracerProvider, each request it handles is
// an OpenTelemetry span saying which of these answers it got.
//
// It must never run a handler twice for one scoped key inside the window:
// so it refuses an engine that would (FailOpen, memory-only or bloom-only,
// MaxAttempts other than 1, or the embedded store without DurableClaims),
// gives claims back only uncounted, and never releases a claim whose
// response it could not store. It never decides a duplicate itself: the
// engine does. The engine never imports it.
package httpdedup
