package tier

import (
	"context"
	"errors"
	"testing"
)

// noArchive is an archive backend whose archiver is never linked.
type noArchive struct{ ArchiveBackend }

func (noArchive) Name() string { return "none" }

// TestOpenArchiverUnlinked: without an archiver registered (a program
// that does not link tier/archive), opening one is refused with
// ErrOptions, naming the package to import, and nothing is opened.
func TestOpenArchiverUnlinked(t *testing.T) {
	if archiverOpener.Load() != nil {
		t.Fatal("an archiver is registered in package tier's own tests")
	}
	a, err := OpenArchiver(context.Background(), noArchive{}, ArchiveEnv{}, ArchiverConfig{})
	if !errors.Is(err, ErrOptions) || a != nil {
		t.Fatalf("OpenArchiver with none linked: %v, %v; want ErrOptions", a, err)
	}
}
