package enginetest_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/crashtest"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/postgres/pgtest"
)

// The helpers these tests share with the engine's (internal/enginetest).
type (
	fakeClock  = enginetest.Clock
	stepClock  = enginetest.StepClock
	fixedClock = enginetest.FixedClock
	crashFS    = enginetest.CrashFS
)

var (
	quiet      = enginetest.Quiet
	newClock   = enginetest.NewClock
	newCrashFS = enginetest.NewCrashFS
)

const day = 24 * time.Hour

func open(t testing.TB, o engine.Options) *engine.Engine {
	t.Helper()
	return enginetest.Open(t, o)
}

func waitArchived(t testing.TB, e *engine.Engine) {
	t.Helper()
	enginetest.WaitArchived(t, e)
}

func postgresPool(t *testing.T) *pgxpool.Pool { return pgtest.Pool(t) }

func ptr[T any](v T) *T { return enginetest.Ptr(v) }

// TestMain sends a child process (this test binary, re-executed by
// crashtest.Start for a kill test) to its code.
func TestMain(m *testing.M) {
	crashtest.Main(m, map[string]func(spec string) int{
		"archive": archiveChild, // TestKillWhileArchiving
	})
}

// putGate holds the archive's Puts (a slow archive: a busy disk, a remote
// database) while armed: the archiver then holds its lock (Forgetting's
// writer side) for as long as the Put takes.
type putGate struct {
	armed   atomic.Bool
	once    sync.Once
	entered chan struct{} // closed when the first held Put entered
	release chan struct{} // closed to let every held Put go on
	puts    atomic.Int64  // partitions the held Puts were for, last one
}

func newPutGate() *putGate {
	return &putGate{entered: make(chan struct{}), release: make(chan struct{})}
}

func (g *putGate) open() {
	select {
	case <-g.release:
	default:
		close(g.release)
	}
}

func (g *putGate) wrap(b tier.ArchiveBackend) tier.ArchiveBackend {
	return wrappedArchive{b, func(a tier.Archive) tier.Archive { return gatedPutStore{a, g} }}
}

type gatedPutStore struct {
	tier.Archive
	g *putGate
}

func (s gatedPutStore) Put(ctx context.Context, p int64, scan func(func(*tier.Record) error) error) error {
	if s.g.armed.Load() {
		s.g.puts.Store(p)
		s.g.once.Do(func() { close(s.g.entered) })
		select {
		case <-s.g.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return s.Archive.Put(ctx, p, scan)
}
