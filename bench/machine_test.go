package bench

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
)

// twoBillion is the plan of 2e9 IDs a day over the default week, on a
// calibration of fixed figures (no run).
func twoBillion(t *testing.T) Plan {
	t.Helper()
	in := PlanInput{IDsPerDay: 2e9, Window: 7 * 24 * time.Hour, Partition: 24 * time.Hour, DupRatio: 0.1, DupReach: time.Hour,
		Shape: UUIDv4, FalsePositive: 0.01, Tiers: engine.Default, MemoryCapacity: 1 << 20}
	cal := Calibration{KeysPerSec: 300_000, StoreKeys: 4_000_000, TableBytesPerKey: 40, WALBytesPerKey: 60, WALFileKeys: 1e6}
	pl, err := MakePlan(in, cal)
	if err != nil {
		t.Fatal(err)
	}
	return pl
}

const gib = 1 << 30

// TestCheckFitNamesChangesThatFit: a plan whose filters alone take more
// than the machine's memory does not fit, and at least two of the changes
// offered fit when replanned, each one verified here from its own plan.
func TestCheckFitNamesChangesThatFit(t *testing.T) {
	pl := twoBillion(t)
	m := Machine{MemoryBytes: 24 * gib, MemorySource: "test", DiskBytes: 4096 * gib, DiskPath: "/test"}
	f := CheckFit(pl, m)
	if f.Fits() || f.MemoryFits || !f.DiskFits {
		t.Fatalf("a plan of %.1f GiB of heap on a 24 GiB machine: fits %v (memory %v, disk %v)", pl.HeapBytes/gib, f.Fits(), f.MemoryFits, f.DiskFits)
	}
	fitting := 0
	var kinds []string
	for _, c := range f.Changes {
		mem, disk := needs(c.Plan)
		t.Logf("%s: memory %.2f GiB, disk %.0f GiB, fits %v", c.What, mem/gib, disk/gib, c.Fits())
		if c.Cost == "" {
			t.Errorf("%s: no cost stated", c.What)
		}
		if strings.HasPrefix(c.What, "a machine") {
			continue // a change of the machine, not of the plan
		}
		if got := mem <= FitShare*m.MemoryBytes; got != c.MemoryFits {
			t.Errorf("%s: memory %.2f GiB on %.0f GiB reported fitting %v", c.What, mem/gib, m.MemoryBytes/gib, c.MemoryFits)
		}
		if c.Fits() {
			fitting++
			kinds = append(kinds, strings.Fields(c.What)[0])
		}
		if strings.HasPrefix(c.What, "-fp") && !(c.Plan.Input.FalsePositive > pl.Input.FalsePositive && c.Plan.BloomBytes < pl.BloomBytes) {
			t.Errorf("%s: target %v, filters %.1f GiB against %v, %.1f GiB", c.What, c.Plan.Input.FalsePositive, c.Plan.BloomBytes/gib, pl.Input.FalsePositive, pl.BloomBytes/gib)
		}
	}
	if fitting < 2 {
		t.Fatalf("%d changes of the plan fit (%v), want at least 2", fitting, kinds)
	}
	// On a machine twice as large in memory, the same plan fits and
	// offers nothing.
	m.MemoryBytes = 2 * pl.HeapBytes / FitShare
	if f := CheckFit(pl, m); !f.Fits() || len(f.Changes) != 0 {
		t.Fatalf("on %.0f GiB: fits %v, %d changes", m.MemoryBytes/gib, f.Fits(), len(f.Changes))
	}
}

// TestCheckFitDisk: a store larger than the free disk does not fit, and
// the changes that fit it bring the disk under the machine's share.
func TestCheckFitDisk(t *testing.T) {
	pl := twoBillion(t)
	m := Machine{MemoryBytes: 1024 * gib, MemorySource: "test", DiskBytes: 100 * gib, DiskPath: "/test"}
	f := CheckFit(pl, m)
	if f.Fits() || !f.MemoryFits || f.DiskFits {
		t.Fatalf("%.0f GiB of disk on 100 GiB free: memory fits %v, disk fits %v", f.DiskBytes/gib, f.MemoryFits, f.DiskFits)
	}
	found := false
	for _, c := range f.Changes {
		if _, disk := needs(c.Plan); c.DiskFits && !strings.Contains(c.What, "free at") && disk > FitShare*m.DiskBytes {
			t.Errorf("%s: disk %.0f GiB reported fitting 100 GiB", c.What, disk/gib)
		}
		found = found || c.Fits() && strings.Contains(c.What, "processes")
	}
	if !found {
		t.Fatalf("no split over processes that fits: %+v", f.Changes)
	}
	// Unknown free disk is not checked.
	m.DiskBytes = 0
	if f := CheckFit(pl, m); !f.Fits() {
		t.Fatalf("unknown disk: fits %v", f.Fits())
	}
}

// TestDetectMachine reads this machine: its memory (internal/machine), and
// the free disk at a directory that does not exist yet (its nearest
// parent's).
func TestDetectMachine(t *testing.T) {
	dir := t.TempDir()
	m, err := DetectMachine(filepath.Join(dir, "not", "yet"))
	if err != nil {
		t.Fatal(err)
	}
	if m.MemoryBytes < 64<<20 || m.MemorySource == "" || m.DiskBytes <= 0 || m.DiskPath != dir || m.CPUs < 1 {
		t.Fatalf("machine %+v", m)
	}
}

// TestCheckFitProcessesFit: the load split over processes is offered with
// the fewest processes that fit, each keeping its fixed share (memory
// tier, WAL, memtables) whatever its load: on machines of many sizes
// where the plan does not fit, that change fits.
func TestCheckFitProcessesFit(t *testing.T) {
	in := twoBillion(t).Input
	in.IDsPerDay = 2e10
	// A store with a fixed gibibyte of disk beside its tables and WAL.
	pl, err := MakePlan(in, Calibration{KeysPerSec: 300_000, StoreKeys: 4_000_000, TableBytesPerKey: 40, WALBytesPerKey: 60, WALFileKeys: 1e6, FixedDiskBytes: gib})
	if err != nil {
		t.Fatal(err)
	}
	for _, mem := range []float64{4, 8, 16, 24} {
		for disk := 20.0; disk <= 400; disk *= 1.37 {
			m := Machine{MemoryBytes: mem * gib, MemorySource: "test", DiskBytes: disk * gib, DiskPath: "/test"}
			f := CheckFit(pl, m)
			if f.Fits() {
				continue
			}
			found := false
			for _, c := range f.Changes {
				if strings.Contains(c.What, "processes on") {
					found = true
					if !c.Fits() {
						mb, db := needs(c.Plan)
						t.Errorf("%.0f GiB of memory, %.0f GiB of disk: %s needs %.2f GiB and %.1f GiB: does not fit", mem, disk, c.What, mb/gib, db/gib)
					}
				}
			}
			if !found {
				t.Errorf("%.0f GiB of memory, %.0f GiB of disk: no split over processes offered", mem, disk)
			}
		}
	}
}
