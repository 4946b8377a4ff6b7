package tiertest

import (
	"fmt"
	"time"

	"github.com/tierdedup/tierdedup/tier"
)

// advancerChecks: "Advance claims each key for reqs[i].Token and lease
// when reqs[i].Digest, a version, is greater than the version stored
// (committed, or kept by a claim that replaced it): Acquired, with Digest
// the version it replaces (zero if none). Otherwise it changes nothing
// and answers Committed with Digest the stored version, or Held while
// another live claim holds the key. Versions compare as their Digest's
// bytes." Versions are written as the engine writes them: 16 hex digits.
func advancerChecks() []check {
	adv := implements("Advancer", func(in *info) bool { return in.advancer })
	return []check{
		{"advance-higher-only", adv, checkAdvanceHigherOnly},
		{"advance-release-restores", adv, checkAdvanceReleaseRestores},
		{"advance-lapsed-claim-keeps-version", adv, checkAdvanceLapsedKeeps},
	}
}

func (h *harness) ver(key string, v uint64) tier.Request {
	r := h.req("versions", key)
	r.Digest, r.Versioned = version(v), true
	return r
}

func (h *harness) wantAdvance(what string, a tier.Answer, st tier.Status, v uint64) {
	h.t.Helper()
	want := tier.Digest{}
	if v != 0 {
		want = version(v)
	}
	if h.wantStatus(what, a, st, "Advance") && a.Digest != want {
		h.errorf("%s: Digest %q, want %q", what, a.Digest[:], want[:])
	}
}

func checkAdvanceHigherOnly(h *harness) {
	a := h.ver("entity", 5)
	h.wantAdvance("Advance of an entity with no version", h.advance(long, a)[0], tier.Acquired, 0)
	h.wantAdvance("Advance by another token while the first holds it", h.advance(long, h.ver("entity", 9))[0], tier.Held, 0)
	h.wantAll("Commit of version 5", []tier.Request{a}, h.commit(base, a), tier.OK)
	h.wantAdvance("Advance to a lower version", h.advance(long, h.ver("entity", 3))[0], tier.Committed, 5)
	h.wantAdvance("Advance to the stored version", h.advance(long, h.ver("entity", 5))[0], tier.Committed, 5)
	h.wantAdvance("Advance to a lower version, again (nothing changed)", h.advance(long, h.ver("entity", 4))[0], tier.Committed, 5)
	b := h.ver("entity", 0x10) // "0000000000000010" > "0000000000000005" byte by byte
	h.wantAdvance("Advance to a higher version", h.advance(long, b)[0], tier.Acquired, 5)
	h.wantAll("Commit of the higher version", []tier.Request{b}, h.commit(base, b), tier.OK)
	h.wantAdvance("Advance below the new version", h.advance(long, h.ver("entity", 0xf))[0], tier.Committed, 0x10)
	h.wantAdvance("Advance of another entity", h.advance(long, h.ver("other", 1))[0], tier.Acquired, 0)
}

func checkAdvanceReleaseRestores(h *harness) {
	a := h.ver("restored", 5)
	h.advance(long, a)
	h.commit(base, a)
	b := h.ver("restored", 7)
	h.wantAdvance("Advance to a higher version", h.advance(long, b)[0], tier.Acquired, 5)
	h.wantAll("Release of the version claim", []tier.Request{b}, h.release(base, false, b), tier.OK)
	h.wantAdvance("Advance to the replaced version after the release", h.advance(long, h.ver("restored", 5))[0], tier.Committed, 5)
	h.wantAdvance("Advance above it", h.advance(long, h.ver("restored", 6))[0], tier.Acquired, 5)

	fresh := h.ver("restored-none", 3)
	h.advance(long, fresh)
	h.wantAll("Release of a version claim that replaced none", []tier.Request{fresh}, h.release(base, false, fresh), tier.OK)
	h.wantAdvance("Advance after it", h.advance(long, h.ver("restored-none", 1))[0], tier.Acquired, 0)
}

func checkAdvanceLapsedKeeps(h *harness) {
	a := h.ver("lapsed-version", 5)
	h.advance(long, a)
	h.commit(base, a)
	h.wantAdvance("Advance to a higher version, short lease", h.advance(short, h.ver("lapsed-version", 8))[0], tier.Acquired, 5)
	time.Sleep(wait)
	h.wantAdvance("Advance below the stored version after the claim lapsed", h.advance(long, h.ver("lapsed-version", 4))[0], tier.Committed, 5)
	h.wantAdvance("Advance above it", h.advance(long, h.ver("lapsed-version", 6))[0], tier.Acquired, 5)
}

// markerChecks: "Mark is Claim followed, for every key it acquires, by
// Commit: the answer Acquired means the key is now committed by
// reqs[i].Token with reqs[i].Digest. Other answers and errors are
// Claim's."
func markerChecks() []check {
	m := implements("Marker", func(in *info) bool { return in.marker })
	return []check{
		{"mark-commits", m, checkMarkCommits},
		{"mark-poisoned", both(m, both(inStore, counting)), checkMarkPoisoned},
		{"mark-adopts", both(m, inStore), checkMarkAdopts},
		{"mark-stable", implements("PartialMarker", func(in *info) bool { return in.partial }), checkCanMarkStable},
		{"unmark-undoes", implements("Unmarker", func(in *info) bool { return in.unmarker && in.canMark }), checkUnmarkUndoes},
		{"unmark-fences", implements("Unmarker", func(in *info) bool { return in.unmarker && in.canMark }), checkUnmarkFences},
		{"unmark-spares-others", implements("Unmarker", func(in *info) bool { return in.unmarker }), checkUnmarkSparesOthers},
	}
}

// checkCanMarkStable: "the engine marks through Mark only while CanMark":
// the engine reads it once, at Open, so it is a property of the
// configuration, the same every time it is asked.
func checkCanMarkStable(h *harness) {
	pm := h.x.(tier.PartialMarker)
	first := pm.CanMark()
	for i := 0; i < 3; i++ {
		h.mark(h.req("", fmt.Sprintf("can-mark-%d", i)))
		if pm.CanMark() != first {
			h.errorf("CanMark changed from %v to %v between calls: the engine reads it once", first, pm.CanMark())
			return
		}
	}
}

// checkUnmarkUndoes: "Unmark undoes each request's mark if the tier
// applied it (a commit carrying reqs[i].Token) ... out[i] is OK when a
// mark was undone": the key is free again, another caller acquires it.
func checkUnmarkUndoes(h *harness) {
	r := h.req("", "unmark-applied")
	r.Digest = tier.Digest{0x5a}
	if !h.wantStatus("Mark of a fresh key", h.mark(r)[0], tier.Acquired, "Claim's answer") {
		return
	}
	h.wantAll("Unmark of an applied mark", []tier.Request{r}, h.unmark(r), tier.OK)
	h.wantStatus("Claim after the mark was undone", h.claim1(h.as(r), long), tier.Acquired, "the key is free again")
}

// checkUnmarkFences: Unmark of a mark the tier has not applied undoes
// nothing (not OK), and what it leaves to keep that mark out ("keeps that
// mark from being applied for fence") commits nothing and holds nothing
// against other callers: another caller's claim acquires the key. (The
// mark it keeps out is a copy already sent, a paused server's input or a
// client's retry of the failed call's pipeline, which no call through this
// API can stand for: every call has a token of its own. The tiers' nemesis
// runs send such copies.)
func checkUnmarkFences(h *harness) {
	r := h.req("", "unmark-late")
	r.Digest = tier.Digest{0x5b}
	for _, st := range h.unmark(r) {
		if st == tier.OK {
			h.errorf("Unmark of a mark never applied = OK, want not OK (nothing was undone)")
		}
	}
	other := h.req("", "unmark-late")
	h.wantStatus("Claim by another caller after an Unmark's fence", h.claim1(other, long), tier.Acquired, "the fence holds nothing against other callers")
}

// checkUnmarkSparesOthers: Unmark matches its own token only: another
// caller's commit of the key stays, and Unmark is not OK.
func checkUnmarkSparesOthers(h *harness) {
	other := h.req("", "unmark-others")
	other.Digest = tier.Digest{0x5c}
	h.put(base, other)
	mine := h.as(other)
	for _, st := range h.unmark(mine) {
		if st == tier.OK {
			h.errorf("Unmark of another token's commit = OK, want not OK")
		}
	}
	h.wantCommitted("Claim after Unmark of another token", h.claim1(h.as(other), long), other, base)
}

func checkMarkCommits(h *harness) {
	fresh, held, committed := h.req("", "mark-fresh"), h.req("", "mark-held"), h.req("", "mark-committed")
	fresh.Digest, committed.Digest = tier.Digest{0x3a}, tier.Digest{0x3b}
	if !h.engine() {
		h.hold(long, held)
	}
	h.put(base, committed)
	m := again(h, []tier.Request{fresh, held, committed})
	m[0].Digest = fresh.Digest
	out := h.mark(m...)
	if h.wantStatus("Mark of a fresh key", out[0], tier.Acquired, "Claim's answer") {
		h.wantCommitted("Claim after Mark acquired it", h.claim1(h.as(fresh), long), m[0], base)
	}
	if !h.engine() {
		h.wantStatus("Mark of a held key", out[1], tier.Held, "Claim's answer")
		h.wantAll("Commit by the holder after another's Mark", []tier.Request{held}, h.commit(base, held), tier.OK)
	}
	h.wantCommitted("Mark of a committed key", out[2], committed, base)
	h.wantCommitted("Claim after a Mark of a committed key", h.claim1(h.as(committed), long), committed, base)
}

// checkMarkAdopts: a Mark retried over the caller's earlier call's claim
// or commit (Request.Earlier) adopts it, "replaced by Mark's commit and
// Acquired"; a late give-back of the earlier call then finds nothing.
func checkMarkAdopts(h *harness) {
	p := byte(h.tokens)
	h.tokens++
	held, done := h.req("", "mark-adopt-claim"), h.req("", "mark-adopt-commit")
	held.Token, done.Token, done.Digest = procToken(p, 10), procToken(p, 11), tier.Digest{0x11}
	h.hold(long, held)
	h.put(base, done)
	r1, r2 := retry(held, procToken(p, 14), procToken(p, 10)), retry(done, procToken(p, 15), procToken(p, 10))
	r1.Digest, r2.Digest = tier.Digest{0x14}, tier.Digest{0x15}
	out := h.mark(r1, r2)
	h.wantStatus("Mark retried over the caller's earlier claim", out[0], tier.Acquired, "adopted, committed by the Mark")
	h.wantStatus("Mark retried over the caller's earlier commit", out[1], tier.Acquired, "adopted, replaced by the Mark's commit")
	h.wantAll("A late give-back of the earlier calls", []tier.Request{held, done}, h.release(base, true, held, done), tier.Lost)
	h.wantCommitted("Claim after the retried Mark of a claimed key", h.claim1(h.as(held), long), r1, base)
	h.wantCommitted("Claim after the retried Mark of a committed key", h.claim1(h.as(done), long), r2, base)
}

func checkMarkPoisoned(h *harness) {
	k := h.req("", "mark-poisoned")
	for i := 0; i < h.o.MaxAttempts; i++ {
		r := h.as(k)
		h.hold(long, r)
		h.release(base, false, r)
	}
	m := h.as(k)
	m.Digest = tier.Digest{1}
	h.wantStatus("Mark of a poisoned key", h.mark(m)[0], tier.Poisoned, "Claim's answer")
	h.wantStatus("Claim after a Mark of a poisoned key", h.claim1(h.as(k), long), tier.Poisoned, "Mark committed nothing")
}
