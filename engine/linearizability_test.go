package engine_test

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier/pebble"
)

// TestLinearizability records concurrent histories of a few keys (clients
// claiming, committing, releasing, marking, looking up and forgetting them,
// advancing entities and using one-time tokens) in every configuration, and
// checks with porcupine that each history is linearizable with respect to
// the specification in linearizability_model_test.go: that there is one
// order of the calls, each taking effect at one instant between its call
// and its return, in which every answer is the one the documentation
// promises.
//
// The short run (CI) records about linOpsDefault calls per configuration;
// TIERDEDUP_LINEARIZE_OPS=N records N. TIERDEDUP_LINEARIZE_VIS asks for
// porcupine's visualization of a history that fails (see linVisualizeEnv).

// linOpsEnv scales the run: calls per configuration.
const linOpsEnv = "TIERDEDUP_LINEARIZE_OPS"

// linOpsDefault is the short run's calls per configuration.
const linOpsDefault = 2400

// linDigests are the payload digests claims and marks carry: none, A or B.
var linDigests = [3]engine.Digest{{}, engine.DigestOf([]byte("A")), engine.DigestOf([]byte("B"))}

// linEpoch is the fake clock's start.
var linEpoch = newClock().Now().UnixNano()

// linRestarts says when an engine is closed and reopened.
type linRestarts uint8

const (
	linNoRestart     linRestarts = iota
	linBetweenRounds             // every engine, while no call runs
	linMidRound                  // the first engine, while its clients' calls run
)

// linConfig is one configuration under test.
type linConfig struct {
	name string
	// on names the configuration in the one list (enginetest.Configs).
	on          string
	maxAttempts int
	// async commits through CommitAsync: a client goes on while its
	// commit is queued, and the commit returns when its done runs.
	async    bool
	restarts linRestarts
	// leaseJumps moves the fake clock by a third of the lease or past it
	// while clients run, so claims are taken over.
	leaseJumps bool
	advance    bool // Advance serves this configuration
	tokens     bool // so do tokens
	// durable: Options.DurableClaims (with MaxAttempts): a claim a
	// restart abandons counts as an attempt.
	durable bool
	// archive: the embedded store with a files archive; between rounds
	// the clock moves past the hot window and the engine reopens with a
	// window an hour longer, so the keys committed before answer from the
	// archive (or the store) as long as the archive window holds them.
	archive bool
	// stalls pauses the Redis server for 50–150 ms now and then while the
	// clients run; the clients' go-redis reads time out after 30 ms and
	// retry (late and repeated copies of every command), and the engine's
	// calls outlast the pauses.
	stalls bool
}

func (c linConfig) shared() bool { return enginetest.Named(c.on).Shared }

// tiers are the configuration's tiers.
func (c linConfig) tiers() engine.Tiers { return enginetest.Named(c.on).Tiers }

// engines is how many engines share the tier: two for Redis and
// PostgreSQL (the clients split across them), else one.
func (c linConfig) engines() int {
	if c.shared() {
		return 2
	}
	return 1
}

// rounds is how many rounds the calls are split into: three with restarts
// between them, else one.
func (c linConfig) rounds() int {
	if c.restarts == linBetweenRounds {
		return 3
	}
	return 1
}

var linConfigs = []linConfig{
	{name: "memory", on: "memory", maxAttempts: 3},
	{name: "memory-lease", on: "memory", maxAttempts: 3, leaseJumps: true},
	{name: "default", on: "default", advance: true, tokens: true},
	{name: "default-attempts", on: "default", maxAttempts: 3, advance: true},
	{name: "default-async", on: "default", maxAttempts: 3, async: true, advance: true, tokens: true},
	{name: "default-restarts", on: "default", maxAttempts: 3, restarts: linBetweenRounds, advance: true, tokens: true},
	{name: "default-lease", on: "default", leaseJumps: true, advance: true, tokens: true},
	{name: "redis", on: "redis", maxAttempts: 3, advance: true, tokens: true},
	{name: "redis-restarts", on: "redis", restarts: linMidRound, advance: true, tokens: true},
	{name: "postgres", on: "postgres", maxAttempts: 3, tokens: true},
	{name: "default-durable", on: "default", maxAttempts: 3, durable: true, restarts: linMidRound},
	{name: "default-archive", on: "default", restarts: linBetweenRounds, archive: true},
	{name: "redis-stalls", on: "redis", stalls: true},
}

func TestLinearizability(t *testing.T) {
	ops := linOpsDefault
	if s := os.Getenv(linOpsEnv); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number of calls", linOpsEnv, s)
		}
		ops = n
	}
	for _, cfg := range linConfigs {
		t.Run(cfg.name, func(t *testing.T) {
			runLinearizability(t, cfg, ops)
		})
	}
}

// linClients is how many clients call concurrently in each run.
const linClients = 4

// linRestartEvery is how many calls pass between two mid-round restarts.
const linRestartEvery = 30

// linKeys, linEntities: the few keys and entities the clients share.
var (
	linKeys     = []string{"k0", "k1", "k2"}
	linEntities = []string{"e0", "e1"}
)

// runLinearizability drives one configuration with calls calls, split
// across clients and rounds, and checks the history.
func runLinearizability(t *testing.T, cfg linConfig, calls int) {
	ctx := context.Background()
	clock := newClock()
	lease := time.Hour // no lease ends: the fake clock stands still
	if cfg.leaseJumps {
		lease = time.Minute
	}
	o := engine.Options{
		Clock: clock, Lease: lease, MaxAttempts: cfg.maxAttempts,
		MemoryCapacity: 4096, ExpectedKeys: 1000, DurableClaims: cfg.durable,
	}
	if cfg.archive {
		// Hour partitions, a two-hour window that grows an hour a round,
		// and an archive far longer than the run: no key expires.
		o.Lease, o.Window, o.Partition = 30*time.Minute, 2*time.Hour, time.Hour
		o.Archive, o.ArchiveWindow = pebble.ArchiveDir{Dir: t.TempDir()}, 10*day
	}
	if cfg.async {
		o.CommitQueue = 8 // small: CommitAsync waits for room now and then
	}
	o.NoSharedCache = cfg.shared() // Forget needs it with a shared tier
	store := enginetest.Named(cfg.on).New(t, "lin_"+cfg.name)
	redisSrv := store.Redis
	var w enginetest.Wrap // a Redis client per process
	if cfg.stalls {
		w.Redis = &goredis.Options{ReadTimeout: 30 * time.Millisecond, MaxRetries: 50, MaxRetryBackoff: 20 * time.Millisecond}
	}
	opts := make([]engine.Options, cfg.engines())
	for i := range opts {
		opts[i] = store.Wrapped(o, w)
	}
	h := newLinEngines(t, opts)
	defer h.closeAll(t)

	rec := &linRecorder{clock: clock, hold: linHolds(cfg)}
	model := linModel{lease: int64(o.Lease), maxAttempts: cfg.maxAttempts, voidOnRestart: !cfg.shared(), countOnRestart: cfg.durable, retriedCopies: cfg.stalls}
	var ids, steps atomic.Int64
	tokens := &linTokens{}
	clients := make([]*linClient, linClients)
	for i := range clients {
		clients[i] = &linClient{
			id: i, eng: i * cfg.engines() / linClients, cfg: cfg, lease: lease, clock: clock,
			rng: rand.New(rand.NewPCG(uint64(i), uint64(time.Now().UnixNano()))), rec: rec, h: h, ids: &ids,
			steps: &steps, tokens: tokens,
		}
	}
	perClient := max(1, calls/(linClients*cfg.rounds()))
	start := time.Now()
	var pauses atomic.Int64
	if cfg.stalls {
		stop := make(chan struct{})
		stopped := make(chan struct{})
		defer func() { close(stop); <-stopped }()
		go func() {
			defer close(stopped)
			rng := rand.New(rand.NewPCG(7, uint64(time.Now().UnixNano())))
			for {
				select {
				case <-stop:
					return
				case <-time.After(time.Duration(20+rng.IntN(100)) * time.Millisecond):
				}
				redisSrv.Pause()
				time.Sleep(time.Duration(50+rng.IntN(100)) * time.Millisecond)
				redisSrv.Resume()
				pauses.Add(1)
			}
		}()
	}
	for round := range cfg.rounds() {
		if round > 0 && cfg.restarts == linBetweenRounds {
			if cfg.archive {
				// Every key committed (or held) at the round's end, so the
				// next round has committed keys to find in the archive.
				clients[0].markKeys(ctx, linKeys, false)
				// The keys' partitions leave the window, are archived and
				// dropped from the store; the engine comes back with a
				// window an hour longer, which holds them again: the store
				// no longer does, and the archive must answer.
				clock.Add(3 * time.Hour)
				for i := range opts {
					e, _, _ := h.get(i)
					_, _ = e.Lookup(ctx, []byte("tick")) // rotates
					waitArchived(t, e)
					h.opts[i].Window += time.Hour
				}
			}
			for i := range opts {
				rec.restart(i, func() error { return h.restart(i) })
			}
		}
		if cfg.tokens {
			for i := range 2 {
				if out := tokens.issue(ctx, h, rec, 0, i%cfg.engines()); out.err != linOK {
					t.Fatalf("IssueToken: %s", out.errText)
				}
			}
		}
		var wg sync.WaitGroup
		var done atomic.Int64
		// Mid-round restarts: the first engine is closed and reopened
		// every linRestartEvery calls, while the clients go on.
		trigger := make(chan struct{}, 1)
		stop := make(chan struct{})
		restarter := make(chan struct{})
		go func() {
			defer close(restarter)
			for {
				select {
				case <-trigger:
					rec.restart(0, func() error { return h.restart(0) })
				case <-stop:
					return
				}
			}
		}()
		for _, c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range perClient {
					if h.failed() != nil {
						return
					}
					c.step(ctx)
					if cfg.stalls {
						time.Sleep(time.Millisecond) // the run outlasts several pauses
					}
					if n := done.Add(1); cfg.restarts == linMidRound && n%linRestartEvery == 0 {
						select {
						case trigger <- struct{}{}:
						default: // a restart is under way
						}
					}
				}
			}()
		}
		wg.Wait()
		close(stop)
		<-restarter
		if err := h.failed(); err != nil {
			t.Fatal(err)
		}
		for i := range opts {
			e, _, _ := h.get(i)
			if err := e.Flush(ctx); err != nil {
				t.Fatalf("Flush: %v", err)
			}
		}
	}
	ran := time.Since(start)
	if t.Failed() {
		t.FailNow()
	}
	if cfg.stalls && pauses.Load() < 3 {
		t.Fatalf("the server was paused %d times while the clients ran, want at least 3", pauses.Load())
	}

	history := rec.history()
	begin := time.Now()
	res, report := linCheck(t, t.Name(), model, history, 5*time.Minute)
	if res != porcupine.Ok {
		t.Fatalf("%s: the history of %d calls is not linearizable (%v):\n%s\ncalls: %s", cfg.name, rec.calls.Load(), res, report, rec.summary())
	}
	t.Logf("%d calls (%d operations in %d keys) in %v, linearizable (checked in %v); %s",
		rec.calls.Load(), len(history), len(linPartition(history)), ran.Round(time.Millisecond), time.Since(begin).Round(time.Millisecond), rec.summary())
}

// linHolds tells which calls hold their key for a moment, so that other
// calls may see it InFlight while they run (the model's pending), and
// whether every engine sees that hold (global) or only the calling one.
//
// In memory-only there is no slower tier to consult: a claim and a release
// decide in one step under the stripe lock, and only the calls of two
// steps hold the key: a mark (it claims, then commits), a forget (it
// seizes the key, then frees it) and a commit (its claim is pinned from the
// lease check until the commit is made, past the lease if that ends
// meanwhile). With a tier behind memory every call but a lookup installs
// its hold in memory first. A shared tier shows a Redis mark (and a
// token's use, which is one) between its claim and its commit, and a
// release between memory and the tier, to every engine; PostgreSQL marks
// in one statement.
func linHolds(cfg linConfig) func(linOp) (hold, global bool) {
	return func(op linOp) (bool, bool) {
		switch op {
		case linLookup, linIssue, linBegin, linEnd, linRestart:
			return false, false
		case linMark, linConsume:
			return true, cfg.on == "redis"
		case linRelease:
			return cfg.tiers() != engine.MemoryOnly, cfg.shared()
		case linForget, linCommit:
			return true, false
		}
		return cfg.tiers() != engine.MemoryOnly, false
	}
}

// linTokens are the tokens of a run, in the order they were issued; uses
// pick among the last few, so that clients race for each.
type linTokens struct {
	mu    sync.Mutex
	toks  []string
	parts []string
}

// issue issues a token through engine eng of h, recorded as client's call,
// and adds it to the pool.
func (p *linTokens) issue(ctx context.Context, h *linEngines, rec *linRecorder, client, eng int) linOutput {
	e, _, inst := h.get(eng)
	p.mu.Lock()
	part := fmt.Sprintf("t:%d", len(p.parts))
	p.parts = append(p.parts, part)
	p.toks = append(p.toks, "")
	n := len(p.toks) - 1
	p.mu.Unlock()
	call := rec.begin(client, []linInput{{op: linIssue, class: linToken, part: part, eng: eng, inst: inst}})
	tok, err := e.IssueToken(ctx, 24*time.Hour)
	out := linOut(err)
	call.end([]linOutput{out})
	p.mu.Lock()
	p.toks[n] = tok
	p.mu.Unlock()
	return out
}

// pick returns one of the last three tokens issued (and returned), and
// its partition.
func (p *linTokens) pick(rng *rand.Rand) (string, string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var idx []int
	for i := len(p.toks) - 1; i >= 0 && len(idx) < 3; i-- {
		if p.toks[i] != "" {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return "", "", false
	}
	i := idx[rng.IntN(len(idx))]
	return p.toks[i], p.parts[i], true
}

// linEngines holds the engines of a run, which a restart replaces: each
// has an instance number, so a claim of a closed engine can be told from
// one of its successor.
type linEngines struct {
	mu   sync.Mutex
	cond *sync.Cond
	opts []engine.Options
	es   []*engine.Engine
	ns   []*engine.Namespace
	inst []int64
	next int64
	err  error // a restart that failed: the run stops
}

// newLinEngines opens an engine for each of opts.
func newLinEngines(t *testing.T, opts []engine.Options) *linEngines {
	h := &linEngines{opts: opts}
	h.cond = sync.NewCond(&h.mu)
	for i := range opts {
		e, err := linOpen(opts[i])
		if err != nil {
			t.Fatal(err)
		}
		h.add(e)
	}
	return h
}

// linOpen opens an engine that logs nothing.
func linOpen(o engine.Options) (*engine.Engine, error) {
	o.Logger = quiet
	return engine.Open(&o)
}

// get returns engine i, its namespace "lin" and its instance number.
func (h *linEngines) get(i int) (*engine.Engine, *engine.Namespace, int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.es[i], h.ns[i], h.inst[i]
}

// restart closes engine i (waiting for the calls it is serving; later ones
// fail with ErrClosed) and opens it again. A failure stops the run.
func (h *linEngines) restart(i int) error {
	e, _, _ := h.get(i)
	err := e.Close()
	var n *engine.Engine
	var ns *engine.Namespace
	if err == nil {
		n, err = linOpen(h.opts[i])
	}
	if err == nil {
		ns, err = n.Namespace("lin")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if err != nil {
		h.err = fmt.Errorf("restart of engine %d: %w", i, err)
	} else {
		h.next++
		h.es[i], h.ns[i], h.inst[i] = n, ns, h.next
	}
	h.cond.Broadcast()
	return err
}

// failed returns the error of a restart that failed, if any.
func (h *linEngines) failed() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// waitPast waits until engine i is no longer instance inst (or a restart
// failed).
func (h *linEngines) waitPast(i int, inst int64) {
	h.mu.Lock()
	for h.inst[i] == inst && h.err == nil {
		h.cond.Wait()
	}
	h.mu.Unlock()
}

// closeAll closes the current engines.
func (h *linEngines) closeAll(t *testing.T) {
	for _, e := range h.es {
		if err := e.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
}

// add appends e as the next engine, a new instance.
func (h *linEngines) add(e *engine.Engine) {
	ns, err := e.Namespace("lin")
	if err != nil {
		panic(err) // a valid name
	}
	h.next++
	h.es, h.ns, h.inst = append(h.es, e), append(h.ns, ns), append(h.inst, h.next)
}

// linRecorder records a history for porcupine. Operations are timed by a
// logical clock: each call takes three ticks before it is made (a begin
// operation's two, then its own) and three after it returns (its return,
// then an end operation's two), so no other event falls between a call
// and its begin, or its return and its end. A call that holds its key
// takes a free pending slot for that time.
type linRecorder struct {
	ticks atomic.Int64
	calls atomic.Int64
	clock *fakeClock
	hold  func(linOp) (hold, global bool)

	mu     sync.Mutex
	ops    []porcupine.Operation
	slots  uint64
	counts map[string]int
	errs   []string
}

// linCall is a call in progress: one input per key it touches.
type linCall struct {
	r    *linRecorder
	ins  []linInput
	call int64
}

// begin starts a call by client of ins (one per key).
func (r *linRecorder) begin(client int, ins []linInput) *linCall {
	r.calls.Add(1)
	c := &linCall{r: r, ins: ins}
	r.mu.Lock()
	for i := range c.ins {
		c.ins[i].client, c.ins[i].slot = client, -1
		hold, global := r.hold(c.ins[i].op)
		if hold && !c.ins[i].settled {
			c.ins[i].global = global
			free := bits.TrailingZeros64(^r.slots)
			if free == 64 {
				panic("linearizability: more than 64 calls hold keys at once")
			}
			r.slots |= 1 << free
			c.ins[i].slot = free
		}
	}
	r.mu.Unlock()
	t0 := r.clock.Now().UnixNano()
	for i := range c.ins {
		c.ins[i].t0 = t0
	}
	c.call = r.ticks.Add(3)
	return c
}

// end records the call's answers, one per key.
func (c *linCall) end(outs []linOutput) {
	r := c.r
	ret := r.ticks.Add(3)
	t1 := r.clock.Now().UnixNano()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.counts == nil {
		r.counts = map[string]int{}
	}
	for i, in := range c.ins {
		in.t1 = t1
		out := outs[i]
		r.ops = append(r.ops, porcupine.Operation{ClientId: in.client, Input: in, Call: c.call, Output: out, Return: ret - 2})
		if in.slot >= 0 {
			mark := linInput{class: in.class, part: in.part, client: in.client, eng: in.eng, slot: in.slot, global: in.global}
			mark.op = linBegin
			r.ops = append(r.ops, porcupine.Operation{ClientId: in.client, Input: mark, Call: c.call - 2, Return: c.call - 1})
			mark.op = linEnd
			r.ops = append(r.ops, porcupine.Operation{ClientId: in.client, Input: mark, Call: ret - 1, Return: ret})
			r.slots &^= 1 << in.slot
		}
		name := in.op.String() + ":"
		switch {
		case out.err != linOK:
			name += out.err.String()
		case out.outcome == 0:
			name += "ok"
		default:
			name += out.outcome.String()
		}
		r.counts[name]++
		if out.err == linOther {
			r.errs = append(r.errs, describeOp(in, out))
		}
	}
}

// restart records the restart of engine eng (do closes and reopens it): a
// restart of every key.
func (r *linRecorder) restart(eng int, do func() error) {
	call := r.ticks.Add(1)
	err := do()
	ret := r.ticks.Add(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.errs = append(r.errs, fmt.Sprintf("restart of engine %d: %v", eng, err))
	}
	r.ops = append(r.ops, porcupine.Operation{Input: linInput{op: linRestart, part: "*", claim: int64(eng), slot: -1}, Call: call, Return: ret})
}

// history returns the operations recorded so far.
func (r *linRecorder) history() []porcupine.Operation {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]porcupine.Operation(nil), r.ops...)
}

// summary counts the answers by call, and lists unexpected errors.
func (r *linRecorder) summary() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	names := make([]string, 0, len(r.counts))
	for n := range r.counts {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for i, n := range names {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s=%d", n, r.counts[n])
	}
	for _, e := range r.errs {
		fmt.Fprintf(&b, "\n  unexpected: %s", e)
	}
	return b.String()
}

// linOut classifies a call's error.
func linOut(err error) linOutput {
	out := linOutput{err: linOther}
	switch {
	case err == nil:
		out.err = linOK
	case errors.Is(err, engine.ErrLeaseLost):
		out.err = linLeaseLost
	case errors.Is(err, engine.ErrInFlight):
		out.err = linInFlightErr
	case errors.Is(err, engine.ErrClosed):
		out.err = linClosed
	case errors.Is(err, engine.ErrTokenUsed):
		out.err = linTokenUsed
	case errors.Is(err, engine.ErrTokenUnknown):
		out.err = linTokenUnknown
	case errors.Is(err, engine.ErrTokenExpired):
		out.err = linTokenExpired
	}
	if out.err != linOK {
		out.errText = err.Error()
	}
	return out
}

// linClient is one goroutine's calls. It keeps the claims it holds, to
// commit or release them later, and the ones it settled (or lost), to try
// them again: those must fail with ErrLeaseLost.
type linClient struct {
	id, eng int
	cfg     linConfig
	lease   time.Duration
	clock   *fakeClock
	rng     *rand.Rand
	rec     *linRecorder
	h       *linEngines
	ids     *atomic.Int64
	steps   *atomic.Int64 // every client's calls: the versions Advance offers rise with it
	tokens  *linTokens
	held    []linHeld
	stale   []linHeld
}

// linHeld is a New claim (of a key or an entity) and its identity.
type linHeld struct {
	c     engine.Claim
	id    int64
	part  string
	class linClass
	// queued: committed through CommitAsync, perhaps not yet written: a
	// retry may still be the commit that takes effect.
	queued bool
}

// key picks one of the shared keys.
func (c *linClient) key() string { return linKeys[c.rng.IntN(len(linKeys))] }

// keys returns n keys, distinct unless repeats.
func (c *linClient) keys(n int, repeats bool) []string {
	var ks []string
	for len(ks) < n {
		k := c.key()
		if !repeats && contains(ks, k) {
			if len(ks) == len(linKeys) {
				break
			}
			continue
		}
		ks = append(ks, k)
	}
	return ks
}

// contains reports whether ks holds k.
func contains(ks []string, k string) bool {
	for _, x := range ks {
		if x == k {
			return true
		}
	}
	return false
}

// step makes one call, chosen at random.
func (c *linClient) step(ctx context.Context) {
	c.steps.Add(1)
	if c.cfg.leaseJumps && c.rng.IntN(100) < 4 {
		// Time passes while other clients' calls run: a third of a lease,
		// or past it.
		c.clock.Add([]time.Duration{c.lease / 3, c.lease + time.Second}[c.rng.IntN(2)])
	}
	if len(c.held) >= 2 || (len(c.held) > 0 && c.rng.IntN(100) < 50) {
		c.settle(ctx)
		return
	}
	switch r := c.rng.IntN(100); {
	case r < 22:
		c.claim(ctx, 1)
	case r < 30:
		c.claim(ctx, 1+c.rng.IntN(3))
	case r < 36 && len(c.stale) > 0:
		c.settleStale(ctx)
	case r < 48:
		c.mark(ctx)
	case r < 62:
		c.lookup(ctx)
	case r < 70:
		c.forget(ctx)
	case r < 84:
		if c.cfg.advance {
			c.advance(ctx)
		} else {
			c.claim(ctx, 1)
		}
	case r < 86 && c.cfg.tokens:
		c.tokens.issue(ctx, c.h, c.rec, c.id, c.eng)
	case r < 94 && c.cfg.tokens:
		c.consume(ctx)
	default:
		c.claim(ctx, 1)
	}
}

// closed waits for the engine's successor after a call failed because a
// restart closed it.
func (c *linClient) closed(out linOutput, inst int64) {
	if out.err == linClosed {
		c.h.waitPast(c.eng, inst)
	}
}

// claim claims n keys (repeats allowed).
func (c *linClient) claim(ctx context.Context, n int) { c.claimKeys(ctx, c.keys(n, true)) }

// claimKey claims one key.
func (c *linClient) claimKey(ctx context.Context, key string) { c.claimKeys(ctx, []string{key}) }

// claimKeys claims keys, one at a time or in a batch.
func (c *linClient) claimKeys(ctx context.Context, keys []string) {
	_, ns, inst := c.h.get(c.eng)
	n := len(keys)
	bkeys := make([][]byte, n)
	ds := make([]engine.Digest, n)
	ins := make([]linInput, n)
	for i, k := range keys {
		bkeys[i], ds[i] = []byte(k), linDigests[c.rng.IntN(len(linDigests))]
		ins[i] = linInput{op: linClaim, class: linKey, part: "k:" + k, claim: c.ids.Add(1), eng: c.eng, inst: inst, digest: ds[i]}
	}
	call := c.rec.begin(c.id, ins)
	out := make([]engine.Claim, n)
	var err error
	if n == 1 && c.rng.IntN(2) == 0 {
		out[0], err = ns.ClaimDigest(ctx, bkeys[0], ds[0])
	} else {
		err = ns.ClaimBatch(ctx, bkeys, ds, out)
	}
	outs := make([]linOutput, n)
	for i := range outs {
		outs[i] = linOut(err)
		if err == nil {
			outs[i].outcome, outs[i].leaseUntil, outs[i].result = out[i].Outcome, out[i].LeaseUntil, string(out[i].Result)
		}
	}
	call.end(outs)
	for i := range out {
		if err == nil && out[i].Outcome == engine.New {
			c.held = append(c.held, linHeld{c: out[i], id: ins[i].claim, part: ins[i].part, class: linKey})
		}
	}
	c.closed(outs[0], inst)
}

// mark marks one key (MarkIfAbsent) or up to three (MarkBatch with
// digests, repeats allowed).
func (c *linClient) mark(ctx context.Context) {
	n := 1 + c.rng.IntN(3)
	c.markKeys(ctx, c.keys(n, true), n == 1 && c.rng.IntN(2) == 0)
}

// markKeys marks keys, with MarkIfAbsent when single, else MarkBatch.
func (c *linClient) markKeys(ctx context.Context, keys []string, single bool) {
	_, ns, inst := c.h.get(c.eng)
	n := len(keys)
	ins := make([]linInput, n)
	bkeys := make([][]byte, n)
	ds := make([]engine.Digest, n)
	for i, k := range keys {
		bkeys[i], ds[i] = []byte(k), linDigests[c.rng.IntN(len(linDigests))]
		ins[i] = linInput{op: linMark, class: linKey, part: "k:" + k, eng: c.eng, inst: inst, digest: ds[i]}
	}
	if single {
		ins[0].digest = engine.Digest{} // MarkIfAbsent carries no digest
	}
	call := c.rec.begin(c.id, ins)
	out := make([]engine.Outcome, n)
	var err error
	if single {
		out[0], err = ns.MarkIfAbsent(ctx, bkeys[0])
	} else {
		err = ns.MarkBatch(ctx, bkeys, ds, out)
	}
	outs := make([]linOutput, n)
	for i := range outs {
		outs[i] = linOut(err)
		if err == nil {
			outs[i].outcome = out[i]
		}
	}
	call.end(outs)
	c.closed(outs[0], inst)
}

// lookup looks up one or two distinct keys.
func (c *linClient) lookup(ctx context.Context) { c.read(ctx, linLookup) }

// forget forgets one or two distinct keys (a repeat in a ForgetBatch is
// answered as its first occurrence, which is no sequential step).
func (c *linClient) forget(ctx context.Context) { c.read(ctx, linForget) }

// read is lookup (op linLookup) or forget (linForget): one key alone, or
// two in a batch.
func (c *linClient) read(ctx context.Context, op linOp) {
	_, ns, inst := c.h.get(c.eng)
	keys := c.keys(1+c.rng.IntN(2), false)
	ins := make([]linInput, len(keys))
	bkeys := make([][]byte, len(keys))
	for i, k := range keys {
		bkeys[i] = []byte(k)
		ins[i] = linInput{op: op, class: linKey, part: "k:" + k, eng: c.eng, inst: inst}
	}
	call := c.rec.begin(c.id, ins)
	infos := make([]engine.KeyInfo, len(keys))
	var err error
	switch {
	case op == linLookup && len(keys) == 1:
		infos[0], err = ns.Lookup(ctx, bkeys[0])
	case op == linLookup:
		err = ns.LookupBatch(ctx, bkeys, infos)
	case len(keys) == 1:
		infos[0], err = ns.Forget(ctx, bkeys[0])
	default:
		err = ns.ForgetBatch(ctx, bkeys, infos)
	}
	outs := make([]linOutput, len(keys))
	for i := range outs {
		o := linOut(err)
		if op == linForget && o.err == linInFlightErr && infos[i].Outcome != engine.InFlight {
			// ForgetBatch's error names the held keys; the others were
			// forgotten.
			o = linOutput{}
		}
		outs[i] = linInfo(o, infos[i])
	}
	call.end(outs)
	c.closed(outs[0], inst)
}

// linInfo adds a KeyInfo to out.
func linInfo(out linOutput, info engine.KeyInfo) linOutput {
	out.outcome, out.digest, out.result, out.attempts = info.Outcome, info.Digest, string(info.Result), info.Attempts
	return out
}

// advance offers a version of an entity.
func (c *linClient) advance(ctx context.Context) {
	_, ns, inst := c.h.get(c.eng)
	entity := linEntities[c.rng.IntN(len(linEntities))]
	// Around a version that rises as the run goes on: newer, the same or
	// older than the stored one.
	v := uint64(max(1, c.steps.Load()/24+int64(c.rng.IntN(4))-1))
	in := linInput{op: linAdvance, class: linEntity, part: "e:" + entity, claim: c.ids.Add(1), eng: c.eng, inst: inst, version: v}
	call := c.rec.begin(c.id, []linInput{in})
	cl, err := ns.Advance(ctx, []byte(entity), v)
	out := linOut(err)
	if err == nil {
		out.outcome, out.version, out.leaseUntil = cl.Outcome, cl.Version, cl.LeaseUntil
	}
	call.end([]linOutput{out})
	if err == nil && cl.Outcome == engine.New {
		c.held = append(c.held, linHeld{c: cl, id: in.claim, part: in.part, class: linEntity})
	}
	c.closed(out, inst)
}

// consume uses one of the last tokens issued.
func (c *linClient) consume(ctx context.Context) {
	e, _, inst := c.h.get(c.eng)
	tok, part, ok := c.tokens.pick(c.rng)
	if !ok {
		return
	}
	call := c.rec.begin(c.id, []linInput{{op: linConsume, class: linToken, part: part, eng: c.eng, inst: inst}})
	out := linOut(e.ConsumeToken(ctx, tok))
	call.end([]linOutput{out})
	c.closed(out, inst)
}

// settle commits or releases one or two held claims: one at a time, in a
// batch, or (async) through CommitAsync.
func (c *linClient) settle(ctx context.Context) {
	n := min(len(c.held), 1+c.rng.IntN(2))
	c.rng.Shuffle(len(c.held), func(i, j int) { c.held[i], c.held[j] = c.held[j], c.held[i] })
	pick := append([]linHeld(nil), c.held[:n]...)
	c.held = append(c.held[:0], c.held[n:]...)
	c.settleClaims(ctx, pick, c.rng.IntN(10) < 6, false)
	c.stale = append(c.stale, pick...)
	if len(c.stale) > 6 {
		c.stale = c.stale[len(c.stale)-6:]
	}
}

// settleStale commits or releases a claim settled before (or taken over,
// or of a closed engine): the model allows only ErrLeaseLost.
func (c *linClient) settleStale(ctx context.Context) {
	h := c.stale[c.rng.IntN(len(c.stale))]
	c.settleClaims(ctx, []linHeld{h}, c.rng.IntN(2) == 0, !h.queued)
}

// settleClaims commits or releases claims; settled says they were settled
// before (so they hold nothing).
func (c *linClient) settleClaims(ctx context.Context, pick []linHeld, commit, settled bool) {
	e, _, inst := c.h.get(c.eng)
	op := linRelease
	if commit {
		op = linCommit
	}
	ins := make([]linInput, len(pick))
	claims := make([]engine.Claim, len(pick))
	for i, h := range pick {
		ins[i] = linInput{op: op, class: h.class, part: h.part, claim: h.id, eng: c.eng, inst: inst, settled: settled}
		claims[i] = h.c
		claims[i].Result = nil
		if commit && h.class == linKey && c.rng.IntN(2) == 0 {
			ins[i].result = fmt.Sprintf("r%d", h.id)
			claims[i].Result = []byte(ins[i].result)
		}
	}
	if commit && c.cfg.async {
		// Each commit returns when its done runs; the client goes on.
		for i := range claims {
			pick[i].queued = true
			call := c.rec.begin(c.id, ins[i:i+1])
			e.CommitAsync(ctx, claims[i], func(err error) { call.end([]linOutput{linOut(err)}) })
		}
		return
	}
	call := c.rec.begin(c.id, ins)
	outs := make([]linOutput, len(claims))
	if len(claims) == 1 && c.rng.IntN(2) == 0 {
		var err error
		if commit {
			err = e.Commit(ctx, claims[0])
		} else {
			err = e.Release(ctx, claims[0])
		}
		outs[0] = linOut(err)
	} else {
		errs := make([]error, len(claims))
		var err error
		if commit {
			err = e.CommitBatch(ctx, claims, errs)
		} else {
			err = e.ReleaseBatch(ctx, claims, errs)
		}
		for i := range outs {
			switch {
			case errs[i] != nil:
				outs[i] = linOut(errs[i])
			case err != nil && !errors.Is(err, engine.ErrLeaseLost):
				outs[i] = linOut(err) // the call failed whole
			}
		}
	}
	call.end(outs)
	c.closed(outs[0], inst)
}

// TestLinearizabilityCheckerCatchesBrokenModel shows that the check can
// fail: a real history (one client's calls in a fixed order on a
// memory-only engine) passes the model and fails a model in which Release
// commits the key (a Duplicate is then required after a Release); and a
// forged history, two claims of one key both New one after the other,
// fails the real model.
func TestLinearizabilityCheckerCatchesBrokenModel(t *testing.T) {
	ctx := context.Background()
	clock := newClock()
	opts := []engine.Options{{Tiers: engine.MemoryOnly, Clock: clock, Lease: time.Hour, MemoryCapacity: 4096}}
	h := newLinEngines(t, opts)
	defer h.closeAll(t)
	cfg := linConfig{name: "memory", on: "memory"}
	rec := &linRecorder{clock: clock, hold: linHolds(cfg)}
	var ids atomic.Int64
	c := &linClient{cfg: cfg, lease: time.Hour, clock: clock, rng: rand.New(rand.NewPCG(1, 2)), rec: rec, h: h, ids: &ids}
	// Claim, Release, Claim again (New), Commit, Claim (Duplicate), Lookup.
	for _, commit := range []bool{false, true} {
		c.claimKey(ctx, "k0")
		if len(c.held) != 1 {
			t.Fatalf("claim of a free key held %d claims", len(c.held))
		}
		c.settleClaims(ctx, c.held, commit, false)
		c.held = nil
	}
	c.claimKey(ctx, "k0")
	c.lookup(ctx)
	history := rec.history()

	right := linModel{lease: int64(time.Hour), voidOnRestart: true}
	if res, report := linCheck(t, "right", right, history, time.Minute); res != porcupine.Ok {
		t.Fatalf("the real history fails the model: %v\n%s", res, report)
	}
	broken := right
	broken.broken = linBreakRelease
	res, report := linCheck(t, "broken", broken, history, time.Minute)
	if res != porcupine.Illegal || !strings.Contains(report, "key k:k0: Illegal") || !strings.Contains(report, "Claim(k0") {
		t.Fatalf("a model requiring a Duplicate after Release accepted the history: %v\n%s", res, report)
	}
	t.Logf("broken model rejected the history:%s", report)

	// Forged: client 1 claims k1 (New) after client 0's claim of k1 (New)
	// returned, with no release or commit between.
	lease := int64(time.Hour)
	forged := []porcupine.Operation{
		{ClientId: 0, Call: 1, Return: 2, Input: linInput{op: linClaim, part: "k:k1", claim: 1, inst: 1, slot: -1, t0: linEpoch, t1: linEpoch},
			Output: linOutput{outcome: engine.New, leaseUntil: linEpoch + lease}},
		{ClientId: 1, Call: 3, Return: 4, Input: linInput{op: linClaim, part: "k:k1", claim: 2, inst: 1, slot: -1, t0: linEpoch, t1: linEpoch},
			Output: linOutput{outcome: engine.New, leaseUntil: linEpoch + lease}},
	}
	if res, report := linCheck(t, "forged", right, forged, time.Minute); res != porcupine.Illegal {
		t.Fatalf("two New claims of one key passed: %v\n%s", res, report)
	}
	// The same two claims, concurrent, and the second InFlight: legal.
	forged[1].Call, forged[1].Output = 1, linOutput{outcome: engine.InFlight}
	if res, report := linCheck(t, "concurrent", right, forged, time.Minute); res != porcupine.Ok {
		t.Fatalf("New and InFlight of concurrent claims failed: %v\n%s", res, report)
	}
}
