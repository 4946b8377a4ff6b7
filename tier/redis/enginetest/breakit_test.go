package enginetest_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/postgres"
	"github.com/tierdedup/tierdedup/tier/redis"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// Attacks on the archive behind Redis (the archive log, the one-step
// logged mark bounded by LogBy, the removals hash), combined with clock
// skew, late copies of script calls, Redis pauses, client timeouts,
// closed engines, Forget racing Mark and configuration changes.

// bkClock is a system clock off by d (a host whose clock differs from
// Redis's).
type bkClock struct{ d time.Duration }

func (c bkClock) Now() time.Time { return time.Now().Add(c.d) }

// bkTyped reports whether err is one of the engine's typed errors (or the
// caller's own context ending).
func bkTyped(err error) bool {
	for _, e := range []error{engine.ErrUnavailable, engine.ErrClosed, engine.ErrInFlight, engine.ErrLeaseLost, engine.ErrLayout, engine.ErrOptions, context.DeadlineExceeded, context.Canceled} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// TestBreakItClockSkew: an engine whose clock is behind Redis's by a
// little (300 ms), or ahead by 1.5 s, marks fresh keys; one behind by 1.2
// or 1.5 s fails every MarkBatch with a typed error and writes nothing
// (docs/archive.md: a one-step mark must reach Redis by LogBy, one second
// after the archive read by the engine's clock); what any acknowledges
// stays Duplicate once Redis let it go (archive).
func TestBreakItClockSkew(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	prefix := fmt.Sprintf("bkskew-%d:", time.Now().UnixNano())
	arch := redisArchive(t)
	ref := ra2Open(t, redisArchiveOptions(c, prefix, arch))
	gMarkNew(t, ref, keysOf("bkskew-warm", 3))
	var acked [][]byte
	for _, skew := range []time.Duration{-1500 * time.Millisecond, -1200 * time.Millisecond, -300 * time.Millisecond, 1500 * time.Millisecond} {
		refused := skew <= -time.Second
		t.Run(fmt.Sprint("skew=", skew), func(t *testing.T) {
			o := redisArchiveOptions(c, prefix, arch)
			o.Clock = bkClock{skew}
			e := ra2Open(t, o)
			var lastErr error
			fails := 0
			for round := 0; round < 5; round++ {
				keys := keysOf(fmt.Sprintf("bkskew%v-%d", skew, round), 10)
				out := make([]engine.Outcome, len(keys))
				err := e.MarkBatch(ctx, keys, nil, out)
				if err != nil {
					if !bkTyped(err) {
						t.Errorf("untyped error: %v", err)
					}
					if refused && !errors.Is(err, redis.ErrPastLogBy) {
						t.Errorf("MarkBatch failed, but not past its LogBy: %v", err)
					}
					fails++
					lastErr = err
					// Nothing may stay marked: the keys are New for another engine.
					info := make([]engine.KeyInfo, len(keys))
					if lerr := ref.LookupBatch(ctx, keys, info); lerr != nil {
						t.Fatal(lerr)
					}
					for i := range info {
						if info[i].Outcome != engine.New {
							t.Errorf("key %s of a failed MarkBatch: %v, want New", keys[i], info[i].Outcome)
						}
					}
					continue
				}
				for i, o := range out {
					if o != engine.New {
						t.Errorf("fresh key %s: %v", keys[i], o)
					}
				}
				acked = append(acked, keys...)
			}
			if refused && fails != 5 {
				t.Errorf("engine clock %v off Redis's: %d of 5 MarkBatch calls failed, want every one (a mark past its LogBy)", skew, fails)
			}
			if !refused && fails > 0 {
				t.Errorf("engine clock %v off Redis's: %d of 5 MarkBatch calls of fresh keys failed, last: %v", skew, fails, lastErr)
			}
		})
	}
	if len(acked) > 0 {
		waitFromArchive(t, ref, acked, 25*time.Second)
	}
}

// bkSplitMark is a go-redis hook that, armed, runs the next mark
// pipeline (markLogScript calls, the archive log as their first key) one
// chunk first and the others delay later: the first chunk commits before
// LogBy, the others reach Redis after it.
type bkSplitMark struct {
	armed  atomic.Bool
	logKey string
	delay  time.Duration
}

func (h *bkSplitMark) DialHook(next goredis.DialHook) goredis.DialHook          { return next }
func (h *bkSplitMark) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }
func (h *bkSplitMark) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if len(cmds) >= 2 && cmds[0].Name() == "evalsha" && len(cmds[0].Args()) > 3 && fmt.Sprint(cmds[0].Args()[3]) == h.logKey && h.armed.CompareAndSwap(true, false) {
			err1 := next(ctx, cmds[:1])
			time.Sleep(h.delay)
			err2 := next(ctx, cmds[1:])
			if err1 != nil {
				return err1
			}
			return err2
		}
		return next(ctx, cmds)
	}
}

// TestBreakItMarkChunksStraddleLogBy: a MarkBatch of 600 keys (three
// chunks) whose first chunk commits (and logs) before LogBy and whose
// other chunks reach Redis after it. The call must fail, and every key
// be New for another engine, before and after Redis's window (the
// archive must not bring the first chunk's commits back), and the next
// mark of each key New exactly once.
func TestBreakItMarkChunksStraddleLogBy(t *testing.T) {
	srv := redistest.Start(t)
	plain := srv.Client(t)
	ctx := context.Background()
	prefix := fmt.Sprintf("bksplit-%d:", time.Now().UnixNano())
	arch := redisArchive(t)
	h := &bkSplitMark{logKey: prefix + "\x00\x00", delay: 1300 * time.Millisecond}
	hc := srv.ClientWith(t, &goredis.Options{MaxRetries: -1})
	hc.AddHook(h)
	a := ra2Open(t, redisArchiveOptions(hc, prefix, arch))
	b := ra2Open(t, redisArchiveOptions(plain, prefix, arch))
	gMarkNew(t, a, keysOf("bksplit-warm", 3))
	keys := keysOf("bksplit", 600)
	out := make([]engine.Outcome, len(keys))
	h.armed.Store(true)
	err := a.MarkBatch(ctx, keys, nil, out)
	if !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("MarkBatch whose later chunks passed LogBy: %v (%v), want ErrUnavailable", err, out[:3])
	}
	t.Logf("MarkBatch: %v", err)
	committed, removed := 0, 0
	for _, e := range gReadLog(t, plain, prefix) {
		for _, k := range e.commits {
			if strings.Contains(k, "bksplit-0") {
				committed++
			}
		}
		if strings.Contains(e.forget, "bksplit-0") {
			removed++
		}
	}
	t.Logf("log: %d commits, %d removals of the batch's keys", committed, removed)
	if removed < committed {
		t.Errorf("the log holds %d commits of the failed batch and only %d removals", committed, removed)
	}
	info := make([]engine.KeyInfo, len(keys))
	check := func(when string) {
		if err := b.LookupBatch(ctx, keys, info); err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		bad := 0
		for i := range info {
			if info[i].Outcome != engine.New {
				if bad++; bad <= 3 {
					t.Errorf("%s: key %s of the failed MarkBatch: %v from %v, want New", when, keys[i], info[i].Outcome, info[i].Source)
				}
			}
		}
	}
	check("at once")
	time.Sleep(8 * time.Second) // past Redis's window; the drain applied the log
	ra2WaitDrained(t, b, 10*time.Second)
	check("past Redis's window")
	if err := b.MarkBatch(ctx, keys, nil, out); err != nil {
		t.Fatal(err)
	}
	for i, o := range out {
		if o != engine.New {
			t.Fatalf("mark of %s after the failed batch: %v, want New", keys[i], o)
		}
	}
}

// bkClient is a client of srv with short timeouts, so that a paused
// server loses replies (settled, or given back) rather than holding calls.
func bkClient(t *testing.T, srv *redistest.Server) *goredis.Client {
	return srv.ClientWith(t, &goredis.Options{ReadTimeout: 400 * time.Millisecond, WriteTimeout: 400 * time.Millisecond, MaxRetries: 2, PoolSize: 8, PoolTimeout: 600 * time.Millisecond})
}

// TestBreakItNemesisPausesCloseDrainer: two engines on one prefix (A, the
// drainer, Lease 2 s; B, Lease 700 ms), three workers each marking unique
// keys in batches with random deadlines (none, 60 ms, 300 ms), each batch
// sent again on the same engine until it is answered (a consumer's
// redelivery), while Redis is paused 300 ms to 2 s every 1.2 s; A is
// closed half way (the drain moves to B). No key may be New twice; a key
// of B's workers (never answered before) may never be Duplicate (a
// message nobody processed); every error is typed; every acknowledged
// key is Duplicate from the archive after Redis's window.
func TestBreakItNemesisPausesCloseDrainer(t *testing.T) {
	srv := redistest.Start(t)
	plain := srv.Client(t)
	prefix := fmt.Sprintf("bknem-%d:", time.Now().UnixNano())
	arch := redisArchive(t)
	oa := redisArchiveOptions(bkClient(t, srv), prefix, arch)
	oa.Logger = quiet
	a := ra2Open(t, oa)
	ra2WaitDrainer(t, a, 5*time.Second)
	ob := redisArchiveOptions(bkClient(t, srv), prefix, arch)
	ob.Lease, ob.Logger = 700*time.Millisecond, quiet
	b := ra2Open(t, ob)
	var (
		mu       sync.Mutex
		news     = map[string]int{}
		answered = map[string]bool{}
		dropped  []string
		untyped  []string
		acked    [][]byte
		calls    atomic.Int64
		fails    atomic.Int64
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	worker := func(e *engine.Engine, name string, strict bool, seed int64) {
		defer wg.Done()
		rng := rand.New(rand.NewSource(seed))
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			time.Sleep(20 * time.Millisecond)
			keys := keysOf(fmt.Sprintf("bknem-%s-%d", name, n), 5)
			out := make([]engine.Outcome, len(keys))
			for try := 0; ; try++ {
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				switch rng.Intn(3) {
				case 1:
					ctx, cancel = context.WithTimeout(ctx, 60*time.Millisecond)
				case 2:
					ctx, cancel = context.WithTimeout(ctx, 300*time.Millisecond)
				}
				err := e.MarkBatch(ctx, keys, nil, out)
				cancel()
				calls.Add(1)
				if err != nil {
					fails.Add(1)
					if errors.Is(err, engine.ErrClosed) {
						return
					}
					if !bkTyped(err) {
						mu.Lock()
						untyped = append(untyped, err.Error())
						mu.Unlock()
					}
					select {
					case <-stop:
						return
					case <-time.After(50 * time.Millisecond):
					}
					continue
				}
				mu.Lock()
				for i, o := range out {
					k := string(keys[i])
					switch o {
					case engine.New:
						news[k]++
						answered[k] = true
						acked = append(acked, keys[i])
					case engine.Duplicate, engine.Conflict:
						if strict && !answered[k] {
							dropped = append(dropped, fmt.Sprintf("%s (%s, try %d)", k, name, try))
						}
						answered[k] = true
					}
				}
				mu.Unlock()
				done := true
				for _, o := range out {
					if o == engine.InFlight {
						done = false
					}
				}
				if done {
					break
				}
			}
		}
	}
	for w := 0; w < 3; w++ {
		wg.Add(2)
		go worker(a, fmt.Sprint("a", w), false, int64(w))
		go worker(b, fmt.Sprint("b", w), true, int64(100+w))
	}
	pauses := make(chan struct{})
	go func() {
		defer close(pauses)
		rng := rand.New(rand.NewSource(7))
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(1200 * time.Millisecond):
			}
			srv.Pause()
			time.Sleep(time.Duration(300+rng.Intn(1700)) * time.Millisecond)
			srv.Resume()
		}
	}()
	time.Sleep(9 * time.Second)
	// Close the drainer, possibly while Redis is paused.
	closed := make(chan error, 1)
	go func() {
		start := time.Now()
		err := a.Close()
		t.Logf("A closed in %v", time.Since(start).Round(time.Millisecond))
		closed <- err
	}()
	time.Sleep(9 * time.Second)
	close(stop)
	wg.Wait()
	<-pauses
	srv.Resume()
	if err := <-closed; err != nil {
		t.Logf("A.Close: %v", err)
	}
	t.Logf("%d calls, %d failed, %d keys acknowledged", calls.Load(), fails.Load(), len(acked))
	for k, n := range news {
		if n > 1 {
			t.Errorf("key %s answered New %d times", k, n)
		}
	}
	for i, d := range dropped {
		if i < 5 {
			t.Errorf("key of a never-answered message answered Duplicate (dropped): %s", d)
		}
	}
	if len(dropped) > 0 {
		t.Errorf("%d dropped messages", len(dropped))
	}
	for i, u := range untyped {
		if i < 5 {
			t.Errorf("untyped error: %s", u)
		}
	}
	if len(acked) < 100 {
		t.Fatalf("only %d keys acknowledged: the test did not exercise much", len(acked))
	}
	_ = plain
	c := ra2Open(t, redisArchiveOptions(srv.Client(t), prefix, arch))
	waitFromArchive(t, c, acked, 30*time.Second)
}

// TestBreakItForgetRacesMark: keys that live only in the archive (Redis
// let them go) are forgotten on one engine while another marks them,
// concurrently, with Redis paused now and then. A mark answered New must
// stay Duplicate (in Redis, then from the archive); a mark answered
// Duplicate whose key's Forget succeeded means the Forget came after it:
// the key is New afterwards, before and after Redis's window.
func TestBreakItForgetRacesMark(t *testing.T) {
	t.Run("paused", func(t *testing.T) { bkForgetRacesMark(t, false, 150*time.Millisecond, 0) })
	// Pauses and stalls longer than a Forget's LogBy (a second after its
	// archive read), every other Forget's deletes held 1.3 s on their way:
	// the deletes of keys only the archive holds that reach Redis after
	// it append nothing and fail; the others hold as above.
	t.Run("paused-past-logby", func(t *testing.T) { bkForgetRacesMark(t, false, 1300*time.Millisecond, 1300*time.Millisecond) })
	// The drain stalled during the race, Forgets with a 400 ms deadline:
	// they fail after appending their removals, which the marks' archive
	// reads must see pending.
	t.Run("drain-stalled", func(t *testing.T) { bkForgetRacesMark(t, true, 150*time.Millisecond, 0) })
}

func bkForgetRacesMark(t *testing.T, stall bool, pause, slow time.Duration) {
	srv := redistest.Start(t)
	plain := srv.Client(t)
	ctx := context.Background()
	prefix := fmt.Sprintf("bkfm-%d:", time.Now().UnixNano())
	arch := redisArchive(t)
	ac := bkClient(t, srv)
	var slowOn atomic.Bool
	sh := bkSlowForget(slow, 2, &slowOn)
	ac.AddHook(sh)
	oa := redisArchiveOptions(ac, prefix, arch)
	oa.Logger = quiet
	a := ra2Open(t, oa)
	ob := redisArchiveOptions(bkClient(t, srv), prefix, arch)
	ob.Logger = quiet
	b := ra2Open(t, ob)
	keys := keysOf("bkfm", 60)
	gMarkNew(t, a, keys)
	waitFromArchive(t, b, keys, 25*time.Second)
	slowOn.Store(slow > 0)
	type res struct {
		mark      engine.Outcome
		markErr   error
		forget    engine.KeyInfo
		forgetErr error
	}
	results := make([]res, len(keys))
	var wg sync.WaitGroup
	forgetWait := 5 * time.Second
	var lease string
	if stall {
		forgetWait = 400 * time.Millisecond
		lease = ra2StallDrain(t, plain, prefix)
		time.Sleep(700 * time.Millisecond) // the drainer's pass in progress ends
	}
	stopPause := make(chan struct{})
	go func() {
		for {
			select {
			case <-stopPause:
				return
			case <-time.After(250 * time.Millisecond):
			}
			srv.Pause()
			time.Sleep(pause)
			srv.Resume()
		}
	}()
	for i := range keys {
		wg.Add(2)
		go func(i int) {
			defer wg.Done()
			time.Sleep(time.Duration(i%7) * 30 * time.Millisecond)
			fctx, cancel := context.WithTimeout(ctx, forgetWait)
			defer cancel()
			results[i].forget, results[i].forgetErr = a.Forget(fctx, keys[i])
		}(i)
		go func(i int) {
			defer wg.Done()
			time.Sleep(time.Duration(i%5) * 40 * time.Millisecond)
			results[i].mark, results[i].markErr = b.MarkIfAbsent(ctx, keys[i])
		}(i)
		if i%10 == 9 {
			wg.Wait()
		}
	}
	wg.Wait()
	close(stopPause)
	srv.Resume()
	if stall {
		gFreeDrain(t, plain, lease)
	}
	counts := map[string]int{}
	for _, r := range results {
		counts[fmt.Sprintf("mark=%v/%v forget=%v:%v/%v", r.mark, r.markErr != nil, r.forget.Outcome, r.forget.Source, r.forgetErr != nil)]++
		for _, err := range []error{r.markErr, r.forgetErr} {
			if err != nil && !bkTyped(err) {
				t.Errorf("untyped error: %v", err)
			}
		}
	}
	late := 0
	for _, r := range results {
		if r.forgetErr != nil && errors.Is(r.forgetErr, redis.ErrPastLogBy) {
			late++
		}
	}
	t.Logf("outcomes: %v; %d Forgets refused past their LogBy (%d held on their way)", counts, late, sh.held.Load())
	if slow > time.Second && late == 0 {
		t.Errorf("no Forget reached Redis past its LogBy: deletes held %v tested nothing", slow)
	}
	verify := func(when string) {
		info := make([]engine.KeyInfo, len(keys))
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			err := b.LookupBatch(ctx, keys, info)
			if err == nil {
				break
			}
			if !errors.Is(err, engine.ErrUnavailable) || time.Now().After(deadline) {
				t.Fatalf("%s: %v", when, err)
			}
		}
		for i, r := range results {
			// A Forget that answered from Redis (not the archive) removed
			// the mark's commit: it came after the mark.
			forgotMark := r.forgetErr == nil && r.forget.Outcome == engine.Duplicate && r.forget.Source != engine.SourceArchive
			switch {
			case r.markErr == nil && r.mark == engine.New && forgotMark && info[i].Outcome != engine.New:
				t.Errorf("%s: key %s marked New, then forgotten (the Forget found %v from %v): %v from %v, want New", when, keys[i], r.forget.Outcome, r.forget.Source, info[i].Outcome, info[i].Source)
			case r.markErr == nil && r.mark == engine.New && !forgotMark && (r.forgetErr == nil || errors.Is(r.forgetErr, engine.ErrInFlight)) && info[i].Outcome != engine.Duplicate:
				t.Errorf("%s: key %s marked New (forget %v from %v, %v): %v from %v, want Duplicate", when, keys[i], r.forget.Outcome, r.forget.Source, r.forgetErr, info[i].Outcome, info[i].Source)
			case r.markErr == nil && r.mark == engine.Duplicate && r.forgetErr == nil && info[i].Outcome != engine.New:
				t.Errorf("%s: key %s marked Duplicate, then forgotten: %v from %v, want New", when, keys[i], info[i].Outcome, info[i].Source)
			}
		}
	}
	verify("at once")
	time.Sleep(8 * time.Second)
	verify("past Redis's window")
}

// TestBreakItReopenChangedConfig: an engine on a prefix that feeds an
// archive keeps running while an engine with changed settings tries to
// join (each variant on a prefix and archive of its own): what the prefix
// or the archive records is refused with a typed error and writes nothing
// (docs: a refused Open "records nothing"), so an engine with the
// prefix's own options still opens (a restart of any of its processes);
// what they do not record (Lease) joins, and every key any of them
// acknowledged stays Duplicate, in Redis and from the archive.
func TestBreakItReopenChangedConfig(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	for _, v := range []struct {
		name string
		mod  func(*engine.Options)
	}{
		{"window", func(o *engine.Options) { o.Window = 8 * time.Second }},
		{"archive-window-longer", func(o *engine.Options) { o.ArchiveWindow = 2 * time.Minute }},
		{"archive-window-shorter", func(o *engine.Options) { o.ArchiveWindow = 30 * time.Second }},
		{"partition", func(o *engine.Options) { o.Partition = 2 * time.Second }},
		{"expected-keys", func(o *engine.Options) { o.ExpectedKeys = 2000 }},
		{"shared-cache", func(o *engine.Options) { o.NoSharedCache = false }},
		{"ns-archive-window", func(o *engine.Options) {
			o.Namespaces = map[string]engine.NamespaceOptions{"aw": {ArchiveWindow: 10 * time.Second}}
		}},
		{"sliding", func(o *engine.Options) {
			o.Namespaces = map[string]engine.NamespaceOptions{"s": {Sliding: true}}
		}},
		{"ns-window", func(o *engine.Options) {
			o.Namespaces = map[string]engine.NamespaceOptions{"w": {Window: 3 * time.Second}}
		}},
		{"lease-300ms", func(o *engine.Options) { o.Lease = 300 * time.Millisecond }},
		{"max-attempts", func(o *engine.Options) { o.MaxAttempts = 3 }},
		{"false-positive", func(o *engine.Options) { o.ArchiveFalsePositive = 0.001 }},
	} {
		t.Run(v.name, func(t *testing.T) {
			prefix := fmt.Sprintf("bkcfg-%d:", time.Now().UnixNano())
			arch := redisArchive(t)
			base := ra2Open(t, redisArchiveOptions(c, prefix, arch))
			acked := keysOf("bkcfg-base", 20)
			gMarkNew(t, base, acked)
			o := redisArchiveOptions(c, prefix, arch)
			o.Logger = quiet
			v.mod(&o)
			e, err := engine.Open(&o)
			if err != nil {
				if !errors.Is(err, engine.ErrLayout) && !errors.Is(err, engine.ErrOptions) {
					t.Errorf("refused with an untyped error: %v", err)
				}
				t.Logf("refused: %v", err)
				// A refused Open writes nothing: the prefix's own
				// configuration still opens (a restart of any process).
				ob := redisArchiveOptions(c, prefix, arch)
				ob.Logger = quiet
				again, err := engine.Open(&ob)
				if err != nil {
					t.Errorf("after the refused %s Open, an engine with the prefix's own options is refused: %v", v.name, err)
					return
				}
				_ = again.Close()
				return
			}
			defer e.Close()
			t.Logf("opened")
			out := make([]engine.Outcome, len(acked))
			lmMark(t, e, nil, acked, out)
			for i, o := range out {
				if o != engine.Duplicate {
					t.Errorf("acknowledged key %s on the %s engine: %v", acked[i], v.name, o)
				}
			}
			fresh := keysOf("bkcfg-"+v.name, 10)
			lmMark(t, e, nil, fresh, out[:10])
			for i, o := range out[:10] {
				if o != engine.New {
					t.Errorf("fresh key %s on the %s engine: %v", fresh[i], v.name, o)
				}
			}
			acked = append(acked, fresh...)
			if err := base.MarkBatch(ctx, fresh, nil, out[:10]); err != nil {
				t.Fatal(err)
			}
			for i, o := range out[:10] {
				if o != engine.Duplicate {
					t.Errorf("base engine's mark of %s, acknowledged by the %s engine: %v", fresh[i], v.name, o)
				}
			}
			waitFromArchive(t, base, acked, 25*time.Second)
			waitFromArchive(t, e, acked, 25*time.Second)
		})
	}
}

// bkSeq is a go-redis hook that, armed with a list of actions, applies
// one to each script pipeline (an EVALSHA first, not the drain's own
// trim or lease) in turn: 'L' runs it and loses every reply (a dropped
// connection after the server applied it), 'D' drops it unsent (nothing
// applied), '.' lets it through.
type bkSeq struct {
	mu      sync.Mutex
	actions []byte
	used    int
}

func (h *bkSeq) arm(actions string) {
	h.mu.Lock()
	h.actions, h.used = []byte(actions), 0
	h.mu.Unlock()
}

func (h *bkSeq) DialHook(next goredis.DialHook) goredis.DialHook          { return next }
func (h *bkSeq) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }
func (h *bkSeq) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if len(cmds) == 0 || cmds[0].Name() != "evalsha" || logTrim(cmds) {
			return next(ctx, cmds)
		}
		h.mu.Lock()
		act := byte('.')
		if len(h.actions) > 0 {
			act, h.actions = h.actions[0], h.actions[1:]
			h.used++
		}
		h.mu.Unlock()
		switch act {
		case 'L':
			_ = next(ctx, cmds)
		case 'D':
		default:
			return next(ctx, cmds)
		}
		for _, c := range cmds {
			c.SetErr(errMmDropped)
		}
		return errMmDropped
	}
}

// TestBreakItRetryAfterLostGiveBack: a MarkBatch behind the archive whose
// mark the server applied, with its reply, its settling and its give-back
// (Unmark) all lost, fails (ErrUnavailable); the engine remembers the
// call's token so that its retry adopts that commit (docs/reliability.md:
// "a give-back that cannot reach the tier leaves the retry of this
// process to find its own mark"), as it does without the archive. The
// redelivery of the message, to the same process, must be New: nobody
// was ever told the key was processed. Variants: the redelivery at once
// (the control); 3 s later (inside Redis's 6 s window, but after the
// drain sealed the failed call's commit into the archive, which the
// one-step mark reads before Redis); and at once after one more attempt
// whose archive read failed (a transient PostgreSQL error).
func TestBreakItRetryAfterLostGiveBack(t *testing.T) {
	// "after-seal" is a residual (docs/reliability.md), reproduced by
	// TestResidualRetryAfterSeal (build tag residuals).
	for _, variant := range []string{"immediate", "archive-read-fails"} {
		t.Run(variant, func(t *testing.T) { bkRetryAfterLostGiveBack(t, variant) })
	}
}

// bkRetryAfterLostGiveBack is one variant of
// TestBreakItRetryAfterLostGiveBack.
func bkRetryAfterLostGiveBack(t *testing.T, variant string) {
	{
		{
			srv := redistest.Start(t)
			plain := srv.Client(t)
			ctx := context.Background()
			prefix := fmt.Sprintf("bkretry-%d:", time.Now().UnixNano())
			arch := redisArchive(t)
			oa := redisArchiveOptions(plain, prefix, arch)
			oa.Logger = quiet
			a := ra2Open(t, oa)
			ra2WaitDrainer(t, a, 5*time.Second)
			seq := &bkSeq{}
			hc := srv.ClientWith(t, &goredis.Options{MaxRetries: -1})
			hc.AddHook(seq)
			fdb := &raFaultDB{ArchiveDB: arch.DB}
			ob := redisArchiveOptions(hc, prefix, postgres.Archive{DB: fdb, Table: arch.Table})
			ob.Logger = quiet
			b := ra2Open(t, ob)
			keys := keysOf("bkretry", 5)
			if variant == "archive-read-fails" {
				// Keys the archive filter holds (committed, archived once
				// Redis let them go, then forgotten: no fence in Redis),
				// so that a mark of them reads the archive.
				gMarkNew(t, a, keys)
				waitFromArchive(t, b, keys, 25*time.Second)
				info := make([]engine.KeyInfo, len(keys))
				if err := a.ForgetBatch(ctx, keys, info); err != nil {
					t.Fatal(err)
				}
				if err := b.LookupBatch(ctx, keys, info); err != nil {
					t.Fatal(err)
				}
				for i := range info {
					if info[i].Outcome != engine.New {
						t.Fatalf("forgotten key %s: %v", keys[i], info[i].Outcome)
					}
				}
			} else {
				gMarkNew(t, b, keysOf("bkretry-warm", 2))
			}
			out := make([]engine.Outcome, len(keys))
			// Call 1: the mark applied, every reply lost, the settling and
			// the give-back never sent.
			seq.arm("LDD")
			err := b.MarkBatch(ctx, keys, nil, out)
			seq.arm("")
			if !errors.Is(err, engine.ErrUnavailable) {
				t.Fatalf("call 1: %v, want ErrUnavailable", err)
			}
			t.Logf("call 1: %v", err)
			if v, err := plain.Get(ctx, redisKeyOf(prefix, "", keys[0])).Result(); err != nil || !strings.HasPrefix(v, "D") {
				t.Fatalf("call 1's mark is not committed in Redis (%q, %v): the fault did not apply it", v, err)
			}
			switch variant {
			case "after-seal":
				time.Sleep(3 * time.Second)
				if n, err := redisHeld(ctx, plain, redisKeyOf(prefix, "", keys[0])); err != nil || n != 1 {
					t.Fatalf("Redis no longer holds call 1's commit (%d, %v)", n, err)
				}
			case "archive-read-fails":
				// Call 2: its archive read fails.
				fdb.failApplied.Store(true)
				err := b.MarkBatch(ctx, keys, nil, out)
				fdb.failApplied.Store(false)
				if fdb.hits.Load() == 0 {
					t.Fatalf("call 2 did not read the archive (%v): inconclusive", err)
				}
				if !errors.Is(err, engine.ErrUnavailable) {
					t.Fatalf("call 2 with its archive read failing: %v %v, want ErrUnavailable", out, err)
				}
				t.Logf("call 2: %v", err)
			}
			// The redelivery, in the same process.
			bkRedeliverNew(t, b, keys, out, "whose every earlier mark failed (ErrUnavailable), to the same process")
			// Once answered New, the key is Duplicate for everyone.
			info := make([]engine.KeyInfo, len(keys))
			if err := a.LookupBatch(ctx, keys, info); err != nil {
				t.Fatal(err)
			}
			for i := range info {
				if info[i].Outcome != engine.Duplicate {
					t.Errorf("key %s after its redelivery: %v", keys[i], info[i].Outcome)
				}
			}
		}
	}
}

// TestBreakItRetryAfterLostGiveBackMaxAttempts: the same with MaxAttempts
// (marks go claim, archive read, commit): call 1's commit is applied with
// its reply lost and its give-back never sent (ErrUnavailable, its token
// remembered); call 2, the redelivery batched with keys whose archive
// read fails, adopts call 1's commit in Redis and then fails in the
// archive read (ErrUnavailable). Call 3, the next redelivery to the same
// process, must be New. (Control: without call 2, New.)
func TestBreakItRetryAfterLostGiveBackMaxAttempts(t *testing.T) {
	for _, failRead := range []bool{false, true} {
		t.Run(fmt.Sprint("archive-read-fails=", failRead), func(t *testing.T) {
			srv := redistest.Start(t)
			plain := srv.Client(t)
			ctx := context.Background()
			prefix := fmt.Sprintf("bkretryma-%d:", time.Now().UnixNano())
			arch := redisArchive(t)
			oa := redisArchiveOptions(plain, prefix, arch)
			oa.Logger, oa.MaxAttempts = quiet, 3
			a := ra2Open(t, oa)
			ra2WaitDrainer(t, a, 5*time.Second)
			seq := &bkSeq{}
			hc := srv.ClientWith(t, &goredis.Options{MaxRetries: -1})
			hc.AddHook(seq)
			fdb := &raFaultDB{ArchiveDB: arch.DB}
			ob := redisArchiveOptions(hc, prefix, postgres.Archive{DB: fdb, Table: arch.Table})
			ob.Logger, ob.MaxAttempts = quiet, 3
			b := ra2Open(t, ob)
			// Keys the archive filter holds, forgotten since.
			filtered := keysOf("bkretryma-f", 3)
			gMarkNew(t, a, filtered)
			waitFromArchive(t, b, filtered, 25*time.Second)
			info := make([]engine.KeyInfo, len(filtered))
			if err := a.ForgetBatch(ctx, filtered, info); err != nil {
				t.Fatal(err)
			}
			keys := keysOf("bkretryma", 3)
			out := make([]engine.Outcome, len(keys))
			// Call 1: claimed; the commit applied, its reply lost; the
			// give-back never sent.
			seq.arm(".LD")
			err := b.MarkBatch(ctx, keys, nil, out)
			seq.arm("")
			if !errors.Is(err, engine.ErrUnavailable) {
				t.Fatalf("call 1: %v %v, want ErrUnavailable", out, err)
			}
			t.Logf("call 1: %v", err)
			if v, err := plain.Get(ctx, redisKeyOf(prefix, "", keys[0])).Result(); err != nil || !strings.HasPrefix(v, "D") {
				t.Fatalf("call 1's commit is not in Redis (%q, %v)", v, err)
			}
			if failRead {
				both := append(append([][]byte{}, keys...), filtered...)
				o2 := make([]engine.Outcome, len(both))
				fdb.failApplied.Store(true)
				err := b.MarkBatch(ctx, both, nil, o2)
				fdb.failApplied.Store(false)
				if fdb.hits.Load() == 0 {
					t.Fatalf("call 2 did not read the archive (%v %v): inconclusive", o2, err)
				}
				if !errors.Is(err, engine.ErrUnavailable) {
					t.Fatalf("call 2: %v %v, want ErrUnavailable", o2, err)
				}
				t.Logf("call 2: %v", err)
			}
			bkRedeliverNew(t, b, keys, out, "whose every earlier mark failed (ErrUnavailable), to the same process")
		})
	}
}

// bkRedeliverNew marks keys on e again (the message redelivered; a call
// the engine refuses with ErrUnavailable is made again, up to 20 times)
// and fails t for each key not answered New: nobody processed it before.
// how says which redelivery it is.
func bkRedeliverNew(t *testing.T, e *engine.Engine, keys [][]byte, out []engine.Outcome, how string) {
	t.Helper()
	var err error
	for try := 0; try < 20; try++ {
		if err = e.MarkBatch(context.Background(), keys, nil, out); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range out {
		if o != engine.New {
			t.Errorf("redelivery of %s, %s: %v, want New (a message nobody processed is dropped)", keys[i], how, o)
		}
	}
}

// bkLateForget is a go-redis hook that, armed, lets the next Forget
// script pipeline (the forget script: per request ARGV nk = 2, na = 4)
// run and keeps a copy of it, to be delivered again later (a copy of the
// command that go-redis retried, whose first TCP segment arrives late).
type bkLateForget struct {
	armed  atomic.Bool
	mu     sync.Mutex
	copies [][]any
}

func (h *bkLateForget) DialHook(next goredis.DialHook) goredis.DialHook          { return next }
func (h *bkLateForget) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }
func (h *bkLateForget) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if h.armed.Load() && len(cmds) > 0 && bkIsForget(cmds[0]) && h.armed.CompareAndSwap(true, false) {
			h.mu.Lock()
			for _, c := range cmds {
				h.copies = append(h.copies, append([]any(nil), c.Args()...))
			}
			h.mu.Unlock()
		}
		return next(ctx, cmds)
	}
}

// bkSlowForget returns a hook that, while on, holds every every-th
// forget script pipeline (bkIsForget) for delay before sending it: a
// stall of exactly a Forget's deletes, after its reads (a Redis pause
// lands anywhere in the call, most often in its reads, and its LogBy
// counts from the end of its archive read).
func bkSlowForget(delay time.Duration, every int64, on *atomic.Bool) *holdHook {
	var n atomic.Int64
	return &holdHook{delay: delay, take: func(cmds []goredis.Cmder) bool {
		return on.Load() && bkIsForget(cmds[0]) && n.Add(1)%max(every, 1) == 0
	}}
}

func bkIsForget(c goredis.Cmder) bool {
	args := c.Args()
	if c.Name() != "evalsha" || len(args) < 4 {
		return false
	}
	nk, err := strconv.Atoi(fmt.Sprint(args[2]))
	if err != nil || len(args) < 5+nk {
		return false
	}
	return fmt.Sprint(args[3+nk]) == "2" && fmt.Sprint(args[4+nk]) == "4"
}

// TestBreakItLateForgetCopy: a Forget's script call, retried by go-redis
// after a lost reply, whose first copy arrives late: after a commit made
// since (acknowledged) has left Redis for the archive. The copy finds the
// key absent; before its LogBy it would append a removal, which hid the
// acknowledged commit at once (removals hash) and deleted it from the
// archive once drained, so the key answered New inside the archive
// window. Past its LogBy it writes nothing: the key stays Duplicate.
func TestBreakItLateForgetCopy(t *testing.T) {
	srv := redistest.Start(t)
	plain := srv.Client(t)
	ctx := context.Background()
	prefix := fmt.Sprintf("bklf-%d:", time.Now().UnixNano())
	arch := redisArchive(t)
	h := &bkLateForget{}
	hc := srv.Client(t)
	hc.AddHook(h)
	a := ra2Open(t, redisArchiveOptions(hc, prefix, arch))
	b := ra2Open(t, redisArchiveOptions(plain, prefix, arch))
	keys := keysOf("bklf", 20)
	gMarkNew(t, a, keys) // C0
	h.armed.Store(true)
	info := make([]engine.KeyInfo, len(keys))
	if err := a.ForgetBatch(ctx, keys, info); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	copies := h.copies
	h.mu.Unlock()
	if len(copies) == 0 {
		t.Fatal("the hook kept no copy of the forget script call")
	}
	gMarkNew(t, b, keys) // C1: acknowledged after the Forget
	acked := time.Now()
	waitFromArchive(t, b, keys, 25*time.Second)
	// The late copy of the Forget's script arrives now.
	flbAllLate(t, flbSend(t, copies, func(args []any) (any, error) { return plain.Do(ctx, args...).Result() }), "after the commit left Redis")
	bkStaysDuplicate(t, b, keys, acked, "archive window 1m")
	out := make([]engine.Outcome, len(keys))
	if err := b.MarkBatch(ctx, keys, nil, out); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, o := range out {
		if o == engine.New {
			n++
		}
	}
	if n > 0 {
		t.Errorf("%d of %d acknowledged keys marked New a second time inside the archive window", n, len(keys))
	}
}

// bkStaysDuplicate looks keys up on e for 3 s and fails for any key not
// Duplicate: each was acknowledged New at acked, after the Forget whose
// late copy was delivered. what names the case in the failures. Lookups
// refused while the archive catches up (ErrUnavailable) are tried again
// until 10 s have passed; at least one must answer, or nothing was checked.
func bkStaysDuplicate(t *testing.T, e interface {
	LookupBatch(context.Context, [][]byte, []engine.KeyInfo) error
}, keys [][]byte, acked time.Time, what string) {
	t.Helper()
	ctx := context.Background()
	info := make([]engine.KeyInfo, len(keys))
	bad, answered := 0, 0
	var last error
	start := time.Now()
	for deadline := start.Add(3 * time.Second); time.Now().Before(deadline) || answered == 0 && time.Since(start) < 10*time.Second; time.Sleep(300 * time.Millisecond) {
		err := e.LookupBatch(ctx, keys, info)
		if err != nil {
			if !bkTyped(err) {
				t.Fatalf("untyped: %v", err)
			}
			last = err
			continue
		}
		answered++
		for i := range info {
			if info[i].Outcome != engine.Duplicate {
				bad++
				if bad <= 3 {
					t.Errorf("%s: key %s acknowledged New %v ago, after a late copy of an earlier Forget's script: %v from %v, want Duplicate", what, keys[i], time.Since(acked).Round(time.Millisecond), info[i].Outcome, info[i].Source)
				}
			}
		}
	}
	if answered == 0 {
		t.Errorf("%s: no lookup answered in %v (last: %v): nothing checked", what, time.Since(start).Round(time.Millisecond), last)
	}
}
