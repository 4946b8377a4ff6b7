package pebble

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/internal/faultfs"
	"github.com/tierdedup/tierdedup/tier"
)

// TestMoveGateHeldAcrossClose: a test that held the move gate when a
// fault hit keeps it held until the store is closed (internal/faultfs),
// so that no move rotates a WAL the fault may have failed. A move waiting
// for the gate must then let Close end it, not hold Close up forever (it
// did while it waited on the lock itself); nothing moves meanwhile, and
// the partition moves after a reopen.
func TestMoveGateHeldAcrossClose(t *testing.T) {
	mem := vfs.NewMem()
	fs := faultfs.Wrap(mem, &faultfs.Fault{})
	s := open(t, Options{Dir: "db", FS: fs})
	const n = 200
	for _, p := range []int64{10, 11} {
		reqs := make([]tier.Request, n)
		for i := range reqs {
			reqs[i] = tier.Request{NS: "ns", Key: fmt.Appendf(nil, "p%d-k%d", p, i)}
		}
		if err := s.Commit(context.Background(), p, reqs, make([]tier.Status, n)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Drop(0, 12*int64(time.Hour)+1); err != nil { // the clock past partition 11
		t.Fatal(err)
	}
	gate := fs.MoveGate()
	gate.Lock()
	if err := s.SealPartition(10, Seal{ID: 1}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the mover is woken, and waits
	if got := s.coldUpTo.Load(); got >= 10 {
		t.Fatalf("partition 10 moved (coldUpTo %d) while the gate was held", got)
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		gate.Unlock()
		<-closed
		t.Fatal("Close waited 10 s for a move waiting on the held gate")
	}
	gate.Unlock()
	s = open(t, Options{Dir: "db", FS: fs})
	defer s.Close()
	waitMoved(t, s, 10)
	if got := hotRecords(t, s, 10); got != 0 {
		t.Fatalf("after the reopen partition 10 left %d records in the hot database", got)
	}
}
