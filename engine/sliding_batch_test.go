package engine_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/crashtest"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// slidingBatchEngine opens an embedded store on a crashable filesystem
// with a sliding default namespace, marks "k" New, and moves the clock to
// a later partition inside the window, where a duplicate of "k" refreshes
// it.
func slidingBatchEngine(t *testing.T, lease time.Duration) (*engine.Engine, engine.Options, *vfs.MemFS, *fakeClock) {
	t.Helper()
	clock := newClock()
	fs := vfs.NewCrashableMem()
	o := engine.Options{Backend: &embedded.Backend{Dir: "s", FS: fs}, Window: slideWindow, Partition: slidePart, ExpectedKeys: 1000,
		Clock: clock, Lease: lease, Namespaces: map[string]engine.NamespaceOptions{"": {Sliding: true}}}
	e := open(t, o)
	if g, err := e.MarkIfAbsent(context.Background(), []byte("k")); g != engine.New || err != nil {
		t.Fatal(g, err)
	}
	clock.Add(slideWindow - time.Minute)
	return e, o, fs, clock
}

// TestSlidingRefreshSharesTheBatchWrite: a MarkBatch whose batch holds
// New keys and a sliding duplicate that refreshes makes one durable write,
// not two (the refresh rides with the commits), and both are durable when
// it returns: a machine crash right after (a crash clone: what was not
// synced is lost) keeps the New keys Duplicate and the refreshed key
// Duplicate past its first commit's expiry. A batch of the refresh alone
// (no New key) writes once too.
func TestSlidingRefreshSharesTheBatchWrite(t *testing.T) {
	ctx := context.Background()
	e, o, fs, clock := slidingBatchEngine(t, 0)
	var writes atomic.Int64
	enginetest.SetBeforeDurable(func() { writes.Add(1) })
	defer enginetest.SetBeforeDurable(nil)
	keys := [][]byte{[]byte("a"), []byte("k"), []byte("b")}
	out := make([]engine.Outcome, len(keys))
	if err := e.MarkBatch(ctx, keys, nil, out); err != nil {
		t.Fatal(err)
	}
	if out[0] != engine.New || out[1] != engine.Duplicate || out[2] != engine.New {
		t.Fatalf("answers %v, want [New Duplicate New]", out)
	}
	if n := writes.Load(); n != 1 {
		t.Errorf("a batch of two New keys and a refresh made %d durable writes, want 1", n)
	}
	if r := e.Stats().Calls.Refreshes; r != 1 {
		t.Errorf("Refreshes %d, want 1", r)
	}
	crashed := fs.CrashClone(vfs.CrashCloneCfg{})

	// The refresh alone: one write.
	clock.Add(slidePart)
	writes.Store(0)
	if err := e.MarkBatch(ctx, [][]byte{[]byte("k")}, nil, out[:1]); err != nil || out[0] != engine.Duplicate {
		t.Fatal(out[0], err)
	}
	if n := writes.Load(); n != 1 {
		t.Errorf("a batch of one refresh made %d durable writes, want 1", n)
	}
	enginetest.SetBeforeDurable(nil)
	e.Close()

	// Past the first commit's expiry, inside the refresh's.
	clock.Add(2 * time.Minute)
	setFS(&o, crashed)
	e = open(t, o)
	defer e.Close()
	for _, k := range []string{"a", "k", "b"} {
		if g, err := e.MarkIfAbsent(ctx, []byte(k)); g != engine.Duplicate || err != nil {
			t.Errorf("after a machine crash, %q: %v %v, want Duplicate", k, g, err)
		}
	}
}

// TestSlidingRefreshNotWrittenAfterItsLease: a MarkBatch held between its
// claim and its commit while the lease of its claims ends, and a Forget
// of the key it decided to refresh runs meanwhile: the refresh is not
// written (it would bring the forgotten key back), the duplicate it
// answered stands (decided while it held the key), the New key whose
// claim ended is InFlight, and no claim is left behind.
func TestSlidingRefreshNotWrittenAfterItsLease(t *testing.T) {
	ctx := context.Background()
	const lease = time.Minute
	e, _, _, clock := slidingBatchEngine(t, lease)
	defer e.Close()
	entered, release := holdMark(t)
	keys := [][]byte{[]byte("k"), []byte("fresh")}
	out := make([]engine.Outcome, len(keys))
	done := make(chan error, 1)
	go func() { done <- e.MarkBatch(ctx, keys, nil, out) }()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the mark never reached its commit")
	}
	clock.Add(2 * lease)
	found, err := e.Forget(ctx, []byte("k"))
	if err != nil || found.Outcome != engine.Duplicate {
		t.Fatalf("Forget of the held key after its lease: %v, %v; want the commit it removed", found.Outcome, err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if out[0] != engine.Duplicate || out[1] != engine.InFlight {
		t.Errorf("the held mark answered %v, want [Duplicate InFlight]", out)
	}
	in, err := e.Lookup(ctx, []byte("k"))
	if err != nil || in.Outcome != engine.New {
		t.Errorf("the forgotten key after the held mark's late commit: %v %v, want New (not written back by a refresh)", in.Outcome, err)
	}
	for _, k := range []string{"k", "fresh"} {
		if g, err := e.MarkIfAbsent(ctx, []byte(k)); g != engine.New || err != nil {
			t.Errorf("%q marked again: %v %v, want New (no claim left behind)", k, g, err)
		}
	}
}

// slideCrashChild marks batches of a sliding namespace in dir (the spec)
// on a clock that moves a minute a batch: each batch holds new keys and
// re-sends of keys first sent 5 minutes to 3.6 hours before (refreshes
// in later partitions, with the 4-hour window and hourly partitions of
// TestSlidingRefreshSurvivesKill), and prints, once MarkBatch returned,
// "A <unix nanos> <outcome> <key>" for each of its keys, until killed.
func slideCrashChild(dir string) int {
	clock := enginetest.ClockAt(time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC))
	e, err := engine.Open(&engine.Options{Backend: embedded.Dir(dir), Window: slideWindow, Partition: slidePart, ExpectedKeys: 100_000,
		Clock: clock, Namespaces: map[string]engine.NamespaceOptions{"": {Sliding: true}}})
	if err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	ctx := context.Background()
	var sent [][]byte
	out := make([]engine.Outcome, 24)
	w := bufio.NewWriter(os.Stdout)
	for b := 0; ; b++ {
		keys := make([][]byte, 0, 24)
		for j := range 16 {
			keys = append(keys, fmt.Appendf(nil, "k-%d-%d", b, j))
		}
		for j := range 8 {
			if back := 5 + (b*7+j*31)%210; back <= b {
				keys = append(keys, sent[(b-back)*16+(b+j)%16])
			}
		}
		if err := e.MarkBatch(ctx, keys, nil, out[:len(keys)]); err != nil {
			fmt.Println("ERR", err)
			return 1
		}
		at := clock.Now().UnixNano()
		for i, k := range keys {
			fmt.Fprintf(w, "A %d %d %s\n", at, out[i], k)
		}
		w.Flush()
		sent = append(sent, keys[:16]...)
		clock.Add(time.Minute)
	}
}

// TestSlidingRefreshSurvivesKill: a process marking batches of new keys
// and refreshing re-sends (slideCrashChild, its refreshes riding in its
// batches' commits) is killed with SIGKILL at a random batch, three
// times; the parent reopens the store an hour and a half (simulated)
// after the last batch and looks up every key: each key whose last
// acknowledged arrival (New or Duplicate) is less than a window before
// is Duplicate. A refresh lost with the kill shows as a key re-sent
// recently, first sent more than a window ago, answered New.
func TestSlidingRefreshSurvivesKill(t *testing.T) {
	for round := range 3 {
		dir := t.TempDir()
		child := crashtest.Start(t, "slidecrash", dir, &crashtest.Options{Timeout: time.Minute})
		first, last := map[string]int64{}, map[string]int64{}
		var latest int64
		limit := 7000 + rand.IntN(8000) // past the 210 batches a key refreshed alone needs
		lines := 0
		for {
			line, ok := child.Next()
			if !ok {
				break
			}
			f := strings.Fields(line)
			if len(f) > 0 && f[0] == "ERR" {
				t.Fatalf("child: %s", line)
			}
			if len(f) != 4 || f[0] != "A" {
				continue
			}
			at, _ := strconv.ParseInt(f[1], 10, 64)
			o, _ := strconv.Atoi(f[2])
			if engine.Outcome(o) == engine.New || engine.Outcome(o) == engine.Duplicate {
				last[f[3]] = max(last[f[3]], at)
				if _, ok := first[f[3]]; !ok {
					first[f[3]] = at
				}
			}
			latest = max(latest, at)
			if lines++; lines == limit {
				child.Signal(syscall.SIGKILL)
			}
		}
		_ = child.Wait()
		if lines < limit {
			t.Fatalf("round %d: the child printed %d lines before it ended\n%s", round, lines, child.Describe())
		}
		check := time.Unix(0, latest).Add(90 * time.Minute)
		e := open(t, engine.Options{Backend: embedded.Dir(dir), Window: slideWindow, Partition: slidePart, ExpectedKeys: 100_000,
			Clock: enginetest.ClockAt(check), Namespaces: map[string]engine.NamespaceOptions{"": {Sliding: true}}})
		var keys [][]byte
		refreshed := 0 // kept alive by a refresh alone: first sent more than a window before the check
		for k, at := range last {
			if check.Before(time.Unix(0, at).Add(slideWindow)) {
				keys = append(keys, []byte(k))
				if !check.Before(time.Unix(0, first[k]).Add(slideWindow + slidePart)) {
					refreshed++
				}
			}
		}
		if refreshed == 0 {
			t.Fatalf("round %d: no key checked depends on a refresh", round)
		}
		info := make([]engine.KeyInfo, len(keys))
		if err := e.LookupBatch(context.Background(), keys, info); err != nil {
			t.Fatal(err)
		}
		bad := 0
		for i, in := range info {
			if in.Outcome != engine.Duplicate {
				if bad++; bad <= 5 {
					t.Errorf("round %d: %s, last acknowledged %v before the check, is %v, want Duplicate",
						round, keys[i], check.Sub(time.Unix(0, last[string(keys[i])])), in.Outcome)
				}
			}
		}
		t.Logf("round %d: killed after %d lines; %d keys inside their window checked (%d alive by a refresh alone), %d not Duplicate",
			round, lines, len(keys), refreshed, bad)
		e.Close()
	}
}
