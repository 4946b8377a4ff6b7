package memory

import "github.com/tierdedup/tierdedup/tier"

// Status is the tiers' shared vocabulary (tier.Status), so the engine reads
// every tier's answers without translating them.
type Status = tier.Status

// Digest is a payload digest (tier.Digest), stored whole.
type Digest = tier.Digest
