package engine_test

import (
	"testing"

	"github.com/tierdedup/tierdedup/internal/enginetest"
)

// TestConformance drives the engine's own configurations (memory, Bloom,
// the embedded default, with crashes and storage faults) through the
// conformance suite and its reference model (enginetest.Conformance);
// each shared tier runs the same suite beside its backend.
func TestConformance(t *testing.T) {
	for _, cfg := range enginetest.ConformanceConfigs {
		t.Run(cfg.Name, func(t *testing.T) { enginetest.Conformance(t, cfg) })
	}
}

// Ageing a shared tier's own clock with the test's (enginetest.AgeRedis,
// enginetest.AgePostgres).
var (
	ageRedis    = enginetest.AgeRedis
	agePostgres = enginetest.AgePostgres
)
