package pebble

import (
	"context"
	"errors"
	"fmt"
	"github.com/tierdedup/tierdedup/internal/hooks"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/tierdedup/tierdedup/tier"
)

// coldFixture is a store with keys k0..k(n-1) committed in partitions 10
// and 11 (hour partitions), its clock in partition 12.
func coldFixture(t *testing.T, dir string, n int) *Store {
	t.Helper()
	s := open(t, Options{Dir: dir})
	hour := int64(time.Hour)
	for _, p := range []int64{10, 11} {
		reqs := make([]tier.Request, n)
		for i := range reqs {
			reqs[i] = tier.Request{NS: "ns", Key: fmt.Appendf(nil, "p%d-k%d", p, i), Digest: Digest{byte(p)}}
		}
		if err := s.Commit(context.Background(), p, reqs, make([]tier.Status, n)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Drop(0, 12*hour+1); err != nil {
		t.Fatal(err)
	}
	return s
}

// hotRecords counts the records of partition p in the hot database.
func hotRecords(t *testing.T, s *Store, p int64) int {
	t.Helper()
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: recordPrefix(p), UpperBound: recordPrefix(p + 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	n := 0
	for ok := it.First(); ok; ok = it.Next() {
		n++
	}
	return n
}

// claimAll claims every key of coldFixture and counts the committed ones
// with their partition's digest.
func claimAll(t *testing.T, s *Store, n int) int {
	t.Helper()
	found := 0
	for _, p := range []int64{10, 11} {
		reqs := make([]tier.Request, n)
		for i := range reqs {
			reqs[i] = tier.Request{NS: "ns", Key: fmt.Appendf(nil, "p%d-k%d", p, i), Oldest: 9, Mask: 0b1110}
		}
		out := make([]tier.Answer, n)
		if err := s.Claim(context.Background(), reqs, 0, out); err != nil {
			t.Fatal(err)
		}
		for _, a := range out {
			if a.Status == tier.Committed && a.Partition == p && a.Digest == (Digest{byte(p)}) {
				found++
			}
		}
	}
	return found
}

func waitMoved(t *testing.T, s *Store, upTo int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.coldUpTo.Load() < upTo {
		if time.Now().After(deadline) {
			t.Fatalf("partitions up to %d not moved: coldUpTo %d, broken %v", upTo, s.coldUpTo.Load(), s.Broken())
		}
		time.Sleep(time.Millisecond)
	}
	s.moveMu.Lock() // the move that set coldUpTo has ended
	s.moveMu.Unlock()
}

// TestSealedPartitionsMoveToCold: a sealed partition leaves the hot
// database for the cold one, every key still answers Committed with its
// value, Scan still sees every record once in key order, Forget reaches
// the cold database, the move survives a reopen, and Drop removes expired
// partitions from the cold database.
func TestSealedPartitionsMoveToCold(t *testing.T) {
	const n = 3000
	dir := t.TempDir()
	s := coldFixture(t, dir, n)
	if err := s.SealPartition(10, Seal{ID: 1}); err != nil {
		t.Fatal(err)
	}
	waitMoved(t, s, 10)
	if got := hotRecords(t, s, 10); got != 0 {
		t.Fatalf("partition 10 left %d records in the hot database", got)
	}
	if got := hotRecords(t, s, 11); got != n {
		t.Fatalf("unsealed partition 11 has %d records in the hot database, want %d", got, n)
	}
	if got := claimAll(t, s, n); got != 2*n {
		t.Fatalf("after the move %d of %d keys answer Committed", got, 2*n)
	}
	var scanned []int64
	last := ""
	err := s.Scan(context.Background(), 0, 12, func(p int64, ns, key []byte) error {
		k := fmt.Sprintf("%d/%s", p, key)
		if k <= last {
			return fmt.Errorf("scan out of order: %s after %s", k, last)
		}
		last = k
		scanned = append(scanned, p)
		return nil
	})
	if err != nil || len(scanned) != 2*n {
		t.Fatalf("Scan: %d records, %v; want %d", len(scanned), err, 2*n)
	}
	// Forget one key of each partition: the cold one and the hot one.
	forget := []tier.Request{{NS: "ns", Key: []byte("p10-k7"), Oldest: 9, Mask: 0b110}, {NS: "ns", Key: []byte("p11-k7"), Oldest: 9, Mask: 0b110}}
	out := make([]tier.Answer, 2)
	if err := s.Forget(context.Background(), forget, out); err != nil || out[0].Status != tier.Committed || out[1].Status != tier.Committed {
		t.Fatalf("Forget: %+v, %v", out, err)
	}
	if err := s.Claim(context.Background(), forget, 0, out); err != nil || out[0].Status != tier.Absent || out[1].Status != tier.Absent {
		t.Fatalf("claims after Forget: %+v, %v", out, err)
	}
	if err := s.SealPartition(11, Seal{ID: 2}); err != nil {
		t.Fatal(err)
	}
	waitMoved(t, s, 11)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = open(t, Options{Dir: dir})
	defer s.Close()
	if s.coldUpTo.Load() != 11 || hotRecords(t, s, 11) != 0 {
		t.Fatalf("after reopen: coldUpTo %d, %d records of 11 hot", s.coldUpTo.Load(), hotRecords(t, s, 11))
	}
	if got := claimAll(t, s, n); got != 2*n-2 {
		t.Fatalf("after reopen %d keys answer Committed, want %d", got, 2*n-2)
	}
	if err := s.Drop(11, 13*int64(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if got := claimAll(t, s, n); got != n-1 {
		t.Fatalf("after dropping partition 10, %d keys answer Committed, want %d", got, n-1)
	}
	if ok, err := s.coldHas(10); ok || err != nil {
		t.Fatalf("partition 10's marker outlived its Drop: %v, %v", ok, err)
	}
}

// TestInterruptedMoveCompletes: a move that ingested its partition and
// crashed before the hot database forgot it is completed by the next
// Open; one that crashed while writing its tables leaves them behind,
// and Open removes them and the partition is moved again. Either way
// every key answers Committed once, from one database.
func TestInterruptedMoveCompletes(t *testing.T) {
	const n = 500
	for _, ingested := range []bool{true, false} {
		t.Run(fmt.Sprintf("ingested=%v", ingested), func(t *testing.T) {
			dir := t.TempDir()
			s := coldFixture(t, dir, n)
			// Seal partition 10 as SealPartition does, without waking the
			// mover, then run the move's first steps by hand.
			if err := s.set(sealKey(10), make([]byte, sealLen)); err != nil {
				t.Fatal(err)
			}
			s.sealed.Store(10)
			s.moveMu.Lock()
			paths, err := s.writeMoveTables(context.Background(), 10)
			if err == nil && ingested {
				err = s.cold.Ingest(context.Background(), paths)
			}
			s.moveMu.Unlock()
			if err != nil {
				t.Fatal(err)
			}
			if ingested {
				for _, p := range paths {
					_ = os.Remove(p)
				}
			}
			if err := s.Close(); err != nil { // the mover wakes only at Open
				t.Fatal(err)
			}
			if left, _ := filepath.Glob(filepath.Join(dir, "*"+moveTmpSuffix)); len(left) == 0 && !ingested {
				t.Fatal("no move tables left behind to test their removal")
			}
			s = open(t, Options{Dir: dir})
			defer s.Close()
			waitMoved(t, s, 10)
			if hot := hotRecords(t, s, 10); hot != 0 {
				t.Fatalf("%d records of partition 10 left hot", hot)
			}
			if left, _ := filepath.Glob(filepath.Join(dir, "*"+moveTmpSuffix)); len(left) != 0 {
				t.Fatalf("move tables left: %v", left)
			}
			if got := claimAll(t, s, n); got != 2*n {
				t.Fatalf("%d of %d keys answer Committed", got, 2*n)
			}
			cold, err := s.cold.NewIter(&pebble.IterOptions{LowerBound: recordPrefix(10), UpperBound: recordPrefix(11)})
			if err != nil {
				t.Fatal(err)
			}
			defer cold.Close()
			c := 0
			for ok := cold.First(); ok; ok = cold.Next() {
				c++
			}
			if c != n {
				t.Fatalf("the cold database holds %d records of partition 10, want %d (once)", c, n)
			}
		})
	}
}

// TestColdStoreIsBound: a cold database of another store, and a hot
// database that recorded a move with its cold database gone, are refused
// with ErrLayout.
func TestColdStoreIsBound(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	s := coldFixture(t, a, 10)
	if err := s.SealPartition(10, Seal{ID: 1}); err != nil {
		t.Fatal(err)
	}
	waitMoved(t, s, 10)
	_ = s.Close()
	_ = open(t, Options{Dir: b}).Close()

	if err := os.RemoveAll(filepath.Join(b, ColdSubdir)); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(a, ColdSubdir), filepath.Join(b, ColdSubdir)); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{a, b} {
		_, err := Open(&Options{Dir: dir, Logger: quiet, Partition: time.Hour, Window: 4 * time.Hour})
		var le *LayoutError
		if !errors.Is(err, ErrLayout) || !errors.As(err, &le) {
			t.Fatalf("open of %s: %v, want ErrLayout", dir, err)
		}
		if _, err := os.Stat(filepath.Join(a, ColdSubdir)); dir == a && err == nil {
			t.Fatal("the refused open created a cold database")
		}
	}
}

// TestColdTablesCarryNoFilter: a moved partition's tables in the cold
// database have no filter block (the engine's filters already chose the
// partition: a table filter there is a block load that answers yes),
// while the hot database's flushed tables keep theirs.
func TestColdTablesCarryNoFilter(t *testing.T) {
	s := coldFixture(t, t.TempDir(), 3000)
	defer s.Close()
	policies := func(db *pebble.DB) map[string]int {
		levels, err := db.SSTables(pebble.WithProperties())
		if err != nil {
			t.Fatal(err)
		}
		n := map[string]int{}
		for _, level := range levels {
			for _, tb := range level {
				n[tb.Properties.FilterPolicyName]++
			}
		}
		return n
	}
	if err := s.db.Flush(); err != nil {
		t.Fatal(err)
	}
	if hot := policies(s.db); len(hot) != 1 || hot[""] != 0 {
		t.Fatalf("hot tables by filter policy: %v, want every one with a filter", hot)
	}
	if err := s.SealPartition(10, Seal{ID: 1}); err != nil {
		t.Fatal(err)
	}
	waitMoved(t, s, 10)
	if cold := policies(s.cold); len(cold) != 1 || cold[""] == 0 {
		t.Fatalf("cold tables by filter policy: %v, want every one without a filter", cold)
	}
}

// TestKeepExpiredMovesEveryPartition: with KeepExpired, partitions that
// left the window before their move are moved all the same, in order, so
// every partition up to the moved one is read from the cold database, and
// holds all its records there (an archive reads them after the window).
// Without it the mover skips them, which is right only because Drop
// deletes them next.
func TestKeepExpiredMovesEveryPartition(t *testing.T) {
	const n = 500
	s := open(t, Options{Dir: t.TempDir(), KeepExpired: true})
	hour := int64(time.Hour)
	ctx := context.Background()
	for _, p := range []int64{10, 11, 20} {
		reqs := make([]tier.Request, n)
		for i := range reqs {
			reqs[i] = tier.Request{NS: "ns", Key: fmt.Appendf(nil, "p%d-k%d", p, i)}
		}
		if err := s.Commit(ctx, p, reqs, make([]tier.Status, n)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Drop(0, 22*hour+1); err != nil { // the clock: 10 and 11 left the window
		t.Fatal(err)
	}
	if err := s.SealPartition(20, Seal{ID: 1}); err != nil {
		t.Fatal(err)
	}
	waitMoved(t, s, 20)
	for _, p := range []int64{10, 11, 20} {
		if got := hotRecords(t, s, p); got != 0 {
			t.Errorf("partition %d: %d records left in the hot database", p, got)
		}
		got := 0
		if err := s.ScanRecords(ctx, p, func(*tier.Record) error { got++; return nil }); err != nil || got != n {
			t.Errorf("ScanRecords(%d): %d records, %v; want %d", p, got, err, n)
		}
		out := make([]tier.Answer, 1)
		req := []tier.Request{{NS: "ns", Key: fmt.Appendf(nil, "p%d-k7", p), Oldest: p, Mask: 1}}
		if err := s.Claim(ctx, req, 0, out); err != nil || out[0].Status != tier.Committed {
			t.Errorf("a key of partition %d: %v, %v", p, out[0].Status, err)
		}
	}
}

// TestCompactMovesSealedPartitionsFirst: Compact moves every sealed
// partition before it compacts, so that no partition is measured midway
// between the two databases: when it returns, a partition sealed just
// before is in the cold database only, even when the mover was in the
// middle of moving it (held between its ingest and its excise here).
func TestCompactMovesSealedPartitionsFirst(t *testing.T) {
	entered := make(chan struct{}, 1)
	slow := func() {
		select {
		case entered <- struct{}{}:
		default:
		}
		time.Sleep(300 * time.Millisecond)
	}
	hooks.InMove.Store(&slow)
	defer hooks.InMove.Store(nil)
	s := coldFixture(t, t.TempDir(), 20_000)
	defer s.Close()
	if err := s.SealPartition(10, Seal{ID: 1}); err != nil {
		t.Fatal(err)
	}
	<-entered // the mover has ingested partition 10, not yet excised it
	if err := s.Compact(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got, n := s.coldUpTo.Load(), hotRecords(t, s, 10); got < 10 || n != 0 {
		t.Fatalf("after Compact: moved up to %d, %d records of partition 10 in the hot database", got, n)
	}
}
