package tiertest

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/tier"
)

// Options are the hints a tier gives the suite: what it cannot be asked
// through tier.Exact, and which the caller vouches for.
type Options struct {
	// Partitioned says that the tier keeps each record in the partition
	// its Commit or Release names, answers that partition as
	// Answer.Partition, reads only the partitions a request's Oldest and
	// Mask name, and drops and scans by partition (Dropper, Scanner): a
	// tier whose retention the engine drives, such as tier/pebble. The
	// suite writes in partitions 64 to 127 and names them with Oldest 64
	// (a multiple of 64, so that both readings of Mask agree, see
	// tier.Request). Unpartitioned tiers must answer Partition -1.
	Partitioned bool
	// MaxAttempts is the attempt limit the tier was opened with
	// (ClaimsInStore): the checks of counted releases, lease expiries and
	// Poisoned run only when it is positive. Zero means the tier counts
	// nothing. At least 2 when positive.
	MaxAttempts int
	// IgnoresWindow says that the tier keeps every commit for its own
	// window whatever Request.Window says, although it expires keys itself
	// (an unpartitioned tier): the engine must then refuse namespaces with
	// their own window over it. Without it, an unpartitioned tier must
	// honour a Request.Window shorter than its window.
	IgnoresWindow bool
	// Reopen opens again, as a new process would, the data of a tier the
	// suite has just closed (the same directory, prefix or table, with the
	// same options); required: an exact tier is durable.
	Reopen func(t *testing.T, closed tier.Exact) tier.Exact
}

// Open returns a new, empty tier for one check (its own directory,
// prefix or table), registering on t whatever must be removed after it.
// The suite closes the tier itself before the check ends.
type Open func(t *testing.T) tier.Exact

// Run runs the contract's checks, each a subtest with a tier of its own
// from open, grouped as Exact (every tier), ClaimsInEngine or
// ClaimsInStore (the tier's own semantics), and one group per optional
// interface the tier implements. Checks of an optional interface the tier
// does not implement, or of a hint Options does not give, are not run;
// Run logs them with the reason.
func Run(t *testing.T, o Options, open Open) {
	t.Helper()
	if open == nil {
		t.Fatal("tiertest: open is nil")
	}
	if o.Reopen == nil {
		t.Fatal("tiertest: Options.Reopen is nil: an exact tier is durable, and the suite checks it by reopening")
	}
	if o.MaxAttempts < 0 || o.MaxAttempts == 1 || o.MaxAttempts > tier.MaxAttempts {
		t.Fatalf("tiertest: Options.MaxAttempts %d: zero, or in [2, %d]", o.MaxAttempts, tier.MaxAttempts)
	}
	// One tier tells what the tier is: where its claims live, which
	// optional interfaces it implements.
	x := open(t)
	if x == nil {
		t.Fatal("tiertest: open returned a nil tier")
	}
	in := describe(x, o)
	if err := x.Close(); err != nil {
		t.Errorf("Close of a new tier: %v", err)
	}
	if in.where != tier.ClaimsInEngine && in.where != tier.ClaimsInStore {
		t.Fatalf("Claims() = %v: want tier.ClaimsInEngine or tier.ClaimsInStore", in.where)
	}
	if in.where == tier.ClaimsInStore && o.Partitioned {
		t.Fatal("tiertest: Options.Partitioned is for tiers whose claims live in the engine: the partition checks write records as the engine writes them there, without claims")
	}
	t.Logf("tier %s: claims %s; implements %s", in.typ, whereName(in.where), strings.Join(in.implements(), ", "))
	var skipped []string
	for _, g := range groups() {
		var run []check
		var left []string
		reasons := map[string]bool{}
		for _, c := range g.checks {
			if why := c.skip(&in); why != "" {
				left = append(left, c.name+" ("+why+")")
				reasons[why] = true
				continue
			}
			run = append(run, c)
		}
		switch {
		case len(run) == 0 && len(reasons) == 1:
			for why := range reasons {
				skipped = append(skipped, g.name+" ("+why+")")
			}
		default:
			for _, l := range left {
				skipped = append(skipped, g.name+"/"+l)
			}
		}
		if len(run) == 0 {
			continue
		}
		t.Run(g.name, func(t *testing.T) {
			for _, c := range run {
				t.Run(c.name, func(t *testing.T) {
					h := newHarness(t, o, &in, open)
					defer h.close()
					c.run(h)
				})
			}
		})
	}
	if len(skipped) > 0 {
		t.Logf("not run (an interface the tier does not implement, or a hint it does not give): %s", strings.Join(skipped, "; "))
	}
}

// info is what the suite knows of the tier: where its claims live, which
// optional interfaces it implements, and the caller's hints.
type info struct {
	typ                                          string // the tier's Go type
	where                                        tier.Where
	o                                            Options
	commitWriter, extender, resultKeeper, keeps  bool
	looker, forgetter, advancer, marker, dropper bool
	scanner, latching                            bool
	// unmarker: a tier.Unmarker; partial: a tier.PartialMarker, canMark
	// its CanMark (true for a Marker that is not partial).
	unmarker, partial, canMark bool
}

func describe(x tier.Exact, o Options) info {
	in := info{typ: fmt.Sprintf("%T", x), where: x.Claims(), o: o}
	_, in.commitWriter = x.(tier.CommitWriter)
	_, in.extender = x.(tier.Extender)
	var rk tier.ResultKeeper
	rk, in.resultKeeper = x.(tier.ResultKeeper)
	in.keeps = in.resultKeeper && rk.KeepsResults()
	_, in.looker = x.(tier.Looker)
	_, in.forgetter = x.(tier.Forgetter)
	_, in.advancer = x.(tier.Advancer)
	_, in.marker = x.(tier.Marker)
	_, in.unmarker = x.(tier.Unmarker)
	var pm tier.PartialMarker
	pm, in.partial = x.(tier.PartialMarker)
	in.canMark = in.marker && (!in.partial || pm.CanMark())
	_, in.dropper = x.(tier.Dropper)
	_, in.scanner = x.(tier.Scanner)
	_, in.latching = x.(tier.Latching)
	return in
}

func (in *info) implements() []string {
	var names []string
	for _, n := range []struct {
		ok   bool
		name string
	}{
		{in.commitWriter, "CommitWriter"}, {in.extender, "Extender"}, {in.resultKeeper, fmt.Sprintf("ResultKeeper (keeps results: %v)", in.keeps)},
		{in.looker, "Looker"}, {in.forgetter, "Forgetter"}, {in.advancer, "Advancer"}, {in.marker, "Marker"},
		{in.partial, fmt.Sprintf("PartialMarker (can mark: %v)", in.canMark)}, {in.unmarker, "Unmarker"},
		{in.dropper, "Dropper"}, {in.scanner, "Scanner"}, {in.latching, "Latching"},
	} {
		if n.ok {
			names = append(names, n.name)
		}
	}
	if len(names) == 0 {
		return []string{"no optional interface"}
	}
	return names
}

func whereName(w tier.Where) string {
	switch w {
	case tier.ClaimsInEngine:
		return "in the engine"
	case tier.ClaimsInStore:
		return "in the store"
	}
	return fmt.Sprintf("Where(%d)", w)
}

// check is one promise of the contract.
type check struct {
	name string
	// skip returns why the check does not apply to the tier, "" when it
	// does.
	skip func(*info) string
	run  func(*harness)
}

type group struct {
	name   string
	checks []check
}

// groups lists every check, in the order they run.
func groups() []group {
	return []group{
		{"Exact", exactChecks()},
		{"ClaimsInEngine", engineChecks()},
		{"ClaimsInStore", storeChecks()},
		{"ResultKeeper", resultChecks()},
		{"CommitWriter", commitWriterChecks()},
		{"Extender", extenderChecks()},
		{"Looker", lookerChecks()},
		{"Forgetter", forgetterChecks()},
		{"Advancer", advancerChecks()},
		{"Marker", markerChecks()},
		{"Dropper", dropperChecks()},
		{"Scanner", scannerChecks()},
		{"Latching", latchingChecks()},
	}
}

// Conditions for check.skip.
func always(*info) string { return "" }

func inEngine(in *info) string {
	if in.where != tier.ClaimsInEngine {
		return "claims live in the store"
	}
	return ""
}

func inStore(in *info) string {
	if in.where != tier.ClaimsInStore {
		return "claims live in the engine"
	}
	return ""
}

func both(a, b func(*info) string) func(*info) string {
	return func(in *info) string {
		if why := a(in); why != "" {
			return why
		}
		return b(in)
	}
}

func counting(in *info) string {
	if in.o.MaxAttempts == 0 {
		return "Options.MaxAttempts is zero"
	}
	return ""
}

func partitioned(in *info) string {
	if !in.o.Partitioned {
		return "not Options.Partitioned"
	}
	return ""
}

func implements(name string, ok func(*info) bool) func(*info) string {
	return func(in *info) string {
		if !ok(in) {
			return "not a tier." + name
		}
		return ""
	}
}

// Partitions the suite writes in (see Options.Partitioned).
const (
	base = 64 // the Oldest of every request: a multiple of 64
	// Mask names every partition from base.
	everyPartition = ^uint64(0)
)

// Leases. long outlasts every check; short ends within one, and wait is
// how long the suite sleeps for a short lease (or a short Request.Window)
// to have ended, by the tier's clock too.
const (
	long  = 10 * time.Minute
	short = 150 * time.Millisecond
	wait  = 400 * time.Millisecond
)

// Poison fills every out before a call: an element still holding any of
// it afterwards was not answered.
var (
	poisonDigest = tier.Digest{0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee}
	poisonToken  = tier.Token{0xdd, 0xdd, 0xdd, 0xdd, 0xdd, 0xdd, 0xdd, 0xdd, 0xdd, 0xdd, 0xdd, 0xdd, 0xdd, 0xdd, 0xdd, 0xdd}
	poisonResult = []byte("tiertest: stale result")
)

const (
	poisonStatus    tier.Status = 200
	poisonPartition             = -99
	poisonAttempts              = 0xbeef
	poisonAt                    = -0x5eed
)

// Statuses each method may answer (tier/exact.go).
var (
	engineClaim = []tier.Status{tier.Absent, tier.Committed, tier.Released}
	storeClaim  = []tier.Status{tier.Acquired, tier.Held, tier.Committed, tier.Poisoned}
	looked      = []tier.Status{tier.Absent, tier.Held, tier.Committed, tier.Released, tier.Poisoned}
	advanced    = []tier.Status{tier.Acquired, tier.Committed, tier.Held}
	fenced      = []tier.Status{tier.OK, tier.Lost}
	written     = []tier.Status{tier.OK}
)

// RunInDirs runs the contract (Run) over a tier kept in a directory:
// open opens (or reopens) the tier in dir, registering on t its cleanup
// (Close is called again after the suite's own), each check gets a
// directory of its own, and Options.Reopen opens the directory of the
// tier it is given again.
func RunInDirs(t *testing.T, o Options, open func(t *testing.T, dir string) tier.Exact) {
	t.Helper()
	var mu sync.Mutex
	dirs := map[tier.Exact]string{} // the directory of each tier opened
	opened := func(t *testing.T, dir string) tier.Exact {
		t.Helper()
		x := open(t, dir)
		mu.Lock()
		dirs[x] = dir
		mu.Unlock()
		return x
	}
	o.Reopen = func(t *testing.T, closed tier.Exact) tier.Exact {
		mu.Lock()
		dir := dirs[closed]
		mu.Unlock()
		return opened(t, dir)
	}
	Run(t, o, func(t *testing.T) tier.Exact { return opened(t, t.TempDir()) })
}
