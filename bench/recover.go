package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/hooks"
)

// RecoverConfig describes a recovery measurement: a store filled with Keys
// messages over Days simulated days, a SIGKILL while it is still being
// written, and three reopens of copies of the killed store: as the kill
// left it (the sealed partitions' filters load, the open partition's is
// restored from its checkpoint and the journal after it); with the
// checkpoint files removed (the open partition is rebuilt by a scan of
// Pebble); with every filter file removed (the whole window is).
type RecoverConfig struct {
	// Keys is the messages written before the kill (10 % duplicates).
	Keys int64
	// Days is the simulated days they span; zero means the window's
	// partitions plus one, so the window is full and has rotated.
	Days int
	// Engine configures the engine (Default), its Backend the embedded
	// store with a Dir.
	Engine engine.Options
	// Batch is keys per MarkBatch (zero: 256), Workers the goroutines
	// (zero: 8).
	Batch, Workers int
	// After is how long the load runs once the filters are warm, for the
	// warm rate; zero means 3 s.
	After time.Duration
}

func (c *RecoverConfig) defaults() {
	o := c.Engine.WithDefaults()
	if c.Days <= 0 {
		c.Days = int(o.Window/o.Partition) + 1
	}
	if c.Batch <= 0 {
		c.Batch = 256
	}
	if c.Workers <= 0 {
		c.Workers = 8
	}
	if c.After <= 0 {
		c.After = 3 * time.Second
	}
	if c.Engine.ExpectedKeys == 0 {
		c.Engine.ExpectedKeys = int(float64(c.Keys) * 0.9 / float64(c.Days) * float64(o.Partition) / float64(24*time.Hour))
	}
}

func (c *RecoverConfig) workload(seed uint64) WorkloadConfig {
	return WorkloadConfig{Keys: c.Keys, Shape: UUIDv4, DupRatio: 0.1, DupReach: time.Hour, Span: time.Duration(c.Days) * 24 * time.Hour, Seed: seed}
}

// RecoverResult is what one reopen after the kill measured.
type RecoverResult struct {
	// Mode is the reopen: RecoverCheckpoint, RecoverNoCheckpoint or
	// RecoverRebuildAll.
	Mode string
	// StoreKeys is the messages written before the kill.
	StoreKeys int64
	// Open is engine.Open's duration; Warm the time from its start until
	// the filters were warm.
	Open, Warm time.Duration
	// SealedLoaded is the sealed filters loaded, RebuiltKeys the keys
	// scanned from Pebble into the filters; Restored the partitions
	// restored from a checkpoint, JournalKeys the keys read back from the
	// journal after it.
	SealedLoaded, RebuiltKeys, Restored, JournalKeys uint64
	// RebuildingRate is the keys/s of MarkBatch calls made while the
	// filters rebuilt (every key memory does not know reads Pebble);
	// WarmRate the keys/s in the After that followed.
	RebuildingRate, WarmRate float64
	// RebuildingKeys is the messages processed while rebuilding.
	RebuildingKeys int64
	// Disk is the store's directory at the end, as the OS allocates it
	// (Stats.Store.Disk).
	Disk engine.DiskParts
}

// pumpStream runs workers MarkBatch calls over stream until it ends, ctx
// ends or stop returns true (checked between batches), counting messages in
// processed.
func pumpStream(ctx context.Context, e *engine.Engine, stream *Stream, batch, workers int, processed *atomic.Int64, stop func() bool) error {
	var (
		mu       sync.Mutex
		wg       sync.WaitGroup
		firstErr error
		once     sync.Once
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var keys [][]byte
			var kinds []Kind
			out := make([]engine.Outcome, batch)
			for ctx.Err() == nil && (stop == nil || !stop()) {
				mu.Lock()
				keys, kinds = stream.Batch(keys, kinds, batch)
				mu.Unlock()
				if len(keys) == 0 {
					return
				}
				if err := e.MarkBatch(ctx, keys, nil, out[:len(keys)]); err != nil {
					once.Do(func() { firstErr = err; cancel() })
					return
				}
				processed.Add(int64(len(keys)))
			}
		}()
	}
	wg.Wait()
	if firstErr != nil && !errors.Is(firstErr, context.Canceled) {
		return firstErr
	}
	return nil
}

// RecoverFill is the child that fills the store: it writes the
// configuration's messages, waits until every closed partition's filter is
// sealed, prints "READY <simulated Unix ns>" and goes on writing new keys
// in the open partition until it is killed.
func RecoverFill(ctx context.Context, c RecoverConfig, out io.Writer) error {
	c.defaults()
	stream, err := NewStream(c.workload(1))
	if err != nil {
		return err
	}
	var processed atomic.Int64
	o := c.Engine
	// The last message is a minute before the last day ends: the writes
	// that follow until the kill stay in that day's open partition.
	o.Clock = simClock{start: Start.Add(-time.Minute), step: stream.step, processed: &processed}
	o.Lease = o.WithDefaults().Window / 2 // simulated time runs fast (see Run)
	e, err := engine.Open(&o)
	if err != nil {
		return err
	}
	if err := pumpStream(ctx, e, stream, c.Batch, c.Workers, &processed, nil); err != nil {
		return err
	}
	parts := int(o.WithDefaults().Window / o.WithDefaults().Partition)
	deadline := time.Now().Add(5 * time.Minute)
	for e.Stats().Bloom.Sealed < uint64(parts) {
		if time.Now().After(deadline) {
			return fmt.Errorf("%d closed partitions sealed after 5 minutes, want %d", e.Stats().Bloom.Sealed, parts)
		}
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Fprintf(out, "READY %d\n", o.Clock.Now().UnixNano())
	// Keep writing, at the end of the last simulated day, until killed.
	more, err := NewStream(WorkloadConfig{Keys: 1 << 40, Shape: UUIDv4, Seed: 99, Span: time.Minute})
	if err != nil {
		return err
	}
	var n atomic.Int64
	return pumpStream(ctx, e, more, c.Batch, c.Workers, &n, nil)
}

// The reopens of a recovery measurement.
const (
	RecoverCheckpoint   = "checkpoint"    // the store as the kill left it
	RecoverNoCheckpoint = "no checkpoint" // the checkpoint files removed and the journal not read
	RecoverRebuildAll   = "rebuild all"   // every filter file removed, the journal not read
)

// RecoverModes are the reopens Recover measures, in order.
var RecoverModes = []string{RecoverCheckpoint, RecoverNoCheckpoint, RecoverRebuildAll}

// RecoverMeasure is the child that reopens the killed store in dir after
// removing what mode says, runs a load of new keys from the simulated time
// at (Unix ns) while the filters rebuild and for c.After once warm, prints
// "RESULT <json>", and returns without closing the engine.
func RecoverMeasure(ctx context.Context, c RecoverConfig, at int64, mode string, out io.Writer) error {
	c.defaults()
	res := RecoverResult{Mode: mode, StoreKeys: c.Keys}
	sealed := filepath.Join(c.dir(), "tierdedup-sealed")
	seed := uint64(2)
	switch mode {
	case RecoverCheckpoint:
	case RecoverNoCheckpoint:
		// The checkpoint files go, and the journal is not read either (a
		// store younger than its first checkpoint restores from the
		// journal alone): the open partition is scanned, as when the
		// checkpoint is damaged.
		seed = 3
		ckpts, err := filepath.Glob(filepath.Join(sealed, "*.ckpt"))
		if err != nil {
			return err
		}
		for _, f := range ckpts {
			if err := os.Remove(f); err != nil {
				return err
			}
		}
		hooks.NoRestore.Store(true)
	case RecoverRebuildAll:
		seed = 4
		if err := os.RemoveAll(sealed); err != nil {
			return err
		}
		hooks.NoRestore.Store(true)
	default:
		return fmt.Errorf("bench: unknown recover mode %q", mode)
	}
	all := mode != RecoverCheckpoint
	stream, err := NewStream(c.workload(seed))
	if err != nil {
		return err
	}
	var processed atomic.Int64
	o := c.Engine
	// The clock stays where the kill left it: the load and the rebuild
	// share the open partition, as right after a restart.
	o.Clock = simClock{start: time.Unix(0, at), processed: &processed}
	o.Lease = o.WithDefaults().Window / 2
	if all {
		o.Logger = slog.New(slog.DiscardHandler) // it would name each file removed above
	}
	t0 := time.Now()
	e, err := engine.Open(&o)
	if err != nil {
		return err
	}
	res.Open = time.Since(t0)
	var warmAt time.Time
	var warmKeys int64
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			mu.Lock()
			if warmAt.IsZero() && e.Stats().Bloom.Mode == "warm" {
				warmAt, warmKeys = time.Now(), processed.Load()
			}
			w := warmAt
			mu.Unlock()
			if !w.IsZero() {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	err = pumpStream(ctx, e, stream, c.Batch, c.Workers, &processed, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return !warmAt.IsZero() && time.Since(warmAt) >= c.After
	})
	end, total := time.Now(), processed.Load()
	<-done
	if err != nil {
		return err
	}
	if warmAt.IsZero() {
		return errors.New("the filters never became warm")
	}
	st := e.Stats()
	res.Warm = warmAt.Sub(t0)
	res.SealedLoaded, res.RebuiltKeys = st.Bloom.SealedLoaded, st.Bloom.RebuiltKeys
	res.Restored, res.JournalKeys = st.Bloom.Restored, st.Bloom.JournalKeys
	res.Disk = st.Store.Disk
	res.RebuildingKeys = warmKeys
	if d := warmAt.Sub(t0) - res.Open; d > 0 {
		res.RebuildingRate = float64(warmKeys) / d.Seconds()
	}
	res.WarmRate = float64(total-warmKeys) / end.Sub(warmAt).Seconds()
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "RESULT %s\n", b)
	return err
}

// Recover fills a store in a child process, kills it with SIGKILL, and
// reopens a copy of it per RecoverModes in child processes, each with the
// killed directory's contents (so each reopen recovers from the kill, not
// from the reopen before). child(dir, args...) runs this program's recover
// child on dir with args (RecoverFill with "-phase fill", RecoverMeasure
// with "-phase measure").
func Recover(ctx context.Context, c RecoverConfig, child func(dir string, args ...string) *exec.Cmd) ([]RecoverResult, error) {
	c.defaults()
	cmd := child(c.dir(), "-phase", "fill")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(stdout)
	var at int64
	for sc.Scan() {
		if s, ok := strings.CutPrefix(sc.Text(), "READY "); ok {
			at, err = strconv.ParseInt(s, 10, 64)
			// Let it write into the open partition a moment, then kill it
			// in the middle of its writes.
			time.Sleep(500 * time.Millisecond)
			_ = cmd.Process.Signal(syscall.SIGKILL)
			break
		}
	}
	_, _ = io.Copy(io.Discard, stdout)
	_ = cmd.Wait()
	if at == 0 || err != nil {
		return nil, fmt.Errorf("the filling child never got ready (%v)", err)
	}
	var results []RecoverResult
	for _, mode := range RecoverModes {
		dir := c.dir() + ".reopen"
		if err := copyDir(c.dir(), dir); err != nil {
			return nil, err
		}
		out, err := child(dir, "-phase", "measure", "-at", strconv.FormatInt(at, 10), "-mode", mode).Output()
		_ = os.RemoveAll(dir)
		if err != nil {
			return nil, fmt.Errorf("reopen (%s): %w", mode, err)
		}
		var r RecoverResult
		for _, line := range strings.Split(string(out), "\n") {
			if s, ok := strings.CutPrefix(line, "RESULT "); ok {
				err = json.Unmarshal([]byte(s), &r)
			}
		}
		if err != nil || r.Mode == "" {
			return nil, fmt.Errorf("reopen (%s): no result (%v)", mode, err)
		}
		results = append(results, r)
	}
	return results, ctx.Err()
}

// PrintRecover prints the results of Recover.
func PrintRecover(w io.Writer, rs []RecoverResult) {
	fmt.Fprintf(w, "%-14s %10s %8s %8s %7s %9s %12s %12s %14s %9s %9s\n", "reopen", "store keys", "open", "warm", "sealed", "restored", "journal keys", "rebuilt keys", "rebuilding k/s", "warm k/s", "disk MiB")
	for _, r := range rs {
		fmt.Fprintf(w, "%-14s %10d %8s %8s %7d %9d %12d %12d %14.0f %9.0f %9.1f\n", r.Mode, r.StoreKeys, r.Open.Round(time.Millisecond), r.Warm.Round(time.Millisecond),
			r.SealedLoaded, r.Restored, r.JournalKeys, r.RebuiltKeys, r.RebuildingRate/1000, r.WarmRate/1000, float64(r.Disk.Total)/(1<<20))
	}
	if len(rs) > 0 {
		d := rs[len(rs)-1].Disk
		fmt.Fprintf(w, "disk (as the OS allocates it, du; the last reopen's): SSTs %.1f MiB, WAL %.1f MiB (preallocated), filter files %.1f MiB, other %.1f MiB\n",
			float64(d.Tables+d.ColdTables)/(1<<20), float64(d.WAL)/(1<<20), float64(d.Filters)/(1<<20), float64(d.Other)/(1<<20))
	}
}

// copyDir copies the directory tree src to dst (replaced): regular files
// and directories only, as a store holds.
func copyDir(src, dst string) error {
	if err := os.RemoveAll(dst); err != nil {
		return err
	}
	return filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(to, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		in, err := os.Open(path)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.Create(to)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	})
}

// dir is the embedded store's directory the engine is configured with.
func (c *RecoverConfig) dir() string {
	if b := embeddedIn(&c.Engine); b != nil {
		return b.Dir
	}
	return ""
}
