package backendtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/tierdedup/tierdedup/engine"
)

// Late is what LateGiveBack needs of a tier's fault: Arm makes the next
// mark's write apply and its reply be lost, and the give-back after it
// held; Applied reports that the write was applied; Deliver sends the
// held give-back now and reports whether there was one.
type Late interface {
	Arm()
	Applied() bool
	Deliver() bool
}

// LateGiveBack checks, through a (whose tier faults as f says) and b
// (another engine on the same tier, faulting never), that a give-back
// arriving after the retry it gave back for cannot undo what the retry
// acknowledged: a MarkBatch of 300 keys is applied and its reply lost
// (ErrUnavailable), its give-back held; the retry answers New for every
// key (its own lost mark); the give-back then arrives; every key must be a
// Duplicate for b.
func LateGiveBack(t *testing.T, a, b *engine.Engine, f Late) {
	t.Helper()
	keys := make([][]byte, 300)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "order-%d", i)
	}
	out := make([]engine.Outcome, len(keys))
	ctx := context.Background()
	f.Arm()
	if err := a.MarkBatch(ctx, keys, nil, out); !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("MarkBatch whose reply was lost: %v, want ErrUnavailable", err)
	}
	if !f.Applied() {
		t.Fatal("the mark was not applied")
	}
	if err := a.MarkBatch(ctx, keys, nil, out); err != nil {
		t.Fatalf("the retried MarkBatch: %v", err)
	}
	for i, o := range out {
		if o != engine.New {
			t.Fatalf("retried mark of %s = %v, want New (its own lost mark)", keys[i], o)
		}
	}
	if !f.Deliver() {
		t.Fatal("no give-back was held")
	}
	if err := b.MarkBatch(ctx, keys, nil, out); err != nil {
		t.Fatal(err)
	}
	lost := 0
	for _, o := range out {
		if o != engine.Duplicate {
			lost++
		}
	}
	if lost > 0 {
		t.Fatalf("%d of %d keys acknowledged New by the retry are New again after the first call's late give-back", lost, len(keys))
	}
}

// LargeResults commits, through e (MaxResultSize engine.MaxResultSize), a
// group of 40 claims whose results are 4 MiB each, and checks that every
// result is answered whole afterwards.
func LargeResults(t *testing.T, e *engine.Engine) {
	t.Helper()
	ctx := context.Background()
	keys := make([][]byte, 40)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "order-%d", i)
	}
	claims := make([]engine.Claim, len(keys))
	if err := e.ClaimBatch(ctx, keys, nil, claims); err != nil {
		t.Fatal(err)
	}
	for i := range claims {
		claims[i].Result = bytes.Repeat([]byte{byte(i)}, engine.MaxResultSize)
	}
	if err := e.CommitBatch(ctx, claims, nil); err != nil {
		t.Fatalf("commit of 40 results of 4 MiB: %v", err)
	}
	again := make([]engine.Claim, len(keys))
	if err := e.ClaimBatch(ctx, keys, nil, again); err != nil {
		t.Fatal(err)
	}
	for i := range again {
		if again[i].Outcome != engine.Duplicate || !bytes.Equal(again[i].Result, claims[i].Result) {
			t.Fatalf("key %d after the commit: %v with %d bytes of result", i, again[i].Outcome, len(again[i].Result))
		}
	}
}
