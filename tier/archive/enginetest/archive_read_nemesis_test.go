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
	"github.com/tierdedup/tierdedup/tier/postgres"
	"github.com/tierdedup/tierdedup/tier/postgres/pgtest"
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
	p := pgtest.Pool(t, "application_name="+app)
	admin := postgresPool(t)
	table := fmt.Sprintf("engine_archn_%d", time.Now().UnixNano()%1e9)
	t.Cleanup(func() {
		for _, s := range []string{"", "_layout", "_parts", "_blobs", "_log", "_open"} {
			_, _ = admin.Exec(context.Background(), "DROP TABLE IF EXISTS "+table+s+" CASCADE")
		}
	})
	r := newArchiveRun(t, func(vfs.FS) tier.ArchiveBackend { return postgres.Archive{DB: p, Table: table} })
	for range 12 {
		r.commitDay()
	}
	waitArchived(t, r.e)

	ctx := context.Background()
	stop := make(chan struct{})
	var terminated atomic.Int64
	nemesis := make(chan error, 1)
	go func() {
		defer close(nemesis)
		for {
			select {
			case <-stop:
				return
			case <-time.After(30 * time.Millisecond):
			}
			var n int64
			if err := admin.QueryRow(ctx, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&n); err != nil {
				nemesis <- err
				return
			}
			terminated.Add(n)
		}
	}()

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
	wg.Wait()
	close(stop)
	if err := <-nemesis; err != nil {
		t.Fatal(err)
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d calls, %d failed while the nemesis ended %d connections", calls.Load(), failed.Load(), terminated.Load())
	if terminated.Load() == 0 || failed.Load() == 0 {
		t.Fatalf("the nemesis did not bite: %d connections ended, %d calls failed", terminated.Load(), failed.Load())
	}
	if bad := r.check(); len(bad) > 0 {
		t.Fatalf("%d wrong answers after the nemesis, first: %s", len(bad), bad[0])
	}
}
