package bench

import (
	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// embeddedIn returns the embedded store's Backend that o names, nil when
// it names none (memory-only, or a shared tier).
func embeddedIn(o *engine.Options) *embedded.Backend {
	b, _ := o.Backend.(*embedded.Backend)
	return b
}

// backendFor returns the Backend a configuration of tiers runs on with
// its files in dir: the embedded store in dir (Default), its filters
// alone (BloomOnly, their state in dir when it is set), nothing
// (MemoryOnly, or Default with no dir yet: Run makes one).
func backendFor(tiers engine.Tiers, dir string) tier.Backend {
	switch {
	case tiers == engine.BloomOnly:
		return &embedded.Backend{Dir: dir}
	case tiers == engine.Default && dir != "":
		return embedded.Dir(dir)
	}
	return nil
}
