package memory

import (
	"bytes"
	"strconv"
	"testing"

	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
)

// commitResult claims and commits f with result r at now.
func commitResult(t *testing.T, tb *Table, f shard.Fingerprint, token uint64, now int64, r []byte) {
	t.Helper()
	if got := acquire(tb, f, token, now, 100); got.Status != tier.Acquired {
		t.Fatalf("acquire: %v", got.Status)
	}
	if st := one(tb.Begin, f, token, now); st != tier.OK {
		t.Fatalf("begin: %v", st)
	}
	tb.FinishResults([]shard.Fingerprint{f}, []uint64{token}, []bool{true}, []int64{now + 1000}, []Digest{d(token)}, [][]byte{r}, now)
}

// TestResults: with Options.Results a committed entry answers with its
// result and time; eviction, expiry and a later commit without a result
// leave no result behind (an index reused by another key never carries
// one); without the option a commit with a result leaves no entry.
func TestResults(t *testing.T) {
	tb := newTable(t, &Options{Capacity: 8, Stripes: 1, Results: true})
	for i := range 8 {
		commitResult(t, tb, fp(i), uint64(i+1), 10, []byte("r"+strconv.Itoa(i)))
	}
	got := acquire(tb, fp(3), 99, 20, 100)
	if got.Status != tier.Committed || string(got.Result) != "r3" || got.At != 10 {
		t.Fatalf("committed with a result: %+v", got)
	}
	got.Result[0] = 'X'
	if again := acquire(tb, fp(3), 99, 20, 100); string(again.Result) != "r3" {
		t.Fatalf("the answer's result is not a copy: %q", again.Result)
	}
	// Evict every one of them with commits that carry no result.
	for i := 100; i < 108; i++ {
		commitResult(t, tb, fp(i), uint64(i), 30, nil)
	}
	s := &tb.stripes[0]
	if len(s.results) != 0 {
		t.Fatalf("%d results kept for evicted entries", len(s.results))
	}
	for i := 100; i < 108; i++ {
		if got := acquire(tb, fp(i), 1, 40, 100); got.Status != tier.Committed || got.Result != nil {
			t.Fatalf("key %d committed without a result answers %+v", i, got)
		}
	}
	// An expired entry with a result is claimed afresh: its result goes.
	commitResult(t, tb, fp(200), 200, 50, []byte("old"))
	if got := acquire(tb, fp(200), 201, 50+2000, 100); got.Status != tier.Acquired {
		t.Fatalf("expired: %v", got.Status)
	}
	tb.Finish([]shard.Fingerprint{fp(200)}, []uint64{201}, []bool{false}, 0, []Digest{{}})
	if len(s.results) != 0 {
		t.Fatalf("an expired entry kept its result (%d kept)", len(s.results))
	}

	plain := newTable(t, &Options{Capacity: 8, Stripes: 1})
	commitResult(t, plain, fp(1), 1, 10, []byte("r"))
	if _, committed := plain.Len(); committed != 0 {
		t.Fatalf("without Options.Results a commit with a result left %d entries", committed)
	}
	if got := acquire(plain, fp(1), 2, 20, 100); got.Status != tier.Acquired || !bytes.Equal(got.Result, nil) {
		t.Fatalf("without Options.Results: %+v, want the key left to the tier that stores it", got)
	}
}
