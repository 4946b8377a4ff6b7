package redis_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/redis"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
	"github.com/tierdedup/tierdedup/tier/tiertest"
)

// contractSuite runs the exact tiers' contract suite over Stores on c,
// each under a prefix of its own, once without attempt counting (claims
// by SET NX) and once with MaxAttempts (claims by the counting script).
func contractSuite(t *testing.T, c goredis.UniversalClient) {
	var mu sync.Mutex
	prefixes := map[tier.Exact]string{} // the prefix of each Store the suite opened
	n := 0
	for _, maxAttempts := range []int{0, 3} {
		open := func(t *testing.T, prefix string) tier.Exact {
			t.Helper()
			s, err := redis.New(context.Background(), c, &redis.Options{
				Prefix: prefix, Window: time.Hour, MaxAttempts: maxAttempts, Logger: log.New(io.Discard, "", 0),
			})
			if err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			prefixes[s] = prefix
			mu.Unlock()
			return s
		}
		t.Run(fmt.Sprint("max-attempts=", maxAttempts), func(t *testing.T) {
			tiertest.Run(t, tiertest.Options{
				MaxAttempts: maxAttempts,
				Reopen: func(t *testing.T, closed tier.Exact) tier.Exact {
					mu.Lock()
					prefix := prefixes[closed]
					mu.Unlock()
					return open(t, prefix)
				},
			}, func(t *testing.T) tier.Exact {
				mu.Lock()
				n++
				prefix := fmt.Sprintf("contract-%d-%d:", time.Now().UnixNano(), n)
				mu.Unlock()
				return open(t, prefix)
			})
		})
	}
}

// TestContract runs the contract suite against one redis-server.
func TestContract(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	contractSuite(t, c)
}

// TestContractCluster runs the contract suite against a three-master
// Redis Cluster: every key of a batch on its own slot.
func TestContractCluster(t *testing.T) {
	began := time.Now()
	cl := redistest.StartCluster(t)
	t.Logf("cluster started in %v", time.Since(began).Round(time.Millisecond))
	c := cl.Client(t)
	contractSuite(t, c)
}
