package engine_test

// Adversarial tests of the memory tier's hashed index (tier/memory/stripe.go)
// and of the memory-only one-step MarkBatch (engine/mark.go markInMemory →
// memory.Table.Mark), through the public API only.
//
// With Stripes 1 the memory tier is one exact LRU, so a reference model
// (rvModel below: a map and an LRU order) predicts every answer, LRU
// eviction, TTL expiry, attempt counts and the counts in Stats. With more
// stripes the placement of a key is secret, so rvBounds checks what holds
// whatever the placement: never a false Duplicate, and a key fewer than a
// stripe's capacity of distinct keys behind the most recent is still held.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/enginetest"
)

// ---------------------------------------------------------------------------
// The exact reference model (one stripe).

const (
	rvClaimed = iota + 1
	rvCommitted
	rvReleased
)

type rvEntry struct {
	state    int
	until    int64 // lease end, expiry, or keep time of an attempt count
	digest   engine.Digest
	result   string
	attempts int
	owner    int   // claim id (rvClaimed)
	seq      int64 // LRU recency (rvCommitted, rvReleased): higher is more recent
}

type rvModel struct {
	cap, maxAttempts      int
	lease, window, partLn int64
	live                  int64
	m                     map[string]*rvEntry
	seq                   int64
	nextOwner             int
}

func newRVModel(capacity, maxAttempts int, lease, window, part time.Duration) *rvModel {
	return &rvModel{
		cap: capacity, maxAttempts: maxAttempts, lease: int64(lease), window: int64(window), partLn: int64(part),
		live: int64((window+part-1)/part) + 1, m: map[string]*rvEntry{},
	}
}

// keepUntil is the engine's keep time for an attempt count made at now:
// the expiry of now's partition.
func (m *rvModel) keepUntil(now int64) int64 { return (now/m.partLn + m.live) * m.partLn }

func (m *rvModel) lruLen() int {
	n := 0
	for _, e := range m.m {
		if e.state == rvCommitted || e.state == rvReleased {
			n++
		}
	}
	return n
}

func (m *rvModel) claims() int {
	n := 0
	for _, e := range m.m {
		if e.state == rvClaimed {
			n++
		}
	}
	return n
}

func (m *rvModel) touch(e *rvEntry) { m.seq++; e.seq = m.seq }

// evict removes the least recently used committed or released entries
// beyond the capacity.
func (m *rvModel) evict() {
	for m.lruLen() > m.cap {
		var tail string
		var ts int64 = -1
		for k, e := range m.m {
			if (e.state == rvCommitted || e.state == rvReleased) && (ts < 0 || e.seq < ts) {
				tail, ts = k, e.seq
			}
		}
		delete(m.m, tail)
	}
}

// acquire is one key's claim attempt: the outcome, and the claim's owner
// id when it installed one (New). evictNow: a poisoning lease expiry
// evicts at once (a claim); false: the caller evicts later (a mark, whose
// stripe evicts once all its keys of the batch are answered).
func (m *rvModel) acquire(key string, now int64, evictNow bool) (engine.Outcome, *rvEntry, int) {
	e := m.m[key]
	claim := func(attempts int) (engine.Outcome, *rvEntry, int) {
		m.nextOwner++
		ne := &rvEntry{state: rvClaimed, until: now + m.lease, attempts: attempts, owner: m.nextOwner}
		m.m[key] = ne
		return engine.New, nil, m.nextOwner
	}
	if e == nil {
		return claim(0)
	}
	switch e.state {
	case rvClaimed:
		if enginetest.LeaseMayLive(e.until, now) {
			return engine.InFlight, nil, 0
		}
		a := int(enginetest.Counted(uint16(e.attempts), m.maxAttempts))
		if m.maxAttempts > 0 {
			if enginetest.Poisoned(uint16(a), m.maxAttempts) {
				e.state, e.until, e.attempts = rvReleased, m.keepUntil(now), a
				m.touch(e)
				if evictNow {
					m.evict()
				}
				return engine.Poison, nil, 0
			}
		}
		return claim(a)
	case rvReleased:
		a := e.attempts
		if e.until <= now {
			a = 0
		} else if enginetest.Poisoned(uint16(a), m.maxAttempts) {
			m.touch(e)
			return engine.Poison, nil, 0
		}
		return claim(a)
	default: // committed
		if e.until > now {
			m.touch(e)
			return engine.Duplicate, e, 0
		}
		return claim(0)
	}
}

func (m *rvModel) commit(key string, owner int, now int64, d engine.Digest, result string, evict bool) bool {
	e := m.m[key]
	if e == nil || e.state != rvClaimed || e.owner != owner || e.until <= now {
		return false
	}
	*e = rvEntry{state: rvCommitted, until: now + m.window, digest: d, result: result}
	m.touch(e)
	if evict {
		m.evict()
	}
	return true
}

func (m *rvModel) release(key string, owner int, now int64) bool {
	e := m.m[key]
	if e == nil || e.state != rvClaimed || e.owner != owner || e.until <= now {
		return false
	}
	if m.maxAttempts == 0 {
		delete(m.m, key)
		return true
	}
	e.attempts++
	e.state, e.until, e.owner = rvReleased, m.keepUntil(now), 0
	m.touch(e)
	m.evict()
	return true
}

func rvConflicts(req, stored engine.Digest) bool { return enginetest.Conflicts(req, stored) }

// mark is MarkBatch: every key in order, evicting at the end.
func (m *rvModel) mark(keys []string, ds []engine.Digest, now int64) []engine.Outcome {
	out := make([]engine.Outcome, len(keys))
	for i, k := range keys {
		var d engine.Digest
		if ds != nil {
			d = ds[i]
		}
		o, e, owner := m.acquire(k, now, false)
		switch {
		case o == engine.New:
			m.commit(k, owner, now, d, "", false)
		case o == engine.Duplicate && rvConflicts(d, e.digest):
			o = engine.Conflict
		}
		out[i] = o
	}
	m.evict()
	return out
}

// peek is Lookup's answer (and what Forget reports).
func (m *rvModel) peek(key string, now int64) engine.KeyInfo {
	e := m.m[key]
	counted := func(a int) engine.KeyInfo {
		if enginetest.Poisoned(uint16(a), m.maxAttempts) {
			return engine.KeyInfo{Outcome: engine.Poison, Attempts: uint16(a)}
		}
		return engine.KeyInfo{Outcome: engine.New, Attempts: uint16(a)}
	}
	if e == nil {
		return engine.KeyInfo{Outcome: engine.New}
	}
	switch e.state {
	case rvClaimed:
		if e.until > now {
			return engine.KeyInfo{Outcome: engine.InFlight}
		}
		if m.maxAttempts == 0 {
			return engine.KeyInfo{Outcome: engine.New}
		}
		return counted(e.attempts + 1)
	case rvReleased:
		if e.until <= now {
			return engine.KeyInfo{Outcome: engine.New}
		}
		return counted(e.attempts)
	default:
		if e.until <= now {
			return engine.KeyInfo{Outcome: engine.New}
		}
		var r []byte
		if e.result != "" {
			r = []byte(e.result)
		}
		return engine.KeyInfo{Outcome: engine.Duplicate, Digest: e.digest, Result: r}
	}
}

func (m *rvModel) forget(key string, now int64) engine.KeyInfo {
	in := m.peek(key, now)
	if in.Outcome != engine.InFlight {
		delete(m.m, key)
	}
	return in
}

// ---------------------------------------------------------------------------
// The driver: random operations on an engine and the model side by side.

type rvHeld struct {
	c      engine.Claim
	key    string
	owner  int
	digest engine.Digest
}

type rvRun struct {
	t       *testing.T
	r       *rand.Rand
	e       *engine.Engine
	ns      *engine.Namespace
	clock   *fakeClock
	m       *rvModel
	keys    []string
	held    []rvHeld
	log     []string // the operations so far, for a failure's reproduction
	digests []engine.Digest
}

func (x *rvRun) now() int64 { return x.clock.Now().UnixNano() }

func (x *rvRun) fail(format string, args ...any) {
	x.t.Helper()
	start := max(0, len(x.log)-40)
	x.t.Fatalf("%s\nlast operations (of %d):\n  %s", fmt.Sprintf(format, args...), len(x.log), joinLines(x.log[start:]))
}

func joinLines(ss []string) string {
	out := ""
	for i, s := range ss {
		if i > 0 {
			out += "\n  "
		}
		out += s
	}
	return out
}

func (x *rvRun) pickKeys(n int) []string {
	ks := make([]string, n)
	for i := range ks {
		ks[i] = x.keys[x.r.IntN(len(x.keys))]
	}
	return ks
}

func (x *rvRun) pickDigest() engine.Digest { return x.digests[x.r.IntN(len(x.digests))] }

func rvBytes(ss []string) [][]byte {
	out := make([][]byte, len(ss))
	for i, s := range ss {
		out[i] = []byte(s)
	}
	return out
}

func (x *rvRun) checkInfo(what, key string, got, want engine.KeyInfo) {
	x.t.Helper()
	if got.Outcome != want.Outcome || got.Attempts != want.Attempts ||
		(want.Outcome == engine.Duplicate && (got.Digest != want.Digest || string(got.Result) != string(want.Result))) {
		x.fail("%s %q: got %v (attempts %d, digest %x, result %q), model %v (attempts %d, digest %x, result %q)",
			what, key, got.Outcome, got.Attempts, got.Digest[:2], got.Result, want.Outcome, want.Attempts, want.Digest[:2], want.Result)
	}
}

func (x *rvRun) checkCounts() {
	x.t.Helper()
	s := x.e.Stats()
	if s.Memory.Entries != x.m.lruLen() || s.Memory.Claims != x.m.claims() {
		x.fail("Stats: MemoryEntries %d MemoryClaims %d, model %d and %d", s.Memory.Entries, s.Memory.Claims, x.m.lruLen(), x.m.claims())
	}
}

func (x *rvRun) step() {
	ctx := context.Background()
	now := x.now()
	switch op := x.r.IntN(100); {
	case op < 30: // MarkBatch, repeats likely
		n := 1 + x.r.IntN(12)
		if x.r.IntN(10) == 0 {
			n = 30 + x.r.IntN(40) // far beyond the stripe's capacity
		}
		ks := x.pickKeys(n)
		var ds []engine.Digest
		if x.r.IntN(2) == 0 {
			ds = make([]engine.Digest, n)
			for i := range ds {
				ds[i] = x.pickDigest()
			}
		}
		x.log = append(x.log, fmt.Sprintf("MarkBatch %v digests %v", ks, rvDigestNames(ds)))
		want := x.m.mark(ks, ds, now)
		got := make([]engine.Outcome, n)
		if err := x.e.MarkBatch(ctx, rvBytes(ks), ds, got); err != nil {
			x.fail("MarkBatch: %v", err)
		}
		for i := range want {
			if got[i] != want[i] {
				x.fail("MarkBatch %v: got %v, model %v (first difference at %d)", ks, got, want, i)
			}
		}
	case op < 45: // Claim one key (with a digest), hold it
		k := x.pickKeys(1)[0]
		d := x.pickDigest()
		x.log = append(x.log, fmt.Sprintf("Claim %s digest %s", k, rvDigestNames([]engine.Digest{d})))
		want, e, owner := x.m.acquire(k, now, true)
		if want == engine.Duplicate && rvConflicts(d, e.digest) {
			want = engine.Conflict
		}
		c, err := x.ns.ClaimDigest(ctx, []byte(k), d)
		if err != nil {
			x.fail("Claim: %v", err)
		}
		if c.Outcome != want {
			x.fail("Claim %q: got %v, model %v", k, c.Outcome, want)
		}
		if (want == engine.Duplicate || want == engine.Conflict) && string(c.Result) != e.result {
			x.fail("Claim %q: result %q, model %q", k, c.Result, e.result)
		}
		if want == engine.New {
			x.held = append(x.held, rvHeld{c: c, key: k, owner: owner, digest: d})
		}
	case op < 50: // ClaimBatch of many keys: claims pile up beyond the capacity
		n := 5 + x.r.IntN(25)
		ks := x.pickKeys(n)
		x.log = append(x.log, fmt.Sprintf("ClaimBatch %v", ks))
		out := make([]engine.Claim, n)
		if err := x.e.ClaimBatch(ctx, rvBytes(ks), nil, out); err != nil {
			x.fail("ClaimBatch: %v", err)
		}
		want := make([]engine.Outcome, n)
		owners := make([]int, n)
		for i, k := range ks {
			want[i], _, owners[i] = x.m.acquire(k, now, true)
		}
		// A repeat that memory found held by this batch's own claim
		// follows the earliest occurrence memory did not find held, as the
		// engine does (repeatsFollow): Duplicate or Poison follow, New
		// keeps it InFlight.
		raw := append([]engine.Outcome(nil), want...)
		for i := range ks {
			if raw[i] != engine.InFlight {
				continue
			}
			for j := range i {
				if ks[j] != ks[i] || raw[j] == engine.InFlight {
					continue
				}
				if raw[j] == engine.Poison || raw[j] == engine.Duplicate || raw[j] == engine.Conflict {
					want[i] = engine.Duplicate
					if raw[j] == engine.Poison {
						want[i] = engine.Poison
					}
				}
				break
			}
		}
		for i, k := range ks {
			if out[i].Outcome != want[i] {
				got := make([]engine.Outcome, n)
				for j := range out {
					got[j] = out[j].Outcome
				}
				x.fail("ClaimBatch %v: key %d %q got %v, model %v\n got %v\nmodel %v", ks, i, k, out[i].Outcome, want[i], got, want)
			}
			if want[i] == engine.New {
				x.held = append(x.held, rvHeld{c: out[i], key: k, owner: owners[i]})
			}
		}
	case op < 62: // Commit a held claim (maybe with a result)
		if len(x.held) == 0 {
			return
		}
		j := x.r.IntN(len(x.held))
		h := x.held[j]
		x.held = append(x.held[:j], x.held[j+1:]...)
		res := ""
		if x.r.IntN(2) == 0 {
			res = fmt.Sprintf("r-%s-%d", h.key, len(x.log))
			h.c.Result = []byte(res)
		}
		x.log = append(x.log, fmt.Sprintf("Commit %s (owner %d) result %q", h.key, h.owner, res))
		ok := x.m.commit(h.key, h.owner, now, h.digest, res, true)
		err := x.e.Commit(ctx, h.c)
		if ok != (err == nil) || (!ok && !errors.Is(err, engine.ErrLeaseLost)) {
			x.fail("Commit %q: %v, model ok=%v", h.key, err, ok)
		}
	case op < 70: // Release a held claim
		if len(x.held) == 0 {
			return
		}
		j := x.r.IntN(len(x.held))
		h := x.held[j]
		x.held = append(x.held[:j], x.held[j+1:]...)
		x.log = append(x.log, fmt.Sprintf("Release %s (owner %d)", h.key, h.owner))
		ok := x.m.release(h.key, h.owner, now)
		err := x.e.Release(ctx, h.c)
		if ok != (err == nil) || (!ok && !errors.Is(err, engine.ErrLeaseLost)) {
			x.fail("Release %q: %v, model ok=%v", h.key, err, ok)
		}
	case op < 80: // LookupBatch (changes nothing, not even LRU order)
		ks := x.pickKeys(1 + x.r.IntN(6))
		x.log = append(x.log, fmt.Sprintf("LookupBatch %v", ks))
		out := make([]engine.KeyInfo, len(ks))
		if err := x.e.LookupBatch(ctx, rvBytes(ks), out); err != nil {
			x.fail("LookupBatch: %v", err)
		}
		for i, k := range ks {
			x.checkInfo("Lookup", k, out[i], x.m.peek(k, now))
		}
	case op < 86: // ForgetBatch, repeats possible
		ks := x.pickKeys(1 + x.r.IntN(4))
		x.log = append(x.log, fmt.Sprintf("ForgetBatch %v", ks))
		out := make([]engine.KeyInfo, len(ks))
		err := x.e.ForgetBatch(ctx, rvBytes(ks), out)
		held := false
		seen := map[string]engine.KeyInfo{}
		for i, k := range ks {
			want, ok := seen[k]
			if !ok {
				want = x.m.forget(k, now)
				seen[k] = want
			}
			held = held || want.Outcome == engine.InFlight
			x.checkInfo("Forget", k, out[i], want)
		}
		if held != errors.Is(err, engine.ErrInFlight) || (!held && err != nil) {
			x.fail("ForgetBatch %v: %v (a key held: %v)", ks, err, held)
		}
	default: // the clock moves
		steps := []time.Duration{0, time.Millisecond, time.Duration(x.m.lease / 2), time.Duration(x.m.lease - 1), time.Duration(x.m.lease),
			time.Duration(x.m.partLn), time.Duration(x.m.window/2 - 1), time.Duration(x.m.window - 1), time.Duration(x.m.window)}
		d := steps[x.r.IntN(len(steps))]
		x.log = append(x.log, fmt.Sprintf("clock +%v", d))
		x.clock.Add(d)
	}
	x.checkCounts()
}

var rvDigestName = map[engine.Digest]string{{}: "0", mmdig(1): "d1", mmdig(2): "d2"}

func rvDigestNames(ds []engine.Digest) string {
	if ds == nil {
		return "nil"
	}
	out := "["
	for i, d := range ds {
		if i > 0 {
			out += " "
		}
		out += rvDigestName[d]
	}
	return out + "]"
}

// rvModelRun runs steps random operations against a one-stripe memory-only
// engine of capacity, over a universe of nkeys keys.
func rvModelRun(t *testing.T, seed uint64, capacity, maxAttempts, nkeys, steps int) {
	clock := newClock()
	const lease, window, part = time.Second, 8 * time.Second, time.Second
	e := open(t, engine.Options{Tiers: engine.MemoryOnly, Clock: clock, MemoryCapacity: capacity, Stripes: 1,
		MaxAttempts: maxAttempts, Lease: lease, Window: window, Partition: part})
	defer e.Close()
	ns, err := e.Namespace("")
	if err != nil {
		t.Fatal(err)
	}
	x := &rvRun{t: t, r: rand.New(rand.NewPCG(seed, 0x5eed)), e: e, ns: ns, clock: clock,
		m: newRVModel(capacity, maxAttempts, lease, window, part), digests: []engine.Digest{{}, mmdig(1), mmdig(2)}}
	for i := range nkeys {
		x.keys = append(x.keys, fmt.Sprintf("k%02d", i))
	}
	for range steps {
		x.step()
	}
}

// TestMemModelModelExact: random Mark/Claim/ClaimBatch/Commit/Release/
// Lookup/Forget and clock steps on a one-stripe memory-only engine with a
// tiny capacity (1..8), without MaxAttempts, against the exact LRU model:
// every answer (outcome, digest, result), every lease loss, and the
// memory's counts. Batches of up to 70 keys with repeats exceed the
// capacity many times over (the index grows from its 14..23 slots), claims
// pile up uncounted by the capacity and must never be evicted.
func TestMemModelModelExact(t *testing.T) {
	for capacity := 1; capacity <= 8; capacity++ {
		for seed := range uint64(3) {
			t.Run(fmt.Sprintf("cap%d-seed%d", capacity, seed), func(t *testing.T) {
				rvModelRun(t, seed*100+uint64(capacity), capacity, 0, 30, 1500)
			})
		}
	}
}

// TestMemModelModelAttempts: the same with MaxAttempts 2: releases and
// lease expiries count, Poison at two, counts kept to their partition's
// expiry and evicted with the LRU, Forget clears them.
func TestMemModelModelAttempts(t *testing.T) {
	for capacity := 1; capacity <= 8; capacity++ {
		for seed := range uint64(3) {
			t.Run(fmt.Sprintf("cap%d-seed%d", capacity, seed), func(t *testing.T) {
				rvModelRun(t, seed*100+uint64(capacity)+7, capacity, 2, 30, 1500)
			})
		}
	}
}

// ---------------------------------------------------------------------------
// Targeted cases.

// TestMemModelClaimsNeverEvicted: one stripe of capacity 1 holds 64
// claims (ClaimBatch, leases of a minute) while marks of 2000 other keys,
// in batches far beyond the capacity, evict on every visit: every claim
// stays (InFlight for marks, claims and Lookups of its key; its Forget
// fails ErrInFlight and changes nothing), and each commits afterwards;
// then the capacity holds exactly the last commit.
func TestMemModelClaimsNeverEvicted(t *testing.T) {
	ctx := context.Background()
	e := open(t, engine.Options{Tiers: engine.MemoryOnly, Clock: newClock(), MemoryCapacity: 1, Stripes: 1, Lease: time.Minute})
	defer e.Close()
	held := make([][]byte, 64)
	for i := range held {
		held[i] = fmt.Appendf(nil, "held%02d", i)
	}
	cl := make([]engine.Claim, len(held))
	if err := e.ClaimBatch(ctx, held, nil, cl); err != nil {
		t.Fatal(err)
	}
	for i := range cl {
		if cl[i].Outcome != mmN {
			t.Fatalf("claim %d: %v", i, cl[i].Outcome)
		}
	}
	for round := range 10 {
		var ks [][]byte
		for i := range 200 {
			ks = append(ks, fmt.Appendf(nil, "m%d-%03d", round, i))
			if i%10 == 0 {
				ks = append(ks, held[(round*7+i)%len(held)])
			}
		}
		out := mmmark(t, e, ks, nil)
		for i, o := range out {
			want := mmN
			if string(ks[i][:4]) == "held" {
				want = mmI
			}
			if o != want {
				t.Fatalf("round %d, mark of %s: %v, want %v", round, ks[i], o, want)
			}
		}
		if s := e.Stats(); s.Memory.Claims != len(held) || s.Memory.Entries != 1 {
			t.Fatalf("round %d: MemoryClaims %d MemoryEntries %d, want %d and 1", round, s.Memory.Claims, s.Memory.Entries, len(held))
		}
	}
	infos := make([]engine.KeyInfo, len(held))
	if err := e.LookupBatch(ctx, held, infos); err != nil {
		t.Fatal(err)
	}
	for i, in := range infos {
		if in.Outcome != mmI {
			t.Fatalf("Lookup of held claim %s: %v", held[i], in.Outcome)
		}
	}
	if err := e.ForgetBatch(ctx, held[:3], infos[:3]); !errors.Is(err, engine.ErrInFlight) {
		t.Fatalf("Forget of held claims: %v, want ErrInFlight", err)
	}
	again := make([]engine.Claim, len(held))
	if err := e.ClaimBatch(ctx, held, nil, again); err != nil {
		t.Fatal(err)
	}
	for i := range again {
		if again[i].Outcome != mmI {
			t.Fatalf("second claim of %s: %v", held[i], again[i].Outcome)
		}
	}
	for i := range cl {
		cl[i].Result = []byte("r")
	}
	if err := e.CommitBatch(ctx, cl, nil); err != nil {
		t.Fatalf("commit of the claims kept through the evictions: %v", err)
	}
	if err := e.LookupBatch(ctx, held, infos); err != nil {
		t.Fatal(err)
	}
	for i, in := range infos {
		want := mmN // evicted by the later commits of the batch
		if i == len(held)-1 {
			want = mmD
		}
		if in.Outcome != want {
			t.Fatalf("after committing, %s: %v, want %v", held[i], in.Outcome, want)
		}
	}
}

// TestMemModelMarkPoisonEvictsBatchKeys: MarkBatch promises "a key
// repeated in the batch is New once and Duplicate after", and
// tier/memory's invariant 1 that Mark evicts only once a stripe's keys of
// the batch are all answered, "so no key of the batch loses what it held
// to another key's commit". A key of the batch whose expired claim
// reaches MaxAttempts (Poison) evicts at once, while the stripe holds the
// batch's commits beyond its capacity: a key committed earlier in the
// same batch, and a key committed before it, are evicted mid-batch and
// answer New.
func TestMemModelMarkPoisonEvictsBatchKeys(t *testing.T) {
	ctx := context.Background()
	clock := newClock()
	e := open(t, engine.Options{Tiers: engine.MemoryOnly, Clock: clock, MemoryCapacity: 2, Stripes: 1, MaxAttempts: 1,
		Lease: time.Second, Window: time.Hour, Partition: time.Minute})
	defer e.Close()
	mmwant(t, "old", mmmark(t, e, mmkeys("old"), nil), mmN)
	c, err := e.Claim(ctx, []byte("p"))
	if err != nil || c.Outcome != mmN {
		t.Fatal(c.Outcome, err)
	}
	clock.Add(time.Second) // p's lease ends: its next claim poisons it
	// Claim-then-commit (Acquire of the whole batch, then Finish) answers
	// a, b New, p Poison, the repeat of a Duplicate, old Duplicate.
	mmwant(t, "batch", mmmark(t, e, mmkeys("a", "b", "p", "a", "old"), nil), mmN, mmN, mmP, mmD, mmD)
}

// TestMemModelMarkOverCapacityLRU: a batch of many distinct keys with
// repeats, far beyond a one-stripe capacity: each key New exactly once in
// the batch and Duplicate at its repeats; after the batch exactly the
// capacity's most recently used keys are held (Lookup changes no order),
// the rest are New. Repeated for capacities 1..8 and for capacities
// whose slab and index are sized eagerly (n == limit) or not.
func TestMemModelMarkOverCapacityLRU(t *testing.T) {
	for _, capacity := range []int{1, 2, 3, 5, 8, 100, 4096} {
		t.Run(fmt.Sprint(capacity), func(t *testing.T) {
			e := open(t, engine.Options{Tiers: engine.MemoryOnly, Clock: newClock(), MemoryCapacity: capacity, Stripes: 1})
			defer e.Close()
			r := rand.New(rand.NewPCG(uint64(capacity), 1))
			n := 3*capacity + 50
			var batch []string
			for i := range n {
				batch = append(batch, fmt.Sprintf("b%05d", i))
				if i > 0 && r.IntN(3) == 0 {
					batch = append(batch, fmt.Sprintf("b%05d", r.IntN(i))) // a repeat of an earlier key
				}
			}
			got := mmmark(t, e, rvBytes(batch), nil)
			seen := map[string]bool{}
			var order []string // distinct keys, least recent first
			last := map[string]int{}
			for i, k := range batch {
				want := mmN
				if seen[k] {
					want = mmD
				}
				if got[i] != want {
					t.Fatalf("key %d %q in the batch: %v, want %v", i, k, got[i], want)
				}
				seen[k] = true
				last[k] = i
			}
			for k := range last {
				order = append(order, k)
			}
			sort.Slice(order, func(a, b int) bool { return last[order[a]] < last[order[b]] })
			infos := make([]engine.KeyInfo, len(order))
			if err := e.LookupBatch(context.Background(), rvBytes(order), infos); err != nil {
				t.Fatal(err)
			}
			for i, in := range infos {
				want := mmN
				if i >= len(order)-capacity {
					want = mmD
				}
				if in.Outcome != want {
					t.Fatalf("after the batch, key %q (recency %d of %d, capacity %d): %v, want %v", order[i], len(order)-i, len(order), capacity, in.Outcome, want)
				}
			}
			if s := e.Stats(); s.Memory.Entries != capacity || s.Memory.Claims != 0 {
				t.Fatalf("MemoryEntries %d MemoryClaims %d, want %d and 0", s.Memory.Entries, s.Memory.Claims, capacity)
			}
			// A second batch of fresh keys and the held ones, reversed.
			var again []string
			for i := len(order) - 1; i >= len(order)-capacity; i-- {
				again = append(again, order[i], fmt.Sprintf("fresh%05d", i))
			}
			got = mmmark(t, e, rvBytes(again), nil)
			for i := range again {
				want := mmD
				if i%2 == 1 {
					want = mmN
				}
				if got[i] != want {
					t.Fatalf("second batch, key %q: %v, want %v", again[i], got[i], want)
				}
			}
		})
	}
}

// TestMemModelGrowFromSmall: a capacity above the eager allocation
// (1<<20 entries), one stripe: the slab and the index are sized for 1<<20
// and must grow (the index doubles from 1398102 slots, not a power of
// two) while the keys past it arrive. Every key stays Duplicate until
// capacity pressure evicts the least recent; none is lost by the growth.
func TestMemModelGrowFromSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("a million keys")
	}
	const extra = 3000
	capacity := 1<<20 + extra
	e := open(t, engine.Options{Tiers: engine.MemoryOnly, Clock: newClock(), MemoryCapacity: capacity, Stripes: 1})
	defer e.Close()
	ctx := context.Background()
	total := capacity + 1000 // 1000 evicted, in order
	const batch = 8192
	keys := make([][]byte, 0, batch)
	out := make([]engine.Outcome, batch)
	key := func(i int) []byte { return fmt.Appendf(nil, "g%08d", i) }
	for lo := 0; lo < total; lo += batch {
		keys = keys[:0]
		for i := lo; i < min(lo+batch, total); i++ {
			keys = append(keys, key(i))
		}
		if err := e.MarkBatch(ctx, keys, nil, out[:len(keys)]); err != nil {
			t.Fatal(err)
		}
		for i, o := range out[:len(keys)] {
			if o != mmN {
				t.Fatalf("fresh key %d: %v", lo+i, o)
			}
		}
	}
	if s := e.Stats(); s.Memory.Entries != capacity {
		t.Fatalf("MemoryEntries %d, want %d", s.Memory.Entries, capacity)
	}
	infos := make([]engine.KeyInfo, batch)
	for lo := 0; lo < total; lo += batch {
		keys = keys[:0]
		for i := lo; i < min(lo+batch, total); i++ {
			keys = append(keys, key(i))
		}
		if err := e.LookupBatch(ctx, keys, infos[:len(keys)]); err != nil {
			t.Fatal(err)
		}
		for i, in := range infos[:len(keys)] {
			want := mmD
			if lo+i < total-capacity {
				want = mmN
			}
			if in.Outcome != want {
				t.Fatalf("key %d of %d (capacity %d): %v, want %v", lo+i, total, capacity, in.Outcome, want)
			}
		}
	}
	// Forget half of a range, re-mark everything of it: exactly the
	// forgotten are New (deletion inside a grown index).
	keys = keys[:0]
	for i := total - 5000; i < total; i++ {
		keys = append(keys, key(i))
	}
	fo := make([]engine.KeyInfo, 0, len(keys)/2)
	var half [][]byte
	for i := 0; i < len(keys); i += 2 {
		half = append(half, keys[i])
	}
	fo = fo[:len(half)]
	if err := e.ForgetBatch(ctx, half, fo); err != nil {
		t.Fatal(err)
	}
	for i, in := range fo {
		if in.Outcome != mmD {
			t.Fatalf("Forget of held key %s: %v", half[i], in.Outcome)
		}
	}
	out = make([]engine.Outcome, len(keys))
	if err := e.MarkBatch(ctx, keys, nil, out); err != nil {
		t.Fatal(err)
	}
	for i, o := range out {
		want := mmD
		if i%2 == 0 {
			want = mmN
		}
		if o != want {
			t.Fatalf("re-mark of %s: %v, want %v", keys[i], o, want)
		}
	}
}

// ---------------------------------------------------------------------------
// Many stripes: what holds whatever the (secret) placement.

// rvBounds tracks, per key, what was committed (digest, expiry) and when it
// was last moved to the front of its stripe's LRU. A key fewer than
// perStripe distinct keys behind the most recent cannot have been evicted
// (its stripe's LRU holds at most those in front of it), so it must be
// Duplicate; a key not committed (or expired, or forgotten) must never be.
type rvBounds struct {
	perStripe int
	// roomy: no stripe can reach its capacity (the universe's keys spread
	// over the stripes a few dozen each, the capacity 64 each): nothing is
	// ever evicted (the chance that one does is below 1e-17).
	roomy     bool
	window    int64
	committed map[string]*rvEntry // key → its commit (digest, until), as far as the model knows
	last      map[string]int64    // key → its last LRU touch, kept after removal
	seq       int64
}

func (b *rvBounds) touch(k string) { b.seq++; b.last[k] = b.seq }

// certain reports that k must still be held.
func (b *rvBounds) certain(k string, now int64) bool {
	e := b.committed[k]
	if e == nil || e.until <= now {
		return false
	}
	if b.roomy {
		return true
	}
	ahead := 0
	for o, s := range b.last {
		if o != k && s > b.last[k] {
			ahead++
		}
	}
	return ahead < b.perStripe
}

// possible reports that k may still be held, with digest d.
func (b *rvBounds) possible(k string, now int64) (*rvEntry, bool) {
	e := b.committed[k]
	return e, e != nil && e.until > now
}

func rvStripedRun(t *testing.T, seed uint64, stripes, capacity, nkeys, steps int) {
	ctx := context.Background()
	clock := newClock()
	const window = 8 * time.Second
	e := open(t, engine.Options{Tiers: engine.MemoryOnly, Clock: clock, MemoryCapacity: capacity, Stripes: stripes,
		Lease: time.Second, Window: window, Partition: time.Second})
	defer e.Close()
	r := rand.New(rand.NewPCG(seed, 77))
	b := &rvBounds{perStripe: (capacity + stripes - 1) / stripes, roomy: nkeys <= stripes*16 && capacity >= stripes*64, window: int64(window), committed: map[string]*rvEntry{}, last: map[string]int64{}}
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("s%05d", i)
	}
	// pick draws n keys (with repeats) from keys.
	pick := func(n int) []string {
		ks := make([]string, n)
		for i := range ks {
			ks[i] = keys[r.IntN(len(keys))]
		}
		return ks
	}
	digestOf := func(k string, v int) engine.Digest { // a few digests a key
		d := engine.DigestOf([]byte(k))
		d[15] = byte(v)
		return d
	}
	var log []string
	certainChecks := 0
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("%s\nlast operations:\n  %s", fmt.Sprintf(format, args...), joinLines(log[max(0, len(log)-15):]))
	}
	// checkHeld judges one answer about key k from memory: Duplicate (with
	// the digest held, dig) or New.
	checkHeld := func(what, k string, dup bool, dig engine.Digest, now int64) {
		t.Helper()
		if dup {
			ce, ok := b.possible(k, now)
			if !ok {
				fail("%s %q: Duplicate, but it is not committed inside the window (model %+v)", what, k, b.committed[k])
			}
			if dig != ce.digest {
				fail("%s %q: Duplicate with digest %x, committed with %x", what, k, dig[:4], ce.digest[:4])
			}
		}
		if b.certain(k, now) {
			certainChecks++
		}
		if !dup && b.certain(k, now) {
			fail("%s %q: New, but fewer than %d distinct keys were touched after its commit", what, k, b.perStripe)
		}
	}
	for range steps {
		now := clock.Now().UnixNano()
		switch op := r.IntN(100); {
		case op < 55: // MarkBatch with repeats
			n := 1 + r.IntN(40)
			if r.IntN(8) == 0 {
				n = 200 + r.IntN(400)
			}
			ks := make([]string, n)
			ds := make([]engine.Digest, n)
			for i := range ks {
				ks[i] = keys[r.IntN(len(keys))]
				ds[i] = digestOf(ks[i], r.IntN(2))
			}
			log = append(log, fmt.Sprintf("MarkBatch of %d keys", n))
			out := make([]engine.Outcome, n)
			if err := e.MarkBatch(ctx, rvBytes(ks), ds, out); err != nil {
				t.Fatal(err)
			}
			for i, k := range ks {
				switch out[i] {
				case engine.New:
					checkHeld("MarkBatch", k, false, engine.Digest{}, now)
					b.committed[k] = &rvEntry{digest: ds[i], until: now + b.window}
				case engine.Duplicate, engine.Conflict:
					ce, ok := b.possible(k, now)
					if !ok {
						fail("MarkBatch %q: %v, but it is not committed inside the window", k, out[i])
					}
					if (out[i] == engine.Conflict) != rvConflicts(ds[i], ce.digest) {
						fail("MarkBatch %q with digest %x: %v, committed with %x", k, ds[i][:4], out[i], ce.digest[:4])
					}
				default:
					fail("MarkBatch %q: %v", k, out[i])
				}
				b.touch(k)
			}
		case op < 80: // LookupBatch
			n := 1 + r.IntN(64)
			ks := pick(n)
			log = append(log, fmt.Sprintf("LookupBatch %v", ks))
			out := make([]engine.KeyInfo, n)
			if err := e.LookupBatch(ctx, rvBytes(ks), out); err != nil {
				t.Fatal(err)
			}
			for i, k := range ks {
				if out[i].Outcome != engine.New && out[i].Outcome != engine.Duplicate {
					fail("Lookup %q: %v", k, out[i].Outcome)
				}
				checkHeld("Lookup", k, out[i].Outcome == engine.Duplicate, out[i].Digest, now)
				if out[i].Outcome == engine.New {
					delete(b.committed, k) // evicted or expired: known now
				}
			}
		case op < 90: // ForgetBatch
			n := 1 + r.IntN(8)
			ks := pick(n)
			log = append(log, fmt.Sprintf("ForgetBatch %v", ks))
			out := make([]engine.KeyInfo, n)
			if err := e.ForgetBatch(ctx, rvBytes(ks), out); err != nil {
				t.Fatal(err)
			}
			done := map[string]bool{}
			for i, k := range ks {
				if !done[k] {
					checkHeld("Forget", k, out[i].Outcome == engine.Duplicate, out[i].Digest, now)
				}
				done[k] = true
				delete(b.committed, k)
			}
		default:
			d := []time.Duration{time.Millisecond, time.Second, window/2 - 1, window - 1, window}[r.IntN(5)]
			log = append(log, fmt.Sprintf("clock +%v", d))
			clock.Add(d)
		}
	}
	t.Logf("%d answers about keys that had to be held", certainChecks)
	if certainChecks == 0 {
		t.Fatal("no answer was about a key that had to be held: the run proves nothing")
	}
	if s := e.Stats(); s.Memory.Claims != 0 || s.Memory.Entries > stripes*b.perStripe {
		t.Fatalf("MemoryClaims %d MemoryEntries %d (at most %d)", s.Memory.Claims, s.Memory.Entries, stripes*b.perStripe)
	}
}

// TestMemModelModelStriped: random marks (with repeats, some batches far
// beyond a stripe's capacity), Lookups, Forgets and clock steps on engines
// with several stripes and small capacities: never a Duplicate for a key
// not committed inside the window (or forgotten since), the committed
// digest with every Duplicate and Conflict exactly when digests differ,
// and never New for a key that too few keys followed to be evicted.
func TestMemModelModelStriped(t *testing.T) {
	for _, c := range []struct{ stripes, capacity, keys int }{
		{2, 16, 60}, {4, 64, 200}, {16, 64, 300}, {256, 1 << 14, 4096}, {256, 768, 3000}, {4, 4, 40},
	} {
		t.Run(fmt.Sprintf("stripes%d-cap%d", c.stripes, c.capacity), func(t *testing.T) {
			rvStripedRun(t, uint64(c.stripes*1000+c.capacity), c.stripes, c.capacity, c.keys, 600)
		})
	}
}

// ---------------------------------------------------------------------------
// Concurrency (run with -race).

// TestMemModelConcurrentExactlyOnce: eight goroutines take the same 6000
// keys (each key a digest of its own), each in its own order, through
// MarkBatch (batches of 1..64 with repeats), ClaimBatch then CommitBatch,
// or ClaimBatch then ReleaseBatch (a failed handler), with Lookups. The
// capacity never evicts. Each key is committed exactly
// once: the New answers of a key are its releases plus one commit, never a
// Conflict, and at the end every key is Duplicate with its digest.
func TestMemModelConcurrentExactlyOnce(t *testing.T) {
	ctx := context.Background()
	e := open(t, engine.Options{Tiers: engine.MemoryOnly, MemoryCapacity: 1 << 16, Lease: time.Minute})
	defer e.Close()
	const nkeys, workers = 6000, 8
	keys := make([][]byte, nkeys)
	digs := make([]engine.Digest, nkeys)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "c%05d", i)
		digs[i] = engine.DigestOf(keys[i])
	}
	var news, commits, releases [nkeys]atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 3))
			order := r.Perm(nkeys)
			for lo := 0; lo < len(order); {
				n := min(1+r.IntN(64), len(order)-lo)
				var idx []int
				for _, i := range order[lo : lo+n] {
					idx = append(idx, i)
					if r.IntN(6) == 0 {
						idx = append(idx, i) // a repeat in the batch
					}
				}
				lo += n
				ks := make([][]byte, len(idx))
				ds := make([]engine.Digest, len(idx))
				for j, i := range idx {
					ks[j], ds[j] = keys[i], digs[i]
				}
				switch mode := r.IntN(10); {
				case mode < 6:
					out := make([]engine.Outcome, len(ks))
					if err := e.MarkBatch(ctx, ks, ds, out); err != nil {
						errs <- err
						return
					}
					for j, o := range out {
						switch o {
						case engine.New:
							news[idx[j]].Add(1)
							commits[idx[j]].Add(1)
						case engine.Duplicate, engine.InFlight:
						default:
							errs <- fmt.Errorf("mark of %s: %v", ks[j], o)
							return
						}
					}
				default:
					cl := make([]engine.Claim, len(ks))
					if err := e.ClaimBatch(ctx, ks, ds, cl); err != nil {
						errs <- err
						return
					}
					release := mode == 9
					for j, c := range cl {
						switch c.Outcome {
						case engine.New:
							news[idx[j]].Add(1)
							if release {
								releases[idx[j]].Add(1)
							} else {
								commits[idx[j]].Add(1)
							}
						case engine.Duplicate, engine.InFlight:
						default:
							errs <- fmt.Errorf("claim of %s: %v", ks[j], c.Outcome)
							return
						}
					}
					var err error
					if release {
						err = e.ReleaseBatch(ctx, cl, nil)
					} else {
						err = e.CommitBatch(ctx, cl, nil)
					}
					if err != nil {
						errs <- err
						return
					}
				}
				if r.IntN(4) == 0 {
					infos := make([]engine.KeyInfo, len(ks))
					if err := e.LookupBatch(ctx, ks, infos); err != nil {
						errs <- err
						return
					}
					for j, in := range infos {
						if in.Outcome == engine.Duplicate && in.Digest != ds[j] {
							errs <- fmt.Errorf("lookup of %s: digest %x, committed %x", ks[j], in.Digest[:4], ds[j][:4])
							return
						}
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Keys whose every New was released are committed now, once.
	out := make([]engine.Outcome, nkeys)
	if err := e.MarkBatch(ctx, keys, digs, out); err != nil {
		t.Fatal(err)
	}
	for i, o := range out {
		if o == engine.New {
			commits[i].Add(1)
			news[i].Add(1)
		}
	}
	infos := make([]engine.KeyInfo, nkeys)
	if err := e.LookupBatch(ctx, keys, infos); err != nil {
		t.Fatal(err)
	}
	for i := range keys {
		if c := commits[i].Load(); c != 1 {
			t.Errorf("key %s committed %d times (New %d, released %d)", keys[i], c, news[i].Load(), releases[i].Load())
		}
		if news[i].Load() != commits[i].Load()+releases[i].Load() {
			t.Errorf("key %s: New %d times, committed %d, released %d", keys[i], news[i].Load(), commits[i].Load(), releases[i].Load())
		}
		if infos[i].Outcome != engine.Duplicate || infos[i].Digest != digs[i] {
			t.Errorf("key %s at the end: %v digest %x", keys[i], infos[i].Outcome, infos[i].Digest[:4])
		}
	}
	if s := e.Stats(); s.Memory.Claims != 0 || s.Memory.Entries != nkeys {
		t.Errorf("MemoryClaims %d MemoryEntries %d, want 0 and %d", s.Memory.Claims, s.Memory.Entries, nkeys)
	}
}

// TestMemModelConcurrentTinyStripe: four goroutines share one stripe of
// capacity 8 (eviction on nearly every call, the index growing for batches
// of up to 120 keys and shrinking back by deletions), each marking,
// looking up and forgetting keys of its own with a digest of their own,
// while a fifth only looks up keys nobody marks. Never a Duplicate for a
// key its goroutine has not marked (or forgot since), always with its own
// digest, never a Conflict; a key repeated in a batch is Duplicate after
// its first occurrence; the keys nobody marks stay New.
func TestMemModelConcurrentTinyStripe(t *testing.T) {
	ctx := context.Background()
	e := open(t, engine.Options{Tiers: engine.MemoryOnly, MemoryCapacity: 8, Stripes: 1})
	defer e.Close()
	const workers, perWorker, rounds = 4, 300, 150
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	stop := make(chan struct{})
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 9))
			marked := map[int]bool{}
			key := func(i int) []byte { return fmt.Appendf(nil, "w%d-%04d", w, i) }
			dig := func(i int) engine.Digest { return engine.DigestOf(key(i)) }
			for range rounds {
				n := 1 + r.IntN(120)
				idx := make([]int, n)
				ks := make([][]byte, n)
				ds := make([]engine.Digest, n)
				for j := range idx {
					idx[j] = r.IntN(perWorker)
					ks[j], ds[j] = key(idx[j]), dig(idx[j])
				}
				switch r.IntN(4) {
				case 0, 1:
					out := make([]engine.Outcome, n)
					if err := e.MarkBatch(ctx, ks, ds, out); err != nil {
						errs <- err
						return
					}
					first := map[int]bool{}
					for j, o := range out {
						i := idx[j]
						switch {
						case o == engine.Duplicate && !marked[i]:
							errs <- fmt.Errorf("worker %d: mark of %s never marked: Duplicate", w, ks[j])
							return
						case o == engine.New && first[i]:
							errs <- fmt.Errorf("worker %d: mark of %s repeated in the batch: New again", w, ks[j])
							return
						case o != engine.New && o != engine.Duplicate:
							errs <- fmt.Errorf("worker %d: mark of %s: %v", w, ks[j], o)
							return
						}
						first[i], marked[i] = true, true
					}
				case 2:
					infos := make([]engine.KeyInfo, n)
					if err := e.LookupBatch(ctx, ks, infos); err != nil {
						errs <- err
						return
					}
					for j, in := range infos {
						if in.Outcome == engine.Duplicate && (!marked[idx[j]] || in.Digest != ds[j]) {
							errs <- fmt.Errorf("worker %d: lookup of %s (marked %v): Duplicate with digest %x, want %x", w, ks[j], marked[idx[j]], in.Digest[:4], ds[j][:4])
							return
						}
						if in.Outcome != engine.Duplicate && in.Outcome != engine.New {
							errs <- fmt.Errorf("worker %d: lookup of %s: %v", w, ks[j], in.Outcome)
							return
						}
					}
				default:
					m := min(n, 6)
					infos := make([]engine.KeyInfo, m)
					if err := e.ForgetBatch(ctx, ks[:m], infos); err != nil {
						errs <- err
						return
					}
					for j, in := range infos {
						if in.Outcome == engine.Duplicate && (!marked[idx[j]] || in.Digest != ds[j]) {
							errs <- fmt.Errorf("worker %d: forget of %s (marked %v): Duplicate with digest %x", w, ks[j], marked[idx[j]], in.Digest[:4])
							return
						}
					}
					for j := range m {
						delete(marked, idx[j])
					}
				}
			}
		}()
	}
	var watched atomic.Int64
	watchErr := make(chan error, 1)
	go func() {
		ks := make([][]byte, 50)
		for i := range ks {
			ks[i] = fmt.Appendf(nil, "nobody-%02d", i)
		}
		infos := make([]engine.KeyInfo, len(ks))
		for {
			select {
			case <-stop:
				watchErr <- nil
				return
			default:
			}
			if err := e.LookupBatch(ctx, ks, infos); err != nil {
				watchErr <- err
				return
			}
			for i, in := range infos {
				if in.Outcome != engine.New {
					watchErr <- fmt.Errorf("key %s nobody marks: %v", ks[i], in.Outcome)
					return
				}
			}
			watched.Add(1)
		}
	}()
	wg.Wait()
	close(stop)
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if err := <-watchErr; err != nil {
		t.Error(err)
	}
	if s := e.Stats(); s.Memory.Claims != 0 || s.Memory.Entries > 8 {
		t.Fatalf("MemoryClaims %d MemoryEntries %d, want 0 and at most 8", s.Memory.Claims, s.Memory.Entries)
	}
	t.Logf("%d lookups of the unmarked keys", watched.Load())
}
