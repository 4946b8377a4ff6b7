package enginetest_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/embedded"
	"github.com/tierdedup/tierdedup/tier/pebble"
)

// ---------------------------------------------------------------------
// helpers

// atkOpts are the brief's options: 7-day window, 1-day partitions,
// 21-day archive.
func atkOpts(clock *fakeClock, fs vfs.FS, a tier.ArchiveBackend) engine.Options {
	return engine.Options{
		Backend: &embedded.Backend{Dir: "store", FS: fs}, Clock: clock, Window: 7 * day, Partition: day,
		ExpectedKeys: 2000, Archive: a, ArchiveWindow: 21 * day,
	}
}

func atkLookup(t *testing.T, e *engine.Engine, key []byte) engine.KeyInfo {
	t.Helper()
	info, err := e.Lookup(context.Background(), key)
	if err != nil {
		t.Fatalf("lookup %q: %v", key, err)
	}
	return info
}

func atkMark(t *testing.T, e *engine.Engine, keys ...[]byte) []engine.Outcome {
	t.Helper()
	out := make([]engine.Outcome, len(keys))
	if err := e.MarkBatch(context.Background(), keys, nil, out); err != nil {
		t.Fatalf("mark: %v", err)
	}
	return out
}

// tick moves the clock by d and makes the engine see it (a Lookup of a
// throwaway key rotates).
func tick(t *testing.T, e *engine.Engine, c *fakeClock, d time.Duration) {
	t.Helper()
	c.Add(d)
	_, _ = e.Lookup(context.Background(), []byte("tick"))
}

// gateArchive wraps an archive backend: Put fails while down is set;
// Lookup waits on hold (when set) before answering.
func gateArchive(b tier.ArchiveBackend, down *atomic.Bool, hold *atomic.Pointer[chan struct{}]) tier.ArchiveBackend {
	return wrappedArchive{b, func(a tier.Archive) tier.Archive { return gateStore{a, down, hold} }}
}

type gateStore struct {
	tier.Archive
	down *atomic.Bool
	hold *atomic.Pointer[chan struct{}]
}

func (g gateStore) Put(ctx context.Context, p int64, scan func(func(*tier.Record) error) error) error {
	if g.down != nil && g.down.Load() {
		return errors.New("archive down")
	}
	return g.Archive.Put(ctx, p, scan)
}

func (g gateStore) Lookup(ctx context.Context, qs []tier.ArchiveQuery, out []tier.Answer) error {
	if g.hold != nil {
		if ch := g.hold.Load(); ch != nil {
			<-*ch
		}
	}
	return g.Archive.Lookup(ctx, qs, out)
}

// ---------------------------------------------------------------------
// Results, digests, repeats

// TestArchiveAttackResultConflictRepeats: a commit with a Result and a
// digest, read back past the hot window from the archive: Lookup and Claim
// give the Result, ClaimDigest with another digest is a Conflict, a batch
// repeating the key is all Duplicate; and claiming it does not renew it.
func TestArchiveAttackResultConflictRepeats(t *testing.T) {
	ctx := context.Background()
	clock := newClock()
	fs := vfs.NewMem()
	o := atkOpts(clock, fs, pebble.ArchiveDir{Dir: "archive", FS: fs})
	e := open(t, o)
	defer func() { e.Close() }()
	key, res := []byte("with-result"), []byte("the-result")
	dg := engine.DigestOf([]byte("payload-1"))
	ns, _ := e.Namespace("")
	c, err := ns.ClaimDigest(ctx, key, dg)
	if err != nil || c.Outcome != engine.New {
		t.Fatalf("claim: %v %v", c.Outcome, err)
	}
	c.Result = res
	if err := e.Commit(ctx, c); err != nil {
		t.Fatal(err)
	}
	committedAt := clock.Now().UnixNano()
	plain := []byte("plain")
	atkMark(t, e, plain)
	for d := 0; d < 10; d++ {
		tick(t, e, clock, day)
	}
	waitArchived(t, e)
	check := func(stage string) {
		t.Helper()
		ns, _ := e.Namespace("")
		info := atkLookup(t, e, key)
		if info.Outcome != engine.Duplicate || !bytes.Equal(info.Result, res) || info.Digest != dg || info.Source != engine.SourceArchive {
			t.Errorf("%s: lookup %+v", stage, info)
		}
		if info.CommittedAt != committedAt {
			t.Errorf("%s: CommittedAt %d, want %d", stage, info.CommittedAt, committedAt)
		}
		c, err := e.Claim(ctx, key)
		if err != nil || c.Outcome != engine.Duplicate || !bytes.Equal(c.Result, res) || c.CommittedAt != committedAt {
			t.Errorf("%s: claim %v %q %d %v", stage, c.Outcome, c.Result, c.CommittedAt, err)
		}
		c, err = ns.ClaimDigest(ctx, key, engine.DigestOf([]byte("payload-2")))
		if err != nil || c.Outcome != engine.Conflict {
			t.Errorf("%s: claim with another digest %v %v", stage, c.Outcome, err)
		}
		c, err = ns.ClaimDigest(ctx, key, dg)
		if err != nil || c.Outcome != engine.Duplicate {
			t.Errorf("%s: claim with the same digest %v %v", stage, c.Outcome, err)
		}
		claims := make([]engine.Claim, 4)
		keys := [][]byte{key, plain, key, plain}
		if err := e.ClaimBatch(ctx, keys, nil, claims); err != nil {
			t.Fatal(err)
		}
		for i, c := range claims {
			if c.Outcome != engine.Duplicate {
				t.Errorf("%s: batch claim %d (%s): %v", stage, i, keys[i], c.Outcome)
			}
			if bytes.Equal(keys[i], key) && !bytes.Equal(c.Result, res) {
				t.Errorf("%s: batch claim %d: result %q", stage, i, c.Result)
			}
		}
		for i, o := range atkMark(t, e, keys...) {
			if o != engine.Duplicate {
				t.Errorf("%s: batch mark %d (%s): %v", stage, i, keys[i], o)
			}
		}
		infos := make([]engine.KeyInfo, 4)
		if err := e.LookupBatch(ctx, keys, infos); err != nil {
			t.Fatal(err)
		}
		for i, in := range infos {
			if in.Outcome != engine.Duplicate {
				t.Errorf("%s: batch lookup %d: %+v", stage, i, in)
			}
		}
	}
	check("live")
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = open(t, o)
	check("reopened")
	// Claims and marks of the duplicate must not renew it: 22 days after
	// its commit, it is New.
	for d := 10; d < 22; d++ {
		tick(t, e, clock, day)
		if d == 15 {
			check("day 15")
		}
	}
	waitArchived(t, e)
	for _, k := range [][]byte{key, plain} {
		if info := atkLookup(t, e, k); info.Outcome != engine.New {
			t.Errorf("%s after 22 days: %+v, want New", k, info)
		}
	}
	st := e.Stats().Archive
	if st == nil || st.Hits == 0 || st.Reads < st.Hits || st.Partitions == 0 || st.Window != 21*day || st.Name != "files" {
		t.Errorf("stats %+v", st)
	}
}

// ---------------------------------------------------------------------
// Forget past 63 lagging partitions

// TestArchiveAttackForgetLongLag: with hourly partitions and a 30-day
// archive, the archive is down for more than 63 partitions behind the
// window. A Forget of a key in a lagging partition more than 63 behind
// the window must remove it (or fail): afterwards the key is New.
func TestArchiveAttackForgetLongLag(t *testing.T) {
	ctx := context.Background()
	clock := newClock()
	fs := vfs.NewMem()
	var down atomic.Bool
	down.Store(true)
	a := gateArchive(pebble.ArchiveDir{Dir: "archive", FS: fs}, &down, nil)
	o := engine.Options{Backend: &embedded.Backend{Dir: "store", FS: fs}, Clock: clock, Window: 24 * time.Hour, Partition: time.Hour,
		ExpectedKeys: 1000, Archive: a, ArchiveWindow: 30 * day}
	e := open(t, o)
	defer func() { e.Close() }()
	atkMark(t, e, []byte("early"))
	for h := 0; h < 70; h++ {
		tick(t, e, clock, time.Hour)
	}
	key := []byte("victim")
	if out := atkMark(t, e, key); out[0] != engine.New {
		t.Fatalf("mark: %v", out[0])
	}
	for h := 0; h < 40; h++ {
		tick(t, e, clock, time.Hour)
	}
	// The key's partition is 40 behind now, 15 behind the window; the
	// lag starts 110 behind now.
	info, ferr := e.Forget(ctx, key)
	t.Logf("forget: %+v, %v", info, ferr)
	down.Store(false)
	tick(t, e, clock, time.Hour)
	waitArchived(t, e)
	after := atkLookup(t, e, key)
	if ferr == nil && after.Outcome != engine.New {
		t.Fatalf("Forget returned %v (no error), yet the key is %v from %v afterwards", info.Outcome, after.Outcome, after.Source)
	}
	if ferr == nil && info.Outcome != engine.Duplicate {
		t.Errorf("Forget of a committed key answered %v", info.Outcome)
	}
}

// ---------------------------------------------------------------------
// A read racing with the archiver

// TestArchiveAttackLagReadRace: a Lookup (or Claim) of a key in a
// partition that left the window unarchived, while the archiver catches
// up and the exact tier drops that partition. The archive's reads are
// slow (a network archive): the call reads the archive first, then the
// exact tier's lagging partitions, with the archive's progress read
// before either. The key must stay Duplicate.
func TestArchiveAttackLagReadRace(t *testing.T) {
	for _, via := range []string{"lookup", "claim"} {
		t.Run(via, func(t *testing.T) {
			ctx := context.Background()
			clock := newClock()
			fs := vfs.NewMem()
			var down atomic.Bool
			var hold atomic.Pointer[chan struct{}]
			a := gateArchive(pebble.ArchiveDir{Dir: "archive", FS: fs}, &down, &hold)
			e := open(t, atkOpts(clock, fs, a))
			defer func() { e.Close() }()
			archived, lagging := []byte("archived-key"), []byte("lagging-key")
			atkMark(t, e, archived)
			tick(t, e, clock, day)
			waitArchived(t, e) // day 0 is in the archive
			down.Store(true)
			atkMark(t, e, lagging) // day 1: the archive will lag behind it
			for d := 0; d < 9; d++ {
				tick(t, e, clock, day)
			}
			if info := atkLookup(t, e, lagging); info.Outcome != engine.Duplicate {
				t.Fatalf("lagging key before the race: %+v", info)
			}
			ch := make(chan struct{})
			hold.Store(&ch)
			type res struct {
				outs []engine.Outcome
				err  error
			}
			done := make(chan res, 1)
			go func() {
				keys := [][]byte{archived, lagging}
				if via == "lookup" {
					infos := make([]engine.KeyInfo, 2)
					err := e.LookupBatch(ctx, keys, infos)
					done <- res{[]engine.Outcome{infos[0].Outcome, infos[1].Outcome}, err}
					return
				}
				claims := make([]engine.Claim, 2)
				err := e.ClaimBatch(ctx, keys, nil, claims)
				done <- res{[]engine.Outcome{claims[0].Outcome, claims[1].Outcome}, err}
			}()
			time.Sleep(100 * time.Millisecond) // the call waits in the archive's Lookup
			hold.Store(nil)
			down.Store(false)
			tick(t, e, clock, day) // the archiver catches up with days 1-3
			// (the seals of the newer partitions wait for the call in flight)
			deadline := time.Now().Add(20 * time.Second)
			for e.Stats().Archive.Lag > 7 {
				if time.Now().After(deadline) {
					t.Fatalf("archiver stuck: %+v", e.Stats().Archive)
				}
				time.Sleep(10 * time.Millisecond)
			}
			tick(t, e, clock, day) // the rotation drops what the archive holds
			close(ch)
			r := <-done
			if r.err != nil {
				t.Logf("racing call failed: %v (acceptable)", r.err)
			} else if r.outs[1] != engine.Duplicate {
				t.Errorf("racing %s: the lagging key (committed 10 days ago, inside the archive window) is %v, want Duplicate", via, r.outs[1])
			}
			if info := atkLookup(t, e, lagging); info.Outcome != engine.Duplicate {
				t.Errorf("after the race: %+v", info)
			}
		})
	}
}

// ---------------------------------------------------------------------
// Damage between runs

// atkHistory commits one key a day for days days (2 keys: one plain,
// one with a result), leaving the engine open at day `days`.
func atkHistory(t *testing.T, e *engine.Engine, clock *fakeClock, days int) {
	t.Helper()
	for d := 0; d < days; d++ {
		atkMark(t, e, fmt.Appendf(nil, "hist-%02d", d))
		tick(t, e, clock, day)
	}
	waitArchived(t, e)
}

// atkCheckHistory: keys younger than 21 days are Duplicate, those older
// than 21 days and their partition New, and a key of exactly 21 days (a
// commit is dated, and the check runs at the hour of the commits) either;
// it returns the disagreements.
func atkCheckHistory(t *testing.T, e *engine.Engine, days int) []string {
	return atkCheckHistoryAt(t, e, days, days)
}

// atkCheckHistoryAt checks the keys of days [0, committed) when the
// clock is at day `days`.
func atkCheckHistoryAt(t *testing.T, e *engine.Engine, committed, days int) []string {
	t.Helper()
	var bad []string
	for d := 0; d < committed; d++ {
		k := fmt.Appendf(nil, "hist-%02d", d)
		info, err := e.Lookup(context.Background(), k)
		if err != nil {
			bad = append(bad, fmt.Sprintf("%s: %v", k, err))
			continue
		}
		want := engine.Duplicate
		if days-d > 21 {
			want = engine.New
		}
		if info.Outcome != want && days-d != 21 {
			bad = append(bad, fmt.Sprintf("%s (age %d): %v from %v, want %v", k, days-d, info.Outcome, info.Source, want))
		}
	}
	return bad
}

// TestArchiveAttackBlobsDamaged: every filter blob corrupted, truncated
// or removed between runs: the next Open rescans and answers exactly.
func TestArchiveAttackBlobsDamaged(t *testing.T) {
	for _, how := range []string{"none", "flip", "truncate", "remove", "empty", "swap"} {
		t.Run(how, func(t *testing.T) {
			clock := newClock()
			fs := vfs.NewMem()
			o := atkOpts(clock, fs, pebble.ArchiveDir{Dir: "archive", FS: fs})
			e := open(t, o)
			atkHistory(t, e, clock, 15)
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			dir := fs.PathJoin("archive", "blobs")
			names, err := fs.List(dir)
			if err != nil || len(names) == 0 {
				t.Fatalf("blobs: %v %v", names, err)
			}
			var prev []byte
			for _, n := range names {
				path := fs.PathJoin(dir, n)
				f, err := fs.Open(path)
				if err != nil {
					t.Fatal(err)
				}
				st, _ := f.Stat()
				buf := make([]byte, st.Size())
				_, _ = f.ReadAt(buf, 0)
				f.Close()
				orig := bytes.Clone(buf)
				switch how {
				case "flip":
					for i := len(buf) / 2; i < len(buf); i += 64 {
						buf[i] ^= 0xff
					}
				case "truncate":
					buf = buf[:len(buf)/2]
				case "empty":
					buf = nil
				case "swap":
					if prev == nil {
						prev = orig
						continue
					}
					buf, prev = prev, orig
				case "none":
					continue
				case "remove":
					if err := fs.Remove(path); err != nil {
						t.Fatal(err)
					}
					continue
				}
				w, err := fs.Create(path, vfs.WriteCategoryUnspecified)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = w.Write(buf)
				_ = w.Sync()
				w.Close()
			}
			e = open(t, o)
			defer e.Close()
			if bad := atkCheckHistory(t, e, 15); len(bad) > 0 {
				t.Fatalf("%d wrong, first: %s; archive %+v", len(bad), bad[0], e.Stats().Archive)
			}
			// And through the next days, with the filters restored.
			for d := 15; d < 25; d++ {
				tick(t, e, clock, day)
			}
			waitArchived(t, e)
			if bad := atkCheckHistoryAt(t, e, 15, 25); len(bad) > 0 {
				t.Fatalf("later: %d wrong, first: %s", len(bad), bad[0])
			}
		})
	}
}

// TestArchiveAttackArchiveDirLost: the archive directory is deleted
// between runs (the exact tier already dropped what it held). The engine
// can no longer answer for those keys: it must refuse to open (or
// answer Duplicate), never answer New for keys inside the archive window.
func TestArchiveAttackArchiveDirLost(t *testing.T) {
	clock := newClock()
	fs := vfs.NewMem()
	o := atkOpts(clock, fs, pebble.ArchiveDir{Dir: "archive", FS: fs})
	e := open(t, o)
	atkHistory(t, e, clock, 15)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := fs.RemoveAll("archive"); err != nil {
		t.Fatal(err)
	}
	o.Logger = quiet
	e2, err := engine.Open(&o)
	if err != nil {
		t.Logf("refused: %v", err)
		return
	}
	defer e2.Close()
	if bad := atkCheckHistory(t, e2, 15); len(bad) > 0 {
		t.Fatalf("the archive was lost and Open accepted it: %d keys inside the archive window answer wrong, first: %s", len(bad), bad[0])
	}
}

// TestArchiveAttackSameDir: an ArchiveDir that is the store's own Dir is
// a bad option (ArchiveDir.Dir's doc): refused at Open with ErrOptions.
func TestArchiveAttackSameDir(t *testing.T) {
	for _, dir := range []string{"store", "store/archive"} {
		clock := newClock()
		fs := vfs.NewMem()
		o := atkOpts(clock, fs, pebble.ArchiveDir{Dir: dir, FS: fs})
		o.Logger = quiet
		e, err := engine.Open(&o)
		if err == nil {
			atkMark(t, e, []byte("k"))
			cerr := e.Close()
			e2, err2 := engine.Open(&o)
			if err2 == nil {
				e2.Close()
			}
			t.Errorf("archive dir %q inside/equal to the store's: Open accepted it (close %v, reopen %v)", dir, cerr, err2)
			continue
		}
		if !errors.Is(err, engine.ErrOptions) {
			t.Errorf("archive dir %q: %v, want ErrOptions", dir, err)
		}
	}
}

// ---------------------------------------------------------------------
// Crashes and Close while archiving

// TestArchiveAttackCrashWhileArchiving: machine crashes (CrashClone)
// taken while the archiver copies partitions and the exact tier drops
// them; each clone, reopened, answers every key acknowledged before the
// crash exactly (Duplicate inside the archive window, New after).
func TestArchiveAttackCrashWhileArchiving(t *testing.T) {
	clock := newClock()
	fs := newCrashFS()
	o := atkOpts(clock, fs, pebble.ArchiveDir{Dir: "archive", FS: fs})
	o.ExpectedKeys = 5000
	e := open(t, o)
	const perDay = 300
	type clone struct {
		fs    crashFS
		acked int // days fully acknowledged before the clone
		at    time.Time
	}
	var clones []clone
	var acked atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(7 * time.Millisecond):
			}
			a := int(acked.Load())
			at := clock.Now()
			c := fs.CrashClone(vfs.CrashCloneCfg{})
			mu.Lock()
			clones = append(clones, clone{c, a, at})
			mu.Unlock()
		}
	}()
	for d := 0; d < 30; d++ {
		keys := make([][]byte, perDay)
		for i := range keys {
			keys[i] = fmt.Appendf(nil, "c%02d-%04d", d, i)
		}
		out := make([]engine.Outcome, perDay)
		if err := e.MarkBatch(context.Background(), keys, nil, out); err != nil {
			t.Fatal(err)
		}
		acked.Store(int64(d + 1))
		clock.Add(day)
		_, _ = e.Lookup(context.Background(), []byte("tick"))
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	_ = e.Close()
	t.Logf("%d clones", len(clones))
	step := max(1, len(clones)/25)
	for n := 0; n < len(clones); n += step {
		c := clones[n]
		cl := enginetest.ClockAt(c.at)
		o2 := atkOpts(cl, c.fs, pebble.ArchiveDir{Dir: "archive", FS: c.fs})
		o2.ExpectedKeys = 5000
		o2.Logger = quiet
		e2, err := engine.Open(&o2)
		if err != nil {
			t.Errorf("clone %d: open: %v", n, err)
			continue
		}
		cur := int(cl.Now().Sub(newClock().Now()) / day) // days since day 0
		for d := 0; d < c.acked; d++ {
			keys := make([][]byte, perDay)
			for i := range keys {
				keys[i] = fmt.Appendf(nil, "c%02d-%04d", d, i)
			}
			infos := make([]engine.KeyInfo, perDay)
			if err := e2.LookupBatch(context.Background(), keys, infos); err != nil {
				t.Errorf("clone %d day %d: %v", n, d, err)
				continue
			}
			want := engine.Duplicate
			if cur-d > 21 {
				want = engine.New
			}
			wrong := 0
			for _, in := range infos {
				if in.Outcome != want && cur-d != 21 { // exactly the archive window: either
					wrong++
				}
			}
			if wrong > 0 {
				t.Errorf("clone %d (clock day %d, %d days acked): day %d (age %d): %d keys not %v", n, cur, c.acked, d, cur-d, wrong, want)
			}
		}
		_ = e2.Close()
	}
}

// TestArchiveAttackCloseWhileArchiving: Close while the archiver is busy
// catching up many partitions; the reopened engine answers exactly.
func TestArchiveAttackCloseWhileArchiving(t *testing.T) {
	for round := 0; round < 3; round++ {
		clock := newClock()
		fs := vfs.NewMem()
		var down atomic.Bool
		down.Store(true)
		a := gateArchive(pebble.ArchiveDir{Dir: "archive", FS: fs}, &down, nil)
		o := atkOpts(clock, fs, a)
		e := open(t, o)
		for d := 0; d < 18; d++ {
			keys := make([][]byte, 500)
			for i := range keys {
				keys[i] = fmt.Appendf(nil, "hist-%02d-%d", d, i)
			}
			keys[0] = fmt.Appendf(nil, "hist-%02d", d)
			if err := e.MarkBatch(context.Background(), keys, nil, make([]engine.Outcome, len(keys))); err != nil {
				t.Fatal(err)
			}
			tick(t, e, clock, day)
		}
		down.Store(false)
		tick(t, e, clock, time.Hour) // wake the archiver
		time.Sleep(time.Duration(round) * 5 * time.Millisecond)
		if err := e.Close(); err != nil {
			t.Fatalf("close while archiving: %v", err)
		}
		e = open(t, o)
		if bad := atkCheckHistory(t, e, 18); len(bad) > 0 {
			t.Errorf("round %d: %d wrong, first: %s", round, len(bad), bad[0])
		}
		waitArchived(t, e)
		if bad := atkCheckHistory(t, e, 18); len(bad) > 0 {
			t.Errorf("round %d, archived: %d wrong, first: %s", round, len(bad), bad[0])
		}
		e.Close()
	}
}

// ---------------------------------------------------------------------
// Clock jumps and a longer archive window

// TestArchiveAttackClockJumps: the clock jumps 15 days at once (keys
// stay Duplicate, through Lookup and Claim, before the archiver catches
// up), the engine reopens with a longer ArchiveWindow (nothing lost), then
// the clock jumps 70 days (more than 63 partitions; every key New).
func TestArchiveAttackClockJumps(t *testing.T) {
	clock := newClock()
	fs := vfs.NewMem()
	o := atkOpts(clock, fs, pebble.ArchiveDir{Dir: "archive", FS: fs})
	e := open(t, o)
	defer func() { e.Close() }()
	atkHistory(t, e, clock, 5)
	clock.Add(15 * day) // ages 16..20 now, no archiving has run for them yet
	if bad := atkCheckHistoryAt(t, e, 5, 20); len(bad) > 0 {
		t.Fatalf("right after a 15-day jump: %d wrong, first: %s", len(bad), bad[0])
	}
	claims := make([]engine.Claim, 5)
	keys := make([][]byte, 5)
	for d := range keys {
		keys[d] = fmt.Appendf(nil, "hist-%02d", d)
	}
	if err := e.ClaimBatch(context.Background(), keys, nil, claims); err != nil {
		t.Fatal(err)
	}
	for d, c := range claims {
		if c.Outcome != engine.Duplicate {
			t.Errorf("claim of hist-%02d after the jump: %v", d, c.Outcome)
		}
	}
	waitArchived(t, e)
	if bad := atkCheckHistoryAt(t, e, 5, 20); len(bad) > 0 {
		t.Fatalf("archived after the jump: %d wrong, first: %s", len(bad), bad[0])
	}
	// Reopen with a longer archive window: nothing is lost.
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	o.ArchiveWindow = 60 * day
	e = open(t, o)
	for d := range keys {
		if info := atkLookup(t, e, keys[d]); info.Outcome != engine.Duplicate {
			t.Errorf("longer window: hist-%02d: %+v", d, info)
		}
	}
	clock.Add(70 * day)
	for d := range keys {
		if info := atkLookup(t, e, keys[d]); info.Outcome != engine.New {
			t.Errorf("after 90 days: hist-%02d: %+v", d, info)
		}
	}
	waitArchived(t, e)
	if st := e.Stats().Archive; st.Lag != 0 || st.Window != 60*day {
		t.Errorf("stats %+v", st)
	}
}
