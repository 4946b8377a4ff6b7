package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/tierdedup/tierdedup/bench"
)

func compareCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("compare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var w workloadFlags
	w.bind(fs, 2_000_000, "postgres://postgres@127.0.0.1:5432/test", true)
	budget := fs.Duration("budget", 10*time.Second, "time limit of each baseline")
	asJSON, report := bindOutput(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	rc, closeShared, err := w.config(ctx)
	if err != nil {
		return err
	}
	defer closeShared()
	say := func(format string, args ...any) {
		if !*asJSON {
			fmt.Fprintf(stderr, format+"\n", args...)
		}
	}
	say("engine (%s), %d keys...", rc.TiersName(), w.keys)
	res, err := bench.Run(ctx, rc)
	if err != nil {
		return err
	}
	rows := []bench.CompareRow{{Name: "engine " + res.Tiers + " MarkBatch", Group: bench.GroupBatch, Batch: res.Batch, Concurrency: res.Workers,
		Keys: res.Keys, Elapsed: res.Elapsed, KeysPerSec: res.KeysPerSec}}
	rows = append(rows, baselines(ctx, rc, w.shared.redis, w.shared.postgres, *budget, say)...)
	slices.SortStableFunc(rows, func(a, b bench.CompareRow) int { return strings.Compare(a.Group, b.Group) })
	bench.Ratios(rows)
	if err := finish(stdout, *report, *asJSON, res, rows, rows, func() { bench.PrintCompare(stdout, rows) }); err != nil {
		return err
	}
	return res.Exactness()
}
