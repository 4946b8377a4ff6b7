package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tierdedup/tierdedup/bench"
	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/embedded"
	"github.com/tierdedup/tierdedup/tier/pebble"
	"github.com/tierdedup/tierdedup/tier/postgres"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "dedupbench:", err)
		os.Exit(1)
	}
}

// commands are the subcommands a user runs, in the order help lists them.
var commands = []struct{ name, summary, example string }{
	{"run", "the embedded default (or -tiers) on a realistic workload; the default command",
		"run -keys 1e6 -memory 1e5   (-tiers redis|postgres|memory|bloom, -span 168h, -report page.html)"},
	{"plan", "size memory, Bloom filters and disk for a load, calibrated on this machine",
		"plan -ids-per-day 5e8   (-window, -dup, -sample your-ids.txt, -tiers redis|postgres)"},
	{"compare", "the engine beside Redis SET NX and PostgreSQL, in batches and per message",
		"compare -keys 1e6   (-redis host:port, -postgres URL)"},
	{"footprint", "what a default engine costs as it fills: disk (the engine's figure and du), heap, RSS",
		"footprint -keys 1,1e5,1e6"},
	{"crash", "the crash table with real processes and SIGKILL (-broker file, kafka or both)",
		"crash -broker both"},
	{"recover", "reopening after a kill -9: time until the filters are warm, sealed or rebuilt",
		"recover -keys 1e7"},
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "help", "-h", "-help", "--help":
			return help(ctx, args[1:], stdout)
		}
	}
	cmd := "run"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	err := dispatch(ctx, cmd, args, stdout, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil // CMD -h printed its flags
	}
	return err
}

// help prints every subcommand and its flags, or, given one, its flags.
func help(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) > 0 {
		for _, c := range commands {
			if c.name == args[0] {
				fmt.Fprintf(stdout, "dedupbench %s: %s\n\n", c.name, c.summary)
				return helpFlags(ctx, c.name, stdout)
			}
		}
		return fmt.Errorf("help: unknown command %q (want run, plan, compare, footprint, crash or recover)", args[0])
	}
	fmt.Fprintln(stdout, "dedupbench measures tierdedup on this machine and turns the measurements into a capacity plan.")
	fmt.Fprintln(stdout, "\nusage: dedupbench [command] [flags]    (dedupbench help command: one command's flags)")
	fmt.Fprintln(stdout, "\ncommands:")
	for _, c := range commands {
		fmt.Fprintf(stdout, "  %-9s %s\n            e.g. dedupbench %s\n", c.name, c.summary, c.example)
	}
	fmt.Fprintln(stdout, "\nEvery command's flags: dedupbench help run (or plan, compare, footprint, crash, recover).")
	return nil
}

// helpFlags prints command's flags to w, as its -h does.
func helpFlags(ctx context.Context, command string, w io.Writer) error {
	if err := dispatch(ctx, command, []string{"-h"}, w, w); !errors.Is(err, flag.ErrHelp) {
		return fmt.Errorf("help %s: %v", command, err)
	}
	return nil
}

func dispatch(ctx context.Context, cmd string, args []string, stdout, stderr io.Writer) error {
	switch cmd {
	case "run":
		return runCmd(ctx, args, stdout, stderr)
	case "plan":
		return planCmd(ctx, args, stdout, stderr)
	case "compare":
		return compareCmd(ctx, args, stdout, stderr)
	case "footprint":
		return footprintCmd(ctx, args, stdout, stderr)
	case "crash":
		return crashCmd(ctx, args, stdout, stderr)
	case "crash-child":
		return crashChildCmd(ctx, args)
	case "recover":
		return recoverCmd(ctx, args, stdout, stderr)
	case "recover-child":
		return recoverChildCmd(ctx, args, stdout)
	default:
		return fmt.Errorf("unknown command %q (want run, plan, compare, footprint, crash or recover)", cmd)
	}
}

// workloadFlags binds the flags that describe a workload and an engine.
type workloadFlags struct {
	keys                   int64
	shape                  string
	dup, inBatch, zipf     float64
	reach, span            time.Duration
	tiers                  string
	window, partition      time.Duration
	fp                     float64
	memCap, batch, workers int
	keySize                int
	sample                 string
	cache                  int
	noSync                 bool
	sliding                bool
	seed                   uint64
	archive                string
	archiveWindow          time.Duration
	shared                 sharedFlags
}

// bind binds the flags, -keys defaulting to keys and -postgres to
// postgres; baselines says the command also runs the Redis and PostgreSQL
// baselines on -redis and -postgres.
func (w *workloadFlags) bind(fs *flag.FlagSet, keys int64, postgres string, baselines bool) {
	countVar(fs, &w.keys, "keys", keys, "messages to process")
	fs.StringVar(&w.shape, "shape", "uuid4", "key shape: uuid4, uuid7, snowflake or business")
	fs.IntVar(&w.keySize, "key-size", 0, "key size in bytes, padding the shape (0: the shape's own)")
	fs.StringVar(&w.sample, "sample", "", sampleHelp)
	fs.Float64Var(&w.dup, "dup", 0.1, "share of messages that repeat an earlier key")
	fs.DurationVar(&w.reach, "reach", 6*time.Hour, "how far back in simulated time duplicates reach (6h: past the memory tier, so the store answers them)")
	fs.Float64Var(&w.zipf, "zipf", 0, "Zipf exponent (> 1) skewing duplicates to recent keys; 0 is uniform")
	fs.Float64Var(&w.inBatch, "inbatch", 0.005, "share of messages repeating a key of the same batch")
	fs.DurationVar(&w.span, "span", 24*time.Hour, "simulated time the stream covers (e.g. 168h for 7 days)")
	fs.StringVar(&w.tiers, "tiers", "default", "configuration: default, memory, bloom, redis or postgres"+sharedHelp)
	fs.DurationVar(&w.window, "window", engine.DefaultWindow, "retention window")
	fs.DurationVar(&w.partition, "partition", engine.DefaultPartition, "retention partition")
	fs.Float64Var(&w.fp, "fp", 0.01, "Bloom false-positive target over the whole window")
	intCountVar(fs, &w.memCap, "memory", 1<<20, "committed keys cached in memory")
	fs.IntVar(&w.cache, "cache", 0, "Pebble block cache in bytes (0: 64 MiB)")
	fs.IntVar(&w.batch, "batch", 256, "keys per batch")
	fs.IntVar(&w.workers, "workers", 0, "goroutines (0: 4 per CPU)")
	fs.BoolVar(&w.noSync, "nosync", false, "do not fsync commits")
	fs.BoolVar(&w.sliding, "sliding", false, "slide the window: a duplicate refreshes its key (engine.NamespaceOptions.Sliding; not with -tiers redis or postgres)")
	fs.Uint64Var(&w.seed, "seed", 1, "workload seed")
	fs.StringVar(&w.archive, "archive", "", "archive (default configuration): a directory, or a PostgreSQL URL (postgres://…, table dedupbench_archive, dropped first); keys stay known for -archive-window after they leave the window")
	fs.DurationVar(&w.archiveWindow, "archive-window", 0, "archive window with -archive (0: engine.DefaultArchiveWindow)")
	w.shared.bind(fs, postgres, baselines)
}

// sampleHelp is the -sample flag's help.
const sampleHelp = "a file of your own keys, one a line in arrival order (- for standard input): keys are synthesised to look like them, replacing -shape and -key-size (a few hundred thousand lines are enough)"

// loadSample reads -sample, refusing it beside -shape or -key-size.
func loadSample(path, shape string, keySize int) (*bench.Sample, error) {
	if path == "" {
		return nil, nil
	}
	if shape != "uuid4" || keySize != 0 {
		return nil, fmt.Errorf("%w: -sample replaces -shape and -key-size: give one or the other", bench.ErrConfig)
	}
	return bench.LoadSample(path)
}

// parseTiers reads -tiers: an engine configuration, or a shared tier
// (bench.SharedRedis, bench.SharedPostgres) behind memory, whose Tiers is
// Default.
func parseTiers(s string) (engine.Tiers, string, error) {
	for _, t := range []engine.Tiers{engine.Default, engine.MemoryOnly, engine.BloomOnly} {
		if s == t.String() || (s == "default" && t == engine.Default) {
			return t, "", nil
		}
	}
	for _, shared := range []string{bench.SharedRedis, bench.SharedPostgres} {
		if s == shared || s == "memory+"+shared {
			return engine.Default, shared, nil
		}
	}
	return 0, "", fmt.Errorf("unknown -tiers %q (want default, memory, bloom, redis or postgres)", s)
}

// config returns the run the flags describe, and a func that closes what
// it opened (the shared tier's client). A shared tier's server is
// connected to last, once every other flag is known good.
func (w *workloadFlags) config(ctx context.Context) (bench.RunConfig, func(), error) {
	none := func() {}
	if w.memCap < 0 || w.batch < 0 || w.workers < 0 || w.cache < 0 {
		return bench.RunConfig{}, none, fmt.Errorf("-memory %d, -batch %d, -workers %d and -cache %d must not be negative", w.memCap, w.batch, w.workers, w.cache)
	}
	shape, err := bench.ParseKeyShape(w.shape)
	if err != nil {
		return bench.RunConfig{}, none, err
	}
	tiers, shared, err := parseTiers(w.tiers)
	if err != nil {
		return bench.RunConfig{}, none, err
	}
	sample, err := loadSample(w.sample, w.shape, w.keySize)
	if err != nil {
		return bench.RunConfig{}, none, err
	}
	wc := bench.WorkloadConfig{Keys: w.keys, Shape: shape, KeySize: w.keySize, Sample: sample, DupRatio: w.dup, DupReach: w.reach, Zipf: w.zipf,
		InBatchRepeat: w.inBatch, Span: w.span, Seed: w.seed}
	perPartition := float64(w.keys) * (1 - w.dup - w.inBatch) * float64(w.partition) / float64(max(w.span, w.partition))
	if w.sliding {
		// Each refreshing duplicate is one more key of its partition's
		// filter.
		perPartition += float64(w.keys) * w.dup * bench.RefreshShare(w.reach, w.partition) * float64(w.partition) / float64(max(w.span, w.partition))
	}
	rc := bench.RunConfig{
		Workload: wc,
		Engine: engine.Options{Tiers: tiers, Window: w.window, Partition: w.partition, FalsePositive: w.fp,
			MemoryCapacity: w.memCap, ExpectedKeys: max(1000, int(perPartition)),
			Namespaces: map[string]engine.NamespaceOptions{"": {Sliding: w.sliding}}},
		Batch: w.batch, Workers: w.workers,
	}
	if w.archiveWindow != 0 && w.archive == "" {
		return bench.RunConfig{}, none, errors.New("-archive-window needs -archive")
	}
	if shared != "" {
		if w.archive != "" {
			return bench.RunConfig{}, none, fmt.Errorf("%w: -archive is measured with the embedded store (-tiers default), not -tiers %s", bench.ErrConfig, shared)
		}
		if err := bench.CheckShared(shared, rc); err != nil {
			return bench.RunConfig{}, none, err
		}
		srv, closeFn, err := w.shared.connect(ctx, shared)
		if err != nil {
			return bench.RunConfig{}, none, err
		}
		rc.Shared = srv
		return rc, closeFn, nil
	}
	if tiers != engine.MemoryOnly {
		// The embedded store's settings; Run gives it a directory.
		rc.Engine.Backend = &embedded.Backend{NoSync: w.noSync, CacheSize: w.cache}
	}
	if w.archive != "" {
		rc.Engine.Archive, rc.Engine.ArchiveWindow = pebble.ArchiveDir{Dir: w.archive}, w.archiveWindow
		if strings.HasPrefix(w.archive, "postgres://") || strings.HasPrefix(w.archive, "postgresql://") {
			// A pool for the process's life: the command ends with the run.
			pool, err := pgxpool.New(context.Background(), w.archive)
			if err != nil {
				return bench.RunConfig{}, none, fmt.Errorf("-archive %s: %w", w.archive, err)
			}
			// The benchmark's own tables, from a previous run of another
			// store (which the archive would refuse): started afresh.
			for _, s := range []string{"", "_layout", "_parts", "_blobs"} {
				if _, err := pool.Exec(context.Background(), "DROP TABLE IF EXISTS dedupbench_archive"+s+" CASCADE"); err != nil {
					return bench.RunConfig{}, none, fmt.Errorf("-archive %s: %w", w.archive, err)
				}
			}
			rc.Engine.Archive = postgres.Archive{DB: pool, Table: "dedupbench_archive"}
		}
	}
	return rc, none, nil
}

// bindOutput binds -json and -report, shared by run and compare.
func bindOutput(fs *flag.FlagSet) (asJSON *bool, report *string) {
	return fs.Bool("json", false, "print the result as JSON"),
		fs.String("report", "", "write a self-contained HTML report to this file")
}

// finish writes the HTML report if asked, then v as JSON or print's text.
func finish(stdout io.Writer, report string, asJSON bool, res *bench.Result, rows []bench.CompareRow, v any, print func()) error {
	if report != "" {
		if err := writeReport(report, res, rows); err != nil {
			return err
		}
	}
	if asJSON {
		return writeJSON(stdout, v)
	}
	print()
	return nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func writeReport(path string, res *bench.Result, cmp []bench.CompareRow) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := bench.WriteReport(f, res, cmp); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
