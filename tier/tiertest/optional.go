package tiertest

import (
	"bytes"
	"fmt"
	"slices"
	"time"

	"github.com/tierdedup/tierdedup/tier"
)

// resultChecks: "ResultKeeper is an Exact tier that stores Request.Result
// and Request.At with a commit and returns them with every Committed
// answer."
func resultChecks() []check {
	keeps := func(in *info) string {
		switch {
		case !in.resultKeeper:
			return "not a tier.ResultKeeper"
		case !in.keeps:
			return "KeepsResults() is false"
		}
		return ""
	}
	return []check{
		{"keeps-results", keeps, checkResults},
	}
}

// checkResults: every Committed answer carries the commit's Result and At
// (Claim, again, and Lookup and Forget where the tier has them: "Committed
// (with Digest, Result and At)"), each answer's Result its own copy ("the
// caller's (a copy, never the tier's buffer)"), and nil for a commit
// without one ("Result is nil when it stored none").
func checkResults(h *harness) {
	a, b, none := h.req("", "result-a"), h.req("", "result-b"), h.req("", "result-none")
	a.Result, a.At, a.Digest = []byte("first result"), 1001, tier.Digest{0xa}
	b.Result, b.At = bytes.Repeat([]byte{0, 0xff, 'r'}, 700), 1002
	none.Digest = tier.Digest{0xe}
	reqs := []tier.Request{a, b, none}
	h.put(base, reqs...)
	for round := 0; round < 2; round++ {
		out := h.claim(long, again(h, reqs)...)
		for i, got := range out {
			h.wantCommitted(fmt.Sprintf("Claim %d after the commit of %s", round+1, name(reqs[i])), got, reqs[i], base)
		}
		// Answers do not share buffers with each other or the tier.
		for i := range out {
			for j := range out[i].Result {
				out[i].Result[j] = 'X'
			}
		}
	}
	if _, ok := h.x.(tier.Looker); ok {
		for i, got := range h.lookup(reqs...) {
			h.wantCommitted("Lookup of "+name(reqs[i]), got, reqs[i], base)
		}
	}
	if _, ok := h.x.(tier.Forgetter); ok {
		for i, got := range h.forget(reqs...) {
			h.wantCommitted("Forget of "+name(reqs[i])+" (answers what it found)", got, reqs[i], base)
		}
	}
}

// commitWriterChecks: "CommitWriter is an Exact tier that can write the
// caller's records in the same atomic, durable batch as a commit."
func commitWriterChecks() []check {
	return []check{
		{"commit-with", implements("CommitWriter", func(in *info) bool { return in.commitWriter }), checkCommitWith},
		{"writes-outlive-retention", both(implements("CommitWriter", func(in *info) bool { return in.commitWriter }),
			both(implements("Dropper", func(in *info) bool { return in.dropper }), partitioned)), checkWritesOutliveDrop},
	}
}

func (h *harness) scanWrites(prefix string) []string {
	h.t.Helper()
	var got []string
	err := h.x.(tier.CommitWriter).ScanWrites([]byte(prefix), func(k, v []byte) error {
		got = append(got, string(k)+"="+string(v))
		return nil
	})
	if err != nil {
		h.t.Fatalf("ScanWrites(%q): %v", prefix, err)
	}
	return got
}

// checkCommitWith: "CommitWith is Commit plus writes … With no reqs it
// writes the records alone", and "ScanWrites calls fn for every record
// written with commits whose key starts with prefix, in key order".
func checkCommitWith(h *harness) {
	cw := h.x.(tier.CommitWriter)
	reqs := []tier.Request{h.req("", "with-1"), h.req("n", "with-2")}
	reqs[0].Digest = tier.Digest{0x1}
	if !h.engine() {
		h.hold(long, reqs...)
	}
	writes := []tier.Write{{Key: []byte("w/2"), Value: []byte("b")}, {Key: []byte("w/1"), Value: []byte("a")}, {Key: []byte("x/1"), Value: []byte("c")}}
	st := poisonStatuses(len(reqs))
	if err := cw.CommitWith(h.ctx, base, reqs, writes, st); err != nil {
		h.t.Fatalf("CommitWith: %v", err)
	}
	h.checkStatuses("CommitWith", reqs, st)
	h.wantAll("CommitWith", reqs, st, tier.OK)
	for i, a := range h.claim(long, again(h, reqs)...) {
		h.wantCommitted("Claim after CommitWith of "+name(reqs[i]), a, reqs[i], base)
	}
	if got, want := h.scanWrites("w/"), []string{"w/1=a", "w/2=b"}; !slices.Equal(got, want) {
		h.errorf("ScanWrites(\"w/\") = %q, want %q (prefix, key order)", got, want)
	}
	if err := cw.CommitWith(h.ctx, base, nil, []tier.Write{{Key: []byte("w/0"), Value: []byte("z")}}, []tier.Status{}); err != nil {
		h.t.Fatalf("CommitWith of writes alone: %v", err)
	}
	if got, want := h.scanWrites(""), []string{"w/0=z", "w/1=a", "w/2=b", "x/1=c"}; !slices.Equal(got, want) {
		h.errorf("ScanWrites(\"\") = %q, want %q", got, want)
	}
}

// checkWritesOutliveDrop: writes live "in a keyspace that retention never
// touches": a Drop of every partition leaves them.
func checkWritesOutliveDrop(h *harness) {
	cw := h.x.(tier.CommitWriter)
	r := h.req("", "with-dropped")
	if err := cw.CommitWith(h.ctx, base, []tier.Request{r}, []tier.Write{{Key: []byte("kept"), Value: []byte("1")}}, poisonStatuses(1)); err != nil {
		h.t.Fatalf("CommitWith: %v", err)
	}
	if err := h.x.(tier.Dropper).Drop(base+64, 1); err != nil {
		h.t.Fatalf("Drop: %v", err)
	}
	h.wantNew("Claim after a Drop of its partition", r, "Drop deletes the partition's records")
	if got := h.scanWrites("kept"); !slices.Equal(got, []string{"kept=1"}) {
		h.errorf("ScanWrites after a Drop of every partition = %q, want [kept=1]", got)
	}
}

// extenderChecks: "Extend makes the lease of each claim that
// reqs[i].Token holds with an unexpired lease end lease from now, unless
// it already ends later (out[i] OK); a key the token no longer holds is
// out[i] Lost and unchanged."
func extenderChecks() []check {
	ext := implements("Extender", func(in *info) bool { return in.extender })
	return []check{
		{"extend-lengthens", ext, checkExtendLengthens},
		{"extend-never-shortens", ext, checkExtendNeverShortens},
		{"extend-fenced", ext, checkExtendFenced},
	}
}

// extendLease is a lease short enough to end within a check, long enough
// for an Extend to arrive before it does on a loaded machine.
const extendLease = 600 * time.Millisecond

func checkExtendLengthens(h *harness) {
	a := h.req("", "extended")
	h.hold(extendLease, a)
	h.wantAll("Extend by the holder", []tier.Request{a}, h.extend(long, a), tier.OK)
	time.Sleep(extendLease + wait)
	h.wantStatus("Claim by another token after the original lease would have ended", h.claim1(h.as(a), long), tier.Held, "Extend made the lease end lease from now")
	h.wantAll("Commit by the holder of the extended claim", []tier.Request{a}, h.commit(base, a), tier.OK)
}

func checkExtendNeverShortens(h *harness) {
	a := h.req("", "not-shortened")
	h.hold(long, a)
	h.wantAll("Extend by a shorter lease", []tier.Request{a}, h.extend(10*time.Millisecond, a), tier.OK)
	time.Sleep(wait)
	h.wantStatus("Claim by another token after the shorter lease would have ended", h.claim1(h.as(a), long), tier.Held, "\"unless it already ends later\"")
	h.wantAll("Commit by the holder", []tier.Request{a}, h.commit(base, a), tier.OK)
}

func checkExtendFenced(h *harness) {
	held := h.req("", "extend-other")
	h.hold(short, held)
	stranger := h.as(held)
	h.wantAll("Extend by a token that does not hold the key", []tier.Request{stranger}, h.extend(long, stranger), tier.Lost)
	time.Sleep(wait)
	h.wantFree("Claim after the holder's lease ended, another's Extend Lost", h.as(held), "a Lost Extend changes nothing")

	committed := h.req("", "extend-committed")
	committed.Digest = tier.Digest{0xec}
	h.put(base, committed)
	h.wantAll("Extend by the committer of a committed key", []tier.Request{committed}, h.extend(long, committed), tier.Lost)
	h.wantCommitted("Claim after an Extend of a committed key", h.claim1(h.as(committed), long), committed, base)

	lapsed := h.req("", "extend-lapsed")
	h.hold(short, lapsed)
	time.Sleep(wait)
	h.wantAll("Extend after the lease ended", []tier.Request{lapsed}, h.extend(long, lapsed), tier.Lost)
	h.wantFree("Claim after a Lost Extend of a lapsed claim", h.as(lapsed), "\"with an unexpired lease\"")

	fresh := h.req("", "extend-fresh")
	h.wantAll("Extend of a key never claimed", []tier.Request{fresh}, h.extend(long, fresh), tier.Lost)
	h.wantNew("Claim after an Extend of a key never claimed", h.as(fresh), "a Lost Extend changes nothing")
}
