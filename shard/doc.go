// Package shard is the only place where a key becomes numbers: it hashes a
// namespaced key once into a 128-bit keyed Fingerprint and maps fingerprints
// onto lock stripes with a per-process secret.
//
// It must never depend on another tierdedup package, keep state between calls
// or decide whether a key was seen: it only names keys.
//
// # Concurrency
//
// Sum is a pure function; a Hasher and a Router are immutable values, safe
// for concurrent use.
//
// # Invariants
//
//  1. Sum is frozen: golden vectors under a fixed test secret pin it,
//     because the Bloom snapshots and every in-memory answer depend on it.
//  2. Sum is keyed (SipHash-2-4-128 under a 128-bit secret): nobody without
//     the secret can construct two keys with equal fingerprints, so a
//     fingerprint match is evidence of the same key, not an attack.
//  3. The namespace is length-prefixed into the hash, so ("ab","c") and
//     ("a","bc") never share a fingerprint by construction.
//  4. Stripe choice depends on a secret chosen per store, so keys crafted to
//     collide in the unkeyed hash still spread over all stripes.
package shard
