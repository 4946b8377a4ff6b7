//go:build !race

package main

// The crash table and the recovery run, real processes killed at scale,
// run without -race: under it they took 61 s and 32 s of the package's
// 167 s, and they test what a kill leaves on disk, not data races (the
// code they run is raced by the engine's and the stores' own tests). CI
// runs them in its pass without -race (.ci/test).

import (
	"context"
	"math/rand/v2"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/bench"
	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// TestCrashTable reproduces the crash table with real processes killed by
// SIGKILL ten times, with offsets committed to a file and to a Kafka
// consumer group (an in-process cluster; the ledger row through
// kafkadedup, its offset stored with its marks), at random messages of 2000 (offsets every 100), some
// before a message and some between its effect and its mark (for the
// ledger strategy: inside the one write that does both), and asserts every
// row against what the kill points imply: committing the offset first
// loses the uncommitted tails, processing first repeats them, the engine
// with a separate effect repeats exactly the kills that fell after an
// effect, and the effect written in the engine's commit repeats and loses
// nothing.
func TestCrashTable(t *testing.T) {
	child := func(a ...string) *exec.Cmd { return command(t, append([]string{"crash-child"}, a...)...) }
	cfg := bench.CrashConfig{Messages: 2000, Every: 100, Kills: bench.RandomKills(2000, 100, 10, rand.New(rand.NewPCG(1, 0)))}
	after := 0
	for _, k := range cfg.Kills {
		if k.AfterEffect {
			after++
		}
	}
	if after == 0 || after == len(cfg.Kills) {
		t.Fatalf("kills %+v: want some between an effect and its mark, some before a message", cfg.Kills)
	}
	for _, broker := range []struct {
		name string
		run  func(context.Context, bench.CrashConfig, func(...string) *exec.Cmd) ([]bench.CrashRow, error)
	}{{"file", bench.CrashTable}, {"kafka", bench.CrashTableKafka}} {
		rows, err := broker.run(context.Background(), cfg, child)
		if err != nil {
			t.Fatalf("%s: %v", broker.name, err)
		}
		for i, s := range bench.Strategies {
			want := cfg.Expected(s)
			if rows[i] != want {
				t.Errorf("%s: %s: got %+v, want %+v", broker.name, s, rows[i], want)
			}
			t.Logf("%-6s %-60s processed %d duplicated %d lost %d", broker.name, s, rows[i].Processed, rows[i].Duplicated, rows[i].Lost)
		}
	}
	// The shape of the table: the engine with a separate effect repeats
	// exactly the kills that fell between an effect and its mark; with the
	// effect in its commit nothing repeats and nothing is lost.
	if e := cfg.Expected(bench.WithEngine); e.Duplicated != after || e.Lost != 0 {
		t.Fatalf("expected residue of the engine with a separate effect: %+v, want %d duplicated", e, after)
	}
	if e := cfg.Expected(bench.WithLedger); e.Duplicated != 0 || e.Lost != 0 || e.Processed != cfg.Messages {
		t.Fatalf("expected row of the ledger in the commit: %+v", e)
	}
}

// TestRecover runs the recovery measurement small: 400k keys over the
// default window's 8 days, a real SIGKILL while the filling child writes,
// then the three reopens. As the kill left it, the seven closed days load
// from their files and the open day is restored from its checkpoint and
// the journal: warm at Open, nothing scanned. Without the checkpoint files
// the open day is scanned; without any filter file, the whole window is.
func TestRecover(t *testing.T) {
	dir := t.TempDir()
	args := []string{"-keys", "400000", "-after", "300ms"}
	child := func(dir string, a ...string) *exec.Cmd {
		cmd := command(t, append(append([]string{"recover-child", "-dir", dir}, args...), a...)...)
		cmd.Stderr = os.Stderr
		return cmd
	}
	restore := engine.Options{Backend: embedded.Dir(dir)}
	rs, err := bench.Recover(context.Background(), bench.RecoverConfig{Keys: 400000, Engine: restore, After: 300 * time.Millisecond}, child)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 3 {
		t.Fatalf("results %+v", rs)
	}
	ckpt, scan, all := rs[0], rs[1], rs[2]
	t.Logf("%+v\n%+v\n%+v", ckpt, scan, all)
	// Warm at Open: nothing to scan (RebuiltKeys 0; a rebuild of this
	// store takes over 20 s), within scheduling noise (79 ms once, under
	// -race beside the engine's tests on 2 cores).
	if ckpt.Mode != bench.RecoverCheckpoint || ckpt.SealedLoaded != 7 || ckpt.Restored != 1 || ckpt.RebuiltKeys != 0 || ckpt.Warm != ckpt.Open && ckpt.Warm > ckpt.Open+250*time.Millisecond {
		t.Fatalf("as killed: %+v; want 7 sealed, the open day restored, nothing scanned, warm at Open", ckpt)
	}
	if scan.Mode != bench.RecoverNoCheckpoint || scan.SealedLoaded != 7 || scan.Restored != 0 || scan.RebuiltKeys == 0 {
		t.Fatalf("without checkpoints: %+v; want 7 sealed and the open day scanned", scan)
	}
	if all.Mode != bench.RecoverRebuildAll || all.SealedLoaded != 0 {
		t.Fatalf("without filter files: %+v", all)
	}
	// Seven of the eight days hold ≈ 7/8 of the 360k distinct keys.
	if saved := int64(all.RebuiltKeys) - int64(scan.RebuiltKeys); saved < 250000 {
		t.Fatalf("the sealed filters spared %d keys of the rebuild, want ≈ 315k", saved)
	}
	for _, r := range rs {
		if r.Open <= 0 || r.Warm < r.Open || r.WarmRate <= 0 {
			t.Fatalf("%s: open %v, warm %v, warm rate %v", r.Mode, r.Open, r.Warm, r.WarmRate)
		}
	}
}
