package httpdedup_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/integrations/httpdedup"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// The middleware in front of a handler that creates orders: the second
// request with the same key is answered with the first one's response,
// and the handler runs once.
func Example() {
	dir, _ := os.MkdirTemp("", "orders-api")
	defer os.RemoveAll(dir)
	e, err := engine.Open(&engine.Options{
		Backend:       embedded.Dir(dir),
		MaxAttempts:   1,    // a request whose outcome is unknown is never run again
		DurableClaims: true, // ... even after a crash
		MaxResultSize: 1 << 20,
		Namespaces:    map[string]engine.NamespaceOptions{"http": {Window: 24 * time.Hour}},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer e.Close()
	m, err := httpdedup.New(&httpdedup.Options{
		Engine: e,
		Scope:  func(r *http.Request) (string, error) { return r.Header.Get("X-Api-Key"), nil },
	})
	if err != nil {
		log.Fatal(err)
	}
	orders := 0
	create := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		orders++
		w.Header().Set("Location", fmt.Sprintf("/orders/%d", orders))
		w.WriteHeader(http.StatusCreated)
	})
	srv := httptest.NewServer(m.Handler(create))
	defer srv.Close()

	for range 2 {
		req, _ := http.NewRequest("POST", srv.URL+"/orders", strings.NewReader(`{"sku":"a"}`))
		req.Header.Set("X-Api-Key", "client-1")
		req.Header.Set("Idempotency-Key", `"8e03978e-40d5-43e8-bc93-6894a57f9324"`)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Printf("%d %s replayed=%q\n", resp.StatusCode, resp.Header.Get("Location"), resp.Header.Get("Idempotent-Replayed"))
	}
	fmt.Println("orders created:", orders)
	// Output:
	// 201 /orders/1 replayed=""
	// 201 /orders/1 replayed="true"
	// orders created: 1
}

// A client whose POSTs are retried with one key each: a response lost on
// the way is answered by the retry with the first run's response.
func ExampleTransport() {
	client := &http.Client{Transport: &httpdedup.Transport{MaxAttempts: 4}}
	_ = client // client.Post(url, "application/json", body)
}
