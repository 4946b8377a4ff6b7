package main

import (
	"context"
	"flag"
	"fmt"
	"io"
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
	messages := fs.Int("messages", 1000, "messages in the topic")
	every := fs.Int("every", 100, "commit the offset every this many messages")
	killAt := fs.Int("kill-at", 505, "SIGKILL the consumer just before this message")
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
	rows, err := bench.CrashTable(ctx, bench.CrashConfig{Messages: *messages, Every: *every, KillAt: *killAt}, child)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(stdout, rows)
	}
	fmt.Fprintf(stdout, "%d messages, offset committed every %d, consumer killed (SIGKILL) at message %d, then restarted:\n\n", *messages, *every, *killAt)
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
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *strategy < 0 || *strategy >= len(bench.Strategies) {
		return fmt.Errorf("strategy %d", *strategy)
	}
	return bench.CrashChild(ctx, bench.Strategies[*strategy], *dir, *messages, *every, *killAt)
}
