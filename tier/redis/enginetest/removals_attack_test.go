package enginetest_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier/postgres"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// Attacks on the log's removals hash: an archive hit of a key whose
// removal the hash still holds is answered New when the archive read had
// applied the log only up to a position before that removal; a removal
// the read had applied (its trim failed, or its drainer closed before
// trimming) hides nothing, and the drain's next pass trims it.

// raPos is a stream ID.
type raPos struct{ ms, seq uint64 }

func (p raPos) less(q raPos) bool { return p.ms < q.ms || p.ms == q.ms && p.seq < q.seq }

func raParsePos(s string) (raPos, bool) {
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		return raPos{}, false
	}
	ms, err1 := strconv.ParseUint(a, 10, 64)
	seq, err2 := strconv.ParseUint(b, 10, 64)
	return raPos{ms, seq}, err1 == nil && err2 == nil
}

// raLogTail is the ID of the newest entry of prefix's archive log.
func raLogTail(t *testing.T, c *goredis.Client, prefix string) raPos {
	t.Helper()
	xs, err := c.XRevRangeN(context.Background(), prefix+"\x00\x00", "+", "-", 1).Result()
	if err != nil || len(xs) != 1 {
		t.Fatalf("reading the archive log's tail: %v (%d entries)", err, len(xs))
	}
	p, ok := raParsePos(xs[0].ID)
	if !ok {
		t.Fatalf("log entry ID %q", xs[0].ID)
	}
	return p
}

// trimFailingClients are two clients of srv without go-redis's retries
// whose trims of prefix's archive log fail while tf is armed; ha's hooks
// also lose, once armed, a MarkBatch's mark replies (h) and its settling
// script's (settle).
func trimFailingClients(t *testing.T, srv *redistest.Server, prefix string) (ha, hb *goredis.Client, h, settle *mmpartial, tf *raTrimFail) {
	tf = &raTrimFail{prefix: prefix}
	h, settle = &mmpartial{min: 3}, &mmpartial{min: 3}
	ha = srv.ClientWith(t, &goredis.Options{MaxRetries: -1})
	ha.AddHook(h)
	ha.AddHook(settle)
	ha.AddHook(tf)
	hb = srv.ClientWith(t, &goredis.Options{MaxRetries: -1})
	hb.AddHook(tf)
	return ha, hb, h, settle, tf
}

// raTrimFail is a go-redis hook that, armed, fails every trim script
// call of the log of prefix (the drain's TrimLog) as a dropped connection
// would, before it reaches the server, and records the position each
// failed trim was for.
type raTrimFail struct {
	prefix string
	armed  atomic.Bool
	fails  atomic.Int32
	mu     sync.Mutex
	upTo   raPos // the newest position a failed trim was for
}

var errRaTrim = errors.New("connection reset (trim)")

func (h *raTrimFail) isTrim(c goredis.Cmder) (raPos, bool) {
	args := c.Args()
	if c.Name() != "evalsha" && c.Name() != "eval" || len(args) < 8 {
		return raPos{}, false
	}
	if s, _ := args[4].(string); s != h.prefix+"\x00\xfftrimmed" {
		return raPos{}, false
	}
	ms, _ := strconv.ParseUint(fmt.Sprint(args[6]), 10, 64)
	seq, _ := strconv.ParseUint(fmt.Sprint(args[7]), 10, 64)
	return raPos{ms, seq}, true
}

func (h *raTrimFail) fail(cmds []goredis.Cmder) bool {
	if !h.armed.Load() {
		return false
	}
	hit := false
	for _, c := range cmds {
		if p, ok := h.isTrim(c); ok {
			hit = true
			h.mu.Lock()
			if h.upTo.less(p) {
				h.upTo = p
			}
			h.mu.Unlock()
		}
	}
	if !hit {
		return false
	}
	h.fails.Add(1)
	for _, c := range cmds {
		c.SetErr(errRaTrim)
	}
	return true
}

func (h *raTrimFail) failedUpTo() raPos {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.upTo
}

func (h *raTrimFail) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (h *raTrimFail) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, c goredis.Cmder) error {
		if h.fail([]goredis.Cmder{c}) {
			return errRaTrim
		}
		return next(ctx, c)
	}
}
func (h *raTrimFail) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if h.fail(cmds) {
			return errRaTrim
		}
		return next(ctx, cmds)
	}
}

// raLookupAcked looks keys up on e, every acknowledged New before,
// until each answers Duplicate from the archive (Redis let them go),
// within; a New answer on the way is a broken promise, reported, and
// ends the wait (it returns true).
func raLookupAcked(t *testing.T, e *engine.Engine, keys [][]byte, acked time.Time, within time.Duration) bool {
	t.Helper()
	ctx := context.Background()
	info := make([]engine.KeyInfo, len(keys))
	deadline := time.Now().Add(within)
	var lastErr error
	for {
		err := e.LookupBatch(ctx, keys, info)
		if err != nil && !errors.Is(err, engine.ErrUnavailable) {
			t.Fatalf("LookupBatch: %v (not ErrUnavailable)", err)
		}
		done := err == nil
		bad := 0
		if err == nil {
			for i := range info {
				if info[i].Outcome != engine.Duplicate {
					if bad < 3 {
						t.Errorf("PROMISE 2 BROKEN: key %s, acknowledged New %v ago, looked up as %v (source %v)", keys[i], time.Since(acked).Round(time.Millisecond), info[i].Outcome, info[i].Source)
					}
					bad++
				}
				done = done && info[i].Source == engine.SourceArchive
			}
		}
		lastErr = err
		if bad > 0 {
			t.Errorf("%d of %d acknowledged keys answered other than Duplicate in one lookup", bad, len(keys))
			return true
		}
		if done {
			t.Logf("every acknowledged key Duplicate from the archive %v after its acknowledgement", time.Since(acked).Round(time.Millisecond))
			return false
		}
		if time.Now().After(deadline) {
			t.Fatalf("keys not answered from the archive within %v (last error %v)", within, lastErr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// raRemarkAcked marks keys, every acknowledged New before, on e: each
// must be Duplicate.
func raRemarkAcked(t *testing.T, e *engine.Engine, keys [][]byte) {
	t.Helper()
	ctx := context.Background()
	out := make([]engine.Outcome, len(keys))
	for try := 0; ; try++ {
		err := e.MarkBatch(ctx, keys, nil, out)
		if err == nil {
			break
		}
		if !errors.Is(err, engine.ErrUnavailable) || try > 20 {
			t.Fatalf("MarkBatch of acknowledged keys: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	n := 0
	for i, o := range out {
		if o != engine.Duplicate {
			if n < 3 {
				t.Errorf("PROMISE 2 BROKEN: re-mark of acknowledged key %s = %v, want Duplicate (the message is processed twice)", keys[i], o)
			}
			n++
		}
	}
	if n > 0 {
		t.Errorf("%d of %d acknowledged keys marked New a second time", n, len(keys))
	}
}

// raDiagnose, after an acknowledged key was answered New from the
// archive, moves the log's removals hash aside, looks the keys up again
// (Duplicate from the archive: the archive holds the acknowledged commit
// and only the stale removal hid it) and puts the hash back.
func raDiagnose(t *testing.T, c *goredis.Client, prefix string, e interface {
	LookupBatch(context.Context, [][]byte, []engine.KeyInfo) error
}, keys [][]byte) int {
	t.Helper()
	ctx := context.Background()
	hk := prefix + "\x00\xffremoving"
	n, _ := c.HLen(ctx, hk).Result()
	if err := c.Rename(ctx, hk, hk+"-aside").Err(); err != nil {
		t.Logf("diagnosis: moving the hash aside: %v", err)
		return -1
	}
	info := make([]engine.KeyInfo, len(keys))
	err := e.LookupBatch(ctx, keys, info)
	if rerr := c.Rename(ctx, hk+"-aside", hk).Err(); rerr != nil {
		t.Fatalf("diagnosis: putting the hash back: %v", rerr)
	}
	if err != nil {
		t.Logf("diagnosis: lookup without the hash: %v", err)
		return -1
	}
	dup := 0
	for i := range info {
		if info[i].Outcome == engine.Duplicate && info[i].Source == engine.SourceArchive {
			dup++
		}
	}
	t.Logf("diagnosis: the removals hash held %d fields; without it, %d of %d keys are Duplicate from the archive (e.g. %s: %v from %v, committed %v)",
		n, dup, len(keys), keys[0], info[0].Outcome, info[0].Source, time.Unix(0, info[0].CommittedAt).UTC().Format("15:04:05.000"))
	if hs, err := c.HGetAll(ctx, hk).Result(); err == nil {
		for f, v := range hs {
			t.Logf("diagnosis: a field left in the hash: %q = %s", f, v)
			break
		}
	}
	return dup
}

// TestRemovalsAttackTrimFailsAfterReMark: a key's removal is appended
// (a give-back of a mark whose caller was told it failed, or a Forget),
// and right after (within LogSkew) another engine marks it New,
// acknowledged. The drain applies the removal and the new commit, and
// its trims fail (a dropped connection on that one script call, before
// it reaches Redis), so the removal stays in the removals hash. Once
// Redis's window passes and only the archive holds the acknowledged
// commit, the key must be Duplicate: the archive read had applied the
// log past the removal, so what it answered is the later commit. In
// "giveback" and "forget" the trims fail until after those reads (only
// the applied position protects the key); in "giveback-claimcommit" they
// go through again before (the drain's next pass trims what it applied,
// though no entry followed). In every variant the hash is empty once
// the trims go through.
func TestRemovalsAttackTrimFailsAfterReMark(t *testing.T) {
	for _, how := range []string{"giveback", "forget", "giveback-claimcommit"} {
		t.Run(how, func(t *testing.T) { removalsTrimFailsAfterReMark(t, how, true, how != "giveback-claimcommit") })
	}
	// The same with every trim going through.
	t.Run("giveback-control", func(t *testing.T) { removalsTrimFailsAfterReMark(t, "giveback", false, false) })
}

func removalsTrimFailsAfterReMark(t *testing.T, how string, failTrim, keepFailing bool) {
	srv := redistest.Start(t)
	plain := srv.Client(t)
	ctx := context.Background()
	prefix := fmt.Sprintf("ratrim-%s-%d:", how, time.Now().UnixNano())
	ha, hb, h, settle, tf := trimFailingClients(t, srv, prefix)
	arch := redisArchive(t)
	oa := redisArchiveOptions(ha, prefix, arch)
	oa.Logger = quiet
	a := open(t, oa)
	defer a.Close()
	ob := redisArchiveOptions(hb, prefix, arch)
	ob.Logger = quiet
	b := open(t, ob)
	defer b.Close()

	keys := keysOf("ratrim-"+how, 600)
	out := make([]engine.Outcome, len(keys))
	tf.armed.Store(failTrim)
	defer tf.armed.Store(false)
	reMark := "mark"
	if how == "giveback-claimcommit" {
		how, reMark = "giveback", "claimcommit"
	}
	switch how {
	case "giveback":
		h.arm("evalsha", 0, -1)
		settle.arm("evalsha", 1, 0)
		err := a.MarkBatch(ctx, keys, nil, out)
		if h.hits.Load() != 1 || settle.hits.Load() != 1 || !errors.Is(err, engine.ErrUnavailable) {
			t.Fatalf("MarkBatch with the mark and settling replies lost: %v (fault hits %d, %d)", err, h.hits.Load(), settle.hits.Load())
		}
	case "forget":
		if err := a.MarkBatch(ctx, keys, nil, out); err != nil {
			t.Fatal(err)
		}
		info := make([]engine.KeyInfo, len(keys))
		fctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		err := a.ForgetBatch(fctx, keys, info)
		cancel()
		if err != nil {
			t.Fatalf("ForgetBatch: %v", err)
		}
	}
	removed := time.Now()
	if n, err := plain.HLen(ctx, prefix+"\x00\xffremoving").Result(); err != nil || n != int64(len(keys)) {
		t.Fatalf("removals in the hash after the %s: %d (%v), want %d", how, n, err, len(keys))
	}
	// Another engine marks the keys New: acknowledged.
	if reMark == "mark" {
		if err := b.MarkBatch(ctx, keys, nil, out); err != nil {
			t.Fatalf("re-mark after the %s: %v", how, err)
		}
	} else {
		claims := make([]engine.Claim, len(keys))
		if err := b.ClaimBatch(ctx, keys, nil, claims); err != nil {
			t.Fatalf("re-claim after the %s: %v", how, err)
		}
		for i := range claims {
			out[i] = claims[i].Outcome
		}
		errs := make([]error, len(claims))
		if err := b.CommitBatch(ctx, claims, errs); err != nil {
			t.Fatalf("CommitBatch after the %s: %v %v", how, err, errors.Join(errs...))
		}
	}
	acked := time.Now()
	for i, o := range out {
		if o != engine.New {
			t.Fatalf("re-mark of %s after the %s = %v, want New", keys[i], how, o)
		}
	}
	t.Logf("re-marked New %v after the %s", acked.Sub(removed).Round(time.Millisecond), how)
	tail := raLogTail(t, plain, prefix)
	// Wait until a drain applied the log up to the re-mark's entry and its
	// trim (the one that would delete the removals) failed.
	for deadline := time.Now().Add(15 * time.Second); failTrim && tf.failedUpTo().less(tail); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no trim up to the re-mark's entry %v within 15 s (failed trims %d, newest %v)", tail, tf.fails.Load(), tf.failedUpTo())
		}
	}
	if !keepFailing {
		tf.armed.Store(false) // Redis is fine again: every later trim goes through
	}
	t.Logf("%d trims failed, the last up to %v (the log's tail)", tf.fails.Load(), tf.failedUpTo())
	if raLookupAcked(t, b, keys, acked, 30*time.Second) {
		raDiagnose(t, plain, prefix, b, keys)
	}
	raRemarkAcked(t, b, keys)
	tf.armed.Store(false)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		n, err := plain.HLen(ctx, prefix+"\x00\xffremoving").Result()
		if err == nil && n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("removals left in the hash 10 s after the trims went through again: %d (%v)", n, err)
		}
	}
}

// raApplied reads the log position the PostgreSQL archive applied.
func raApplied(ctx context.Context, arch interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, table string) (raPos, error) {
	rows, err := arch.Query(ctx, `SELECT ms, seq FROM `+table+`_log WHERE id = 1`)
	if err != nil {
		return raPos{}, err
	}
	defer rows.Close()
	var ms, seq int64
	if !rows.Next() {
		return raPos{}, fmt.Errorf("no _log row: %v", rows.Err())
	}
	if err := rows.Scan(&ms, &seq); err != nil {
		return raPos{}, err
	}
	return raPos{uint64(ms), uint64(seq)}, rows.Err()
}

// TestRemovalsAttackCloseBetweenApplyAndTrim: no Redis fault. Engine a
// holds the drain; a's MarkBatch loses its replies and gives its keys
// back (the caller is told it failed), and right after another engine,
// b, marks them New (acknowledged). The drain reads the give-back's
// removals and b's commits in one pass and applies them; a is closed
// (a deploy) between that Apply and its TrimLog, which its cancelled
// context fails. The removals stay in the hash: b takes the drain over,
// finds nothing left to apply, and trims nothing. A new process opens on
// the prefix (a reopened). Once Redis's window passes, are b's
// acknowledged keys Duplicate (from the archive) for b and the reopened
// engine?
func TestRemovalsAttackCloseBetweenApplyAndTrim(t *testing.T) {
	srv := redistest.Start(t)
	plain := srv.Client(t)
	ctx := context.Background()
	prefix := fmt.Sprintf("raclose-%d:", time.Now().UnixNano())
	h, settle := &mmpartial{min: 3}, &mmpartial{min: 3}
	ha := srv.ClientWith(t, &goredis.Options{MaxRetries: -1})
	ha.AddHook(h)
	ha.AddHook(settle)
	arch := redisArchive(t)
	oa := redisArchiveOptions(ha, prefix, arch)
	oa.Logger = quiet
	a := open(t, oa)
	aClosed := false
	defer func() {
		if !aClosed {
			a.Close()
		}
	}()
	for deadline := time.Now().Add(10 * time.Second); !a.Stats().Archive.Drainer; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("engine a did not take the drain lease within 10 s")
		}
	}
	ob := redisArchiveOptions(plain, prefix, arch)
	ob.Logger = quiet
	b := open(t, ob)
	defer b.Close()

	var gate, heldArmed atomic.Bool
	var putBlocked atomic.Int32
	putGo, heldAt, heldGo := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var target raPos
	var targetMu sync.Mutex
	enginetest.SetInArchive(func(stage string) {
		switch stage {
		case "put":
			if gate.Load() {
				putBlocked.Add(1)
				<-putGo
			}
		case "held":
			if !heldArmed.Load() {
				return
			}
			p, err := raApplied(context.Background(), arch.DB, arch.Table)
			targetMu.Lock()
			reached := err == nil && !p.less(target)
			targetMu.Unlock()
			if reached && heldArmed.CompareAndSwap(true, false) {
				close(heldAt)
				<-heldGo
			}
		}
	})
	defer enginetest.SetInArchive(nil)
	releasePut := sync.OnceFunc(func() { gate.Store(false); close(putGo) })
	releaseHeld := sync.OnceFunc(func() { close(heldGo) })
	defer releasePut()
	defer releaseHeld()

	// Stop the drain at "put" on a pass that read only entries before
	// the give-back, so its removals and b's commits come in one read.
	gate.Store(true)
	out := make([]engine.Outcome, 10)
	if err := b.MarkBatch(ctx, keysOf("raclose-first", 10), nil, out); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); putBlocked.Load() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the drain did not reach the first entry within 10 s")
		}
	}
	keys := keysOf("raclose", 600)
	out = make([]engine.Outcome, len(keys))
	h.arm("evalsha", 0, -1)
	settle.arm("evalsha", 1, 0)
	err := a.MarkBatch(ctx, keys, nil, out)
	if h.hits.Load() != 1 || settle.hits.Load() != 1 || !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("MarkBatch with the mark and settling replies lost: %v (fault hits %d, %d)", err, h.hits.Load(), settle.hits.Load())
	}
	removed := time.Now()
	if err := b.MarkBatch(ctx, keys, nil, out); err != nil {
		t.Fatal(err)
	}
	acked := time.Now()
	for i, o := range out {
		if o != engine.New {
			t.Fatalf("b's mark of given-back key %s = %v, want New", keys[i], o)
		}
	}
	t.Logf("b marked the given-back keys New %v after the give-back", acked.Sub(removed).Round(time.Millisecond))
	targetMu.Lock()
	target = raLogTail(t, plain, prefix)
	targetMu.Unlock()
	heldArmed.Store(true)
	releasePut()
	select {
	case <-heldAt:
	case <-time.After(15 * time.Second):
		t.Fatal("the drain did not apply up to b's commits within 15 s")
	}
	// The drain reads the 600 removals (one position each) in batches,
	// trimming after each: the removals read with b's commits are left.
	if n, err := plain.HLen(ctx, prefix+"\x00\xffremoving").Result(); err != nil || n == 0 {
		t.Fatalf("removals in the hash once the drain applied b's commits, before its trim: %d (%v), want some", n, err)
	} else {
		t.Logf("removals in the hash once the drain applied b's commits, before its trim: %d of %d", n, len(keys))
	}
	t.Logf("drain applied the log up to %v (b's commits); a is the drainer: %v, b: %v", target, a.Stats().Archive.Drainer, b.Stats().Archive.Drainer)
	closed := make(chan error, 1)
	go func() { closed <- a.Close() }()
	time.Sleep(300 * time.Millisecond) // Close has cancelled the loop's context
	releaseHeld()
	select {
	case err := <-closed:
		aClosed = true
		t.Logf("a closed: %v", err)
	case <-time.After(15 * time.Second):
		t.Fatal("a's Close did not return within 15 s")
	}
	enginetest.SetInArchive(nil)
	n, err := plain.HLen(ctx, prefix+"\x00\xffremoving").Result()
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Skip("a's trim went through despite the Close: inconclusive")
	}
	t.Logf("removals left in the hash after a closed: %d", n)
	oa2 := redisArchiveOptions(plain, prefix, arch)
	oa2.Logger = quiet
	a2 := open(t, oa2)
	defer a2.Close()
	if raLookupAcked(t, b, keys, acked, 30*time.Second) {
		raDiagnose(t, plain, prefix, b, keys)
	}
	if raLookupAcked(t, a2, keys, acked, 10*time.Second) {
		t.Logf("the reopened engine answers the same")
	}
	raRemarkAcked(t, a2, keys)
}

// raAllNew looks keys up on n: every one must be New (never
// acknowledged), or the call ErrUnavailable (reported, allowed: true
// when it answered).
func raAllNew(t *testing.T, what string, n *engine.Namespace, keys [][]byte) bool {
	t.Helper()
	info := make([]engine.KeyInfo, len(keys))
	err := n.LookupBatch(context.Background(), keys, info)
	if err != nil {
		if !errors.Is(err, engine.ErrUnavailable) {
			t.Fatalf("%s: LookupBatch: %v (not ErrUnavailable)", what, err)
		}
		t.Logf("%s: LookupBatch: %v", what, err)
		return false
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
	return true
}

// raFaultDB is the archive's pool with faults: failApplied fails the
// archive read that also reads the applied position (LookupApplied),
// failLookup the plain archive read (the read again after a trim).
type raFaultDB struct {
	postgres.ArchiveDB
	failApplied, failLookup atomic.Bool
	hits                    atomic.Int32
}

var errRaPG = errors.New("pg: connection reset (test)")

func (d *raFaultDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	applied := strings.Contains(sql, "UNION ALL")
	plain := !applied && strings.HasPrefix(strings.TrimSpace(sql), "SELECT q.i")
	if applied && d.failApplied.Load() || plain && d.failLookup.Load() {
		d.hits.Add(1)
		return nil, errRaPG
	}
	return d.ArchiveDB.Query(ctx, sql, args...)
}

// TestRemovalsAttackFaultsInFind: the new step of an archive read (the
// read of the log's removals in Redis, and the archive read again when
// the log was trimmed past what the first read had applied) under
// faults, for keys engine a acknowledged that only the archive holds
// now: Redis paused just before the removals are read (Lookup and
// MarkBatch with a deadline), the removals read's reply lost or never
// sent, the archive's applied-position read failing, and the read again
// failing (forced by a drain that trims past it in between). Each call
// must fail with ErrUnavailable (no panic, no answer), and afterwards
// the keys are Duplicate, and the mid-read case without a fault answers
// Duplicate too.
func TestRemovalsAttackFaultsInFind(t *testing.T) {
	srv := redistest.Start(t)
	plain := srv.Client(t)
	ctx := context.Background()
	prefix := fmt.Sprintf("rafind-%d:", time.Now().UnixNano())
	rm := &mmpartial{}
	hb := srv.ClientWith(t, &goredis.Options{MaxRetries: -1})
	hb.AddHook(rm)
	arch := redisArchive(t)
	oa := redisArchiveOptions(plain, prefix, arch)
	oa.Logger = quiet
	a := open(t, oa)
	defer a.Close()
	fdb := &raFaultDB{ArchiveDB: arch.DB}
	ob := redisArchiveOptions(hb, prefix, postgres.Archive{DB: fdb, Table: arch.Table})
	ob.Logger = quiet
	b := open(t, ob)
	defer b.Close()
	defer enginetest.SetInArchive(nil)

	keys := keysOf("rafind", 300)
	out := make([]engine.Outcome, len(keys))
	if err := a.MarkBatch(ctx, keys, nil, out); err != nil {
		t.Fatal(err)
	}
	waitFromArchive(t, b, keys, 20*time.Second)
	info := make([]engine.KeyInfo, len(keys))
	allDup := func(what string) {
		t.Helper()
		var err error
		for try := 0; try < 50; try++ {
			if err = b.LookupBatch(ctx, keys, info); err == nil || !errors.Is(err, engine.ErrUnavailable) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("%s: LookupBatch: %v", what, err)
		}
		for i := range info {
			if info[i].Outcome != engine.Duplicate {
				t.Fatalf("PROMISE 2 BROKEN: %s: acknowledged key %s = %v from %v", what, keys[i], info[i].Outcome, info[i].Source)
			}
		}
	}
	mustUnavailable := func(what string, err error, took time.Duration) {
		t.Helper()
		if !errors.Is(err, engine.ErrUnavailable) {
			t.Errorf("PROMISE 3 BROKEN: %s: %v (after %v), want ErrUnavailable", what, err, took.Round(time.Millisecond))
			return
		}
		t.Logf("%s: %v (after %v)", what, err, took.Round(time.Millisecond))
	}

	// reach makes call until the fault it arms fires. A call may answer
	// ErrUnavailable before it reaches the faulted read: b's drain or
	// seal may lag after Redis was paused, and sealedFor then refuses
	// first. That answer is honest but tests nothing here, so the call is
	// made again (the fault stays armed) for up to 10 s.
	reach := func(what string, fired func() bool, call func() error) (error, time.Duration) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			began := time.Now()
			err := call()
			took := time.Since(began)
			if fired() {
				return err, took
			}
			if !errors.Is(err, engine.ErrUnavailable) || time.Now().After(deadline) {
				t.Fatalf("%s: the fault was not reached (%v)", what, err)
			}
			t.Logf("%s: answered before the fault: %v", what, err)
			time.Sleep(100 * time.Millisecond)
		}
	}

	// Redis paused just before the removals are read.
	for _, call := range []string{"lookup", "mark"} {
		var paused atomic.Bool
		resumed := make(chan struct{})
		enginetest.SetInArchive(func(stage string) {
			if stage == "removals" && paused.CompareAndSwap(false, true) {
				srv.Pause()
				go func() { time.Sleep(2500 * time.Millisecond); srv.Resume(); close(resumed) }()
			}
		})
		err, took := reach(call+" with Redis paused before the removals read", paused.Load, func() error {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			if call == "lookup" {
				return b.LookupBatch(cctx, keys, info)
			}
			return b.MarkBatch(cctx, keys, nil, out)
		})
		enginetest.SetInArchive(nil)
		mustUnavailable("Redis paused before the removals read, "+call, err, took)
		if err == nil {
			for i := range keys {
				if call == "lookup" && info[i].Outcome != engine.Duplicate || call == "mark" && out[i] != engine.Duplicate {
					t.Fatalf("%s with Redis paused answered key %s wrongly", call, keys[i])
				}
			}
		}
		<-resumed
		allDup("after Redis resumed (" + call + ")")
	}

	// The removals read's reply lost, or the read never sent.
	rmFired := func() bool { return rm.hits.Swap(0) > 0 }
	for _, apply := range []int{-1, 0} {
		rm.arm("hmget", 0, apply)
		err, took := reach("the removals read lost in LookupBatch", rmFired, func() error { return b.LookupBatch(ctx, keys, info) })
		mustUnavailable(fmt.Sprint("the removals read lost (apply ", apply, ")"), err, took)
		rm.arm("hmget", 0, apply)
		err, took = reach("the removals read lost in MarkBatch", rmFired, func() error { return b.MarkBatch(ctx, keys, nil, out) })
		mustUnavailable(fmt.Sprint("MarkBatch, the removals read lost (apply ", apply, ")"), err, took)
		allDup("after the removals read was lost")
	}

	// The archive's read with its applied position fails.
	fdb.failApplied.Store(true)
	err, took := reach("LookupApplied failing", func() bool { return fdb.hits.Swap(0) > 0 }, func() error { return b.LookupBatch(ctx, keys, info) })
	fdb.failApplied.Store(false)
	mustUnavailable("LookupApplied failing", err, took)
	allDup("after LookupApplied failed")

	// Mid-read: a drain applies and trims new entries between the archive
	// read and the removals read, so the hits are read again; once
	// answered, once with that read again failing.
	for _, fail := range []bool{false, true} {
		var fired atomic.Bool
		other := keysOf(fmt.Sprint("rafind-other-", fail), 5)
		enginetest.SetInArchive(func(stage string) {
			if stage != "removals" || !fired.CompareAndSwap(false, true) {
				return
			}
			o := make([]engine.Outcome, len(other))
			for try := 0; ; try++ {
				err := a.MarkBatch(ctx, other, nil, o)
				if err == nil {
					break
				}
				if !errors.Is(err, engine.ErrUnavailable) || try > 50 {
					t.Errorf("marking other keys mid-read: %v", err)
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
			tail := raLogTail(t, plain, prefix)
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				v, _ := plain.Get(ctx, prefix+"\x00\xfftrimmed").Result()
				if p, ok := raParsePos(v); ok && !p.less(tail) {
					break
				}
				if time.Now().After(deadline) {
					t.Errorf("the drain did not trim the other keys' entry mid-read within 10 s")
					return
				}
			}
			fdb.failLookup.Store(fail)
		})
		err, took := reach(fmt.Sprint("mid-read (fail ", fail, ")"), fired.Load, func() error { return b.LookupBatch(ctx, keys, info) })
		enginetest.SetInArchive(nil)
		fdb.failLookup.Store(false)
		hits := fdb.hits.Swap(0)
		if fail {
			if hits == 0 {
				t.Fatalf("the read again did not happen (no fault hit; %v)", err)
			}
			mustUnavailable("the read again failing", err, took)
		} else {
			if err != nil {
				t.Fatalf("mid-read: %v", err)
			}
			for i := range info {
				if info[i].Outcome != engine.Duplicate || info[i].Source != engine.SourceArchive {
					t.Fatalf("PROMISE 2 BROKEN: mid-read: acknowledged key %s = %v from %v", keys[i], info[i].Outcome, info[i].Source)
				}
			}
		}
		allDup(fmt.Sprint("after the mid-read (fail ", fail, ")"))
	}
	// Nothing was marked by the failed calls; a's keys stay Duplicate,
	// and a MarkBatch on b finds them so.
	if err := b.MarkBatch(ctx, keys, nil, out); err != nil {
		t.Fatal(err)
	}
	for i, o := range out {
		if o != engine.Duplicate {
			t.Fatalf("PROMISE 2 BROKEN: mark of acknowledged key %s after the faults = %v", keys[i], o)
		}
	}
}
