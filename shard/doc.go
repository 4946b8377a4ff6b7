// Package shard is the only place where a key becomes numbers: it hashes a
// namespaced key once into a 128-bit Fingerprint and maps fingerprints onto
// lock stripes with a per-store secret.
//
// It must never depend on another tierdedup package, keep state between calls
// or decide whether a key was seen: it only names keys.
//
// # Concurrency
//
// Sum is a pure function; a Router is immutable after NewRouter and safe for
// concurrent use.
//
// # Invariants
//
//  1. Sum is frozen: golden vectors in the tests pin it, because the Bloom
//     snapshots and every in-memory answer depend on it.
//  2. The namespace is length-prefixed into the hash, so ("ab","c") and
//     ("a","bc") never share a fingerprint by construction.
//  3. Stripe choice depends on a secret chosen per store, so keys crafted to
//     collide in the unkeyed hash still spread over all stripes.
package shard
