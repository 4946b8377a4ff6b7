package engine_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// FuzzClaim feeds hostile keys and namespaces to the public API of the
// durable configuration. Every call must return a typed error or a
// consistent answer: never panic, never accept a key it then forgets.
func FuzzClaim(f *testing.F) {
	f.Add("", []byte("6ba7b810-9dad-11d1-80b4-00c04fd430c8"), []byte("payload"))
	f.Add("", []byte{}, []byte{})
	f.Add("orders", make([]byte, 1<<20), []byte{})
	f.Add("\x00", []byte{0xff, 0xfe, 0x00, 0x80}, []byte{0xc3, 0x28})
	f.Add(strings.Repeat("n", 255), []byte("k"), []byte(nil))
	f.Add(strings.Repeat("n", 256), []byte("k"), []byte(nil))
	f.Add("\x00token/used", []byte("k"), []byte(nil))
	f.Add("ns", []byte(strings.Repeat("x", engine.DefaultMaxKeySize)), []byte("p"))
	f.Add("ns", []byte(strings.Repeat("x", engine.DefaultMaxKeySize+1)), []byte("p"))

	e, err := engine.Open(&engine.Options{Backend: &embedded.Backend{Dir: "db", FS: vfs.NewMem(), NoSync: true}, ExpectedKeys: 10_000, Logger: quiet})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { e.Close() })
	ctx := context.Background()

	f.Fuzz(func(t *testing.T, name string, key, payload []byte) {
		ns, err := e.Namespace(name)
		if len(name) > engine.MaxNamespace || strings.HasPrefix(name, "\x00") {
			if !errors.Is(err, engine.ErrNamespace) {
				t.Fatalf("namespace %q of %d bytes: %v", name, len(name), err)
			}
			return
		}
		if err != nil {
			t.Fatalf("namespace %q: %v", name, err)
		}
		d := engine.DigestOf(payload)
		c, err := ns.ClaimDigest(ctx, key, d)
		switch {
		case len(key) == 0:
			if !errors.Is(err, engine.ErrEmptyKey) {
				t.Fatalf("empty key: %v", err)
			}
			return
		case len(key) > engine.DefaultMaxKeySize:
			if !errors.Is(err, engine.ErrKeyTooLong) {
				t.Fatalf("key of %d bytes: %v", len(key), err)
			}
			return
		case err != nil:
			t.Fatalf("claim: %v", err)
		}
		if c.Outcome == engine.New {
			if err := e.Commit(ctx, c); err != nil {
				t.Fatalf("commit: %v", err)
			}
		} else if c.Outcome != engine.Duplicate && c.Outcome != engine.Conflict {
			t.Fatalf("first claim of a fresh fuzz key = %v", c.Outcome)
		}
		// The engine is shared across inputs, so a key may have been
		// committed earlier with another payload: it stays a conflict.
		want := engine.Duplicate
		if c.Outcome == engine.Conflict {
			want = engine.Conflict
		}
		again, err := ns.ClaimDigest(ctx, key, d)
		if err != nil || again.Outcome != want {
			t.Fatalf("claim after commit = %v, %v; want %v", again.Outcome, err, want)
		}
		// Clip: the fuzzer's payload may share an array with key.
		other, err := ns.ClaimDigest(ctx, key, engine.DigestOf(append(slices.Clip(payload), 1)))
		if err != nil || (other.Outcome != engine.Conflict && c.Outcome == engine.New) {
			t.Fatalf("claim with another payload = %v, %v; want conflict", other.Outcome, err)
		}
	})
}

// FuzzOptions opens an engine with arbitrary Options and runs a short call
// sequence (claims, commits, releases, one-shot marks, clock jumps of up to
// twice MaxWindow either way, a restart). Invalid options must be refused
// with ErrOptions; valid ones must never make a call panic, and a key
// committed a moment ago must not be New.
func FuzzOptions(f *testing.F) {
	f.Add(uint8(0), int64(0), int64(0), int64(0), 0, 0, 0, 0.0, 0, 0, []byte{0, 1, 2, 3})
	f.Add(uint8(1), int64(engine.MaxWindow), int64(engine.MaxWindow/63), int64(engine.MaxWindow-1), 1, 1, 1, 0.5, 1, 1, []byte{4, 5, 6})
	f.Add(uint8(2), int64(1<<62), int64(1<<62), int64(1<<62), 1<<40, 1<<20, 1<<50, 1e-300, 1<<20, 1<<30, []byte{7})
	f.Add(uint8(0), int64(time.Second), int64(time.Second), int64(time.Nanosecond), 3, 2, 100, 0.999999, 65535, 1, []byte{1, 7, 1, 7})
	f.Add(uint8(1), int64(8e18), int64(2e17), int64(0), 0, 0, 0, 0.0, 0, 0, []byte{2, 2})     // a window of 250 years
	f.Add(uint8(2), int64(0), int64(0), int64(0), 0, 0, 1<<50, 0.0, 0, 0, []byte{2, 2})       // filters of petabytes
	f.Add(uint8(1), int64(0), int64(0), int64(0), 1<<40, 1, 0, 0.0, 0, 0, []byte{2, 2})       // a trillion cached keys
	f.Add(uint8(1), int64(0), int64(0), int64(1<<62), 0, 0, 0, 0.0, 0, 0, []byte{0, 0, 2, 2}) // a lease of centuries
	f.Fuzz(func(t *testing.T, tiers uint8, window, partition, lease int64, capacity, stripes, expected int, fp float64, attempts, maxKey int, ops []byte) {
		clock := newClock()
		o := engine.Options{
			Tiers: engine.Tiers(tiers % 4), Window: time.Duration(window), Partition: time.Duration(partition),
			Lease: time.Duration(lease), MemoryCapacity: capacity, Stripes: stripes, ExpectedKeys: expected,
			FalsePositive: fp, MaxAttempts: attempts, MaxKeySize: maxKey, Clock: clock, Logger: quiet,
		}
		if o.Tiers > engine.BloomOnly { // 3, once Redis, which needs a server
			o.Tiers = engine.MemoryOnly
		}
		fs := vfs.NewMem()
		if o.Tiers == engine.Default || o.Tiers == engine.BloomOnly {
			o.Backend = &embedded.Backend{Dir: "db", FS: fs, NoSync: true}
		}
		verr := o.Validate()
		e, err := engine.Open(&o)
		if verr != nil {
			if !errors.Is(err, engine.ErrOptions) {
				t.Fatalf("Validate: %v; Open: %v, want ErrOptions", verr, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("valid options refused by Open: %v", err)
		}
		// A resource cap of this test, not of the engine: valid options may
		// ask for filters larger than a fuzzing machine holds.
		if o.Tiers != engine.MemoryOnly && bloomBytes(o) > 64<<20 {
			_ = e.Close()
			return
		}
		ctx := context.Background()
		for i, op := range ops {
			key := []byte{'a' + op%8} // one byte: MaxKeySize may be 1
			switch op % 6 {
			case 0, 1:
				c, err := e.Claim(ctx, key)
				if err == nil && c.Outcome == engine.New {
					if op%2 == 0 {
						err = e.Commit(ctx, c)
					} else {
						err = e.Release(ctx, c)
					}
				}
				if err != nil && !errors.Is(err, engine.ErrLeaseLost) {
					t.Fatalf("op %d: %v", i, err)
				}
			case 2:
				out, err := e.MarkIfAbsent(ctx, key)
				if err != nil {
					t.Fatalf("op %d: mark: %v", i, err)
				}
				if out == engine.New {
					if again, err := e.MarkIfAbsent(ctx, key); err != nil || again == engine.New {
						t.Fatalf("op %d: a key marked a moment ago = %v, %v", i, again, err)
					}
				}
			case 3:
				clock.Add(time.Duration(int64(op)*int64(engine.MaxWindow)/128) - engine.MaxWindow)
			case 4:
				if err := e.Close(); err != nil {
					t.Fatalf("op %d: close: %v", i, err)
				}
				if e, err = engine.Open(&o); err != nil {
					// A clock outside the range the engine takes as time,
					// with no stored reading, is refused: nothing to run.
					if now := clock.Now(); errors.Is(err, engine.ErrOptions) && (now.Year() < 1970 || now.Year() > 2231) {
						return
					}
					t.Fatalf("op %d: reopen: %v", i, err)
				}
			case 5:
				_ = e.Stats()
			}
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

// bloomBytes is the memory all live filters of o take once full.
func bloomBytes(o engine.Options) float64 {
	window, partition := o.Window, o.Partition
	if window == 0 {
		window = engine.DefaultWindow
	}
	if partition == 0 {
		partition = engine.DefaultPartition
	}
	fp, n := o.FalsePositive, float64(o.ExpectedKeys)
	if fp == 0 {
		fp = 0.01
	}
	if n == 0 {
		n = 10e6
	}
	live := float64((window+partition-1)/partition + 1)
	per := -math.Expm1(math.Log1p(-fp) / live)
	return live * n * -math.Log(per) / (math.Ln2 * math.Ln2) / 8
}

// FuzzConsumeToken feeds hostile strings to ConsumeToken beside one real
// token: every string but the one IssueToken returned is ErrTokenUnknown
// (one spelling per token) and never uses the real token, which is then
// consumed exactly once.
func FuzzConsumeToken(f *testing.F) {
	for _, s := range []string{"", "AAAAAAAAAAAAAAAAAAAAAA", "AAAAAAAAAAAAAAAAAAAAAB", "AAAAAAAAAAAAAAAAAAAAA", "AAAAAAAAAAAAAAAAAAAAAAA",
		"AAAAAAAAAAAAAAAAAAAAAA==", "AAAAAAAAAAA\nAAAAAAAAAAA", "+/+/+/+/+/+/+/+/+/+/+/", "________________________", "\x00\xff"} {
		f.Add(s)
	}
	e, err := engine.Open(&engine.Options{Backend: &embedded.Backend{Dir: "db", FS: vfs.NewMem(), NoSync: true}, ExpectedKeys: 10_000, Logger: quiet})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { e.Close() })
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := e.IssueToken(ctx, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if s != tok {
			if err := e.ConsumeToken(ctx, s); !errors.Is(err, engine.ErrTokenUnknown) {
				t.Fatalf("ConsumeToken(%q): %v, want ErrTokenUnknown", s, err)
			}
			// The real token's real neighbours: its own bytes, changed by s.
			if len(s) > 0 {
				near := []byte(tok)
				near[int(s[0])%len(near)] ^= s[len(s)-1] | 1
				if string(near) != tok {
					if err := e.ConsumeToken(ctx, string(near)); !errors.Is(err, engine.ErrTokenUnknown) {
						t.Fatalf("ConsumeToken(%q) beside %q: %v, want ErrTokenUnknown", near, tok, err)
					}
				}
			}
		}
		if err := e.ConsumeToken(ctx, tok); err != nil {
			t.Fatalf("the real token after %q: %v", s, err)
		}
		if err := e.ConsumeToken(ctx, tok); !errors.Is(err, engine.ErrTokenUsed) {
			t.Fatalf("the real token twice: %v, want ErrTokenUsed", err)
		}
	})
}

// FuzzReadExport feeds hostile manifests to ReadExport, each inside an
// envelope whose checksum matches (so the manifest's own decoding is
// reached) and bare: every one is described or refused with ErrExport,
// never a panic or another error.
func FuzzReadExport(f *testing.F) {
	f.Add([]byte(`{"format":1,"version":1,"created":0,"files":[]}`))
	f.Add([]byte(`{"format":1,"files":[{"name":"../x","size":1,"sha256":""}]}`))
	f.Add([]byte(`{"format":1,"files":[{"name":"sealed/x","size":-1,"sha256":"00"}]}`))
	f.Add([]byte(`{"format":2}`))
	f.Add([]byte(`{"format":1,"unknown":true}`))
	f.Add([]byte(`null`))
	f.Add([]byte{0xff, 0x00})
	f.Fuzz(func(t *testing.T, manifest []byte) {
		for _, wrapped := range []bool{true, false} {
			raw := manifest
			if wrapped {
				sum := sha256.Sum256(manifest)
				env, err := json.Marshal(map[string]any{"manifest": json.RawMessage(manifest), "sha256": hex.EncodeToString(sum[:])})
				if err != nil {
					continue // not JSON: json.RawMessage refuses it
				}
				raw = env
			}
			fs := vfs.NewMem()
			if err := fs.MkdirAll("x", 0o755); err != nil {
				t.Fatal(err)
			}
			w, err := fs.Create("x/tierdedup-export.json", vfs.WriteCategoryUnspecified)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := w.Write(raw); err != nil {
				t.Fatal(err)
			}
			w.Close()
			info, err := embedded.ReadExport(fs, "x")
			if err != nil && !errors.Is(err, engine.ErrExport) {
				t.Fatalf("ReadExport of %q (wrapped %v): %v, want nil or ErrExport", manifest, wrapped, err)
			}
			if err == nil && (info.Files < 0 || info.Bytes < 0) {
				t.Fatalf("ReadExport of %q described %+v", manifest, info)
			}
		}
	})
}
