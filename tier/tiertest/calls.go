package tiertest

import (
	"fmt"
	"time"

	"github.com/tierdedup/tierdedup/tier"
)

// claim calls Claim.
func (h *harness) claim(lease time.Duration, reqs ...tier.Request) []tier.Answer {
	h.t.Helper()
	out := poisonAnswers(len(reqs))
	if err := h.x.Claim(h.ctx, reqs, lease, out); err != nil {
		h.t.Fatalf("Claim of %d keys: %v", len(reqs), err)
	}
	allowed := storeClaim
	if h.engine() {
		allowed = engineClaim
	}
	h.checkAnswers("Claim", reqs, out, allowed)
	return out
}

func (h *harness) claim1(r tier.Request, lease time.Duration) tier.Answer {
	h.t.Helper()
	return h.claim(lease, r)[0]
}

// commit calls Commit in partition p.
func (h *harness) commit(p int64, reqs ...tier.Request) []tier.Status {
	h.t.Helper()
	out := poisonStatuses(len(reqs))
	if err := h.x.Commit(h.ctx, p, reqs, out); err != nil {
		h.t.Fatalf("Commit of %d keys: %v", len(reqs), err)
	}
	h.checkStatuses("Commit", reqs, out)
	return out
}

// release calls Release in partition p.
func (h *harness) release(p int64, giveBack bool, reqs ...tier.Request) []tier.Status {
	h.t.Helper()
	out := poisonStatuses(len(reqs))
	if err := h.x.Release(h.ctx, p, reqs, giveBack, out); err != nil {
		h.t.Fatalf("Release of %d keys (giveBack %v): %v", len(reqs), giveBack, err)
	}
	h.checkStatuses("Release", reqs, out)
	return out
}

// put makes every key committed in partition p: claimed by its token and
// committed (claims in the store), or committed (claims in the engine).
func (h *harness) put(p int64, reqs ...tier.Request) {
	h.t.Helper()
	if !h.engine() {
		for i, a := range h.claim(long, reqs...) {
			if a.Status != tier.Acquired {
				h.t.Fatalf("setup: Claim of the fresh key %s = %v, want acquired", name(reqs[i]), a.Status)
			}
		}
	}
	for i, s := range h.commit(p, reqs...) {
		if s != tier.OK {
			h.t.Fatalf("setup: Commit of %s by its claim's token = %v, want ok", name(reqs[i]), s)
		}
	}
}

// hold claims every key for its token (claims in the store only).
func (h *harness) hold(lease time.Duration, reqs ...tier.Request) {
	h.t.Helper()
	for i, a := range h.claim(lease, reqs...) {
		if a.Status != tier.Acquired {
			h.t.Fatalf("setup: Claim of %s by a new token = %v, want acquired", name(reqs[i]), a.Status)
		}
	}
}

// lookup calls Lookup (Looker).
func (h *harness) lookup(reqs ...tier.Request) []tier.Answer {
	h.t.Helper()
	out := poisonAnswers(len(reqs))
	if err := h.x.(tier.Looker).Lookup(h.ctx, reqs, out); err != nil {
		h.t.Fatalf("Lookup of %d keys: %v", len(reqs), err)
	}
	h.checkAnswers("Lookup", reqs, out, looked)
	return out
}

// forget calls Forget (Forgetter).
func (h *harness) forget(reqs ...tier.Request) []tier.Answer {
	h.t.Helper()
	out := poisonAnswers(len(reqs))
	if err := h.x.(tier.Forgetter).Forget(h.ctx, reqs, out); err != nil {
		h.t.Fatalf("Forget of %d keys: %v", len(reqs), err)
	}
	allowed := looked
	if h.engine() {
		allowed = engineClaim
	}
	h.checkAnswers("Forget", reqs, out, allowed)
	return out
}

// extend calls Extend (Extender).
func (h *harness) extend(lease time.Duration, reqs ...tier.Request) []tier.Status {
	h.t.Helper()
	out := poisonStatuses(len(reqs))
	if err := h.x.(tier.Extender).Extend(h.ctx, reqs, lease, out); err != nil {
		h.t.Fatalf("Extend of %d keys: %v", len(reqs), err)
	}
	h.checkStatuses("Extend", reqs, out)
	return out
}

// advance calls Advance (Advancer).
func (h *harness) advance(lease time.Duration, reqs ...tier.Request) []tier.Answer {
	h.t.Helper()
	out := poisonAnswers(len(reqs))
	if err := h.x.(tier.Advancer).Advance(h.ctx, reqs, lease, out); err != nil {
		h.t.Fatalf("Advance of %d keys: %v", len(reqs), err)
	}
	// Acquired carries the version replaced: only the poison of the other
	// fields is checked by status.
	h.checkAnswers("Advance", reqs, out, advanced)
	return out
}

// mark calls Mark (Marker).
func (h *harness) mark(reqs ...tier.Request) []tier.Answer {
	h.t.Helper()
	out := poisonAnswers(len(reqs))
	if err := h.x.(tier.Marker).Mark(h.ctx, reqs, out); err != nil {
		h.t.Fatalf("Mark of %d keys: %v", len(reqs), err)
	}
	h.checkAnswers("Mark", reqs, out, storeClaim)
	return out
}

// unmark calls Unmark (Unmarker) with a fence of a lease.
func (h *harness) unmark(reqs ...tier.Request) []tier.Status {
	h.t.Helper()
	out := make([]tier.Status, len(reqs))
	for i := range out {
		out[i] = poisonStatus
	}
	if err := h.x.(tier.Unmarker).Unmark(h.ctx, reqs, long, out); err != nil {
		h.t.Fatalf("Unmark of %d keys: %v", len(reqs), err)
	}
	for i, st := range out {
		if st == poisonStatus {
			h.errorf("Unmark left out[%d] unset", i)
		}
	}
	return out
}

// scan calls Scan (Scanner) and returns what it listed, one
// "partition ns key" string per record.
func (h *harness) scan(from, to int64) map[string]int {
	h.t.Helper()
	got := map[string]int{}
	err := h.x.(tier.Scanner).Scan(h.ctx, from, to, func(p int64, ns, key []byte) error {
		got[record(p, string(ns), key)]++
		return nil
	})
	if err != nil {
		h.t.Fatalf("Scan [%d, %d): %v", from, to, err)
	}
	return got
}

func record(p int64, ns string, key []byte) string { return fmt.Sprintf("%d %q %q", p, ns, key) }

// version is version v as the engine stores it in a Digest (Advance): 16
// lowercase hex digits, so versions compare as their bytes.
func version(v uint64) tier.Digest {
	var d tier.Digest
	copy(d[:], fmt.Sprintf("%016x", v))
	return d
}
