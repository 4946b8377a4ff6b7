package engine_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/crashtest"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// durableOpts is an embedded store in dir whose New claims are durable
// attempts, MaxAttempts as given.
func durableOpts(dir string, attempts int, clock engine.Clock) engine.Options {
	return engine.Options{Backend: embedded.Dir(dir), ExpectedKeys: 10_000, MaxAttempts: attempts, DurableClaims: true, Clock: clock,
		Window: 4 * time.Hour, Partition: time.Hour, Lease: time.Minute}
}

// claimOutcome claims key once and returns the outcome, releasing nothing.
func claimOutcome(t *testing.T, e *engine.Engine, key string) (engine.Claim, engine.Outcome) {
	t.Helper()
	c, err := e.Claim(context.Background(), []byte(key))
	if err != nil {
		t.Fatalf("claim %s: %v", key, err)
	}
	return c, c.Outcome
}

// TestDurableClaimsCountAbandonedClaims: a claim left without commit or
// release (Close here, a crash in TestDurableClaimsSurviveSIGKILL) is an
// attempt at the next Open; one given back uncounted, committed, or released
// counts as each of those says, across reopens.
func TestDurableClaimsCountAbandonedClaims(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	clock := newClock()
	o := durableOpts(dir, 1, clock)
	o.Lease = 3 * time.Hour // alive across the rotation below
	e := open(t, o)
	abandoned, _ := claimOutcome(t, e, "abandoned")
	unclaimed, _ := claimOutcome(t, e, "unclaimed")
	released, _ := claimOutcome(t, e, "released")
	committed, _ := claimOutcome(t, e, "committed")
	// A key repeated in a batch is New once: that one claim is the attempt.
	batch := make([]engine.Claim, 2)
	if err := e.ClaimBatch(ctx, [][]byte{[]byte("repeated"), []byte("repeated")}, nil, batch); err != nil {
		t.Fatal(err)
	}
	for _, c := range []engine.Claim{abandoned, unclaimed, released, committed, batch[0]} {
		if c.Outcome != engine.New {
			t.Fatalf("%s: %v, want New", c.Key, c.Outcome)
		}
	}
	// The claim given back uncounted is given back after a rotation: the
	// count it restores must shadow the one its claim wrote in an older
	// partition.
	clock.Add(90 * time.Minute)
	if err := e.UnclaimBatch(ctx, []engine.Claim{unclaimed}, nil); err != nil {
		t.Fatal(err)
	}
	if err := e.Release(ctx, released); err != nil {
		t.Fatal(err)
	}
	if err := e.Commit(ctx, committed); err != nil {
		t.Fatal(err)
	}
	_ = abandoned // neither committed nor released: Close abandons it
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}

	e = open(t, durableOpts(dir, 1, clock))
	defer e.Close()
	want := map[string]engine.Outcome{
		"abandoned": engine.Poison, // its handler may have run: never New again
		"repeated":  engine.Poison,
		"released":  engine.Poison, // a counted failure, MaxAttempts 1
		"unclaimed": engine.New,    // never handed to a handler
		"committed": engine.Duplicate,
	}
	for key, w := range want {
		c, got := claimOutcome(t, e, key)
		if got != w {
			t.Errorf("%s after reopen: %v, want %v", key, got, w)
		}
		if got == engine.New {
			if err := e.UnclaimBatch(ctx, []engine.Claim{c}, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestDurableClaimsAttemptsAddUp: with MaxAttempts 3, each abandoned claim
// is one attempt: New after one and two crashes, Poison after the third;
// a lease that ended in the running process counts once, not twice.
func TestDurableClaimsAttemptsAddUp(t *testing.T) {
	dir := t.TempDir()
	clock := newClock()
	for round, want := range []engine.Outcome{engine.New, engine.New, engine.New, engine.Poison} {
		e := open(t, durableOpts(dir, 3, clock))
		if _, got := claimOutcome(t, e, "k"); got != want {
			t.Fatalf("round %d: %v, want %v", round, got, want)
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// A lease ending while the process runs is the same attempt its claim
	// already wrote.
	dir = t.TempDir()
	e := open(t, durableOpts(dir, 3, clock))
	claimOutcome(t, e, "k")                                   // attempt 1, written
	clock.Add(2 * time.Minute)                                // its lease ends
	if _, got := claimOutcome(t, e, "k"); got != engine.New { // attempt 2
		t.Fatalf("after a lease ended: %v, want New", got)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = open(t, durableOpts(dir, 3, clock))
	defer e.Close()
	if _, got := claimOutcome(t, e, "k"); got != engine.New { // attempt 3
		t.Fatalf("third claim: %v, want New (two attempts so far)", got)
	}
}

// TestDurableClaimsOptions: DurableClaims needs MaxAttempts and a durable
// tier.
func TestDurableClaimsOptions(t *testing.T) {
	for _, o := range []engine.Options{
		{Backend: embedded.Dir(t.TempDir()), DurableClaims: true},
		{Tiers: engine.MemoryOnly, DurableClaims: true, MaxAttempts: 1},
		{Tiers: engine.BloomOnly, DurableClaims: true, MaxAttempts: 1},
	} {
		if _, err := engine.Open(&o); !errors.Is(err, engine.ErrOptions) {
			t.Errorf("%s with DurableClaims, MaxAttempts %d: %v, want ErrOptions", o.Name(), o.MaxAttempts, err)
		}
	}
}

// durableChild claims the keys of its spec (dir|key,key,...) in an engine
// with DurableClaims and MaxAttempts 1, prints "N key" for each New, then
// waits to be killed.
func durableChild(spec string) int {
	dir, keys, _ := strings.Cut(spec, "|")
	if dir == "long" {
		return durableLongChild(keys)
	}
	o := durableOpts(dir, 1, nil)
	o.DurableClaims = os.Getenv("DURABLE_OFF") == ""
	e, err := engine.Open(&o)
	if err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	for _, k := range strings.Split(keys, ",") {
		c, err := e.Claim(context.Background(), []byte(k))
		if err != nil {
			fmt.Println("ERR", err)
			return 1
		}
		if c.Outcome == engine.New {
			fmt.Println("N", k)
		}
	}
	fmt.Println("READY")
	select {}
}

// TestDurableClaimsSurviveSIGKILL: a process SIGKILLed while it holds New
// claims (a handler running) leaves each of them counted: the next process
// answers Poison, never New, so the handler does not run a second time.
func TestDurableClaimsSurviveSIGKILL(t *testing.T) {
	dir := t.TempDir()
	keys := []string{"order-1", "order-2", "order-3"}
	child := crashtest.Start(t, "durable", dir+"|"+strings.Join(keys, ","), &crashtest.Options{Timeout: time.Minute})
	news := 0
	for {
		line, ok := child.Next()
		if !ok {
			t.Fatalf("child ended before READY\n%s", child.Describe())
		}
		if line == "READY" {
			break
		}
		if strings.HasPrefix(line, "ERR") {
			t.Fatalf("child: %s", line)
		}
		if strings.HasPrefix(line, "N ") {
			news++
		}
	}
	if news != len(keys) {
		t.Fatalf("child answered %d New of %d fresh keys\n%s", news, len(keys), child.Describe())
	}
	_ = child.Kill()
	_ = child.Wait()
	e := open(t, durableOpts(dir, 1, nil))
	defer e.Close()
	for _, k := range keys {
		if _, got := claimOutcome(t, e, k); got != engine.Poison {
			t.Errorf("%s after SIGKILL: %v, want Poison (its handler may have run)", k, got)
		}
	}
}

// heartbeatPast holds claim c of e for five hours on clock, the engine's
// (Window 2 h, Partition 1 h): a heartbeat of 30 minutes every 20,
// while other keys rotate and drop the partitions behind.
func heartbeatPast(e *engine.Engine, clock *fakeClock, c *engine.Claim) error {
	ctx := context.Background()
	other := [][]byte{nil}
	marks := make([]engine.Outcome, 1)
	for step := range 15 {
		if err := e.Extend(ctx, c, 30*time.Minute); err != nil {
			return fmt.Errorf("heartbeat %d: %w", step, err)
		}
		clock.Add(20 * time.Minute)
		other[0] = fmt.Appendf(other[0][:0], "other-%d", step)
		if err := e.MarkBatch(ctx, other, nil, marks); err != nil {
			return err
		}
	}
	return nil
}

// longDurableOpts are the options of TestDurableClaimsOutliveTheirPartition.
func longDurableOpts(dir string, clock engine.Clock) engine.Options {
	o := durableOpts(dir, 1, clock)
	o.Window, o.Partition, o.Lease = 2*time.Hour, time.Hour, 10*time.Minute
	return o
}

// durableLongChild claims a key and heartbeats it past its partition
// (heartbeatPast), then prints "READY <clock>" and waits to be killed.
func durableLongChild(dir string) int {
	clock := newClock()
	e, err := engine.Open(ptr(longDurableOpts(dir, clock)))
	if err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	c, err := e.Claim(context.Background(), []byte("long-handler"))
	if err != nil || c.Outcome != engine.New {
		fmt.Println("ERR claim", c.Outcome, err)
		return 1
	}
	if err := heartbeatPast(e, clock, &c); err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	fmt.Println("READY", clock.Now().UnixNano())
	select {}
}

// TestDurableClaimsOutliveTheirPartition: a durable claim whose handler
// heartbeats (Extend) past Window + Partition, longer than the partition
// its attempt was first written in lives, then is abandoned (Close, or a
// SIGKILL), is an attempt at the next Open: with MaxAttempts 1 its key is
// Poison, never New, so its handler, which may have run, never runs
// again. A claim given back after the drop has its earlier count
// restored: New again.
func TestDurableClaimsOutliveTheirPartition(t *testing.T) {
	for _, end := range []string{"close", "sigkill", "give-back"} {
		t.Run(end, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			clock := newClock()
			if end == "sigkill" {
				child := crashtest.Start(t, "durable", "long|"+dir, &crashtest.Options{Timeout: time.Minute})
				line, ok := child.WaitLine(time.Minute, func(l string) bool { return strings.HasPrefix(l, "READY") || strings.HasPrefix(l, "ERR") })
				if !ok || !strings.HasPrefix(line, "READY") {
					t.Fatalf("child: %q\n%s", line, child.Describe())
				}
				_ = child.Kill()
				_ = child.Wait()
				var ns int64
				fmt.Sscanf(line, "READY %d", &ns)
				clock.Add(time.Unix(0, ns).Sub(clock.Now()))
			} else {
				e := open(t, longDurableOpts(dir, clock))
				c, out := claimOutcome(t, e, "long-handler")
				if out != engine.New {
					t.Fatalf("first claim: %v", out)
				}
				if err := heartbeatPast(e, clock, &c); err != nil {
					t.Fatal(err)
				}
				if end == "give-back" {
					if err := e.UnclaimBatch(ctx, []engine.Claim{c}, nil); err != nil {
						t.Fatal(err)
					}
				}
				if err := e.Close(); err != nil {
					t.Fatal(err)
				}
			}
			e := open(t, longDurableOpts(dir, clock))
			defer e.Close()
			want := engine.Poison
			if end == "give-back" {
				want = engine.New // given back uncounted: the count before it, none
			}
			if _, got := claimOutcome(t, e, "long-handler"); got != want {
				t.Fatalf("after five hours of heartbeats and a reopen: %v, want %v", got, want)
			}
		})
	}
}

// TestDurableClaimGivenBackWhileAnotherClaims: with DurableClaims and
// MaxAttempts 1 (the HTTP middleware's setup), a claim given back
// uncounted (UnclaimBatch: its handler failed cleanly) frees its key in
// memory before its attempt count is restored on disk. A claim of the key
// in that gap must wait for the restored count and answer New, not read
// the given-back claim's own durable attempt and answer Poison (a request
// whose first run failed would then never run).
func TestDurableClaimGivenBackWhileAnotherClaims(t *testing.T) {
	ctx := context.Background()
	opts := durableOpts(t.TempDir(), 1, nil)
	e, err := engine.Open(&opts)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	first, o := claimOutcome(t, e, "gap")
	if o != engine.New {
		t.Fatalf("first claim: %v", o)
	}
	// The give-back's durable write is held until the second claim had
	// time to read.
	entered, hold := make(chan struct{}), make(chan struct{})
	var once sync.Once
	enginetest.SetBeforeDurable(func() {
		once.Do(func() {
			close(entered)
			<-hold
		})
	})
	defer enginetest.SetBeforeDurable(nil)
	gave := make(chan error, 1)
	go func() { gave <- e.UnclaimBatch(ctx, []engine.Claim{first}, nil) }()
	<-entered
	second := make(chan engine.Claim, 1)
	go func() {
		c, err := e.Claim(ctx, []byte("gap"))
		if err != nil {
			t.Errorf("second claim: %v", err)
		}
		second <- c
	}()
	select {
	case c := <-second:
		close(hold)
		t.Fatalf("a claim while the give-back's count was not durable answered %v at once; want it to wait, then New", c.Outcome)
	case <-time.After(300 * time.Millisecond):
	}
	close(hold)
	if err := <-gave; err != nil {
		t.Fatalf("UnclaimBatch: %v", err)
	}
	if c := <-second; c.Outcome != engine.New {
		t.Fatalf("second claim after the give-back: %v, want New", c.Outcome)
	}
}
