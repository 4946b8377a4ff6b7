package enginetest_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier/bloom"
)

// Attacks on the growing Bloom filters of the embedded store (and the
// growing memory table): every key a MarkBatch acknowledged must be a
// Duplicate inside the window, across growth, rotation, snapshots,
// checkpoints, seals, crashes and reopen with other parameters.

// gaSmall reports the attacks' small size: under -race, and unless
// TIERDEDUP_GROWTH_FULL is set (then they run at the default
// ExpectedKeys, seven doublings: 27 s without -race). The small size
// grows a ring of three doublings through the same code.
func gaSmall() bool { return enginetest.RaceEnabled() || os.Getenv("TIERDEDUP_GROWTH_FULL") == "" }

// gaScale returns n, or n/(4·div) at the small size.
func gaScale(n, div int) int {
	if gaSmall() {
		return max(1, n/(4*div))
	}
	return n
}

// gaScaleUp returns a growth factor an attack must see: f, or f/2 at the
// small size, whose ring has fewer steps.
func gaScaleUp(f int) int {
	if gaSmall() {
		return f / 2
	}
	return f
}

// gaExpected is the ExpectedKeys of the growth attacks: the default
// (seven doublings, the last at ~312k keys a partition), or 600k at the
// small size (three doublings, the last at ~19k).
func gaExpected() int {
	if gaSmall() {
		return 600_000
	}
	return bloom.DefaultExpectedKeys
}

// gaFull is the keys a partition needs to have grown the ring of
// gaExpected through all its steps, and a little more.
func gaFull() int { return gaExpected()/2/16 + gaExpected()/40 }

// ledger is the keys acknowledged so far.
type ledger struct {
	mu   sync.Mutex
	keys [][]byte
}

func (l *ledger) add(keys [][]byte) {
	l.mu.Lock()
	l.keys = append(l.keys, keys...)
	l.mu.Unlock()
}

func (l *ledger) snapshot() [][]byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([][]byte(nil), l.keys...)
}

func (l *ledger) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.keys)
}

// gaMarkFresh has workers goroutines mark fresh keys (prefix-i, i from
// next) in batches of batch until total keys are marked or stop closes;
// every fresh key must be New, and each acknowledged batch goes to l. It
// returns the first error (a fresh key not New, a failed mark).
func gaMarkFresh(e *engine.Engine, l *ledger, prefix string, next *atomic.Int64, total int64, workers, batch int, stop <-chan struct{}) error {
	return gaMarkFreshClock(e, l, prefix, next, total, workers, batch, stop, false)
}

// gaMarkFreshClock is gaMarkFresh; inFlightOK accepts InFlight for a fresh
// key (the clock jumped past the lease while its mark ran), which is then
// not acknowledged.
func gaMarkFreshClock(e *engine.Engine, l *ledger, prefix string, next *atomic.Int64, total int64, workers, batch int, stop <-chan struct{}, inFlightOK bool) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	fail := func(err error) {
		mu.Lock()
		if first == nil {
			first = err
		}
		mu.Unlock()
	}
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]engine.Outcome, batch)
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := next.Add(int64(batch)) - int64(batch)
				if start >= total {
					return
				}
				n := int(min(int64(batch), total-start))
				keys := make([][]byte, n)
				for i := range keys {
					keys[i] = fmt.Appendf(nil, "%s-%d", prefix, start+int64(i))
				}
				if err := e.MarkBatch(context.Background(), keys, nil, out[:n]); err != nil {
					if errors.Is(err, engine.ErrClosed) {
						return
					}
					fail(fmt.Errorf("mark %s..: %w", keys[0], err))
					return
				}
				acked := keys[:0:0]
				for i, o := range out[:n] {
					switch {
					case o == engine.New:
						acked = append(acked, keys[i])
					case o == engine.InFlight && inFlightOK:
						// A clock jump past the lease during the mark:
						// documented InFlight, nothing marked.
					default:
						fail(fmt.Errorf("fresh key %s marked %v", keys[i], o))
						return
					}
				}
				l.add(acked)
			}
		}()
	}
	wg.Wait()
	return first
}

// gaAllDuplicate marks every key again once the filters are warm: each must
// be a Duplicate (a New is an acknowledged key lost: with memory too small
// to hold them, the filters' "absent").
func gaAllDuplicate(t testing.TB, e *engine.Engine, keys [][]byte, what string) {
	t.Helper()
	waitWarm(t, e)
	const batch = 1024
	out := make([]engine.Outcome, batch)
	lost := 0
	var sample []string
	for i := 0; i < len(keys); i += batch {
		b := keys[i:min(i+batch, len(keys))]
		if err := e.MarkBatch(context.Background(), b, nil, out[:len(b)]); err != nil {
			t.Fatalf("%s: mark again: %v", what, err)
		}
		for j, o := range out[:len(b)] {
			if o != engine.Duplicate {
				lost++
				if len(sample) < 5 {
					sample = append(sample, fmt.Sprintf("%s=%v", b[j], o))
				}
			}
		}
	}
	if lost > 0 {
		st := e.Stats().Bloom
		t.Fatalf("%s: %d of %d acknowledged keys not Duplicate (e.g. %v); bloom mode %s, %d bytes, %d negatives, rebuilt %d, sealed loaded %d, restored %d",
			what, lost, len(keys), sample, st.Mode, st.Bytes, st.Negatives, st.RebuiltKeys, st.SealedLoaded, st.Restored)
	}
}

// gaLookupAll looks every key up: each must be a Duplicate.
func gaLookupAll(t testing.TB, e *engine.Engine, keys [][]byte, what string) {
	t.Helper()
	const batch = 1024
	out := make([]engine.KeyInfo, batch)
	for i := 0; i < len(keys); i += batch {
		b := keys[i:min(i+batch, len(keys))]
		if err := e.LookupBatch(context.Background(), b, out[:len(b)]); err != nil {
			t.Fatalf("%s: lookup: %v", what, err)
		}
		for j, info := range out[:len(b)] {
			if info.Outcome != engine.Duplicate {
				t.Fatalf("%s: lookup of acknowledged key %s: %v (source %v)", what, b[j], info.Outcome, info.Source)
			}
		}
	}
}

// gaMarkSeq marks n fresh keys prefix-from.. in batches, in one goroutine,
// and returns them.
func gaMarkSeq(t testing.TB, e *engine.Engine, prefix string, from, n int) [][]byte {
	t.Helper()
	var l ledger
	var next atomic.Int64
	if err := gaMarkFresh(e, &l, fmt.Sprintf("%s-%d", prefix, from), &next, int64(n), 1, 512, nil); err != nil {
		t.Fatal(err)
	}
	return l.keys
}

// gaOpen opens an engine that leaves deduplication to the filters and
// Pebble: memory holds one committed key a stripe.
func gaOpen(t testing.TB, o engine.Options) *engine.Engine {
	t.Helper()
	o.MemoryCapacity = 1
	return open(t, o)
}

// gaRemarker re-marks batches of 128 acknowledged keys of l until stop
// closes, each from the newest recent keys (one in anyEvery from all of
// them; 0: none), and checks each answers Duplicate; each batch checked
// counts in checks (if not nil). Its error, or nil once stopped, arrives
// on the channel it returns.
func gaRemarker(e *engine.Engine, l *ledger, stop <-chan struct{}, checks *atomic.Int64, recent, anyEvery int, what string) <-chan error {
	res := make(chan error, 1)
	go func() {
		rng := rand.New(rand.NewPCG(11, 12))
		out := make([]engine.Outcome, 128)
		for {
			select {
			case <-stop:
				res <- nil
				return
			default:
			}
			keys := l.snapshot()
			if len(keys) < 128 {
				time.Sleep(time.Millisecond)
				continue
			}
			b := make([][]byte, 128)
			for i := range b {
				j := len(keys) - 1 - rng.IntN(min(len(keys), recent))
				if anyEvery > 0 && i%anyEvery == 0 {
					j = rng.IntN(len(keys))
				}
				b[i] = keys[j]
			}
			if err := e.MarkBatch(context.Background(), b, nil, out); err != nil {
				res <- err
				return
			}
			for i, o := range out {
				if o != engine.Duplicate {
					res <- fmt.Errorf("%s: acknowledged key %s marked %v (%d acknowledged, filters %d bytes)", what, b[i], o, len(keys), e.Stats().Bloom.Bytes)
					return
				}
			}
			if checks != nil {
				checks.Add(1)
			}
		}
	}()
	return res
}
