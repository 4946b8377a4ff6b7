package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/tierdedup/tierdedup/bench"
	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/memory"
)

// maxFootprintKeys bounds footprint's counts: a store it fills in minutes.
const maxFootprintKeys = 1_000_000_000

// footprintCmd measures a default engine as it fills (bench.MeasureFootprint),
// in this process of its own, so that its RSS is the engine's and the
// program's.
func footprintCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("footprint", flag.ContinueOnError)
	fs.SetOutput(stderr)
	keys := fs.String("keys", "1,1e5,1e6", "the counts of distinct keys to measure at, increasing, comma-separated, at most 1e9 (1000000, 1_000_000 or 1e6)")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	window := fs.Duration("window", 0, "retention window (0: the engine's default)")
	partition := fs.Duration("partition", 0, "retention partition (0: the engine's default)")
	var memCap, expected int
	intCountVar(fs, &memCap, "memory", 0, "committed keys cached in memory, a ceiling (0: the engine's default)")
	intCountVar(fs, &expected, "expected-keys", 0, "keys a partition is sized for, a ceiling the filters grow to (0: the engine's default)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("footprint: unexpected arguments %q", fs.Args())
	}
	var steps []int64
	for _, f := range strings.Split(*keys, ",") {
		n, err := parseCount(strings.TrimSpace(f), maxFootprintKeys)
		if err != nil {
			return fmt.Errorf("-keys: %v", err)
		}
		steps = append(steps, n)
	}
	if memCap < 0 || expected < 0 {
		return fmt.Errorf("-memory %d and -expected-keys %d must not be negative", memCap, expected)
	}
	if *window < 0 || *partition < 0 {
		return fmt.Errorf("-window %v and -partition %v must not be negative", *window, *partition)
	}
	o := engine.Options{Window: *window, Partition: *partition, MemoryCapacity: memCap, ExpectedKeys: expected}
	start := time.Now()
	fp, err := bench.MeasureFootprint(ctx, o, steps)
	if errors.Is(err, bench.ErrFootprintSteps) {
		return fmt.Errorf("-keys %s: %w", *keys, err)
	}
	if err != nil {
		return fmt.Errorf("footprint: %w", err) // engine.Open's error names the option
	}
	if *asJSON {
		return writeJSON(stdout, fp)
	}
	d := o.WithDefaults()
	if d.MemoryCapacity == 0 {
		d.MemoryCapacity = memory.DefaultCapacity
	}
	fmt.Fprintf(stdout, "default engine: window %v in partitions of %v, memory tier up to %d keys, filters up to %d keys a partition (%.1fs)\n",
		d.Window, d.Partition, d.MemoryCapacity, d.ExpectedKeys, time.Since(start).Seconds())
	bench.PrintFootprint(stdout, fp)
	return nil
}
