package engine

import (
	"fmt"
	"math/bits"
	"strings"

	"github.com/tierdedup/tierdedup/tier"
)

// Need names a kind of call that not every configuration serves. A
// program lists the ones it makes in Options.Needs, and Open refuses
// (ErrOptions) a configuration that cannot serve one, so the mismatch shows
// when the program starts, not at its first such call, perhaps in
// production hours later. Each call refuses it the same way whether or not
// it was listed (Engine.Serves is the one place that decides).
type Need uint16

const (
	// NeedLookup: Lookup and LookupBatch. Not bloom-only, which cannot
	// tell a key it saw from a false positive.
	NeedLookup Need = 1 << iota
	// NeedForget: Forget and ForgetBatch. Exact tiers; with a shared tier,
	// Options.NoSharedCache (another process would answer from its cached
	// commit).
	NeedForget
	// NeedAdvance: Advance and AdvanceBatch. An exact tier that compares
	// versions: the embedded store, or a Backend that offers it.
	NeedAdvance
	// NeedResults: a Result stored with a commit (Claim.Result, DoResult,
	// the HTTP middleware's responses). A tier that stores results.
	NeedResults
	// NeedTokens: IssueToken and ConsumeToken. An exact tier.
	NeedTokens
	// NeedExtend: Extend (and Keep's heartbeat). With a shared tier, one
	// that extends leases.
	NeedExtend
	// NeedWrites: CommitBatchWith, CommitBatchAsync with writes and
	// ScanWrites. A tier that writes records with commits: the embedded
	// store.
	NeedWrites
	// NeedHandoff: Export and Compact. The embedded store.
	NeedHandoff

	needEnd
	needAll = needEnd - 1
)

// needNames are the calls each Need names, in bit order.
var needNames = [...]string{"Lookup", "Forget", "Advance", "Results", "Tokens", "Extend", "Writes", "Handoff"}

// String names n's needs, joined by "|".
func (n Need) String() string {
	if n == 0 {
		return "none"
	}
	var names []string
	for b := n; b != 0; b &= b - 1 {
		i := bits.TrailingZeros16(uint16(b))
		if i < len(needNames) {
			names = append(names, needNames[i])
		} else {
			names = append(names, fmt.Sprintf("Need(%#x)", uint16(1)<<i))
		}
	}
	return strings.Join(names, "|")
}

// Serves reports, as ErrOptions naming it, the first of n that this
// engine's configuration cannot serve; nil when it serves them all.
func (e *Engine) Serves(n Need) error {
	if n&^needAll != 0 {
		return fmt.Errorf("%w: unknown need %s", ErrOptions, n&^needAll)
	}
	for b := n; b != 0; b &= b - 1 {
		one := Need(1) << bits.TrailingZeros16(uint16(b))
		if err := e.serve(one, one.String()); err != nil {
			return err
		}
	}
	return nil
}

// serve is Serves for one need, the refusal naming op (the call made).
func (e *Engine) serve(n Need, op string) error {
	shared := e.where == tier.ClaimsInStore
	var what string
	switch n {
	case NeedLookup:
		if e.tiers == BloomOnly {
			what = "exact tiers"
		}
	case NeedForget:
		switch {
		case e.tiers == BloomOnly:
			what = "exact tiers"
		case shared && !e.noSharedCache:
			return fmt.Errorf("%w: %s with a shared tier needs Options.NoSharedCache (another process would answer from its cached commit)", ErrOptions, op)
		}
	case NeedAdvance:
		if e.exact == nil || (shared && e.advancer == nil) {
			what = "an exact tier that can compare versions (the embedded store or a Backend that offers it)"
		}
	case NeedResults:
		if !e.results {
			what = "a tier that stores results"
		}
	case NeedTokens:
		if e.exact == nil {
			what = "an exact tier (Default or a Backend)"
		}
	case NeedExtend:
		if shared && e.extender == nil {
			what = "a shared tier that extends leases"
		}
	case NeedWrites:
		if e.writer == nil {
			what = "a tier that writes with commits (the embedded store)"
		}
	case NeedHandoff:
		if e.handoff == nil || e.exact == nil {
			what = "the embedded store"
		}
	}
	if what != "" {
		return fmt.Errorf("%w: %s needs %s, have %s", ErrOptions, op, what, e.name)
	}
	return nil
}
