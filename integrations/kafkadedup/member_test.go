package kafkadedup_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/integrations/kafkadedup"
	"github.com/tierdedup/tierdedup/tier/embedded"
	"github.com/tierdedup/tierdedup/tier/redis"
)

// consumeUntil polls cl, processing with h, until partition 0 of "orders"
// stores offset want.
func consumeUntil(t *testing.T, m *kafkadedup.Member, cl *kgo.Client, want int64, h kafkadedup.Handler) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			cl.AllowRebalance() // or closing the client waits for it forever
			t.Fatalf("offset %d not reached", want)
		}
		_ = m.Process(ctx, cl, fetches, h)
		cl.AllowRebalance()
		if next, ok := m.Offset("orders", 0); ok && next == want {
			return
		}
	}
}

func member(t *testing.T, o kafkadedup.Options, brokers []string) (*kafkadedup.Member, *kgo.Client) {
	t.Helper()
	o.Logger = quiet
	m, err := kafkadedup.New(&o)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(append(m.Opts(), kgo.SeedBrokers(brokers...),
		kgo.ConsumeTopics("orders"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50*time.Millisecond))...)
	if err != nil {
		t.Fatal(err)
	}
	return m, cl
}

// TestFailingHandler: a handler that keeps failing on one record stops its
// partition there (the records before it commit, those after it wait and
// are not counted as attempts) until the record turns Poison and is
// rejected; a record with an empty key is rejected at once. Every other
// record is handled exactly once, in offset order, and a restarted member
// resumes at the stored offset without handling anything again.
func TestFailingHandler(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.SeedTopics(1, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	produce(brokers, "a", "", "b", "c")

	var rejected []string
	o := kafkadedup.Options{
		Group:  "g",
		Dir:    t.TempDir(),
		Engine: engine.Options{MaxAttempts: 3},
		Reject: func(_ context.Context, r *kgo.Record, why error) {
			switch {
			case errors.Is(why, kafkadedup.ErrPoison):
				rejected = append(rejected, string(r.Key)+":poison")
			case errors.Is(why, engine.ErrEmptyKey):
				rejected = append(rejected, "empty")
			default:
				rejected = append(rejected, string(r.Key)+":"+why.Error())
			}
		},
	}
	m, cl := member(t, o, brokers)
	var handled []string
	h := func(_ context.Context, r *kgo.Record) ([]engine.Write, error) {
		handled = append(handled, string(r.Key))
		if string(r.Key) == "b" {
			return nil, errors.New("b fails")
		}
		return []engine.Write{{Key: append([]byte("ledger/"), r.Key...), Value: []byte{1}}}, nil
	}
	consumeUntil(t, m, cl, 4, h)
	if want := []string{"a", "b", "b", "b", "c"}; !slices.Equal(handled, want) {
		t.Fatalf("handled %v, want %v", handled, want)
	}
	if want := []string{"empty", "b:poison"}; !slices.Equal(rejected, want) {
		t.Fatalf("rejected %v, want %v", rejected, want)
	}
	if s := m.Stats(); s.New != 2 || s.Rejected != 2 || s.Failed != 3 {
		t.Fatalf("stats %+v", s)
	}
	var ledger []string
	if err := m.Engine("orders", 0).ScanWrites([]byte("ledger/"), func(k, _ []byte) error {
		ledger = append(ledger, strings.TrimPrefix(string(k), "ledger/"))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ledger, []string{"a", "c"}) {
		t.Fatalf("ledger %v", ledger)
	}
	cl.Close()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}

	// A restart resumes at offset 4: nothing is handled again, although
	// the group has no committed offset (the client would start at 0).
	produce(brokers, "d")
	m, cl = member(t, o, brokers)
	defer m.Close()
	defer cl.Close()
	handled = nil
	consumeUntil(t, m, cl, 5, h)
	if !slices.Equal(handled, []string{"d"}) {
		t.Fatalf("after a restart handled %v, want [d]", handled)
	}
}

// TestForeignDirectory: a partition directory holding another partition's
// offset is refused at assignment rather than trusted.
func TestForeignDirectory(t *testing.T) {
	dir := t.TempDir()
	e, err := engine.Open(&engine.Options{Backend: embedded.Dir(filepath.Join(dir, "g", "orders.0")), Logger: quietEngine})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.CommitBatchWith(context.Background(), nil, nil, []engine.Write{{Key: []byte("kafkadedup/offset/payments/3"), Value: make([]byte, 8)}}); err != nil {
		t.Fatal(err)
	}
	e.Close()
	cluster, err := kfake.NewCluster(kfake.SeedTopics(1, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	logged := &syncBuffer{}
	m, err := kafkadedup.New(&kafkadedup.Options{Group: "g", Dir: dir, Logger: log.New(logged, "", 0)})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	cl, err := kgo.NewClient(append(m.Opts(), kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics("orders"))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(logged.String(), "another partition") {
		if time.Now().After(deadline) {
			t.Fatalf("no refusal logged: %s", logged.String())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		cl.PollFetches(ctx)
		cancel()
		cl.AllowRebalance()
	}
	if m.Engine("orders", 0) != nil {
		t.Fatal("the foreign directory was taken")
	}
}

// syncBuffer is a log destination the client's goroutines write to.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestOptions(t *testing.T) {
	for _, o := range []kafkadedup.Options{
		{},
		{Group: "g"},
		{Dir: "x"},
		{Group: "..", Dir: "x"},
		{Group: "g", Dir: "x", Engine: engine.Options{Backend: redis.NewBackend(nil, redis.Config{})}},
		{Group: "g", Dir: "x", OpenWait: -time.Second},
		{Group: "g", Dir: "x", Engine: engine.Options{Window: -time.Hour}},
	} {
		if _, err := kafkadedup.New(&o); err == nil {
			t.Errorf("New(%+v) accepted", o)
		}
	}
	if _, err := kafkadedup.New(&kafkadedup.Options{}); !errors.Is(err, kafkadedup.ErrOptions) {
		t.Errorf("empty Dir: %v, want ErrOptions", err)
	}
}

// offsetLedger is a handler that writes one record per handled Kafka
// record, keyed by its offset, counts its calls, and fails where told.
type offsetLedger struct {
	mu      sync.Mutex
	calls   map[int64]int
	failing map[int64]int // offset -> times to fail
}

func newOffsetLedger() *offsetLedger {
	return &offsetLedger{calls: map[int64]int{}, failing: map[int64]int{}}
}

func (l *offsetLedger) handle(_ context.Context, r *kgo.Record) ([]engine.Write, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls[r.Offset]++
	if l.failing[r.Offset] > 0 {
		l.failing[r.Offset]--
		return nil, fmt.Errorf("offset %d fails", r.Offset)
	}
	return []engine.Write{{Key: fmt.Appendf(nil, "ledger/%d", r.Offset), Value: r.Value}}, nil
}

// TestStopHoldsLaterRecords: Process gets one partition's records in two
// entries (as a caller that merges polls would pass them) and the handler
// fails at offset 1: the partition stops there, and the later entry does
// not commit past it; the records from offset 1 on are handled after.
func TestStopHoldsLaterRecords(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.SeedTopics(1, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	produce(brokers, "a", "b", "c", "d", "e", "f")
	m, cl := member(t, kafkadedup.Options{Group: "g", Dir: t.TempDir(), Engine: engine.Options{MaxAttempts: 5}}, brokers)
	defer m.Close()
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for len(recs) < 6 {
		f := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatal("records not fetched")
		}
		recs = append(recs, f.Records()...)
	}
	split := kgo.Fetches{{Topics: []kgo.FetchTopic{{Topic: "orders", Partitions: []kgo.FetchPartition{
		{Partition: 0, Records: recs[:3]},
		{Partition: 0, Records: recs[3:]},
	}}}}}
	l := newOffsetLedger()
	l.failing[1] = 1
	_ = m.Process(ctx, cl, split, l.handle)
	cl.AllowRebalance()
	if next, _ := m.Offset("orders", 0); next != 1 {
		t.Fatalf("the handler failed at offset 1, the stored offset is %d (calls %v)", next, l.calls)
	}
	consumeUntil(t, m, cl, 6, l.handle)
	for off := range int64(6) {
		if want := map[bool]int{true: 2, false: 1}[off == 1]; l.calls[off] != want {
			t.Errorf("offset %d handled %d times, want %d (calls %v)", off, l.calls[off], want, l.calls)
		}
	}
}

// TestGroupsKeepTheirOwnState: two consumer groups sharing Dir and
// Exports each handle every record: neither imports nor opens the other's
// state.
func TestGroupsKeepTheirOwnState(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.SeedTopics(1, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	dir, exports := t.TempDir(), t.TempDir()
	produce(brokers, "a", "b", "c")
	l1 := newOffsetLedger()
	m1, cl1 := member(t, kafkadedup.Options{Group: "g1", Dir: dir, Exports: exports}, brokers)
	consumeUntil(t, m1, cl1, 3, l1.handle)
	cl1.Close() // revocation exports g1's state at offset 3
	if err := m1.Close(); err != nil {
		t.Fatal(err)
	}
	if m1.Stats().Exports != 1 {
		t.Fatalf("g1 made %d exports, want 1", m1.Stats().Exports)
	}
	produce(brokers, "d")
	l2 := newOffsetLedger()
	m2, cl2 := member(t, kafkadedup.Options{Group: "g2", Dir: dir, Exports: exports}, brokers)
	defer m2.Close()
	defer cl2.Close()
	consumeUntil(t, m2, cl2, 4, l2.handle)
	for off := range int64(4) {
		if l2.calls[off] != 1 {
			t.Errorf("group g2 handled offset %d %d times, want 1 (imports %d)", off, l2.calls[off], m2.Stats().Imports)
		}
	}
}

// TestRewindIsSetAgain: a partition stopped at a failed record whose
// rewind did not take (kgo skips SetOffsets for a partition it is not
// consuming at that instant, as during an assignment; here the client is
// set past the stop behind the Member's back) must not ignore every later
// record and stall at the partition's end: a fetch from beyond the stop
// sets the client back to it, and every record is handled.
func TestRewindIsSetAgain(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.SeedTopics(1, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	produce(brokers, "a", "b", "c", "d", "e", "f")
	m, cl := member(t, kafkadedup.Options{Group: "g", Dir: t.TempDir(), Engine: engine.Options{MaxAttempts: 5}}, brokers)
	defer m.Close()
	defer cl.Close()
	l := newOffsetLedger()
	l.failing[1] = 1
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		f := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatal("records not fetched")
		}
		_ = m.Process(ctx, cl, f, l.handle)
		if next, ok := m.Offset("orders", 0); ok && next == 1 {
			// The stop's rewind is lost: the client goes on from the end.
			cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{"orders": {0: {Epoch: -1, Offset: 6}}})
			cl.AllowRebalance()
			break
		}
		cl.AllowRebalance()
	}
	produce(brokers, "g", "h")
	consumeUntil(t, m, cl, 8, l.handle)
	for off := range int64(8) {
		if l.calls[off] == 0 {
			t.Errorf("offset %d never handled (calls %v)", off, l.calls)
		}
	}
	if m.Stats().Rewinds == 0 {
		t.Error("no rewind counted")
	}
}

// TestStallReported: a partition whose handler keeps failing at one record
// (MaxAttempts 0: never Poison) receives records but commits nothing: the
// Member says so within StallReport, naming the offset it is stopped at
// and why, and counts it.
func TestStallReported(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.SeedTopics(1, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	produce(brokers, "a", "b", "c")
	var logs syncBuffer
	m, err := kafkadedup.New(&kafkadedup.Options{Group: "g", Dir: t.TempDir(), StallReport: 300 * time.Millisecond, Logger: log.New(&logs, "", 0)})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	cl, err := kgo.NewClient(append(m.Opts(), kgo.SeedBrokers(brokers...),
		kgo.ConsumeTopics("orders"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50*time.Millisecond))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	l := newOffsetLedger()
	l.failing[1] = 1 << 30
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for m.Stats().Stalls == 0 {
		f := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			cl.AllowRebalance()
			t.Fatalf("no stall reported; log:\n%s", logs.String())
		}
		_ = m.Process(ctx, cl, f, l.handle)
		cl.AllowRebalance()
	}
	if !strings.Contains(logs.String(), "stopped at offset 1: offset 1 fails") {
		t.Fatalf("the report does not name the stop and its cause; log:\n%s", logs.String())
	}
}
