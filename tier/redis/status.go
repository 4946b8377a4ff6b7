package redis

import "github.com/tierdedup/tierdedup/tier"

// Status is the tiers' shared vocabulary (tier.Status), so the engine reads
// every tier's answers without translating them.
type Status = tier.Status

// Digest is a payload digest (tier.Digest), stored whole.
type Digest = tier.Digest

// Token is a claim's owner token (tier.Token).
type Token = tier.Token

// The Store is the shared exact tier.
var (
	_ tier.Exact        = (*Store)(nil)
	_ tier.ResultKeeper = (*Store)(nil)
	_ tier.Looker       = (*Store)(nil)
	_ tier.Forgetter    = (*Store)(nil)
	_ tier.Advancer     = (*Store)(nil)
)
