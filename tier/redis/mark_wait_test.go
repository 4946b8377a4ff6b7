package redis_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/redis"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// TestMarkWaitReplyLost: WaitReplicas 1, the replica lagging
// (its link cut: still online for the master), the client's ReadTimeout
// (150 ms) shorter than WaitTimeout (1 s), go-redis retries off
// (MaxRetries -1). A MarkBatch of new keys: every SET's reply arrives
// (nil: the key was free), the WAIT's read times out. The mark must fail
// (ErrUnavailable: no replica confirmed it); if it answers New, the
// master is killed, the replica promoted, and the acknowledged keys are
// looked up there.
func TestMarkWaitReplyLost(t *testing.T) {
	master := redistest.Start(t)
	link := newLink(t, master.Addr)
	replica := redistest.Start(t, "--replicaof", "127.0.0.1", fmt.Sprint(link.port))
	replica.WaitSynced(t)
	prefix := fmt.Sprintf("brkw-%d:", time.Now().UnixNano())
	opts := func(c goredis.UniversalClient, wait int) *engine.Options {
		return &engine.Options{Window: time.Hour, Partition: 10 * time.Minute, Logger: quietEngine,
			Backend: redis.NewBackend(c, redis.Config{Prefix: prefix, WaitReplicas: wait, WaitTimeout: time.Second})}
	}
	c := master.ClientWith(t, &goredis.Options{ReadTimeout: 150 * time.Millisecond, MaxRetries: -1})
	e, err := engine.Open(opts(c, 1))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := context.Background()
	if o, err := e.MarkIfAbsent(ctx, []byte("sanity")); err != nil || o != engine.New {
		t.Fatalf("mark with the replica in sync: %v %v", o, err)
	}
	keys := advKeys("w", 20)
	link.cut() // the replica lags: nothing written from now on reaches it
	out := make([]engine.Outcome, len(keys))
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	start := time.Now()
	err = e.MarkBatch(cctx, keys, nil, out)
	cancel()
	t.Logf("MarkBatch with the replica lagging: err=%v after %v, outcomes %v", err, time.Since(start), out[:3])
	var acked [][]byte
	if err == nil {
		for i, o := range out {
			if o == engine.New {
				acked = append(acked, keys[i])
			}
		}
	} else if !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("MarkBatch: %v, not ErrUnavailable", err)
	}
	master.Kill()
	rc := replica.Client(t)
	if err := rc.Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	promoted, err := engine.Open(opts(rc, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer promoted.Close()
	if len(acked) == 0 {
		return
	}
	again := make([]engine.Outcome, len(acked))
	if err := promoted.MarkBatch(ctx, acked, nil, again); err != nil {
		t.Fatal(err)
	}
	if n := countNot(again, engine.Duplicate); n > 0 {
		t.Fatalf("WaitReplicas 1, replica lagging, WAIT's reply lost: MarkBatch answered New for %d keys with no error; after the failover %d of them are marked New a second time (first: %v)", len(acked), n, again[0])
	}
}
