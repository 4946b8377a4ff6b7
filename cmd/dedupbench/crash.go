package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"text/tabwriter"

	"github.com/tierdedup/tierdedup/bench"
)

// crashCmd reproduces the crash table with real processes: this binary,
// re-executed as crash-child, killed with SIGKILL and restarted.
func crashCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("crash", flag.ContinueOnError)
	fs.SetOutput(stderr)
	messages := fs.Int("messages", 2000, "messages in the topic")
	every := fs.Int("every", 100, "commit the offset every this many messages")
	kills := fs.Int("kills", 10, "SIGKILL the consumer this many times, each at a random message and phase (before it, or between its effect and its mark)")
	seed := fs.Uint64("seed", 1, "seed of the kill points")
	asJSON := fs.Bool("json", false, "print the table as JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	child := func(a ...string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, exe, append([]string{"crash-child"}, a...)...)
		cmd.Env = os.Environ()
		return cmd
	}
	cfg := bench.CrashConfig{Messages: *messages, Every: *every, Kills: bench.RandomKills(*messages, *every, *kills, rand.New(rand.NewPCG(*seed, 0)))}
	rows, err := bench.CrashTable(ctx, cfg, child)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(stdout, rows)
	}
	after := 0
	for _, k := range cfg.Kills {
		if k.AfterEffect {
			after++
		}
	}
	fmt.Fprintf(stdout, "%d messages, offset committed every %d, consumer killed (SIGKILL) %d times at random messages (%d of them between an effect and its mark), restarted after each:\n\n", *messages, *every, len(cfg.Kills), after)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "strategy\tprocessed\tduplicated\tlost")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\n", r.Strategy, r.Processed, r.Duplicated, r.Lost)
	}
	return tw.Flush()
}

func crashChildCmd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("crash-child", flag.ContinueOnError)
	strategy := fs.Int("strategy", 0, "index into bench.Strategies")
	dir := fs.String("dir", "", "state directory")
	messages := fs.Int("messages", 1000, "")
	every := fs.Int("every", 100, "")
	killAt := fs.Int("kill-at", 0, "")
	phase := fs.String("kill-phase", "before", "before, or effect (between the effect and its mark)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *strategy < 0 || *strategy >= len(bench.Strategies) {
		return fmt.Errorf("strategy %d", *strategy)
	}
	return bench.CrashChild(ctx, bench.Strategies[*strategy], *dir, *messages, *every, *killAt, *phase == "effect")
}
