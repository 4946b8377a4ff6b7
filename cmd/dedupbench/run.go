package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/tierdedup/tierdedup/bench"
)

func runCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var w workloadFlags
	w.bind(fs, 15_000_000)
	asJSON, report := bindOutput(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	rc, err := w.config()
	if err != nil {
		return err
	}
	if isTerminal(stderr) && !*asJSON {
		rc.Progress = func(p bench.Point) {
			fmt.Fprintf(stderr, "\r%6.1fs %12d keys %10.0f keys/s  simulated %s  partitions dropped %d   ",
				p.At.Seconds(), p.Keys, p.KeysPerSec, p.SimTime.Format("Jan 2 15:04"), p.Rotations)
		}
	}
	res, err := bench.Run(ctx, rc)
	if rc.Progress != nil {
		fmt.Fprintln(stderr)
	}
	if err != nil {
		return err
	}
	if err := finish(stdout, *report, *asJSON, res, nil, res, func() { bench.PrintResult(stdout, res) }); err != nil {
		return err
	}
	// A broken promise fails the command, after its figures are out.
	return res.Exactness()
}
