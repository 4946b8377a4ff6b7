package enginetest

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/faultfs"
	"github.com/tierdedup/tierdedup/tier"
)

// The conformance suite's reference model: what each key may answer, by
// configuration, from what the run did to it.

type mkey struct {
	ns  int
	key string
}

type mstate struct {
	committed bool
	commitAt  int64
	digest    engine.Digest
	claimed   bool
	owner     int // id of the claim that holds it
	until     int64
	uncertain bool // its commit failed with ErrStorage: durable or not
}

type held struct {
	id     int
	k      mkey
	claim  engine.Claim
	digest engine.Digest
}

type model struct {
	cfg       ConformanceConfig
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
	if s != nil && s.committed && m.cfg.Config.Tiers != engine.BloomOnly && Conflicts(d, s.digest) {
		dup = engine.Conflict
	}
	ret := Retention{Parts: m.parts, Window: cWindow}
	var set outcomes
	switch {
	case s == nil || !s.committed || ret.Gone(s.commitAt, now):
		set = outcomes{engine.New: true}
	case ret.Held(s.commitAt, now):
		set = outcomes{dup: true}
	default:
		set = outcomes{engine.New: true, dup: true}
	}
	if m.mayForget && set[dup] {
		set[engine.New] = true
	}
	if m.cfg.Config.Tiers == engine.BloomOnly {
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

// restart mirrors a reopen: claims are void; committed keys survive where
// the configuration keeps them; time resumes from the persisted clock.
func (m *model) restart(clock int64, keeps bool) {
	for k, s := range m.keys {
		// Claims live in this process, or in Redis until their lease ends:
		// there a restarted consumer still sees them, and their old owners
		// (the test's stale claims) can no longer commit.
		s.claimed = s.claimed && m.cfg.Config.Shared
		s.owner = -1
		if !keeps {
			delete(m.keys, k)
		}
	}
	if m.cfg.keepsClock() {
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
func faultRound(t *testing.T, op int, e *engine.Engine, namespaces []*engine.Namespace, m *model, clock *Clock, rng *rand.Rand, randKey func() string) bool {
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
			s.committed, s.commitAt, s.digest = true, now, engine.Digest{}
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
