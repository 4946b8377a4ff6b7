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

// More attacks on the log's removals hash: namespaces with archive
// windows of their own, many removals (more than a trim reads), Redis
// paused at the removals read (FailOpen with an archive is refused at
// Open), Claim/Commit/Do with MaxAttempts, other Options on the same
// prefix.

type ra2Lookuper interface {
	LookupBatch(context.Context, [][]byte, []engine.KeyInfo) error
}

type ra2Marker interface {
	MarkBatch(context.Context, [][]byte, []engine.Digest, []engine.Outcome) error
}

// ra2WaitAcked is raLookupAcked for any lookuper (a namespace).
func ra2WaitAcked(t *testing.T, what string, l ra2Lookuper, keys [][]byte, acked time.Time, within time.Duration) bool {
	t.Helper()
	info := make([]engine.KeyInfo, len(keys))
	deadline := time.Now().Add(within)
	var lastErr error
	for {
		err := l.LookupBatch(context.Background(), keys, info)
		if err != nil && !errors.Is(err, engine.ErrUnavailable) {
			t.Fatalf("%s: LookupBatch: %v (not ErrUnavailable)", what, err)
		}
		lastErr = err
		done := err == nil
		bad := 0
		if err == nil {
			for i := range info {
				if info[i].Outcome != engine.Duplicate {
					if bad < 3 {
						t.Errorf("PROMISE 2 BROKEN: %s: key %s acknowledged New %v ago looked up as %v (source %v)", what, keys[i], time.Since(acked).Round(time.Millisecond), info[i].Outcome, info[i].Source)
					}
					bad++
				}
				done = done && info[i].Source == engine.SourceArchive
			}
		}
		if bad > 0 {
			t.Errorf("%s: %d of %d acknowledged keys not Duplicate", what, bad, len(keys))
			return true
		}
		if done {
			t.Logf("%s: every acknowledged key Duplicate from the archive %v after its acknowledgement", what, time.Since(acked).Round(time.Millisecond))
			return false
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: keys not answered from the archive within %v (last error %v)", what, within, lastErr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ra2AllNewL is raAllNew for any lookuper.
func ra2AllNewL(t *testing.T, what string, l ra2Lookuper, keys [][]byte) {
	t.Helper()
	info := make([]engine.KeyInfo, len(keys))
	var err error
	for try := 0; try < 30; try++ {
		if err = l.LookupBatch(context.Background(), keys, info); err == nil || !errors.Is(err, engine.ErrUnavailable) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("%s: LookupBatch: %v", what, err)
	}
	bad := 0
	for i := range info {
		if info[i].Outcome != engine.New {
			if bad < 3 {
				t.Errorf("PROMISE 1 BROKEN: %s: never-acknowledged key %s looked up as %v from %v", what, keys[i], info[i].Outcome, info[i].Source)
			}
			bad++
		}
	}
	if bad > 0 {
		t.Errorf("%s: %d of %d never-acknowledged keys not New", what, bad, len(keys))
	}
}

// ra2Mark marks keys on m, retrying ErrUnavailable, and checks every
// outcome is want.
func ra2Mark(t *testing.T, what string, m ra2Marker, keys [][]byte, want engine.Outcome) {
	t.Helper()
	out := make([]engine.Outcome, len(keys))
	for try := 0; ; try++ {
		err := m.MarkBatch(context.Background(), keys, nil, out)
		if err == nil {
			break
		}
		if !errors.Is(err, engine.ErrUnavailable) || try > 30 {
			t.Fatalf("%s: MarkBatch: %v", what, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	bad := 0
	for i, o := range out {
		if o != want {
			if bad < 3 {
				p := "2"
				if want == engine.New {
					p = "1"
				}
				t.Errorf("PROMISE %s BROKEN: %s: mark of %s = %v, want %v", p, what, keys[i], o, want)
			}
			bad++
		}
	}
	if bad > 0 {
		t.Errorf("%s: %d of %d marks not %v", what, bad, len(keys), want)
	}
}

// ra2NewOrUnavail: every key New, or the call ErrUnavailable (logged).
func ra2NewOrUnavail(t *testing.T, what string, l ra2Lookuper, keys [][]byte) {
	t.Helper()
	info := make([]engine.KeyInfo, len(keys))
	if err := l.LookupBatch(context.Background(), keys, info); err != nil {
		if !errors.Is(err, engine.ErrUnavailable) {
			t.Fatalf("PROMISE 3: %s: LookupBatch: %v (not ErrUnavailable)", what, err)
		}
		t.Logf("%s: LookupBatch: %v", what, err)
		return
	}
	for i := range info {
		if info[i].Outcome != engine.New {
			t.Fatalf("PROMISE 1 BROKEN: %s: never-acknowledged key %s looked up as %v from %v", what, keys[i], info[i].Outcome, info[i].Source)
		}
	}
}

func ra2HLen(t *testing.T, c *goredis.Client, prefix string) int64 {
	t.Helper()
	n, err := c.HLen(context.Background(), prefix+"\x00\xffremoving").Result()
	if err != nil {
		t.Fatalf("HLEN: %v", err)
	}
	return n
}

// TestRemovalsAttack2NamespacesSameKey: the same 400 keys in two named
// namespaces with archive windows of their own. In "gb" engine a's
// MarkBatch loses its mark and settling replies and gives the keys back
// (the caller told it failed); right after, in "ack", engine b marks the
// same keys New (acknowledged). The drain's trims fail until the lookups
// are done, so gb's removals stay in the hash. Once Redis's window
// passed: ack's keys Duplicate from the archive (gb's removals must not
// hide them: another namespace), gb's keys New, and gb's redelivery New.
// Run with NoSharedCache true and false.
func TestRemovalsAttack2NamespacesSameKey(t *testing.T) {
	for _, nsc := range []bool{true, false} {
		t.Run(fmt.Sprint("NoSharedCache=", nsc), func(t *testing.T) { ra2NamespacesSameKey(t, nsc) })
	}
}

func ra2NamespacesSameKey(t *testing.T, noSharedCache bool) {
	srv := redistest.Start(t)
	plain := srv.Client(t)
	ctx := context.Background()
	prefix := fmt.Sprintf("ra2ns-%v-%d:", noSharedCache, time.Now().UnixNano())
	ha, hb, h, settle, tf := trimFailingClients(t, srv, prefix)
	arch := redisArchive(t)
	nsOpts := map[string]engine.NamespaceOptions{
		"gb":  {ArchiveWindow: 30 * time.Second},
		"ack": {ArchiveWindow: 45 * time.Second},
	}
	oa := redisArchiveOptions(ha, prefix, arch)
	oa.Logger, oa.NoSharedCache, oa.Namespaces = quiet, noSharedCache, nsOpts
	a := open(t, oa)
	defer a.Close()
	ob := redisArchiveOptions(hb, prefix, arch)
	ob.Logger, ob.NoSharedCache, ob.Namespaces = quiet, noSharedCache, nsOpts
	b := open(t, ob)
	defer b.Close()
	gbA, _ := a.Namespace("gb")
	gbB, _ := b.Namespace("gb")
	ackB, _ := b.Namespace("ack")
	ackA, _ := a.Namespace("ack")

	keys := keysOf("ra2ns", 600)
	out := make([]engine.Outcome, len(keys))
	tf.armed.Store(true)
	defer tf.armed.Store(false)
	h.arm("evalsha", 0, -1)
	settle.arm("evalsha", 1, 0)
	err := gbA.MarkBatch(ctx, keys, nil, out)
	if h.hits.Load() != 1 || settle.hits.Load() != 1 || !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("MarkBatch in gb with the mark and settling replies lost: %v (fault hits %d, %d)", err, h.hits.Load(), settle.hits.Load())
	}
	if n := ra2HLen(t, plain, prefix); n != int64(len(keys)) {
		t.Fatalf("removals in the hash after gb's give-back: %d, want %d", n, len(keys))
	}
	if err := ackB.MarkBatch(ctx, keys, nil, out); err != nil {
		t.Fatalf("ack's mark: %v", err)
	}
	acked := time.Now()
	for i, o := range out {
		if o != engine.New {
			t.Fatalf("ack's mark of %s = %v, want New (never marked in ack)", keys[i], o)
		}
	}
	ra2AllNewL(t, "gb right after the give-back (b)", gbB, keys)
	ra2AllNewL(t, "gb right after the give-back (a)", gbA, keys)
	tail := raLogTail(t, plain, prefix)
	for deadline := time.Now().Add(15 * time.Second); tf.failedUpTo().less(tail); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no trim up to ack's entry %v within 15 s (fails %d)", tail, tf.fails.Load())
		}
	}
	t.Logf("%d trims failed; the hash holds %d removals", tf.fails.Load(), ra2HLen(t, plain, prefix))
	if ra2WaitAcked(t, "ack on b", ackB, keys, acked, 30*time.Second) {
		raDiagnose(t, plain, prefix, ackB, keys)
	}
	ra2WaitAcked(t, "ack on a", ackA, keys, acked, 5*time.Second)
	ra2AllNewL(t, "gb after Redis's window, removals pending in the hash (b)", gbB, keys)
	ra2AllNewL(t, "gb after Redis's window, removals pending in the hash (a)", gbA, keys)
	// The default namespace never saw the keys.
	ra2AllNewL(t, "default namespace", b, keys)
	tf.armed.Store(false)
	// gb's redelivery, processed: New, then both namespaces Duplicate.
	ra2Mark(t, "gb's redelivery", gbB, keys, engine.New)
	ra2Mark(t, "ack re-mark", ackA, keys, engine.Duplicate)
	ra2Mark(t, "gb re-mark", gbA, keys, engine.Duplicate)
}

// TestRemovalsAttack2ManyRemovals: 2600 keys (more than a trim reads of
// the hash) are marked (acknowledged), forgotten (2600 removals in the
// hash) and marked New again by another engine (acknowledged) while the
// trims fail; then the trims go through. Once Redis's window passed the
// keys must be Duplicate from the archive, though the hash may still hold
// removals a trim did not reach. Then a second Forget replaces the
// fields with later removals: the keys are New, and stay New after
// Redis's window (the archive applied the removals). Finally a third
// mark is New and acknowledged; Duplicate from the archive.
func TestRemovalsAttack2ManyRemovals(t *testing.T) {
	srv := redistest.Start(t)
	plain := srv.Client(t)
	ctx := context.Background()
	prefix := fmt.Sprintf("ra2many-%d:", time.Now().UnixNano())
	tf := &raTrimFail{prefix: prefix}
	ha := srv.ClientWith(t, nil)
	ha.AddHook(tf)
	hb := srv.ClientWith(t, nil)
	hb.AddHook(tf)
	arch := redisArchive(t)
	oa := redisArchiveOptions(ha, prefix, arch)
	oa.Logger, oa.ExpectedKeys = quiet, 20000
	a := open(t, oa)
	defer a.Close()
	ob := redisArchiveOptions(hb, prefix, arch)
	ob.Logger, ob.ExpectedKeys = quiet, 20000
	b := open(t, ob)
	defer b.Close()

	keys := keysOf("ra2many", 2600)
	ra2Mark(t, "first mark", a, keys, engine.New)
	tf.armed.Store(true)
	defer tf.armed.Store(false)
	info := make([]engine.KeyInfo, len(keys))
	fctx, cancel := context.WithTimeout(ctx, 25*time.Second)
	err := a.ForgetBatch(fctx, keys, info)
	cancel()
	if err != nil {
		t.Fatalf("ForgetBatch: %v", err)
	}
	for i := range info {
		if info[i].Outcome != engine.Duplicate {
			t.Fatalf("ForgetBatch found %s %v, want the acknowledged commit", keys[i], info[i].Outcome)
		}
	}
	if n := ra2HLen(t, plain, prefix); n != int64(len(keys)) {
		t.Fatalf("removals in the hash after the Forget: %d, want %d", n, len(keys))
	}
	ra2AllNewL(t, "after the Forget", b, keys)
	ra2Mark(t, "re-mark after the Forget", b, keys, engine.New)
	acked := time.Now()
	tail := raLogTail(t, plain, prefix)
	for deadline := time.Now().Add(15 * time.Second); tf.failedUpTo().less(tail); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no trim up to the re-mark's entry %v within 15 s (fails %d)", tail, tf.fails.Load())
		}
	}
	tf.armed.Store(false)
	t.Logf("%d trims failed; hash %d fields", tf.fails.Load(), ra2HLen(t, plain, prefix))
	// The drain's next pass trims up to what it applied, and that one
	// trim reads every field of a hash this size (up to trimRemovals).
	for deadline := time.Now().Add(5 * time.Second); ra2HLen(t, plain, prefix) != 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("removals left in the hash 5 s after the trims went through: %d of %d", ra2HLen(t, plain, prefix), len(keys))
		}
	}
	if ra2WaitAcked(t, "re-marked keys", b, keys, acked, 30*time.Second) {
		raDiagnose(t, plain, prefix, b, keys)
	}
	ra2Mark(t, "third mark of acknowledged keys on a", a, keys, engine.Duplicate)
	t.Logf("removals left in the hash now: %d", ra2HLen(t, plain, prefix))
	// Second Forget: replaces the (possibly stale) fields with later IDs.
	fctx, cancel = context.WithTimeout(ctx, 25*time.Second)
	err = b.ForgetBatch(fctx, keys, info)
	cancel()
	if err != nil {
		t.Fatalf("second ForgetBatch: %v", err)
	}
	for i := range info {
		if info[i].Outcome != engine.Duplicate {
			t.Fatalf("PROMISE 4: second ForgetBatch found %s %v (source %v), want the acknowledged commit", keys[i], info[i].Outcome, info[i].Source)
		}
	}
	ra2AllNewL(t, "after the second Forget (a)", a, keys)
	ra2AllNewL(t, "after the second Forget (b)", b, keys)
	time.Sleep(7 * time.Second) // Redis's window passes
	ra2AllNewL(t, "second Forget, after Redis's window (a)", a, keys)
	ra2Mark(t, "mark after the second Forget", a, keys, engine.New)
	acked = time.Now()
	if ra2WaitAcked(t, "marked after the second Forget", b, keys, acked, 30*time.Second) {
		raDiagnose(t, plain, prefix, b, keys)
	}
	t.Logf("removals left in the hash at the end: %d", ra2HLen(t, plain, prefix))
}

// TestRemovalsAttack2FailOpenPausedRemovals: a's MarkBatch gives 600 keys
// back (replies lost), held until the drain sealed their partition; the
// drain stops before the removals. A FailOpen engine f then marks them
// while Redis is paused just before the removals are read: it may answer
// New (fail open) or fail, never Duplicate (the keys were never
// acknowledged). The same for ClaimBatch. Engines with other Options on
// the prefix (NoSharedCache false, another ArchiveWindow, MaxAttempts)
// are refused or answer New too. Finally the drain goes on: New.
func TestRemovalsAttack2FailOpenPausedRemovals(t *testing.T) {
	srv := redistest.Start(t)
	plain := srv.Client(t)
	ctx := context.Background()
	hc, h, settle, gb := losingClient(t, srv)
	prefix := fmt.Sprintf("ra2fo-%d:", time.Now().UnixNano())
	arch := redisArchive(t)
	o := redisArchiveOptions(plain, prefix, arch)
	o.Logger = quiet
	b := open(t, o)
	defer b.Close()
	o.Backend = redisBackend(hc, prefix)
	a := open(t, o)
	defer a.Close()
	fc := srv.ClientWith(t, &goredis.Options{MaxRetries: -1, ReadTimeout: 500 * time.Millisecond, WriteTimeout: 500 * time.Millisecond})
	of := redisArchiveOptions(fc, prefix, arch)
	of.Logger, of.FailOpen = quiet, true
	if e, err := engine.Open(&of); err == nil {
		e.Close()
		t.Errorf("FailOpen with an Archive behind Redis accepted")
	} else if !errors.Is(err, engine.ErrOptions) {
		t.Errorf("PROMISE 3: FailOpen with an Archive: %v, want ErrOptions", err)
	} else {
		t.Logf("FailOpen with an Archive refused: %v", err)
	}
	// f: the same calls fail closed (FailOpen refused with an archive).
	of.FailOpen = false
	f := open(t, of)
	defer f.Close()

	stop := make(chan struct{})
	var stopped atomic.Bool
	goOn := sync.OnceFunc(func() { enginetest.SetInArchive(nil); close(stop) })
	defer goOn()
	var start time.Time
	gb.before = func() {
		waitSealed(t, start, a, b)
		stopDrain(stop, &stopped)
	}
	keys := keysOf("ra2fo", 600)
	out := make([]engine.Outcome, len(keys))
	h.arm("evalsha", 0, -1)
	settle.arm("evalsha", 1, 0)
	gb.skip.Store(1)
	gb.armed.Store(true)
	start = time.Now()
	err := a.MarkBatch(ctx, keys, nil, out)
	if h.hits.Load() != 1 || settle.hits.Load() != 1 || gb.armed.Load() || !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("MarkBatch with replies lost: %v (fault hits %d, %d; held %v)", err, h.hits.Load(), settle.hits.Load(), !gb.armed.Load())
	}
	if t.Failed() {
		return
	}
	for deadline := time.Now().Add(10 * time.Second); !stopped.Load(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the drain did not reach the removals within 10 s")
		}
	}
	if dup := raDiagnose(t, plain, prefix, b, keys); dup <= 0 {
		t.Logf("the archive does not hold the undone commits (%d): the attack may not reach the check", dup)
	}
	// hook swaps: keep stopping the drain at put, and pause Redis at the
	// removals read.
	var paused atomic.Int32
	pauseAt := func(on bool) {
		enginetest.SetInArchive(func(stage string) {
			switch stage {
			case "put":
				<-stop
			case "removals":
				if on && paused.CompareAndSwap(0, 1) {
					srv.Pause()
					go func() { time.Sleep(1200 * time.Millisecond); srv.Resume(); paused.Store(2) }()
				}
			}
		})
	}
	waitResumed := func() {
		for deadline := time.Now().Add(10 * time.Second); paused.Load() == 1; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("Redis not resumed")
			}
		}
		paused.Store(0)
	}
	others, markKeys := keys[:300], keys[300:]
	for _, call := range []string{"mark", "claim", "do"} {
		pauseAt(true)
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		var err error
		dups := 0
		switch call {
		case "mark":
			mo := make([]engine.Outcome, len(markKeys))
			err = f.MarkBatch(cctx, markKeys, nil, mo)
			if err == nil {
				for i := range mo {
					if mo[i] != engine.New {
						dups++
						if dups < 3 {
							t.Errorf("PROMISE 1 BROKEN: FailOpen mark of given-back %s with Redis paused at the removals read = %v", markKeys[i], mo[i])
						}
					}
				}
			}
		case "claim":
			claims := make([]engine.Claim, len(others))
			err = f.ClaimBatch(cctx, others, nil, claims)
			if err == nil {
				for i := range claims {
					if claims[i].Outcome != engine.New {
						dups++
						if dups < 3 {
							t.Errorf("PROMISE 1 BROKEN: FailOpen claim of given-back %s with Redis paused at the removals read = %v", others[i], claims[i].Outcome)
						}
					}
				}
				waitResumed()
				errs := make([]error, len(claims))
				if rerr := f.ReleaseBatch(ctx, claims, errs); rerr != nil {
					t.Logf("ReleaseBatch after the FailOpen claim: %v", rerr)
				}
			}
		case "do":
			ran := false
			var o engine.Outcome
			o, err = f.Do(cctx, others[0], func(context.Context) error { ran = true; return errors.New("handler fails: nothing committed") })
			t.Logf("FailOpen Do: %v %v (ran %v)", o, err, ran)
			if o == engine.Duplicate {
				dups++
				t.Errorf("PROMISE 1 BROKEN: FailOpen Do of given-back %s = Duplicate", others[0])
			}
		}
		cancel()
		reached := paused.Load() != 0
		waitResumed()
		pauseAt(false)
		t.Logf("FailOpen %s with Redis paused at the removals read (reached %v): err %v, %d not New", call, reached, err, dups)
		if err != nil && !errors.Is(err, engine.ErrUnavailable) && call != "do" {
			t.Errorf("PROMISE 3: FailOpen %s: %v, want ErrUnavailable or answers", call, err)
		}
		if call == "mark" && err == nil {
			// f answered New: its caller processes markKeys (acknowledged by f).
			t.Logf("FailOpen mark answered New while paused; fail-open stats %d", f.Stats().Calls.FailOpen)
			mi := make([]engine.KeyInfo, len(markKeys))
			if lerr := b.LookupBatch(ctx, markKeys, mi); lerr == nil {
				t.Logf("after f's fail-open mark, b looks %s up as %v from %v", markKeys[0], mi[0].Outcome, mi[0].Source)
			}
		}
	}
	ra2NewOrUnavail(t, "after the paused calls (b)", b, keys)
	// Other Options on the prefix.
	for _, v := range []struct {
		name string
		mod  func(*engine.Options)
	}{
		{"NoSharedCache=false", func(o *engine.Options) { o.NoSharedCache = false }},
		{"ArchiveWindow=30s", func(o *engine.Options) { o.ArchiveWindow = 30 * time.Second }},
		{"MaxAttempts=2", func(o *engine.Options) { o.MaxAttempts = 2 }},
		{"Window=8s", func(o *engine.Options) { o.Window = 8 * time.Second }},
	} {
		ov := redisArchiveOptions(plain, prefix, arch)
		ov.Logger = quiet
		v.mod(&ov)
		e, err := engine.Open(&ov)
		if err != nil {
			typed := errors.Is(err, engine.ErrOptions) || errors.Is(err, engine.ErrLayout) || errors.Is(err, engine.ErrUnavailable)
			t.Logf("Open with %s on the prefix: %v (typed %v)", v.name, err, typed)
			if !typed {
				t.Errorf("PROMISE 3: Open with %s: untyped error %v", v.name, err)
			}
			continue
		}
		t.Logf("Open with %s on the prefix: accepted", v.name)
		ra2NewOrUnavail(t, "engine with "+v.name, e, keys)
		e.Close()
	}
	goOn()
	for deadline := time.Now().Add(15 * time.Second); ra2HLen(t, plain, prefix) != 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the drain did not trim the removals within 15 s")
		}
	}
	ra2AllNewL(t, "drain went on (b)", b, keys)
	ra2AllNewL(t, "drain went on (f)", f, keys)
	ra2Mark(t, "redelivery after the drain went on", f, keys, engine.New)
}

// TestRemovalsAttack2CommitGiveBackMaxAttempts: MaxAttempts 3.
// Part 1: engine a claims 600 keys New and its CommitBatch loses the
// commit's replies: ErrUnavailable, no give-back (a commit that may have
// landed is never given back: documented); the keys are Duplicate and
// stay so from the archive. Part 2: a's MarkBatch of 600 other keys loses
// its mark and settling replies and gives them back; the trims fail.
// Engine b redelivers: 10 keys through Do (the handler must run: New) and
// the rest through ClaimBatch + CommitBatch (New, not Duplicate nor
// Poison). Once Redis's window passed they are Duplicate from the
// archive, and Do does not run the handler again.
func TestRemovalsAttack2CommitGiveBackMaxAttempts(t *testing.T) {
	srv := redistest.Start(t)
	plain := srv.Client(t)
	ctx := context.Background()
	prefix := fmt.Sprintf("ra2cm-%d:", time.Now().UnixNano())
	ha, hb, h, settle, tf := trimFailingClients(t, srv, prefix)
	arch := redisArchive(t)
	oa := redisArchiveOptions(ha, prefix, arch)
	oa.Logger, oa.MaxAttempts = quiet, 3
	a := open(t, oa)
	defer a.Close()
	ob := redisArchiveOptions(hb, prefix, arch)
	ob.Logger, ob.MaxAttempts = quiet, 3
	b := open(t, ob)
	defer b.Close()

	// Part 1: the ambiguous commit.
	amb := keysOf("ra2cm-amb", 600)
	claims := make([]engine.Claim, len(amb))
	if err := a.ClaimBatch(ctx, amb, nil, claims); err != nil {
		t.Fatal(err)
	}
	h.arm("evalsha", 0, -1)
	errs := make([]error, len(claims))
	err := a.CommitBatch(ctx, claims, errs)
	t.Logf("CommitBatch with its replies lost: %v (fault hits %d); removals in the hash: %d", err, h.hits.Load(), ra2HLen(t, plain, prefix))
	if err != nil && !errors.Is(err, engine.ErrUnavailable) {
		t.Errorf("PROMISE 3: CommitBatch: %v, want ErrUnavailable", err)
	}
	ambAt := time.Now()

	// Part 2: the give-back.
	keys := keysOf("ra2cm", 600)
	out := make([]engine.Outcome, len(keys))
	tf.armed.Store(true)
	defer tf.armed.Store(false)
	// With MaxAttempts a mark is a claim then a commit: lose the
	// commit's replies (the second script pipeline); the call gives the
	// commits back (no settling step on this path).
	h.arm("evalsha", 1, -1)
	h.hits.Store(0)
	err = a.MarkBatch(ctx, keys, nil, out)
	settle.armed.Store(false)
	if h.hits.Load() != 1 || !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("MarkBatch with the mark and settling replies lost: %v (fault hits %d, %d)", err, h.hits.Load(), settle.hits.Load())
	}
	t.Logf("MarkBatch (MaxAttempts 3) with its commit pipeline's replies lost: %v (fault hits %d, settling %d); removals in the hash: %d",
		err, h.hits.Load(), settle.hits.Load(), ra2HLen(t, plain, prefix))
	if ra2HLen(t, plain, prefix) == 0 {
		t.Fatalf("no give-back: the attack does not reach the removals (test set-up)")
	}
	ra2AllNewL(t, "after the give-back (b)", b, keys)
	ran := 0
	for _, k := range keys[:10] {
		var o engine.Outcome
		var err error
		for try := 0; try < 20; try++ {
			o, err = b.Do(ctx, k, func(context.Context) error { ran++; return nil })
			if err == nil || !errors.Is(err, engine.ErrUnavailable) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if err != nil || o != engine.New {
			t.Errorf("PROMISE 1 BROKEN: Do of given-back %s = %v, %v, want New", k, o, err)
		}
	}
	if ran != 10 {
		t.Errorf("PROMISE 1 BROKEN: the handler ran %d times for 10 given-back keys", ran)
	}
	rest := keys[10:]
	rc := make([]engine.Claim, len(rest))
	if err := b.ClaimBatch(ctx, rest, nil, rc); err != nil {
		t.Fatalf("redelivery ClaimBatch: %v", err)
	}
	bad := 0
	for i := range rc {
		if rc[i].Outcome != engine.New {
			if bad < 3 {
				t.Errorf("PROMISE 1 BROKEN: redelivery claim of given-back %s = %v", rest[i], rc[i].Outcome)
			}
			bad++
		}
	}
	if bad > 0 {
		t.Fatalf("%d of %d redelivery claims not New", bad, len(rest))
	}
	rerrs := make([]error, len(rc))
	if err := b.CommitBatch(ctx, rc, rerrs); err != nil {
		t.Fatalf("redelivery CommitBatch: %v %v", err, errors.Join(rerrs...))
	}
	acked := time.Now()
	tail := raLogTail(t, plain, prefix)
	for deadline := time.Now().Add(15 * time.Second); tf.failedUpTo().less(tail); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Logf("no failed trim up to the redelivery's entry %v within 15 s (fails %d)", tail, tf.fails.Load())
			break
		}
	}
	t.Logf("%d trims failed; hash %d", tf.fails.Load(), ra2HLen(t, plain, prefix))
	if ra2WaitAcked(t, "redelivered keys", b, keys, acked, 30*time.Second) {
		raDiagnose(t, plain, prefix, b, keys)
	}
	ra2WaitAcked(t, "ambiguous commits (landed)", b, amb, ambAt, 5*time.Second)
	for _, k := range keys[:10] {
		o, err := a.Do(ctx, k, func(context.Context) error { ran++; return nil })
		if err != nil || o != engine.Duplicate {
			t.Errorf("PROMISE 2 BROKEN: Do of acknowledged %s after Redis's window = %v, %v", k, o, err)
		}
	}
	if ran != 10 {
		t.Errorf("PROMISE 2 BROKEN: the handler ran %d times in all, want 10", ran)
	}
	tf.armed.Store(false)
	ac := make([]engine.Claim, len(rest))
	if err := a.ClaimBatch(ctx, rest, nil, ac); err != nil {
		t.Fatalf("claim of acknowledged keys: %v", err)
	}
	for i := range ac {
		if ac[i].Outcome != engine.Duplicate {
			t.Fatalf("PROMISE 2 BROKEN: claim of acknowledged %s = %v", rest[i], ac[i].Outcome)
		}
	}
}
