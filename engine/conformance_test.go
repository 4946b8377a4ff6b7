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
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/internal/faultfs"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/embedded"
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

type confConfig struct {
	name      string
	tiers     engine.Tiers
	capacity  int
	evicts    bool // capacity is below the key space
	snapshots bool // bloom-only: keep filters across clean restarts
	crashes   bool
	// faults injects read, write and sync errors (then recovers by a crash
	// and reopen), tampers with the Bloom snapshot between clean restarts
	// (damaged, or an older one put back), reopens with changed options
	// and tries a changed layout, which must be refused.
	faults bool
	// redis supplies a client for the Redis backend (tiers is Default; a
	// fresh key prefix per run). Redis expires leases and windows on its
	// own clock, so after each clock jump forward the test ages every key
	// of the run by the same step (ageRedis).
	redis func(t *testing.T) goredis.UniversalClient
	// postgres supplies a database for the PostgreSQL backend (a fresh
	// table per run; tiers is Default), aged like Redis after each clock
	// jump forward (agePostgres).
	postgres func(t *testing.T) *pgxpool.Pool
}

// shared reports a configuration whose claims live in a shared tier.
func (c confConfig) shared() bool { return c.redis != nil || c.postgres != nil }

// embedded reports the default configuration: memory + bloom + Pebble.
func (c confConfig) embedded() bool { return c.tiers == engine.Default && !c.shared() }

var confConfigs = []confConfig{
	{name: "memory", tiers: engine.MemoryOnly, capacity: 4096},
	{name: "memory-evicting", tiers: engine.MemoryOnly, capacity: 16, evicts: true},
	{name: "bloom", tiers: engine.BloomOnly, snapshots: true},
	{name: "default", tiers: engine.Default, capacity: 4096, crashes: true},
	{name: "default-small-cache", tiers: engine.Default, capacity: 16, crashes: true},
	{name: "default-faults", tiers: engine.Default, capacity: 16, crashes: true, faults: true},
}

func TestConformance(t *testing.T) {
	for _, cfg := range confConfigs {
		t.Run(cfg.name, func(t *testing.T) {
			runConformanceSeeds(t, cfg)
		})
	}
}

// runConformanceSeeds runs four seeds of cfg side by side (their fsyncs
// overlap). Under -race each runs 500 operations, for the races; CI runs
// the full 1500 in its pass without -race.
func runConformanceSeeds(t *testing.T, cfg confConfig) {
	ops := 1500
	if raceEnabled() {
		ops = 500
	}
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			t.Parallel()
			runConformance(t, cfg, seed, ops)
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
	uncertain  bool // its commit failed with ErrStorage: durable or not
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
	if s != nil && s.uncertain {
		set[engine.New], set[engine.Duplicate] = true, true
	}
	return set
}

// observe settles an uncertain key by the engine's first answer for it.
func (m *model) observe(k mkey, o engine.Outcome, now int64) {
	s := m.keys[k]
	if s == nil || !s.uncertain {
		return
	}
	s.uncertain = false
	s.committed = o == engine.Duplicate || o == engine.Conflict
}

func runConformance(t *testing.T, cfg confConfig, seed uint64, ops int) {
	rng := rand.New(rand.NewPCG(seed, 99))
	clock := newClock()
	parts, _ := tier.NewPartitions(cWindow, cPartition)
	mem := newCrashFS()
	var inj faultfs.Fault
	wrap := func(m crashFS) vfs.FS {
		if cfg.faults {
			return faultfs.Wrap(m, &inj)
		}
		return m
	}
	opts := engine.Options{
		Tiers: cfg.tiers, Window: cWindow, Partition: cPartition, Lease: cLease,
		MemoryCapacity: cfg.capacity, Stripes: 4, ExpectedKeys: 1000, FalsePositive: 0.01,
		Clock: clock, Backend: &embedded.Backend{FS: wrap(mem)},
	}
	var oldSnapshot []byte // a snapshot of an earlier clean close, to put back later
	faults := 0            // injected faults that failed a call
	if cfg.embedded() || cfg.snapshots {
		setDir(&opts, "db")
	}
	if cfg.tiers == engine.MemoryOnly || cfg.shared() {
		opts.Backend = nil // memory-only has none; a shared tier's is set below
	}
	var pool *pgxpool.Pool
	var table string                   // the PostgreSQL backend's table
	var client goredis.UniversalClient // the Redis backend's client
	var prefix string                  // and key prefix
	if cfg.postgres != nil {
		pool = cfg.postgres(t)
		table = fmt.Sprintf("conf_%d_%d", seed, time.Now().UnixNano())
		opts.Backend = pgBackend(pool, table)
		t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	}
	if cfg.redis != nil {
		client = cfg.redis(t)
		prefix = fmt.Sprintf("conf-%s-%d-%d:", cfg.name, seed, time.Now().UnixNano())
		opts.Backend = redisBackend(client, prefix)
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
				m.observe(k, o, now)
				if o == engine.New {
					s := m.state(k)
					s.committed, s.commitAt, s.commitPart, s.digest = true, now, m.parts.Of(now), engine.Digest{}
					s.claimed = false
				}
			}
		case r < 88: // time passes
			steps := []time.Duration{time.Second, 10 * time.Second, cLease + time.Second, cPartition, cWindow, cWindow + cPartition + time.Second, -30 * time.Minute, -cWindow - 2*cPartition}
			step := steps[rng.IntN(len(steps))]
			if cfg.shared() {
				if step < 0 {
					// A shared tier keeps its own time, which never steps
					// back with a host's clock; steps back are exercised
					// by the other configurations.
					continue
				}
				// It expires leases and windows on its own clock: age
				// every key of this run by the same step.
				var err error
				if cfg.redis != nil {
					err = ageRedis(ctx, client, prefix, step)
				} else {
					err = agePostgres(ctx, pool, table, step)
				}
				if err != nil {
					fail(op, "ageing the shared tier: %v", err)
				}
			}
			clock.Add(step)
		case r < 94: // clean restart
			if err := e.Close(); err != nil {
				fail(op, "Close: %v", err)
			}
			if cfg.embedded() || cfg.snapshots {
				m.persisted = m.hw // with the snapshot, bloom-only keeps its clock too
			}
			if cfg.faults {
				const snap = "db/tierdedup-bloom.snapshot"
				cur := readFile(t, mem, snap)
				switch rng.IntN(4) {
				case 0: // damaged
					if len(cur) > 0 {
						cur[rng.IntN(len(cur))] ^= 0x10
						writeFile(t, mem, snap, cur)
					}
				case 1: // an older snapshot of this store put back
					if oldSnapshot != nil {
						writeFile(t, mem, snap, oldSnapshot)
					}
				case 2: // other Bloom parameters and cache size: the snapshot cannot be used
					opts.ExpectedKeys = 1000 + 500*rng.IntN(3)
					opts.MemoryCapacity = []int{16, 64, 4096}[rng.IntN(3)]
				case 3: // a changed layout is refused, and changes nothing
					bad := opts
					bad.Partition, bad.Logger = 2*cPartition, quiet
					if _, err := engine.Open(&bad); !errors.Is(err, engine.ErrLayout) {
						fail(op, "Open with another partition length: %v, want ErrLayout", err)
					}
				}
				if cur != nil {
					oldSnapshot = cur
				}
			}
			e = open(t, opts)
			m.restart(clock.Now().UnixNano(), cfg.embedded() || cfg.snapshots || cfg.shared())
			outstanding = reclaimNamespaces(t, e, namespaces, outstanding)
		default: // crash: abandon the engine, reopen what was synced
			if !cfg.crashes {
				continue
			}
			if cfg.faults && rng.IntN(2) == 0 {
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
				gate := fsOf(opts).(*faultfs.FS).MoveGate()
				gate.Lock()
				inj.ArmNth(oneFault[rng.IntN(3)], int64(1+rng.IntN(3)))
				broken := faultRound(t, op, e, namespaces, m, clock, rng, randKey)
				inj.Disarm()
				gate.Unlock()
				// A fault that hit Pebble's background work (a flush or
				// compaction) may have failed the store after the round:
				// reopen then too.
				if !broken && inj.Hits() == 0 {
					continue
				}
				faults++
			}
			crashed := mem.CrashClone(vfs.CrashCloneCfg{})
			old := e
			o := opts
			setFS(&o, wrap(crashed))
			e = open(t, o)
			old.Close() // writes only to the abandoned filesystem
			mem = crashed
			setFS(&opts, fsOf(o))
			m.restart(clock.Now().UnixNano(), true)
			outstanding = reclaimNamespaces(t, e, namespaces, outstanding)
			if st := e.Stats(); st.Bloom.Mode == "" {
				fail(op, "no bloom mode after crash")
			}
		}
	}
	if cfg.faults && faults == 0 {
		t.Fatal("no injected fault failed a call: the fault rounds test nothing")
	}
	st := e.Stats()
	t.Logf("faults %d claims %d new %d dup %d inflight %d conflict %d commits %d releases %d expiries %d lost %d bloom-fp %d store-reads %d mode %s",
		faults, st.Calls.Claims, st.Calls.New, st.Calls.Duplicates, st.Calls.InFlight, st.Calls.Conflicts, st.Calls.Commits, st.Calls.Releases, st.Calls.LeaseExpiries, st.Calls.LeaseLost, st.Bloom.FalsePositives, st.Store.Reads, st.Bloom.Mode)
}

// restart mirrors a reopen: claims are void; committed keys survive where
// the configuration keeps them; time resumes from the persisted clock.
func (m *model) restart(clock int64, keeps bool) {
	for k, s := range m.keys {
		// Claims live in this process, or in Redis until their lease ends:
		// there a restarted consumer still sees them, and their old owners
		// (the test's stale claims) can no longer commit.
		s.claimed = s.claimed && m.cfg.shared()
		s.owner = -1
		if !keeps {
			delete(m.keys, k)
		}
	}
	if m.cfg.embedded() || m.cfg.snapshots {
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

// oneFault are the operations a storage fault of the conformance run
// fails, one of them (the n-th after it is armed): an SST read, a WAL
// write or a WAL sync.
var oneFault = []faultfs.Match{faultfs.SSTReads, faultfs.WALWrites, faultfs.WALSyncs}

// faultRound claims a batch and commits its New claims while a fault is
// armed. It checks each answer against the model, marks the keys of a
// failed commit uncertain, and reports whether the engine failed (then it
// must refuse every later claim until reopened).
func faultRound(t *testing.T, op int, e *engine.Engine, namespaces []*engine.Namespace, m *model, clock *fakeClock, rng *rand.Rand, randKey func() string) bool {
	t.Helper()
	ctx := context.Background()
	ns := rng.IntN(2)
	keys := make([][]byte, 1+rng.IntN(8))
	for i := range keys {
		keys[i] = []byte(randKey())
	}
	out := make([]engine.Claim, len(keys))
	err := namespaces[ns].ClaimBatch(ctx, keys, nil, out)
	now := m.tick(clock.Now().UnixNano())
	if err != nil {
		if !errors.Is(err, engine.ErrStorage) {
			t.Fatalf("op %d: claim under a fault: %v, want ErrStorage", op, err)
		}
	} else {
		for i, c := range out {
			k := mkey{ns, string(keys[i])}
			if want := m.allowed(k, engine.Digest{}, now); !want[c.Outcome] {
				t.Fatalf("op %d: claim %v under a fault = %v, model allows %v", op, k, c.Outcome, want)
			}
			m.observe(k, c.Outcome, now)
			if c.Outcome == engine.New {
				m.nextID++
				s := m.state(k)
				s.claimed, s.owner, s.until = true, m.nextID, c.LeaseUntil
			}
		}
		err = e.CommitBatch(ctx, out, nil)
		now = m.tick(clock.Now().UnixNano())
		if err != nil && !errors.Is(err, engine.ErrStorage) {
			t.Fatalf("op %d: commit under a fault: %v, want ErrStorage", op, err)
		}
		for i, c := range out {
			if c.Outcome != engine.New {
				continue
			}
			s := m.state(mkey{ns, string(keys[i])})
			s.claimed = false
			s.committed, s.commitAt, s.commitPart, s.digest = true, now, m.parts.Of(now), engine.Digest{}
			s.uncertain = err != nil
		}
	}
	if err == nil {
		return false
	}
	if c, err := e.Claim(ctx, []byte("never-claimed")); !errors.Is(err, engine.ErrStorage) || c.Outcome == engine.New {
		t.Fatalf("op %d: after a storage failure a claim = %v, %v; want ErrStorage", op, c.Outcome, err)
	}
	return true
}

// ageRedis makes Redis's clock follow a jump of the test's clock: every key
// under prefix whose TTL is at most d is deleted, the others' TTLs shrink
// by d. Keys without a TTL (the prefix's layout record) are left alone.
func ageRedis(ctx context.Context, c goredis.UniversalClient, prefix string, d time.Duration) error {
	age := func(ctx context.Context, c goredis.Cmdable) error {
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			k := iter.Val()
			ttl, err := c.PTTL(ctx, k).Result()
			switch {
			case err != nil:
				return err
			case ttl < 0:
			case ttl <= d:
				err = c.Del(ctx, k).Err()
			default:
				err = c.PExpire(ctx, k, ttl-d).Err()
			}
			if err != nil {
				return err
			}
		}
		return iter.Err()
	}
	if cc, ok := c.(*goredis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, m *goredis.Client) error { return age(ctx, m) })
	}
	return age(ctx, c)
}

// agePostgres makes the table's clock follow a jump of the test's clock:
// every lease end and expiry of the run comes d closer.
func agePostgres(ctx context.Context, p *pgxpool.Pool, table string, d time.Duration) error {
	ms := d.Milliseconds()
	for try := 0; ; try++ {
		// The store's background sweep deletes rows while this updates
		// all of them: one of the two may be chosen as a deadlock victim.
		_, err := p.Exec(ctx, fmt.Sprintf("UPDATE %s SET lease_until = CASE WHEN lease_until > 0 THEN lease_until - $1 ELSE 0 END, expires = expires - $1", table), ms)
		var pe *pgconn.PgError
		if err == nil || try == 5 || !errors.As(err, &pe) || pe.Code != "40P01" {
			return err
		}
	}
}

var readFile = enginetest.ReadFile

var writeFile = enginetest.WriteFile
