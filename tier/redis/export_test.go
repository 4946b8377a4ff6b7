package redis

import (
	"context"
	"time"
)

// ClaimScriptHashes are the SHA1s of the scripts that make a claim (each
// form of claimScript), for tests that must recognise a
// claim on the wire.
func ClaimScriptHashes() []string {
	var h []string
	for _, ks := range []*keyScript{claimScript} {
		h = append(h, ks.one.Hash(), ks.many.Hash())
	}
	return h
}

// SettleMarks settles marks whose replies were lost, as Mark does: the
// claim script with each mark's committed value, then (Cluster, Ring) the
// forgotten set.
func (s *Store) SettleMarks(ctx context.Context, reqs []Request, out []Result) error {
	if err := s.claimScripted(ctx, reqs, time.Millisecond, true, 0, out); err != nil {
		return err
	}
	if !s.sharded {
		return nil
	}
	idx := make([]int, len(reqs))
	for i := range idx {
		idx[i] = i
	}
	return s.forgottenAfter(ctx, reqs, out, idx)
}
