package bench

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// TestPebbleBaseline: with Read, a key already written is not fresh, and
// a reopened directory still holds it (the batches were synced); without,
// every key is written and fresh; a temporary directory is removed at
// Close.
func TestPebbleBaseline(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "db")
	p, err := OpenPebbleBaseline(PebbleBaselineOptions{Dir: dir, Read: true})
	if err != nil {
		t.Fatal(err)
	}
	fresh := make([]bool, 3)
	if err := p.Mark(ctx, [][]byte{[]byte("a"), []byte("b"), []byte("c")}, fresh); err != nil {
		t.Fatal(err)
	}
	if !fresh[0] || !fresh[1] || !fresh[2] {
		t.Fatalf("first marks: fresh %v", fresh)
	}
	p.Close()
	if p, err = OpenPebbleBaseline(PebbleBaselineOptions{Dir: dir, Read: true}); err != nil {
		t.Fatal(err)
	}
	if err := p.Mark(ctx, [][]byte{[]byte("b"), []byte("d"), []byte("a")}, fresh); err != nil {
		t.Fatal(err)
	}
	if fresh[0] || !fresh[1] || fresh[2] {
		t.Fatalf("after reopening: fresh %v, want [false true false]", fresh)
	}
	p.Close()

	blind, err := OpenPebbleBaseline(PebbleBaselineOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tmp := blind.dir
	if err := blind.Mark(ctx, [][]byte{[]byte("a"), []byte("a")}, fresh[:2]); err != nil {
		t.Fatal(err)
	}
	if !fresh[0] || !fresh[1] {
		t.Fatalf("blind writes: fresh %v", fresh[:2])
	}
	blind.Close()
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Fatalf("the temporary directory %s is still there: %v", tmp, err)
	}
}
