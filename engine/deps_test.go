package engine_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestEngineLinksNoStore: the engine names no store and no archive, so a
// program that uses only the engine (memory-only) links none of their
// libraries or code. Every store reaches it as a tier.Backend built in the
// store's own package, an archive as a tier.Archiver (tier.OpenArchiver).
func TestEngineLinksNoStore(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/tierdedup/tierdedup/engine").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	for _, d := range deps {
		for _, heavy := range []string{
			"github.com/cockroachdb/", // Pebble and what it brings
			"github.com/getsentry/",
			"github.com/prometheus/",
			"github.com/redis/",
			"github.com/jackc/",
			"github.com/tierdedup/tierdedup/tier/embedded",
			"github.com/tierdedup/tierdedup/tier/pebble",
			"github.com/tierdedup/tierdedup/tier/archive",
		} {
			if strings.HasPrefix(d, heavy) {
				t.Errorf("the engine links %s", d)
			}
		}
	}
	if len(deps) > 150 {
		t.Errorf("the engine links %d packages, want at most 150", len(deps))
	}
	t.Logf("the engine links %d packages", len(deps))
}
