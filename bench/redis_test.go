package bench_test

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/bench"
	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/redis"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// BenchmarkRedis compares, against one redis-server the benchmark starts:
// the engine's batch claims and marks (memory + Redis), the recipe users
// replace (one SET NX EX per message), and redis-benchmark pipelining 64
// SET NX EX when the binary is present.
//
//	go test -run '^$' -bench Redis -cpu 2 ./bench/
func BenchmarkRedis(b *testing.B) {
	srv := redistest.Start(b)
	client := srv.ClientWith(b, &goredis.Options{PoolSize: 64})
	for _, batch := range []int{1, 256} {
		for _, op := range []string{"claim", "mark"} {
			b.Run(fmt.Sprintf("tier=redis/op=%s/batch=%d", op, batch), func(b *testing.B) {
				e, err := engine.Open(&engine.Options{Backend: redis.NewBackend(client, redis.Config{Prefix: fmt.Sprintf("b%d:", time.Now().UnixNano())}), Logger: quietEngine})
				if err != nil {
					b.Fatal(err)
				}
				defer e.Close()
				runMark(b, redisOp{e, op}, batch)
			})
		}
	}
	for _, op := range []string{"claim", "mark"} {
		b.Run("tier=redis-cluster/op="+op+"/batch=256", func(b *testing.B) {
			cl := redistest.StartCluster(b)
			cc := cl.ClientWith(b, &goredis.ClusterOptions{PoolSize: 64})
			e, err := engine.Open(&engine.Options{Backend: redis.NewBackend(cc, redis.Config{Prefix: fmt.Sprintf("c%d:", time.Now().UnixNano())}), Logger: quietEngine})
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			runMark(b, redisOp{e, op}, 256)
		})
	}
	b.Run("tier=baseline-setnx-per-message/batch=1", func(b *testing.B) {
		prefix := fmt.Sprintf("s%d:", time.Now().UnixNano())
		runMark(b, setNX{client, prefix}, 1)
	})
	b.Run("tier=baseline-redis-benchmark-P64/batch=64", func(b *testing.B) {
		rps := srv.Benchmark(b, max(b.N, 10_000), "SET", "rb:__rand_int__", "1", "NX", "EX", "86400")
		b.ReportMetric(rps, "keys/s")
	})
}

// redisOp drives an engine through ClaimBatch only (claim) or claim and
// commit (mark).
type redisOp struct {
	e  *engine.Engine
	op string
}

func (r redisOp) mark(keys [][]byte, out []engine.Outcome) error {
	if r.op == "mark" {
		return r.e.MarkBatch(context.Background(), keys, nil, out)
	}
	claims := make([]engine.Claim, len(keys))
	if err := r.e.ClaimBatch(context.Background(), keys, nil, claims); err != nil {
		return err
	}
	for i := range claims {
		out[i] = claims[i].Outcome
	}
	return nil
}
func (r redisOp) close()              {}
func (r redisOp) stats() engine.Stats { return r.e.Stats() }

// setNX is the common recipe: SET key 1 NX EX window, one round trip per
// message.
type setNX struct {
	c      *goredis.Client
	prefix string
}

func (s setNX) mark(keys [][]byte, out []engine.Outcome) error {
	for i, k := range keys {
		ok, err := s.c.SetNX(context.Background(), s.prefix+string(k), 1, 7*24*time.Hour).Result()
		if err != nil {
			return err
		}
		out[i] = engine.Duplicate
		if ok {
			out[i] = engine.New
		}
	}
	return nil
}
func (s setNX) close() {}

// TestRedisBytesPerKey measures Redis's memory per committed key (INFO
// memory before and after marking 100,000 36-byte keys through the engine)
// and checks the planner's RedisFixedBytes + key size against it, within
// 15 %: the figure docs/performance.md and `dedupbench plan` quote.
func TestRedisBytesPerKey(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	e, err := engine.Open(&engine.Options{Backend: redis.NewBackend(c, redis.Config{}), Logger: quietEngine}) // the default prefix, as the planner assumes
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	used := func() float64 {
		info, err := c.Info(ctx, "memory").Result()
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`used_memory:(\d+)`).FindStringSubmatch(info)
		n, _ := strconv.ParseFloat(m[1], 64)
		return n
	}
	const n, keySize = 100_000, 36
	before := used()
	keys := make([][]byte, 256)
	out := make([]engine.Outcome, len(keys))
	for i := 0; i < n; i += len(keys) {
		for j := range keys {
			keys[j] = fmt.Appendf(keys[j][:0], "6ba7b810-9dad-11d1-80b4-%012d", i+j)
		}
		if err := e.MarkBatch(ctx, keys, nil, out); err != nil {
			t.Fatal(err)
		}
	}
	perKey := (used() - before) / float64(((n+255)/256)*256)
	planned := float64(bench.RedisFixedBytes + keySize)
	t.Logf("Redis memory per committed %d-byte key: %.1f B measured, %.0f B planned", keySize, perKey, planned)
	if r := perKey / planned; r < 0.85 || r > 1.15 {
		t.Fatalf("measured %.1f B per key, planner %.0f B (ratio %.2f)", perKey, planned, r)
	}
}
