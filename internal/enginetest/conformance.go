package enginetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/faultfs"
	"github.com/tierdedup/tierdedup/tier"
)

// The conformance suite drives every configuration with the same random
// operations (batched claims with repeated keys and digests, commits and
// releases including stale ones, one-shot marks, clock jumps past leases,
// partitions and the window, clock steps back, clean restarts and, for the
// durable configuration, crashes) and checks every answer against a
// reference model. The model knows which errors each configuration may make
// and allows no others:
//
//   - memory-only may forget a committed key after a restart, or after
//     eviction when its capacity is smaller than the key space;
//   - bloom-only may report a new key as a duplicate (a false positive) and
//     cannot tell a conflict from a duplicate;
//   - the default configuration is exact; after an injected storage
//     fault it answers ErrStorage (never New) until reopened, and a key
//     whose commit failed may be either afterwards, as the engine finds it.
//
// Between Window and Window+Partition after its commit a key may be either
// (retention drops whole partitions); the model accepts both there and
// follows the engine's answer.

const (
	cWindow    = 4 * time.Hour
	cPartition = time.Hour
	cLease     = time.Minute
)

// ConformanceConfig is how the conformance suite drives one of the
// configurations (Configs): the engine's own (ConformanceConfigs) in
// package engine's tests, each shared tier's beside it.
type ConformanceConfig struct {
	Name     string
	Config   Config
	Capacity int
	Evicts   bool // capacity is below the key space
	Crashes  bool
	// Faults injects read, write and sync errors (then recovers by a crash
	// and reopen), tampers with the Bloom snapshot between clean restarts
	// (damaged, or an older one put back), reopens with changed options
	// and tries a changed layout, which must be refused.
	Faults bool
}

// keepsClock: a local configuration that persists its clock (the
// embedded store; Bloom-only with its snapshot).
func (c ConformanceConfig) keepsClock() bool { return c.Config.Durable && !c.Config.Shared }

// ConformanceConfigs are the engine's own configurations.
var ConformanceConfigs = []ConformanceConfig{
	{Name: "memory", Config: Named("memory"), Capacity: 4096},
	{Name: "memory-evicting", Config: Named("memory"), Capacity: 16, Evicts: true},
	{Name: "bloom", Config: Named("bloom-dir")},
	{Name: "default", Config: Named("default"), Capacity: 4096, Crashes: true},
	{Name: "default-small-cache", Config: Named("default"), Capacity: 16, Crashes: true},
	{Name: "default-faults", Config: Named("default"), Capacity: 16, Crashes: true, Faults: true},
}

// Conformance runs four seeds of cfg side by side (their fsyncs overlap).
// Under -race each runs 500 operations, for the races; CI runs the full
// 1500 in its pass without -race.
func Conformance(t *testing.T, cfg ConformanceConfig) {
	ops := 1500
	if RaceEnabled() {
		ops = 500
	}
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			t.Parallel()
			runConformance(t, cfg, seed, ops)
		})
	}
}

func runConformance(t *testing.T, cfg ConformanceConfig, seed uint64, ops int) {
	rng := rand.New(rand.NewPCG(seed, 99))
	clock := NewClock()
	parts, _ := tier.NewPartitions(cWindow, cPartition)
	mem := NewCrashFS()
	var inj faultfs.Fault
	wrap := func(m CrashFS) vfs.FS {
		if cfg.Faults {
			return faultfs.Wrap(m, &inj)
		}
		return m
	}
	store := cfg.Config.New(t, fmt.Sprintf("conf_%s_%d", cfg.Name, seed))
	opts := store.Wrapped(engine.Options{
		Window: cWindow, Partition: cPartition, Lease: cLease,
		MemoryCapacity: cfg.Capacity, Stripes: 4, ExpectedKeys: 1000, FalsePositive: 0.01,
		Clock: clock,
	}, Wrap{FS: wrap(mem)})
	var oldSnapshot []byte // a snapshot of an earlier clean close, to put back later
	faults := 0            // injected faults that failed a call
	age := store.Age       // the shared tier's, for clock jumps
	e := Open(t, opts)
	defer func() { e.Close() }()
	m := &model{cfg: cfg, parts: parts, keys: map[mkey]*mstate{}, mayForget: cfg.Evicts && cfg.Config.Tiers == engine.MemoryOnly}
	m.tick(clock.Now().UnixNano())
	m.persisted = m.hw

	ctx := context.Background()
	namespaces := make([]*engine.Namespace, 2)
	for i := range namespaces {
		namespaces[i], _ = e.Namespace([]string{"", "biz"}[i])
	}
	var outstanding []held
	digests := []engine.Digest{{}, engine.DigestOf([]byte("a")), engine.DigestOf([]byte("b"))}
	randKey := func() string { return fmt.Sprintf("key-%d", rng.IntN(40)) }
	fail := func(op int, format string, args ...any) {
		t.Helper()
		t.Fatalf("op %d: "+format, append([]any{op}, args...)...)
	}

	var heldGate *sync.RWMutex // a move gate held across a faulted engine's Close
	for op := 0; op < ops; op++ {
		if testing.Verbose() && os.Getenv("CONFORMANCE_TRACE") != "" {
			t.Logf("op %d clock %d hw %d", op, clock.Now().UnixNano(), m.hw)
			for k, s := range m.keys {
				if k.key == os.Getenv("CONFORMANCE_TRACE") {
					t.Logf("   %v %+v", k, *s)
				}
			}
		}
		switch r := rng.IntN(100); {
		case r < 35: // claim a batch
			ns := rng.IntN(2)
			n := 1 + rng.IntN(8)
			keys := make([][]byte, n)
			ds := make([]engine.Digest, n)
			for i := range keys {
				keys[i] = []byte(randKey())
				ds[i] = digests[rng.IntN(len(digests))]
			}
			out := make([]engine.Claim, n)
			if err := namespaces[ns].ClaimBatch(ctx, keys, ds, out); err != nil {
				fail(op, "ClaimBatch: %v", err)
			}
			now := m.tick(clock.Now().UnixNano())
			if os.Getenv("CONFORMANCE_TRACE") != "" {
				for i, c := range out {
					t.Logf("   claim ns=%d %s %v", ns, keys[i], c.Outcome)
				}
			}
			for i, c := range out {
				k := mkey{ns, string(keys[i])}
				if want := m.allowed(k, ds[i], now); !want[c.Outcome] {
					fail(op, "claim %v = %v, model allows %v (state %+v, now %d)", k, c.Outcome, want, m.keys[k], now)
				}
				m.observe(k, c.Outcome, now)
				if c.Outcome == engine.New {
					if c.LeaseUntil != now+int64(cLease) {
						fail(op, "lease until %d, want %d", c.LeaseUntil, now+int64(cLease))
					}
					m.nextID++
					s := m.state(k)
					s.claimed, s.owner, s.until = true, m.nextID, c.LeaseUntil
					outstanding = append(outstanding, held{id: m.nextID, k: k, claim: c, digest: ds[i]})
				}
			}
		case r < 55 && len(outstanding) > 0: // commit or release some held claims, stale ones included
			n := 1 + rng.IntN(min(4, len(outstanding)))
			pick := make([]held, n)
			claims := make([]engine.Claim, n)
			for i := range pick {
				pick[i] = outstanding[rng.IntN(len(outstanding))]
				claims[i] = pick[i].claim
			}
			if dupInBatch(pick) {
				continue // the same claim twice in one batch has no single right answer
			}
			errs := make([]error, n)
			commit := rng.IntN(3) != 0
			var err error
			now := m.hw
			if commit {
				err = e.CommitBatch(ctx, claims, errs)
				now = m.tick(clock.Now().UnixNano())
			} else {
				err = e.ReleaseBatch(ctx, claims, errs)
				now = max(m.hw, clock.Now().UnixNano())
			}
			if os.Getenv("CONFORMANCE_TRACE") != "" {
				for i, h := range pick {
					t.Logf("   commit=%v %v id=%d err=%v", commit, h.k, h.id, errs[i])
				}
			}
			anyLost := false
			for i, h := range pick {
				s := m.keys[h.k]
				owns := s != nil && s.claimed && s.owner == h.id && now < s.until
				if owns != (errs[i] == nil) {
					fail(op, "commit=%v of claim %d on %v: err %v, model owns=%v (%+v, now %d)", commit, h.id, h.k, errs[i], owns, s, now)
				}
				if !owns {
					anyLost = true
					if !errors.Is(errs[i], engine.ErrLeaseLost) {
						fail(op, "stale claim error %v, want ErrLeaseLost", errs[i])
					}
					continue
				}
				s.claimed = false
				if commit {
					s.committed, s.commitAt, s.digest = true, now, h.digest
				}
			}
			if anyLost != errors.Is(err, engine.ErrLeaseLost) {
				fail(op, "batch error %v, any lost %v", err, anyLost)
			}
		case r < 65: // one-shot marks
			ns := rng.IntN(2)
			n := 1 + rng.IntN(6)
			keys := make([][]byte, n)
			for i := range keys {
				keys[i] = []byte(randKey())
			}
			out := make([]engine.Outcome, n)
			if err := namespaces[ns].MarkBatch(ctx, keys, nil, out); err != nil {
				fail(op, "MarkBatch: %v", err)
			}
			now := m.tick(clock.Now().UnixNano())
			if os.Getenv("CONFORMANCE_TRACE") != "" {
				for i, o := range out {
					t.Logf("   mark ns=%d %s %v", ns, keys[i], o)
				}
			}
			for i, o := range out {
				k := mkey{ns, string(keys[i])}
				want := m.allowed(k, engine.Digest{}, now)
				if !want[o] {
					fail(op, "mark %v = %v, model allows %v (state %+v)", k, o, want, m.keys[k])
				}
				m.observe(k, o, now)
				if o == engine.New {
					s := m.state(k)
					s.committed, s.commitAt, s.digest = true, now, engine.Digest{}
					s.claimed = false
				}
			}
		case r < 88: // time passes
			steps := []time.Duration{time.Second, 10 * time.Second, cLease + time.Second, cPartition, cWindow, cWindow + cPartition + time.Second, -30 * time.Minute, -cWindow - 2*cPartition}
			step := steps[rng.IntN(len(steps))]
			if cfg.Config.Shared {
				if step < 0 {
					// A shared tier keeps its own time, which never steps
					// back with a host's clock; steps back are exercised
					// by the other configurations.
					continue
				}
				// It expires leases and windows on its own clock: age
				// every key of this run by the same step.
				err := age(ctx, step)
				if err != nil {
					fail(op, "ageing the shared tier: %v", err)
				}
			}
			clock.Add(step)
		case r < 94: // clean restart
			if err := e.Close(); err != nil {
				fail(op, "Close: %v", err)
			}
			if cfg.keepsClock() {
				m.persisted = m.hw // with the snapshot, bloom-only keeps its clock too
			}
			if cfg.Faults {
				const snap = "db/tierdedup-bloom.snapshot"
				cur := ReadFile(t, mem, snap)
				switch rng.IntN(4) {
				case 0: // damaged
					if len(cur) > 0 {
						cur[rng.IntN(len(cur))] ^= 0x10
						WriteFile(t, mem, snap, cur)
					}
				case 1: // an older snapshot of this store put back
					if oldSnapshot != nil {
						WriteFile(t, mem, snap, oldSnapshot)
					}
				case 2: // other Bloom parameters and cache size: the snapshot cannot be used
					opts.ExpectedKeys = 1000 + 500*rng.IntN(3)
					opts.MemoryCapacity = []int{16, 64, 4096}[rng.IntN(3)]
				case 3: // a changed layout is refused, and changes nothing
					bad := opts
					bad.Partition, bad.Logger = 2*cPartition, Quiet
					if _, err := engine.Open(&bad); !errors.Is(err, engine.ErrLayout) {
						fail(op, "Open with another partition length: %v, want ErrLayout", err)
					}
				}
				if cur != nil {
					oldSnapshot = cur
				}
			}
			e = Open(t, opts)
			m.restart(clock.Now().UnixNano(), cfg.Config.Durable)
			outstanding = reclaimNamespaces(t, e, namespaces, outstanding)
		default: // crash: abandon the engine, reopen what was synced
			if !cfg.Crashes {
				continue
			}
			if cfg.Faults && rng.IntN(2) == 0 {
				// A storage fault: the next read of an SST (after a
				// compaction), or write or sync of the WAL, fails during a
				// claim and commit. Every answer must be ErrStorage or
				// right; then the engine is reopened, as an operator would.
				if rng.IntN(2) == 0 {
					if err := e.Compact(ctx); err != nil {
						fail(op, "Compact: %v", err)
					}
				}
				// No partition move runs meanwhile (faultfs.FS.MoveGate).
				gate := BackendOf(&opts).FS.(*faultfs.FS).MoveGate()
				gate.Lock()
				inj.ArmNth(oneFault[rng.IntN(3)], int64(1+rng.IntN(3)))
				broken := faultRound(t, op, e, namespaces, m, clock, rng, randKey)
				inj.Disarm()
				// A fault that hit Pebble's background work (a flush or
				// compaction) may have failed the store after the round:
				// reopen then too.
				if !broken && inj.Hits() == 0 {
					gate.Unlock()
					continue
				}
				faults++
				// The gate stays held until the engine is closed: its WAL
				// may have failed without a call seeing it, and a move's
				// excise that rotates a failed WAL ends the process (Pebble
				// panics with its mutex released, and its deferred unlock
				// is fatal). Close ends the mover's wait for the gate.
				heldGate = gate
			}
			crashed := mem.CrashClone(vfs.CrashCloneCfg{})
			old := e
			o := opts
			SetFS(&o, wrap(crashed))
			e = Open(t, o)
			old.Close() // writes only to the abandoned filesystem
			if heldGate != nil {
				heldGate.Unlock()
				heldGate = nil
			}
			mem = crashed
			SetFS(&opts, BackendOf(&o).FS)
			m.restart(clock.Now().UnixNano(), true)
			outstanding = reclaimNamespaces(t, e, namespaces, outstanding)
			if st := e.Stats(); st.Bloom.Mode == "" {
				fail(op, "no bloom mode after crash")
			}
		}
	}
	if cfg.Faults && faults == 0 {
		t.Fatal("no injected fault failed a call: the fault rounds test nothing")
	}
	st := e.Stats()
	t.Logf("faults %d claims %d new %d dup %d inflight %d conflict %d commits %d releases %d expiries %d lost %d bloom-fp %d store-reads %d mode %s",
		faults, st.Calls.Claims, st.Calls.New, st.Calls.Duplicates, st.Calls.InFlight, st.Calls.Conflicts, st.Calls.Commits, st.Calls.Releases, st.Calls.LeaseExpiries, st.Calls.LeaseLost, st.Bloom.FalsePositives, st.Store.Reads, st.Bloom.Mode)
}
