package enginetest_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// TestAdvanceRedisRetriedAfterLostReply: an Advance whose reply was lost
// (Redis paused past the caller's deadline, then applying it) is
// recognised by its retry as the same claim: New, not held for the lease.
func TestAdvanceRedisRetriedAfterLostReply(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	prefix := fmt.Sprintf("advlost-%d:", time.Now().UnixNano())
	e := openRedis(t, c, prefix, engine.Options{Lease: time.Hour})
	defer e.Close()
	ent := []byte("order-1")
	srv.Pause()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	_, err := e.Advance(ctx, ent, 1)
	cancel()
	srv.Resume()
	if !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("Advance against a paused Redis: %v", err)
	}
	key := prefix + "\x00\x03\x00v/" + string(ent)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if n, _ := c.Exists(context.Background(), key).Result(); n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the paused advance never reached Redis")
		}
	}
	cl, err := e.Advance(context.Background(), ent, 1)
	if err != nil || cl.Outcome != engine.New {
		t.Fatalf("retried Advance = %v, %v; want New (its own claim, applied by Redis), not held for the 1h lease", cl.Outcome, err)
	}
}

// TestAdvanceRedisRace: goroutines in two processes advance, extend,
// release and commit shared entities at random: no version is applied
// twice, and no New comes over an equal or higher stored version.
func TestAdvanceRedisRace(t *testing.T) {
	ctx := context.Background()
	c := redistest.Start(t).Client(t)
	prefix := fmt.Sprintf("advrace-%d:", time.Now().UnixNano())
	o := engine.Options{Lease: 2 * time.Second}
	a, b := openRedis(t, c, prefix, o), openRedis(t, c, prefix, o)
	defer a.Close()
	defer b.Close()
	const ents, vers = 30, 6
	var news [ents][vers + 1]atomic.Int32
	var wg sync.WaitGroup
	for w := range 8 {
		x := a
		if w%2 == 1 {
			x = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for v := uint64(1); v <= vers; v++ {
				for i := range ents {
					ent := []byte(fmt.Sprint("e", i))
					cl, err := x.Advance(ctx, ent, v)
					if err != nil {
						t.Error(err)
						return
					}
					if cl.Outcome != engine.New {
						continue
					}
					if cl.Version >= v {
						t.Errorf("New %d over stored %d", v, cl.Version)
					}
					news[i][v].Add(1)
					if err := x.Extend(ctx, &cl, time.Second); err != nil {
						t.Error(err)
					}
					if (i+int(v)+w)%3 == 0 {
						if err := x.Release(ctx, cl); err != nil {
							t.Error(err)
						}
						news[i][v].Add(-1)
						continue
					}
					if err := x.Commit(ctx, cl); err != nil {
						t.Error(err)
					}
				}
			}
		}()
	}
	wg.Wait()
	for i := range ents {
		for v := 1; v <= vers; v++ {
			if n := news[i][v].Load(); n > 1 {
				t.Fatalf("entity %d version %d applied %d times", i, v, n)
			}
		}
	}
}

// TestAdvanceMixedBatchesRedis: commit, release and unclaim batches
// mixing Advance and plain claims keep the right versions, with
// MaxAttempts; versions near 2^64-1 compare as numbers.
func TestAdvanceMixedBatchesRedis(t *testing.T) {
	ctx := context.Background()
	c := redistest.Start(t).Client(t)
	prefix := fmt.Sprintf("advmix-%d:", time.Now().UnixNano())
	o := engine.Options{Lease: time.Hour, MaxAttempts: 3}
	e, f := openRedis(t, c, prefix, o), openRedis(t, c, prefix, o)
	defer e.Close()
	defer f.Close()
	mk := func(k string, v uint64) []engine.Claim {
		a, err := e.Advance(ctx, []byte(k), v)
		if err != nil || a.Outcome != engine.New {
			t.Fatal(a.Outcome, err)
		}
		n, err := e.Claim(ctx, []byte(k))
		if err != nil || n.Outcome != engine.New {
			t.Fatal(n.Outcome, err)
		}
		return []engine.Claim{a, n}
	}
	if err := e.CommitBatch(ctx, mk("a", 5), nil); err != nil {
		t.Fatal(err)
	}
	cls := mk("b", 7)
	cls = append(cls, mk("c", 9)...)
	bv, _ := e.Advance(ctx, []byte("a"), 6)
	cls = append(cls, bv)
	errs := make([]error, len(cls))
	if err := e.ReleaseBatch(ctx, cls, errs); err != nil {
		t.Fatal(err, errs)
	}
	for k, want := range map[string]engine.Outcome{"a": engine.Stale} {
		if x, err := f.Advance(ctx, []byte(k), 4); err != nil || x.Outcome != want || x.Version != 5 {
			t.Fatalf("%s: %v %d %v", k, x.Outcome, x.Version, err)
		}
	}
	for _, k := range []string{"b", "c"} {
		if x, err := f.Advance(ctx, []byte(k), 1); err != nil || x.Outcome != engine.New {
			t.Fatalf("%s after release: %v %v", k, x.Outcome, err)
		}
	}
	u, _ := e.Advance(ctx, []byte("a"), 8)
	if err := e.UnclaimBatch(ctx, []engine.Claim{u}, nil); err != nil {
		t.Fatal(err)
	}
	if x, _ := f.Advance(ctx, []byte("a"), 5); x.Outcome != engine.Duplicate {
		t.Fatalf("after unclaim: %v", x.Outcome)
	}
	max := uint64(math.MaxUint64)
	for _, v := range []uint64{max - 1, max} {
		x, err := f.Advance(ctx, []byte("big"), v)
		if err != nil || x.Outcome != engine.New {
			t.Fatal(x.Outcome, err)
		}
		if err := f.Commit(ctx, x); err != nil {
			t.Fatal(err)
		}
	}
	if x, _ := e.Advance(ctx, []byte("big"), max-1); x.Outcome != engine.Stale || x.Version != max {
		t.Fatalf("near max: %v %d", x.Outcome, x.Version)
	}
}
