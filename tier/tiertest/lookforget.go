package tiertest

import (
	"fmt"
	"time"

	"github.com/tierdedup/tierdedup/tier"
)

// lookerChecks: "Lookup answers each key without changing anything:
// Absent, Held (a live claim), Committed (with Digest, Result and At),
// Released (an attempt count, or a claim whose lease ended, counted) or
// Poisoned."
func lookerChecks() []check {
	look := implements("Looker", func(in *info) bool { return in.looker })
	return []check{
		{"lookup-answers", look, checkLookupAnswers},
		{"lookup-changes-nothing", look, checkLookupChangesNothing},
		{"lookup-counts", both(look, counting), checkLookupCounts},
	}
}

func checkLookupAnswers(h *harness) {
	fresh, held, committed := h.req("", "look-fresh"), h.req("", "look-held"), h.req("", "look-committed")
	committed.Digest = tier.Digest{0x10}
	if h.in.keeps {
		committed.Result, committed.At = []byte("looked"), 99
	}
	h.hold(long, held)
	h.put(base, committed)
	reqs := []tier.Request{fresh, held, committed}
	out := h.lookup(again(h, reqs)...)
	h.wantStatus("Lookup of a key never written", out[0], tier.Absent, "no record")
	h.wantStatus("Lookup of a claimed key", out[1], tier.Held, "\"Held (a live claim)\"")
	h.wantCommitted("Lookup of a committed key", out[2], committed, base)
}

func checkLookupChangesNothing(h *harness) {
	fresh, held, committed, released := h.req("", "unchanged-fresh"), h.req("", "unchanged-held"), h.req("", "unchanged-committed"), h.req("", "unchanged-released")
	committed.Digest = tier.Digest{0x11}
	h.hold(long, held, released)
	h.put(base, committed)
	h.release(base, false, released)
	reqs := []tier.Request{fresh, held, committed, released}
	first := h.lookup(reqs...)
	second := h.lookup(again(h, reqs)...)
	for i := range first {
		if first[i].Status != second[i].Status || first[i].Attempts != second[i].Attempts {
			h.errorf("Lookup of %s = %v (%d attempts), then %v (%d): a Lookup changed it", name(reqs[i]), first[i].Status, first[i].Attempts, second[i].Status, second[i].Attempts)
		}
	}
	h.wantNew("Claim after Lookups of a key never written", h.as(fresh), "Lookup claims nothing")
	h.wantAll("Commit by the holder after Lookups, its own included", []tier.Request{held}, h.commit(base, held), tier.OK)
	h.wantCommitted("Claim after Lookups of a committed key", h.claim1(h.as(committed), long), committed, base)
	a := h.wantFree("Claim after Lookups of a released key", h.as(released), "Lookup changes nothing")
	if h.o.MaxAttempts > 0 && a.Attempts != 1 {
		h.errorf("Claim after one release and two Lookups carries %d attempts, want 1", a.Attempts)
	}
}

// checkLookupCounts (Options.MaxAttempts): a released key answers
// Released with its count, a claim whose lease ended Released with it
// counted (and the count is not taken twice by two Lookups), and a
// poisoned key Poisoned.
func checkLookupCounts(h *harness) {
	released, lapsed, poisoned := h.req("", "look-released"), h.req("", "look-lapsed"), h.req("", "look-poisoned")
	h.hold(long, released)
	h.release(base, false, released)
	h.hold(short, lapsed)
	for i := 0; i < h.o.MaxAttempts; i++ {
		r := h.as(poisoned)
		h.hold(long, r)
		h.release(base, false, r)
	}
	time.Sleep(wait)
	reqs := []tier.Request{released, lapsed, poisoned}
	for round := 0; round < 2; round++ {
		out := h.lookup(again(h, reqs)...)
		if h.wantStatus("Lookup of a key released once", out[0], tier.Released, "\"Released (an attempt count …)\"") && out[0].Attempts != 1 {
			h.errorf("Lookup of a key released once: %d attempts, want 1", out[0].Attempts)
		}
		if h.wantStatus(fmt.Sprintf("Lookup %d of a claim whose lease ended", round+1), out[1], tier.Released, "\"or a claim whose lease ended, counted\"") && out[1].Attempts != 1 {
			h.errorf("Lookup %d of a claim whose lease ended: %d attempts, want 1", round+1, out[1].Attempts)
		}
		if h.wantStatus("Lookup of a poisoned key", out[2], tier.Poisoned, "MaxAttempts releases") && out[2].Attempts != uint16(h.o.MaxAttempts) {
			h.errorf("Lookup of a poisoned key: %d attempts, want %d", out[2].Attempts, h.o.MaxAttempts)
		}
	}
	if a := h.claim1(h.as(lapsed), long); h.wantStatus("Claim after Lookups of a lapsed claim", a, tier.Acquired, "its lease ended") && a.Attempts != 1 {
		h.errorf("Claim after a lapsed lease and two Lookups carries %d attempts, want 1", a.Attempts)
	}
}

// forgetterChecks: "Forget removes every record of each key (every
// partition reqs[i].Oldest and Mask name, in a partitioned tier) unless a
// live claim holds it, atomically per key, and answers what it found, as
// Lookup does: Held keys are left as they are", "so that the next claim of
// it is New".
func forgetterChecks() []check {
	f := implements("Forgetter", func(in *info) bool { return in.forgetter })
	return []check{
		{"forget-removes", f, checkForgetRemoves},
		{"forget-leaves-held", both(f, inStore), checkForgetLeavesHeld},
		{"forget-counts", f, checkForgetCounts},
		{"forget-every-partition", both(f, partitioned), checkForgetEveryPartition},
	}
}

func checkForgetRemoves(h *harness) {
	committed, fresh, kept := h.req("", "forgotten"), h.req("", "forget-fresh"), h.req("", "forget-neighbour")
	committed.Digest, kept.Digest = tier.Digest{0xf0}, tier.Digest{0xf1}
	h.put(base+1, committed, kept)
	out := h.forget(committed, fresh)
	h.wantCommitted("Forget of a committed key (\"answers what it found\")", out[0], committed, base+1)
	h.wantStatus("Forget of a key never written", out[1], tier.Absent, "nothing found")
	h.wantNew("Claim after Forget of a committed key", h.as(committed), "\"so that the next claim of it is New\"")
	h.wantNew("Claim after Forget of a key never written", h.as(fresh), "nothing to remove")
	h.wantCommitted("Claim of a key Forget was not asked about", h.claim1(h.as(kept), long), kept, base+1)
	if h.engine() {
		return
	}
	out = h.forget(h.as(committed)) // now held by the claim above
	h.wantStatus("Forget of a key claimed after its commit was forgotten", out[0], tier.Held, "a live claim")
}

func checkForgetLeavesHeld(h *harness) {
	a := h.req("", "forget-held")
	h.hold(long, a)
	out := h.forget(h.as(a))
	h.wantStatus("Forget of a held key", out[0], tier.Held, "\"Held keys are left as they are\"")
	h.wantStatus("Claim by another token after Forget of a held key", h.claim1(h.as(a), long), tier.Held, "Held keys are left as they are")
	a.Digest = tier.Digest{0xf2}
	h.wantAll("Commit by the holder after Forget of its key", []tier.Request{a}, h.commit(base, a), tier.OK)
	h.wantCommitted("Claim after the holder's commit", h.claim1(h.as(a), long), a, base)
}

// checkForgetCounts: Forget removes "a key's committed record or attempt
// count, so that the next claim of it is New": an engine tier's count; a
// store tier's count (Options.MaxAttempts), answered as found.
func checkForgetCounts(h *harness) {
	r := h.req("", "forget-count")
	if h.engine() {
		r.Attempts = 3
		h.release(base+2, false, r)
	} else {
		if h.o.MaxAttempts == 0 {
			h.hold(long, r)
			h.release(base, false, r)
			out := h.forget(h.as(r))
			if out[0].Status != tier.Absent && out[0].Status != tier.Released {
				h.errorf("Forget of a released key, nothing counted = %v, want absent or released", out[0].Status)
			}
			h.wantNew("Claim after Forget of a released key", h.as(r), "\"so that the next claim of it is New\"")
			return
		}
		for i := 0; i < h.o.MaxAttempts; i++ {
			x := h.as(r)
			h.hold(long, x)
			h.release(base, false, x)
		}
	}
	out := h.forget(h.as(r))
	switch {
	case h.engine():
		if h.wantStatus("Forget of a key with a count", out[0], tier.Released, "answers what it found") && (out[0].Attempts != 3 || out[0].Partition != base+2) {
			h.errorf("Forget found %d attempts in partition %d, want 3 in %d", out[0].Attempts, out[0].Partition, base+2)
		}
	default:
		if h.wantStatus("Forget of a poisoned key", out[0], tier.Poisoned, "answers what it found, as Lookup does") && out[0].Attempts != uint16(h.o.MaxAttempts) {
			h.errorf("Forget found %d attempts, want %d", out[0].Attempts, h.o.MaxAttempts)
		}
	}
	h.wantNew("Claim after Forget of a key's count", h.as(r), "\"so that the next claim of it is New\"")
}

func checkForgetEveryPartition(h *harness) {
	r := h.req("", "forget-partitions")
	r.Attempts = 2
	h.release(base+1, false, r)
	r.Digest = tier.Digest{0xf3}
	h.commit(base+4, r)
	out := h.forget(r)
	if s := out[0].Status; s != tier.Committed && s != tier.Released {
		h.errorf("Forget of a key with a count and a commit in two partitions = %v, want what it found: committed or released", s)
	}
	h.wantNew("Claim after Forget of a key with records in two partitions", r, "\"every partition reqs[i].Oldest and Mask name\"")
}
