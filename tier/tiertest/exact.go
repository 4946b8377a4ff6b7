package tiertest

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/tierdedup/tierdedup/tier"
)

// exactChecks are tier.Exact's promises that hold wherever claims live;
// each branches on the tier's Where where the two differ.
func exactChecks() []check {
	return []check{
		{"claims", always, checkClaims},
		{"fresh-key", always, checkFresh},
		{"commit", always, checkCommit},
		{"batch-order", always, checkBatchOrder},
		{"out-filled", always, checkOutFilled},
		{"keys-not-kept", always, checkKeysNotKept},
		{"namespaces", always, checkNamespaces},
		{"exact-keys", always, checkExactKeys},
		{"concurrent-batches", always, checkConcurrent},
		{"durable", always, checkDurable},
		{"mask", partitioned, checkMask},
		{"request-window", func(in *info) string {
			switch {
			case in.o.Partitioned:
				return "a partitioned tier does not expire keys itself"
			case in.o.IgnoresWindow:
				return "Options.IgnoresWindow"
			}
			return ""
		}, checkRequestWindow},
	}
}

// checkClaims: "Claims says where claims live": one of the two, and the
// same at every call.
func checkClaims(h *harness) {
	w := h.x.Claims()
	if w != tier.ClaimsInEngine && w != tier.ClaimsInStore {
		h.t.Fatalf("Claims() = %v", w)
	}
	if again := h.x.Claims(); again != w {
		h.t.Fatalf("Claims() = %v, then %v", w, again)
	}
}

// checkFresh: a key never written answers Absent (ClaimsInEngine: "the
// tier answers Absent, Committed … or Released") or Acquired
// (ClaimsInStore: "Claim acquires: Acquired (the caller's token now holds
// the key, for lease)"), with nothing of a record: no digest, token,
// result, time, attempts or expiry.
func checkFresh(h *harness) {
	reqs := []tier.Request{h.req("", "fresh-1"), h.req("ns", "fresh-2"), h.req("other", "fresh-3")}
	want := tier.Acquired
	if h.engine() {
		want = tier.Absent
	}
	for i, a := range h.claim(long, reqs...) {
		what := "Claim of the fresh key " + name(reqs[i])
		h.wantStatus(what, a, want, "a key never written")
		if a.Digest != (tier.Digest{}) || a.Token != (tier.Token{}) || a.Result != nil || a.At != 0 || a.Attempts != 0 || a.Expired {
			h.errorf("%s: %s, want no digest, token, result, time, attempts or expiry", what, show(a))
		}
	}
}

// checkCommit: "On success every key answers Committed to later claims":
// with the Digest stored ("Digest is the committed payload digest"), the
// Partition of the commit in a partitioned tier, the committer's Token
// (ClaimsInStore), Result and At (ResultKeeper; At alone in a partitioned
// tier), and a zero Digest and nil Result for a commit of neither. A
// ClaimsInStore commit is made by the claim's token; a claim by that same
// token afterwards answers Committed too, not Acquired: the key is no
// longer held.
func checkCommit(h *harness) {
	plain := h.req("", "plain")
	digest := h.req("", "digest")
	digest.Digest = tier.Digest{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	dated := h.req("", "dated")
	dated.Digest, dated.At = tier.Digest{7}, 1_700_000_000_123_456_789
	reqs := []tier.Request{plain, digest, dated}
	if h.in.keeps {
		result := h.req("", "result")
		result.Digest, result.Result, result.At = tier.Digest{9}, []byte("{\"offset\":42}"), 1_700_000_000_000_000_001
		noDigest := h.req("", "result-no-digest")
		noDigest.Result, noDigest.At = []byte{0, 1, 2, 0xff}, 5
		reqs = append(reqs, result, noDigest)
	}
	h.put(base+1, reqs...)
	for i, a := range h.claim(long, again(h, reqs)...) {
		h.wantCommitted("Claim after the commit of "+name(reqs[i]), a, reqs[i], base+1)
	}
	if !h.engine() {
		for i, a := range h.claim(long, reqs...) {
			h.wantCommitted("Claim by the committer's own token after its commit of "+name(reqs[i]), a, reqs[i], base+1)
		}
	}
}

// again returns reqs asked by new tokens (another claimer of each key).
func again(h *harness, reqs []tier.Request) []tier.Request {
	out := make([]tier.Request, len(reqs))
	for i := range reqs {
		out[i] = h.as(reqs[i])
	}
	return out
}

// checkBatchOrder: "reqs[i] is answered in out[i]": one batch of keys in
// every state, shuffled, each answered at its own index.
func checkBatchOrder(h *harness) {
	const n = 48
	reqs := make([]tier.Request, n)
	var committed, other []tier.Request
	for i := range reqs {
		reqs[i] = h.req(fmt.Sprint("ns", i%3), fmt.Sprintf("order-%02d", i))
		switch i % 4 {
		case 1:
			reqs[i].Digest = tier.Digest{byte(i), 0xd1}
			committed = append(committed, reqs[i])
		case 2:
			other = append(other, reqs[i])
		}
	}
	h.put(base+2, committed...)
	if h.engine() {
		for i := range other {
			other[i].Attempts = uint16(100 + i)
		}
		h.wantAll("Release with an attempt count", other, h.release(base+3, false, other...), tier.OK)
	} else {
		h.hold(long, other...)
	}
	ask := again(h, reqs)
	rand.New(rand.NewPCG(1, 2)).Shuffle(n, func(i, j int) { ask[i], ask[j] = ask[j], ask[i] })
	byKey := map[string]int{}
	for i, r := range reqs {
		byKey[r.NS+"\x00"+string(r.Key)] = i
	}
	for q, a := range h.claim(long, ask...) {
		i := byKey[ask[q].NS+"\x00"+string(ask[q].Key)]
		what := fmt.Sprintf("out[%d] for %s in one shuffled batch", q, name(ask[q]))
		switch i % 4 {
		case 1:
			h.wantCommitted(what, a, reqs[i], base+2)
		case 2:
			if h.engine() {
				if h.wantStatus(what, a, tier.Released, "Release wrote its count") && (a.Attempts != uint16(100+i/4) || a.Partition != base+3) {
					h.errorf("%s: attempts %d in partition %d, want %d in %d", what, a.Attempts, a.Partition, 100+i/4, base+3)
				}
			} else {
				h.wantStatus(what, a, tier.Held, "another token holds it")
			}
		default:
			want := tier.Acquired
			if h.engine() {
				want = tier.Absent
			}
			h.wantStatus(what, a, want, "a fresh key")
		}
	}
}

// checkOutFilled: "out must have len(reqs)", and the tier answers every
// element: out slices that held another call's answers (the engine pools
// them) come back with no field of those left, for every method, and
// nothing the tier does after returning writes them (under -race).
func checkOutFilled(h *harness) {
	reqs := []tier.Request{h.req("", "filled-1"), h.req("", "filled-2"), h.req("x", "filled-3")}
	reqs[1].Digest = tier.Digest{3}
	// Every helper fills out with poison and checks it is gone; this runs
	// each method once over keys in several states.
	h.put(base, reqs[1])
	if h.engine() {
		reqs[2].Attempts = 2
		h.release(base, false, reqs[2])
		h.release(base, true, h.req("", "filled-given-back"))
	} else {
		h.hold(long, reqs[2])
		h.release(base, false, h.as(reqs[2]))
		h.commit(base, h.as(reqs[0]))
	}
	out := h.claim(long, again(h, reqs)...)
	for i := range out { // written after the call: a tier still writing races here
		out[i] = tier.Answer{Status: poisonStatus}
	}
}

// checkKeysNotKept: the tier "never keeps a reference to reqs, out or
// their key bytes after returning": a caller that reuses its key and
// result buffers right after each call (the engine does) changes nothing
// stored, and the Result an answer carries is "the caller's (a copy, never
// the tier's buffer)".
func checkKeysNotKept(h *harness) {
	mutate := func(b []byte) {
		for i := range b {
			b[i] ^= 0x55
		}
	}
	orig := func(key string) tier.Request { return h.req("keep", key) }

	// Commit (and, in the store, the claim before it).
	buf, res := []byte("buffer-commit"), []byte("result-bytes")
	r := orig("buffer-commit")
	r.Key, r.Digest = buf, tier.Digest{4}
	if h.in.keeps {
		r.Result, r.At = res, 77
	}
	if !h.engine() {
		claimBuf := bytes.Clone(buf)
		cr := r
		cr.Key = claimBuf
		h.hold(long, cr)
		mutate(claimBuf)
	}
	h.wantAll("Commit from a buffer", []tier.Request{r}, h.commit(base, r), tier.OK)
	want := r
	want.Key = bytes.Clone(buf)
	if h.in.keeps {
		want.Result = bytes.Clone(res)
	}
	mutate(buf)
	mutate(res)
	h.wantCommitted("Claim of the original key after the caller reused the commit's key and result buffers", h.claim1(h.as(want), long), want, base)
	h.wantNew("Claim of the reused buffer's new bytes", h.as(tier.Request{NS: "keep", Key: bytes.Clone(buf), Oldest: base, Mask: everyPartition}), "no key with those bytes was written")

	// Claim in the store: the claim holds the original key.
	if !h.engine() {
		cbuf := []byte("buffer-claim")
		c := orig("buffer-claim")
		c.Key = cbuf
		h.hold(long, c)
		mutate(cbuf)
		h.wantStatus("Claim of the original key after the claimer reused its buffer", h.claim1(h.as(orig("buffer-claim")), long), tier.Held, "the claim holds the key it was given")
		h.wantNew("Claim of the reused buffer's new bytes", h.as(tier.Request{NS: "keep", Key: bytes.Clone(cbuf), Oldest: base, Mask: everyPartition}), "no key with those bytes was claimed")
	}

	// Release: an engine tier writes the count under the original key; a
	// store tier frees the original key.
	rbuf := []byte("buffer-release")
	rl := orig("buffer-release")
	if h.engine() {
		rl.Key, rl.Attempts = rbuf, 3
		h.release(base+1, false, rl)
		mutate(rbuf)
		a := h.claim1(orig("buffer-release"), long)
		if h.wantStatus("Claim of the original key after the releaser reused its buffer", a, tier.Released, "Release wrote the original key's count") && a.Attempts != 3 {
			h.errorf("released with %d attempts, want 3", a.Attempts)
		}
	} else {
		h.hold(long, rl)
		rl.Key = rbuf
		h.wantAll("Release by the claim's token", []tier.Request{rl}, h.release(base, false, rl), tier.OK)
		mutate(rbuf)
		h.wantFree("Claim of the original key after the releaser reused its buffer", h.as(orig("buffer-release")), "Release freed the original key")
	}

	// The Result of an answer is the caller's.
	if h.in.keeps {
		a := h.claim1(h.as(want), long)
		if a.Status == tier.Committed && len(a.Result) > 0 {
			mutate(a.Result)
			h.wantCommitted("Claim after the caller changed the Result an earlier answer carried", h.claim1(h.as(want), long), want, base)
		}
	}
}

// checkNamespaces: a key is (Request.NS, Request.Key): the same key in two
// namespaces is two keys, and no namespace and key run together with
// another pair ("a" ‖ "bc" is not "ab" ‖ "c").
func checkNamespaces(h *harness) {
	a := h.req("a", "k")
	a.Digest = tier.Digest{0xa}
	abc := h.req("a", "bc")
	abc.Digest = tier.Digest{0xb}
	h.put(base, a, abc)
	for _, r := range []tier.Request{h.req("", "k"), h.req("b", "k"), h.req("ab", "c"), h.req("", "ak"), h.req("", "abc")} {
		h.wantNew("Claim of "+name(r)+" after commits of (\"a\", \"k\") and (\"a\", \"bc\")", r, "namespaces separate keys")
	}
	h.wantCommitted("Claim of (\"a\", \"k\")", h.claim1(h.as(a), long), a, base)
	h.wantCommitted("Claim of (\"a\", \"bc\")", h.claim1(h.as(abc), long), abc, base)
}

// checkExactKeys: keys compare by their full bytes: a key that is a prefix
// of another, differs in case or in its last byte (long keys too), or
// holds NUL and 0xff bytes is another key.
func checkExactKeys(h *harness) {
	long1 := bytes.Repeat([]byte("L"), 4096)
	long2 := append(bytes.Clone(long1[:len(long1)-1]), 'M')
	mid := bytes.Repeat([]byte("m"), 1025)
	written := []tier.Request{h.req("", "k\x00"), h.req("", string(long1)), h.req("", string(mid))}
	for i := range written {
		written[i].Digest = tier.Digest{byte(i + 1), 0xe}
	}
	h.put(base, written...)
	for _, k := range []string{"k", "k\x00\xff", "K\x00", "k\x00\x00", string(long2), string(long1[:4095]), string(mid[:1024]), string(mid) + "m"} {
		r := h.req("", k)
		h.wantNew("Claim of "+name(r)+", a key never written", r, "keys compare by their full bytes")
	}
	for i, a := range h.claim(long, again(h, written)...) {
		h.wantCommitted("Claim of "+name(written[i]), a, written[i], base)
	}
}

// checkMask: a partitioned tier finds a record in the partition a
// request's Oldest and Mask name ("the key can be held only in partitions
// p >= Oldest whose bit … is set in Mask"), with Oldest a multiple of 64.
func checkMask(h *harness) {
	c := h.req("", "masked-commit")
	c.Digest = tier.Digest{0x3}
	h.put(base+3, c)
	r := h.req("", "masked-count")
	r.Attempts = 6
	h.release(base+5, false, r)
	c.Mask, r.Mask = 1<<3, 1<<5
	h.wantCommitted("Claim naming only the commit's partition", h.claim1(c, long), c, base+3)
	a := h.claim1(r, long)
	if h.wantStatus("Claim naming only the count's partition", a, tier.Released, "Release wrote it there") && (a.Attempts != 6 || a.Partition != base+5) {
		h.errorf("released %d attempts in partition %d, want 6 in %d", a.Attempts, a.Partition, base+5)
	}
}

// checkRequestWindow: "Window, when positive, is how long Commit keeps
// the key committed in a tier that expires keys itself (shorter than its
// own window: a namespace's); zero means the tier's window."
func checkRequestWindow(h *harness) {
	short := h.req("", "short-window")
	short.Window = 100 * time.Millisecond
	own := h.req("", "own-window")
	h.put(base, short, own)
	time.Sleep(wait)
	h.wantFree("Claim after the commit's own Window ended", h.as(short), "Commit kept it for Request.Window only")
	h.wantCommitted("Claim of a key committed without a Window, as long after", h.claim1(h.as(own), long), own, base)
}
