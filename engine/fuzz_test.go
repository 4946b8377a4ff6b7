package engine_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
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
	f.Add("ns", []byte(strings.Repeat("x", engine.DefaultMaxKeySize)), []byte("p"))
	f.Add("ns", []byte(strings.Repeat("x", engine.DefaultMaxKeySize+1)), []byte("p"))

	e, err := engine.Open(&engine.Options{Dir: "db", FS: vfs.NewMem(), NoSync: true, ExpectedKeys: 10_000, Logger: quiet})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { e.Close() })
	ctx := context.Background()

	f.Fuzz(func(t *testing.T, name string, key, payload []byte) {
		ns, err := e.Namespace(name)
		if len(name) > engine.MaxNamespace {
			if !errors.Is(err, engine.ErrNamespace) {
				t.Fatalf("namespace of %d bytes: %v", len(name), err)
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
