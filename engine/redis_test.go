package engine_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/crashtest"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// The Redis configuration (memory + Redis) runs the same conformance suite
// as the others, on one node and on a three-master cluster, each test
// against redis-server processes it starts itself.

func TestConformanceRedis(t *testing.T) {
	srv := redistest.Start(t)
	single := confConfig{name: "redis", capacity: 4096, redis: func(t *testing.T) goredis.UniversalClient {
		return srv.Client(t)
	}}
	small := single
	small.name, small.capacity = "redis-small-cache", 16
	t.Run(single.name, func(t *testing.T) { runConformanceSeeds(t, single) })
	t.Run(small.name, func(t *testing.T) { runConformanceSeeds(t, small) })

	cl := redistest.StartCluster(t)
	cluster := confConfig{name: "redis-cluster", capacity: 4096, redis: func(t *testing.T) goredis.UniversalClient {
		return cl.Client(t)
	}}
	t.Run(cluster.name, func(t *testing.T) { runConformanceSeeds(t, cluster) })
}

// openRedis opens an engine of o on the Redis tier over c, its keys under
// prefix (a fresh one when prefix is empty); redisBackend is that tier.
func openRedis(t *testing.T, c goredis.UniversalClient, prefix string, o engine.Options) *engine.Engine {
	t.Helper()
	return enginetest.OpenRedis(t, c, prefix, o)
}

var redisBackend = enginetest.RedisBackend

// TestRedisFencing: a claim whose lease ended in Redis and was taken over by
// another process cannot commit or release, and changes nothing.
func TestRedisFencing(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	clockA, clockB := newClock(), newClock()
	a := openRedis(t, c, "fence:", engine.Options{Clock: clockA})
	b := openRedis(t, c, "fence:", engine.Options{Clock: clockB}) // another process
	defer a.Close()
	defer b.Close()
	ctx := context.Background()
	key := []byte("order-1")
	ca, err := a.Claim(ctx, key)
	if err != nil || ca.Outcome != engine.New {
		t.Fatal(ca.Outcome, err)
	}
	if cb, _ := b.Claim(ctx, key); cb.Outcome != engine.InFlight {
		t.Fatalf("other process inside the lease = %v", cb.Outcome)
	}
	// The lease ends in Redis (forced) and on a's clock.
	redisKey := "fence:\x00\x00order-1" // prefix, NUL, the default namespace
	if n, _ := c.PExpire(ctx, redisKey, time.Millisecond).Result(); !n {
		t.Fatalf("no Redis key %q", redisKey)
	}
	for c.Exists(ctx, redisKey).Val() == 1 {
		time.Sleep(time.Millisecond)
	}
	clockA.Add(engine.DefaultLease + time.Second)
	cb, _ := b.Claim(ctx, key)
	if cb.Outcome != engine.New {
		t.Fatalf("takeover = %v", cb.Outcome)
	}
	if err := a.Commit(ctx, ca); !errors.Is(err, engine.ErrLeaseLost) {
		t.Fatalf("commit by the fenced process: %v", err)
	}
	if err := a.Release(ctx, ca); !errors.Is(err, engine.ErrLeaseLost) {
		t.Fatalf("release by the fenced process: %v", err)
	}
	if err := b.Commit(ctx, cb); err != nil {
		t.Fatalf("commit by the new owner: %v", err)
	}
	for _, e := range []*engine.Engine{a, b} {
		if c, _ := e.Claim(ctx, key); c.Outcome != engine.Duplicate {
			t.Fatalf("after commit = %v", c.Outcome)
		}
	}
}

// TestRedisMemoryNeverSaysNew: the memory tier may answer Duplicate for this
// process's commits but every New comes from Redis: a key committed by
// another process is a Duplicate here although memory never saw it.
func TestRedisMemoryNeverSaysNew(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	a := openRedis(t, c, "mem:", engine.Options{})
	b := openRedis(t, c, "mem:", engine.Options{})
	defer a.Close()
	defer b.Close()
	ctx := context.Background()
	if o, _ := a.MarkIfAbsent(ctx, []byte("k")); o != engine.New {
		t.Fatal(o)
	}
	if o, _ := b.MarkIfAbsent(ctx, []byte("k")); o != engine.Duplicate {
		t.Fatalf("other process = %v", o)
	}
	before := a.Stats()
	if o, _ := a.MarkIfAbsent(ctx, []byte("k")); o != engine.Duplicate {
		t.Fatal(o)
	}
	if after := a.Stats(); after.Memory.Hits != before.Memory.Hits+1 || after.Store.Reads != before.Store.Reads {
		t.Fatalf("own commit not answered from memory: %+v", after)
	}
}

// TestRedisKilledMidRun kills redis-server (with AOF fsync always) while
// the engine claims and commits: calls fail with ErrUnavailable, never a
// wrong answer; when the server returns the engine recovers and every
// acknowledged commit is a Duplicate in Redis itself (read by an engine
// that has not cached it).
func TestRedisKilledMidRun(t *testing.T) {
	srv := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	c := srv.ClientWith(t, &goredis.Options{MaxRetries: 1, DialTimeout: 100 * time.Millisecond, MaxRetryBackoff: 20 * time.Millisecond})
	e := openRedis(t, c, "kill:", engine.Options{})
	defer e.Close()
	load := startOutageLoad(e)
	time.Sleep(200 * time.Millisecond)
	srv.Kill()
	time.Sleep(time.Second)
	srv.Restart()
	time.Sleep(300 * time.Millisecond)
	load.finish(t)
	if load.unavailable.Load() == 0 {
		t.Fatalf("no call saw Redis down (%d acknowledged)", len(load.acked))
	}
	if st := e.Stats(); st.Calls.Errors == 0 {
		t.Error("Stats.Calls.Errors did not count the outage")
	}
	keys := load.acked
	// Checked through a second engine on the same prefix: the first one's
	// memory holds its own commits and would answer Duplicate without
	// asking Redis.
	check := openRedis(t, c, "kill:", engine.Options{})
	defer check.Close()
	out := make([]engine.Claim, len(keys))
	if err := check.ClaimBatch(context.Background(), keys, nil, out); err != nil {
		t.Fatalf("after the server returned: %v", err)
	}
	for i, c := range out {
		if c.Outcome != engine.Duplicate {
			t.Fatalf("acknowledged %s = %v after the restart", keys[i], c.Outcome)
		}
	}
	t.Logf("%d acknowledged commits survived the kill", len(keys))
}

func TestRedisFailOpenIsCounted(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.ClientWith(t, &goredis.Options{MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	closed := openRedis(t, c, "fo:", engine.Options{})
	open := openRedis(t, c, "fo:", engine.Options{FailOpen: true})
	defer closed.Close()
	defer open.Close()
	srv.Kill()
	ctx := context.Background()
	if _, err := closed.Claim(ctx, []byte("k")); !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("fail-closed claim with Redis down: %v", err)
	}
	cl, err := open.Claim(ctx, []byte("k"))
	if err != nil || cl.Outcome != engine.New {
		t.Fatalf("fail-open claim = %v, %v", cl.Outcome, err)
	}
	if err := open.Commit(ctx, cl); err != nil {
		t.Fatalf("fail-open commit: %v", err)
	}
	if st := open.Stats(); st.Calls.FailOpen != 2 {
		t.Fatalf("Stats.Calls.FailOpen = %d, want 2", st.Calls.FailOpen)
	}
}

// The multi-process race: four OS processes (this test binary re-executed)
// claim the same keys in different orders through one Redis (or one
// PostgreSQL table); exactly one claim per key is New across all of them.

func redisChild(spec string) int {
	parts := strings.Split(spec, "|")
	addr, prefix := parts[0], parts[1]
	id, _ := strconv.Atoi(parts[2])
	n, _ := strconv.Atoi(parts[3])
	o := engine.Options{Logger: quiet}
	if strings.HasPrefix(addr, "postgres://") { // the PostgreSQL tier; prefix names its table
		p, err := pgxpool.New(context.Background(), addr)
		if err != nil {
			fmt.Println("ERR", err)
			return 1
		}
		defer p.Close()
		o.Backend = pgBackend(p, prefix)
	} else {
		var c goredis.UniversalClient = goredis.NewClient(&goredis.Options{Addr: addr})
		if strings.Contains(addr, ",") { // a cluster's masters
			c = goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: strings.Split(addr, ",")})
		}
		defer c.Close()
		o.Backend = redisBackend(c, prefix)
	}
	e, err := engine.Open(&o)
	if err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	defer e.Close()
	order := rand.New(rand.NewPCG(uint64(id), 3)).Perm(n)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	for i := 0; i < n; i += 32 {
		idx := order[i:min(i+32, n)]
		keys := make([][]byte, len(idx))
		for j, k := range idx {
			keys[j] = fmt.Appendf(nil, "shared-%d", k)
		}
		claims := make([]engine.Claim, len(keys))
		if err := e.ClaimBatch(context.Background(), keys, nil, claims); err != nil {
			fmt.Fprintln(out, "ERR", err)
			return 1
		}
		for _, cl := range claims {
			if cl.Outcome == engine.New {
				fmt.Fprintln(out, "N", string(cl.Key))
			}
		}
		if id%2 == 0 {
			if err := e.CommitBatch(context.Background(), claims, nil); err != nil {
				fmt.Fprintln(out, "ERR", err)
				return 1
			}
		}
	}
	return 0
}

// TestRedisProcessesRace: four OS processes claim the same keys through one
// Redis node, and through a 3-master cluster; each key is New in exactly
// one process.
func TestRedisProcessesRace(t *testing.T) {
	t.Run("node", func(t *testing.T) { runProcessesRace(t, redistest.Start(t).Addr) })
	t.Run("cluster", func(t *testing.T) { runProcessesRace(t, strings.Join(redistest.StartCluster(t).Addrs(), ",")) })
}

func runProcessesRace(t *testing.T, addr string) {
	const procs, keys = 4, 3000
	prefix := fmt.Sprintf("race-%d:", time.Now().UnixNano())
	if strings.HasPrefix(addr, "postgres://") {
		prefix = fmt.Sprintf("race_%d", time.Now().UnixNano())
		p := postgresPool(t)
		t.Cleanup(func() { _, _ = p.Exec(context.Background(), "DROP TABLE IF EXISTS "+prefix) })
	}
	news := map[string]int{}
	var mu sync.Mutex
	children := make([]*crashtest.Child, procs)
	for p := range procs {
		children[p] = crashtest.Start(t, "redis", fmt.Sprintf("%s|%s|%d|%d", addr, prefix, p, keys), &crashtest.Options{OnLine: func(line string) {
			kind, key, _ := strings.Cut(line, " ")
			mu.Lock()
			defer mu.Unlock()
			switch kind {
			case "N":
				news[key]++
			case "ERR":
				t.Errorf("process %d: %s", p, key)
			}
		}})
	}
	for p, c := range children {
		if err := c.Wait(); err != nil {
			t.Errorf("process %d: %v\n%s", p, err, c.Describe())
		}
	}
	for i := range keys {
		if n := news[fmt.Sprintf("shared-%d", i)]; n != 1 {
			t.Fatalf("shared-%d was New in %d processes", i, n)
		}
	}
}

// TestRedisClaimRetriedAfterLostReply: Redis is paused, so a claim fails by
// its caller's deadline (whatever the client's options) while its command
// waits in the server's socket; Redis resumes and applies it. The retry of
// that claim must be recognised as the same claim (New), not left
// InFlight for the whole lease.
func TestRedisClaimRetriedAfterLostReply(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t) // default options: 3 s read timeout
	prefix := fmt.Sprintf("lost-%d:", time.Now().UnixNano())
	e := openRedis(t, c, prefix, engine.Options{Lease: time.Hour})
	defer e.Close()
	key := []byte("order-1")

	srv.Pause()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	start := time.Now()
	_, err := e.Claim(ctx, key)
	took := time.Since(start)
	cancel()
	srv.Resume()
	if !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("claim against a paused Redis: %v, want ErrUnavailable", err)
	}
	if took > 350*time.Millisecond {
		t.Fatalf("claim with a 100 ms deadline took %v", took)
	}
	// The server now applies the claim whose reply the engine gave up on.
	for deadline := time.Now().Add(5 * time.Second); ; {
		if n, _ := c.Exists(context.Background(), prefix+"\x00\x00"+string(key)).Result(); n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the paused claim never reached Redis")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cl, err := e.Claim(context.Background(), key)
	if err != nil || cl.Outcome != engine.New {
		t.Fatalf("retried claim = %v, %v; want New (its own claim, applied by Redis)", cl.Outcome, err)
	}
	if err := e.Commit(context.Background(), cl); err != nil {
		t.Fatalf("commit of the retried claim: %v", err)
	}
	if again, err := e.Claim(context.Background(), key); err != nil || again.Outcome != engine.Duplicate {
		t.Fatalf("after commit = %v, %v", again.Outcome, err)
	}
}

// TestRedisAttemptsAreShared: with MaxAttempts, failures of a key's handler
// in two processes (two engines on one Redis prefix) add up, and the key is
// Poison for both; a restarted engine sees the count too.
func TestRedisAttemptsAreShared(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	prefix := fmt.Sprintf("att-%d:", time.Now().UnixNano())
	o := engine.Options{MaxAttempts: 3}
	a, b := openRedis(t, c, prefix, o), openRedis(t, c, prefix, o)
	defer b.Close()
	ctx := context.Background()
	boom := errors.New("handler failed")
	for i, e := range []*engine.Engine{a, b, a} {
		if out, err := e.Do(ctx, []byte("poison"), func(context.Context) error { return boom }); out != engine.New || !errors.Is(err, boom) {
			t.Fatalf("attempt %d = %v, %v", i+1, out, err)
		}
	}
	_ = a.Close()
	a = openRedis(t, c, prefix, o)
	defer a.Close()
	for name, e := range map[string]*engine.Engine{"restarted": a, "other": b} {
		if out, err := e.Do(ctx, []byte("poison"), func(context.Context) error { return nil }); out != engine.Poison || err != nil {
			t.Fatalf("%s engine after three failures in two processes = %v, %v; want Poison", name, out, err)
		}
	}
}
