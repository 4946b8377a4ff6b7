package pebble_test

import (
	"testing"

	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/pebble"
	"github.com/tierdedup/tierdedup/tier/tiertest"
)

// TestArchiveContract runs the archive contract suite over ArchiveDirs,
// each in a directory of its own.
func TestArchiveContract(t *testing.T) {
	tiertest.RunArchive(t, func(t *testing.T) tier.ArchiveBackend {
		dir := t.TempDir() // the same for every call within one check
		return pebble.ArchiveDir{Dir: dir}
	})
}
