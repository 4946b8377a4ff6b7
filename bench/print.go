package bench

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/bloom"
)

// storeName names the durable tier of a run.
func storeName(r *Result) string {
	if r.Shared != nil {
		return r.Shared.Tier
	}
	return "pebble"
}

// PrintResult writes a run's measurements for a person.
func PrintResult(w io.Writer, r *Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	p := func(k string, format string, args ...any) {
		fmt.Fprintf(tw, "%s\t"+format+"\n", append([]any{k}, args...)...)
	}
	c := r.Workload
	cfg := fmt.Sprintf("%s, batch %d, %d workers, memory tier %d keys", r.Tiers, r.Batch, r.Workers, r.MemoryCapacity)
	if r.ExpectedKeys > 0 && r.Tiers != engine.MemoryOnly.String() && r.Shared == nil {
		cfg += fmt.Sprintf(", filters sized for %d keys a partition (ExpectedKeys: the workload's; the library's default is %d)", r.ExpectedKeys, bloom.DefaultExpectedKeys)
	}
	p("configuration", "%s", cfg)
	p("workload", "%d %s keys over %v simulated, %.0f%% duplicates reaching %v, %.1f%% in-batch repeats", r.Keys, c.KeysName(), c.Span, 100*c.DupRatio, c.DupReach, 100*c.InBatchRepeat)
	if r.Rate > 0 {
		p("offered", "%.0f keys/s, open loop: latencies from each batch's due time", r.Rate)
	}
	timed := fmt.Sprintf("%d keys in %v", r.Measured, r.Elapsed.Round(time.Millisecond))
	if r.Warmup > 0 {
		timed += fmt.Sprintf(", after %d warm-up keys", r.Warmup)
	}
	if len(r.SegmentRates) > 1 {
		parts := make([]string, len(r.SegmentRates))
		for i, x := range r.SegmentRates {
			parts[i] = fmt.Sprintf("%.0fk", x/1000)
		}
		timed += ", the median of its parts' " + strings.Join(parts, ", ")
	}
	p("throughput", "%.0f keys/s (%s)", r.KeysPerSec, timed)
	p("extrapolated", "%.2f billion IDs/day: this run's keys/s × 86,400, timed on a store that grew to %d keys; one holding a full window is slower: dedupbench plan -ids-per-day %.3g measures what this machine sustains",
		r.IDsPerDay/1e9, r.Stats.Calls.Commits, r.IDsPerDay)
	p("latency per batch", "p50 %v  p99 %v  p999 %v  max %v (every message of a batch of %d waits this long)", r.BatchLatency.P50, r.BatchLatency.P99, r.BatchLatency.P999, r.BatchLatency.Max, r.Batch)
	p("cost per message", "p50 %v  p99 %v  p999 %v (a batch's latency divided by its messages: the time each costs, not the time it waits)", r.KeyLatency.P50, r.KeyLatency.P99, r.KeyLatency.P999)
	rss := ""
	if r.PeakRSSBytes > 0 {
		rss = fmt.Sprintf("; peak RSS of the process %.1f MiB (VmHWM: the heap's collector room, Pebble's off-heap and the benchmark's own ground truth too)", float64(r.PeakRSSBytes)/(1<<20))
	}
	p("heap", "%.1f MiB live, %.1f B per committed key%s", float64(r.HeapBytes)/(1<<20), r.HeapBytesPerKey, rss)
	if r.DiskBytes > 0 {
		d := r.Stats.Store.Disk
		p("disk", "%.1f MiB as the OS allocates it (du), %.1f B per committed key: SSTs %.1f MiB, WAL %.1f MiB (preallocated), filter files %.1f MiB, other %.1f MiB",
			float64(r.DiskBytes)/(1<<20), r.DiskBytesPerKey, float64(d.Tables+d.ColdTables)/(1<<20), float64(d.WAL)/(1<<20), float64(d.Filters)/(1<<20), float64(d.Other)/(1<<20))
	}
	if r.BloomFPConfigured > 0 {
		p("bloom false positives", "%.4f%% measured vs %.4f%% configured (whole window)", 100*r.BloomFPMeasured, 100*r.BloomFPConfigured)
	}
	if n := r.Stats.Calls.Refreshes; n > 0 {
		p("sliding window", "%d duplicates refreshed their key, each a record (in MarkBatch, written with its batch's commits)", n)
	}
	if s := r.Shared; s != nil {
		fate := "deleted after the run"
		if s.Kept {
			fate = "kept"
		}
		switch s.Tier {
		case SharedRedis:
			p("redis memory", "%.1f MiB, %.1f B per key: INFO used_memory grew by that over %d master(s), which hold %d keys under prefix %s (%s)",
				float64(s.Bytes)/(1<<20), s.BytesPerKey, s.Servers, s.Keys, s.Name, fate)
		case SharedPostgres:
			p("postgres table", "%.1f MiB, %.1f B per row: pg_table_size %.1f MiB + pg_indexes_size %.1f MiB for %d rows in table %s (%s)",
				float64(s.Bytes)/(1<<20), s.BytesPerKey, float64(s.TableBytes)/(1<<20), float64(s.IndexBytes)/(1<<20), s.Keys, s.Name, fate)
		}
		p("hit ratios", "memory %.1f%% of claims; %s found %.1f%% of reads", 100*r.MemoryHitRatio, s.Tier, 100*r.StoreHitRatio)
	} else {
		p("hit ratios", "memory %.1f%% of claims; bloom proved new %.1f%% of memory misses; pebble found %.1f%% of reads",
			100*r.MemoryHitRatio, 100*r.BloomNegativeRatio, 100*r.StoreHitRatio)
	}
	if r.Tiers != engine.MemoryOnly.String() && r.Tiers != engine.BloomOnly.String() {
		st := r.Stats
		by := fmt.Sprintf("memory %d, %s %d", st.Memory.Hits, storeName(r), st.Store.Hits)
		if st.Archive != nil {
			by += fmt.Sprintf(", archive %d", st.Archive.Hits)
		}
		p("duplicates answered by", "%s", by)
	}
	p("partitions dropped", "%d", r.Stats.Store.PartitionsDropped)
	if a := r.Stats.Archive; a != nil {
		disk := ""
		if a.DiskBytes > 0 {
			disk = fmt.Sprintf("; disk %.1f MiB (du of its directory)", float64(a.DiskBytes)/(1<<20))
		}
		p("archive", "%s, window %v: %d partitions and %d keys archived, lag %d; %d reads (%.2f%% of claims), %d found, %d reads of unarchived partitions; filter %.1f MiB%s",
			a.Name, a.Window, a.Partitions, a.Keys, a.Lag, a.Reads, 100*float64(a.Reads)/float64(max(1, r.Stats.Calls.Claims)), a.Hits, a.LagReads, float64(a.FilterBytes)/(1<<20), disk)
	}
	if len(r.PerDay) > 1 {
		var days []string
		for _, d := range r.PerDay {
			days = append(days, fmt.Sprintf("day %d: %.0fk", d.Day+1, d.KeysPerSec/1000))
		}
		p("keys/s per simulated day", "%s", strings.Join(days, ", "))
		if last := r.PerDay[len(r.PerDay)-1]; r.PerDay[0].KeysPerSec > 0 {
			p("last day / first day", "%.2f", last.KeysPerSec/r.PerDay[0].KeysPerSec)
		}
		days = days[:0]
		for _, d := range r.PerDay {
			s := fmt.Sprintf("day %d: %.2f µs CPU/key, %d GCs", d.Day+1, float64(d.CPUPerKey)/1e3, d.GCs)
			if d.WriteAmp > 0 {
				s += fmt.Sprintf(", write amp %.2f", d.WriteAmp)
			}
			days = append(days, s)
		}
		p("cost per simulated day", "%s", strings.Join(days, "; "))
	}
	dups := fmt.Sprintf("%d duplicates let through", r.DupsLetThrough)
	if !r.DupsChecked {
		dups = "duplicates not checked (they reach past the window)"
	}
	p("answers", "%d New for %d distinct keys, checked key by key: %d new keys dropped, %s", r.New, r.Fresh, r.WronglyDropped, dups)
	for _, w := range r.Warnings() {
		p("warning", "%s", w)
	}
	tw.Flush()
}

// PrintPlan writes a plan for a person.
func PrintPlan(w io.Writer, pl Plan) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	p := func(k string, format string, args ...any) {
		fmt.Fprintf(tw, "%s\t"+format+"\n", append([]any{k}, args...)...)
	}
	in := pl.Input
	gib := func(b float64) string { return fmt.Sprintf("%.2f GiB", b/(1<<30)) }
	p("load", "%.0f IDs/day, %.0f%% duplicates, %s keys of %.0f bytes, window %v in %d partitions of %v", in.IDsPerDay, 100*in.DupRatio, WorkloadConfig{Shape: in.Shape, Sample: in.Sample}.KeysName(), pl.KeyBytes, in.Window, pl.Live, in.Partition)
	p("keys held", "%.3g per partition, %.3g at most in the durable tier", pl.KeysPerPartition, pl.KeysHeld)
	if in.Sliding {
		p("sliding window", "%.3g refreshes/day (%.0f%% of duplicates land in a later partition than their key's commit): each a record, counted in the keys per partition", pl.RefreshesPerDay, 100*pl.RefreshesPerDay/max(in.IDsPerDay*in.DupRatio, 1))
	}
	if pl.BloomBytes > 0 {
		p("bloom", "%.1f bits/key, k=%d, %.4f%% per partition, %.4f%% over the window: %s for %d filters",
			pl.BloomBitsPerKey, pl.BloomK, 100*pl.BloomPartitionFP, 100*pl.BloomWindowFP, gib(pl.BloomBytes), pl.Live)
	}
	if pl.MemoryBytes > 0 {
		p("memory tier", "%s (%d keys × %.1f B)", gib(pl.MemoryBytes), max(in.MemoryCapacity, 0), MemoryEntryBytes)
	}
	if a := pl.ArchiveLayout; a.Partitions > 0 {
		p("archive", "%v: %.3g keys past the window; filter of %d slots of %d partitions, %.4f%% false positives: %s on the heap; disk %s (tables at %.1f B/key, blobs %s)",
			in.ArchiveWindow, pl.ArchiveKeysHeld, a.Slots, a.Group, 100*pl.ArchiveFP, gib(pl.ArchiveFilterBytes), gib(pl.ArchiveDiskBytes), pl.Calibration.TableBytesPerKey, gib(pl.ArchiveBlobBytes))
	}
	p("heap", "%s live", gib(pl.HeapBytes))
	if pl.OffHeapBytes > 0 {
		p("pebble off-heap", "%s (memtables and block cache, as full as this load fills them)", gib(pl.OffHeapBytes))
	}
	if pl.PeakRSSBytes > 0 {
		p("peak RSS", "%s with GOMEMLIMIT=%s (the live heap × %.2f, and at least %d MiB above it: the collector's room), what the fit is judged by; %s without it (the collector lets the heap grow to twice its live size); both count the program's own code, %s as this calibration's process had it resident",
			gib(pl.PeakRSSBytes), memLimit(pl.MemoryLimitBytes), GCHeadroom, GCMinRoomBytes>>20, gib(pl.PeakRSSNoLimitBytes), gib(pl.ProgramBytes))
	}
	if o := pl.Options(); o != "" {
		p("settings", "%s", o)
	}
	if pl.DiskBytes > 0 {
		p("disk", "%s as the OS allocates it (du): SSTs %s (compacted, %.1f B/key measured by the calibration); WAL %.0f MiB (live and recycled files, preallocated); filter files %s; other %.0f MiB",
			gib(pl.DiskBytes), gib(pl.TableBytes), pl.Calibration.TableBytesPerKey, pl.WALBytes/(1<<20), gib(pl.FilterFileBytes), pl.Calibration.FixedDiskBytes/(1<<20))
	}
	source := "RedisFixedBytes + the key: no calibration"
	if in.Shared == SharedPostgres {
		source = "PostgresFixedBytes + the key: no calibration"
	}
	if pl.Calibration.SharedBytesPerKey > 0 {
		source = "measured on the server by the calibration"
	}
	if pl.RedisBytes > 0 {
		p("redis memory", "%s: %.3g keys (the window's: each expires by its TTL) × %.1f B (used_memory, %s)", gib(pl.RedisBytes), pl.KeysHeld, pl.SharedBytesPerKey, source)
	}
	if pl.PostgresBytes > 0 {
		p("postgres table", "%s: %.3g rows at most (the window's and one partition's: an expired row is swept at the next rotation) × %.1f B (pg_table_size + pg_indexes_size, %s)",
			gib(pl.PostgresBytes), pl.KeysHeld, pl.SharedBytesPerKey, source)
	}
	c := pl.Calibration
	rates := make([]string, len(c.SegmentRates))
	for i, r := range c.SegmentRates {
		rates[i] = fmt.Sprintf("%.0fk", r/1000)
	}
	p("calibration", "%d keys timed in %v over a store of %d keys: %.0f keys/s on this machine (median of %s)",
		c.Keys, c.Elapsed.Round(time.Millisecond), c.StoreKeys, c.KeysPerSec, strings.Join(rates, ", "))
	derate := ""
	if pl.Derate != 1 {
		derate = fmt.Sprintf(", × %.2f: the planned store is larger than the calibration's", pl.Derate)
	}
	if c.KeysPerSec > 0 && in.Shared != "" {
		p("steady state", "%.0f keys/s of marks into the %s tier holding the calibration's %d keys (expiry's own cost, Redis's expire cycle or PostgreSQL's sweep, is not in it)",
			pl.CapacityPerDay/86400, in.Shared, c.StoreKeys)
	} else if c.KeysPerSec > 0 {
		p("steady state", "%.0f keys/s on the last day of a full %v window (timed after every live partition was filled%s)",
			pl.CapacityPerDay/86400, in.Window, derate)
	}
	spread := ""
	if r := pl.HeadroomRange; r[0] > 0 && (r[0] != pl.Headroom || r[1] != pl.Headroom) {
		spread = fmt.Sprintf(" (range %.2f–%.2f×: the calibration's slowest and fastest segments", r[0], r[1])
		if lo, _ := c.spread(); pl.Derate != 1 && pl.CapacityRange[0] < lo*pl.Derate*86400*0.999 {
			spread += fmt.Sprintf(", and at the low end one more × %.2f for each tenfold the store exceeds %d× the calibration's, beyond what the derate was measured at", LargeStoreFactor, MeasuredDerateRatio)
		}
		spread += ")"
	}
	p("headroom", "%.2f×%s: one process sustains %.3g IDs/day", pl.Headroom, spread, pl.CapacityPerDay)
	if x := pl.KeysHeld / float64(c.StoreKeys); in.Shared != "" && c.StoreKeys > 0 && x > 1.25 {
		p("warning", "the planned tier holds %.0f× the calibration's keys: its rate was measured on a smaller one (PostgreSQL slows once its table and index outgrow its memory); raise -calibrate-store, or run the load at scale, before relying on the headroom", x)
	}
	if c.StoreKeys > 0 && pl.Derate != 1 {
		if x := pl.KeysHeld / float64(c.StoreKeys); x > 10 {
			p("warning", "the planned store is %.0f× the calibration's; the derate was measured at 9×: run the load at a fraction of its scale on the target machine (dedupbench run) before relying on the headroom", x)
		}
	}
	tw.Flush()
}

// PrintCompare writes a comparison table for a person.
func PrintCompare(w io.Writer, rows []CompareRow) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "group\twhat\tbatch\tconcurrency\tkeys\tkeys/s\tthe group's engine row is")
	for _, r := range rows {
		if r.Skipped != "" {
			fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t-\tskipped: %s\n", r.Group, r.Name, r.Skipped)
			continue
		}
		ratio := ""
		switch {
		case r.Ratio >= 1:
			ratio = fmt.Sprintf("%.1f× faster", r.Ratio)
		case r.Ratio > 0:
			ratio = fmt.Sprintf("%.1f× slower", 1/r.Ratio)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%.0f\t%s\n", r.Group, r.Name, r.Batch, r.Concurrency, r.Keys, r.KeysPerSec, ratio)
	}
	tw.Flush()
}

// PrintSearch writes a rate search for a person.
func PrintSearch(w io.Writer, s *Search) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "closed-loop ceiling\t%.0f keys/s\n", s.Ceiling)
	fmt.Fprintf(tw, "offered keys/s\tachieved\tp50\tp99\tp999\tp99 <= %v and kept up\n", s.Target)
	for _, p := range s.Tried {
		fmt.Fprintf(tw, "%.0f\t%.0f\t%v\t%v\t%v\t%t\n", p.Rate, p.Achieved, p.Latency.P50, p.Latency.P99, p.Latency.P999, p.OK)
	}
	tw.Flush()
	if s.Best.Rate > 0 {
		fmt.Fprintf(w, "highest rate with p99 <= %v: %.0f keys/s (p99 %v)\n", s.Target, s.Best.Rate, s.Best.Latency.P99)
	} else {
		fmt.Fprintf(w, "no rate tried kept p99 <= %v\n", s.Target)
	}
}

// PrintFitVerdict writes, before a plan, whether it fits the machine.
func PrintFitVerdict(w io.Writer, f Fit) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	m := f.Machine
	gib := func(b float64) string { return fmt.Sprintf("%.2f GiB", b/(1<<30)) }
	disk := "free disk unknown: not checked"
	if m.DiskBytes > 0 {
		disk = fmt.Sprintf("disk %s of the %s free at %s (%.0f%%)", gib(f.DiskBytes), gib(m.DiskBytes), m.DiskPath, 100*f.DiskBytes/m.DiskBytes)
	}
	memory := fmt.Sprintf("memory %s of %s (%s, %.0f%%)", gib(f.MemoryBytes), gib(m.MemoryBytes), m.MemorySource, 100*f.MemoryBytes/m.MemoryBytes)
	if f.Fits() {
		fmt.Fprintf(tw, "fits\tthis machine: %s; %s (a plan fits within %.0f%% of each)\n", memory, disk, 100*FitShare)
	} else {
		var what []string
		if !f.MemoryFits {
			what = append(what, "memory")
		}
		if !f.DiskFits {
			what = append(what, "disk")
		}
		fmt.Fprintf(tw, "DOES NOT FIT\tthis machine's %s: %s; %s (a plan fits within %.0f%% of each: the rest is the Go runtime's room between collections, the page cache and the rest of the machine). Changes that would make it fit follow the plan.\n",
			strings.Join(what, " and "), memory, disk, 100*FitShare)
	}
	tw.Flush()
}

// PrintFitChanges writes, after a plan that does not fit, the changes that
// would make it fit, each with the plan's figures after it and its cost.
func PrintFitChanges(w io.Writer, f Fit) {
	if f.Fits() {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	gib := func(b float64) string { return fmt.Sprintf("%.2f GiB", b/(1<<30)) }
	if len(f.Changes) == 0 {
		fmt.Fprintf(tw, "to fit\tno change of the window, the filters' target or the process count found: run it on a larger machine\n")
	}
	for _, c := range f.Changes {
		mem, disk := needs(c.Plan)
		verdict := "fits"
		switch {
		case !c.MemoryFits && !c.DiskFits:
			verdict = "still does not fit memory nor disk"
		case !c.MemoryFits:
			verdict = "still does not fit memory"
		case !c.DiskFits:
			verdict = "fits memory, still not disk"
		}
		headroom := fmt.Sprintf("headroom %.2f×", c.Plan.Headroom)
		if c.Plan.Calibration.KeysPerSec == 0 {
			headroom = "headroom not calibrated"
		}
		fmt.Fprintf(tw, "to fit\t%s: memory %s, disk %s, %s: %s. Cost: %s\n", c.What, gib(mem), gib(disk), headroom, verdict, c.Cost)
	}
	tw.Flush()
}
