package memory

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"runtime"
	"strconv"
	"testing"
	"unsafe"

	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
)

// d is a digest whose value n sits in its last 8 bytes, so a table that
// kept only the first 8 would answer every such digest as zero.
func d[T ~int | ~uint64](n T) Digest {
	var out Digest
	binary.BigEndian.PutUint64(out[8:], uint64(n))
	return out
}

func fp(i int) shard.Fingerprint {
	return shard.Sum(shard.Hasher{}, "", strconv.AppendInt(nil, int64(i), 10))
}

func newTable(t testing.TB, o *Options) *Table {
	t.Helper()
	tb, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

func acquire(tb *Table, f shard.Fingerprint, token uint64, now, lease int64) Result {
	out := make([]Result, 1)
	tb.Acquire([]shard.Fingerprint{f}, []uint64{token}, now, now+lease, now+1000, out)
	return out[0]
}

func one[T any](fn func([]shard.Fingerprint, []uint64, int64, []T), f shard.Fingerprint, token uint64, now int64) T {
	out := make([]T, 1)
	fn([]shard.Fingerprint{f}, []uint64{token}, now, out)
	return out[0]
}

// release adapts Table.Release (which also takes the time to keep attempt
// counts until) to the shape of one.
func release(tb *Table) func([]shard.Fingerprint, []uint64, int64, []Status) {
	return func(fps []shard.Fingerprint, tokens []uint64, now int64, out []Status) {
		res := make([]Result, len(out))
		tb.Release(fps, tokens, now, now+1000, true, res)
		for i := range res {
			out[i] = res[i].Status
		}
	}
}

func TestSizes(t *testing.T) {
	if got := unsafe.Sizeof(entry{}); got != 56 {
		t.Errorf("entry is %d bytes, want 56: it is most of the tier's memory", got)
	}
	if got := unsafe.Sizeof(stripe{}); got%64 != 0 {
		t.Errorf("stripe is %d bytes, want a multiple of 64 so stripes do not share cache lines", got)
	}
}

func TestOptionsValidateListsEveryProblem(t *testing.T) {
	err := (&Options{Capacity: -1, Stripes: 3, NoCommitted: true, MaxAttempts: -1}).Validate()
	if !errors.Is(err, ErrOptions) {
		t.Fatalf("err = %v, want ErrOptions", err)
	}
	for _, want := range []string{"Capacity -1", "NoCommitted", "Stripes 3", "MaxAttempts -1"} {
		if !contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if _, err := New(&Options{Stripes: 5}); !errors.Is(err, ErrOptions) {
		t.Errorf("New with bad stripes: %v", err)
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

func TestClaimLifecycle(t *testing.T) {
	tb := newTable(t, nil)
	k := fp(1)
	const lease = 10
	if r := acquire(tb, k, 1, 0, lease); r.Status != tier.Acquired {
		t.Fatalf("first acquire = %v", r.Status)
	}
	if r := acquire(tb, k, 2, 5, lease); r.Status != tier.Held {
		t.Fatalf("second acquire inside lease = %v, want held", r.Status)
	}
	if s := one(tb.Begin, k, 2, 5); s != tier.Lost {
		t.Fatalf("begin by non-owner = %v, want lost", s)
	}
	if s := one(release(tb), k, 2, 5); s != tier.Lost {
		t.Fatalf("release by non-owner = %v, want lost", s)
	}
	// Lease expires: another owner takes over, the first is fenced out.
	if r := acquire(tb, k, 3, 10, lease); r.Status != tier.TakenOver {
		t.Fatalf("acquire after lease = %v, want taken-over", r.Status)
	}
	if s := one(tb.Begin, k, 1, 11); s != tier.Lost {
		t.Fatalf("begin by expired owner = %v, want lost", s)
	}
	if s := one(tb.Begin, k, 3, 11); s != tier.OK {
		t.Fatalf("begin by owner = %v", s)
	}
	// A committing claim cannot expire or be released.
	if r := acquire(tb, k, 4, 100, lease); r.Status != tier.Held {
		t.Fatalf("acquire while committing = %v, want held", r.Status)
	}
	if s := one(release(tb), k, 3, 12); s != tier.Lost {
		t.Fatalf("release while committing = %v, want lost", s)
	}
	tb.Finish([]shard.Fingerprint{k}, []uint64{3}, []bool{true}, 50, []Digest{d(77)})
	if r := acquire(tb, k, 5, 20, lease); r.Status != tier.Committed || r.Digest != d(77) {
		t.Fatalf("acquire after commit = %+v, want committed/77", r)
	}
	if r := acquire(tb, k, 6, 50, lease); r.Status != tier.Acquired {
		t.Fatalf("acquire after expiry = %v, want acquired", r.Status)
	}
	if s := one(release(tb), k, 6, 51); s != tier.OK {
		t.Fatalf("release by owner = %v", s)
	}
	if s := one(release(tb), k, 6, 51); s != tier.Lost {
		t.Fatalf("second release = %v, want lost", s)
	}
	if c, m := tb.Len(); c != 0 || m != 0 {
		t.Fatalf("Len = %d, %d after release", c, m)
	}
}

// TestExtend: only the owner of an unexpired, uncommitting claim extends
// its lease, never shortening it; the extended claim holds past its first
// lease end, and one that expired stays taken over.
func TestExtend(t *testing.T) {
	tb := newTable(t, nil)
	k := fp(1)
	extend := func(token uint64, now, until int64) Status {
		out := make([]Status, 1)
		tb.Extend([]shard.Fingerprint{k}, []uint64{token}, now, until, out)
		return out[0]
	}
	acquire(tb, k, 1, 0, 10)
	if s := extend(2, 5, 100); s != tier.Lost {
		t.Fatalf("extend by a non-owner = %v, want lost", s)
	}
	if s := extend(1, 5, 30); s != tier.OK {
		t.Fatalf("extend by the owner = %v", s)
	}
	if s := extend(1, 6, 20); s != tier.OK {
		t.Fatalf("a shorter extension = %v", s)
	}
	if r := acquire(tb, k, 3, 25, 10); r.Status != tier.Held {
		t.Fatalf("acquire inside the extended lease = %v, want held (a shorter extension must not shorten it)", r.Status)
	}
	if r := acquire(tb, k, 3, 30, 10); r.Status != tier.TakenOver {
		t.Fatalf("acquire after the extended lease = %v, want taken-over", r.Status)
	}
	if s := extend(1, 31, 100); s != tier.Lost {
		t.Fatalf("extend by the expired owner = %v, want lost", s)
	}
	one(tb.Begin, k, 3, 32)
	if s := extend(3, 33, 100); s != tier.Lost {
		t.Fatalf("extend while committing = %v, want lost", s)
	}
}

func TestFailedCommitRestoresClaim(t *testing.T) {
	tb := newTable(t, nil)
	k := fp(1)
	acquire(tb, k, 1, 0, 10)
	one(tb.Begin, k, 1, 1)
	tb.Finish([]shard.Fingerprint{k}, []uint64{1}, []bool{false}, 0, []Digest{d(0)})
	if s := one(release(tb), k, 1, 2); s != tier.OK {
		t.Fatalf("release after failed commit = %v, want ok", s)
	}
}

// TestPoison: with MaxAttempts, releases and lease takeovers of a key's
// claims are counted; the attempt after the last allowed one is Poisoned
// and claims nothing; a commit or the keep time resets the count.
func TestPoison(t *testing.T) {
	tb := newTable(t, &Options{MaxAttempts: 3})
	k := fp(1)
	var now int64
	attempt := func(tok uint64) Status { return acquire(tb, k, tok, now, 10).Status }
	rel := func(tok uint64) {
		out := make([]Result, 1)
		tb.Release([]shard.Fingerprint{k}, []uint64{tok}, now, now+500, true, out)
		if out[0].Status != tier.OK {
			t.Fatalf("release = %v", out[0].Status)
		}
	}
	if s := attempt(1); s != tier.Acquired {
		t.Fatal(s)
	}
	rel(1) // attempt 1
	if s := attempt(2); s != tier.Acquired {
		t.Fatal(s)
	}
	now += 20 // lease runs out: attempt 2
	if s := attempt(3); s != tier.TakenOver {
		t.Fatal(s)
	}
	rel(3) // attempt 3
	if s := attempt(4); s != tier.Poisoned {
		t.Fatalf("fourth attempt = %v, want poisoned", s)
	}
	if s := attempt(5); s != tier.Poisoned {
		t.Fatalf("poisoned again = %v", s)
	}
	now += 600 // the count is kept until 500 after the last release
	if s := attempt(6); s != tier.Acquired {
		t.Fatalf("after the keep time = %v, want acquired", s)
	}
	one(tb.Begin, k, 6, now)
	tb.Finish([]shard.Fingerprint{k}, []uint64{6}, []bool{true}, now+1000, []Digest{d(0)})
	if s := attempt(7); s != tier.Committed {
		t.Fatalf("after commit = %v", s)
	}
}

func TestBatchRepeatsSeeEarlierOccurrence(t *testing.T) {
	tb := newTable(t, &Options{Stripes: 4})
	fps := []shard.Fingerprint{fp(1), fp(2), fp(1), fp(3), fp(2), fp(1)}
	out := make([]Result, len(fps))
	tb.Acquire(fps, []uint64{1, 2, 3, 4, 5, 6}, 0, 10, 10, out)
	want := []Status{tier.Acquired, tier.Acquired, tier.Held, tier.Acquired, tier.Held, tier.Held}
	for i := range want {
		if out[i].Status != want[i] {
			t.Errorf("key %d: %v, want %v", i, out[i].Status, want[i])
		}
	}
}

func TestLRUEvictsLeastRecentlyUsedCommitted(t *testing.T) {
	tb := newTable(t, &Options{Capacity: 3, Stripes: 1})
	commit := func(i int) {
		acquire(tb, fp(i), uint64(i), 0, 10)
		one(tb.Begin, fp(i), uint64(i), 0)
		tb.Finish([]shard.Fingerprint{fp(i)}, []uint64{uint64(i)}, []bool{true}, 100, []Digest{d(0)})
	}
	commit(1)
	commit(2)
	commit(3)
	acquire(tb, fp(1), 99, 1, 10) // touch 1: 2 is now least recent
	// An outstanding claim is never evicted, whatever the pressure.
	acquire(tb, fp(50), 50, 1, 1000)
	commit(4)
	if r := acquire(tb, fp(2), 98, 1, 10); r.Status != tier.Acquired {
		t.Fatalf("key 2 = %v, want evicted (acquired)", r.Status)
	}
	for _, i := range []int{1, 3, 4} {
		if r := acquire(tb, fp(i), 97, 1, 10); r.Status != tier.Committed {
			t.Errorf("key %d = %v, want committed", i, r.Status)
		}
	}
	if r := acquire(tb, fp(50), 96, 2, 10); r.Status != tier.Held {
		t.Errorf("claim = %v, want held", r.Status)
	}
}

func TestNoCommittedKeepsClaimsOnly(t *testing.T) {
	tb := newTable(t, &Options{NoCommitted: true})
	k := fp(1)
	acquire(tb, k, 1, 0, 10)
	one(tb.Begin, k, 1, 0)
	tb.Finish([]shard.Fingerprint{k}, []uint64{1}, []bool{true}, 100, []Digest{d(0)})
	if r := acquire(tb, k, 2, 1, 10); r.Status != tier.Acquired {
		t.Fatalf("acquire after commit with NoCommitted = %v, want acquired", r.Status)
	}
}

// TestAgainstModel drives random operations over a small key space, so that
// deletions, growth and eviction interleave, and compares every answer with
// a plain map.
func TestAgainstModel(t *testing.T) {
	type state struct {
		claimed  bool
		token    uint64
		until    int64
		digest   Digest
		inflight bool // committing
	}
	rng := rand.New(rand.NewPCG(1, 2))
	tb := newTable(t, &Options{Capacity: 1 << 20, Stripes: 2})
	model := map[int]*state{}
	var now int64
	var token uint64
	for op := range 200_000 {
		k := rng.IntN(3000)
		f := fp(k)
		m := model[k]
		now += int64(rng.IntN(3))
		token++
		switch rng.IntN(4) {
		case 0, 1:
			r := acquire(tb, f, token, now, 50)
			var want Status
			switch {
			case m == nil || (!m.claimed && m.until <= now):
				want = tier.Acquired
			case m.claimed && (m.inflight || m.until > now):
				want = tier.Held
			case m.claimed:
				want = tier.TakenOver
			default:
				want = tier.Committed
			}
			if r.Status != want || (want == tier.Committed && r.Digest != m.digest) {
				t.Fatalf("op %d key %d: acquire = %+v, want %v (model %+v)", op, k, r, want, m)
			}
			if want == tier.Acquired || want == tier.TakenOver {
				model[k] = &state{claimed: true, token: token, until: now + 50}
			}
		case 2:
			if m == nil || !m.claimed || m.inflight {
				continue
			}
			s := one(tb.Begin, f, m.token, now)
			if (s == tier.OK) != (m.until > now) {
				t.Fatalf("op %d key %d: begin = %v, model %+v now %d", op, k, s, m, now)
			}
			if s != tier.OK {
				continue
			}
			ok := rng.IntN(4) != 0
			tb.Finish([]shard.Fingerprint{f}, []uint64{m.token}, []bool{ok}, now+200, []Digest{d(token)})
			if ok {
				model[k] = &state{until: now + 200, digest: d(token)}
			}
		case 3:
			tok := token
			if m != nil && m.claimed && rng.IntN(2) == 0 {
				tok = m.token
			}
			s := one(release(tb), f, tok, now)
			want := tier.Lost
			if m != nil && m.claimed && !m.inflight && m.token == tok && m.until > now {
				want = tier.OK
				delete(model, k)
			}
			if s != want {
				t.Fatalf("op %d key %d: release = %v, want %v", op, k, s, want)
			}
		}
	}
}

// TestHeapBytesPerEntry measures the heap that 1M committed entries take,
// the budget being 64 B per entry beyond the key (the table stores no
// key bytes at all, only the 128-bit fingerprint).
func TestHeapBytesPerEntry(t *testing.T) {
	const n = 1 << 20
	fps := make([]shard.Fingerprint, n)
	for i := range fps {
		fps[i] = shard.Fingerprint{Hi: rand.Uint64(), Lo: rand.Uint64()}
	}
	expires := make([]int64, n)
	for i := range expires {
		expires[i] = 1 << 60
	}
	digests := make([]Digest, n)
	var before, after runtime.MemStats
	// Twice: what sync.Pools of earlier tests hold survives one collection
	// and would be freed between the readings.
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&before)
	tb := newTable(t, &Options{Capacity: n})
	for i := 0; i < n; i += 256 {
		tb.put(fps[i:i+256], expires[i:i+256], digests[i:i+256])
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	// The inputs were allocated before the first reading: they must still
	// be there at this one, or the difference reads low (or below zero).
	runtime.KeepAlive(fps)
	runtime.KeepAlive(expires)
	runtime.KeepAlive(digests)
	// Each stripe keeps Capacity/Stripes, so a random spread fills slightly
	// less than Capacity before the fullest stripes start evicting.
	_, c := tb.Len()
	if c < n*98/100 {
		t.Fatalf("holds %d committed entries, want ≥ 98%% of %d", c, n)
	}
	perEntry := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(c)
	t.Logf("heap bytes per entry at %d entries: %.1f", c, perEntry)
	// The capacity planner's MemoryEntryBytes (bench) is this figure, 70.5:
	// both bounds keep it honest.
	if perEntry > 74 || perEntry < 67 {
		t.Errorf("%.1f heap bytes per entry, want 67–74 (the planner uses 70.5)", perEntry)
	}
	runtime.KeepAlive(tb)
	runtime.KeepAlive(fps)
	runtime.KeepAlive(expires)
	runtime.KeepAlive(digests)
}

// TestPoisonByExpiryIsKept: a key made poison by lease expiries keeps its
// count as long as one made poison by releases (the keep time), not just
// for one more lease; and every call reports the count it reached.
func TestPoisonByExpiryIsKept(t *testing.T) {
	tb := newTable(t, &Options{MaxAttempts: 2})
	k := fp(1)
	var now int64
	if r := acquire(tb, k, 1, now, 10); r.Status != tier.Acquired || r.Attempts != 0 {
		t.Fatal(r)
	}
	now += 20
	if r := acquire(tb, k, 2, now, 10); r.Status != tier.TakenOver || r.Attempts != 1 || !r.Expired {
		t.Fatalf("first expiry = %+v", r)
	}
	now += 20
	if r := acquire(tb, k, 3, now, 10); r.Status != tier.Poisoned || r.Attempts != 2 || !r.Expired {
		t.Fatalf("second expiry = %+v", r)
	}
	now += 50 // past a lease, inside the keep time (1000)
	if r := acquire(tb, k, 4, now, 10); r.Status != tier.Poisoned || r.Expired {
		t.Fatalf("a key poisoned by expiries, one lease later = %+v, want Poisoned", r)
	}
}

// TestSettleCarriesAttempts: a slower tier's count raises a claim's own
// (Keep) or makes the key poison (Poison), as if counted here.
func TestSettleCarriesAttempts(t *testing.T) {
	tb := newTable(t, &Options{MaxAttempts: 3})
	a, b := fp(1), fp(2)
	acquire(tb, a, 1, 0, 10)
	acquire(tb, b, 2, 0, 10)
	tb.Settle([]shard.Fingerprint{a, b}, []uint64{1, 2}, []Action{Keep, Poison}, []int64{0, 500}, make([]Digest, 2), []uint16{2, 3})
	out := make([]Result, 1)
	tb.Release([]shard.Fingerprint{a}, []uint64{1}, 1, 500, true, out)
	if out[0].Status != tier.OK || out[0].Attempts != 3 {
		t.Fatalf("release after a carried count of 2 = %+v, want attempt 3", out[0])
	}
	if r := acquire(tb, a, 3, 2, 10); r.Status != tier.Poisoned {
		t.Fatalf("a after its third attempt = %+v", r)
	}
	if r := acquire(tb, b, 4, 2, 10); r.Status != tier.Poisoned || r.Attempts != 3 {
		t.Fatalf("b settled as poison = %+v", r)
	}
}

// TestMarkClaimsAndCommitsInOneStep: Mark answers as Acquire and leaves
// every key it acquired committed with its digest until expires; a key
// repeated in the batch finds its first occurrence committed; a live
// claim is Held and kept; an ended claim is taken over and committed; a
// poisoned key stays poisoned and uncommitted; expiry is kept.
func TestMarkClaimsAndCommitsInOneStep(t *testing.T) {
	tb := newTable(t, &Options{MaxAttempts: 1})
	const now, lease = 100, 10
	if r := acquire(tb, fp(2), 7, now, lease); r.Status != tier.Acquired { // a live claim
		t.Fatal(r.Status)
	}
	if r := acquire(tb, fp(3), 8, now-2*lease, lease); r.Status != tier.Acquired { // a claim whose lease ended
		t.Fatal(r.Status)
	}
	if r := acquire(tb, fp(4), 9, now, lease); r.Status != tier.Acquired { // released once: poisoned at MaxAttempts 1
		t.Fatal(r.Status)
	}
	if st := one(release(tb), fp(4), 9, now); st != tier.OK {
		t.Fatal(st)
	}
	fps := []shard.Fingerprint{fp(1), fp(2), fp(1), fp(3), fp(4)}
	digests := []Digest{d(1), d(2), d(3), d(4), d(5)}
	out := make([]Result, len(fps))
	tb.Mark(fps, []uint64{11, 12, 13, 14, 15}, digests, now, now+lease, now+1000, now+500, out)
	want := []Status{tier.Acquired, tier.Held, tier.Committed, tier.Poisoned, tier.Poisoned}
	// fp(3)'s ended lease is an attempt: with MaxAttempts 1 it poisons.
	for i := range want {
		if out[i].Status != want[i] {
			t.Fatalf("key %d = %v, want %v", i, out[i].Status, want[i])
		}
	}
	if out[2].Digest != d(1) {
		t.Fatalf("repeat answered digest %v, want the first occurrence's", out[2].Digest)
	}
	peek := func(f shard.Fingerprint, at int64) Result {
		r := make([]Result, 1)
		tb.Peek([]shard.Fingerprint{f}, at, r)
		return r[0]
	}
	if r := peek(fp(1), now+499); r.Status != tier.Committed || r.Digest != d(1) {
		t.Fatalf("marked key before expiry = %v %v", r.Status, r.Digest)
	}
	if r := peek(fp(1), now+500); r.Status != tier.Absent {
		t.Fatalf("marked key at expiry = %v", r.Status)
	}
	if r := peek(fp(2), now+1); r.Status != tier.Held {
		t.Fatalf("the live claim after Mark = %v", r.Status)
	}
	if st := one(release(tb), fp(2), 7, now+1); st != tier.OK {
		t.Fatalf("the live claim's owner lost it to Mark: %v", st)
	}

	// Without MaxAttempts an ended claim is taken over, and committed.
	tb = newTable(t, nil)
	if r := acquire(tb, fp(3), 8, now-2*lease, lease); r.Status != tier.Acquired {
		t.Fatal(r.Status)
	}
	tb.Mark([]shard.Fingerprint{fp(3)}, []uint64{14}, nil, now, now+lease, now+1000, now+500, out[:1])
	if out[0].Status != tier.TakenOver {
		t.Fatalf("ended claim = %v, want taken over", out[0].Status)
	}
	if r := peek(fp(3), now+lease+1); r.Status != tier.Committed {
		t.Fatalf("taken-over key after its new lease = %v, want committed", r.Status)
	}
	if claims, committed := tb.Len(); claims != 0 || committed != 1 {
		t.Fatalf("Len = %d claims, %d committed", claims, committed)
	}
}
