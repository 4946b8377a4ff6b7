package kafkadedup_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/integrations/kafkadedup"
	"github.com/tierdedup/tierdedup/internal/crashtest"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// The end-to-end tests run an in-process Kafka cluster (kfake: the real
// protocol, consumer groups and rebalances, on loopback) and consumer
// processes that are this test binary re-executed, killed and restarted.

// TestMain sends a consumer process (this test binary, re-executed by
// crashtest.Start) to its code.
func TestMain(m *testing.M) {
	crashtest.Main(m, map[string]func(spec string) int{"consumer": child})
}

// childSpec is what a consumer process is told.
type childSpec struct {
	Brokers []string
	Topic   string
	Group   string
	Dir     string
	Exports string
	// Delay is the handler's work per record.
	Delay time.Duration
	// Session is the group session timeout: short where members are
	// killed (the group drops them sooner), long where they leave cleanly
	// (so that a member slowed by a loaded machine is not dropped).
	Session time.Duration
	// Rebalance is the group rebalance timeout (10 s when zero): how long
	// a rebalance waits for the members to rejoin. kfake drops a member
	// whose session ends while it waits in JoinGroup or SyncGroup without
	// answering it (Kafka keeps such a member), and the member then waits
	// out its request's timeout (Rebalance plus 10 s by default); a
	// Rebalance well under Session keeps every wait under the session.
	Rebalance time.Duration
	// Overhead is kgo.RequestTimeoutOverhead (its default when zero).
	Overhead time.Duration
}

var quiet = log.New(io.Discard, "", 0)

// quietEngine discards an engine\'s logs.
var quietEngine = slog.New(slog.DiscardHandler)

// child consumes until SIGTERM (a clean leave: partitions revoked, flushed
// and exported) or SIGKILL. The handler's effect is a ledger record
// ledger/<id>/<pid>-<seq>, one per application, written with the marks.
// It prints, for each partition of a poll, "F partition first last" before
// processing it and "B partition next" after (next: the stored offset),
// then its counters' increase "S new duplicates".
func child(specJSON string) int {
	var spec childSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	say := crashtest.Say()
	m, err := kafkadedup.New(&kafkadedup.Options{
		Group: spec.Group,
		Dir:   spec.Dir, Exports: spec.Exports,
		Engine:   engine.Options{ExpectedKeys: 100_000, MaxAttempts: 5, Logger: quietEngine},
		OpenWait: time.Minute,
		Logger:   log.New(writerFunc(func(p []byte) { say("L %s", strings.TrimSpace(string(p))) }), "", 0),
	})
	if err != nil {
		say("ERR %v", err)
		return 1
	}
	opts := append(m.Opts(),
		kgo.SeedBrokers(spec.Brokers...), kgo.ConsumeTopics(spec.Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.SessionTimeout(spec.Session), kgo.HeartbeatInterval(100*time.Millisecond),
		kgo.RebalanceTimeout(cmp.Or(spec.Rebalance, 10*time.Second)), kgo.FetchMaxWait(50*time.Millisecond),
	)
	if spec.Overhead > 0 {
		opts = append(opts, kgo.RequestTimeoutOverhead(spec.Overhead))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		say("ERR %v", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pid, seq := os.Getpid(), 0
	last := map[int32]int64{} // per partition, the poll's last offset
	handle := func(_ context.Context, r *kgo.Record) ([]engine.Write, error) {
		seq++
		if spec.Delay > 0 {
			time.Sleep(spec.Delay)
		}
		if r.Offset == last[r.Partition] {
			say("H") // the partition's commit follows
		}
		return []engine.Write{{Key: fmt.Appendf(nil, "ledger/%s/%d-%d", r.Key, pid, seq), Value: []byte{1}}}, nil
	}
	var before kafkadedup.Stats
	for ctx.Err() == nil {
		fetches := cl.PollRecords(ctx, 400)
		if fetches.IsClientClosed() || ctx.Err() != nil {
			cl.AllowRebalance()
			break
		}
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			if n := len(p.Records); n > 0 {
				say("F %d %d %d", p.Partition, p.Records[0].Offset, p.Records[n-1].Offset)
				last[p.Partition] = p.Records[n-1].Offset
			}
		})
		if err := m.Process(context.Background(), cl, fetches, handle); err != nil {
			say("E %v", err)
		}
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) > 0 {
				next, _ := m.Offset(p.Topic, p.Partition)
				say("B %d %d", p.Partition, next)
			}
		})
		s := m.Stats()
		say("S %d %d", s.New-before.New, s.Duplicates-before.Duplicates)
		before = s
		cl.AllowRebalance()
	}
	cl.Close() // leaves the group: every partition revoked, flushed, exported
	if err := m.Close(); err != nil {
		say("ERR %v", err)
		return 1
	}
	say("X")
	return 0
}

type writerFunc func([]byte)

func (w writerFunc) Write(p []byte) (int, error) { w(p); return len(p), nil }

// consumer is one consumer process and what its output told.
type consumer struct {
	spec  string
	child *crashtest.Child
	// fetched gets a value when the consumer starts processing a poll,
	// committing when it handled a partition's last record.
	fetched, committing chan struct{}
	// tail is the consumer's last lines (guarded by run.mu), printed when
	// a run does not catch up.
	tail []string
}

// run is an end-to-end run: a cluster, a topic, its produced records, and
// the consumers' reports.
type run struct {
	t        *testing.T
	cluster  *kfake.Cluster
	topic    string
	parts    int32
	produced map[int32]int64 // per partition, the offset after the last record
	ids      []string        // every distinct message ID produced
	resends  int

	mu          sync.Mutex
	next        map[int32]int64 // per partition, the highest stored offset a consumer reported
	seen        map[int32]map[int64]int
	news, dups  int
	assigned    int
	imports     int
	exportsMade int
	lost        int // partitions a member lost (dropped from the group) rather than gave up
	consumers   []*consumer
	last        map[string]time.Time // when a line of each kind last arrived
}

func newRun(t *testing.T, parts int32) *run {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(parts, "orders"), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return &run{t: t, cluster: c, topic: "orders", parts: parts, produced: map[int32]int64{},
		next: map[int32]int64{}, seen: map[int32]map[int64]int{}, last: map[string]time.Time{}}
}

// produce writes n records, resend of them (a tenth in the run)
// producer re-sends of an earlier record's ID (same key, so the same
// partition), paced over about d.
func (r *run) produce(n int, resendShare float64, d time.Duration, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 3))
	cl, err := kgo.NewClient(kgo.SeedBrokers(r.cluster.ListenAddrs()...), kgo.DefaultProduceTopic(r.topic))
	if err != nil {
		r.t.Error(err)
		return
	}
	defer cl.Close()
	const batch = 500
	pause := d / time.Duration(n/batch+1)
	for sent := 0; sent < n; {
		recs := make([]*kgo.Record, 0, batch)
		for ; len(recs) < batch && sent < n; sent++ {
			var id string
			if len(r.ids) > 0 && rng.Float64() < resendShare {
				id = r.ids[rng.IntN(len(r.ids))]
				r.resends++
			} else {
				id = "m-" + strconv.Itoa(len(r.ids))
				r.ids = append(r.ids, id)
			}
			recs = append(recs, &kgo.Record{Key: []byte(id), Value: []byte(id)})
		}
		res := cl.ProduceSync(context.Background(), recs...)
		if err := res.FirstErr(); err != nil {
			r.t.Error(err)
			return
		}
		r.mu.Lock()
		for _, pr := range res {
			r.produced[pr.Record.Partition] = max(r.produced[pr.Record.Partition], pr.Record.Offset+1)
		}
		r.mu.Unlock()
		time.Sleep(pause)
	}
}

func (r *run) start(spec childSpec) *consumer {
	spec.Brokers, spec.Topic, spec.Group = r.cluster.ListenAddrs(), r.topic, "orders-consumers"
	b, _ := json.Marshal(spec)
	c := &consumer{spec: string(b), fetched: make(chan struct{}, 1), committing: make(chan struct{}, 1)}
	r.mu.Lock()
	r.consumers = append(r.consumers, c)
	r.mu.Unlock()
	r.restart(c)
	return c
}

// restart starts c's process; it runs until killed or stopped.
func (r *run) restart(c *consumer) {
	c.child = crashtest.Start(r.t, "consumer", c.spec, &crashtest.Options{Timeout: crashtest.NoTimeout, OnLine: func(line string) {
		switch ch := map[string]chan struct{}{"F": c.fetched, "H": c.committing}[strings.Fields(line + " ")[0]]; {
		case ch != nil:
			select {
			case ch <- struct{}{}:
			default:
			}
		}
		r.mu.Lock()
		if c.tail = append(c.tail, line); len(c.tail) > 40 {
			c.tail = c.tail[len(c.tail)-40:]
		}
		r.mu.Unlock()
		r.line(line)
	}})
}

func (r *run) line(s string) {
	f := strings.Fields(s)
	if len(f) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last[f[0]] = time.Now()
	switch f[0] {
	case "B":
		var part int32
		var next int64
		if _, err := fmt.Sscanf(s, "B %d %d", &part, &next); err != nil {
			r.t.Errorf("bad line %q", s)
			return
		}
		r.next[part] = max(r.next[part], next)
	case "F":
		var part int32
		var first, last int64
		if _, err := fmt.Sscanf(s, "F %d %d %d", &part, &first, &last); err != nil {
			r.t.Errorf("bad line %q", s)
			return
		}
		if r.seen[part] == nil {
			r.seen[part] = map[int64]int{}
		}
		for o := first; o <= last; o++ {
			r.seen[part][o]++
		}
	case "S":
		var n, d int
		fmt.Sscanf(s, "S %d %d", &n, &d)
		r.news += n
		r.dups += d
	case "L":
		switch {
		case strings.Contains(s, "assigned"):
			r.assigned++
		case strings.Contains(s, ": imported"):
			r.imports++
		case strings.Contains(s, ": exported"):
			r.exportsMade++
		case strings.Contains(s, ": lost"):
			r.lost++
			r.t.Logf("consumer: %s", s)
		case !strings.Contains(s, "assigned"):
			r.t.Logf("consumer: %s", s)
		}
	case "E", "ERR":
		r.t.Logf("consumer: %s", s)
	}
}

// caughtUp reports whether every partition's stored offset reached the end
// of what was produced.
func (r *run) caughtUp() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for p, end := range r.produced {
		if r.next[p] < end {
			return false
		}
	}
	return len(r.produced) > 0
}

// catchUp bounds how long the consumers may take to process everything
// produced: under a minute on a quiet machine, but the race detector on 2
// cores beside other packages' tests slows kfake's group coordination by
// an order of magnitude.
const catchUp = 4 * time.Minute

func (r *run) waitCaughtUp(d time.Duration) {
	deadline := time.Now().Add(d)
	for !r.caughtUp() {
		if time.Now().After(deadline) {
			r.mu.Lock()
			defer r.mu.Unlock()
			// What each consumer said last, and when each kind of line
			// last came, tell a stalled group from a slow one.
			for i, c := range r.consumers {
				r.t.Logf("consumer %d's last lines:\n\t%s", i, strings.Join(c.tail, "\n\t"))
				// Every goroutine's stack, on the child's stderr (the
				// test's output): where a stalled member waits.
				c.child.Signal(syscall.SIGQUIT)
			}
			r.mu.Unlock()
			time.Sleep(2 * time.Second)
			r.mu.Lock()
			for kind, at := range r.last {
				r.t.Logf("last %q line %v ago", kind, time.Since(at).Round(time.Millisecond))
			}
			r.t.Fatalf("consumers did not catch up in %v: stored %v, produced %v", d, r.next, r.produced)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// redeliveries counts records fetched more than once (by any consumer).
func (r *run) redeliveries() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, offs := range r.seen {
		for _, c := range offs {
			n += c - 1
		}
	}
	return n
}

// stop ends a consumer with SIGTERM (a clean leave) and waits for it, up
// to 30 s before it kills it.
func stop(c *consumer) {
	_ = c.child.Stop(syscall.SIGTERM, 30*time.Second)
}

// effects counts each message ID's ledger records over the partition
// directories under dir.
func (r *run) effects(dirs []string) map[string]int {
	effects := map[string]int{}
	for _, d := range dirs {
		e, err := engine.Open(&engine.Options{Backend: embedded.Dir(d), ExpectedKeys: 100_000, Logger: quietEngine})
		if err != nil {
			r.t.Fatal(err)
		}
		if err := e.ScanWrites([]byte("ledger/"), func(k, _ []byte) error {
			id, _, _ := strings.Cut(strings.TrimPrefix(string(k), "ledger/"), "/")
			effects[id]++
			return nil
		}); err != nil {
			r.t.Fatal(err)
		}
		if err := e.Close(); err != nil {
			r.t.Fatal(err)
		}
	}
	return effects
}

// checkExactlyOnce checks every produced ID's effect is there once.
func (r *run) checkExactlyOnce(effects map[string]int) (repeated int) {
	missing := 0
	for _, id := range r.ids {
		switch c := effects[id]; {
		case c == 0:
			missing++
		case c > 1:
			repeated += c - 1
		}
	}
	if missing > 0 || repeated > 0 {
		r.t.Errorf("%d of %d message IDs have no effect, %d effects repeated; want every one exactly once", missing, len(r.ids), repeated)
	}
	if len(effects) != len(r.ids) {
		r.t.Errorf("%d IDs in the ledger, %d produced", len(effects), len(r.ids))
	}
	return repeated
}

func partitionDirs(root, topic string, parts int32) []string {
	var dirs []string
	for p := range parts {
		dirs = append(dirs, filepath.Join(root, "orders-consumers", topic+"."+strconv.Itoa(int(p))))
	}
	return dirs
}

// killAfter waits for the next signal on phase (up to 2s), then for d.
func killAfter(phase chan struct{}, d time.Duration) {
	select {
	case <-phase:
	default:
	}
	select {
	case <-phase:
		time.Sleep(d)
	case <-time.After(2 * time.Second):
	}
}

// churn, until produced is closed and it has done so at least least times,
// waits 300 ms plus up to spread ms, ends a random consumer with end,
// waits up to gap ms and restarts it. It returns how many it ended.
func (r *run) churn(rng *rand.Rand, cs []*consumer, produced <-chan struct{}, least, spread, gap int, end func(*consumer)) (n int) {
	for done := false; !done || n < least; {
		time.Sleep(time.Duration(300+rng.IntN(spread)) * time.Millisecond)
		c := cs[rng.IntN(len(cs))]
		end(c)
		n++
		time.Sleep(time.Duration(rng.IntN(gap)) * time.Millisecond)
		r.restart(c)
		select {
		case <-produced:
			done = true
		default:
		}
	}
	return n
}

// TestKafkaKills: one topic of 6 partitions, 100,000 records of which a
// tenth are producer re-sends of an earlier ID, 3 consumer processes
// sharing one directory that are SIGKILLed and restarted at random moments
// at least 10 times while the records arrive, partitions moving between
// them at each kill. Every message ID's effect must be in the ledger
// exactly once.
func TestKafkaKills(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end run of about a minute; CI runs it without -short")
	}
	r := newRun(t, 6)
	rng := rand.New(rand.NewPCG(1, uint64(time.Now().UnixNano())))
	dir := t.TempDir()
	cs := []*consumer{}
	for range 3 {
		cs = append(cs, r.start(childSpec{Dir: dir, Delay: 20 * time.Microsecond,
			Session: 6 * time.Second, Rebalance: 2 * time.Second, Overhead: 4 * time.Second}))
	}
	produced := make(chan struct{})
	seed := rng.Uint64()
	go func() { defer close(produced); r.produce(100_000, 0.1, 15*time.Second, seed) }()
	kills := r.churn(rng, cs, produced, 10, 900, 400, func(c *consumer) {
		// A third of the kills fall anywhere, a third inside the
		// processing of a poll (its handlers, its commits), a third around
		// a partition's commit.
		switch phase := []chan struct{}{nil, c.fetched, c.committing}[rng.IntN(3)]; {
		case phase == c.fetched:
			killAfter(phase, time.Duration(rng.IntN(10_000))*time.Microsecond)
		case phase != nil:
			killAfter(phase, time.Duration(rng.IntN(1500))*time.Microsecond)
		}
		_ = c.child.Kill()
	})
	r.waitCaughtUp(catchUp)
	for _, c := range cs {
		stop(c)
	}
	repeated := r.checkExactlyOnce(r.effects(partitionDirs(dir, r.topic, r.parts)))
	t.Logf("%d records (%d IDs, %d re-sends), 3 consumers, %d SIGKILLs, %d partition assignments, %d redeliveries, %d duplicates absorbed, %d repeated effects",
		len(r.ids)+r.resends, len(r.ids), r.resends, kills, r.assigned, r.redeliveries(), r.dups, repeated)
	if r.resends < 9000 {
		t.Errorf("only %d re-sends", r.resends)
	}
}

// TestKafkaHandoff: 3 consumer processes, each with its own directory, hand
// partitions over through a shared export directory as they leave and join
// (SIGTERM: revocation exports, assignment imports). Counted over the
// final exports, each partition's last state, every message ID's effect is
// there exactly once: the state followed each partition.
func TestKafkaHandoff(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end run; CI runs it without -short")
	}
	r := newRun(t, 6)
	rng := rand.New(rand.NewPCG(2, uint64(time.Now().UnixNano())))
	root, exports := t.TempDir(), t.TempDir()
	cs := []*consumer{}
	for i := range 3 {
		cs = append(cs, r.start(childSpec{Dir: filepath.Join(root, strconv.Itoa(i)), Exports: exports, Delay: 20 * time.Microsecond, Session: 6 * time.Second}))
	}
	produced := make(chan struct{})
	seed := rng.Uint64()
	go func() { defer close(produced); r.produce(30_000, 0.1, 6*time.Second, seed) }()
	moves := r.churn(rng, cs, produced, 6, 600, 300, stop)
	r.waitCaughtUp(catchUp)
	// Whatever the moves above made of it, one member now handles records
	// of its own and then leaves for good: the others must take its
	// partitions over from its exports, newer than anything they hold, and
	// go on from there (the records produced after it left reach every
	// partition, so the run catches up only once they did).
	r.produce(3000, 0, time.Second, seed+1)
	r.waitCaughtUp(catchUp)
	r.mu.Lock()
	before := r.imports
	r.mu.Unlock()
	stop(cs[0])
	cs = cs[1:]
	r.produce(1000, 0, time.Second, seed+2)
	r.waitCaughtUp(catchUp)
	for _, c := range cs {
		stop(c)
	}
	repeated := r.checkExactlyOnce(r.effects(partitionDirs(exports, r.topic, r.parts)))
	if r.imports == before {
		t.Errorf("no partition of the member that left was imported (%d imports before): the state did not move", before)
	}
	// No consumer was killed, so unless the group dropped a member (its
	// partitions lost, not exported: their work since the last export is
	// redone by the next owner, and rolled back with the state it was
	// written in), every handling the consumers committed is one the world
	// saw. Each ID must have been handled once over all of them (a new
	// owner that did not take over the state would handle its partition's
	// records again).
	switch {
	case r.lost == 0 && r.news != len(r.ids):
		t.Errorf("%d records handled and committed over all consumers, %d IDs: the state did not follow the partitions", r.news, len(r.ids))
	case r.lost > 0:
		t.Logf("%d partitions lost by a member the group dropped: %d handlings for %d IDs (the lost work redone)", r.lost, r.news, len(r.ids))
	}
	t.Logf("%d records, %d leaves and joins, %d assignments, %d exports, %d imports, %d partitions lost, %d redeliveries, %d duplicates absorbed, %d repeated effects",
		len(r.ids)+r.resends, moves, r.assigned, r.exportsMade, r.imports, r.lost, r.redeliveries(), r.dups, repeated)
}
