package redis_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/backendtest"
	"github.com/tierdedup/tierdedup/internal/crashtest"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/postgres/pgtest"
	"github.com/tierdedup/tierdedup/tier/redis"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// TestMain sends a child process (this test binary, re-executed by
// crashtest.Start) to its code.
func TestMain(m *testing.M) {
	crashtest.Main(m, map[string]func(spec string) int{
		"marker": markerChild, // TestMarkNemesis
	})
}

// markerChild is a consumer of TestMarkNemesis on the Redis tier: its
// policy is go-redis's MaxRetries (0 its default retries, -1 none: the
// context deadline decides).
func markerChild(spec string) int {
	return backendtest.NemesisChild(spec, func(sp backendtest.NemesisSpec) (tier.Backend, func(), error) {
		c := goredis.NewClient(&goredis.Options{Addr: sp.Addr, MaxRetries: sp.Policy})
		return redis.NewBackend(c, redis.Config{Prefix: sp.Name}), func() { _ = c.Close() }, nil
	})
}

// TestMarkNemesis: two consumer processes mark batches of 256 keys, half
// of them shared, through MarkBatch on one redis-server with appendonly
// and appendfsync always; one keeps go-redis's default retries, the
// other none (its context deadline decides). Each round the nemesis
// pauses the server (SIGSTOP for 0.3–2 s), kills a consumer (SIGKILL; it
// restarts after its last acknowledged batch, as a consumer group
// redelivers), or both; the checks are backendtest.RunNemesis's. With
// archive=postgres a PostgreSQL archive is behind every engine and
// Redis's window is 8 s in 2 s partitions: every mark reads the archive,
// then commits through the mark script and its log entry (one a call),
// the drain moves it to the archive while the server stalls and drainers
// die, and the checks (the last once every acknowledged key has left
// Redis), and consumers that mark shared keys after Redis let them go,
// must find them there.
// TIERDEDUP_NEMESIS_ROUNDS sets the rounds (CI runs the default, 6).
func TestMarkNemesis(t *testing.T) {
	for _, run := range []struct {
		max     int
		archive bool
	}{{0, false}, {3, false}, {0, true}} {
		name := fmt.Sprint("max=", run.max)
		if run.archive {
			name += "/archive=postgres"
		}
		t.Run(name, func(t *testing.T) {
			srv := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
			prefix := fmt.Sprintf("nemesis-%d:", time.Now().UnixNano())
			c := srv.ClientWith(t, &goredis.Options{MaxRetries: -1})
			n := backendtest.Nemesis{
				Child: "marker", Addr: srv.Addr, Name: prefix, Policies: []int{0, -1}, MaxAttempts: run.max,
				Pause: srv.Pause, Resume: srv.Resume, Checker: redis.NewBackend(c, redis.Config{Prefix: prefix}),
			}
			if run.archive {
				db := pgtest.Pool(t)
				n.Archive, n.ArchiveTable = pgtest.DSN, fmt.Sprintf("nemesis_arch_%d", time.Now().UnixNano()%1e9)
				t.Cleanup(func() {
					for _, s := range []string{"", "_layout", "_parts", "_blobs", "_log", "_open"} {
						_, _ = db.Exec(context.Background(), "DROP TABLE IF EXISTS "+n.ArchiveTable+s+" CASCADE")
					}
				})
			}
			backendtest.RunNemesis(t, n)
		})
	}
}

// lateHook is a go-redis hook that, armed, lets skip pipelines pass, then
// applies the next one and loses its replies (a reply lost on the way
// back), then holds the one after it (the give-back of the failed call)
// without sending it, failing it at once as a timeout would, until
// deliver sends it: a copy that reaches the server late.
type lateHook struct {
	mu      sync.Mutex
	skip    int
	armed   bool
	stage   int // 0: losing next, 1: holding next, 2: done
	held    []goredis.Cmder
	next    goredis.ProcessPipelineHook
	applied int
}

var errLost = errors.New("i/o timeout (reply lost)")

func (h *lateHook) DialHook(next goredis.DialHook) goredis.DialHook          { return next }
func (h *lateHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }
func (h *lateHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if len(cmds) == 0 || cmds[0].Name() == "client" || cmds[0].Name() == "hello" {
			return next(ctx, cmds) // a new connection's handshake
		}
		h.mu.Lock()
		if !h.armed || h.stage == 2 {
			h.mu.Unlock()
			return next(ctx, cmds)
		}
		if h.skip > 0 {
			h.skip--
			h.mu.Unlock()
			return next(ctx, cmds)
		}
		stage := h.stage
		h.stage++
		if stage == 1 {
			h.held, h.next = cmds, next
		}
		h.mu.Unlock()
		if stage == 0 {
			_ = next(ctx, cmds)
			h.applied = len(cmds)
		}
		for _, c := range cmds {
			c.SetErr(errLost)
		}
		return errLost
	}
}

// deliver sends the held give-back now, and returns whether there was one.
func (h *lateHook) deliver() bool {
	h.mu.Lock()
	cmds, next := h.held, h.next
	h.held = nil
	h.mu.Unlock()
	if cmds == nil {
		return false
	}
	for _, c := range cmds {
		c.SetErr(nil)
	}
	_ = next(context.Background(), cmds)
	return true
}

// TestLateGiveBackAfterRetry: the cause TestMarkNemesis finds, in one
// sequence. A MarkBatch's mark is applied but its reply lost; the give-back
// the engine then sends is late (a paused server's socket, another
// connection); the consumer retries the batch, which is New (its own lost
// mark) and acknowledged; then the late give-back arrives. Every key the
// retry acknowledged must stay marked: a give-back names its own call's
// token, which no later call sends. With MaxAttempts the mark is a claim
// and a commit, and the commit's reply is the one lost.
func TestLateGiveBackAfterRetry(t *testing.T) {
	srv := redistest.Start(t)
	for _, max := range []int{0, 3} {
		t.Run(fmt.Sprint("max=", max), func(t *testing.T) {
			prefix := fmt.Sprintf("late-%d:", time.Now().UnixNano())
			h := &lateHook{}
			c := srv.ClientWith(t, &goredis.Options{MaxRetries: -1})
			c.AddHook(h)
			o := engine.Options{Window: time.Hour, Partition: 10 * time.Minute, Lease: time.Minute, MaxAttempts: max, Logger: quietEngine}
			o.Backend = redis.NewBackend(c, redis.Config{Prefix: prefix})
			a, err := engine.Open(&o)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			o.Backend = redis.NewBackend(srv.Client(t), redis.Config{Prefix: prefix})
			b, err := engine.Open(&o)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			skip := 0
			if max > 0 {
				skip = 1 // the claim passes; its commit's reply is lost
			}
			backendtest.LateGiveBack(t, a, b, redisLate{h, skip})
		})
	}
}

// redisLate is lateHook as backendtest.Late, letting skip pipelines pass
// first.
type redisLate struct {
	h    *lateHook
	skip int
}

func (l redisLate) Arm() {
	l.h.mu.Lock()
	l.h.armed, l.h.skip = true, l.skip
	l.h.mu.Unlock()
}
func (l redisLate) Applied() bool { return l.h.applied > 0 }
func (l redisLate) Deliver() bool { return l.h.deliver() }
