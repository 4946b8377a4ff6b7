package pebble

import (
	"context"
	"errors"
	"fmt"
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

// TestCloseWrites: after CloseWrites(before), a batch of records into a
// partition before it is refused (ErrUnavailable, nothing of the batch
// written, the store not latched), one at or after it is written; the
// floor never moves back; and a write that entered before is durable
// when CloseWrites returns (readable by the copy that follows).
func TestCloseWrites(t *testing.T) {
	s := open(t, Options{Dir: t.TempDir()})
	defer s.Close()
	ctx := context.Background()
	commit := func(p int64, keys ...string) error {
		reqs := make([]tier.Request, len(keys))
		for i, k := range keys {
			reqs[i] = tier.Request{Key: []byte(k)}
		}
		return s.Commit(ctx, p, reqs, make([]tier.Status, len(reqs)))
	}
	if err := commit(5, "before"); err != nil {
		t.Fatal(err)
	}
	if err := s.CloseWrites(7); err != nil {
		t.Fatal(err)
	}
	if err := s.CloseWrites(6); err != nil { // a late copy: the floor stays
		t.Fatal(err)
	}
	for _, p := range []int64{5, 6} {
		if err := commit(p, "late"); !errors.Is(err, tier.ErrUnavailable) {
			t.Fatalf("a write into partition %d after CloseWrites(7): %v, want ErrUnavailable", p, err)
		}
	}
	if err := commit(7, "at"); err != nil {
		t.Fatalf("a write at the floor (the store latched?): %v", err)
	}
	var got []string
	if err := s.Scan(ctx, 0, 100, func(p int64, _, key []byte) error {
		got = append(got, fmt.Sprint(p, ":", string(key)))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != "[5:before 7:at]" {
		t.Fatalf("records %v, want [5:before 7:at]", got)
	}
}
