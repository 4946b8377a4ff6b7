package archive

import (
	"context"
	"errors"
	"testing"

	"github.com/tierdedup/tierdedup/tier"
)

// drainingLog is a log and its archive that another process drains by one
// entry after every read either makes: it applies the entry, then trims
// it, so the trim mark is never past the applied position at any moment.
type drainingLog struct {
	tier.ArchiveLog
	tier.ArchiveAppender
	applied, trimmed uint64
}

func (d *drainingLog) drain() { d.applied++; d.trimmed = d.applied }

func (d *drainingLog) LogTail(context.Context) (tier.LogPos, tier.LogPos, int64, error) {
	defer d.drain()
	return tier.LogPos{MS: d.applied + 10}, tier.LogPos{MS: d.trimmed}, 10, nil
}

func (d *drainingLog) Applied(context.Context) (tier.LogPos, int64, error) {
	defer d.drain()
	return tier.LogPos{MS: d.applied}, 7, nil
}

// TestOpenWhileAnotherDrains: an engine opening beside a drainer takes
// the right archive for the right one, whatever the drainer does between
// its reads (read the applied position first, and a drain between the
// reads made the archive look older than the log: Open failed with
// ErrLayout), and refuses an archive that lacks what was trimmed.
func TestOpenWhileAnotherDrains(t *testing.T) {
	d := &drainingLog{applied: 5, trimmed: 5}
	for i := range 3 {
		next, err := appliedPastTrim(context.Background(), d, d)
		if err != nil || next != 7 {
			t.Fatalf("open %d beside a drainer: %d, %v, want 7, nil", i, next, err)
		}
	}
	old := &drainingLog{applied: 5, trimmed: 9}
	if _, err := appliedPastTrim(context.Background(), old, old); !errors.Is(err, tier.ErrLayout) {
		t.Fatalf("an archive that lacks what was trimmed: %v, want ErrLayout", err)
	}
}
