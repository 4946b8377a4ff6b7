package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/tierdedup/tierdedup/bench"
)

// planFlags names, in a plan input's errors, the flag each field comes
// from (the longer names first: ArchiveWindow before Window).
var planFlags = strings.NewReplacer(
	"IDsPerDay", "-ids-per-day", "DupRatio", "-dup", "DupReach", "-reach", "FalsePositive", "-fp",
	"ArchiveWindow", "-archive-window", "Window", "-window", "Partition", "-partition",
	"MemoryCapacity", "-memory", "KeySize", "-key-size", "Sliding", "-sliding",
	"partitioning: window ", "partitioning: -window ", " and partition ", " and -partition ")

// flagError is an error whose text names flags (planFlags), wrapping the
// original: it still matches what that matched (errors.Is).
type flagError struct {
	msg string
	err error
}

func (e flagError) Error() string { return e.msg }
func (e flagError) Unwrap() error { return e.err }

func planCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("plan", flag.ContinueOnError)
	fs.SetOutput(stderr)
	ids := fs.Float64("ids-per-day", 500e6, "message IDs per day")
	window := fs.Duration("window", 7*24*time.Hour, "retention window")
	partition := fs.Duration("partition", 24*time.Hour, "retention partition")
	dup := fs.Float64("dup", 0.1, "share of duplicates")
	shapeFlag := fs.String("shape", "uuid4", "key shape: uuid4, uuid7, snowflake or business")
	keySize := fs.Int("key-size", 0, "key size in bytes, padding the shape (0: the shape's own, 36 for UUIDs)")
	samplePath := fs.String("sample", "", sampleHelp)
	reach := fs.Duration("reach", time.Hour, "how far back duplicates reach")
	fp := fs.Float64("fp", 0.01, "Bloom false-positive target over the whole window")
	tiersFlag := fs.String("tiers", "default", "configuration: default, memory, bloom, redis or postgres"+sharedPlanHelp)
	memCap, calKeys, calStore := new(int), new(int64), new(int64)
	intCountVar(fs, memCap, "memory", 1<<20, "committed keys cached in memory")
	countVar(fs, calKeys, "calibrate", 1_500_000, "timed keys of the calibration run on this machine")
	countVar(fs, calStore, "calibrate-store", 0, "keys the calibration's store holds before the timed part, up to the planned store (0: 4,000,000, or 1,000,000 on a shared tier)")
	segments := fs.Int("segments", 3, "timed parts of the calibration; their median rate is kept")
	asJSON := fs.Bool("json", false, "print the plan as JSON")
	archiveWindow := fs.Duration("archive-window", 0, "plan an archive keeping keys this long (0: none)")
	sliding := fs.Bool("sliding", false, "plan a sliding window: a duplicate in a later partition than its key's commit re-commits it (engine.NamespaceOptions.Sliding)")
	dir := fs.String("dir", ".", "where the store will live: the plan is checked against the free disk there and this machine's memory (or its cgroup's limit)")
	var sf sharedFlags
	sf.bind(fs, "", false)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *segments < 1 {
		return fmt.Errorf("-segments %d: the calibration needs at least one timed part", *segments)
	}
	tiers, shared, err := parseTiers(*tiersFlag)
	if err != nil {
		return err
	}
	shape, err := bench.ParseKeyShape(*shapeFlag)
	if err != nil {
		return err
	}
	sample, err := loadSample(*samplePath, *shapeFlag, *keySize)
	if err != nil {
		return err
	}
	in := bench.PlanInput{IDsPerDay: *ids, Window: *window, Partition: *partition, DupRatio: *dup, DupReach: *reach,
		Shape: shape, KeySize: *keySize, Sample: sample, FalsePositive: *fp, Tiers: tiers, MemoryCapacity: *memCap, ArchiveWindow: *archiveWindow, Shared: shared, Sliding: *sliding}
	if _, err := bench.MakePlan(in, bench.Calibration{}); err != nil {
		return flagError{planFlags.Replace(err.Error()), err} // before the calibration's minutes
	}
	srv, closeShared, err := sf.connect(ctx, shared)
	if err != nil {
		return err
	}
	defer closeShared()
	cc := bench.CalibrateConfig{Measure: *calKeys, Store: *calStore, Segments: *segments, Shared: srv}
	if !*asJSON {
		store, through := *calStore, tiers.String()
		if shared != "" {
			through = "memory+" + shared
		}
		if store == 0 {
			store = 4_000_000
			if shared != "" {
				store = 1_000_000
			}
		}
		fmt.Fprintf(stderr, "calibrating: a store of up to %d %s keys through %s, then %d keys timed, on this machine...\n",
			store, bench.WorkloadConfig{Shape: shape, Sample: sample}.KeysName(), through, *calKeys)
	}
	cal, cres, err := bench.Calibrate(ctx, in, cc)
	if err == nil {
		// A calibration cut short measured part of what it times: no plan
		// from it.
		err = ctx.Err()
	}
	if err != nil {
		return fmt.Errorf("calibration: %w", err)
	}
	if err := cres.Exactness(); err != nil {
		return fmt.Errorf("the calibration run: %w", err) // a plan on a broken engine is worthless
	}
	pl, err := bench.MakePlan(in, cal)
	if err != nil {
		return err
	}
	m, err := bench.DetectMachine(*dir)
	if err != nil {
		return err
	}
	fit := bench.CheckFit(pl, m)
	if *asJSON {
		return writeJSON(stdout, struct {
			bench.Plan
			Fit bench.Fit
		}{pl, fit})
	}
	bench.PrintFitVerdict(stdout, fit)
	bench.PrintPlan(stdout, pl)
	bench.PrintFitChanges(stdout, fit)
	return nil
}
