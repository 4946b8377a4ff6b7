package embedded

import (
	"testing"

	"github.com/tierdedup/tierdedup/tier/bloom"
	"github.com/tierdedup/tierdedup/tier/pebble"
)

// TestSealedAccept: each field that binds a sealed file to its store, its
// partition and its seal refuses the file on its own. Through the public
// API the random seal ID refuses foreign and misplaced files first, so
// each other check is shown here.
func TestSealedAccept(t *testing.T) {
	id := [16]byte{7}
	seal := pebble.Seal{ID: 42, Sum: 0xabc, Size: 100}
	good := bloom.SnapshotHeader{SnapshotMeta: bloom.SnapshotMeta{Kind: bloom.SnapshotPartition, StoreID: id, Epoch: 42}, Newest: 9, Sum: 0xabc}
	if err := sealedAccept(good, id, 9, seal); err != nil {
		t.Fatalf("the right file refused: %v", err)
	}
	for name, change := range map[string]func(*bloom.SnapshotHeader){
		"kind":      func(h *bloom.SnapshotHeader) { h.Kind = bloom.SnapshotCache },
		"store":     func(h *bloom.SnapshotHeader) { h.StoreID[0] = 8 },
		"partition": func(h *bloom.SnapshotHeader) { h.Newest = 8 },
		"seal ID":   func(h *bloom.SnapshotHeader) { h.Epoch = 43 },
		"checksum":  func(h *bloom.SnapshotHeader) { h.Sum = 0xabd },
	} {
		h := good
		change(&h)
		if err := sealedAccept(h, id, 9, seal); err == nil {
			t.Errorf("a file with another %s was accepted", name)
		}
	}
}
