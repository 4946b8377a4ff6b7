package bench

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/machine"
)

// Machine is what a plan must fit in: the memory the process may use and
// the disk free where the store will live.
type Machine struct {
	// MemoryBytes is the machine's memory, or its cgroup's limit when
	// lower; MemorySource says which ("/proc/meminfo MemTotal", the cgroup
	// file).
	MemoryBytes  float64
	MemorySource string
	// DiskBytes is the space free to an unprivileged user at DiskPath
	// (zero when unknown, and the disk is then not checked).
	DiskBytes float64
	DiskPath  string
	CPUs      int
}

// FitShare is the share of the machine's memory and free disk a plan may
// take and still fit: the rest is the Go runtime's room between
// collections (with GOMEMLIMIT set near the plan's heap), the page cache
// the store reads through, and everything else the machine runs.
const FitShare = 0.8

// DetectMachine reads this machine's memory (the cgroup's limit when one is
// set and lower: /sys/fs/cgroup/memory.max, or cgroup v1's
// memory.limit_in_bytes) and the free disk at dir (or its nearest existing
// parent).
func DetectMachine(dir string) (Machine, error) {
	m := Machine{CPUs: runtime.NumCPU()}
	var err error
	if m.MemoryBytes, m.MemorySource, err = machine.Memory(); err != nil {
		return m, err
	}
	if dir == "" {
		dir = "."
	}
	p, err := filepath.Abs(dir)
	if err != nil {
		return m, err
	}
	for {
		var st syscall.Statfs_t
		if err := syscall.Statfs(p, &st); err == nil {
			m.DiskBytes, m.DiskPath = float64(st.Bavail)*float64(st.Bsize), p
			break
		} else if !errors.Is(err, os.ErrNotExist) {
			return m, fmt.Errorf("free disk at %s: %w", p, err)
		}
		parent := filepath.Dir(p)
		if parent == p {
			break
		}
		p = parent
	}
	return m, nil
}

// procKB reads the line "key N kB" of a /proc file (machine.ProcKB).
var procKB = machine.ProcKB

// Fit is a plan checked against a machine: what it needs, whether it fits,
// and, when it does not, the changes that would make it fit.
type Fit struct {
	Machine Machine
	// MemoryBytes is the plan's heap and off-heap; DiskBytes its disk
	// (the store, the archive).
	MemoryBytes, DiskBytes float64
	// MemoryFits and DiskFits: within FitShare of the machine's (DiskFits
	// is true when the machine's free disk is unknown).
	MemoryFits, DiskFits bool
	// Changes are what would make a plan that does not fit fit, each with
	// its cost; empty when it fits.
	Changes []Change
}

// Fits reports whether the plan fits the machine.
func (f Fit) Fits() bool { return f.MemoryFits && f.DiskFits }

// Change is one way to make a plan fit, with the plan it leads to.
type Change struct {
	// What the user changes (a flag, a deployment), and what it costs.
	What, Cost string
	// Plan is the plan after the change (the same calibration), or the
	// unchanged plan for a change of the machine; MemoryFits and DiskFits
	// say whether it then fits the machine's memory and disk (the changed
	// one, for a change of the machine).
	Plan                 Plan
	MemoryFits, DiskFits bool
}

// Fits reports whether the change makes the plan fit.
func (c Change) Fits() bool { return c.MemoryFits && c.DiskFits }

// CheckFit checks pl against m and, when it does not fit, works out the
// changes that would make it fit: a higher false-positive target, a
// smaller memory tier, a shorter window, the load split over more
// processes (each on a machine like m), each replanned with pl's
// calibration; and the memory or disk the machine would need.
func CheckFit(pl Plan, m Machine) Fit {
	f := Fit{Machine: m}
	f.MemoryBytes, f.DiskBytes = needs(pl)
	f.MemoryFits, f.DiskFits = fits(pl, m)
	if f.Fits() {
		return f
	}
	in := pl.Input
	try := func(what, cost string, in PlanInput) {
		p, err := MakePlan(in, pl.Calibration)
		if err != nil {
			return
		}
		mf, df := fits(p, m)
		f.Changes = append(f.Changes, Change{What: what, Cost: cost, Plan: p, MemoryFits: mf, DiskFits: df})
	}
	memShare := FitShare * m.MemoryBytes
	if pl.BloomBytes > 0 && !f.MemoryFits {
		// The filters scale with -ln(fp): find the lowest target (of 1 %
		// steps of a decade) that fits.
		for _, fp := range []float64{0.02, 0.05, 0.1, 0.2, 0.3} {
			if fp <= in.FalsePositive {
				continue
			}
			c := in
			c.FalsePositive = fp
			if p, err := MakePlan(c, pl.Calibration); err == nil && func() bool { m, _ := needs(p); return m <= memShare }() || fp == 0.3 {
				try(fmt.Sprintf("-fp %g (from %g)", fp, in.FalsePositive),
					fmt.Sprintf("%.0f%% of new keys pass the filters and are read in the store instead of %.0f%%: more disk reads per new key, a lower keys/s than this plan's calibration (rerun plan with it)", 100*fp, 100*in.FalsePositive), c)
				break
			}
		}
	}
	// The window: every tier's keys scale with it.
	need := max(f.MemoryBytes/memShare, ratio(f.DiskBytes, FitShare*m.DiskBytes))
	if need > 1 {
		// The longest window of whole partitions that fits.
		for parts := pl.Live - 2; parts >= 1; parts-- {
			c := in
			c.Window = time.Duration(parts) * in.Partition
			c.DupReach = min(c.DupReach, c.Window)
			if p, err := MakePlan(c, pl.Calibration); err == nil {
				if mf, df := fits(p, m); (mf && df) || parts == 1 {
					try(fmt.Sprintf("-window %v (from %v)", c.Window, in.Window),
						fmt.Sprintf("a duplicate arriving more than %v after its first copy is answered New", c.Window), c)
					break
				}
			}
		}
		// Each process keeps its fixed share (the memory tier, the WAL,
		// Pebble's memtables) whatever its load: the fewest processes that
		// fit, from the bytes' ratio up.
		n := int(math.Ceil(need))
		c := in
		for last := 2*n + 16; ; n++ {
			c.IDsPerDay = in.IDsPerDay / float64(n)
			if p, err := MakePlan(c, pl.Calibration); err != nil || n == last {
				break
			} else if mf, df := fits(p, m); mf && df {
				break
			}
		}
		try(fmt.Sprintf("%d processes on %d machines like this one, each -ids-per-day %.3g", n, n, c.IDsPerDay),
			fmt.Sprintf("%d× the machines; the keys split by a stable hash (a Kafka partition, a key-routed queue), so each process sees every copy of its keys", n), c)
	}
	if pl.MemoryBytes > 0 && !f.MemoryFits && pl.MemoryBytes > 0.1*f.MemoryBytes {
		c := in
		c.MemoryCapacity = max(1024, in.MemoryCapacity/4)
		try(fmt.Sprintf("-memory %d (from %d)", c.MemoryCapacity, in.MemoryCapacity),
			"fewer recent duplicates answered from memory: more of them are read in the store", c)
	}
	if in.Shared == "" && in.Tiers == engine.Default {
		// The store on a shared PostgreSQL server: this process keeps
		// only its memory tier; the server holds the window.
		c := in
		c.Shared = SharedPostgres
		if p, err := MakePlan(c, Calibration{}); err == nil {
			mf, df := fits(p, m)
			f.Changes = append(f.Changes, Change{What: "-tiers postgres: the window in a PostgreSQL table that several such processes share",
				Cost: fmt.Sprintf("a server holding %.0f GiB of table and index (%.0f B a row before calibration), and its throughput, which this plan did not measure: run plan -tiers postgres -postgres URL", p.PostgresBytes/(1<<30), p.SharedBytesPerKey),
				Plan: p, MemoryFits: mf, DiskFits: df})
		}
	}
	// The machine itself.
	if !f.MemoryFits {
		bigger := m
		bigger.MemoryBytes = f.MemoryBytes / FitShare
		_, df := fits(pl, bigger)
		f.Changes = append(f.Changes, Change{What: fmt.Sprintf("a machine (or a cgroup limit) with %.1f GiB of memory", bigger.MemoryBytes/(1<<30)),
			Cost: fmt.Sprintf("the memory; with GOMEMLIMIT=%s as the plan assumes", memLimit(pl.MemoryLimitBytes)), Plan: pl, MemoryFits: true, DiskFits: df})
	}
	if !f.DiskFits {
		bigger := m
		bigger.DiskBytes = f.DiskBytes / FitShare
		mf, _ := fits(pl, bigger)
		f.Changes = append(f.Changes, Change{What: fmt.Sprintf("%.0f GiB free at %s (or -dir on a disk that has it)", bigger.DiskBytes/(1<<30), m.DiskPath),
			Cost: "the disk", Plan: pl, MemoryFits: mf, DiskFits: true})
	}
	return f
}

// needs is what pl takes of memory (its peak RSS with GOMEMLIMIT set as
// it says) and disk.
func needs(pl Plan) (memory, disk float64) {
	mem := pl.PeakRSSBytes
	if mem == 0 {
		mem = pl.HeapBytes + pl.OffHeapBytes
	}
	return mem, pl.DiskBytes + pl.ArchiveDiskBytes
}

// fits checks pl's memory and disk against FitShare of m's.
func fits(pl Plan, m Machine) (memory, disk bool) {
	mem, d := needs(pl)
	memory = mem <= FitShare*m.MemoryBytes
	disk = m.DiskBytes == 0 || d <= FitShare*m.DiskBytes
	return memory, disk
}

// memLimit writes a GOMEMLIMIT value: whole MiB, or GiB when exact.
func memLimit(b float64) string {
	mib := int64(math.Ceil(b / (1 << 20)))
	if mib%1024 == 0 {
		return fmt.Sprintf("%dGiB", mib/1024)
	}
	return fmt.Sprintf("%dMiB", mib)
}

// peakRSS is the process's peak resident memory (VmHWM of
// /proc/self/status), 0 where the OS does not say.
func peakRSS() uint64 {
	b, err := procKB("/proc/self/status", "VmHWM:")
	if err != nil {
		return 0
	}
	return uint64(b)
}

// ratio is a/b, or 0 when b is 0 (unknown).
func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}
