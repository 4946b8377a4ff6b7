package tiertest

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/tier"
)

// harness is one check's tier and helpers over it. Every helper fails the
// check on an error, fills the call's out with poison first and verifies
// that every element was answered.
type harness struct {
	t      *testing.T
	x      tier.Exact
	o      Options
	in     *info
	open   Open
	ctx    context.Context
	cancel context.CancelFunc
	closed bool
	tokens int
	mu     sync.Mutex
	errors int // reported by errorf
}

// maxErrors bounds the failures one check reports in full: a tier that
// breaks a promise usually breaks it for every key of a batch.
const maxErrors = 12

// errorf reports a failure, in full for the first maxErrors of the check;
// safe for concurrent use.
func (h *harness) errorf(format string, args ...any) {
	h.t.Helper()
	h.mu.Lock()
	h.errors++
	n := h.errors
	h.mu.Unlock()
	if n <= maxErrors {
		h.t.Errorf(format, args...)
		return
	}
	h.t.Fail()
}

func newHarness(t *testing.T, o Options, in *info, open Open) *harness {
	x := open(t)
	if x == nil {
		t.Fatal("open returned a nil tier")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	return &harness{t: t, x: x, o: o, in: in, open: open, ctx: ctx, cancel: cancel}
}

// close closes the tier, once.
func (h *harness) close() {
	h.t.Helper()
	defer h.cancel()
	if h.errors > maxErrors {
		h.t.Errorf("… and %d more failures of this check", h.errors-maxErrors)
	}
	if h.closed {
		return
	}
	h.closed = true
	if err := h.x.Close(); err != nil {
		h.errorf("Close: %v", err)
	}
}

// reopen closes the tier and opens its data again (Options.Reopen).
func (h *harness) reopen() {
	h.t.Helper()
	if err := h.x.Close(); err != nil {
		h.t.Fatalf("Close: %v", err)
	}
	h.closed = true
	x := h.o.Reopen(h.t, h.x)
	if x == nil {
		h.t.Fatal("Options.Reopen returned a nil tier")
	}
	h.x, h.closed = x, false
	if w := x.Claims(); w != h.in.where {
		h.t.Fatalf("reopened, Claims() = %v, want %v", w, h.in.where)
	}
}

func (h *harness) engine() bool { return h.in.where == tier.ClaimsInEngine }

// tok returns a token no other call of the check has used; never zero.
func (h *harness) tok() tier.Token {
	h.tokens++
	return tier.Token{0x7e, byte(h.tokens >> 8), byte(h.tokens), 0xa5, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
}

// req is a request for (ns, key) with a new token, naming every partition
// from base.
func (h *harness) req(ns, key string) tier.Request {
	return tier.Request{NS: ns, Key: []byte(key), Token: h.tok(), Oldest: base, Mask: everyPartition}
}

// as is r with another new token: the same key, asked by another claimer.
func (h *harness) as(r tier.Request) tier.Request {
	r.Token = h.tok()
	return r
}

// name is a request's key for messages.
func name(r tier.Request) string {
	if len(r.Key) > 24 {
		return fmt.Sprintf("(%q, %q… %d bytes)", r.NS, r.Key[:16], len(r.Key))
	}
	return fmt.Sprintf("(%q, %q)", r.NS, r.Key)
}

// quote is b for messages, cut after 32 bytes.
func quote(b []byte) string {
	if len(b) > 32 {
		return fmt.Sprintf("%q… (%d bytes)", b[:32], len(b))
	}
	return fmt.Sprintf("%q", b)
}

// show is an answer for messages: its status and the fields it set.
func show(a tier.Answer) string {
	var b strings.Builder
	b.WriteString(a.Status.String())
	if a.Digest != (tier.Digest{}) {
		fmt.Fprintf(&b, " digest=%x", a.Digest)
	}
	if a.Token != (tier.Token{}) {
		fmt.Fprintf(&b, " token=%x", a.Token)
	}
	fmt.Fprintf(&b, " partition=%d", a.Partition)
	if a.Attempts != 0 {
		fmt.Fprintf(&b, " attempts=%d", a.Attempts)
	}
	if a.Expired {
		b.WriteString(" expired")
	}
	if a.Result != nil {
		fmt.Fprintf(&b, " result=%s", quote(a.Result))
	}
	if a.At != 0 {
		fmt.Fprintf(&b, " at=%d", a.At)
	}
	return b.String()
}

func poisonAnswers(n int) []tier.Answer {
	out := make([]tier.Answer, n)
	for i := range out {
		out[i] = tier.Answer{Status: poisonStatus, Digest: poisonDigest, Partition: poisonPartition, Token: poisonToken,
			Attempts: poisonAttempts, Expired: true, Result: poisonResult, At: poisonAt}
	}
	return out
}

func poisonStatuses(n int) []tier.Status {
	out := make([]tier.Status, n)
	for i := range out {
		out[i] = poisonStatus
	}
	return out
}

func has(set []tier.Status, s tier.Status) bool {
	for _, x := range set {
		if x == s {
			return true
		}
	}
	return false
}

// checkAnswers verifies that every out[i] was answered: a status the
// method may answer, and no field left as the poison put there.
func (h *harness) checkAnswers(method string, reqs []tier.Request, out []tier.Answer, allowed []tier.Status) {
	h.t.Helper()
	for i := range out {
		a, what := &out[i], fmt.Sprintf("%s: out[%d] for %s", method, i, name(reqs[i]))
		if !has(allowed, a.Status) {
			h.errorf("%s: status %v, want one of %v (\"reqs[i] is answered in out[i]\")", what, a.Status, allowed)
		}
		switch {
		case a.Digest == poisonDigest:
			h.errorf("%s: Digest left as the caller's out held it", what)
		case a.Token == poisonToken:
			h.errorf("%s: Token left as the caller's out held it", what)
		case a.Partition == poisonPartition:
			h.errorf("%s: Partition left as the caller's out held it", what)
		case a.Attempts == poisonAttempts:
			h.errorf("%s: Attempts left as the caller's out held it", what)
		case a.At == poisonAt:
			h.errorf("%s: At left as the caller's out held it", what)
		case len(a.Result) > 0 && &a.Result[0] == &poisonResult[0], bytes.Equal(a.Result, poisonResult):
			h.errorf("%s: Result left as the caller's out held it", what)
		case a.Expired && a.Status != tier.Acquired && a.Status != tier.Poisoned && a.Status != tier.Released:
			h.errorf("%s: Expired on a %v answer (Expired: \"this claim found another's lease ended\")", what, a.Status)
		}
		if !h.o.Partitioned && (a.Status == tier.Committed || a.Status == tier.Released) && a.Partition != -1 {
			h.errorf("%s: %v in partition %d from an unpartitioned tier, want -1 (\"-1 when the tier cannot tell, and then nothing is cached\")", what, a.Status, a.Partition)
		}
		if h.o.Partitioned && (a.Status == tier.Committed || a.Status == tier.Released) && a.Partition < 0 {
			h.errorf("%s: %v without its partition (%d) from a partitioned tier", what, a.Status, a.Partition)
		}
	}
}

func (h *harness) checkStatuses(method string, reqs []tier.Request, out []tier.Status) {
	h.t.Helper()
	allowed := fenced
	if h.engine() {
		allowed = written
	}
	for i, s := range out {
		if !has(allowed, s) {
			h.errorf("%s: out[%d] for %s = %v, want one of %v", method, i, name(reqs[i]), s, allowed)
		}
	}
}

// wantAll fails unless every status is want.
func (h *harness) wantAll(what string, reqs []tier.Request, got []tier.Status, want tier.Status) {
	h.t.Helper()
	for i, s := range got {
		if s != want {
			h.errorf("%s of %s = %v, want %v", what, name(reqs[i]), s, want)
		}
	}
}

// wantStatus fails unless a.Status is want.
func (h *harness) wantStatus(what string, a tier.Answer, want tier.Status, doc string) bool {
	h.t.Helper()
	if a.Status != want {
		h.errorf("%s = %s, want %v (%s)", what, show(a), want, doc)
		return false
	}
	return true
}

// wantNew fails unless r, a key the check never wrote or one whose
// records are gone, is free: Absent (claims in the engine), or Acquired by
// r's token with no attempts (claims in the store; r then holds it). It
// returns the answer.
func (h *harness) wantNew(what string, r tier.Request, doc string) tier.Answer {
	h.t.Helper()
	a := h.claim1(r, long)
	if h.engine() {
		h.wantStatus(what, a, tier.Absent, doc)
		return a
	}
	if h.wantStatus(what, a, tier.Acquired, doc) && a.Attempts != 0 {
		h.errorf("%s: acquired carrying %d attempts, want none (%s)", what, a.Attempts, doc)
	}
	return a
}

// wantFree is wantNew where earlier releases may have left a count:
// Absent or Released (engine), Acquired (store).
func (h *harness) wantFree(what string, r tier.Request, doc string) tier.Answer {
	h.t.Helper()
	a := h.claim1(r, long)
	if h.engine() {
		if a.Status != tier.Absent && a.Status != tier.Released {
			h.errorf("%s = %v, want absent or released (%s)", what, a.Status, doc)
		}
		return a
	}
	h.wantStatus(what, a, tier.Acquired, doc)
	return a
}

// wantCommitted fails unless a is the answer for the commit of r in
// partition p: Committed with r's Digest, the partition (partitioned) or
// -1, the committer's Token (claims in the store), and r's Result and At
// (a tier that keeps results; At alone in a partitioned tier).
func (h *harness) wantCommitted(what string, a tier.Answer, r tier.Request, p int64) {
	h.t.Helper()
	if !h.wantStatus(what, a, tier.Committed, "\"On success every key answers Committed to later claims\"") {
		return
	}
	if a.Digest != r.Digest {
		h.errorf("%s: Digest %x, want %x (\"Digest is the committed payload digest\")", what, a.Digest, r.Digest)
	}
	if !h.engine() && a.Token != r.Token {
		h.errorf("%s: Token %x, want the committer's %x (\"Token is the committer's owner token (Committed, ClaimsInStore)\")", what, a.Token, r.Token)
	}
	if h.o.Partitioned && a.Partition != p {
		h.errorf("%s: Partition %d, want %d, the commit's (\"Partition holds the record\")", what, a.Partition, p)
	}
	if h.in.keeps {
		switch {
		case len(r.Result) > 0 && (!bytes.Equal(a.Result, r.Result) || a.At != r.At):
			h.errorf("%s: Result %s At %d, want %s At %d (ResultKeeper: \"returns both with every later Committed answer\")", what, quote(a.Result), a.At, quote(r.Result), r.At)
		case len(r.Result) == 0 && a.Result != nil:
			h.errorf("%s: Result %s for a commit without one, want nil (\"Result is nil when it stored none\")", what, quote(a.Result))
		}
	}
	if h.o.Partitioned && r.At != 0 && a.At != r.At {
		h.errorf("%s: At %d, want %d (\"a partitioned tier stores At whenever it is given\")", what, a.At, r.At)
	}
}
