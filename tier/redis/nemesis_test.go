package redis_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/backendtest"
	"github.com/tierdedup/tierdedup/internal/crashtest"
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

// markerSpec is what a marking consumer of TestMarkNemesis is told.
type markerSpec struct {
	Addr, Prefix string
	ID           int
	// MaxRetries is go-redis's: 0 keeps its default retries, -1 none (the
	// context deadline decides).
	MaxRetries  int
	MaxAttempts int
	From        int // the first batch to mark
	Timeout     time.Duration
}

// nemesisBatch is batch b of consumer id: half keys every consumer marks
// (shared), half its own.
func nemesisBatch(id, b, size int) [][]byte {
	keys := make([][]byte, size)
	for i := range keys {
		if i%2 == 0 {
			keys[i] = fmt.Appendf(nil, "s:%d:%d", b, i/2)
		} else {
			keys[i] = fmt.Appendf(nil, "o%d:%d:%d", id, b, i/2)
		}
	}
	return keys
}

const nemesisBatchSize = 256

// markerChild marks batches of nemesisBatch in order, as a consumer
// would: a batch whose MarkBatch fails is marked again (redelivered)
// until it succeeds, and its keys answered InFlight are marked again
// until they are New or Duplicate; after each success it prints
// "B <batch> <index>…." with the index of every key it was told New, and
// every few batches it marks an earlier batch again (a broker's
// redelivery of acknowledged messages), printing what was New there too.
func markerChild(spec string) int {
	var sp markerSpec
	if err := json.Unmarshal([]byte(spec), &sp); err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	say := crashtest.Say()
	c := goredis.NewClient(&goredis.Options{Addr: sp.Addr, MaxRetries: sp.MaxRetries})
	defer c.Close()
	var e *engine.Engine
	for {
		var err error
		e, err = engine.Open(&engine.Options{
			Backend: redis.NewBackend(c, redis.Config{Prefix: sp.Prefix}), Window: time.Hour, Partition: 10 * time.Minute,
			Lease: 2 * time.Second, MaxAttempts: sp.MaxAttempts, Logger: quietEngine,
		})
		if err == nil {
			break
		}
		if !errors.Is(err, engine.ErrUnavailable) {
			say("ERR open: %v", err)
			return 1
		}
		time.Sleep(50 * time.Millisecond) // the server is paused: a consumer starts when it can
	}
	defer e.Close()
	mark := func(b int, keys [][]byte) {
		idx := make([]int, len(keys))
		for i := range idx {
			idx[i] = i
		}
		var news []string
		for len(idx) > 0 {
			sub := make([][]byte, len(idx))
			for j, i := range idx {
				sub[j] = keys[i]
			}
			out := make([]engine.Outcome, len(sub))
			ctx, cancel := context.WithTimeout(context.Background(), sp.Timeout)
			err := e.MarkBatch(ctx, sub, nil, out)
			cancel()
			if err != nil {
				say("E %d", b)
				time.Sleep(10 * time.Millisecond)
				continue
			}
			var again []int
			for j, o := range out {
				switch o {
				case engine.New:
					news = append(news, strconv.Itoa(idx[j]))
				case engine.InFlight:
					again = append(again, idx[j])
				case engine.Duplicate:
				default:
					say("ERR key %s: %v", sub[j], o)
				}
			}
			idx = again
			if len(again) > 0 {
				time.Sleep(10 * time.Millisecond)
			}
		}
		say("B %d %s.", b, strings.Join(news, " "))
	}
	for b := sp.From; ; b++ {
		time.Sleep(30 * time.Millisecond) // a consumer's pace: the checks stay short
		mark(b, nemesisBatch(sp.ID, b, nemesisBatchSize))
		if b%4 == 3 && b-3 >= sp.From {
			mark(b-3, nemesisBatch(sp.ID, b-3, nemesisBatchSize))
		}
	}
}

// nemesisLedger is what the consumers of TestMarkNemesis said: every key
// acknowledged New, by whom, and what is still being marked.
type nemesisLedger struct {
	mu       sync.Mutex
	acked    map[string]int  // key → the consumer that was told New
	twice    []string        // keys told New again after an acknowledgement
	last     map[int]int     // consumer → the last batch it finished
	done     map[[2]int]bool // (consumer, batch) → finished (printed)
	killed   map[[2]int]bool // (consumer, batch) → a SIGKILL cut it
	failures map[int]int     // consumer → failed MarkBatch calls
	errs     []string
}

func (l *nemesisLedger) line(id int, line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	kind, rest, _ := strings.Cut(line, " ")
	switch kind {
	case "E":
		l.failures[id]++
	case "B":
		if !strings.HasSuffix(rest, ".") {
			return // cut off by a SIGKILL
		}
		fields := strings.Fields(strings.TrimSuffix(rest, "."))
		b, _ := strconv.Atoi(fields[0])
		keys := nemesisBatch(id, b, nemesisBatchSize)
		for _, f := range fields[1:] {
			i, err := strconv.Atoi(f)
			if err != nil || i < 0 || i >= len(keys) {
				l.errs = append(l.errs, fmt.Sprintf("consumer %d: bad line %q", id, line))
				return
			}
			k := string(keys[i])
			if who, ok := l.acked[k]; ok {
				l.twice = append(l.twice, fmt.Sprintf("%s (New for consumer %d, then for %d)", k, who, id))
				continue
			}
			l.acked[k] = id
		}
		l.last[id] = max(l.last[id], b)
		l.done[[2]int{id, b}] = true
	case "ERR":
		l.errs = append(l.errs, fmt.Sprintf("consumer %d: %s", id, rest))
	}
}

// TestMarkNemesis: two consumer processes mark batches of 256 keys, half
// of them shared, through MarkBatch on one redis-server with appendonly
// and appendfsync always; one keeps go-redis's default retries, the
// other none (its context deadline decides). Each round the nemesis
// pauses the server (SIGSTOP for 0.3–2 s), kills a consumer (SIGKILL; it
// restarts after its last acknowledged batch, as a consumer group
// redelivers), or both. After every round, and at the end, every key a
// consumer was told New for must be Duplicate for a fresh engine, no
// key may have been New twice, and every key of a finished batch must
// have been New for some consumer (none dropped; batches a SIGKILL cut
// excepted). TIERDEDUP_NEMESIS_ROUNDS sets the rounds
// (CI runs a few; the default is 6).
func TestMarkNemesis(t *testing.T) {
	for _, max := range []int{0, 3} {
		t.Run(fmt.Sprint("max=", max), func(t *testing.T) { runMarkNemesis(t, max) })
	}
}

func nemesisRounds() int {
	if n, err := strconv.Atoi(os.Getenv("TIERDEDUP_NEMESIS_ROUNDS")); err == nil && n > 0 {
		return n
	}
	return 6
}

func runMarkNemesis(t *testing.T, maxAttempts int) {
	srv := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	prefix := fmt.Sprintf("nemesis-%d:", time.Now().UnixNano())
	l := &nemesisLedger{acked: map[string]int{}, last: map[int]int{}, failures: map[int]int{}, done: map[[2]int]bool{}, killed: map[[2]int]bool{}}
	policies := []int{0, -1} // consumer 0: go-redis's retries; consumer 1: none
	children := make([]*crashtest.Child, len(policies))
	start := func(id int) {
		l.mu.Lock()
		from := l.last[id] + 1
		l.mu.Unlock()
		sp, _ := json.Marshal(markerSpec{Addr: srv.Addr, Prefix: prefix, ID: id, MaxRetries: policies[id], MaxAttempts: maxAttempts, From: from, Timeout: time.Second})
		children[id] = crashtest.Start(t, "marker", string(sp), &crashtest.Options{
			Timeout: crashtest.NoTimeout, OnLine: func(line string) { l.line(id, line) },
		})
	}
	for id := range policies {
		start(id)
	}
	kill := func(id int) {
		_ = children[id].Kill()
		l.mu.Lock()
		l.killed[[2]int{id, l.last[id] + 1}] = true
		l.mu.Unlock()
		start(id)
	}
	check := newNemesisChecker(t, srv, prefix, maxAttempts)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 41))
	rounds := nemesisRounds()
	var pauses, kills int
	for r := range rounds {
		time.Sleep(time.Duration(300+rng.IntN(700)) * time.Millisecond)
		action := rng.IntN(4)
		if r == 0 {
			action = 0 // every run pauses the server at least once
		}
		if action == 0 || action == 2 {
			pauses++
			srv.Pause()
			if action == 2 {
				// Killed while the server holds its commands.
				kills++
				kill(rng.IntN(len(children)))
			}
			pause := time.Duration(300+rng.IntN(1700)) * time.Millisecond
			if r == 0 {
				// Longer than a call's deadline: every run has failed
				// calls, their give-backs and retries.
				pause = 1500 * time.Millisecond
			}
			time.Sleep(pause)
			srv.Resume()
		}
		if action == 1 {
			kills++
			kill(rng.IntN(len(children)))
		}
		check.acked(l)
	}
	time.Sleep(2500 * time.Millisecond) // the lease and the fences, then a last round of marks
	for _, c := range children {
		_ = c.Kill()
	}
	n := check.acked(l)
	l.mu.Lock()
	defer l.mu.Unlock()
	t.Logf("%d rounds, %d pauses, %d kills: %d keys acknowledged New, %d failed calls (default retries), %d (no retries), %d keys New twice",
		rounds, pauses, kills, n, l.failures[0], l.failures[1], len(l.twice))
	if len(l.errs) > 0 {
		t.Fatalf("consumers reported: %s", strings.Join(l.errs[:min(len(l.errs), 10)], "; "))
	}
	if len(l.twice) > 0 {
		t.Fatalf("%d acknowledged keys were New again, for example %s", len(l.twice), strings.Join(l.twice[:min(len(l.twice), 5)], ", "))
	}
	if l.failures[0]+l.failures[1] == 0 {
		t.Fatal("no MarkBatch failed: the nemesis never reached a call")
	}
	if dropped := l.neverNew(len(children)); len(dropped) > 0 {
		t.Fatalf("%d keys of finished batches were New for no consumer (a new message dropped), for example %s", len(dropped), strings.Join(dropped[:min(len(dropped), 5)], ", "))
	}
}

// neverNew returns the keys of finished batches no consumer was told New
// for: a consumer's own keys of a batch it finished, the shared keys of a
// batch every consumer finished; not the batches a SIGKILL cut (the
// killed process may have been told New and died before saying so).
func (l *nemesisLedger) neverNew(consumers int) []string {
	var out []string
	for cb := range l.done {
		id, b := cb[0], cb[1]
		cut := l.killed[cb]
		shared := !cut
		for other := range consumers {
			shared = shared && l.done[[2]int{other, b}] && !l.killed[[2]int{other, b}]
		}
		for i, k := range nemesisBatch(id, b, nemesisBatchSize) {
			if i%2 == 0 && !shared || i%2 == 1 && cut {
				continue
			}
			if _, ok := l.acked[string(k)]; !ok {
				out = append(out, string(k))
			}
		}
	}
	return out
}

// nemesisChecker looks up, through an engine of its own, every key the
// consumers acknowledged New.
type nemesisChecker struct {
	t *testing.T
	e *engine.Engine
}

func newNemesisChecker(t *testing.T, srv *redistest.Server, prefix string, maxAttempts int) *nemesisChecker {
	c := srv.ClientWith(t, &goredis.Options{MaxRetries: -1})
	for deadline := time.Now().Add(time.Minute); ; {
		e, err := engine.Open(&engine.Options{Backend: redis.NewBackend(c, redis.Config{Prefix: prefix}), Window: time.Hour, Partition: 10 * time.Minute, Lease: 2 * time.Second, MaxAttempts: maxAttempts, Logger: quietEngine})
		if err == nil {
			t.Cleanup(func() { _ = e.Close() })
			return &nemesisChecker{t: t, e: e}
		}
		if !errors.Is(err, engine.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("opening the checker's engine: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// acked checks that every acknowledged key is a Duplicate now, and
// returns how many there are.
func (c *nemesisChecker) acked(l *nemesisLedger) int {
	c.t.Helper()
	l.mu.Lock()
	keys := make([][]byte, 0, len(l.acked))
	for k := range l.acked {
		keys = append(keys, []byte(k))
	}
	l.mu.Unlock()
	info := make([]engine.KeyInfo, len(keys))
	deadline := time.Now().Add(time.Minute)
	for lo := 0; lo < len(keys); {
		hi := min(lo+4096, len(keys))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := c.e.LookupBatch(ctx, keys[lo:hi], info[lo:hi])
		cancel()
		if err == nil {
			lo = hi
			continue
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("looking up the acknowledged keys: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var lost []string
	for i, in := range info {
		if in.Outcome != engine.Duplicate {
			lost = append(lost, fmt.Sprintf("%s=%v", keys[i], in.Outcome))
		}
	}
	if len(lost) > 0 {
		c.t.Errorf("%d of %d acknowledged keys are not Duplicate: %s", len(lost), len(keys), strings.Join(lost[:min(len(lost), 5)], ", "))
	}
	return len(keys)
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
