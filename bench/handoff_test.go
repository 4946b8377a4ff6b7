package bench_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// BenchmarkHandoff measures what moving a partition's dedup state costs:
// b.N keys marked in one engine (before the timer), then one Export to a
// directory on the same file system and one Import of it into another
// engine directory, and the Open of the imported copy (as after a crash:
// sealed filters load, the open partition is rebuilt from the store,
// until warm). It reports the export's bytes per key and the seconds per
// million keys of each step; keys/s is keys moved per second of
// export + import + open.
func BenchmarkHandoff(b *testing.B) {
	ctx := context.Background()
	root := b.TempDir()
	src := filepath.Join(root, "src")
	e, err := engine.Open(&engine.Options{Backend: embedded.Dir(src), ExpectedKeys: max(b.N, 1000), Logger: quietEngine})
	if err != nil {
		b.Fatal(err)
	}
	ks := keys(b, b.N)
	out := make([]engine.Outcome, 256)
	for i := 0; i < len(ks); i += 256 {
		batch := ks[i:min(i+256, len(ks))]
		if err := e.MarkBatch(ctx, batch, nil, out[:len(batch)]); err != nil {
			b.Fatal(err)
		}
	}
	if err := e.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	t0 := time.Now()
	info, err := e.Export(ctx, filepath.Join(root, "export"), 1)
	if err != nil {
		b.Fatal(err)
	}
	t1 := time.Now()
	dstOpts := engine.Options{Backend: embedded.Dir(filepath.Join(root, "dst")), ExpectedKeys: max(b.N, 1000), Logger: quietEngine}
	if _, err := embedded.Dir(filepath.Join(root, "dst")).Import(ctx, filepath.Join(root, "export"), engine.DefaultWindow, engine.DefaultPartition, 0); err != nil {
		b.Fatal(err)
	}
	t2 := time.Now()
	dst, err := engine.Open(&dstOpts)
	if err != nil {
		b.Fatal(err)
	}
	for dst.Stats().Bloom.Mode != "warm" {
		time.Sleep(time.Millisecond)
	}
	t3 := time.Now()
	b.StopTimer()
	_ = dst.Close()
	_ = e.Close()
	perM := func(d time.Duration) float64 { return d.Seconds() / float64(b.N) * 1e6 }
	b.ReportMetric(float64(info.Bytes)/float64(b.N), "bytes/key")
	b.ReportMetric(perM(t1.Sub(t0)), "export-s/Mkeys")
	b.ReportMetric(perM(t2.Sub(t1)), "import-s/Mkeys")
	b.ReportMetric(perM(t3.Sub(t2)), "open-warm-s/Mkeys")
	b.ReportMetric(float64(b.N)/t3.Sub(t0).Seconds(), "keys/s")
}
