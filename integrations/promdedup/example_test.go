package promdedup_test

import (
	"bufio"
	"context"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/integrations/promdedup"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// Example serves an engine's metrics on /metrics, as a consumer process
// would for Prometheus to scrape, and reads them back once.
func Example() {
	dir, _ := os.MkdirTemp("", "dedup")
	defer os.RemoveAll(dir)
	dedup, err := engine.Open(&engine.Options{Backend: embedded.Dir(dir), ExpectedKeys: 1000})
	if err != nil {
		log.Fatal(err)
	}
	defer dedup.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(promdedup.New(dedup, prometheus.Labels{"engine": "orders"}))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	defer srv.Close()

	ctx := context.Background()
	for _, id := range []string{"order-1", "order-2", "order-1"} {
		if _, err := dedup.MarkIfAbsent(ctx, []byte(id)); err != nil {
			log.Fatal(err)
		}
	}

	resp, err := http.Get("http://" + ln.Addr().String() + "/metrics")
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	lines := bufio.NewScanner(resp.Body)
	for lines.Scan() {
		if strings.HasPrefix(lines.Text(), "tierdedup_claims_total") {
			fmt.Println(lines.Text())
		}
	}
	// Output:
	// tierdedup_claims_total{engine="orders",outcome="conflict"} 0
	// tierdedup_claims_total{engine="orders",outcome="duplicate"} 1
	// tierdedup_claims_total{engine="orders",outcome="in_flight"} 0
	// tierdedup_claims_total{engine="orders",outcome="new"} 2
	// tierdedup_claims_total{engine="orders",outcome="poison"} 0
	// tierdedup_claims_total{engine="orders",outcome="stale"} 0
}
