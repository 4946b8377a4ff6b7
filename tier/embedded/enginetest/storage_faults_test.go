package enginetest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/crashtest"
	"github.com/tierdedup/tierdedup/internal/faultfs"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// faultBound is how long any call may take once the disk has failed.
const faultBound = 10 * time.Second

// TestStorageFaultChild: a child process runs writers of every kind, twelve
// at once (MarkBatch of batches larger than a WAL block, Claim then Commit,
// Release writing an attempt count, a mark then Forget), printing every
// key acknowledged New; then the disk starts failing the syncs of the WAL
// (or of Pebble's MANIFEST, while a Compact runs). Two endings are allowed
// and both are checked:
//   - fail closed: every call in flight and every later one returns
//     ErrStorage within faultBound, none hanging in Pebble's commit
//     pipeline behind the failed write;
//   - fail stop: Pebble's own policy for a WAL that fails while it rotates
//     to a new one, and for a MANIFEST that cannot be written, is to exit
//     the process (tier/pebble's doc), which the child then does.
//
// A child that hangs fails the test. Then the directory is reopened, as
// after a crash, and every acknowledged key must be a Duplicate: 0 wrong.
func TestStorageFaultChild(t *testing.T) {
	rounds := 4
	if testing.Short() {
		rounds = 2
	}
	endings := map[string]int{}
	for _, target := range []string{"wal", "manifest"} {
		for round := range rounds {
			t.Run(fmt.Sprintf("%s/%d", target, round), func(t *testing.T) {
				dir := t.TempDir()
				// The child's stderr is kept apart: a fail stop prints
				// Pebble's fatal error and every goroutine's stack.
				child := crashtest.Start(t, "fault", dir+"|"+target, &crashtest.Options{StderrApart: true})
				var acked []string
				ending := "fail-stop"
				for {
					line, ok := child.Next()
					if !ok {
						break
					}
					switch {
					case strings.HasPrefix(line, "ACK "):
						acked = append(acked, strings.Fields(line)[1:]...)
					case line == "FAIL-CLOSED":
						ending = "fail-closed"
					case strings.HasPrefix(line, "ERR "):
						t.Errorf("child: %s", line)
					}
				}
				werr := child.Wait()
				stderr := child.Stderr()
				first, _, _ := strings.Cut(stderr, "\n\n")
				if ending == "fail-closed" && werr != nil {
					t.Errorf("the child failed closed, then exited with %v: %s", werr, first)
				}
				if ending == "fail-stop" && werr == nil {
					t.Fatal("the child exited cleanly without failing closed: it never met the fault")
				}
				if ending == "fail-stop" && !strings.Contains(stderr, "pebble") {
					t.Errorf("the child died (%v), not by Pebble's fail stop: %s", werr, stderr)
				}
				if len(acked) == 0 {
					t.Fatal("the child acknowledged nothing before the fault")
				}
				e := open(t, engine.Options{Backend: embedded.Dir(dir), ExpectedKeys: 100000})
				defer e.Close()
				ctx := context.Background()
				keys := make([][]byte, len(acked))
				for i, k := range acked {
					keys[i] = []byte(k)
				}
				infos := make([]engine.KeyInfo, len(keys))
				if err := e.LookupBatch(ctx, keys, infos); err != nil {
					t.Fatal(err)
				}
				wrong := 0
				for i, info := range infos {
					if info.Outcome != engine.Duplicate {
						if wrong++; wrong <= 5 {
							t.Errorf("acknowledged %s after the restart: %v", acked[i], info.Outcome)
						}
					}
				}
				endings[target+" "+ending]++
				t.Logf("%s: %d acknowledged keys, %d wrong after the restart (child: %v; %s)", ending, len(acked), wrong, werr, first)
			})
		}
	}
	t.Logf("endings: %v", endings)
}

// faultChild is TestStorageFaultChild's child: spec is "dir|wal" or
// "dir|manifest". It exits 0 after failing closed, 3 if a call hangs, or
// dies by Pebble's fail-stop.
func faultChild(spec string) int {
	dir, target, _ := strings.Cut(spec, "|")
	// Once armed, every sync of the WAL's files fails (or of the MANIFEST's:
	// a failed manifest sync in a background compaction is fatal to
	// Pebble, outside any call).
	files := ".log"
	if target == "manifest" {
		files = "MANIFEST"
	}
	var fault faultfs.Fault
	e, err := engine.Open(&engine.Options{Backend: &embedded.Backend{Dir: dir, FS: faultfs.Wrap(vfs.Default, &fault)}, ExpectedKeys: 100000, MaxAttempts: 5, Lease: time.Minute, Logger: quiet})
	if err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	ctx := context.Background()
	var mu sync.Mutex // stdout
	ack := func(keys ...[]byte) {
		var b strings.Builder
		b.WriteString("ACK")
		for _, k := range keys {
			b.WriteByte(' ')
			b.Write(k)
		}
		mu.Lock()
		fmt.Println(b.String())
		mu.Unlock()
	}
	var nacked, slow atomic.Int64
	var wg sync.WaitGroup
	for w := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				key := fmt.Sprintf("w%d-%d", w, i)
				start := time.Now()
				var err error
				switch w % 4 {
				case 0, 1:
					// Batches larger than a WAL block (32 KiB): after a
					// failed flush, Pebble fails the next one inside its
					// commit pipeline, holding the pipeline's lock.
					keys := make([][]byte, 200)
					for j := range keys {
						keys[j] = fmt.Appendf(nil, "%s-%03d-%0120d", key, j, 0)
					}
					out := make([]engine.Outcome, len(keys))
					if err = e.MarkBatch(ctx, keys, nil, out); err == nil {
						var news [][]byte
						for j, k := range keys {
							if out[j] == engine.New {
								news = append(news, k)
							}
						}
						ack(news...)
						nacked.Add(int64(len(news)))
					}
				case 2:
					var c engine.Claim
					if c, err = e.Claim(ctx, []byte(key)); err == nil && c.Outcome == engine.New {
						if i%2 == 0 {
							err = e.Release(ctx, c) // writes the attempt count
						} else if err = e.Commit(ctx, c); err == nil {
							ack([]byte(key))
							nacked.Add(1)
						}
					}
				case 3: // keys of its own, never acknowledged: a mark, then its removal
					if _, err = e.MarkIfAbsent(ctx, []byte(key)); err == nil {
						_, err = e.Forget(ctx, []byte(key))
					}
				}
				if time.Since(start) > faultBound {
					slow.Add(1)
				}
				if err != nil {
					if !errors.Is(err, engine.ErrStorage) {
						fmt.Println("ERR writer", w, err)
					}
					return
				}
			}
		}()
	}
	for nacked.Load() < 5000 {
		time.Sleep(time.Millisecond)
	}
	fault.Arm(faultfs.Match{Kinds: faultfs.Syncs, Contains: files})
	if target == "manifest" {
		go func() { _ = e.Compact(ctx) }() // writes the MANIFEST
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * faultBound):
		fmt.Println("ERR writers still running after the disk failed: a call hangs")
		return 3
	}
	if n := slow.Load(); n > 0 {
		fmt.Println("ERR", n, "calls took longer than", faultBound)
	}
	start := time.Now()
	if _, err := e.MarkIfAbsent(ctx, []byte("after")); !errors.Is(err, engine.ErrStorage) {
		fmt.Println("ERR a mark after the fault:", err)
	}
	if d := time.Since(start); d > faultBound {
		fmt.Println("ERR a mark after the fault took", d)
	}
	fmt.Println("FAIL-CLOSED")
	// The store is abandoned, not closed (Pebble's pipeline is stuck):
	// the process exits, as it is meant to.
	return 0
}
