// Command idemproxy is a reverse proxy that makes any HTTP API idempotent
// under the Idempotency-Key header: it forwards each keyed request to the
// upstream once per client and key inside its window, and answers every
// retry with the upstream's first response (integrations/httpdedup).
//
//	idemproxy -listen 127.0.0.1:8080 -upstream http://127.0.0.1:9000
//
// The keys live in the embedded store (-dir) by default, or in Redis
// (-redis) or PostgreSQL (-postgres), which several proxies share so that
// a retry that reaches another proxy is answered the same. -admin serves
// /metrics (Prometheus), /healthz and /readyz. SIGTERM or SIGINT stops
// accepting requests, lets those in flight finish (-shutdown-timeout) and
// closes the store. `idemproxy -h` lists every flag.
//
// It owns the wiring (flags, engine, proxy, admin endpoints, shutdown) and
// nothing of the idempotency itself, which is the middleware's and the
// engine's. It must never forward a request whose key it could not claim,
// nor let a request's upstream call be cut by its client leaving: the
// upstream's response is stored for the retry.
package main
