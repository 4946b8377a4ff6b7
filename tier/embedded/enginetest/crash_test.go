package enginetest_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/crashtest"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// The crash test runs the engine in a child process (this test binary,
// re-executed) that claims and commits batches on a real directory and
// reports every New answer and every acknowledged commit on stdout. The
// parent SIGKILLs it at a random moment (or, one round in four, asks it to
// close cleanly with SIGTERM, so the next round starts from a Bloom
// snapshot), several rounds over the same directory, then checks: every
// acknowledged key is a Duplicate after reopening, and no key was ever
// answered New after its commit was acknowledged. CI runs 6 rounds;
// TIERDEDUP_CRASH_ROUNDS=100 (or more) is the long mode.

// TestCrashRecovery runs the crash rounds with synchronous batch commits,
// and with asynchronous commits (CommitBatchAsync, a ledger record in each
// write, acknowledged in done), where it also checks that no write was
// half-applied: a claimed key is committed exactly when its ledger record
// exists.
func TestCrashRecovery(t *testing.T) {
	for _, mode := range []string{"sync", "async"} {
		t.Run(mode, func(t *testing.T) { crashRounds(t, mode) })
	}
}

func crashRounds(t *testing.T, mode string) {
	dir := t.TempDir()
	claimed := map[string]bool{}
	acked := map[string]bool{}
	rng := rand.New(rand.NewPCG(42, 1))
	rounds := 6
	if n, err := strconv.Atoi(os.Getenv("TIERDEDUP_CRASH_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	clean, checked := 0, 0
	for r := range rounds {
		// A child that never acknowledges, or hangs, is killed after a
		// minute and fails the test.
		child := crashtest.Start(t, "crash", dir+"|"+strconv.Itoa(r)+"|"+mode, &crashtest.Options{Timeout: time.Minute})
		// The kill comes at a random moment after the child's first
		// acknowledged commit, however slow its start on a loaded machine.
		kill := time.Duration(100+rng.IntN(600)) * time.Millisecond
		sig := syscall.SIGKILL
		if rng.IntN(4) == 0 {
			sig = syscall.SIGTERM
		}
		var timer *time.Timer
		news, acks := 0, 0
		for {
			line, ok := child.Next()
			if !ok {
				break
			}
			if line == "CLOSED" {
				clean++
				continue
			}
			kind, key, ok := strings.Cut(line, " ")
			if !ok {
				continue // a line cut by the kill
			}
			switch kind {
			case "N":
				news++
				checked++
				claimed[key] = true
				if acked[key] {
					t.Fatalf("round %d: key %s answered New after its commit was acknowledged", r, key)
				}
			case "A":
				acks++
				acked[key] = true
				if timer == nil {
					timer = child.SignalAfter(kill, sig)
				}
			case "ERR":
				t.Fatalf("round %d: child failed: %s\n%s", r, key, child.Describe())
			}
		}
		if timer != nil {
			timer.Stop()
		}
		_ = child.Wait()
		t.Logf("round %d: %v after %v, %d New, %d acknowledged", r, sig, kill, news, acks)
		if acks == 0 {
			t.Fatalf("round %d acknowledged nothing before the kill\n%s", r, child.Describe())
		}
	}
	e := open(t, engine.Options{Backend: embedded.Dir(dir), ExpectedKeys: 100_000})
	defer e.Close()
	keys := make([][]byte, 0, len(acked))
	for k := range acked {
		keys = append(keys, []byte(k))
	}
	claimEach(t, e, keys, func(key []byte, c engine.Claim) {
		if c.Outcome != engine.Duplicate {
			t.Fatalf("acknowledged key %s is %v after the crashes", key, c.Outcome)
		}
	})
	half := 0
	if mode == "async" {
		// Never half-applied: every key ever claimed is committed exactly
		// when its ledger record, written in the same write, exists.
		ledger := map[string]bool{}
		if err := e.ScanWrites([]byte("ledger/"), func(k, _ []byte) error {
			ledger[strings.TrimPrefix(string(k), "ledger/")] = true
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		keys = keys[:0]
		for k := range claimed {
			keys = append(keys, []byte(k))
		}
		for i := 0; i < len(keys); i += 256 {
			batch := keys[i:min(i+256, len(keys))]
			out := make([]engine.Claim, len(batch))
			if err := e.ClaimBatch(context.Background(), batch, nil, out); err != nil {
				t.Fatal(err)
			}
			for j, c := range out {
				if committed := c.Outcome == engine.Duplicate; committed != ledger[string(batch[j])] {
					half++
					t.Errorf("key %s: %v, ledger record %v: a half-applied write", batch[j], c.Outcome, ledger[string(batch[j])])
				}
			}
			if err := e.ReleaseBatch(context.Background(), out, nil); err != nil && !errors.Is(err, engine.ErrNotClaimed) {
				t.Fatal(err)
			}
		}
		t.Logf("%d claimed keys: committed exactly when their ledger record exists (%d ledger records)", len(claimed), len(ledger))
	}
	t.Logf("%s: %d rounds (%d closed cleanly, %d killed): %d New answers checked against earlier acknowledgements, %d acknowledged keys all Duplicate at the end, %d half-applied writes",
		mode, rounds, clean, rounds-clean, checked, len(acked), half)
}
