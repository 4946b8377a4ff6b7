package tiertest

import (
	"fmt"
	"time"

	"github.com/tierdedup/tierdedup/tier"
)

// engineChecks are the promises of a tier whose claims live in the
// engine: "Claim is then a read: the tier answers Absent, Committed (with
// the record's Partition) or Released (with its attempt count). Commit
// writes committed records; Release writes the attempt counts the engine
// gives it. The tier never sees a lease."
func engineChecks() []check {
	return []check{
		{"claim-is-a-read", inEngine, checkClaimIsRead},
		{"release-writes-counts", inEngine, checkEngineRelease},
		{"commit-supersedes-count", inEngine, checkCommitSupersedes},
	}
}

// checkClaimIsRead: Claim writes nothing: a fresh key stays Absent however
// often it is claimed, with any lease, and a committed one Committed.
func checkClaimIsRead(h *harness) {
	r := h.req("", "read")
	for _, lease := range []time.Duration{0, time.Millisecond, long} {
		h.wantStatus(fmt.Sprintf("Claim of a fresh key with lease %v", lease), h.claim1(r, lease), tier.Absent, "Claim is a read")
	}
	c := h.req("", "read-committed")
	c.Digest = tier.Digest{0xc}
	h.put(base, c)
	pair := h.claim(time.Millisecond, r, c)
	h.wantStatus("Claim of a fresh key beside a committed one", pair[0], tier.Absent, "Claim is a read")
	time.Sleep(10 * time.Millisecond)
	h.wantCommitted("Claim after a claim with a lease of 1ms ended", h.claim1(c, time.Millisecond), c, base)
	h.wantCommitted("Claim of a committed key, again", h.claim1(c, long), c, base)
}

// checkEngineRelease: "Release … writes, in partition, the attempt count
// reqs[i].Attempts of each key, zero included; nothing with giveBack": a
// count answers Released with its Attempts and Partition, a zero one too
// (and it shadows an older partition's count: an engine restoring what a
// durable claim raised); a request given back writes nothing (Absent); a
// later count replaces the earlier one.
func checkEngineRelease(h *harness) {
	counted, none, given := h.req("", "counted"), h.req("", "no-count"), h.req("", "given-back")
	counted.Attempts, given.Attempts = 2, 5
	h.wantAll("Release", []tier.Request{counted, none}, h.release(base+1, false, counted, none), tier.OK)
	h.wantAll("Release with giveBack", []tier.Request{given}, h.release(base+1, true, given), tier.OK)
	a := h.claim(long, counted, none, given)
	if h.wantStatus("Claim of a key released with a count", a[0], tier.Released, "Release writes the attempt count") && (a[0].Attempts != 2 || a[0].Partition != base+1) {
		h.errorf("released: %d attempts in partition %d, want 2 in %d", a[0].Attempts, a[0].Partition, base+1)
	}
	if h.wantStatus("Claim of a key released with a zero count", a[1], tier.Released, "\"the attempt count … of each key, zero included\"") && (a[1].Attempts != 0 || a[1].Partition != base+1) {
		h.errorf("released with zero: %d attempts in partition %d, want 0 in %d", a[1].Attempts, a[1].Partition, base+1)
	}
	h.wantStatus("Claim of a key given back with a count", a[2], tier.Absent, "\"(none with giveBack)\"")
	counted.Attempts = 3
	h.release(base+1, false, counted)
	if a := h.claim1(counted, long); h.wantStatus("Claim after a second count", a, tier.Released, "Release writes the attempt count") && a.Attempts != 3 {
		h.errorf("after a second count of 3: %d attempts", a.Attempts)
	}
	counted.Attempts = 0
	h.release(base+2, false, counted)
	if a := h.claim1(counted, long); h.wantStatus("Claim after a zero count in a later partition", a, tier.Released, "a newer partition's count shadows an older one") && (a.Attempts != 0 || a.Partition != base+2) {
		h.errorf("after a zero count in partition %d: %d attempts in partition %d", base+2, a.Attempts, a.Partition)
	}
}

// checkCommitSupersedes: "On success every key answers Committed to later
// claims", a key with an attempt count too, whether committed in the
// count's partition or a later one.
func checkCommitSupersedes(h *harness) {
	same, later := h.req("", "count-then-commit"), h.req("", "count-then-later-commit")
	same.Attempts, later.Attempts = 2, 2
	h.release(base+1, false, same, later)
	same.Digest, later.Digest = tier.Digest{5}, tier.Digest{6}
	h.commit(base+1, same)
	h.commit(base+2, later)
	h.wantCommitted("Claim after a count and a commit in its partition", h.claim1(same, long), same, base+1)
	h.wantCommitted("Claim after a count and a commit in a later partition", h.claim1(later, long), later, base+2)
}
