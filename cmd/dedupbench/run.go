package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/tierdedup/tierdedup/bench"
)

func runCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var w workloadFlags
	w.bind(fs, 15_000_000, "", false)
	asJSON, report := bindOutput(fs)
	format := fs.String("format", "text", "output: text, json, or bench (Go benchmark format with configuration lines, for benchstat old.txt new.txt)")
	count := fs.Int("count", 1, "run the measurement this many times, each with a fresh engine (benchstat wants several)")
	rate := fs.Float64("rate", 0, "open loop: offer this many keys/s, batches due on a fixed schedule, latency measured from each batch's due time (0: closed loop)")
	maxP99 := fs.Duration("max-p99", 0, "search for the highest open-loop rate whose batch p99 stays at most this (a closed-loop run, then -search-steps open-loop runs)")
	steps := fs.Int("search-steps", 6, "open-loop runs of a -max-p99 search")
	warmup := new(int64)
	countVar(fs, warmup, "warmup", 0, "messages processed (and checked) before the timing starts, as plan's calibration fills its store before it times")
	every := fs.Duration("every", time.Second, "interval of the series a run records (keys/s, simulated time, disk; in -json and -report)")
	segments := fs.Int("segments", 1, "split the timed messages into this many parts: keys/s is the median of their rates, as plan's calibration takes it")
	profile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to the file")
	dayProfiles := fs.String("cpuprofile-days", "", "write a CPU profile of each simulated day to PREFIXday<N>.pprof (not with -cpuprofile; with -count or -max-p99, each run overwrites the last)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *profile != "" && *dayProfiles != "" {
		return errors.New("-cpuprofile and -cpuprofile-days cannot both run: Go has one CPU profiler")
	}
	stop, err := startProfile(*profile)
	if err != nil {
		return err
	}
	defer stop()
	if *asJSON {
		*format = "json"
	}
	switch {
	case *format != "text" && *format != "json" && *format != "bench":
		return fmt.Errorf("unknown -format %q (want text, json or bench)", *format)
	case *count < 1:
		return fmt.Errorf("-count %d must be at least 1", *count)
	case w.keys < 1:
		return fmt.Errorf("-keys %d: a run needs at least one message", w.keys)
	case *warmup < 0 || *warmup >= w.keys || *segments < 1:
		return fmt.Errorf("-warmup %d must be below -keys %d and -segments %d at least 1", *warmup, w.keys, *segments)
	case *every < time.Millisecond:
		return fmt.Errorf("-every %v: the series needs an interval of at least 1ms", *every)
	case *maxP99 < 0 || *steps < 1:
		return fmt.Errorf("-max-p99 %v and -search-steps %d must be positive", *maxP99, *steps)
	case *maxP99 > 0 && *format == "bench":
		return errors.New("-format bench prints runs, not a search: use -rate with the rate the search finds")
	}
	rc, closeShared, err := w.config(ctx)
	if err != nil {
		return err
	}
	defer closeShared()
	rc.DayProfiles = *dayProfiles
	rc.Warmup, rc.Segments = *warmup, *segments
	rc.Rate = *rate
	rc.Sample = *every
	if err := bench.CheckRate(rc.Rate, rc.Batch); err != nil {
		return err
	}
	if *maxP99 > 0 {
		return searchCmd(ctx, rc, *maxP99, *steps, *format, stdout)
	}
	if isTerminal(stderr) && *format == "text" {
		rc.Progress = func(p bench.Point) {
			fmt.Fprintf(stderr, "\r%6.1fs %12d keys %10.0f keys/s  simulated %s  partitions dropped %d   ",
				p.At.Seconds(), p.Keys, p.KeysPerSec, p.SimTime.Format("Jan 2 15:04"), p.Rotations)
		}
	}
	if *format == "bench" {
		bench.PrintBenchHeader(stdout, rc)
	}
	var results []*bench.Result
	var broken []error
	for i := range *count {
		res, err := bench.Run(ctx, rc)
		if rc.Progress != nil {
			fmt.Fprintln(stderr)
		}
		if err != nil {
			return err
		}
		results = append(results, res)
		// A broken promise fails the command, after its figures are out.
		if err := res.Exactness(); err != nil {
			broken = append(broken, fmt.Errorf("run %d: %w", i+1, err))
		}
		switch *format {
		case "bench":
			bench.PrintBench(stdout, res)
		case "text":
			if *count > 1 {
				fmt.Fprintf(stdout, "run %d of %d\n", i+1, *count)
			}
			bench.PrintResult(stdout, res)
			if i+1 < *count {
				fmt.Fprintln(stdout)
			}
		}
	}
	last := results[len(results)-1]
	if *report != "" {
		if err := writeReport(*report, last, nil); err != nil {
			return err
		}
	}
	if *format == "json" {
		var v any = last
		if *count > 1 {
			v = results
		}
		if err := writeJSON(stdout, v); err != nil {
			return err
		}
	}
	return errors.Join(broken...)
}

// searchCmd runs a -max-p99 search and prints it.
func searchCmd(ctx context.Context, rc bench.RunConfig, target time.Duration, steps int, format string, stdout io.Writer) error {
	s, err := bench.SearchRate(ctx, rc, target, steps)
	if err != nil {
		return err
	}
	if format == "json" {
		return writeJSON(stdout, s)
	}
	bench.PrintSearch(stdout, s)
	return nil
}
