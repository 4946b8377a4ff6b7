package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/integrations/httpdedup"
	"github.com/tierdedup/tierdedup/integrations/promdedup"
	"github.com/tierdedup/tierdedup/tier/embedded"
	"github.com/tierdedup/tierdedup/tier/postgres"
	"github.com/tierdedup/tierdedup/tier/redis"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr, nil); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "idemproxy:", err)
		}
		os.Exit(2)
	}
}

// config is what the flags say.
type config struct {
	listen, admin, upstream                  string
	dir, redisAddr, redisPrefix, pg, pgTable string
	require, methods, scopeHeader            string
	window, lease, wait, upstreamTimeout     time.Duration
	shutdownTimeout                          time.Duration
	maxStored, maxKey, maxHeader             int
	maxBody                                  int64
}

func parseFlags(args []string, out io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("idemproxy", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprintf(out, "Usage: idemproxy -upstream URL [flags]\n\n"+
			"A reverse proxy that runs each request carrying an Idempotency-Key once per client\n"+
			"and key, and answers its retries with the first response (marked Idempotent-Replayed).\n\n")
		fs.PrintDefaults()
	}
	fs.StringVar(&c.listen, "listen", "127.0.0.1:8080", "address the proxy serves on")
	fs.StringVar(&c.admin, "admin", "127.0.0.1:9464", "address of /metrics, /healthz and /readyz; empty for none")
	fs.StringVar(&c.upstream, "upstream", "", "the API the requests go to, such as http://127.0.0.1:9000 (required)")
	fs.StringVar(&c.dir, "dir", "idemproxy-data", "directory of the embedded store (when neither -redis nor -postgres)")
	fs.StringVar(&c.redisAddr, "redis", "", "Redis host:port or redis:// URL: keys shared by every proxy on it")
	fs.StringVar(&c.redisPrefix, "redis-prefix", "idemproxy:", "prefix of the Redis keys")
	fs.StringVar(&c.pg, "postgres", "", "PostgreSQL connection string: keys shared by every proxy on it")
	fs.StringVar(&c.pgTable, "postgres-table", "idemproxy", "PostgreSQL table of the keys")
	fs.StringVar(&c.require, "require", "POST,PATCH", "methods whose requests must carry a key (400 otherwise)")
	fs.StringVar(&c.methods, "methods", "POST,PUT,PATCH,DELETE", "methods whose keyed requests are deduplicated; others pass through")
	fs.StringVar(&c.scopeHeader, "scope-header", "Authorization", "request header naming the client, every line of it: keys of two clients never meet. Authorization (the default) scopes by the credential a request carries, and puts requests without one in one anonymous scope; another header (an API key, a tenant) is required, 403 without it. Empty: every client in one scope, only behind a gateway that scopes keys itself")
	fs.DurationVar(&c.window, "window", 24*time.Hour, "how long a completed request's key is kept and replayed")
	fs.DurationVar(&c.lease, "lease", 30*time.Second, "a request's claim, extended while the upstream runs; the key of a request whose proxy was killed answers 500 (outcome unknown): at once in the embedded store, after 409s for this long in Redis or PostgreSQL")
	fs.DurationVar(&c.wait, "wait", 0, "how long a retry of a request in progress waits for its response (0: 409 at once)")
	fs.DurationVar(&c.upstreamTimeout, "upstream-timeout", time.Minute, "bound on one upstream call; it goes on when its client leaves")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 30*time.Second, "how long SIGTERM waits for requests in flight")
	fs.IntVar(&c.maxStored, "max-stored", 1<<20, "largest stored response in bytes (status, headers, body); a longer body is served, not replayed")
	fs.IntVar(&c.maxKey, "max-key", 255, "longest Idempotency-Key in bytes")
	fs.Int64Var(&c.maxBody, "max-body", 1<<20, "largest keyed request body in bytes (413 beyond)")
	fs.IntVar(&c.maxHeader, "max-header-bytes", 64<<10, "largest request header block in bytes (431 beyond)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	var errs []error
	if fs.NArg() > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments %q", fs.Args()))
	}
	if c.upstream == "" {
		errs = append(errs, errors.New("-upstream is required"))
	} else if u, err := url.Parse(c.upstream); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, fmt.Errorf("-upstream %q: want http://host:port or https://host:port", c.upstream))
	}
	if c.redisAddr != "" && c.pg != "" {
		errs = append(errs, errors.New("-redis and -postgres: choose one store"))
	}
	return c, errors.Join(errs...)
}

// run serves until ctx ends, then shuts down; ready, if not nil, gets the
// proxy's and the admin listener's addresses once both accept.
func run(ctx context.Context, args []string, out io.Writer, ready func(proxy, admin string)) error {
	c, err := parseFlags(args, out)
	if err != nil {
		return err
	}
	logger := log.New(out, "idemproxy: ", log.LstdFlags)
	e, closeStore, err := openEngine(c, logger)
	if err != nil {
		return err
	}
	defer closeStore()
	m, err := httpdedup.New(&httpdedup.Options{
		Engine: e, Methods: split(c.methods), Require: split(c.require), MaxKeyLength: c.maxKey,
		MaxBody: c.maxBody, Scope: scope(c.scopeHeader), Wait: c.wait, Logger: logger,
	})
	if err != nil {
		return err
	}
	up, _ := url.Parse(c.upstream)
	proxy := &http.Server{Handler: m.Handler(reverseProxy(up, c.upstreamTimeout, logger)), ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: c.maxHeader, ErrorLog: logger}
	ln, err := net.Listen("tcp", c.listen)
	if err != nil {
		return fmt.Errorf("-listen %s: %w", c.listen, err)
	}
	var admin *http.Server
	adminAddr := ""
	var draining atomic.Bool
	if c.admin != "" {
		aln, err := net.Listen("tcp", c.admin)
		if err != nil {
			ln.Close()
			return fmt.Errorf("-admin %s (/metrics, /healthz, /readyz; another address, or -admin \"\" for none): %w", c.admin, err)
		}
		admin = &http.Server{Handler: adminMux(e, m, &draining), ReadHeaderTimeout: 10 * time.Second, ErrorLog: logger}
		adminAddr = aln.Addr().String()
		go func() { _ = admin.Serve(aln) }()
	}
	served := make(chan error, 1)
	go func() { served <- proxy.Serve(ln) }()
	logger.Printf("serving %s for %s (%s, window %v)", ln.Addr(), c.upstream, storeName(c), c.window)
	if ready != nil {
		ready(ln.Addr().String(), adminAddr)
	}
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	// Not ready any more; the requests in flight finish (their responses
	// stored), then the store closes.
	draining.Store(true)
	sctx, cancel := context.WithTimeout(context.Background(), c.shutdownTimeout)
	defer cancel()
	err = proxy.Shutdown(sctx)
	if admin != nil {
		_ = admin.Shutdown(sctx)
	}
	logger.Printf("stopped: %+v", m.Stats())
	return err
}

// openEngine opens the store the flags name, with what the middleware
// needs of it; the returned function closes the engine, then its client.
func openEngine(c config, logger *log.Logger) (*engine.Engine, func(), error) {
	o := engine.Options{
		Window: c.window, Lease: c.lease, MaxAttempts: 1, MaxResultSize: c.maxStored,
		// A key is the scope's 32-byte digest and the client's key.
		MaxKeySize: 32 + c.maxKey,
		Logger:     slog.New(slog.NewTextHandler(logger.Writer(), nil)),
	}
	closeClient := func() {}
	switch {
	case c.redisAddr != "":
		opts, err := redisOptions(c.redisAddr)
		if err != nil {
			return nil, nil, err
		}
		client := goredis.NewClient(opts)
		closeClient = func() { _ = client.Close() }
		o.Backend = redis.NewBackend(client, redis.Config{Prefix: c.redisPrefix, RequireNoEviction: true})
	case c.pg != "":
		pool, err := pgxpool.New(context.Background(), c.pg)
		if err != nil {
			return nil, nil, fmt.Errorf("-postgres: %w", err)
		}
		closeClient = pool.Close
		o.Backend = postgres.NewBackend(pool, postgres.Config{Table: c.pgTable})
	default:
		o.Backend, o.DurableClaims = embedded.Dir(c.dir), true
	}
	e, err := engine.Open(&o)
	if err != nil {
		closeClient()
		return nil, nil, err
	}
	return e, func() {
		if err := e.Close(); err != nil {
			logger.Printf("close: %v", err)
		}
		closeClient()
	}, nil
}

// redisOptions reads -redis: host:port or a redis:// URL.
func redisOptions(addr string) (*goredis.Options, error) {
	if strings.Contains(addr, "://") {
		o, err := goredis.ParseURL(addr)
		if err != nil {
			return nil, fmt.Errorf("-redis: %w", err)
		}
		return o, nil
	}
	return &goredis.Options{Addr: addr}, nil
}

// reverseProxy forwards to up. The upstream call is detached from the
// client's connection (a client that leaves does not cut a request the
// upstream may be running; its response is stored for the retry) and
// bounded by timeout. A failure after the request went out is an unknown
// outcome (httpdedup.Unknown); before, the retry may run.
func reverseProxy(up *url.URL, timeout time.Duration, logger *log.Logger) http.Handler {
	type sentKey struct{}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(up)
			pr.SetXForwarded()
		},
		// Connections to the one upstream are kept for reuse: the
		// default keeps two, and every request past them opens one.
		Transport:  upstreamTransport(),
		BufferPool: bufferPool{},
		ErrorLog:   logger,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Value(sentKey{}).(*atomic.Bool).Load() {
				httpdedup.Unknown(r)
			}
			logger.Printf("upstream %s %s: %v", r.Method, r.URL.Path, err)
			w.WriteHeader(http.StatusBadGateway)
		},
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sent := new(atomic.Bool)
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), timeout)
		defer cancel()
		ctx = httptrace.WithClientTrace(context.WithValue(ctx, sentKey{}, sent), &httptrace.ClientTrace{
			WroteHeaders: func() { sent.Store(true) },
		})
		r = r.WithContext(ctx)
		hb := &heldBack{w: w}
		defer func() {
			p := recover()
			switch {
			case p == nil:
			case hb.clientErr != nil:
				// The client left while a streamed response went to it:
				// the upstream answered whole, and the middleware stores
				// what it kept (the status and headers).
				logger.Printf("client left %s %s: %v", r.Method, r.URL.Path, hb.clientErr)
			default:
				// The upstream's body broke off (ReverseProxy aborts): it
				// answered, so the request took effect, or may have.
				if sent.Load() {
					httpdedup.Unknown(r)
				}
				panic(p)
			}
		}()
		rp.ServeHTTP(hb, r)
	})
}

// heldBack hides the middleware's Flush from ReverseProxy, which flushes a
// response of unknown length at every write: the response is then held
// back until it is stored, as any other (up to -max-stored, streamed
// beyond). It remembers the client's write error, which tells a client
// that left from an upstream that broke off.
type heldBack struct {
	w         http.ResponseWriter
	clientErr error
}

func (h *heldBack) Header() http.Header  { return h.w.Header() }
func (h *heldBack) WriteHeader(code int) { h.w.WriteHeader(code) }
func (h *heldBack) Write(p []byte) (int, error) {
	n, err := h.w.Write(p)
	if err != nil && h.clientErr == nil {
		h.clientErr = err
	}
	return n, err
}

// bufferPool lends ReverseProxy its 32 KiB copy buffers (without one it
// allocates one a response).
type bufferPool struct{}

var buffers = sync.Pool{New: func() any { return new([32 << 10]byte) }}

func (bufferPool) Get() []byte  { return buffers.Get().(*[32 << 10]byte)[:] }
func (bufferPool) Put(b []byte) { buffers.Put((*[32 << 10]byte)(b)) }

// upstreamTransport is http.DefaultTransport's settings with up to 512
// idle connections to the upstream.
func upstreamTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns, t.MaxIdleConnsPerHost = 512, 512
	return t
}

// adminMux serves /metrics (the engine's and the proxy's counters),
// /healthz (the process runs) and /readyz (the store answers, and the
// proxy is not draining).
func adminMux(e *engine.Engine, m *httpdedup.Middleware, draining *atomic.Bool) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(promdedup.New(e, nil), statsCollector{m})
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	ns, _ := e.Namespace("\x01idemproxy-ready") // a probe namespace no request uses
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if draining.Load() {
			http.Error(w, "draining", http.StatusServiceUnavailable)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if ns == nil {
			http.Error(w, "no probe namespace", http.StatusInternalServerError)
			return
		}
		if _, err := ns.Lookup(ctx, []byte("probe")); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}

// statsCollector exports the middleware's counters.
type statsCollector struct{ m *httpdedup.Middleware }

var statsDesc = prometheus.NewDesc("idemproxy_requests_total", "Requests by what the proxy answered.", []string{"answer"}, nil)

func (statsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- statsDesc }

func (c statsCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.m.Stats()
	for answer, v := range map[string]uint64{
		"passed": s.Passed, "executed": s.Executed, "stored": s.Stored, "body_not_kept": s.BodiesNotKept,
		"not_stored": s.NotStored, "released": s.Released, "replayed": s.Replayed, "waited": s.Waited,
		"conflict": s.Conflicts, "in_flight": s.InFlight, "unknown": s.Unknown, "bad_request": s.BadRequests,
		"unavailable": s.Unavailable, "panic": s.Panics,
	} {
		ch <- prometheus.MustNewConstMetric(statsDesc, prometheus.CounterValue, float64(v), answer)
	}
}

// scope returns the middleware's Scope for -scope-header: every line of
// the header (the middleware keys by its SHA-256); Authorization optional
// (no credential: the anonymous scope), any other header required; none
// for "".
func scope(header string) func(*http.Request) (string, error) {
	if header == "" {
		return nil
	}
	return httpdedup.HeaderScope(header, http.CanonicalHeaderKey(header) != "Authorization")
}

func split(s string) []string {
	out := []string{} // empty, not nil: "-require ''" requires nothing
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(strings.ToUpper(f)); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// storeName says which store the flags chose.
func storeName(c config) string {
	switch {
	case c.redisAddr != "":
		return "Redis " + c.redisAddr
	case c.pg != "":
		return "PostgreSQL table " + c.pgTable
	}
	return "embedded store " + c.dir
}
