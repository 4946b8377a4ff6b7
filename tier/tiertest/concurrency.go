package tiertest

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"github.com/tierdedup/tierdedup/tier"
)

// checkConcurrent: "the engine calls the methods concurrently, from many
// goroutines, with batches that name the same keys; an implementation is
// safe for that". ClaimsInStore: of the concurrent claims of a key
// exactly one is Acquired ("the caller's token now holds the key"), the
// others Held or Committed (by the one), and the key ends committed by the
// winner's token. ClaimsInEngine: concurrent commits and reads of the same
// keys never fail, reads answer Absent or one of the commits, and each key
// ends Committed with one of the digests written. Run it with -race.
func checkConcurrent(h *harness) {
	const keys, workers, batch = 120, 6, 30
	reqs := make([]tier.Request, keys)
	for i := range reqs {
		reqs[i] = h.req(fmt.Sprint("c", i%2), fmt.Sprintf("contended-%03d", i))
	}
	tokens := make([]tier.Token, workers)
	for w := range tokens {
		tokens[w] = h.tok()
	}
	var mu sync.Mutex
	var failed atomic.Bool      // a call returned an error
	winner := make([]int, keys) // 1 + the worker that acquired it
	acquired := make([]int, keys)
	var lost []string // commits of acquired keys that were not OK
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			order := rand.New(rand.NewPCG(uint64(w), 9)).Perm(keys)
			for lo := 0; lo < keys; lo += batch {
				ask := make([]tier.Request, 0, batch)
				for _, i := range order[lo : lo+batch] {
					r := reqs[i]
					r.Key = bytes.Clone(r.Key)
					r.Token, r.Digest = tokens[w], tier.Digest{byte(w + 1)}
					ask = append(ask, r)
				}
				idx := order[lo : lo+batch]
				out := poisonAnswers(len(ask))
				if err := h.x.Claim(h.ctx, ask, long, out); err != nil {
					failed.Store(true)
					h.errorf("worker %d: Claim: %v", w, err)
					return
				}
				var mine []tier.Request
				mu.Lock()
				for q, a := range out {
					if i := idx[q]; h.judgeConcurrent(w, workers, ask[q], a) {
						acquired[i]++
						winner[i] = w + 1
						mine = append(mine, ask[q])
					}
				}
				mu.Unlock()
				if h.engine() {
					mine = ask
				}
				if len(mine) == 0 {
					continue
				}
				st := poisonStatuses(len(mine))
				if err := h.x.Commit(h.ctx, base, mine, st); err != nil {
					failed.Store(true)
					h.errorf("worker %d: Commit: %v", w, err)
					return
				}
				mu.Lock()
				for q, s := range st {
					if s != tier.OK {
						lost = append(lost, fmt.Sprintf("worker %d: Commit of %s = %v", w, name(mine[q]), s))
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if failed.Load() {
		return
	}
	if !h.engine() {
		for i, n := range acquired {
			if n != 1 {
				h.errorf("%s: acquired %d times by concurrent claims, want exactly once (\"the caller's token now holds the key\")", name(reqs[i]), n)
			}
		}
	}
	if len(lost) > 0 {
		h.errorf("%d commits by the token that acquired (engine: wrote) the key were not OK, want ok; the first: %s", len(lost), lost[0])
	}
	if h.t.Failed() {
		return
	}
	final := h.claim(long, again(h, reqs)...)
	for i, a := range final {
		what := "Claim after the concurrent batches of " + name(reqs[i])
		if h.engine() {
			if h.wantStatus(what, a, tier.Committed, "every worker committed it") && (a.Digest[0] == 0 || int(a.Digest[0]) > workers || a.Digest[1] != 0) {
				h.errorf("%s: digest %x, which no commit wrote", what, a.Digest)
			}
			continue
		}
		if h.wantStatus(what, a, tier.Committed, "its one owner committed it") && a.Token != tokens[winner[i]-1] {
			h.errorf("%s: committed by token %x, want the winner's %x", what, a.Token, tokens[winner[i]-1])
		}
	}
}

// judgeConcurrent checks worker w's answer a to its concurrent claim r (one
// of workers) and reports whether it acquired the key.
func (h *harness) judgeConcurrent(w, workers int, r tier.Request, a tier.Answer) (acquired bool) {
	switch {
	case h.engine() && a.Status != tier.Absent && a.Status != tier.Committed:
		h.errorf("worker %d: concurrent Claim of %s = %v, want absent or committed", w, name(r), a.Status)
	case h.engine() && a.Status == tier.Committed && (a.Digest[0] == 0 || int(a.Digest[0]) > workers):
		h.errorf("worker %d: concurrent Claim of %s = committed with digest %x, which no commit wrote", w, name(r), a.Digest)
	case !h.engine() && a.Status == tier.Acquired:
		return true
	case !h.engine() && a.Status != tier.Held && a.Status != tier.Committed:
		h.errorf("worker %d: concurrent Claim of %s = %v, want held or committed when not acquired", w, name(r), a.Status)
	case !h.engine() && a.Status == tier.Committed && a.Token == r.Token:
		h.errorf("worker %d: concurrent Claim of %s = committed by its own token, which did not acquire it", w, name(r))
	}
	return false
}

// checkDurable: commits are kept "durably as configured", and so are the
// attempt counts an engine tier writes ("so that every restart sees the
// count") and the claims a store tier holds: a tier closed and opened
// again (Options.Reopen) answers as before.
func checkDurable(h *harness) {
	c := h.req("", "durable-commit")
	c.Digest = tier.Digest{0xd, 0x0e}
	if h.in.keeps {
		c.Result, c.At = []byte("durable result"), 12345
	}
	h.put(base+1, c)
	counted := h.req("", "durable-count")
	held := h.req("", "durable-held")
	if h.engine() {
		counted.Attempts = 4
		h.release(base+2, false, counted)
	} else {
		h.hold(long, held)
		if h.o.MaxAttempts > 0 {
			h.hold(long, counted)
			h.release(base, false, counted)
		}
	}
	var writes []tier.Write
	if cw, ok := h.x.(tier.CommitWriter); ok {
		writes = []tier.Write{{Key: []byte("durable/w"), Value: []byte("v")}}
		if err := cw.CommitWith(h.ctx, base+1, nil, writes, []tier.Status{}); err != nil {
			h.t.Fatalf("CommitWith of a write alone: %v", err)
		}
	}
	h.reopen()
	h.wantCommitted("Claim after a reopen of "+name(c), h.claim1(h.as(c), long), c, base+1)
	switch {
	case h.engine():
		a := h.claim1(counted, long)
		if h.wantStatus("Claim after a reopen of "+name(counted), a, tier.Released, "Release wrote the count durably") && (a.Attempts != 4 || a.Partition != base+2) {
			h.errorf("after a reopen: %d attempts in partition %d, want 4 in %d", a.Attempts, a.Partition, base+2)
		}
	default:
		h.wantStatus("Claim by another token after a reopen of "+name(held), h.claim1(h.as(held), long), tier.Held, "the claim lives in the store")
		h.wantAll("Commit after a reopen by the token that claimed before it", []tier.Request{held}, h.commit(base, held), tier.OK)
		if h.o.MaxAttempts > 0 {
			a := h.claim1(h.as(counted), long)
			if h.wantStatus("Claim after a reopen of the released "+name(counted), a, tier.Acquired, "a released key is free") && a.Attempts != 1 {
				h.errorf("after a reopen: acquired carrying %d attempts, want the 1 counted before", a.Attempts)
			}
		}
	}
	if writes != nil {
		var got []string
		err := h.x.(tier.CommitWriter).ScanWrites([]byte("durable/"), func(k, v []byte) error {
			got = append(got, string(k)+"="+string(v))
			return nil
		})
		if err != nil || len(got) != 1 || got[0] != "durable/w=v" {
			h.errorf("ScanWrites after a reopen = %q, %v; want [durable/w=v]", got, err)
		}
	}
}
