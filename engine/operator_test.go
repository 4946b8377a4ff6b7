package engine_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/embedded"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// TestMixedNamespacesAsync: one CommitBatchAsync mixing namespaces with
// their own windows (the default one's too) and without, results and none,
// with a 16-key memory tier: every key answers by its namespace's window
// and with its result, from memory, after a reopen, and after a crash.
func TestMixedNamespacesAsync(t *testing.T) {
	ctx := context.Background()
	clock := newClock()
	fs := newCrashFS()
	o := engine.Options{Backend: &embedded.Backend{Dir: "db", FS: fs}, Clock: clock, Window: 4 * time.Hour, Partition: time.Hour, Lease: time.Minute, MemoryCapacity: 16, ExpectedKeys: 1000,
		Namespaces: map[string]engine.NamespaceOptions{"short": {Window: 10 * time.Minute}, "": {Window: 20 * time.Minute}}}
	e := open(t, o)
	short, _ := e.Namespace("short")
	long, _ := e.Namespace("long")
	def, _ := e.Namespace("")
	type kk struct {
		ns  *engine.Namespace
		key string
		res string
	}
	items := []kk{{def, "a", "ra"}, {short, "b", "rb"}, {short, "c", ""}, {long, "d", "rd"}, {long, "e", ""}, {def, "f", ""}}
	claims := make([]engine.Claim, len(items))
	for i, it := range items {
		c, err := it.ns.Claim(ctx, []byte(it.key))
		if err != nil || c.Outcome != engine.New {
			t.Fatal(c.Outcome, err)
		}
		if it.res != "" {
			c.Result = []byte(it.res)
		}
		claims[i] = c
	}
	done := make(chan error, 1)
	e.CommitBatchAsync(ctx, claims, nil, func(err error) { done <- err })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	check := func(when string, e *engine.Engine, wants map[string]engine.Outcome) {
		t.Helper()
		for _, it := range items {
			ns, _ := e.Namespace(it.ns.Name())
			info, err := ns.Lookup(ctx, []byte(it.key))
			want := wants[it.ns.Name()]
			if err != nil || info.Outcome != want {
				t.Errorf("%s: lookup %q/%s = %v %v want %v", when, it.ns.Name(), it.key, info.Outcome, err, want)
			}
			c, err := ns.Claim(ctx, []byte(it.key))
			if err != nil || c.Outcome != want {
				t.Errorf("%s: claim %q/%s = %v %v want %v", when, it.ns.Name(), it.key, c.Outcome, err, want)
			}
			if want == engine.Duplicate && string(c.Result) != it.res {
				t.Errorf("%s: %q/%s result %q want %q", when, it.ns.Name(), it.key, c.Result, it.res)
			}
			if c.Outcome == engine.New {
				_ = e.Release(ctx, c)
			}
		}
	}
	clock.Add(10*time.Minute - 1)
	check("before short ends", e, map[string]engine.Outcome{"short": engine.Duplicate, "long": engine.Duplicate, "": engine.Duplicate})
	e.Close()
	e = open(t, o)
	check("reopened", e, map[string]engine.Outcome{"short": engine.Duplicate, "long": engine.Duplicate, "": engine.Duplicate})
	clock.Add(1)
	check("short ended", e, map[string]engine.Outcome{"short": engine.New, "long": engine.Duplicate, "": engine.Duplicate})
	clock.Add(10 * time.Minute)
	// crash: reopen a crash clone without Close
	e2 := open(t, engine.Options{Backend: &embedded.Backend{Dir: "db", FS: fs.CrashClone(vfs.CrashCloneCfg{})}, Clock: clock, Window: 4 * time.Hour, Partition: time.Hour, Lease: time.Minute, MemoryCapacity: 16, ExpectedKeys: 1000,
		Namespaces: o.Namespaces})
	check("crashed, default ended", e2, map[string]engine.Outcome{"short": engine.New, "long": engine.Duplicate, "": engine.New})
	e2.Close()
	e.Close()
}

// TestForgetFencing: Forget in one namespace leaves another's key alone; a
// claim whose key was forgotten after its lease ended cannot commit (its
// result is not stored); a taken-over claim's result is refused and the
// new owner's stands.
func TestForgetFencing(t *testing.T) {
	ctx := context.Background()
	for _, cfg := range configs("memory", "default", "redis") {
		t.Run(cfg.name, func(t *testing.T) {
			clock := newClock()
			e, _, _ := cfg.open(t, engine.Options{Clock: clock, Lease: time.Second, MaxAttempts: 3, NoSharedCache: cfg.shared})
			defer e.Close()
			other, _ := e.Namespace("other")
			if _, err := other.MarkIfAbsent(ctx, []byte("k")); err != nil {
				t.Fatal(err)
			}
			// Forget in the default namespace leaves "other" alone.
			if info, err := e.Forget(ctx, []byte("k")); err != nil || info.Outcome != engine.New {
				t.Fatal(info.Outcome, err)
			}
			if o, _ := other.MarkIfAbsent(ctx, []byte("k")); o != engine.Duplicate {
				t.Fatalf("other/k after forgetting default/k: %v", o)
			}
			// A stale claim cannot commit after Forget seized and forgot its key.
			stale, err := e.Claim(ctx, []byte("s"))
			if err != nil || stale.Outcome != engine.New {
				t.Fatal(stale.Outcome, err)
			}
			stale.Result = []byte("stale")
			clock.Add(2 * time.Second)
			if cfg.name == "redis" {
				time.Sleep(1100 * time.Millisecond)
			}
			if _, err := e.Forget(ctx, []byte("s")); err != nil {
				t.Fatal(err)
			}
			if err := e.Commit(ctx, stale); !errors.Is(err, engine.ErrLeaseLost) {
				t.Fatalf("stale commit after Forget: %v", err)
			}
			if info, _ := e.Lookup(ctx, []byte("s")); info.Outcome != engine.New || info.Result != nil {
				t.Fatalf("after stale commit: %+v", info)
			}
			// Taken over; the stale one commits its result: refused; the new owner's stands.
			a, _ := e.Claim(ctx, []byte("t"))
			a.Result = []byte("A")
			clock.Add(2 * time.Second)
			if cfg.name == "redis" {
				time.Sleep(1100 * time.Millisecond)
			}
			b, err := e.Claim(ctx, []byte("t"))
			if err != nil || b.Outcome != engine.New {
				t.Fatal(b.Outcome, err)
			}
			b.Result = []byte("B")
			if err := e.Commit(ctx, a); !errors.Is(err, engine.ErrLeaseLost) {
				t.Fatalf("stale: %v", err)
			}
			if err := e.Commit(ctx, b); err != nil {
				t.Fatal(err)
			}
			if c, _ := e.Claim(ctx, []byte("t")); c.Outcome != engine.Duplicate || string(c.Result) != "B" {
				t.Fatalf("t = %v %q", c.Outcome, c.Result)
			}
		})
	}
}

// TestRedisResultBytes: results whose bytes look like the Redis value
// layout (tags, zero digests, 8, 16 and 24 bytes) come back whole to
// another process, through Claim and Lookup.
func TestRedisResultBytes(t *testing.T) {
	ctx := context.Background()
	c := redistest.Start(t).Client(t)
	prefix := fmt.Sprintf("rbytes-%d:", time.Now().UnixNano())
	o := engine.Options{MaxAttempts: 2}
	a := openRedis(t, c, prefix, o)
	defer a.Close()
	b := openRedis(t, c, prefix, o)
	defer b.Close()
	results := [][]byte{{'C'}, []byte("C0123456789abcdef:1"), bytes.Repeat([]byte{0}, 16), bytes.Repeat([]byte{'D'}, 8), []byte("R5"), bytes.Repeat([]byte{0xff}, 24), []byte("H"), []byte("E3")}
	for i, r := range results {
		k := []byte(fmt.Sprint("k", i))
		cl, err := mustNamespace(t, a, "").ClaimDigest(ctx, k, engine.Digest{})
		if err != nil || cl.Outcome != engine.New {
			t.Fatal(cl.Outcome, err)
		}
		cl.Result = r
		if err := a.Commit(ctx, cl); err != nil {
			t.Fatal(err)
		}
		got, err := b.Claim(ctx, k)
		if err != nil || got.Outcome != engine.Duplicate || !bytes.Equal(got.Result, r) {
			t.Errorf("%d: %v %q %v", i, got.Outcome, got.Result, err)
		}
		info, err := b.Lookup(ctx, k)
		if err != nil || info.Outcome != engine.Duplicate || !bytes.Equal(info.Result, r) {
			t.Errorf("lookup %d: %v %q %v", i, info.Outcome, info.Result, err)
		}
	}
}
