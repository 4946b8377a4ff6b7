package backendtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/crashtest"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/postgres"
)

// The mark nemesis: consumer processes mark batches through MarkBatch on
// one shared tier while the nemesis pauses the server (SIGSTOP: commands
// wait in its sockets and run after their callers gave up) and kills
// consumers (SIGKILL; each restarts after its last acknowledged batch, as
// a consumer group redelivers). After every round, and at the end, every
// key a consumer was told New for must be Duplicate for a fresh engine,
// no key may have been New twice, and every key of a finished batch must
// have been New for some consumer (none dropped; batches a SIGKILL cut
// excepted). TIERDEDUP_NEMESIS_ROUNDS sets the rounds (default 6).

// Nemesis is one run of RunNemesis on a shared tier.
type Nemesis struct {
	// Child is NemesisChild's name in the test binary's TestMain.
	Child string
	// Addr reaches the server (an address, a DSN) and Name is the run's
	// place in it (a key prefix, a table), told to each consumer.
	Addr, Name string
	// Policies has one entry per consumer: the client policy its backend
	// is built with (the tier's own meaning: go-redis's MaxRetries, the
	// pool's connections).
	Policies    []int
	MaxAttempts int
	// Pause stops the server (every process of it) and Resume continues
	// it.
	Pause, Resume func()
	// Checker is the backend of the engine that checks the acknowledged
	// keys, with a client that gives up rather than wait.
	Checker tier.Backend
	// Archive, when set, puts a PostgreSQL archive (of ArchiveTable, at
	// the DSN Archive) behind every engine of the run, the checker's too,
	// and makes the tier's window short (nemesisArchivedWindow; ten minutes
	// of archive): keys
	// leave it while the run goes on, and the checks and the consumers'
	// late marks of shared keys must find them in the archive.
	Archive, ArchiveTable string
}

// nemesisArchivedWindow is the tier's window in a run with an archive,
// in partitions of nemesisArchivedPartition: the archive answers once
// partitions up to the window less tier.LogSkew are sealed, which the
// drain must keep up with under -race on a loaded machine too.
const (
	nemesisArchivedWindow    = 8 * time.Second
	nemesisArchivedPartition = 2 * time.Second
)

// NemesisSpec is what a consumer of RunNemesis is told.
type NemesisSpec struct {
	Addr, Name  string
	ID, Policy  int
	MaxAttempts int
	From        int // the first batch to mark
	Timeout     time.Duration
	// Archive and ArchiveTable are Nemesis's.
	Archive, ArchiveTable string
}

// quiet discards the engines' logs.
var quiet = slog.New(slog.DiscardHandler)

// nemesisOptions are the options of every engine of a run: with an
// archive (sp.Archive), a pool on it, which close closes after the engine.
func nemesisOptions(b tier.Backend, sp NemesisSpec) (o *engine.Options, close func(), err error) {
	o = &engine.Options{Backend: b, Window: time.Hour, Partition: 10 * time.Minute,
		Lease: 2 * time.Second, MaxAttempts: sp.MaxAttempts, Logger: quiet}
	if sp.Archive == "" {
		return o, func() {}, nil
	}
	db, err := pgxpool.New(context.Background(), sp.Archive)
	if err != nil {
		return nil, nil, err
	}
	// Filters sized for the run's rate (a few thousand keys a second):
	// the archive filter's ring is allocated whole, ExpectedKeys times
	// the partitions a slot groups (10 here) times its slots.
	o.Window, o.Partition, o.Lease, o.ExpectedKeys = nemesisArchivedWindow, nemesisArchivedPartition, time.Second, 1<<15
	o.Archive, o.ArchiveWindow = postgres.Archive{DB: db, Table: sp.ArchiveTable}, 10*time.Minute
	return o, db.Close, nil
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

// NemesisChild is a marking consumer of RunNemesis (register it in the
// test binary's TestMain under Nemesis.Child); backend builds its tier's
// backend from the spec, and what closes its client. It marks batches of
// nemesisBatch in order, as a consumer would: a batch whose MarkBatch
// fails is marked again (redelivered) until it succeeds, and its keys answered InFlight are marked again
// until they are New or Duplicate; after each success it prints
// "B <batch> <index>…." with the index of every key it was told New, and
// every few batches it marks an earlier batch again (a broker's
// redelivery of acknowledged messages), printing what was New there too.
func NemesisChild(spec string, backend func(NemesisSpec) (tier.Backend, func(), error)) int {
	var sp NemesisSpec
	if err := json.Unmarshal([]byte(spec), &sp); err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	say := crashtest.Say()
	b, closeB, err := backend(sp)
	if err != nil {
		say("ERR backend: %v", err)
		return 1
	}
	defer closeB()
	o, closeArchive, err := nemesisOptions(b, sp)
	if err != nil {
		say("ERR archive: %v", err)
		return 1
	}
	defer closeArchive()
	var e *engine.Engine
	for {
		var err error
		e, err = engine.Open(o)
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
	pace := 30 * time.Millisecond // a consumer's pace: the checks stay short
	if sp.Archive != "" {
		pace = 100 * time.Millisecond // and the drain keeps up
	}
	for b := sp.From; ; b++ {
		time.Sleep(pace)
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

// NemesisRounds is TIERDEDUP_NEMESIS_ROUNDS, or 6.
func NemesisRounds() int {
	if n, err := strconv.Atoi(os.Getenv("TIERDEDUP_NEMESIS_ROUNDS")); err == nil && n > 0 {
		return n
	}
	return 6
}

// RunNemesis runs n: see the package's mark nemesis.
func RunNemesis(t *testing.T, n Nemesis) {
	maxAttempts := n.MaxAttempts
	l := &nemesisLedger{acked: map[string]int{}, last: map[int]int{}, failures: map[int]int{}, done: map[[2]int]bool{}, killed: map[[2]int]bool{}}
	policies := n.Policies
	children := make([]*crashtest.Child, len(policies))
	start := func(id int) {
		l.mu.Lock()
		from := l.last[id] + 1
		l.mu.Unlock()
		sp, _ := json.Marshal(NemesisSpec{Addr: n.Addr, Name: n.Name, ID: id, Policy: policies[id], MaxAttempts: maxAttempts, From: from, Timeout: time.Second,
			Archive: n.Archive, ArchiveTable: n.ArchiveTable})
		children[id] = crashtest.Start(t, n.Child, string(sp), &crashtest.Options{
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
	check := newNemesisChecker(t, n.Checker, NemesisSpec{MaxAttempts: maxAttempts, Archive: n.Archive, ArchiveTable: n.ArchiveTable})
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 41))
	rounds := NemesisRounds()
	var pauses, kills int
	for r := range rounds {
		time.Sleep(time.Duration(300+rng.IntN(700)) * time.Millisecond)
		action := rng.IntN(4)
		if r == 0 {
			action = 0 // every run pauses the server at least once
		}
		if action == 0 || action == 2 {
			pauses++
			n.Pause()
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
			n.Resume()
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
	if n.Archive != "" {
		// Every key acknowledged has left the tier's window: the last
		// check finds them all in the archive.
		time.Sleep(nemesisArchivedWindow)
	}
	acked := check.acked(l)
	l.mu.Lock()
	defer l.mu.Unlock()
	t.Logf("%d rounds, %d pauses, %d kills: %d keys acknowledged New, %d and %d failed calls (consumers 0 and 1), %d keys New twice",
		rounds, pauses, kills, acked, l.failures[0], l.failures[1], len(l.twice))
	if len(l.errs) > 0 {
		t.Fatalf("consumers reported: %s", strings.Join(l.errs[:min(len(l.errs), 10)], "; "))
	}
	if len(l.twice) > 0 {
		t.Fatalf("%d acknowledged keys were New again, for example %s", len(l.twice), strings.Join(l.twice[:min(len(l.twice), 5)], ", "))
	}
	if l.failures[0]+l.failures[1] == 0 {
		t.Fatal("no MarkBatch failed: the nemesis never reached a call")
	}
	if n.Archive != "" {
		// The last check ran after most acknowledged keys had left the
		// tier's window: the archive must have answered for them.
		st := check.e.Stats().Archive
		if st == nil || st.Hits == 0 {
			t.Fatalf("with an archive, the checks found no acknowledged key in it (%+v)", st)
		}
		t.Logf("the checks found %d acknowledged keys in the archive", st.Hits)
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

func newNemesisChecker(t *testing.T, b tier.Backend, sp NemesisSpec) *nemesisChecker {
	o, closeArchive, err := nemesisOptions(b, sp)
	if err != nil {
		t.Fatalf("the checker's archive: %v", err)
	}
	t.Cleanup(closeArchive)
	for deadline := time.Now().Add(time.Minute); ; {
		e, err := engine.Open(o)
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
	deadline := time.Now().Add(2 * time.Minute) // an archive catching up answers ErrUnavailable meanwhile
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
