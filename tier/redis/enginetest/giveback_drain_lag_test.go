package enginetest_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// holdNth is a go-redis hook that, armed, runs before (after skipping
// skip such pipelines) the next pipeline of at least min commands whose
// first is an EVALSHA, then sends it.
type holdNth struct {
	armed  atomic.Bool
	skip   atomic.Int32
	min    int
	before func()
}

func (h *holdNth) DialHook(next goredis.DialHook) goredis.DialHook          { return next }
func (h *holdNth) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }
func (h *holdNth) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if h.armed.Load() && len(cmds) >= h.min && cmds[0].Name() == "evalsha" && h.skip.Add(-1) < 0 && h.armed.CompareAndSwap(true, false) {
			h.before()
		}
		return next(ctx, cmds)
	}
}

// losingClient is a client of srv without go-redis's retries whose hooks,
// once armed, lose a MarkBatch's mark replies (h) and its settling
// script's (settle), and hold its give-back (gb): pipelines of at least
// three script calls, so a batch of more than 512 keys.
func losingClient(t *testing.T, srv *redistest.Server) (c *goredis.Client, h, settle *mmpartial, gb *holdNth) {
	h, settle, gb = &mmpartial{min: 3}, &mmpartial{min: 3}, &holdNth{min: 3}
	c = srv.ClientWith(t, &goredis.Options{MaxRetries: -1})
	c.AddHook(h)
	c.AddHook(settle)
	c.AddHook(gb)
	return c, h, settle, gb
}

// waitSealed waits until the partition of start has ended and the drain
// sealed it, as every engine of es reports (Stats.Archive.Lag 0 after
// that partition's end); a test error after 20 s.
func waitSealed(t *testing.T, start time.Time, es ...*engine.Engine) {
	pEnd := start.Truncate(time.Second).Add(time.Second)
	time.Sleep(time.Until(pEnd.Add(1200 * time.Millisecond)))
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		lag := uint64(0)
		for _, e := range es {
			lag += e.Stats().Archive.Lag
		}
		if lag == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("the drain did not seal the marks' partition within 20 s")
			return
		}
	}
}

// stopDrain stops every drain of the process before its next Apply
// (stage "put") until stop is closed, setting stopped when one stops.
func stopDrain(stop <-chan struct{}, stopped *atomic.Bool) {
	enginetest.SetInArchive(func(stage string) {
		if stage == "put" {
			stopped.Store(true)
			<-stop
		}
	})
}

// TestGiveBackWhileDrainLags: a MarkBatch behind Redis with an archive
// commits 600 keys and logs the commits, loses the replies of the mark
// and of its settling script, and gives the keys back (the caller is told
// the call failed: the keys were never acknowledged). The give-back is
// held on its way until the drain has applied the commits and sealed
// their partition, and the drain stops before it applies the removals
// the give-back appends. Until it does, the archive holds commits the
// give-back undid: another engine must answer the keys New (Lookup and
// MarkBatch), not Duplicate from the archive, which would drop the only
// delivery anyone will process. In "mid-read" the drain goes on inside
// the other engine's Lookup, between its archive read (which found the
// commits) and its read of the log's removals (which the drain trimmed
// meanwhile): still New. Once the drain goes on, the marks the other
// engine made are Duplicate, from the archive after Redis's window.
func TestGiveBackWhileDrainLags(t *testing.T) {
	for _, mid := range []bool{false, true} {
		name := "held"
		if mid {
			name = "mid-read"
		}
		t.Run(name, func(t *testing.T) { giveBackWhileDrainLags(t, mid) })
	}
}

func giveBackWhileDrainLags(t *testing.T, mid bool) {
	srv := redistest.Start(t)
	plain := srv.Client(t)
	ctx := context.Background()
	hc, h, settle, gb := losingClient(t, srv)
	prefix := fmt.Sprintf("gblag-%d:", time.Now().UnixNano())
	arch := redisArchive(t)
	o := redisArchiveOptions(plain, prefix, arch)
	o.Logger = quiet
	b := open(t, o)
	defer b.Close()
	o.Backend = redisBackend(hc, prefix)
	a := open(t, o)
	defer a.Close()

	stop := make(chan struct{})
	var stopped atomic.Bool
	goOn := sync.OnceFunc(func() { close(stop) }) // the drain goes on
	release := func() {
		enginetest.SetInArchive(nil)
		goOn()
	}
	defer release()
	var start, sealedAt time.Time
	gb.before = func() {
		// The commits were made in the partition of the mark's start;
		// wait until it ended and the drain sealed it.
		waitSealed(t, start, a, b)
		sealedAt = time.Now()
		var midDone atomic.Bool
		enginetest.SetInArchive(func(stage string) {
			switch {
			case stage == "put":
				stopped.Store(true)
				<-stop
			case stage == "removals" && mid && midDone.CompareAndSwap(false, true):
				goOn() // the drain applies and trims the removals
				for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
					if n, err := plain.HLen(ctx, prefix+"\x00\xffremoving").Result(); err == nil && n == 0 {
						break
					}
					if time.Now().After(deadline) {
						t.Errorf("the drain did not trim the removals within 20 s")
						break
					}
				}
			}
		})
	}

	lost := keysOf("gblag", 600)
	out := make([]engine.Outcome, len(lost))
	h.arm("evalsha", 0, -1)
	settle.arm("evalsha", 1, 0)
	gb.skip.Store(1)
	gb.armed.Store(true)
	start = time.Now()
	err := a.MarkBatch(ctx, lost, nil, out)
	if h.hits.Load() != 1 || settle.hits.Load() != 1 || gb.armed.Load() || !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("MarkBatch with the mark and settling replies lost: %v (fault hits %d, %d; give-back held: %v)", err, h.hits.Load(), settle.hits.Load(), !gb.armed.Load())
	}
	if t.Failed() {
		return
	}
	n, err := plain.HLen(ctx, prefix+"\x00\xffremoving").Result()
	if err != nil || n != int64(len(lost)) {
		t.Fatalf("removals recorded in the log's hash: %d (%v), want %d", n, err, len(lost))
	}
	for deadline := time.Now().Add(10 * time.Second); !stopped.Load(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the drain did not reach the removals within 10 s")
		}
	}
	t.Logf("partition sealed %v after the mark started; the drain stopped before the removals", sealedAt.Sub(start).Round(time.Millisecond))

	info := make([]engine.KeyInfo, len(lost))
	if err := b.LookupBatch(ctx, lost, info); err != nil {
		t.Fatal(err)
	}
	for i := range info {
		if info[i].Outcome != engine.New {
			t.Fatalf("given-back key %s while the drain lags = %v from %v, want New", lost[i], info[i].Outcome, info[i].Source)
		}
	}
	if err := b.MarkBatch(ctx, lost, nil, out); err != nil {
		t.Fatal(err)
	}
	for i, o := range out {
		if o != engine.New {
			t.Fatalf("other engine's mark of given-back key %s while the drain lags = %v, want New", lost[i], o)
		}
	}
	release()
	waitFromArchive(t, b, lost, 30*time.Second)
	if n, err := plain.HLen(ctx, prefix+"\x00\xffremoving").Result(); err != nil || n != 0 {
		t.Fatalf("removals left in the log's hash after the drain trimmed them: %d (%v)", n, err)
	}
}
