package pebble

import (
	"errors"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// allocFile records the preallocations it is asked for.
type allocFile struct {
	vfs.File
	allocs [][2]int64
	fail   bool
}

func (f *allocFile) Preallocate(offset, length int64) error {
	if f.fail {
		return errors.New("no fallocate")
	}
	f.allocs = append(f.allocs, [2]int64{offset, length})
	return nil
}

func (f *allocFile) Write(p []byte) (int, error) { return len(p), nil }

// TestWALAllocationFollowsWrites: a WAL file's blocks are allocated ahead
// of its writes, contiguously, never more than twice what it holds (or
// the first chunk), in as many calls as doublings up to the largest
// chunk; Pebble's own preallocation is ignored, and a filesystem that
// cannot preallocate only loses the preallocation.
func TestWALAllocationFollowsWrites(t *testing.T) {
	inner := &allocFile{}
	f := &walFile{File: inner}
	if err := f.Preallocate(0, 70<<20); err != nil || len(inner.allocs) != 0 {
		t.Fatalf("Pebble's preallocation reached the file: %v, %v", err, inner.allocs)
	}
	var written int64
	buf := make([]byte, 32<<10)
	for written < 300<<20 {
		if _, err := f.Write(buf); err != nil {
			t.Fatal(err)
		}
		written += int64(len(buf))
		if f.allocated < written {
			t.Fatalf("at %d bytes written, %d allocated", written, f.allocated)
		}
		if limit := min(2*written, written+walChunkMax) + walChunkMin; f.allocated > limit {
			t.Fatalf("at %d bytes written, %d allocated: over %d", written, f.allocated, limit)
		}
	}
	var end int64
	for _, a := range inner.allocs {
		if a[0] != end || a[1] > walChunkMax {
			t.Fatalf("allocations %v: not contiguous chunks of at most %d", inner.allocs, walChunkMax)
		}
		end += a[1]
	}
	// 1, 1, 2, 4, ... 64 MiB, then 64 MiB chunks: 8 calls to 128 MiB, 3 more to 300.
	if len(inner.allocs) > 12 {
		t.Fatalf("%d preallocations for 300 MiB: %v", len(inner.allocs), inner.allocs)
	}
	bad := &walFile{File: &allocFile{fail: true}}
	if n, err := bad.Write(buf); n != len(buf) || err != nil {
		t.Fatalf("a write where fallocate fails: %d, %v", n, err)
	}
}
