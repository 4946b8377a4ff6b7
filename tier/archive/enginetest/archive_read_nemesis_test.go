package enginetest_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier"
)

// TestArchiveReadNemesis: MarkBatch from four goroutines, each batch
// mixing keys the PostgreSQL archive holds (committed 2 to 11 days ago,
// past the 7-day window) with keys never seen, while a nemesis ends the
// archive's server connections every 30 ms (pg_terminate_backend: what a
// server restart or a failover does to them). Every archived key answers
// Duplicate and every new key New; a call the archive could not answer
// fails with ErrUnavailable and marks nothing, so its retry answers the
// same; afterwards every key answers as the archive window says. The
// archive's read is one statement a batch over the partitions the keys'
// spans cover (tier/postgres: spanned).
func TestArchiveReadNemesis(t *testing.T) {
	app := fmt.Sprintf("archive-nemesis-%d", time.Now().UnixNano())
	archive, admin, _ := raArchive(t, "engine_archn", "application_name="+app)
	r := newArchiveRun(t, func(vfs.FS) tier.ArchiveBackend { return archive })
	for range 12 {
		r.commitDay()
	}
	waitArchived(t, r.e)

	ctx := context.Background()
	stop := make(chan struct{})
	stopped := raNemesis(admin, app, 30*time.Millisecond, stop)

	var failed, calls atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	deadline := time.Now().Add(3 * time.Second)
	for g := range 4 {
		wg.Go(func() {
			for b := 0; time.Now().Before(deadline); b++ {
				keys := make([][]byte, 0, 32)
				want := make([]engine.Outcome, 0, 32)
				for i := range 16 {
					d := 1 + (g*7+b+i)%10 // days 1..10: 2 to 11 days old, in the archive
					keys = append(keys, archiveKey(d, (b*16+i)%r.perDay))
					want = append(want, engine.Duplicate)
					keys = append(keys, fmt.Appendf(nil, "fresh-%d-%d-%d", g, b, i))
					want = append(want, engine.New)
				}
				out := make([]engine.Outcome, len(keys))
				for try := 0; ; try++ {
					calls.Add(1)
					err := r.e.MarkBatch(ctx, keys, nil, out)
					if err == nil {
						break
					}
					if !errors.Is(err, engine.ErrUnavailable) {
						errs <- fmt.Errorf("goroutine %d batch %d: %w, want ErrUnavailable", g, b, err)
						return
					}
					failed.Add(1)
					if try > 100 {
						errs <- fmt.Errorf("goroutine %d batch %d: still failing after %d tries: %w", g, b, try, err)
						return
					}
				}
				for i, o := range out {
					if o != want[i] {
						errs <- fmt.Errorf("goroutine %d batch %d: %s answered %v, want %v", g, b, keys[i], o, want[i])
						return
					}
				}
			}
		})
	}
	terminated := raSettle(t, &wg, stop, stopped, errs)
	t.Logf("%d calls, %d failed while the nemesis ended %d connections", calls.Load(), failed.Load(), terminated)
	if terminated == 0 || failed.Load() == 0 {
		t.Fatalf("the nemesis did not bite: %d connections ended, %d calls failed", terminated, failed.Load())
	}
	if bad := r.check(); len(bad) > 0 {
		t.Fatalf("%d wrong answers after the nemesis, first: %s", len(bad), bad[0])
	}
}
