package pebble

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/tier"
)

// moveIngested leaves partition 10 of a coldFixture store as a crash
// between a move's steps 2 and 3 leaves it: sealed, its records and marker
// ingested into the cold database, keyMoved not recorded, every record
// still in the hot database (where reads find it).
func moveIngested(t *testing.T, s *Store) {
	t.Helper()
	if err := s.set(sealKey(10), make([]byte, sealLen)); err != nil {
		t.Fatal(err)
	}
	s.sealed.Store(10)
	s.moveMu.Lock()
	paths, err := s.writeMoveTables(context.Background(), 10)
	if err == nil {
		err = s.cold.Ingest(context.Background(), paths)
	}
	s.moveMu.Unlock()
	for _, p := range paths {
		_ = os.Remove(p)
	}
	if err != nil {
		t.Fatal(err)
	}
	if s.coldUpTo.Load() >= 10 {
		t.Fatalf("coldUpTo %d: the move was recorded", s.coldUpTo.Load())
	}
}

// TestMovesForgetBeforeInterruptedMoveCompletes: a move ingested
// partition 10 into the cold database and the process crashed before it
// recorded keyMoved (the state TestInterruptedMoveCompletes builds). The
// next process forgets a key of partition 10 before its mover completes
// that move (Forget and the mover both take moveMu; the Forget can come
// first): the key is read in, and deleted from, the hot database only.
// Were the mover to find the marker and complete the move without copying
// again, reads of partition 10 would go to the cold copy, which still
// holds the forgotten key: Committed again after a Forget that returned
// nil. Open deletes such an unrecorded copy, and the mover copies again.
//
// The second case forgets every key of partition 10: the mover then never
// completes that move by itself (no hot record left to find), but the
// move of partition 11 makes coldUpTo 11, and partition 10's stale cold
// copy answers for every forgotten key.
func TestMovesForgetBeforeInterruptedMoveCompletes(t *testing.T) {
	const n = 50
	for _, all := range []bool{false, true} {
		t.Run(fmt.Sprintf("all=%v", all), func(t *testing.T) {
			dir := t.TempDir()
			s := coldFixture(t, dir, n)
			moveIngested(t, s)
			forget := []tier.Request{{NS: "ns", Key: []byte("p10-k7"), Oldest: 9, Mask: 0b1110}}
			if all {
				forget = forget[:0]
				for i := range n {
					forget = append(forget, tier.Request{NS: "ns", Key: fmt.Appendf(nil, "p10-k%d", i), Oldest: 9, Mask: 0b1110})
				}
			}
			out := make([]tier.Answer, len(forget))
			// The crash, then the Forget the next process runs before its
			// mover's first pass may (in the process that ingested, the
			// mover could complete the move first: no crash there).
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = open(t, Options{Dir: dir})
			if err := s.Forget(context.Background(), forget, out); err != nil || out[0].Status != tier.Committed {
				t.Fatalf("Forget: %+v, %v", out[0], err)
			}
			if err := s.Claim(context.Background(), forget, 0, out); err != nil || out[0].Status != tier.Absent {
				t.Fatalf("right after Forget: %+v, %v", out[0], err)
			}
			if err := s.Close(); err != nil { // the crash: the mover wakes at the next Open
				t.Fatal(err)
			}
			s = open(t, Options{Dir: dir})
			defer s.Close()
			if all {
				// Nothing of partition 10 is hot: the mover leaves it; the
				// next seal moves 11.
				if err := s.Drop(0, 13*int64(time.Hour)+1); err != nil {
					t.Fatal(err)
				}
				if err := s.SealPartition(11, Seal{ID: 2}); err != nil {
					t.Fatal(err)
				}
				waitMoved(t, s, 11)
			} else {
				waitMoved(t, s, 10)
			}
			if err := s.Claim(context.Background(), forget, 0, out); err != nil {
				t.Fatal(err)
			}
			back := 0
			for _, a := range out {
				if a.Status != tier.Absent {
					back++
				}
			}
			if back > 0 {
				t.Fatalf("after the move completed, %d of %d forgotten keys answer %v again (partition %d, coldUpTo %d)",
					back, len(out), out[0].Status, out[0].Partition, s.coldUpTo.Load())
			}
		})
	}
}

// TestMovesMoveOfManyTables: a partition larger than moveTableSize is
// moved as several tables in one ingest; every key still answers
// Committed from the cold database, a Forget there holds across a reopen,
// and Scan sees each record once.
func TestMovesMoveOfManyTables(t *testing.T) {
	const n = 150_000
	dir := t.TempDir()
	s := open(t, Options{Dir: dir})
	keys := make([][]byte, n)
	for i := range keys {
		raw := make([]byte, 40)
		_, _ = rand.Read(raw)
		keys[i] = fmt.Appendf(nil, "k%07d-%s", i, hex.EncodeToString(raw))
	}
	for start := 0; start < n; start += 10_000 {
		reqs := make([]tier.Request, 10_000)
		for i := range reqs {
			reqs[i] = tier.Request{NS: "ns", Key: keys[start+i]}
		}
		if err := s.Commit(context.Background(), 10, reqs, make([]tier.Status, len(reqs))); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Drop(0, 12*int64(time.Hour)+1); err != nil {
		t.Fatal(err)
	}
	if err := s.SealPartition(10, Seal{ID: 1}); err != nil {
		t.Fatal(err)
	}
	waitMoved(t, s, 10)
	if got := hotRecords(t, s, 10); got != 0 {
		t.Fatalf("%d records left hot", got)
	}
	m := s.cold.Metrics()
	files := 0
	for _, l := range m.Levels {
		files += int(l.TablesCount)
	}
	if files < 3 {
		t.Fatalf("the move made %d tables: the partition was not larger than one", files)
	}
	check := func(what string, forgotten int) {
		t.Helper()
		found := 0
		for start := 0; start < n; start += 10_000 {
			reqs := make([]tier.Request, 10_000)
			for i := range reqs {
				reqs[i] = tier.Request{NS: "ns", Key: keys[start+i], Oldest: 9, Mask: 0b1110}
			}
			out := make([]tier.Answer, len(reqs))
			if err := s.Claim(context.Background(), reqs, 0, out); err != nil {
				t.Fatal(err)
			}
			for _, a := range out {
				if a.Status == tier.Committed {
					found++
				}
			}
		}
		if found != n-forgotten {
			t.Fatalf("%s: %d keys Committed, want %d", what, found, n-forgotten)
		}
		scanned := 0
		if err := s.Scan(context.Background(), 0, 12, func(int64, []byte, []byte) error { scanned++; return nil }); err != nil || scanned != n-forgotten {
			t.Fatalf("%s: Scan saw %d records (%v), want %d", what, scanned, err, n-forgotten)
		}
	}
	check("moved", 0)
	forget := []tier.Request{{NS: "ns", Key: keys[n/2], Oldest: 9, Mask: 0b1110}, {NS: "ns", Key: keys[n-1], Oldest: 9, Mask: 0b1110}}
	if err := s.Forget(context.Background(), forget, make([]tier.Answer, 2)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, Options{Dir: dir})
	defer s.Close()
	check("reopened after a Forget", 2)
}
