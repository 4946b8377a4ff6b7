package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/bench"
	"github.com/tierdedup/tierdedup/internal/crashtest"
	"github.com/tierdedup/tierdedup/tier/postgres/pgtest"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
	"golang.org/x/perf/benchfmt"
)

// TestMain lets the crash and recovery tests re-execute this binary as
// the command its arguments name (crash-child, recover-child).
func TestMain(m *testing.M) {
	crashtest.Main(m, map[string]func(string) int{"dedupbench": func(string) int {
		if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return 0
	}})
}

// command returns, not started, this binary re-executed as dedupbench with
// args, for bench's crash and recovery drivers to start, read and kill;
// one that hangs is killed and fails the test.
func command(t *testing.T, args ...string) *exec.Cmd {
	return crashtest.Command(t, "dedupbench", "", &crashtest.Options{Args: args})
}

// TestCrashLedgerKilledInsideCommit kills the consumer that writes its
// effect in the engine's commit 30 times, each at a random instant after it
// starts that write (before it reaches the disk, while it does, or after):
// an atomic write leaves every message's effect exactly once. A build that
// writes the effect and the mark in two steps repeats effects here (a kill
// between them leaves the effect without its mark).
func TestCrashLedgerKilledInsideCommit(t *testing.T) {
	child := func(a ...string) *exec.Cmd { return command(t, append([]string{"crash-child"}, a...)...) }
	rng := rand.New(rand.NewPCG(2, 0))
	cfg := bench.CrashConfig{Messages: 600, Every: 20, Kills: bench.RandomKills(600, 20, 30, rng)}
	for i := range cfg.Kills {
		cfg.Kills[i].AfterEffect = true
	}
	row, err := bench.CrashRun(context.Background(), cfg, bench.WithLedger, child)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("30 kills inside the commit: processed %d, duplicated %d, lost %d", row.Processed, row.Duplicated, row.Lost)
	if want := cfg.Expected(bench.WithLedger); row != want {
		t.Fatalf("got %+v, want %+v", row, want)
	}
}

func TestRunPrintsEveryFigure(t *testing.T) {
	var out, errOut bytes.Buffer
	report := filepath.Join(t.TempDir(), "r.html")
	if err := run(context.Background(), []string{"run", "-keys", "1e5", "-memory", "1e4", "-report", report}, &out, &errOut); err != nil {
		t.Fatal(err, errOut.String())
	}
	for _, want := range []string{"keys/s", "billion IDs/day: this run's keys/s × 86,400", "dedupbench plan -ids-per-day", "latency per batch", "cost per message", "heap",
		"disk", "as the OS allocates it", "bloom false positives", "hit ratios", "duplicates answered by  memory", "0 new keys dropped, 0 duplicates let through"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	page, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(page, []byte("<svg")) || bytes.Contains(page, []byte("http://")) && !bytes.Contains(page, []byte("http://www.w3.org/2000/svg")) {
		t.Errorf("report is not a self-contained page with an inline chart")
	}
}

func TestRunJSON(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"-keys", "50000", "-tiers", "memory", "-json"}, &out, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	var res bench.Result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatal(err, out.String())
	}
	if res.Keys != 50000 || res.KeysPerSec <= 0 || res.Tiers != "memory" {
		t.Fatalf("result %+v", res)
	}
}

func TestPlanJSON(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"plan", "-ids-per-day", "5e8", "-calibrate", "50000", "-calibrate-store", "100000", "-shape", "snowflake", "-json"}, &out, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	var pl bench.Plan
	if err := json.Unmarshal(out.Bytes(), &pl); err != nil {
		t.Fatal(err)
	}
	if pl.Live != 8 || pl.BloomBytes <= 0 || pl.DiskBytes <= 0 || pl.Headroom <= 0 || pl.Input.Shape != bench.Snowflake ||
		pl.KeyBytes < 18 || pl.KeyBytes > 20 || pl.Calibration.StoreKeys < 90_000 || pl.Calibration.Keys != 50_000 ||
		len(pl.Calibration.SegmentRates) != 3 || pl.Derate != bench.LargeStoreFactor {
		t.Fatalf("plan %+v", pl)
	}
	// A key size the shape cannot have is refused before any calibration.
	if err := run(context.Background(), []string{"plan", "-key-size", "5"}, &out, &bytes.Buffer{}); err == nil {
		t.Fatal("plan -key-size 5 accepted")
	}
}

func TestCompareAgainstRedis(t *testing.T) {
	srv := redistest.Start(t)
	var out, errOut bytes.Buffer
	args := []string{"compare", "-keys", "50000", "-batch", "64", "-workers", "3", "-redis", srv.Addr, "-postgres", "postgres://nobody@127.0.0.1:1/none", "-budget", "1s"}
	if err := run(context.Background(), args, &out, &errOut); err != nil {
		t.Fatal(err, errOut.String())
	}
	s := out.String()
	// Each row says its group, batch size and concurrency as run; baselines
	// carry a ratio to their group's engine row.
	for _, row := range []struct {
		group, name, batch, conc string
		ratio                    bool
	}{
		{"batch", "engine memory+bloom+pebble MarkBatch", "64", "3", false},
		{"batch", "redis SET NX EX pipelined", "256", "4", true},
		// The store alone, in the engine's batches from as many goroutines.
		{"batch", "pebble alone, synced batches", "64", "3", true},
		{"batch", "pebble alone, Get + synced batches", "64", "3", true},
		{"per message", "engine memory+bloom+pebble Claim + CommitAsync", "1", "1", false},
		{"per message", "engine memory+bloom+pebble Do", "1", "16", false},
		{"per message", "redis SET NX EX per message", "1", "1", true},
		{"per message", "redis SET NX EX per message", "1", "16", true},
	} {
		if !hasRow(s, row.group, row.name, row.batch, row.conc, row.ratio) {
			t.Errorf("no row %q (group %s, batch %s, concurrency %s, ratio %v):\n%s", row.name, row.group, row.batch, row.conc, row.ratio, s)
		}
	}
	if !strings.Contains(s, "skipped: no PostgreSQL") {
		t.Errorf("an unreachable PostgreSQL is not reported as skipped:\n%s", s)
	}
}

// hasRow reports whether compare's table has a row of group and name with
// that batch and concurrency, and a ratio when ratio.
func hasRow(table, group, name, batch, conc string, ratio bool) bool {
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(group) + `\s+` + regexp.QuoteMeta(name) + `\s+` + batch + `\s+` + conc + `\s+\d+\s+\d+[ \t]*(.*)$`)
	for _, m := range re.FindAllStringSubmatch(table, -1) {
		if has := strings.Contains(m[1], "faster") || strings.Contains(m[1], "slower"); has == ratio {
			return true
		}
	}
	return false
}

// TestCompareAgainstPostgres runs the PostgreSQL dedup-table baselines
// docs/dedupbench.md quotes against the server on 127.0.0.1:5432 (TIERDEDUP_POSTGRES
// overrides the address): every row must run and report a ratio. With
// TIERDEDUP_REQUIRE_POSTGRES set (CI sets it) an unreachable server fails
// the test instead of skipping it.
func TestCompareAgainstPostgres(t *testing.T) {
	dsn := os.Getenv("TIERDEDUP_POSTGRES")
	if dsn == "" {
		dsn = "postgres://postgres:test@127.0.0.1:5432/test"
	}
	var out, errOut bytes.Buffer
	args := []string{"compare", "-keys", "20000", "-redis", "", "-postgres", dsn, "-budget", "1s"}
	if err := run(context.Background(), args, &out, &errOut); err != nil {
		t.Fatal(err, errOut.String())
	}
	s := out.String()
	if strings.Contains(s, "skipped: no PostgreSQL") {
		if os.Getenv("TIERDEDUP_REQUIRE_POSTGRES") != "" {
			t.Fatalf("PostgreSQL at %s is required (TIERDEDUP_REQUIRE_POSTGRES is set):\n%s", dsn, s)
		}
		t.Skipf("no PostgreSQL at %s (set TIERDEDUP_REQUIRE_POSTGRES to make this a failure)", dsn)
	}
	for _, row := range []struct{ group, name, batch, conc string }{
		{"per message", "postgres INSERT ON CONFLICT per message", "1", "1"},
		{"per message", "postgres INSERT ON CONFLICT per message", "1", "16"},
		{"batch", "postgres INSERT ON CONFLICT, sorted unnest", "256", "1"},
		{"batch", "postgres INSERT ON CONFLICT, sorted unnest", "256", "4"},
	} {
		if !hasRow(s, row.group, row.name, row.batch, row.conc, true) {
			t.Errorf("no PostgreSQL row %q (batch %s, concurrency %s) with a ratio:\n%s", row.name, row.batch, row.conc, s)
		}
	}
	t.Log("\n" + s)
}

func TestUnknownCommand(t *testing.T) {
	if err := run(context.Background(), []string{"frobnicate"}, &bytes.Buffer{}, &bytes.Buffer{}); err == nil {
		t.Fatal("unknown command accepted")
	}
}

// TestHelp: --help, -h and help list every command with its flags and
// succeed; help CMD and CMD -h print that command's flags and succeed; an
// unknown command is an error.
func TestHelp(t *testing.T) {
	ctx := context.Background()
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}} {
		var out, errOut bytes.Buffer
		if err := run(ctx, args, &out, &errOut); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		for _, want := range []string{"run", "plan", "compare", "crash", "recover", "-keys", "-ids-per-day", "-broker", "-report"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("%v does not mention %q:\n%s", args, want, out.String())
			}
		}
	}
	for _, args := range [][]string{{"help", "crash"}, {"crash", "-h"}} {
		var out, errOut bytes.Buffer
		if err := run(ctx, args, &out, &errOut); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if got := out.String() + errOut.String(); !strings.Contains(got, "-broker") || !strings.Contains(got, "-kills") {
			t.Errorf("%v does not list crash's flags:\n%s", args, got)
		}
	}
	var out bytes.Buffer
	if err := run(ctx, []string{"help", "nope"}, &out, &out); err == nil {
		t.Error("help of an unknown command succeeded")
	}
}

// TestFormatBench: -format bench -count 3 prints the configuration once and
// one result per run, which benchstat's own parser reads as three samples
// of one benchmark, with the run's figures as units.
func TestFormatBench(t *testing.T) {
	var out bytes.Buffer
	args := []string{"run", "-keys", "30000", "-tiers", "memory", "-batch", "100", "-format", "bench", "-count", "3"}
	if err := run(context.Background(), args, &out, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	r := benchfmt.NewReader(bytes.NewReader(out.Bytes()), "run.txt")
	n := 0
	for r.Scan() {
		res, ok := r.Result().(*benchfmt.Result)
		if !ok {
			if err, isErr := r.Result().(*benchfmt.SyntaxError); isErr {
				t.Fatalf("benchstat cannot read the output: %v\n%s", err, out.String())
			}
			continue
		}
		n++
		if got := string(res.Name.Full()); got != "Run-"+strconv.Itoa(runtime.GOMAXPROCS(0)) {
			t.Fatalf("benchmark name %q", got)
		}
		if res.Iters != 30000 {
			t.Fatalf("iterations %d, want the 30000 keys", res.Iters)
		}
		if v, ok := res.GetConfig("tiers"), true; v != "memory" || !ok {
			t.Fatalf("config tiers = %q", v)
		}
		if res.GetConfig("batch") != "100" {
			t.Fatalf("config batch = %q", res.GetConfig("batch"))
		}
		units := map[string]float64{}
		for _, v := range res.Values {
			units[v.Unit] = v.Value
		}
		for _, u := range []string{"sec/op", "keys/s", "p99-sec/batch"} {
			if units[u] <= 0 {
				t.Fatalf("unit %s = %v in %v", u, units[u], units)
			}
		}
	}
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Fatalf("%d results for -count 3:\n%s", n, out.String())
	}
}

// TestRunFlagsRefused: bad -format, -count and -rate values are errors.
func TestRunFlagsRefused(t *testing.T) {
	for _, args := range [][]string{{"-format", "xml"}, {"-count", "0"}, {"-warmup", "10"}, {"-warmup", "-1"}, {"-segments", "0"}, {"-rate", "-1"}, {"-rate", "NaN"}, {"-rate", "+Inf"}, {"-rate", "1e-12"},
		{"-max-p99", "-1s"}, {"-max-p99", "1s", "-format", "bench"},
		{"-keys", "0"}, {"-keys", "-5"}, {"-keys", "1.5"}, {"-keys", "1e30"}, {"-keys", "lots"}, {"-memory", "2e10"}, {"-memory", "1.5"}} {
		if err := run(context.Background(), append([]string{"run", "-keys", "10"}, args...), &bytes.Buffer{}, &bytes.Buffer{}); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

// TestCounts: a count flag takes an integer plainly, with underscores or
// in scientific notation, and refuses fractions, overflows and words.
func TestCounts(t *testing.T) {
	for in, want := range map[string]int64{"1000000": 1_000_000, "1_000_000": 1_000_000, "1e6": 1_000_000, "2.5e5": 250_000, "0": 0, "1E3": 1000} {
		if got, err := parseCount(in, 1<<40); err != nil || got != want {
			t.Errorf("%s: %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"1.5", "1e-3", "2e12", "NaN", "Inf", "one", ""} {
		if got, err := parseCount(in, 1<<40); err == nil {
			t.Errorf("%q accepted as %d", in, got)
		}
	}
	// 2^63, which MaxInt64 rounds to as a float64: over, not wrapped.
	if got, err := parseCount("9.223372036854775808e18", math.MaxInt64); err == nil {
		t.Errorf("2^63 accepted as %d", got)
	}
}

// TestRunWithArchive: run takes an archive directory and window, answers
// exactly through it, and prints the archive's figures; an archive window
// without an archive is refused.
func TestRunWithArchive(t *testing.T) {
	var out, errOut bytes.Buffer
	dir := filepath.Join(t.TempDir(), "archive")
	args := []string{"run", "-keys", "200000", "-span", "96h", "-window", "24h", "-partition", "6h", "-archive", dir, "-archive-window", "48h"}
	if err := run(context.Background(), args, &out, &errOut); err != nil {
		t.Fatal(err, errOut.String())
	}
	for _, want := range []string{"archive ", "files, window 48h0m0s", "0 new keys dropped, 0 duplicates let through"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if err := run(context.Background(), []string{"run", "-keys", "1000", "-archive-window", "48h"}, &out, &errOut); err == nil {
		t.Error("-archive-window without -archive was accepted")
	}
}

// sharedRun runs dedupbench with args and -json and returns its Result,
// checked for the figures every run on a shared tier must carry: the
// server's keys are the run's commits (none expired, no other run's), its
// bytes per key are a plausible Redis or PostgreSQL figure, and heap,
// keys/s and exactness are those of any run.
func sharedRun(t *testing.T, tierName string, args ...string) bench.Result {
	t.Helper()
	var out, errOut bytes.Buffer
	if err := run(context.Background(), append(append([]string{"run"}, args...), "-json"), &out, &errOut); err != nil {
		t.Fatal(err, errOut.String())
	}
	var res bench.Result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatal(err, out.String())
	}
	s := res.Shared
	if res.Tiers != "memory+"+tierName || s == nil || s.Tier != tierName || s.Name == "" {
		t.Fatalf("tiers %q, shared %+v", res.Tiers, s)
	}
	if s.Keys != int64(res.Stats.Calls.Commits) || s.Keys != res.Fresh || s.Keys == 0 {
		t.Fatalf("the server holds %d keys for %d commits of %d distinct keys", s.Keys, res.Stats.Calls.Commits, res.Fresh)
	}
	// 36-byte UUIDs: about 200 B a key in Redis and in PostgreSQL's table
	// and index.
	if s.BytesPerKey < 120 || s.BytesPerKey > 400 || math.Abs(float64(s.Bytes)/float64(s.Keys)-s.BytesPerKey) > 1e-6 {
		t.Fatalf("%d bytes, %.1f B per key", s.Bytes, s.BytesPerKey)
	}
	if res.HeapBytes == 0 || res.KeysPerSec <= 0 || res.DiskBytes != 0 {
		t.Fatalf("heap %d, %.0f keys/s, disk %d", res.HeapBytes, res.KeysPerSec, res.DiskBytes)
	}
	if err := res.Exactness(); err != nil {
		t.Fatal(err)
	}
	return res
}

// dbSize is the number of keys on every server of addrs.
func dbSize(t *testing.T, addrs ...string) int64 {
	t.Helper()
	var n int64
	for _, a := range addrs {
		c := goredis.NewClient(&goredis.Options{Addr: a})
		k, err := c.DBSize(context.Background()).Result()
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		n += k
	}
	return n
}

// TestRunRedis runs `run -tiers redis` on a Redis the test starts, then on
// a three-master Cluster (-redis with three addresses): every figure is
// present and sane, memory is read on every master, and the run's keys are
// deleted afterwards, or kept with -keep; the text output says the Redis
// memory per key.
func TestRunRedis(t *testing.T) {
	srv := redistest.Start(t)
	res := sharedRun(t, "redis", "-tiers", "redis", "-redis", srv.Addr, "-keys", "40000", "-memory", "10000")
	if res.Shared.Servers != 1 || res.Shared.Kept || len(res.Shared.Name) != len("tierdedup:") {
		t.Fatalf("shared %+v", res.Shared)
	}
	if n := dbSize(t, srv.Addr); n != 0 {
		t.Fatalf("%d keys left in Redis after the run", n)
	}
	// -warmup and -segments time the second half, as plan's calibration.
	kept := sharedRun(t, "redis", "-tiers", "redis", "-redis", srv.Addr, "-keys", "40000", "-warmup", "20000", "-segments", "2", "-keep")
	if n := dbSize(t, srv.Addr); !kept.Shared.Kept || n != kept.Shared.Keys+1 { // and the layout record
		t.Fatalf("-keep left %d keys for %d committed", n, kept.Shared.Keys)
	}
	if kept.Warmup != 20000 || kept.Measured != 20000 || len(kept.SegmentRates) != 2 {
		t.Fatalf("-warmup 20000 -segments 2: warm-up %d, %d timed, rates %v", kept.Warmup, kept.Measured, kept.SegmentRates)
	}
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"run", "-tiers", "redis", "-redis", srv.Addr, "-keys", "20000"}, &out, &errOut); err != nil {
		t.Fatal(err, errOut.String())
	}
	for _, want := range []string{"memory+redis", "redis memory", "B per key: INFO used_memory grew", "deleted after the run", "0 new keys dropped, 0 duplicates let through"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}

	cl := redistest.StartCluster(t)
	res = sharedRun(t, "redis", "-tiers", "redis", "-redis", strings.Join(cl.Addrs(), ","), "-keys", "30000")
	if res.Shared.Servers != 3 {
		t.Fatalf("a Cluster measured on %d masters, want 3", res.Shared.Servers)
	}
	if n := dbSize(t, cl.Addrs()...); n != 0 {
		t.Fatalf("%d keys left in the Cluster after the run", n)
	}
}

// TestRunPostgres runs `run -tiers postgres` on the loopback PostgreSQL:
// every figure is present and sane, the table and index sizes add up to
// the bytes, and the run's table is dropped afterwards.
func TestRunPostgres(t *testing.T) {
	p := pgtest.Pool(t)
	res := sharedRun(t, "postgres", "-tiers", "postgres", "-postgres", pgtest.DSN, "-keys", "40000", "-memory", "10000")
	s := res.Shared
	if s.TableBytes <= 0 || s.IndexBytes <= 0 || s.Bytes != s.TableBytes+s.IndexBytes || s.Servers != 1 {
		t.Fatalf("shared %+v", s)
	}
	var exists bool
	if err := p.QueryRow(context.Background(), "SELECT to_regclass($1) IS NOT NULL", s.Name).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Fatalf("table %s left after the run", s.Name)
	}
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"run", "-tiers", "postgres", "-postgres", pgtest.DSN, "-keys", "20000"}, &out, &errOut); err != nil {
		t.Fatal(err, errOut.String())
	}
	for _, want := range []string{"memory+postgres", "postgres table", "pg_table_size", "pg_indexes_size", "0 new keys dropped, 0 duplicates let through"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// TestPlanSharedTiers: `plan -tiers redis|postgres` calibrates against the
// server and sizes its memory or table from what the calibration measured
// there: the window's keys for Redis, the window's and one partition's
// rows for PostgreSQL.
func TestPlanSharedTiers(t *testing.T) {
	srv := redistest.Start(t)
	pgtest.Pool(t) // the loopback PostgreSQL must answer
	for _, tc := range []struct {
		tier, server string
		held         float64
	}{
		{"redis", srv.Addr, 1e6 * 0.9 * 24 / 24},
		{"postgres", pgtest.DSN, 1e6 * 0.9 * 30 / 24},
	} {
		var out, errOut bytes.Buffer
		args := []string{"plan", "-tiers", tc.tier, "-" + tc.tier, tc.server, "-ids-per-day", "1e6", "-window", "24h", "-partition", "6h",
			"-calibrate", "30000", "-calibrate-store", "20000", "-memory", "10000", "-json"}
		if err := run(context.Background(), args, &out, &errOut); err != nil {
			t.Fatal(err, errOut.String())
		}
		var pl bench.Plan
		if err := json.Unmarshal(out.Bytes(), &pl); err != nil {
			t.Fatal(err, out.String())
		}
		c := pl.Calibration
		server := pl.RedisBytes
		if tc.tier == "postgres" {
			server = pl.PostgresBytes
		}
		if pl.Input.Shared != tc.tier || math.Abs(pl.KeysHeld-tc.held) > 1 || c.SharedBytesPerKey < 120 || c.SharedBytesPerKey > 400 ||
			server != pl.KeysHeld*c.SharedBytesPerKey || c.FixedHeapBytes <= 0 || pl.HeapBytes != pl.MemoryBytes+c.FixedHeapBytes ||
			c.KeysPerSec <= 0 || pl.Headroom <= 0 || c.StoreKeys < 40_000 || pl.DiskBytes != 0 || pl.BloomBytes != 0 {
			t.Fatalf("%s plan %+v", tc.tier, pl)
		}
	}
	if n := dbSize(t, srv.Addr); n != 0 {
		t.Fatalf("%d keys left in Redis after the calibration", n)
	}
}

// TestCompareSharedTiers: `compare -tiers redis` prints the engine on the
// Redis tier beside pipelined SET NX EX, and `compare -tiers postgres` the
// engine on the PostgreSQL tier beside batched INSERT … ON CONFLICT DO
// NOTHING, each with its ratio, in the same run. With -keep, Redis holds
// the keys of exactly three prefixes afterwards: each engine row (MarkBatch,
// Claim + CommitAsync, Do) ran on the Redis tier over its own, and the
// baselines deleted theirs; the PostgreSQL baselines drop their tables,
// also when the time budget interrupted a statement and pgx closed its
// connection.
func TestCompareSharedTiers(t *testing.T) {
	srv := redistest.Start(t)
	pool := pgtest.Pool(t)
	start := time.Now().UnixNano()
	for _, tc := range []struct {
		tier string
		args []string
		rows [][4]string // group, name, batch, concurrency
	}{
		{"redis", []string{"-redis", srv.Addr, "-postgres", "", "-keep"}, [][4]string{
			{"batch", "engine memory+redis MarkBatch", "256", "8"},
			{"batch", "redis SET NX EX pipelined", "256", "4"},
			{"per message", "engine memory+redis Claim + CommitAsync", "1", "1"},
			{"per message", "engine memory+redis Do", "1", "16"},
			{"per message", "redis SET NX EX per message", "1", "16"},
		}},
		{"postgres", []string{"-redis", "", "-postgres", pgtest.DSN}, [][4]string{
			{"batch", "engine memory+postgres MarkBatch", "256", "8"},
			{"batch", "postgres INSERT ON CONFLICT, sorted unnest", "256", "4"},
			{"per message", "engine memory+postgres Claim + CommitAsync", "1", "1"},
			{"per message", "postgres INSERT ON CONFLICT per message", "1", "16"},
		}},
	} {
		var out, errOut bytes.Buffer
		args := append([]string{"compare", "-tiers", tc.tier, "-keys", "30000", "-workers", "8", "-budget", "500ms"}, tc.args...)
		if err := run(context.Background(), args, &out, &errOut); err != nil {
			t.Fatal(err, errOut.String())
		}
		for _, r := range tc.rows {
			if !hasRow(out.String(), r[0], r[1], r[2], r[3], !strings.HasPrefix(r[1], "engine")) {
				t.Errorf("%s: no row %v:\n%s", tc.tier, r, out.String())
			}
		}
	}
	// The baselines' tables are dedupbench_ and the time they were made.
	var left []string
	rows, err := pool.Query(context.Background(), `SELECT tablename FROM pg_tables WHERE tablename ~ '^dedupbench_[0-9]+$' AND substr(tablename, 12)::numeric >= $1`, start)
	if err == nil {
		for rows.Next() {
			var name string
			if err := rows.Scan(&name); err != nil {
				t.Fatal(err)
			}
			left = append(left, name)
		}
		err = rows.Err()
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Errorf("baseline tables left after compare: %v", left)
	}
	keys, err := srv.Client(t).Keys(context.Background(), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	prefixes := map[string]int{}
	for _, k := range keys {
		prefix, _, _ := strings.Cut(k, "\x00")
		prefixes[prefix]++
	}
	if len(prefixes) != 3 {
		t.Fatalf("after compare -keep, Redis holds %d keys under %d prefixes, want 3 (the engine rows'): %v", len(keys), len(prefixes), prefixes)
	}
}

// TestSharedTierFlagsRefused: a shared tier without a server, or one that
// does not answer, and a configuration a shared tier's run cannot measure
// honestly (a stream longer than the window, an archive) are errors, never
// a panic; the latter match bench.ErrConfig.
func TestSharedTierFlagsRefused(t *testing.T) {
	ctx := context.Background()
	for _, args := range [][]string{
		{"run", "-keys", "1000", "-tiers", "redis", "-redis", "127.0.0.1:1"},
		{"run", "-keys", "1000", "-tiers", "redis", "-redis", ""},
		{"run", "-keys", "1000", "-tiers", "redis", "-redis", "127.0.0.1:1,127.0.0.1:2"},
		{"run", "-keys", "1000", "-tiers", "postgres"},
		{"run", "-keys", "1000", "-tiers", "postgres", "-postgres", "postgres://nobody@127.0.0.1:1/none"},
		{"run", "-keys", "1000", "-tiers", "postgres", "-postgres", "not a url"},
		{"run", "-keys", "1000", "-tiers", "redis-cluster"},
		{"plan", "-tiers", "redis", "-redis", "127.0.0.1:1"},
		{"plan", "-tiers", "postgres"},
		{"compare", "-keys", "1000", "-tiers", "redis", "-redis", "127.0.0.1:1", "-postgres", ""},
		{"compare", "-keys", "1000", "-tiers", "postgres", "-postgres", "", "-redis", ""},
	} {
		if err := run(ctx, args, &bytes.Buffer{}, &bytes.Buffer{}); err == nil {
			t.Errorf("%v accepted", args)
		} else {
			t.Logf("%v: %v", args, err)
		}
	}
	for _, args := range [][]string{
		{"run", "-tiers", "redis", "-span", "48h", "-window", "24h"},
		{"run", "-tiers", "postgres", "-postgres", pgtest.DSN, "-span", "25h", "-window", "24h"},
		{"run", "-tiers", "redis", "-archive", t.TempDir()},
		{"compare", "-tiers", "redis", "-span", "200h"},
	} {
		if err := run(ctx, append(args, "-keys", "1000"), &bytes.Buffer{}, &bytes.Buffer{}); !errors.Is(err, bench.ErrConfig) {
			t.Errorf("%v: %v, want bench.ErrConfig", args, err)
		}
	}
	// A plan the shared tier cannot have is refused before any calibration.
	if err := run(ctx, []string{"plan", "-tiers", "postgres", "-archive-window", "400h"}, &bytes.Buffer{}, &bytes.Buffer{}); !errors.Is(err, bench.ErrPlan) {
		t.Errorf("plan -tiers postgres -archive-window: %v, want bench.ErrPlan", err)
	}
}

// TestPlanSaysWhenItDoesNotFit: a plan larger than this machine (2e10 IDs a
// day: about 260 GiB of filters) says so on its first line and names at
// least two changes that fit, with their figures; the JSON carries the
// same verdict.
func TestPlanSaysWhenItDoesNotFit(t *testing.T) {
	args := []string{"plan", "-ids-per-day", "2e10", "-calibrate", "50000", "-calibrate-store", "100000", "-dir", t.TempDir()}
	var out bytes.Buffer
	if err := run(context.Background(), args, &out, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if !strings.HasPrefix(lines[0], "DOES NOT FIT") {
		t.Fatalf("first line %q, want the verdict\n%s", lines[0], out.String())
	}
	fitting := 0
	for _, l := range lines {
		if strings.HasPrefix(l, "to fit") && strings.Contains(l, ": fits. Cost: ") && strings.Contains(l, "GiB") {
			fitting++
		}
	}
	if fitting < 2 {
		t.Fatalf("%d changes that fit, want at least 2:\n%s", fitting, out.String())
	}
	out.Reset()
	if err := run(context.Background(), append(args, "-json"), &out, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	var got struct {
		bench.Plan
		Fit bench.Fit
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got.Fit.Fits() || got.Fit.MemoryFits || got.Fit.Machine.MemoryBytes <= 0 || len(got.Fit.Changes) < 2 || got.HeapBytes < 100<<30 {
		t.Fatalf("JSON fit %+v, heap %.0f", got.Fit.Machine, got.HeapBytes)
	}
}

// TestSampleFlag: run and plan take -sample (a file, or - for standard
// input) in place of -shape and -key-size, and refuse it beside them, and
// a file that is missing or too short.
func TestSampleFlag(t *testing.T) {
	dir := t.TempDir()
	var b strings.Builder
	for i := range 5000 {
		fmt.Fprintf(&b, "inv-%08d-%06x\n", 4_000_000+i, rand.Uint32()>>8)
	}
	path := filepath.Join(dir, "ids.txt")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"run", "-sample", path, "-keys", "50000", "-tiers", "memory", "-json"}, &out, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	var res bench.Result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatal(err, out.String())
	}
	if res.Keys != 50000 || res.Workload.Sample == nil || res.Workload.Sample.Name != path || res.Exactness() != nil {
		t.Fatalf("result %+v", res)
	}
	out.Reset()
	if err := run(context.Background(), []string{"plan", "-sample", path, "-ids-per-day", "1e7", "-calibrate", "50000", "-calibrate-store", "100000", "-json"}, &out, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	var pl bench.Plan
	if err := json.Unmarshal(out.Bytes(), &pl); err != nil {
		t.Fatal(err, out.String())
	}
	if pl.KeyBytes != 19 || pl.Input.Sample == nil || pl.Input.Sample.Name != path || pl.DiskBytes <= 0 {
		t.Fatalf("plan %+v", pl)
	}
	// Standard input.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	go func() { w.WriteString(b.String()); w.Close() }()
	stdin := os.Stdin
	os.Stdin = r
	err = run(context.Background(), []string{"run", "-sample", "-", "-keys", "20000", "-tiers", "memory"}, &out, &bytes.Buffer{})
	os.Stdin = stdin
	if err != nil {
		t.Fatal(err)
	}
	short := filepath.Join(dir, "short.txt")
	os.WriteFile(short, []byte("a\nb\n"), 0o644)
	for _, args := range [][]string{
		{"run", "-keys", "1000", "-sample", path, "-shape", "snowflake"},
		{"run", "-keys", "1000", "-sample", path, "-key-size", "40"},
		{"plan", "-sample", path, "-key-size", "40"},
		{"run", "-keys", "1000", "-sample", filepath.Join(dir, "missing.txt")},
		{"plan", "-sample", short},
	} {
		if err := run(context.Background(), args, &bytes.Buffer{}, &bytes.Buffer{}); !errors.Is(err, bench.ErrSample) && !errors.Is(err, bench.ErrConfig) {
			t.Errorf("%v: %v", args, err)
		}
	}
}

// TestPlanErrorsNameTheirFlags: a plan input refused before its
// calibration names the flag it came from, not the field it fills; so
// does run's.
func TestPlanErrorsNameTheirFlags(t *testing.T) {
	for flag, args := range map[string][]string{
		"-ids-per-day": {"-ids-per-day", "0"},
		"-dup":         {"-dup", "1.5"},
		"-fp":          {"-fp", "2"},
		"-window":      {"-window", "0"},
		"-segments":    {"-segments", "0"},
		"-memory":      {"-memory", "-1"},
	} {
		err := run(context.Background(), append([]string{"plan"}, args...), io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("plan %v: %v, want an error naming %s", args, err, flag)
		}
	}
	if err := run(context.Background(), []string{"run", "-keys", "1000", "-memory", "-1"}, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "-memory") {
		t.Errorf("run -memory -1: %v, want an error naming -memory", err)
	}
}
