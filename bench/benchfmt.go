package bench

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
)

// PrintBenchHeader writes the configuration lines of the Go benchmark
// format for runs of rc: benchstat shows them above its table, so two
// files made with different workloads or engines say how they differ.
func PrintBenchHeader(w io.Writer, rc RunConfig) {
	c, o := rc.Workload, rc.Engine.WithDefaults()
	fmt.Fprintf(w, "goos: %s\ngoarch: %s\npkg: github.com/tierdedup/tierdedup/cmd/dedupbench\n", runtime.GOOS, runtime.GOARCH)
	if cpu := cpuName(); cpu != "" {
		fmt.Fprintf(w, "cpu: %s\n", cpu)
	}
	fmt.Fprintf(w, "tiers: %s\nkeys: %d\nshape: %s\ndup: %g\nreach: %v\nspan: %v\ninbatch: %g\nzipf: %g\nseed: %d\n",
		rc.TiersName(), c.Keys, c.KeysName(), c.DupRatio, c.DupReach, c.Span, c.InBatchRepeat, c.Zipf, c.Seed)
	nosync := false
	if b := embeddedIn(&o); b != nil {
		nosync = b.NoSync
	}
	fmt.Fprintf(w, "window: %v\npartition: %v\nfp: %g\nmemory: %d\nnosync: %t\n", o.Window, o.Partition, o.FalsePositive, o.MemoryCapacity, nosync)
	batch, workers := rc.Batch, rc.Workers
	if batch <= 0 {
		batch = 256
	}
	if workers <= 0 {
		workers = 4 * runtime.GOMAXPROCS(0)
	}
	fmt.Fprintf(w, "batch: %d\nworkers: %d\nrate: %g\n", batch, workers, rc.Rate)
}

// PrintBench writes one run as a line of the Go benchmark format: the
// measured keys as iterations, ns per key, and the run's figures as
// further metrics, for benchstat to compare across runs and files. Every
// run is named BenchmarkRun, whatever its configuration (the header's
// lines say it), so that benchstat lines up two files made with different
// flags or code.
func PrintBench(w io.Writer, r *Result) {
	name := "BenchmarkRun"
	nsPerKey := 0.0
	if r.Measured > 0 {
		nsPerKey = float64(r.Elapsed.Nanoseconds()) / float64(r.Measured)
	}
	fmt.Fprintf(w, "%s-%d\t%d\t%.1f ns/op\t%.0f keys/s\t%d p50-ns/batch\t%d p99-ns/batch\t%d p999-ns/batch\t%.1f heap-B/key",
		name, runtime.GOMAXPROCS(0), r.Measured, nsPerKey, r.KeysPerSec,
		r.BatchLatency.P50.Nanoseconds(), r.BatchLatency.P99.Nanoseconds(), r.BatchLatency.P999.Nanoseconds(), r.HeapBytesPerKey)
	if r.DiskBytes > 0 {
		fmt.Fprintf(w, "\t%.1f disk-B/key", r.DiskBytesPerKey)
	}
	if r.BloomFPConfigured > 0 {
		fmt.Fprintf(w, "\t%.6f bloom-fp", r.BloomFPMeasured)
	}
	if r.Shared != nil {
		fmt.Fprintf(w, "\t%.1f server-B/key", r.Shared.BytesPerKey)
	}
	fmt.Fprintln(w)
}

// cpuName is the processor's model name, as go test prints it.
func cpuName() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
