package enginetest_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// TestRedisSentinelFailover runs the configuration docs/shared-tiers.md recommends
// for Sentinel: a master, a replica and a sentinel (started here on
// loopback ports), an engine with a go-redis FailoverClient marking batches
// of keys, and the master SIGKILLed mid-run. It checks what docs/shared-tiers.md's
// failover row says: every error is ErrUnavailable (never a wrong answer);
// marks succeed again once the sentinel has promoted the replica; every key
// acknowledged after the failover is a Duplicate; and it counts the keys
// acknowledged before the failover that it lost (replication is
// asynchronous: the last commits may not have reached the replica).
func TestRedisSentinelFailover(t *testing.T) {
	master := redistest.Start(t)
	replica := redistest.StartReplica(t, master)
	sentinel := redistest.StartSentinel(t, "dedup", master, 500*time.Millisecond)
	replica.WaitSynced(t)
	c := goredis.NewFailoverClient(&goredis.FailoverOptions{
		MasterName: "dedup", SentinelAddrs: []string{sentinel.Addr},
		MaxRetries: 1, DialTimeout: 200 * time.Millisecond, ReadTimeout: 500 * time.Millisecond, WriteTimeout: 500 * time.Millisecond,
	})
	defer c.Close()
	e := openRedis(t, c, "failover:", engine.Options{})
	defer e.Close()

	var before, after [][]byte // acknowledged before the failover, after it
	var unavailable int
	var victim string        // the master killed
	var failedOver time.Time // when the sentinel first named another master
	var recovered time.Time  // the first batch acknowledged after that
	var slowest time.Duration
	start := time.Now()
	// The server to kill is the master the sentinel names at that moment:
	// on a loaded machine it may already have failed over once.
	sc := sentinel.SentinelClient(t)
	masterAddr := func() string {
		addr, err := sc.GetMasterAddrByName(context.Background(), "dedup").Result()
		if err != nil || len(addr) != 2 {
			return ""
		}
		return net.JoinHostPort(addr[0], addr[1])
	}
	for i := 0; ; i++ {
		if victim == "" && time.Since(start) > 300*time.Millisecond {
			s := master
			if masterAddr() == replica.Addr {
				s = replica
			}
			s.Kill()
			victim = s.Addr
			// Hold the dead master's port, as a dead host would: another
			// test's redis-server must not take it, or the client, still
			// sent there by the sentinel, would write to that server.
			hold, err := net.Listen("tcp", victim)
			if err != nil {
				t.Fatalf("holding the killed master's port %s: %v", victim, err)
			}
			defer hold.Close()
		}
		// The failover is the sentinel's: a batch sent after it named a
		// live master must be acknowledged durably there. Whether any call
		// failed in between depends on timing (go-redis may switch before
		// a call notices the dead master), so it is counted, not required.
		afterFailover := !failedOver.IsZero()
		if victim != "" && !afterFailover {
			if addr := masterAddr(); addr != "" && addr != victim {
				failedOver = time.Now()
			}
			if time.Since(start) > 30*time.Second {
				t.Fatalf("the sentinel did not fail over in 30 s (master still %s; %d batches unavailable, %d keys acknowledged)",
					masterAddr(), unavailable, len(before))
			}
		}
		keys := make([][]byte, 64)
		for j := range keys {
			keys[j] = fmt.Appendf(nil, "order-%d-%d", i, j)
		}
		out := make([]engine.Outcome, len(keys))
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		sent := time.Now()
		err := e.MarkBatch(ctx, keys, nil, out)
		slowest = max(slowest, time.Since(sent))
		cancel()
		switch {
		case err != nil && !errors.Is(err, engine.ErrUnavailable):
			t.Fatalf("batch %d: %v, want ErrUnavailable or success", i, err)
		case err != nil:
			unavailable++
			if afterFailover && time.Since(failedOver) > 30*time.Second {
				t.Fatalf("no recovery 30 s after the failover (%d batches unavailable)", unavailable)
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		for j, o := range out {
			if o != engine.New {
				t.Fatalf("batch %d: fresh key %s = %v", i, keys[j], o)
			}
		}
		if !afterFailover {
			// Acknowledged before the sentinel named the new master: by
			// the old one before it died, or by the new one already.
			before = append(before, keys...)
			continue
		}
		if recovered.IsZero() {
			recovered = time.Now()
		}
		after = append(after, keys...)
		if time.Since(recovered) > 500*time.Millisecond {
			break
		}
	}
	// Losses are counted through a second engine: the first one's memory
	// holds its own commits and would answer Duplicate without asking
	// Redis.
	check := openRedis(t, c, "failover:", engine.Options{})
	defer check.Close()
	lost := func(keys [][]byte) int {
		n := 0
		for i := 0; i < len(keys); i += 256 {
			batch := keys[i:min(i+256, len(keys))]
			out := make([]engine.Claim, len(batch))
			if err := check.ClaimBatch(context.Background(), batch, nil, out); err != nil {
				t.Fatal(err)
			}
			for _, c := range out {
				if c.Outcome != engine.Duplicate {
					n++
				}
			}
		}
		return n
	}
	lostBefore, lostAfter := lost(before), lost(after)
	t.Logf("failover: killed %s, sentinel named another master %v after the start, marks again %v after that; %d batches unavailable, slowest batch %v; acknowledged before %d (lost %d), after %d (lost %d)",
		victim, failedOver.Sub(start), recovered.Sub(failedOver), unavailable, slowest, len(before), lostBefore, len(after), lostAfter)
	if lostAfter != 0 {
		t.Fatalf("%d keys acknowledged after the failover are not duplicates", lostAfter)
	}
}
