package pebble

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/tier"
)

// TestSeals: a seal is refused for a partition the persisted clock has not
// left, refuses writes into its partition and every one before it (across
// a reopen), and goes with its partition at Drop.
func TestSeals(t *testing.T) {
	dir := t.TempDir()
	s := open(t, Options{Dir: dir}) // hour partitions
	hour := int64(time.Hour)
	commit := func(s *Store, p int64, key string) error {
		return s.Commit(context.Background(), p, []tier.Request{{Key: []byte(key)}}, make([]tier.Status, 1))
	}
	if err := commit(s, 10, "a"); err != nil {
		t.Fatal(err)
	}
	if err := s.Drop(0, 11*hour+5); err != nil { // the clock is in partition 11
		t.Fatal(err)
	}
	if err := s.SealPartition(11, Seal{ID: 1}); !errors.Is(err, ErrOptions) {
		t.Fatalf("sealing the clock's own partition: %v, want ErrOptions", err)
	}
	if err := s.SealPartition(10, Seal{ID: 7, Sum: 8, Size: 9}); err != nil {
		t.Fatal(err)
	}
	if err := s.SealPartition(9, Seal{ID: 5, Sum: 6, Size: 7}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []int64{9, 10} {
		if err := commit(s, p, "late"); !errors.Is(err, ErrSealed) {
			t.Fatalf("write into sealed partition %d: %v, want ErrSealed", p, err)
		}
	}
	if err := commit(s, 11, "b"); err != nil {
		t.Fatalf("a refused write latched the store: %v", err)
	}
	seals, err := s.Seals(0)
	if err != nil || len(seals) != 2 || seals[10] != (Seal{ID: 7, Sum: 8, Size: 9}) || seals[9] != (Seal{ID: 5, Sum: 6, Size: 7}) {
		t.Fatalf("Seals = %v, %v", seals, err)
	}
	if seals, _ := s.Seals(10); len(seals) != 1 {
		t.Fatalf("Seals(10) = %v", seals)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = open(t, Options{Dir: dir})
	defer s.Close()
	if err := commit(s, 10, "late"); !errors.Is(err, ErrSealed) {
		t.Fatalf("after reopen, write into a sealed partition: %v", err)
	}
	if err := s.Drop(10, 12*hour); err != nil {
		t.Fatal(err)
	}
	if seals, err := s.Seals(0); err != nil || len(seals) != 1 || seals[10].ID != 7 {
		t.Fatalf("after Drop(10), Seals = %v, %v (partition 9's seal must go)", seals, err)
	}
}
