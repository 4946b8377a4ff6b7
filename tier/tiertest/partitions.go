package tiertest

import (
	"fmt"
	"math"
	"time"

	"github.com/tierdedup/tierdedup/tier"
)

// dropperChecks: "Drop deletes every record of partitions before `before`
// and records highWater, the engine's clock, durably, in one step."
func dropperChecks() []check {
	d := implements("Dropper", func(in *info) bool { return in.dropper })
	return []check{
		{"drop-partitions", both(d, partitioned), checkDropPartitions},
		{"drop-keeps-live", both(d, func(in *info) string {
			if in.o.Partitioned {
				return "Options.Partitioned: drop-partitions checks it"
			}
			return ""
		}), checkDropKeepsLive},
	}
}

func checkDropPartitions(h *harness) {
	var reqs []tier.Request
	for i := int64(0); i < 4; i++ {
		r := h.req("", fmt.Sprint("dropped-", i))
		r.Digest = tier.Digest{byte(i + 1)}
		h.commit(base+i, r)
		reqs = append(reqs, r)
	}
	count := h.req("", "dropped-count")
	count.Attempts = 2
	h.release(base+1, false, count)
	later := h.req("", "dropped-count-later")
	later.Attempts = 2
	h.release(base+2, false, later)
	if err := h.x.(tier.Dropper).Drop(base+2, 1); err != nil {
		h.t.Fatalf("Drop(%d): %v", base+2, err)
	}
	out := h.claim(long, append(reqs, count, later)...)
	h.wantStatus("Claim of a key committed in a dropped partition", out[0], tier.Absent, "Drop deletes every record of partitions before `before`")
	h.wantStatus("Claim of a key committed in the partition before `before`", out[1], tier.Absent, "Drop deletes every record of partitions before `before`")
	h.wantCommitted("Claim of a key committed in partition `before`", out[2], reqs[2], base+2)
	h.wantCommitted("Claim of a key committed after `before`", out[3], reqs[3], base+3)
	h.wantStatus("Claim of a count in a dropped partition", out[4], tier.Absent, "every record")
	if h.wantStatus("Claim of a count in partition `before`", out[5], tier.Released, "kept") && out[5].Attempts != 2 {
		h.errorf("count in partition `before`: %d attempts, want 2", out[5].Attempts)
	}
	if _, ok := h.x.(tier.Scanner); ok {
		got := h.scan(0, math.MaxUint32)
		want := map[string]int{record(base+2, "", reqs[2].Key): 1, record(base+3, "", reqs[3].Key): 1, record(base+2, "", later.Key): 1}
		if !sameRecords(got, want) {
			h.errorf("Scan after Drop(%d) = %v, want %v", base+2, got, want)
		}
	}
}

// checkDropKeepsLive: in a tier that is not partitioned no record lies in
// a partition before `before`; a Drop keeps every live key as it was.
func checkDropKeepsLive(h *harness) {
	c := h.req("", "live-commit")
	c.Digest = tier.Digest{0xd}
	h.put(base, c)
	held := h.req("", "live-held")
	if !h.engine() {
		h.hold(long, held)
	}
	if err := h.x.(tier.Dropper).Drop(base+10, 1); err != nil {
		h.t.Fatalf("Drop: %v", err)
	}
	time.Sleep(wait) // a background sweep has run by now
	h.wantCommitted("Claim after a Drop of a key committed in the window", h.claim1(h.as(c), long), c, base)
	if !h.engine() {
		h.wantStatus("Claim by another token after a Drop of a held key", h.claim1(h.as(held), long), tier.Held, "the claim is live")
	}
}

// scannerChecks: "Scan calls fn for every committed or released record in
// partitions [from, to)".
func scannerChecks() []check {
	return []check{
		{"scan-range", both(implements("Scanner", func(in *info) bool { return in.scanner }), partitioned), checkScanRange},
	}
}

func sameRecords(got, want map[string]int) bool {
	if len(got) != len(want) {
		return false
	}
	for k := range want {
		if got[k] == 0 {
			return false
		}
	}
	return true
}

func checkScanRange(h *harness) {
	in := func(p int64, ns, key string) tier.Request {
		r := h.req(ns, key)
		r.Digest = tier.Digest{byte(p)}
		h.commit(p, r)
		return r
	}
	in(base, "a", "scan-before")
	in(base+1, "", "scan-1")
	in(base+1, "b", "scan-1")
	in(base+2, "", "scan-2")
	in(base+3, "", "scan-after")
	c := h.req("c", "scan-count")
	c.Attempts = 1
	h.release(base+2, false, c)
	none := h.req("", "scan-no-count")
	h.release(base+2, false, none)
	h.release(base+2, true, h.req("", "scan-given-back"))
	got := h.scan(base+1, base+3)
	want := map[string]int{
		record(base+1, "", []byte("scan-1")): 1, record(base+1, "b", []byte("scan-1")): 1,
		record(base+2, "", []byte("scan-2")): 1, record(base+2, "c", []byte("scan-count")): 1,
		record(base+2, "", []byte("scan-no-count")): 1, // a zero count is a record too
	}
	if !sameRecords(got, want) {
		h.errorf("Scan [%d, %d) = %v, want %v (every committed or released record, no other)", base+1, base+3, got, want)
	}
	if got := h.scan(base+4, base+9); len(got) != 0 {
		h.errorf("Scan of partitions holding nothing = %v", got)
	}
}

// latchingChecks: "Broken returns the failure that stopped the tier, nil
// while it works."
func latchingChecks() []check {
	return []check{
		{"works-unbroken", implements("Latching", func(in *info) bool { return in.latching }), checkUnbroken},
	}
}

func checkUnbroken(h *harness) {
	l := h.x.(tier.Latching)
	if err := l.Broken(); err != nil {
		h.t.Fatalf("Broken() of a new tier = %v", err)
	}
	r := h.req("", "unbroken")
	r.Digest = tier.Digest{1}
	h.put(base, r)
	h.claim(long, h.as(r), h.req("", "unbroken-fresh"))
	if err := l.Broken(); err != nil {
		h.t.Fatalf("Broken() after calls that worked = %v", err)
	}
}
