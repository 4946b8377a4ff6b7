package redisclient

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// BenchmarkClients sends tierdedup's Redis mark, `SET key value PX ms NX
// GET` with a 39-byte key and a 17-byte value, through go-redis and
// rueidis against one redis-server the benchmark starts, from 8 goroutines
// (16 at -cpu 2):
//
//   - batch=256: one pipeline of 256 marks per call (go-redis Pipeline,
//     rueidis DoMulti), the engine's MarkBatch;
//   - batch=1: one mark per call (go-redis Do, rueidis Do with its
//     auto-pipelining), a consumer marking one message at a time.
//
// and, for reference, redis-benchmark sending the same command, which is
// the server's limit for it.
//
// One key in ten repeats an earlier one (a duplicate: its reply is the
// stored value). Each reports keys/s and the CPU per key of this process
// (the client) and of redis-server, by getrusage and /proc: on a 2-core
// machine the two share the cores, so a client's CPU is the server's loss.
//
//	cd bench/redisclient && go test -run '^$' -bench Clients -cpu 2 -benchmem .
func BenchmarkClients(b *testing.B) {
	srv := startRedis(b)
	b.Run("client=redis-benchmark-P64/batch=64", func(b *testing.B) {
		// The server's own limit for this command: redis-benchmark, in C,
		// 50 connections pipelining 64 each.
		n := max(b.N, 10_000)
		srv0 := srv.cpu(b)
		rps := srv.Benchmark(b, n, "SET", "rb:000000000000000000000000__rand_int__", "c0123456789abcdef", "PX", "86400000", "NX", "GET")
		b.ReportMetric(rps, "keys/s")
		b.ReportMetric(float64(srv.cpu(b)-srv0)/float64(n), "server-cpu-ns/key")
	})
	for _, batch := range []int{256, 1} {
		b.Run(fmt.Sprintf("client=go-redis/batch=%d", batch), func(b *testing.B) {
			c := srv.ClientWith(b, &goredis.Options{PoolSize: 64})
			run(b, srv, batch, func(ctx context.Context, keys []string, val string, out []bool) error {
				if len(keys) == 1 {
					_, err := c.Do(ctx, "set", keys[0], val, "px", 86400000, "nx", "get").Result()
					out[0] = errors.Is(err, goredis.Nil)
					if out[0] {
						err = nil
					}
					return err
				}
				p := c.Pipeline()
				cmds := make([]*goredis.Cmd, len(keys))
				for i, k := range keys {
					cmds[i] = p.Do(ctx, "set", k, val, "px", 86400000, "nx", "get")
				}
				if _, err := p.Exec(ctx); err != nil && !errors.Is(err, goredis.Nil) {
					return err
				}
				for i, cmd := range cmds {
					_, err := cmd.Result()
					out[i] = errors.Is(err, goredis.Nil)
					if err != nil && !out[i] {
						return err
					}
				}
				return nil
			})
		})
		b.Run(fmt.Sprintf("client=rueidis/batch=%d", batch), func(b *testing.B) {
			c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			cmds := make(chan rueidis.Commands, 64)
			run(b, srv, batch, func(ctx context.Context, keys []string, val string, out []bool) error {
				if len(keys) == 1 {
					err := c.Do(ctx, c.B().Set().Key(keys[0]).Value(val).Nx().Get().PxMilliseconds(86400000).Build()).Error()
					out[0] = rueidis.IsRedisNil(err)
					if out[0] {
						err = nil
					}
					return err
				}
				var cs rueidis.Commands
				select {
				case cs = <-cmds:
					cs = cs[:0]
				default:
				}
				for _, k := range keys {
					cs = append(cs, c.B().Set().Key(k).Value(val).Nx().Get().PxMilliseconds(86400000).Build())
				}
				for i, r := range c.DoMulti(ctx, cs...) {
					err := r.Error()
					out[i] = rueidis.IsRedisNil(err)
					if err != nil && !out[i] {
						return err
					}
				}
				select {
				case cmds <- cs:
				default:
				}
				return nil
			})
		})
	}
}

// run has 8 × GOMAXPROCS goroutines mark b.N keys in calls of batch and
// checks that exactly the first copy of each key was new.
func run(b *testing.B, srv *server, batch int, mark func(context.Context, []string, string, []bool) error) {
	prefix := fmt.Sprintf("rc%d:", time.Now().UnixNano())
	keyOf := func(i int) string {
		if i%10 == 9 {
			i -= 5 // a duplicate of a key marked five keys before
		}
		return fmt.Sprintf("%s%036d", prefix, i)
	}
	const val = "c0123456789abcdef"
	var next, news atomic.Int64
	var failed atomic.Value
	cpu0, srv0 := selfCPU(), srv.cpu(b)
	b.SetParallelism(8)
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		keys := make([]string, 0, batch)
		out := make([]bool, batch)
		ctx := context.Background()
		flush := func() {
			if err := mark(ctx, keys, val, out[:len(keys)]); err != nil {
				failed.Store(err)
			}
			for _, n := range out[:len(keys)] {
				if n {
					news.Add(1)
				}
			}
			keys = keys[:0]
		}
		for pb.Next() {
			keys = append(keys, keyOf(int(next.Add(1))-1))
			if len(keys) == batch {
				flush()
			}
		}
		if len(keys) > 0 {
			flush()
		}
	})
	elapsed := time.Since(start)
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	// Every key is new except the repeats whose original was marked
	// (a repeat races its original only across goroutines: both may
	// arrive in either order, and exactly one of the two is new).
	if want := int64(b.N - b.N/10); news.Load() < want-int64(b.N/10) || news.Load() > want {
		b.Fatalf("%d new of %d keys, want about %d", news.Load(), b.N, want)
	}
	n := float64(b.N)
	b.ReportMetric(n/elapsed.Seconds(), "keys/s")
	b.ReportMetric(float64(selfCPU()-cpu0)/n, "client-cpu-ns/key")
	b.ReportMetric(float64(srv.cpu(b)-srv0)/n, "server-cpu-ns/key")
}

// selfCPU is this process's user and system CPU time, in nanoseconds.
func selfCPU() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// server is the benchmark's redis-server, with its CPU time.
type server struct{ *redistest.Server }

// startRedis starts redis-server (no persistence) on a free loopback port
// and stops it when b ends.
func startRedis(b *testing.B) *server {
	return &server{redistest.Start(b, "--save", "", "--appendonly", "no")}
}

// cpu is the server process's user and system CPU time, in nanoseconds
// (/proc/PID/stat, at 100 ticks a second).
func (s *server) cpu(b *testing.B) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", s.Pid()))
	if err != nil {
		b.Fatal(err)
	}
	// The fields after the command name, which is in parentheses.
	i := len(data) - 1
	for i > 0 && data[i] != ')' {
		i--
	}
	var f []string
	start := -1
	for j := i + 2; j <= len(data); j++ {
		if j == len(data) || data[j] == ' ' {
			if start >= 0 {
				f = append(f, string(data[start:j]))
				start = -1
			}
		} else if start < 0 {
			start = j
		}
	}
	// f[0] is the state (field 3); utime and stime are fields 14 and 15.
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("/proc stat: %v %v", err1, err2)
	}
	return (ut + st) * int64(10*time.Millisecond)
}
