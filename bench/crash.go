package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
)

// Strategy is how a consumer orders processing and committing its offset.
type Strategy string

// The strategies of the crash table.
const (
	OffsetFirst  Strategy = "commit offset, then process"
	ProcessFirst Strategy = "process, then commit offset"
	WithEngine   Strategy = "process with the dedup engine, then commit offset"
	// WithLedger writes the effect as a record in the engine's commit
	// (CommitBatchWith): effect and mark are one atomic write.
	WithLedger Strategy = "effect written in the engine's commit, then commit offset"
)

// Strategies lists them in table order.
var Strategies = []Strategy{OffsetFirst, ProcessFirst, WithEngine, WithLedger}

// Kill is one SIGKILL of the consumer: just before it processes message At,
// or, with AfterEffect, after that message's effect and before it is
// marked. For WithLedger, whose effect and mark are one write, an
// AfterEffect kill lands inside that write: at the first file sync it
// makes, when its first bytes are written and not yet synced. An atomic
// write leaves both halves or neither; a write in two steps would leave the
// effect without its mark.
type Kill struct {
	At          int
	AfterEffect bool
}

// CrashConfig is the crash experiment: Messages messages, the offset
// committed every Every, the consumer killed (SIGKILL) at each of Kills in
// turn and restarted, then run to the end. Kills must fall in distinct
// offset batches, in increasing order. Without Kills, one kill just before
// message KillAt.
type CrashConfig struct {
	Messages, Every, KillAt int
	Kills                   []Kill
	// Kafka, if set, runs the consumers against a Kafka topic (see
	// CrashTableKafka) instead of a file holding the committed offset.
	Kafka *KafkaCrash
}

// Expected returns the row a strategy must produce for c's kills: what is
// lost or repeated follows from where each kill falls in its offset batch.
func (c CrashConfig) Expected(s Strategy) CrashRow {
	row := CrashRow{Strategy: s}
	for _, k := range c.kills() {
		start := (k.At-1)/c.Every*c.Every + 1
		end := min(start+c.Every-1, c.Messages)
		done := k.At - start // effects of this batch before the kill
		if k.AfterEffect {
			done++
		}
		switch s {
		case OffsetFirst:
			row.Lost += end - start + 1 - done
		case ProcessFirst:
			row.Duplicated += done
		case WithEngine:
			if k.AfterEffect {
				row.Duplicated++ // the effect happened; its mark did not
			}
		}
	}
	row.Processed = c.Messages - row.Lost + row.Duplicated
	return row
}

func (c CrashConfig) kills() []Kill {
	if len(c.Kills) == 0 {
		return []Kill{{At: c.KillAt}}
	}
	return c.Kills
}

// RandomKills picks n kill points in distinct offset batches of a topic of
// messages, each at a random message and phase.
func RandomKills(messages, every, n int, rng *rand.Rand) []Kill {
	batches := rng.Perm((messages + every - 1) / every)[:min(n, (messages+every-1)/every)]
	slices.Sort(batches)
	kills := make([]Kill, len(batches))
	for i, b := range batches {
		size := min(every, messages-b*every)
		kills[i] = Kill{At: b*every + 1 + rng.IntN(size), AfterEffect: rng.IntN(2) == 0}
	}
	return kills
}

// CrashRow is one strategy's outcome: effects performed, messages whose
// effect happened more than once, messages whose effect never happened.
type CrashRow struct {
	Strategy   Strategy
	Processed  int
	Duplicated int
	Lost       int
}

// CrashTable runs the experiment for each strategy with real processes:
// child(args...) must return a command that runs CrashChild with args.
func CrashTable(ctx context.Context, c CrashConfig, child func(args ...string) *exec.Cmd) ([]CrashRow, error) {
	var rows []CrashRow
	for _, s := range Strategies {
		row, err := CrashRun(ctx, c, s, child)
		if err != nil {
			return nil, err
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// CrashRun runs the experiment for one strategy.
func CrashRun(ctx context.Context, c CrashConfig, s Strategy, child func(args ...string) *exec.Cmd) (CrashRow, error) {
	dir, err := os.MkdirTemp("", "dedupbench-crash-")
	if err != nil {
		return CrashRow{}, err
	}
	defer os.RemoveAll(dir)
	args := []string{"-strategy", strconv.Itoa(strategyIndex(s)), "-dir", dir, "-messages", strconv.Itoa(c.Messages), "-every", strconv.Itoa(c.Every)}
	ledger := filepath.Join(dir, "dedup")
	if c.Kafka != nil {
		args = append(args, c.Kafka.args(s)...)
		ledger = filepath.Join(ledger, crashGroup(s), c.Kafka.Topic+".0") // kafkadedup's directory of partition 0
	}
	for _, k := range c.kills() {
		phase := "before"
		if k.AfterEffect {
			phase = "effect"
		}
		if err := runUntilKilled(ctx, child(append(args, "-kill-at", strconv.Itoa(k.At), "-kill-phase", phase)...), k.At, phase); err != nil {
			return CrashRow{}, fmt.Errorf("%s: kill at %d (%s): %w", s, k.At, phase, err)
		}
	}
	if out, err := child(args...).CombinedOutput(); err != nil {
		return CrashRow{}, fmt.Errorf("%s: restart: %w\n%s", s, err, out)
	}
	var row CrashRow
	if s == WithLedger {
		row, err = countLedger(ledger, c.Messages)
	} else {
		row, err = countEffects(dir, c.Messages)
	}
	row.Strategy = s
	return row, err
}

// runUntilKilled starts cmd, waits until it reports reaching message at in
// phase, and kills it with SIGKILL.
func runUntilKilled(ctx context.Context, cmd *exec.Cmd, at int, phase string) error {
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	sc := bufio.NewScanner(out)
	want := "AT " + strconv.Itoa(at) + " " + phase
	reached := false
	for sc.Scan() {
		if sc.Text() == want {
			reached = true
			_ = cmd.Process.Signal(syscall.SIGKILL)
			break
		}
	}
	_, _ = io.Copy(io.Discard, out)
	_ = cmd.Wait()
	if !reached {
		return errors.New("the consumer never reached the kill point")
	}
	return ctx.Err()
}

// countEffects counts the effects appended to dir/effects.
func countEffects(dir string, messages int) (CrashRow, error) {
	f, err := os.Open(filepath.Join(dir, "effects"))
	if err != nil {
		return CrashRow{}, err
	}
	defer f.Close()
	seen := map[int]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		n, err := strconv.Atoi(sc.Text())
		if err != nil {
			return CrashRow{}, fmt.Errorf("effects file: %w", err)
		}
		seen[n]++
	}
	if err := sc.Err(); err != nil {
		return CrashRow{}, err
	}
	return tally(seen, messages), nil
}

// strategyIndex is s's index in Strategies, which names it to a child.
func strategyIndex(s Strategy) int { return slices.Index(Strategies, s) }

// countLedger counts the effect records WithLedger appended in the store
// in dir, one per application (effect/<message>/<pid>-<n>), so a repeat is
// seen.
func countLedger(dir string, messages int) (CrashRow, error) {
	e, err := engine.Open(&engine.Options{Dir: dir, ExpectedKeys: 10_000, Logger: crashQuiet})
	if err != nil {
		return CrashRow{}, err
	}
	defer e.Close()
	seen := map[int]int{}
	err = e.ScanWrites([]byte("effect/"), func(k, _ []byte) error {
		m, _, _ := strings.Cut(strings.TrimPrefix(string(k), "effect/"), "/")
		n, err := strconv.Atoi(m)
		seen[n]++
		return err
	})
	return tally(seen, messages), err
}

// tally turns effects per message into a row.
func tally(seen map[int]int, messages int) CrashRow {
	var row CrashRow
	for _, n := range seen {
		row.Processed += n
	}
	for m := 1; m <= messages; m++ {
		switch {
		case seen[m] == 0:
			row.Lost++
		case seen[m] > 1:
			row.Duplicated += seen[m] - 1
		}
	}
	return row
}

// CrashChild is the consumer of the crash experiment: it reads its offset,
// processes messages in batches of every (each effect appended and fsynced
// to dir/effects, or, for WithLedger, written as a record in the engine's
// commit), commits its offset per the strategy, and, given killAt, prints
// "AT killAt before" before that message (or "AT killAt effect" after its
// effect, with afterEffect) and waits to be killed.
func CrashChild(ctx context.Context, strategy Strategy, dir string, messages, every, killAt int, afterEffect bool) error {
	offsetPath := filepath.Join(dir, "offset")
	effects, err := os.OpenFile(filepath.Join(dir, "effects"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer effects.Close()
	effect := func(m int) error { return appendEffect(effects, m) }
	wait := func(m int, phase string) error { return waitKill(ctx, m, phase) }
	var e *engine.Engine
	// For WithLedger's kill inside its commit: the store's files stop at
	// their first sync once armed, say so, and wait for the SIGKILL.
	hook := &syncHook{FS: vfs.Default}
	if strategy == WithEngine || strategy == WithLedger {
		if e, err = engine.Open(&engine.Options{Dir: filepath.Join(dir, "dedup"), FS: hook, ExpectedKeys: 10_000}); err != nil {
			return err
		}
		defer e.Close()
	}
	offset := 0
	if b, err := os.ReadFile(offsetPath); err == nil {
		offset, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	commitOffset := func(o int) error { return writeSynced(offsetPath, strconv.Itoa(o)) }
	for offset < messages {
		end := min(offset+every, messages)
		if strategy == OffsetFirst {
			if err := commitOffset(end); err != nil {
				return err
			}
		}
		for m := offset + 1; m <= end; m++ {
			if m == killAt && !afterEffect {
				if err := wait(m, "before"); err != nil {
					return err
				}
			}
			afterThisEffect := func() error {
				if m == killAt && afterEffect {
					return wait(m, "effect")
				}
				return nil
			}
			key := []byte("msg-" + strconv.Itoa(m))
			switch strategy {
			case OffsetFirst, ProcessFirst:
				if err := effect(m); err != nil {
					return err
				}
				if err := afterThisEffect(); err != nil {
					return err
				}
			case WithEngine:
				if _, err := e.Do(ctx, key, func(context.Context) error {
					if err := effect(m); err != nil {
						return err
					}
					return afterThisEffect()
				}); err != nil {
					return err
				}
			case WithLedger:
				c, err := e.Claim(ctx, key)
				if err != nil {
					return err
				}
				if c.Outcome != engine.New {
					continue
				}
				// The effect is the write below, with the mark: the kill
				// lands inside it, at its first sync.
				if m == killAt && afterEffect {
					hook.arm(func() { _ = wait(m, "effect") })
				}
				record := []engine.Write{{Key: fmt.Appendf(nil, "effect/%d/%d-%d", m, os.Getpid(), m), Value: []byte{1}}}
				if err := e.CommitBatchWith(ctx, []engine.Claim{c}, nil, record); err != nil {
					return err
				}
			}
		}
		if strategy != OffsetFirst {
			if err := commitOffset(end); err != nil {
				return err
			}
		}
		offset = end
	}
	return nil
}

// appendEffect appends message m's effect to the effects file, synced.
func appendEffect(effects *os.File, m int) error {
	if _, err := fmt.Fprintf(effects, "%d\n", m); err != nil {
		return err
	}
	return effects.Sync()
}

// waitKill says the consumer reached message m in phase and waits for the
// SIGKILL that follows (an error if it does not come within a minute).
func waitKill(ctx context.Context, m int, phase string) error {
	fmt.Println("AT", m, phase)
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Minute):
		return fmt.Errorf("not killed at %d %s", m, phase)
	}
}

func writeSynced(path, content string) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(content); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// syncHook is a filesystem whose files, once armed, run the hook at their
// first sync (before syncing): where a kill lands inside a durable write.
type syncHook struct {
	vfs.FS
	armed atomic.Pointer[func()]
}

func (h *syncHook) arm(fn func()) { h.armed.Store(&fn) }

func (h *syncHook) fire() {
	if fn := h.armed.Swap(nil); fn != nil {
		(*fn)()
	}
}

func (h *syncHook) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := h.FS.Create(name, c)
	return h.wrap(f, err)
}

func (h *syncHook) ReuseForWrite(oldname, newname string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := h.FS.ReuseForWrite(oldname, newname, c)
	return h.wrap(f, err)
}

func (h *syncHook) OpenReadWrite(name string, c vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := h.FS.OpenReadWrite(name, c, opts...)
	return h.wrap(f, err)
}

func (h *syncHook) wrap(f vfs.File, err error) (vfs.File, error) {
	if err != nil {
		return nil, err
	}
	return hookedFile{File: f, h: h}, nil
}

type hookedFile struct {
	vfs.File
	h *syncHook
}

func (f hookedFile) Sync() error {
	f.h.fire()
	return f.File.Sync()
}

func (f hookedFile) SyncData() error {
	f.h.fire()
	return f.File.SyncData()
}

func (f hookedFile) SyncTo(length int64) (bool, error) {
	f.h.fire()
	return f.File.SyncTo(length)
}
