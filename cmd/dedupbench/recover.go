package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime/pprof"
	"time"

	"github.com/tierdedup/tierdedup/bench"
	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// recoverFlags binds the flags shared by recover and its child.
type recoverFlags struct {
	keys              int64
	days              int
	dir               string
	window, partition time.Duration
	after             time.Duration
}

func (r *recoverFlags) bind(fs *flag.FlagSet) {
	countVar(fs, &r.keys, "keys", 10_000_000, "messages written before the kill (10 % duplicates)")
	fs.IntVar(&r.days, "days", 0, "simulated days they span (0: the window's partitions plus one)")
	fs.StringVar(&r.dir, "dir", "", "store directory (default: a temporary one, removed at the end)")
	fs.DurationVar(&r.window, "window", engine.DefaultWindow, "retention window")
	fs.DurationVar(&r.partition, "partition", engine.DefaultPartition, "retention partition")
	fs.DurationVar(&r.after, "after", 3*time.Second, "how long the load runs once warm, for the warm rate")
}

func (r *recoverFlags) config() bench.RecoverConfig {
	return bench.RecoverConfig{Keys: r.keys, Days: r.days, After: r.after,
		Engine: engine.Options{Backend: embedded.Dir(r.dir), Window: r.window, Partition: r.partition}}
}

// recoverCmd measures the reopen after a kill -9: open time, time to warm
// filters and the rate while they rebuild, with the sealed partitions'
// filters and without.
func recoverCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("recover", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var rf recoverFlags
	rf.bind(fs)
	asJSON := fs.Bool("json", false, "print the results as JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if rf.dir == "" {
		dir, err := os.MkdirTemp("", "dedupbench-recover-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		rf.dir = dir
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	base := []string{"-keys", fmt.Sprint(rf.keys), "-days", fmt.Sprint(rf.days),
		"-window", rf.window.String(), "-partition", rf.partition.String(), "-after", rf.after.String()}
	child := func(dir string, a ...string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, exe, append(append([]string{"recover-child", "-dir", dir}, base...), a...)...)
		cmd.Stderr = stderr
		return cmd
	}
	rs, err := bench.Recover(ctx, rf.config(), child)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(stdout, rs)
	}
	bench.PrintRecover(stdout, rs)
	return nil
}

func recoverChildCmd(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("recover-child", flag.ContinueOnError)
	var rf recoverFlags
	rf.bind(fs)
	phase := fs.String("phase", "fill", "fill or measure")
	at := fs.Int64("at", 0, "measure: the simulated time of the kill, Unix ns")
	mode := fs.String("mode", bench.RecoverCheckpoint, "measure: what to remove first (checkpoint: nothing; no checkpoint: the checkpoint files; rebuild all: every filter file)")
	profile := fs.String("cpuprofile", "", "write a CPU profile of this child to the file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	stop, err := startProfile(*profile)
	if err != nil {
		return err
	}
	defer stop()
	if *phase == "fill" {
		return bench.RecoverFill(ctx, rf.config(), stdout)
	}
	return bench.RecoverMeasure(ctx, rf.config(), *at, *mode, stdout)
}

// startProfile writes a CPU profile to path (nothing when it is empty)
// until the returned function is called.
func startProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}
