package tiertest

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/tierdedup/tierdedup/tier"
)

// storeChecks are the promises of a tier whose claims live in it: "a
// claim must be taken in it, atomically, and every commit and release is
// fenced by the claim's owner token there. Claim acquires: Acquired (the
// caller's token now holds the key, for lease), Held, Committed (with the
// committer's Token) or Poisoned; Commit and Release answer OK or Lost
// per key."
func storeChecks() []check {
	return []check{
		{"claim-holds", inStore, checkClaimHolds},
		{"fenced-commit", inStore, checkFencedCommit},
		{"fenced-release", inStore, checkFencedRelease},
		{"retried-commit", inStore, checkRetriedCommit},
		{"give-back", inStore, checkGiveBack},
		{"retry-adopts", inStore, checkRetryAdopts},
		{"lease-ends", inStore, checkLeaseEnds},
		{"attempts", both(inStore, counting), checkAttempts},
	}
}

// checkClaimHolds: Acquired means "the caller's token now holds the key":
// another token's claim is Held (Status: "another claim with an unexpired
// lease holds the key"), and the same token's claim again is Acquired
// (Acquired: the key was "held by this very token").
func checkClaimHolds(h *harness) {
	a := h.req("", "held")
	h.hold(long, a)
	for i := 0; i < 2; i++ {
		b := h.as(a)
		if got := h.claim1(b, long); h.wantStatus("Claim by another token of a held key", got, tier.Held, "another claim holds it") && (got.Digest != (tier.Digest{}) || got.Token != (tier.Token{})) {
			h.errorf("Held answer carries a digest %x or token %x", got.Digest, got.Token)
		}
	}
	h.wantStatus("Claim by the holder's own token again", h.claim1(a, long), tier.Acquired, "\"held by this very token\"")
	h.wantAll("Commit by the holder", []tier.Request{a}, h.commit(base, a), tier.OK)
}

// checkFencedCommit: Commit makes a key committed "when reqs[i].Token
// still holds it (ClaimsInStore; out[i] Lost otherwise)": a commit by a
// token that does not hold the key is Lost and changes nothing (the
// holder still holds it and commits; a free key stays free).
func checkFencedCommit(h *harness) {
	a := h.req("", "fenced")
	a.Digest = tier.Digest{0xa}
	h.hold(long, a)
	b := h.as(a)
	b.Digest = tier.Digest{0xb}
	h.wantAll("Commit by a token that does not hold the key", []tier.Request{b}, h.commit(base, b), tier.Lost)
	h.wantStatus("Claim by a third token after a Lost commit", h.claim1(h.as(a), long), tier.Held, "a Lost commit changes nothing")
	h.wantAll("Commit by the holder after another's Lost commit", []tier.Request{a}, h.commit(base, a), tier.OK)
	h.wantCommitted("Claim after the holder's commit", h.claim1(h.as(a), long), a, base)
	h.wantAll("Commit by another token of a committed key", []tier.Request{b}, h.commit(base, b), tier.Lost)
	h.wantCommitted("Claim after another token's Lost commit of a committed key", h.claim1(h.as(a), long), a, base)

	free := h.req("", "never-claimed")
	free.Digest = tier.Digest{0xf}
	h.wantAll("Commit of a key no claim holds", []tier.Request{free}, h.commit(base, free), tier.Lost)
	h.wantNew("Claim after a Lost commit of a free key", h.as(free), "a Lost commit changes nothing")
}

// checkFencedRelease: Release "frees each key its token holds (out[i]
// Lost otherwise)": the holder's release is OK and frees the key; a
// release by another token, or a second one by the holder, is Lost and
// changes nothing.
func checkFencedRelease(h *harness) {
	a := h.req("", "released")
	h.hold(long, a)
	b := h.as(a)
	h.wantAll("Release by a token that does not hold the key", []tier.Request{b}, h.release(base, false, b), tier.Lost)
	h.wantStatus("Claim by a third token after a Lost release", h.claim1(h.as(a), long), tier.Held, "a Lost release changes nothing")
	h.wantAll("Release by the holder", []tier.Request{a}, h.release(base, false, a), tier.OK)
	h.wantAll("Release by the holder again", []tier.Request{a}, h.release(base, false, a), tier.Lost)
	c := h.wantFree("Claim after the holder's release", b, "Release frees the key")
	if h.o.MaxAttempts > 0 && c.Attempts != 1 {
		h.errorf("Claim after one release carries %d attempts, want 1 (\"counting an attempt\")", c.Attempts)
	}
	h.wantAll("Release by the former holder of a key another now holds", []tier.Request{a}, h.release(base, false, a), tier.Lost)
	h.wantStatus("Claim by a third token after the former holder's Lost release", h.claim1(h.as(a), long), tier.Held, "a Lost release changes nothing")
}

// checkRetriedCommit: "the engine keeps the claims' tokens so that a retry
// can recognise its own writes": a commit repeated by the token that made
// it answers OK and leaves the commit as it was.
func checkRetriedCommit(h *harness) {
	a := h.req("", "retried")
	a.Digest = tier.Digest{0x4e}
	h.put(base, a)
	h.wantAll("Commit retried by its token", []tier.Request{a}, h.commit(base, a), tier.OK)
	h.wantCommitted("Claim after a retried commit", h.claim1(h.as(a), long), a, base)
}

// checkGiveBack: Release "with giveBack counting none and undoing a
// commit the same token made": a given-back claim frees its key with its
// count unchanged, a given-back commit of the same token is undone (the
// key is free again, its count unchanged), and another token's give-back
// of a commit is Lost and changes nothing.
func checkGiveBack(h *harness) {
	claimed := h.req("", "given-back-claim")
	h.hold(long, claimed)
	h.wantAll("Release with giveBack by the holder", []tier.Request{claimed}, h.release(base, true, claimed), tier.OK)
	h.wantNew("Claim after a give-back", h.as(claimed), "a give-back frees the key and counts none")

	committed := h.req("", "given-back-commit")
	committed.Digest = tier.Digest{0x9b}
	h.put(base, committed)
	h.wantAll("Release with giveBack by the committer", []tier.Request{committed}, h.release(base, true, committed), tier.OK)
	h.wantNew("Claim after the committer's give-back", h.as(committed), "\"undoing a commit the same token made\"")

	other := h.req("", "given-back-by-another")
	other.Digest = tier.Digest{0x9c}
	h.put(base, other)
	stranger := h.as(other)
	h.wantAll("Release with giveBack by a token that did not commit", []tier.Request{stranger}, h.release(base, true, stranger), tier.Lost)
	h.wantCommitted("Claim after another token's Lost give-back", h.claim1(h.as(other), long), other, base)

	if h.o.MaxAttempts == 0 {
		return
	}
	// With a count: one counted release first, then give-backs keep it.
	for _, commit := range []bool{false, true} {
		k := h.req("", fmt.Sprint("given-back-counted-", commit))
		h.hold(long, k)
		h.release(base, false, k)
		k2 := h.as(k)
		if a := h.claim1(k2, long); !h.wantStatus("Claim after one release", a, tier.Acquired, "a released key is free") || a.Attempts != 1 {
			h.t.Fatalf("Claim after one release carries %d attempts, want 1", a.Attempts)
		}
		what := "give-back of a claim"
		if commit {
			what = "give-back of the same token's commit"
			h.wantAll("Commit", []tier.Request{k2}, h.commit(base, k2), tier.OK)
		}
		k2.Attempts = 1 // the count the claim carried ("Attempts ... in a Release with giveBack")
		h.wantAll("Release with giveBack", []tier.Request{k2}, h.release(base, true, k2), tier.OK)
		a := h.claim1(h.as(k), long)
		if h.wantStatus("Claim after a "+what, a, tier.Acquired, "the key is free again") && a.Attempts != 1 {
			h.errorf("Claim after one counted release and a %s carries %d attempts, want 1 (\"with giveBack counting none\")", what, a.Attempts)
		}
	}
}

// procToken is a token of process proc (its first 8 bytes) with counter
// n, as the engine makes them.
func procToken(proc byte, n uint64) tier.Token {
	var t tier.Token
	t[0], t[7] = 0x5e, proc
	binary.BigEndian.PutUint64(t[8:], n)
	return t
}

// retry is r asked again by token with Earlier earlier.
func retry(r tier.Request, token, earlier tier.Token) tier.Request {
	r.Token, r.Earlier = token, earlier
	return r
}

// checkRetryAdopts: "a claim or commit that the tier holds for such a
// token is the caller's own, never acknowledged: Claim and Mark first move
// it to Token (adopt it) … and then answer as if Token had made it", so
// "a late give-back of an earlier call … finds nothing of its own once a
// retry has answered"; a token outside [Earlier, Token) of Token's
// process is not adopted.
func checkRetryAdopts(h *harness) {
	p := byte(h.tokens) // a process of this check's own
	h.tokens++
	held := h.req("", "adopt-claim")
	held.Token = procToken(p, 10)
	h.hold(long, held)
	r := retry(held, procToken(p, 12), procToken(p, 10))
	h.wantStatus("Claim retried over the caller's earlier claim", h.claim1(r, long), tier.Acquired, "\"the caller's own\": adopted")
	h.wantAll("Commit by the earlier call's token after the retry adopted its claim", []tier.Request{held}, h.commit(base, held), tier.Lost)
	h.wantAll("Commit by the retry", []tier.Request{r}, h.commit(base, r), tier.OK)
	h.wantAll("A late give-back of the earlier call", []tier.Request{held}, h.release(base, true, held), tier.Lost)
	h.wantCommitted("Claim after the retry's commit and a late give-back", h.claim1(h.as(held), long), r, base)

	done := h.req("", "adopt-commit")
	done.Token, done.Digest = procToken(p, 20), tier.Digest{0x20}
	h.put(base, done)
	r = retry(done, procToken(p, 23), procToken(p, 19))
	h.wantCommitted("Claim retried over the caller's earlier commit", h.claim1(r, long), r, base)
	h.wantAll("A late give-back of the earlier call", []tier.Request{done}, h.release(base, true, done), tier.Lost)
	h.wantCommitted("Claim after a late give-back of the adopted commit", h.claim1(h.as(done), long), r, base)
	h.wantAll("Give-back by the retry", []tier.Request{r}, h.release(base, true, r), tier.OK)
	h.wantNew("Claim after the retry gave the adopted commit back", h.as(done), "\"undoing a commit the same token made\"")

	for _, c := range []struct {
		what           string
		by, to, earlir tier.Token
	}{
		{"before Earlier", procToken(p, 30), procToken(p, 33), procToken(p, 31)},
		{"of another process", procToken(p+1, 30), procToken(p, 33), procToken(p, 1)},
		{"after the caller's token", procToken(p, 40), procToken(p, 33), procToken(p, 1)},
	} {
		k := h.req("", "adopt-not-"+c.what)
		k.Token, k.Digest = c.by, tier.Digest{0x30}
		h.put(base, k)
		h.wantCommitted("Claim retried over a commit "+c.what, h.claim1(retry(k, c.to, c.earlir), long), k, base)
	}
}

// checkLeaseEnds: Acquired holds the key "for lease": once it ended
// another token acquires it (Expired, counting the lapse as an attempt,
// where attempts are counted: "Expired reports that this claim found
// another's lease ended and counted it as an attempt"), and the old
// token's commit and release are Lost (Lost: "its lease expired, another
// owner took over").
func checkLeaseEnds(h *harness) {
	a := h.req("", "lapsed")
	h.hold(short, a)
	time.Sleep(wait)
	b := h.as(a)
	got := h.claim1(b, long)
	if h.wantStatus("Claim after another's lease ended", got, tier.Acquired, "its lease ended") && h.o.MaxAttempts > 0 && (!got.Expired || got.Attempts != 1) {
		h.errorf("Claim after another's lease ended: expired %v with %d attempts, want expired with 1", got.Expired, got.Attempts)
	}
	h.wantAll("Commit by the token whose lease ended", []tier.Request{a}, h.commit(base, a), tier.Lost)
	h.wantAll("Release by the token whose lease ended", []tier.Request{a}, h.release(base, false, a), tier.Lost)
	h.wantStatus("Claim by a third token", h.claim1(h.as(a), long), tier.Held, "the new owner holds it")
	b.Digest = tier.Digest{0xbb}
	h.wantAll("Commit by the new owner", []tier.Request{b}, h.commit(base, b), tier.OK)
	h.wantCommitted("Claim after the new owner's commit", h.claim1(h.as(a), long), b, base)

	lapsed := h.req("", "lapsed-uncommitted")
	h.hold(short, lapsed)
	time.Sleep(wait)
	lapsed.Digest = tier.Digest{1}
	h.wantAll("Commit after the lease ended, nobody else claiming", []tier.Request{lapsed}, h.commit(base, lapsed), tier.Lost)
	h.wantFree("Claim after a Lost commit of a lapsed claim", h.as(lapsed), "the lapsed claim is not a commit")
}

// checkAttempts (Options.MaxAttempts): Release "counting an attempt",
// carried by the next claim ("Attempts is … an Acquired claim's carried
// count"), until the key is Poisoned: "the key's claims were released (or
// let expire) MaxAttempts times inside the window: no claim was made",
// with "a Poisoned key's reached" count.
func checkAttempts(h *harness) {
	k := h.req("", "poisoned")
	for i := 0; i < h.o.MaxAttempts; i++ {
		r := h.as(k)
		a := h.claim1(r, long)
		if !h.wantStatus(fmt.Sprintf("Claim after %d releases", i), a, tier.Acquired, "below MaxAttempts") {
			return
		}
		if a.Attempts != uint16(i) {
			h.errorf("Claim after %d releases carries %d attempts", i, a.Attempts)
		}
		h.wantAll("Release", []tier.Request{r}, h.release(base, false, r), tier.OK)
	}
	p := h.as(k)
	a := h.claim1(p, long)
	if h.wantStatus(fmt.Sprintf("Claim after %d releases", h.o.MaxAttempts), a, tier.Poisoned, "MaxAttempts releases") && a.Attempts != uint16(h.o.MaxAttempts) {
		h.errorf("Poisoned with %d attempts, want %d", a.Attempts, h.o.MaxAttempts)
	}
	p.Digest = tier.Digest{1}
	h.wantAll("Commit by the token of a Poisoned claim", []tier.Request{p}, h.commit(base, p), tier.Lost)
	h.wantStatus("Claim of a poisoned key, again", h.claim1(h.as(k), long), tier.Poisoned, "\"no claim was made\"")

	// A lease that ends counts as an attempt.
	e := h.req("", "expired-count")
	h.hold(short, e)
	time.Sleep(wait)
	got := h.claim1(h.as(e), long)
	if h.wantStatus("Claim after a lease ended", got, tier.Acquired, "below MaxAttempts") && (!got.Expired || got.Attempts != 1) {
		h.errorf("Claim after a lease ended: expired %v with %d attempts, want expired with 1 (\"or let expire\")", got.Expired, got.Attempts)
	}
}
