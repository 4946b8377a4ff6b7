package enginetest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// The Redis configuration (memory + Redis) runs the same conformance suite
// as the others, on one node and on a three-master cluster, each test
// against redis-server processes it starts itself.

func TestConformanceRedis(t *testing.T) {
	single := enginetest.ConformanceConfig{Name: "redis", Config: enginetest.Named("redis"), Capacity: 4096}
	small := single
	small.Name, small.Capacity = "redis-small-cache", 16
	t.Run(single.Name, func(t *testing.T) { enginetest.Conformance(t, single) })
	t.Run(small.Name, func(t *testing.T) { enginetest.Conformance(t, small) })

	// A three-master cluster: the "redis" configuration on other storage.
	cl := redistest.StartCluster(t)
	onCluster := enginetest.Named("redis")
	onCluster.Name = "redis-cluster"
	onCluster.New = func(t testing.TB, name string) *enginetest.Storage {
		c, prefix := cl.Client(t), "conf-"+name+":"
		return enginetest.StorageOf(func(o engine.Options, _ enginetest.Wrap) engine.Options {
			o.Backend = redisBackend(c, prefix)
			return o
		}, func(ctx context.Context, d time.Duration) error { return ageRedis(ctx, c, prefix, d) })
	}
	cluster := enginetest.ConformanceConfig{Name: "redis-cluster", Config: onCluster, Capacity: 4096}
	t.Run(cluster.Name, func(t *testing.T) { enginetest.Conformance(t, cluster) })
}

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
	load := enginetest.StartOutageLoad(e)
	time.Sleep(200 * time.Millisecond)
	srv.Kill()
	time.Sleep(time.Second)
	srv.Restart()
	time.Sleep(300 * time.Millisecond)
	load.Finish(t)
	if load.Unavailable.Load() == 0 {
		t.Fatalf("no call saw Redis down (%d acknowledged)", len(load.Acked))
	}
	if st := e.Stats(); st.Calls.Errors == 0 {
		t.Error("Stats.Calls.Errors did not count the outage")
	}
	keys := load.Acked
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

// TestRedisProcessesRace: four OS processes claim the same keys through one
// Redis node, and through a 3-master cluster; each key is New in exactly
// one process.
func TestRedisProcessesRace(t *testing.T) {
	t.Run("node", func(t *testing.T) { enginetest.ProcessesRace(t, redistest.Start(t).Addr) })
	t.Run("cluster", func(t *testing.T) { enginetest.ProcessesRace(t, strings.Join(redistest.StartCluster(t).Addrs(), ",")) })
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
