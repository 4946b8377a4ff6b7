package engine_test

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/enginetest"
)

// This file is the sequential specification that TestLinearizability checks
// recorded histories against (porcupine), and the code that reports a
// history it cannot linearize.
//
// One partition per key: a caller's key, an Advance entity or a one-time
// token. A key is absent (perhaps with an attempt count), claimed by one
// claim (its id, the engine instance that made it and its lease end) or
// committed (with its digest and result); an entity has a stored version
// and maybe a claim offering a higher one; a token is issued, then used.
//
// Where the documentation promises less than one atomic step per call, the
// model allows exactly that, and each allowance names the sentence:
//
//   - pending: while a call that holds its key for a moment runs, any other
//     call may see the key InFlight. Invariant 1 of the package: "the
//     memory tier's stripe lock installs a claim before any slower tier is
//     consulted"; Outcome InFlight: "another claim holds the key now"; the
//     docs on Forget (docs/operations.md): "a claim racing a Forget is InFlight until the
//     removal is durable". The holds are a claim or an advance while it
//     consults a slower tier, whatever it answers; a commit, from its lease
//     check until memory shows it (its claim is pinned meanwhile, past its
//     lease if that ends; with a shared tier the others see the commit
//     first); a release between memory and a shared tier; a forget; and a
//     mark, which "holds the key as a claim does, so a concurrent call of
//     the same key may see it InFlight until the mark is durable"
//     (MarkIfAbsent; the same for a token's use, a mark). A call marks itself pending with two synthetic
//     operations, begin (just before its call) and end (just after its
//     return), so the allowance lasts exactly as long as the call. With a
//     shared tier most holds are in the calling engine's memory, and
//     excuse InFlight there only; those the shared tier shows (a Redis
//     mark between its claim and its commit, a release between memory and
//     the tier) excuse it in every engine. Which calls hold, and where, is
//     linHolds.
//   - stalled: a mark, or a token's use, whose call lasted a whole lease may
//     answer InFlight (ErrInFlight): docs/consuming.md, "In a MarkBatch, a key
//     whose lease was lost before the commit (another worker took it over)
//     is answered InFlight", and ConsumeToken, "ErrInFlight ... when this
//     call stalled past the Lease before its use was durable". An
//     IssueToken that stalled so "fails with ErrLeaseLost and issues
//     nothing".
//   - leases are judged on the engine's time, which lies between the fake
//     clock's readings before the call and after its return (Invariant 5:
//     "Time never runs backwards inside an engine"): inside that interval a
//     lease may have ended or not, and both are allowed. Invariant 2:
//     "Commit and Release succeed only for the current owner of an
//     unexpired lease; otherwise they return ErrLeaseLost and change
//     nothing."
//   - a restart voids every claim of the embedded tier (docs/operations.md:
//     "Claims of a previous process are void at open"; MaxAttempts: "a
//     claim abandoned by a crash is void at the next Open and not
//     counted"); a shared tier keeps a closed engine's claims ("in Redis
//     its lease simply runs out"), which no other engine can commit
//     (ErrLeaseLost: "a Commit or Release by a claim that no longer owns
//     its key").
//   - errors: a call that failed with ErrClosed changed nothing (Close:
//     "calls after it return ErrClosed"; ClaimBatch: "On error no claim is
//     held"). Every other error that this file does not name fails the
//     check.

// linOp is the kind of a recorded operation.
type linOp uint8

const (
	linBegin   linOp = iota + 1 // synthetic: a call that holds its key starts
	linEnd                      // synthetic: that call has returned
	linRestart                  // the engine (or one of them) closed and reopened
	linClaim                    // Claim, ClaimDigest, one key of ClaimBatch
	linMark                     // MarkIfAbsent, one key of MarkBatch
	linCommit                   // Commit, CommitAsync, one claim of CommitBatch
	linRelease                  // Release, one claim of ReleaseBatch
	linLookup                   // Lookup, one key of LookupBatch
	linForget                   // Forget, one key of ForgetBatch
	linAdvance                  // Advance
	linIssue                    // IssueToken
	linConsume                  // ConsumeToken
)

var linOpNames = [...]string{"", "begin", "end", "restart", "Claim", "Mark", "Commit", "Release", "Lookup", "Forget", "Advance", "IssueToken", "ConsumeToken"}

// String names the call.
func (o linOp) String() string { return linOpNames[o] }

// linClass is what a partition holds.
type linClass uint8

const (
	linKey    linClass = iota // a caller's key
	linEntity                 // an Advance entity
	linToken                  // a one-time token
)

// linErr is the class of error a call returned.
type linErr uint8

const (
	linOK           linErr = iota
	linLeaseLost           // ErrLeaseLost
	linInFlightErr         // ErrInFlight (Forget, ConsumeToken)
	linClosed              // ErrClosed: the call changed nothing
	linTokenUsed           // ErrTokenUsed
	linTokenUnknown        // ErrTokenUnknown
	linTokenExpired        // ErrTokenExpired
	linOther               // any other error: never allowed
)

var linErrNames = [...]string{"ok", "ErrLeaseLost", "ErrInFlight", "ErrClosed", "ErrTokenUsed", "ErrTokenUnknown", "ErrTokenExpired", "other error"}

// String names the error.
func (e linErr) String() string { return linErrNames[e] }

// linInput is an operation's call: what was asked, of which key, by which
// claim and engine instance, and the fake clock's readings around it.
type linInput struct {
	op     linOp
	class  linClass
	part   string // partition: "k:name", "e:name", "t:n"; "*" for a restart
	client int
	claim  int64 // the claim this call made (Claim, Advance) or settles (Commit, Release)
	eng    int   // the engine the call went to (of those sharing a tier)
	inst   int64 // and its instance (a restart makes a new one)
	digest engine.Digest
	result string // the result a commit stores
	// version is the version an Advance offers.
	version uint64
	// slot is the pending slot of a call that holds its key (-1: none);
	// global, whether every engine sees that hold or only its own.
	slot   int
	global bool
	// settled: the call commits or releases a claim settled before,
	// which holds nothing.
	settled bool
	// t0 and t1 are the fake clock before the call and after its return:
	// the engine's time during the call lies between them.
	t0, t1 int64
}

// linOutput is an operation's answer.
type linOutput struct {
	err        linErr
	errText    string // the error's text, for the report
	outcome    engine.Outcome
	leaseUntil int64
	digest     engine.Digest
	result     string
	attempts   uint16
	version    uint64
}

// linStatus is a partition's state.
type linStatus uint8

const (
	linAbsent    linStatus = iota // key: nothing committed; entity: no claim; token: not issued
	linClaimed                    // a claim holds the key or entity
	linCommitted                  // key: committed
	linIssued                     // token: issued, unused
	linUsed                       // token: used
)

// linState is one partition's state. It is a comparable value.
type linState struct {
	status linStatus
	// The claim (linClaimed): its id, engine instance, lease end, and what
	// its commit stores (a key's digest, an entity's version).
	owner, inst int64
	until       int64
	cdigest     engine.Digest
	offered     uint64
	// The commit (linCommitted).
	digest engine.Digest
	result string
	// attempts counts failed claims (MaxAttempts); a claim carries the
	// count of the key it holds.
	attempts uint16
	// version is an entity's stored version.
	version uint64
	// pending has a bit per slot of a call that holds the key now where
	// every engine sees it (the shared tier); local[e], of one that holds
	// it in engine e's memory only.
	pending uint64
	local   [linMaxEngines]uint64
}

// linMaxEngines bounds the engines that share a tier in a run.
const linMaxEngines = 2

// calls is s without its key's state: only the calls in progress.
func (s linState) calls() linState { return linState{pending: s.pending, local: s.local} }

// hash is a hash of every field, for porcupine's cache of visited states.
func (s linState) hash() uint64 {
	h := fnv.New64a()
	var buf [10 * 8]byte
	for i, v := range []uint64{uint64(s.status), uint64(s.owner), uint64(s.inst), uint64(s.until), s.offered, uint64(s.attempts), s.version, s.pending, s.local[0], s.local[1]} {
		binary.LittleEndian.PutUint64(buf[8*i:], v)
	}
	h.Write(buf[:])
	h.Write(s.cdigest[:])
	h.Write(s.digest[:])
	h.Write([]byte(s.result))
	return h.Sum64()
}

// linBreak names a deliberately wrong model, to show that the checker
// fails.
type linBreak uint8

const (
	linCorrect linBreak = iota
	// linBreakRelease makes Release commit the key: a Duplicate is then
	// required after a Release.
	linBreakRelease
)

// linModel is the specification for one configuration.
type linModel struct {
	lease       int64
	maxAttempts int
	// voidOnRestart: claims live in the engine (memory-only, the embedded
	// tier) and die with it.
	voidOnRestart bool
	// countOnRestart: a claim voided so is an attempt (DurableClaims:
	// its handler may have run).
	countOnRestart bool
	// retriedCopies: the client retries commands whose replies time out
	// (go-redis's retries, a paused server): a Commit or Release that
	// answers ErrLeaseLost may follow a copy of itself that applied, and a
	// Forget's answer may be read after its first copy removed the key
	// (docs/reliability.md), so each may have taken effect.
	retriedCopies bool
	broken        linBreak
}

// one is the single state s.
func one(s linState) []linState { return []linState{s} }

// mayLive reports whether a claim's lease may still run during the call:
// the lease holds while the engine's time is before its end.
func mayLive(s linState, in linInput) bool { return enginetest.LeaseMayLive(s.until, in.t0) }

// mayEnd reports whether a claim's lease may have ended during the call.
func mayEnd(s linState, in linInput) bool { return enginetest.LeaseMayEnd(s.until, in.t1) }

// othersPending reports whether another call holding the key is running.
func othersPending(s linState, in linInput) bool {
	p := s.pending | s.local[in.eng]
	if in.slot >= 0 {
		p &^= 1 << in.slot
	}
	return p != 0
}

// stalled reports whether the call lasted a whole lease: a claim it took
// on its way (a mark's, a token use's) may have ended before its commit.
func (m linModel) stalled(in linInput) bool { return in.t1-in.t0 >= m.lease }

// heldByClaim reports whether a live claim may hold the key.
func heldByClaim(s linState, in linInput) bool { return s.status == linClaimed && mayLive(s, in) }

// count adds one failed claim when attempts are counted.
func (m linModel) count(a uint16) uint16 { return enginetest.Counted(a, m.maxAttempts) }

// poisoned reports an absent key whose attempts reached MaxAttempts.
func (m linModel) poisoned(s linState) bool { return enginetest.Poisoned(s.attempts, m.maxAttempts) }

// expire is a key after its claim's lease ended: free, the ended claim
// counted as an attempt (MaxAttempts: "released, or left to expire").
func (m linModel) expire(s linState) linState {
	n := s.calls()
	n.attempts, n.version = m.count(s.attempts), s.version
	return n
}

// free is an entity without its claim (a release, an ended lease, a
// restart): it keeps the version the claim would have replaced.
func free(s linState) linState {
	n := s.calls()
	n.version = s.version
	return n
}

// committed is the key committed with digest d and result r.
func committed(s linState, d engine.Digest, r string) linState {
	n := s.calls()
	n.status, n.digest, n.result = linCommitted, d, r
	return n
}

// newClaim is the state after a New answer to in.
func newClaim(s linState, in linInput, out linOutput) linState {
	s.status, s.owner, s.inst, s.until = linClaimed, in.claim, in.inst, out.leaseUntil
	s.cdigest, s.offered = in.digest, in.version
	s.digest, s.result = engine.Digest{}, ""
	return s
}

// leaseOK checks a New claim's lease end: Lease after the engine's time.
func (m linModel) leaseOK(in linInput, out linOutput) bool {
	return out.leaseUntil >= in.t0+m.lease && out.leaseUntil <= in.t1+m.lease
}

// conflicting reports a commit's digest that contradicts a claim's: both
// given and different (Conflict).
func conflicting(requested, stored engine.Digest) bool {
	return enginetest.Conflicts(requested, stored)
}

// acquirable is the key as a claim finds it once a claim whose lease
// ended is taken over, or false while a live claim holds it.
func (m linModel) acquirable(s linState, in linInput) (linState, bool) {
	if s.status != linClaimed {
		return s, true
	}
	if !mayEnd(s, in) {
		return s, false
	}
	return m.expire(s), true
}

// step returns every state the partition may be in after s and the
// operation (in, out); none if the operation cannot happen in s.
func (m linModel) step(s linState, in linInput, out linOutput) []linState {
	switch in.op {
	case linBegin:
		if in.global {
			s.pending |= 1 << in.slot
		} else {
			s.local[in.eng] |= 1 << in.slot
		}
		return one(s)
	case linEnd:
		s.pending &^= 1 << in.slot
		s.local[in.eng] &^= 1 << in.slot
		return one(s)
	case linRestart:
		if m.voidOnRestart && s.status == linClaimed {
			if in.class == linEntity {
				return one(free(s))
			}
			// Void, and not counted (DurableClaims: counted).
			n := s.calls()
			n.attempts = s.attempts
			if m.countOnRestart && in.class == linKey {
				n.attempts++
			}
			return one(n)
		}
		return one(s)
	}
	if out.err == linClosed {
		return one(s) // ErrClosed changed nothing
	}
	switch in.op {
	case linClaim:
		return m.claim(s, in, out)
	case linMark:
		return m.mark(s, in, out)
	case linCommit:
		return m.commit(s, in, out)
	case linRelease:
		return m.release(s, in, out)
	case linLookup:
		return m.lookup(s, in, out)
	case linForget:
		return m.forget(s, in, out)
	case linAdvance:
		return m.advance(s, in, out)
	case linIssue:
		switch {
		case s.status != linAbsent:
		case out.err == linOK:
			s.status = linIssued
			return one(s)
		case out.err == linLeaseLost && m.stalled(in):
			// Its claim of the token ended before the commit
			// (IssueToken: "fails with ErrLeaseLost and issues
			// nothing"): no token was handed out.
			return one(s)
		}
	case linConsume:
		return m.consume(s, in, out)
	}
	return nil
}

// busy answers an InFlight outcome: allowed, changing nothing, while
// another call holds the key or a claim does.
func busy(s linState, in linInput) []linState {
	if othersPending(s, in) || heldByClaim(s, in) {
		return one(s)
	}
	return nil
}

func (m linModel) claim(s linState, in linInput, out linOutput) []linState {
	switch {
	case out.err != linOK:
		return nil
	case out.outcome == engine.InFlight:
		return busy(s, in)
	}
	b, ok := m.acquirable(s, in)
	if !ok {
		return nil
	}
	switch {
	case b.status == linCommitted:
		want := engine.Duplicate
		if conflicting(in.digest, b.digest) {
			want = engine.Conflict
		}
		if out.outcome == want && out.result == b.result {
			return one(b)
		}
	case m.poisoned(b):
		if out.outcome == engine.Poison {
			return one(b)
		}
	case out.outcome == engine.New && m.leaseOK(in, out):
		return one(newClaim(b, in, out))
	}
	return nil
}

func (m linModel) mark(s linState, in linInput, out linOutput) []linState {
	if out.err != linOK {
		return nil
	}
	if out.outcome == engine.InFlight {
		var next []linState
		if othersPending(s, in) || heldByClaim(s, in) || m.stalled(in) {
			next = append(next, s)
		}
		if m.stalled(in) {
			// Its own claim ended before its commit: whoever takes the
			// key next counts that claim, after taking over the one that
			// held it before, if that one had ended.
			if b, ok := m.acquirable(s, in); ok && b.status == linAbsent {
				next = append(next, b, m.expire(b))
			}
		}
		return next
	}
	b, ok := m.acquirable(s, in)
	if !ok {
		return nil
	}
	switch {
	case b.status == linCommitted:
		want := engine.Duplicate
		if conflicting(in.digest, b.digest) {
			want = engine.Conflict
		}
		if out.outcome == want {
			return one(b)
		}
	case m.poisoned(b):
		if out.outcome == engine.Poison {
			return one(b)
		}
	case out.outcome == engine.New:
		return one(committed(s, in.digest, ""))
	}
	return nil
}

// owns reports whether in's claim is the key's current claim, made by the
// engine instance in goes to.
func owns(s linState, in linInput) bool {
	return s.status == linClaimed && s.owner == in.claim && s.inst == in.inst
}

func (m linModel) commit(s linState, in linInput, out linOutput) []linState {
	switch out.err {
	case linOK:
		if !owns(s, in) || !mayLive(s, in) {
			return nil
		}
		if in.class == linEntity {
			n := s.calls()
			n.version = s.offered
			return one(n)
		}
		return one(committed(s, s.cdigest, in.result))
	case linLeaseLost:
		// Invariant 2: only the current owner of an unexpired lease.
		if !owns(s, in) || mayEnd(s, in) {
			return one(s)
		}
		if m.retriedCopies && in.class != linEntity {
			return []linState{s, committed(s, s.cdigest, in.result)}
		}
	}
	return nil
}

func (m linModel) release(s linState, in linInput, out linOutput) []linState {
	switch out.err {
	case linOK:
		if !owns(s, in) || !mayLive(s, in) {
			return nil
		}
		if in.class == linEntity {
			return one(free(s)) // "Release ... keeps the one it replaced"
		}
		if m.broken == linBreakRelease {
			return one(committed(s, s.cdigest, ""))
		}
		n := s.calls()
		n.attempts = m.count(s.attempts)
		return one(n)
	case linLeaseLost:
		if !owns(s, in) || mayEnd(s, in) {
			return one(s)
		}
		if m.retriedCopies && in.class != linEntity {
			n := s.calls()
			n.attempts = m.count(s.attempts)
			return []linState{s, n}
		}
	}
	return nil
}

// info checks a Lookup's or Forget's report of the key b (not held).
func (m linModel) info(b linState, out linOutput) bool {
	switch {
	case b.status == linCommitted:
		return out.outcome == engine.Duplicate && out.digest == b.digest && out.result == b.result && out.attempts == 0
	case m.poisoned(b):
		return out.outcome == engine.Poison && out.attempts == b.attempts
	default:
		return out.outcome == engine.New && out.attempts == b.attempts
	}
}

func (m linModel) lookup(s linState, in linInput, out linOutput) []linState {
	switch {
	case out.err != linOK:
		return nil
	case out.outcome == engine.InFlight:
		return busy(s, in)
	}
	// What a claim would answer now: a claim whose lease ended counts as
	// an attempt. Lookup itself changes nothing.
	if b, ok := m.acquirable(s, in); ok && m.info(b, out) {
		return one(s)
	}
	if s.status == linAbsent && othersPending(s, in) && m.info(m.expire(s), out) {
		// The claim a running call took on its way (a mark's, a token
		// use's) ended before this Lookup, which counts it as a claim
		// would; nobody took the key over, so the call may still commit.
		return one(s)
	}
	return nil
}

func (m linModel) forget(s linState, in linInput, out linOutput) []linState {
	if m.retriedCopies && (out.err == linOK || out.err == linInFlightErr) {
		// A copy that applied may have removed the key before the copy
		// whose answer came back read it (then held, or changed by
		// others): the answer says nothing of what was removed.
		if _, ok := m.acquirable(s, in); ok {
			return []linState{s, s.calls()}
		}
		return one(s)
	}
	switch out.err {
	case linInFlightErr:
		if out.outcome == engine.InFlight && (othersPending(s, in) || heldByClaim(s, in)) {
			return one(s)
		}
	case linOK:
		if b, ok := m.acquirable(s, in); ok && m.info(b, out) {
			return one(s.calls())
		}
	}
	return nil
}

func (m linModel) advance(s linState, in linInput, out linOutput) []linState {
	switch {
	case out.err != linOK:
		return nil
	case out.outcome == engine.InFlight:
		return busy(s, in)
	}
	b := s
	if s.status == linClaimed {
		if !mayEnd(s, in) {
			return nil
		}
		b = free(s) // Advance takes an ended claim over; attempts are not counted
	}
	if out.version != b.version || out.outcome != enginetest.AdvanceOutcome(b.version, in.version) {
		return nil
	}
	if out.outcome != engine.New {
		return one(b)
	}
	if m.leaseOK(in, out) {
		return one(newClaim(b, in, out))
	}
	return nil
}

func (m linModel) consume(s linState, in linInput, out linOutput) []linState {
	switch out.err {
	case linOK:
		if s.status == linIssued {
			s.status = linUsed
			return one(s)
		}
	case linTokenUsed:
		if s.status == linUsed {
			return one(s)
		}
	case linInFlightErr:
		// "ErrInFlight while another call is consuming it (or when this
		// call stalled past the Lease before its use was durable)".
		if s.status != linAbsent && (othersPending(s, in) || m.stalled(in)) {
			return one(s)
		}
	}
	return nil
}

// partition groups a history by key; every restart belongs to all keys.
func linPartition(history []porcupine.Operation) [][]porcupine.Operation {
	byPart := map[string][]porcupine.Operation{}
	var restarts []porcupine.Operation
	for _, op := range history {
		in := op.Input.(linInput)
		if in.part == "*" {
			restarts = append(restarts, op)
			continue
		}
		byPart[in.part] = append(byPart[in.part], op)
	}
	names := make([]string, 0, len(byPart))
	for name := range byPart {
		names = append(names, name)
	}
	sort.Strings(names)
	out := make([][]porcupine.Operation, 0, len(names))
	for _, name := range names {
		ops := byPart[name]
		class := ops[0].Input.(linInput).class
		for _, r := range restarts {
			in := r.Input.(linInput)
			in.part, in.class = name, class
			r.Input = in
			ops = append(ops, r)
		}
		out = append(out, ops)
	}
	return out
}

// porcupine returns the model for porcupine, partitioned per key.
func (m linModel) porcupine() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: linPartition,
		Init:      func() []interface{} { return []interface{}{linState{}} },
		Step: func(state, input, output interface{}) []interface{} {
			var out linOutput
			if output != nil {
				out = output.(linOutput)
			}
			next := m.step(state.(linState), input.(linInput), out)
			states := make([]interface{}, len(next))
			for i, s := range next {
				states[i] = s
			}
			return states
		},
		Equal: func(a, b interface{}) bool { return a.(linState) == b.(linState) },
		Hash:  func(state interface{}) uint64 { return state.(linState).hash() },
		DescribeOperation: func(input, output interface{}) string {
			var out linOutput
			if output != nil {
				out = output.(linOutput)
			}
			return describeOp(input.(linInput), out)
		},
		DescribeState: func(state interface{}) string { return describeState(state.(linState)) },
	}
	return nm.ToModel()
}

// digestName names the test's digests.
func digestName(d engine.Digest) string {
	switch d {
	case engine.Digest{}:
		return "-"
	case linDigests[1]:
		return "A"
	case linDigests[2]:
		return "B"
	}
	return fmt.Sprintf("%x", d[:4])
}

func describeOp(in linInput, out linOutput) string {
	key := strings.TrimPrefix(strings.TrimPrefix(strings.TrimPrefix(in.part, "k:"), "e:"), "t:")
	var b strings.Builder
	switch in.op {
	case linBegin, linEnd:
		fmt.Fprintf(&b, "%v(slot %d)", in.op, in.slot)
		return b.String()
	case linRestart:
		return fmt.Sprintf("restart(engine %d)", in.claim)
	case linClaim:
		fmt.Fprintf(&b, "Claim(%s, d=%s, id=%d)", key, digestName(in.digest), in.claim)
	case linMark:
		fmt.Fprintf(&b, "Mark(%s, d=%s)", key, digestName(in.digest))
	case linCommit:
		fmt.Fprintf(&b, "Commit(%s, id=%d, r=%q)", key, in.claim, in.result)
	case linRelease:
		fmt.Fprintf(&b, "Release(%s, id=%d)", key, in.claim)
	case linLookup:
		fmt.Fprintf(&b, "Lookup(%s)", key)
	case linForget:
		fmt.Fprintf(&b, "Forget(%s)", key)
	case linAdvance:
		fmt.Fprintf(&b, "Advance(%s, v%d, id=%d)", key, in.version, in.claim)
	case linIssue:
		fmt.Fprintf(&b, "IssueToken(%s)", key)
	case linConsume:
		fmt.Fprintf(&b, "ConsumeToken(%s)", key)
	}
	fmt.Fprintf(&b, " @e%d", in.inst)
	b.WriteString(" -> ")
	if out.err != linOK {
		b.WriteString(out.err.String())
		if out.errText != "" && out.err == linOther {
			fmt.Fprintf(&b, " (%s)", out.errText)
		}
		if in.op != linForget {
			return b.String()
		}
		b.WriteString(" ")
	}
	switch in.op {
	case linCommit, linRelease, linIssue, linConsume:
		if out.err == linOK {
			b.WriteString("ok")
		}
		return b.String()
	}
	b.WriteString(out.outcome.String())
	switch {
	case in.op == linClaim && out.outcome == engine.New, in.op == linAdvance && out.outcome == engine.New:
		fmt.Fprintf(&b, " lease+%v", time.Duration(out.leaseUntil-in.t0))
	case in.op == linClaim && (out.outcome == engine.Duplicate || out.outcome == engine.Conflict):
		fmt.Fprintf(&b, " r=%q", out.result)
	case in.op == linLookup || in.op == linForget:
		fmt.Fprintf(&b, " d=%s r=%q att=%d", digestName(out.digest), out.result, out.attempts)
	}
	if in.op == linAdvance && out.outcome != engine.InFlight {
		fmt.Fprintf(&b, " stored v%d", out.version)
	}
	if in.slot >= 0 {
		fmt.Fprintf(&b, " [slot %d]", in.slot)
	}
	return b.String()
}

func describeState(s linState) string {
	var b strings.Builder
	switch s.status {
	case linAbsent:
		b.WriteString("absent")
	case linClaimed:
		fmt.Fprintf(&b, "claimed(id=%d @e%d, until %d", s.owner, s.inst, s.until)
		if s.offered != 0 {
			fmt.Fprintf(&b, ", offers v%d", s.offered)
		} else {
			fmt.Fprintf(&b, ", d=%s", digestName(s.cdigest))
		}
		b.WriteString(")")
	case linCommitted:
		fmt.Fprintf(&b, "committed(d=%s, r=%q)", digestName(s.digest), s.result)
	case linIssued:
		b.WriteString("issued")
	case linUsed:
		b.WriteString("used")
	}
	if s.attempts > 0 {
		fmt.Fprintf(&b, " att=%d", s.attempts)
	}
	if s.version > 0 {
		fmt.Fprintf(&b, " v%d", s.version)
	}
	if s.pending != 0 {
		fmt.Fprintf(&b, " pending=%b", s.pending)
	}
	for e, p := range s.local {
		if p != 0 {
			fmt.Fprintf(&b, " pending@engine%d=%b", e, p)
		}
	}
	return b.String()
}

// linVisualizeEnv names the variable that asks for porcupine's
// visualization of a history that fails, and the whole history of each key
// that fails as text: an existing directory to write them to, or any other
// value for the test's temporary directory (removed when the test ends).
const linVisualizeEnv = "TIERDEDUP_LINEARIZE_VIS"

// linCheck checks history against m within timeout and returns porcupine's
// verdict and, unless it is Ok, a readable account of each key whose
// history cannot be linearized.
func linCheck(t *testing.T, name string, m linModel, history []porcupine.Operation, timeout time.Duration) (porcupine.CheckResult, string) {
	t.Helper()
	model := m.porcupine()
	res, info := porcupine.CheckOperationsVerbose(model, history, timeout)
	if res == porcupine.Ok {
		return res, ""
	}
	var report strings.Builder
	if res == porcupine.Unknown {
		fmt.Fprintf(&report, "porcupine gave no verdict within %v for %d operations\n", timeout, len(history))
	}
	dir := os.Getenv(linVisualizeEnv)
	file := func(suffix string) string {
		return filepath.Join(dir, "linearizability-"+strings.NewReplacer("/", "_", " ", "_", ":", "_").Replace(name+suffix))
	}
	if dir != "" {
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			dir = t.TempDir()
		}
		path := file(".html")
		if err := porcupine.VisualizePath(model, info, path); err != nil {
			t.Logf("visualization: %v", err)
		} else {
			fmt.Fprintf(&report, "visualization: %s\n", path)
		}
	}
	single := m.porcupine()
	single.Partition = nil
	for _, part := range linPartition(history) {
		r, pinfo := porcupine.CheckOperationsVerbose(single, part, timeout)
		if r == porcupine.Ok {
			continue
		}
		report.WriteString(describeFailure(single, part, r, pinfo))
		if dir != "" {
			key := part[0].Input.(linInput).part
			path := file("-" + key + ".txt")
			if err := os.WriteFile(path, []byte(describeHistory(part)), 0o644); err != nil {
				t.Logf("history of %s: %v", key, err)
			} else {
				fmt.Fprintf(&report, "  its whole history: %s\n", path)
			}
		}
	}
	return res, report.String()
}

// describeFailure tells where one key's history stops being linearizable:
// the longest order of its operations the model accepts, the state it
// leaves, and the operations none of which can come next.
func describeFailure(model porcupine.Model, part []porcupine.Operation, res porcupine.CheckResult, info porcupine.LinearizationInfo) string {
	var b strings.Builder
	key := part[0].Input.(linInput).part
	fmt.Fprintf(&b, "\nkey %s: %v (%d operations)\n", key, res, len(part))
	var longest []porcupine.Operation
	for _, parts := range info.PartialLinearizationsOperations() {
		for _, p := range parts {
			if len(p) > len(longest) {
				longest = p
			}
		}
	}
	// The states after the longest prefix.
	state := model.Init()
	for _, op := range longest {
		_, state = model.Step(state, op.Input, op.Output)
	}
	from := max(0, len(longest)-12)
	fmt.Fprintf(&b, "  longest linearizable order: %d operations; its last %d:\n", len(longest), len(longest)-from)
	for _, op := range longest[from:] {
		fmt.Fprintf(&b, "    %s\n", describeTimed(op))
	}
	fmt.Fprintf(&b, "  state(s) then: %s\n", model.DescribeState(state))
	// The operations that could come next: called before the earliest
	// return among those not in the order.
	type opKey struct {
		call, ret int64
		in        linInput
	}
	done := map[opKey]bool{}
	for _, op := range longest {
		done[opKey{op.Call, op.Return, op.Input.(linInput)}] = true
	}
	var rest []porcupine.Operation
	minReturn := int64(1<<63 - 1)
	for _, op := range part {
		if !done[opKey{op.Call, op.Return, op.Input.(linInput)}] {
			rest = append(rest, op)
			minReturn = min(minReturn, op.Return)
		}
	}
	sort.Slice(rest, func(i, j int) bool { return rest[i].Call < rest[j].Call })
	b.WriteString("  none of these fits next:\n")
	lo, hi := int64(1<<63-1), int64(0)
	for _, op := range rest {
		if op.Call <= minReturn {
			fmt.Fprintf(&b, "    %s\n", describeTimed(op))
			lo, hi = min(lo, op.Call), max(hi, op.Return)
		}
	}
	// Every call (begin and end left out) that overlaps those, in the
	// order of the calls.
	sorted := append([]porcupine.Operation(nil), part...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Call < sorted[j].Call })
	b.WriteString("  the calls overlapping them:\n")
	shown := 0
	for _, op := range sorted {
		if in := op.Input.(linInput); in.op == linBegin || in.op == linEnd || op.Return < lo || op.Call > hi {
			continue
		}
		if shown++; shown > 40 {
			b.WriteString("    ...\n")
			break
		}
		fmt.Fprintf(&b, "    %s\n", describeTimed(op))
	}
	return b.String()
}

// describeHistory is every operation of one key, in the order of their
// calls.
func describeHistory(part []porcupine.Operation) string {
	sorted := append([]porcupine.Operation(nil), part...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Call < sorted[j].Call })
	var b strings.Builder
	for _, op := range sorted {
		b.WriteString(describeTimed(op))
		b.WriteByte('\n')
	}
	return b.String()
}

// describeTimed is an operation with its client, logical times and the
// fake clock around it.
func describeTimed(op porcupine.Operation) string {
	in := op.Input.(linInput)
	var out linOutput
	if op.Output != nil {
		out = op.Output.(linOutput)
	}
	clock := ""
	if in.t1 != in.t0 {
		clock = fmt.Sprintf(" clock +%v..+%v", time.Duration(in.t0-linEpoch), time.Duration(in.t1-linEpoch))
	} else if in.t0 != 0 {
		clock = fmt.Sprintf(" clock +%v", time.Duration(in.t0-linEpoch))
	}
	return fmt.Sprintf("[%d..%d] client %d: %s%s", op.Call, op.Return, in.client, describeOp(in, out), clock)
}
