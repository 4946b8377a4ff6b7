//go:build !race

package main

// Peak resident memory and disk are what the OS counts, and the race
// detector changes both (it keeps Pebble's memory on the Go heap and
// shadows every byte): this test runs in CI's pass without -race.

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/bench"
)

// businessKeys is a script, not one of dedupbench's generators, that
// writes structured business keys (tenant-NNNN/type/date/counter/event-vN)
// as a team would sample them from its own logs: argv[1] keys, one a line,
// from seed argv[2].
const businessKeys = `import random, sys
n, seed = int(sys.argv[1]), int(sys.argv[2])
random.seed(seed)
T = ["order", "invoice", "refund", "payment", "shipment", "ticket"]
out = sys.stdout
for i in range(n):
    out.write("tenant-%04d/%s/2026-%02d-%02d/%08d/event-v%d\n" % (random.randint(1, 2000), random.choice(T),
        random.randint(1, 12), random.randint(1, 28), i, random.randint(1, 3)))
`

// TestPlanAgreesWithOS plans a load from a sample of business keys a
// script wrote, then runs that load as `dedupbench run` in its own process
// under the GOMEMLIMIT the plan gives, and holds the plan and the run's
// own figures against what the OS counted for that process, as a capacity
// planner following docs/dedupbench.md would:
//   - peak RSS: the child's peak resident set (getrusage's ru_maxrss of
//     the waited-for process) against the plan's PeakRSSBytes (within
//     25 %) and the run's PeakRSSBytes (within 10 %);
//   - disk: the blocks allocated under the run's store directory, summed
//     as du does while the run goes (every 50 ms), through its second
//     simulated day, when the window is full, against the plan's
//     DiskBytes (within 25 %) and the run's own samples of
//     Stats.Store.DiskBytes over that day (medians, within 10 %).
//
// The run's keys are synthesised from the same sample (`run -sample`):
// the keys themselves would otherwise sit in the run's memory, which the
// plan does not count.
func TestPlanAgreesWithOS(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal("python3 writes this test's keys (a script outside dedupbench): ", err)
	}
	dir := t.TempDir()
	sample := filepath.Join(dir, "sample.txt")
	f, err := os.Create(sample)
	if err != nil {
		t.Fatal(err)
	}
	gen := exec.Command(py, "-c", businessKeys, "200000", "7")
	gen.Stdout = f
	if err := gen.Run(); err != nil {
		t.Fatalf("python3: %v: %s", err, stderrOf(err))
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	load := []string{"-window", "24h", "-partition", "6h", "-memory", "3e5", "-sample", sample}
	plan := command(t, append([]string{"plan", "-json", "-ids-per-day", "1e6", "-calibrate", "300000", "-calibrate-store", "2000000"}, load...)...)
	out, err := plan.Output()
	if err != nil {
		t.Fatalf("plan: %v: %s", err, stderrOf(err))
	}
	var pl bench.Plan
	if err := json.Unmarshal(out, &pl); err != nil {
		t.Fatal(err)
	}
	if pl.MemoryLimitBytes <= 0 || pl.PeakRSSBytes <= 0 || pl.DiskBytes <= 0 {
		t.Fatalf("plan: limit %v, peak RSS %v, disk %v", pl.MemoryLimitBytes, pl.PeakRSSBytes, pl.DiskBytes)
	}

	// The run's store is a temporary directory: under a TMPDIR of its
	// own, so that everything below it is the store.
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	run := command(t, append([]string{"run", "-json", "-keys", "2e6", "-span", "48h", "-every", "100ms"}, load...)...)
	run.Env = append(run.Env, "TMPDIR="+tmp, "GOMEMLIMIT="+strconv.FormatInt(int64(pl.MemoryLimitBytes), 10))
	var stdout, stderr syncBuffer
	run.Stdout, run.Stderr = &stdout, &stderr
	start := time.Now()
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	type diskAt struct {
		at   time.Duration
		disk int64
	}
	var disks []diskAt
	done := make(chan error, 1)
	go func() { done <- run.Wait() }()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
poll:
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("run: %v: %s", err, stderr.String())
			}
			break poll
		case <-tick.C:
			if b := int64(bench.Allocated(tmp)); b > 0 {
				disks = append(disks, diskAt{time.Since(start), b})
			}
		}
	}
	var res bench.Result
	if err := json.Unmarshal([]byte(stdout.String()), &res); err != nil {
		t.Fatal(err)
	}
	if err := res.Exactness(); err != nil {
		t.Fatal(err)
	}
	ru, ok := run.ProcessState.SysUsage().(*syscall.Rusage)
	if !ok {
		t.Fatal("no rusage for the run's process")
	}
	osPeak := float64(ru.Maxrss) * 1024 // KiB on Linux

	// The second simulated day: the run's clock follows the messages it
	// has processed, so the second half of its timed part (Elapsed, from
	// about when the store opened: the first sample) in wall time. Later
	// samples see the store closed and removed.
	if len(disks) < 10 {
		t.Fatalf("%d disk samples of the run's directory: too few to say what it held", len(disks))
	}
	from, to := disks[0].at+res.Elapsed/2, disks[0].at+res.Elapsed
	var second []float64
	for _, s := range disks {
		if s.at >= from && s.at <= to {
			second = append(second, float64(s.disk))
		}
	}
	var runSecond []float64
	for _, p := range res.Series {
		if p.SimTime.Sub(bench.Start) > 24*time.Hour && p.DiskBytes > 0 {
			runSecond = append(runSecond, float64(p.DiskBytes))
		}
	}
	if len(second) < 5 || len(runSecond) < 5 {
		t.Fatalf("%d samples of the OS and %d of the run through the second day: too few", len(second), len(runSecond))
	}
	slices.Sort(second)
	slices.Sort(runSecond)
	osDisk, runDisk := second[len(second)/2], runSecond[len(runSecond)/2]

	t.Logf("keys of %.1f B; GOMEMLIMIT %.1f MiB; the run %.0f keys/s", pl.KeyBytes, pl.MemoryLimitBytes/(1<<20), res.KeysPerSec)
	t.Logf("peak RSS: plan %.1f MiB (heap %.1f, off-heap %.1f, program %.1f), run %.1f MiB, OS %.1f MiB",
		pl.PeakRSSBytes/(1<<20), pl.HeapBytes/(1<<20), pl.OffHeapBytes/(1<<20), pl.ProgramBytes/(1<<20), float64(res.PeakRSSBytes)/(1<<20), osPeak/(1<<20))
	t.Logf("disk through the second day (medians): plan %.1f MiB (SSTs %.1f, WAL %.1f, filters %.1f); OS %.1f MiB (%.1f to %.1f over %d samples); run %.1f MiB (%.1f to %.1f over %d samples)",
		pl.DiskBytes/(1<<20), pl.TableBytes/(1<<20), pl.WALBytes/(1<<20), pl.FilterFileBytes/(1<<20),
		osDisk/(1<<20), second[0]/(1<<20), second[len(second)-1]/(1<<20), len(second),
		runDisk/(1<<20), runSecond[0]/(1<<20), runSecond[len(runSecond)-1]/(1<<20), len(runSecond))
	within(t, "peak RSS: plan vs OS", pl.PeakRSSBytes, osPeak, 0.25)
	within(t, "peak RSS: run vs OS", float64(res.PeakRSSBytes), osPeak, 0.10)
	within(t, "disk: plan vs OS through the second day", pl.DiskBytes, osDisk, 0.25)
	within(t, "disk: run (Stats.Store.DiskBytes) vs OS through the second day", runDisk, osDisk, 0.10)
}

// within fails the test when got is further than tol (a fraction) from
// want.
func within(t *testing.T, what string, got, want, tol float64) {
	t.Helper()
	if r := got / want; r < 1-tol || r > 1+tol {
		t.Errorf("%s: %.1f MiB against %.1f MiB, %.2f: beyond %.0f %%", what, got/(1<<20), want/(1<<20), r, 100*tol)
	}
}

// syncBuffer is a buffer a child process writes while the test reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	return len(p), nil
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

// stderrOf is the standard error an exec.ExitError kept.
func stderrOf(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return string(ee.Stderr)
	}
	return ""
}
