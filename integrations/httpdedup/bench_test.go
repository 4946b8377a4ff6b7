package httpdedup_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/integrations/httpdedup"
	"github.com/tierdedup/tierdedup/tier/redis"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// BenchmarkMiddleware serves a small JSON handler in process, 16 requests
// at a time, bare and behind the middleware (the embedded store, and
// Redis), with a new key per request and with replays of 1,000 stored
// keys; it reports requests/s and the microseconds a request costs over
// the bare handler's (same run).
//
//	go test -run '^$' -bench BenchmarkMiddleware -benchtime 3s ./integrations/httpdedup/
func BenchmarkMiddleware(b *testing.B) {
	bare := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"order":1,"status":"created"}`))
	})
	var bareNs atomic.Int64
	b.Run("bare", func(b *testing.B) {
		serveBench(b, bare, "new", &bareNs, nil)
	})
	stores := map[string]func(b *testing.B) *engine.Engine{
		"embedded": func(b *testing.B) *engine.Engine {
			o := engineOptions(b.TempDir())
			o.ExpectedKeys = 1 << 20
			e, err := engine.Open(&o)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = e.Close() })
			return e
		},
		"redis": func(b *testing.B) *engine.Engine {
			c := redistest.Start(b).Client(b)
			o := engine.Options{MaxAttempts: 1, MaxResultSize: 64 << 10, Logger: quietEngine,
				Backend: redis.NewBackend(c, redis.Config{Prefix: fmt.Sprintf("bench-%d:", time.Now().UnixNano())})}
			e, err := engine.Open(&o)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = e.Close() })
			return e
		},
	}
	for _, store := range []string{"embedded", "redis"} {
		for _, mode := range []string{"new", "replay"} {
			b.Run(store+"/"+mode, func(b *testing.B) {
				m, err := httpdedup.New(&httpdedup.Options{Engine: stores[store](b), Logger: quiet})
				if err != nil {
					b.Fatal(err)
				}
				serveBench(b, m.Handler(bare), mode, nil, &bareNs)
			})
		}
	}
}

var benchRun atomic.Int64

// serveBench runs h over b.N POST requests, 16 goroutines at a time; mode
// "new" gives each a fresh key, "replay" one of 1,000 keys stored first.
// nsPerReq, if set, gets the run's ns/request; bare, if set, is the bare
// handler's, and the overhead is reported against it.
func serveBench(b *testing.B, h http.Handler, mode string, nsPerReq, bare *atomic.Int64) {
	run := benchRun.Add(1)
	body := `{"sku":"a","qty":1}`
	const stored = 1000
	keyOf := func(i int64) string {
		if mode == "replay" {
			i %= stored
		}
		return `"` + strconv.FormatInt(run, 10) + "-" + strconv.FormatInt(i, 10) + `"`
	}
	if mode == "replay" {
		for i := range int64(stored) {
			serveOnce(b, h, keyOf(i), body, http.StatusCreated)
		}
	}
	var next, busy atomic.Int64
	b.SetParallelism(8) // 16 on 2 cores
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			rec := serve(h, keyOf(next.Add(1)), body)
			switch {
			case mode == "replay" && rec.Code == http.StatusConflict:
				// Another request held the key (reading its stored
				// response) for all of the middleware's settle time:
				// 16 goroutines on 2 cores over 1,000 keys.
				busy.Add(1)
			case rec.Code != http.StatusCreated:
				b.Errorf("%d %s", rec.Code, rec.Body)
			case mode == "replay" && rec.Header().Get(httpdedup.HeaderReplayed) != "true":
				b.Error("a replay was not replayed")
			}
		}
	})
	elapsed := time.Since(start)
	b.StopTimer()
	per := elapsed.Nanoseconds() / int64(b.N)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "req/s")
	if mode == "replay" {
		b.ReportMetric(float64(busy.Load())/float64(b.N), "409s/op")
	}
	if nsPerReq != nil {
		nsPerReq.Store(per)
	}
	if bare != nil && bare.Load() > 0 {
		b.ReportMetric(float64(per-bare.Load())/1e3, "µs-over-bare")
	}
}

func serveOnce(b *testing.B, h http.Handler, key, body string, want int) {
	if rec := serve(h, key, body); rec.Code != want {
		b.Fatalf("%d %s", rec.Code, rec.Body)
	}
}

func serve(h http.Handler, key, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequestWithContext(context.Background(), "POST", "/orders", strings.NewReader(body))
	req.Header.Set(httpdedup.HeaderKey, key)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}
