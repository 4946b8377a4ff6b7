package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/tierdedup/tierdedup/bench"
)

func planCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("plan", flag.ContinueOnError)
	fs.SetOutput(stderr)
	ids := fs.Float64("ids-per-day", 500e6, "message IDs per day")
	window := fs.Duration("window", 7*24*time.Hour, "retention window")
	partition := fs.Duration("partition", 24*time.Hour, "retention partition")
	dup := fs.Float64("dup", 0.1, "share of duplicates")
	keySize := fs.Int("key-size", 36, "key size in bytes (36 for UUIDs)")
	fp := fs.Float64("fp", 0.01, "Bloom false-positive target over the whole window")
	tiersFlag := fs.String("tiers", "default", "configuration: default, memory or bloom")
	memCap := fs.Int("memory", 1<<20, "committed keys cached in memory")
	calKeys := fs.Int64("calibrate", 2_000_000, "keys of the calibration run on this machine")
	asJSON := fs.Bool("json", false, "print the plan as JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	tiers, err := parseTiers(*tiersFlag)
	if err != nil {
		return err
	}
	in := bench.PlanInput{IDsPerDay: *ids, Window: *window, Partition: *partition, DupRatio: *dup, KeySize: *keySize,
		FalsePositive: *fp, Tiers: tiers, MemoryCapacity: *memCap}
	shape := bench.UUIDv4
	if *keySize != 36 {
		shape = bench.Business
	}
	if !*asJSON {
		fmt.Fprintf(stderr, "calibrating: %d keys through %s on this machine...\n", *calKeys, tiers)
	}
	cal, _, err := bench.Calibrate(ctx, in, *calKeys, shape)
	if err != nil {
		return err
	}
	pl, err := bench.MakePlan(in, cal)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(stdout, pl)
	}
	bench.PrintPlan(stdout, pl)
	return nil
}

func compareCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("compare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var w workloadFlags
	w.bind(fs, 2_000_000)
	redisAddr := fs.String("redis", "127.0.0.1:6379", "Redis for the SET NX EX baseline (empty: skip)")
	dsn := fs.String("postgres", "postgres://postgres@127.0.0.1:5432/test", "PostgreSQL for the unique-index baseline (empty: skip)")
	budget := fs.Duration("budget", 10*time.Second, "time limit of each baseline")
	asJSON, report := bindOutput(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	rc, err := w.config()
	if err != nil {
		return err
	}
	say := func(format string, args ...any) {
		if !*asJSON {
			fmt.Fprintf(stderr, format+"\n", args...)
		}
	}
	say("engine (%s), %d keys...", rc.Engine.Tiers, w.keys)
	res, err := bench.Run(ctx, rc)
	if err != nil {
		return err
	}
	rows := []bench.CompareRow{{Name: "engine " + res.Tiers + ", batch 256", Keys: res.Keys, Elapsed: res.Elapsed, KeysPerSec: res.KeysPerSec}}
	rows = append(rows, baselines(ctx, rc.Workload, *redisAddr, *dsn, *budget, say)...)
	bench.Ratios(res.KeysPerSec, rows)
	return finish(stdout, *report, *asJSON, res, rows, rows, func() { bench.PrintCompare(stdout, rows) })
}
