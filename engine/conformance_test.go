package engine_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
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
//   - the default configuration is exact.
//
// Between Window and Window+Partition after its commit a key may be either
// (retention drops whole partitions); the model accepts both there and
// follows the engine's answer.

const (
	cWindow    = 4 * time.Hour
	cPartition = time.Hour
	cLease     = time.Minute
)

type confConfig struct {
	name      string
	tiers     engine.Tiers
	capacity  int
	evicts    bool // capacity is below the key space
	snapshots bool // bloom-only: keep filters across clean restarts
	crashes   bool
	// redis supplies a client for Tiers: Redis (a fresh key prefix per
	// run). Redis expires leases and windows on its own clock, so these
	// runs make no clock jumps.
	redis func(t *testing.T) goredis.UniversalClient
}

var confConfigs = []confConfig{
	{name: "memory", tiers: engine.MemoryOnly, capacity: 4096},
	{name: "memory-evicting", tiers: engine.MemoryOnly, capacity: 16, evicts: true},
	{name: "bloom", tiers: engine.BloomOnly, snapshots: true},
	{name: "default", tiers: engine.Default, capacity: 4096, crashes: true},
	{name: "default-small-cache", tiers: engine.Default, capacity: 16, crashes: true},
}

func TestConformance(t *testing.T) {
	for _, cfg := range confConfigs {
		t.Run(cfg.name, func(t *testing.T) {
			runConformanceSeeds(t, cfg)
		})
	}
}

func runConformanceSeeds(t *testing.T, cfg confConfig) {
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			runConformance(t, cfg, seed, 1500)
		})
	}
}

type mkey struct {
	ns  int
	key string
}

type mstate struct {
	committed  bool
	commitAt   int64
	commitPart int64
	digest     engine.Digest
	claimed    bool
	owner      int // id of the claim that holds it
	until      int64
}

type held struct {
	id     int
	k      mkey
	claim  engine.Claim
	digest engine.Digest
}

type model struct {
	cfg       confConfig
	parts     tier.Partitions
	keys      map[mkey]*mstate
	hw        int64 // the engine's time: highest clock reading
	current   int64
	persisted int64 // high-water clock as last written to the store
	nextID    int
	mayForget bool
}

func (m *model) state(k mkey) *mstate {
	s := m.keys[k]
	if s == nil {
		s = &mstate{}
		m.keys[k] = s
	}
	return s
}

// tick mirrors Engine.now: time never runs backwards, and a new partition
// persists the clock (in the durable configuration).
func (m *model) tick(clock int64) int64 {
	m.hw = max(m.hw, clock)
	if p := m.parts.Of(m.hw); p > m.current {
		m.current = p
		m.persisted = m.hw
	}
	return m.hw
}

type outcomes map[engine.Outcome]bool

func (m *model) allowed(k mkey, d engine.Digest, now int64) outcomes {
	s := m.keys[k]
	if s != nil && s.claimed && now < s.until {
		return outcomes{engine.InFlight: true}
	}
	dup := engine.Duplicate
	if s != nil && s.committed && m.cfg.tiers != engine.BloomOnly &&
		d != (engine.Digest{}) && s.digest != (engine.Digest{}) && d != s.digest {
		dup = engine.Conflict
	}
	var set outcomes
	switch {
	case s == nil || !s.committed || now >= m.parts.Expiry(s.commitPart):
		set = outcomes{engine.New: true}
	case now < s.commitAt+int64(cWindow):
		set = outcomes{dup: true}
	default:
		set = outcomes{engine.New: true, dup: true}
	}
	if m.mayForget && set[dup] {
		set[engine.New] = true
	}
	if m.cfg.tiers == engine.BloomOnly {
		set[engine.Duplicate] = true
	}
	return set
}

func runConformance(t *testing.T, cfg confConfig, seed uint64, ops int) {
	rng := rand.New(rand.NewPCG(seed, 99))
	clock := newClock()
	parts, _ := tier.NewPartitions(cWindow, cPartition)
	fs := vfs.NewCrashableMem()
	opts := engine.Options{
		Tiers: cfg.tiers, Window: cWindow, Partition: cPartition, Lease: cLease,
		MemoryCapacity: cfg.capacity, Stripes: 4, ExpectedKeys: 1000, FalsePositive: 0.01,
		Clock: clock, FS: fs,
	}
	if cfg.tiers == engine.Default || cfg.snapshots {
		opts.Dir = "db"
	}
	if cfg.tiers == engine.MemoryOnly || cfg.tiers == engine.Redis {
		opts.FS = nil
	}
	if cfg.redis != nil {
		opts.Redis = cfg.redis(t)
		opts.RedisPrefix = fmt.Sprintf("conf-%s-%d-%d:", cfg.name, seed, time.Now().UnixNano())
	}
	e := open(t, opts)
	defer func() { e.Close() }()
	m := &model{cfg: cfg, parts: parts, keys: map[mkey]*mstate{}, mayForget: cfg.evicts && cfg.tiers == engine.MemoryOnly}
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
					s.committed, s.commitAt, s.commitPart, s.digest = true, now, m.parts.Of(now), h.digest
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
				if o == engine.New {
					s := m.state(k)
					s.committed, s.commitAt, s.commitPart, s.digest = true, now, m.parts.Of(now), engine.Digest{}
					s.claimed = false
				}
			}
		case r < 88: // time passes
			if cfg.redis != nil {
				continue
			}
			steps := []time.Duration{time.Second, 10 * time.Second, cLease + time.Second, cPartition, cWindow, cWindow + cPartition + time.Second, -30 * time.Minute}
			clock.Add(steps[rng.IntN(len(steps))])
		case r < 94: // clean restart
			if err := e.Close(); err != nil {
				fail(op, "Close: %v", err)
			}
			if cfg.tiers == engine.Default || cfg.snapshots {
				m.persisted = m.hw // with the snapshot, bloom-only keeps its clock too
			}
			e = open(t, opts)
			m.restart(clock.Now().UnixNano(), cfg.tiers == engine.Default || cfg.snapshots || cfg.redis != nil)
			outstanding = reclaimNamespaces(t, e, namespaces, outstanding)
		default: // crash: abandon the engine, reopen what was synced
			if !cfg.crashes {
				continue
			}
			crashed := fs.CrashClone(vfs.CrashCloneCfg{})
			old := e
			o := opts
			o.FS = crashed
			e = open(t, o)
			old.Close() // writes only to the abandoned filesystem
			fs = crashed
			opts.FS = crashed
			m.restart(clock.Now().UnixNano(), true)
			outstanding = reclaimNamespaces(t, e, namespaces, outstanding)
			if st := e.Stats(); st.BloomMode == "" {
				fail(op, "no bloom mode after crash")
			}
		}
	}
	st := e.Stats()
	t.Logf("claims %d new %d dup %d inflight %d conflict %d commits %d releases %d expiries %d lost %d bloom-fp %d store-reads %d mode %s",
		st.Claims, st.New, st.Duplicates, st.InFlight, st.Conflicts, st.Commits, st.Releases, st.LeaseExpiries, st.LeaseLost, st.BloomFalsePositives, st.StoreReads, st.BloomMode)
}

// restart mirrors a reopen: claims are void; committed keys survive where
// the configuration keeps them; time resumes from the persisted clock.
func (m *model) restart(clock int64, keeps bool) {
	for k, s := range m.keys {
		// Claims live in this process, or in Redis until their lease ends:
		// there a restarted consumer still sees them, and their old owners
		// (the test's stale claims) can no longer commit.
		s.claimed = s.claimed && m.cfg.redis != nil
		s.owner = -1
		if !keeps {
			delete(m.keys, k)
		}
	}
	if m.cfg.tiers == engine.Default || m.cfg.snapshots {
		m.hw = max(clock, m.persisted)
	} else {
		m.hw = clock
	}
	m.current = m.parts.Of(m.hw)
	m.persisted = m.hw
}

// reclaimNamespaces points the test's namespace handles at the new engine.
// Claims from before the restart are kept: committing them must fail.
func reclaimNamespaces(t *testing.T, e *engine.Engine, ns []*engine.Namespace, held []held) []held {
	t.Helper()
	for i := range ns {
		var err error
		if ns[i], err = e.Namespace(ns[i].Name()); err != nil {
			t.Fatal(err)
		}
	}
	return held
}

func dupInBatch(pick []held) bool {
	seen := map[int]bool{}
	for _, h := range pick {
		if seen[h.id] {
			return true
		}
		seen[h.id] = true
	}
	return false
}
