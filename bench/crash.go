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
	"syscall"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/embedded"
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
	e, err := engine.Open(&engine.Options{Backend: embedded.Dir(dir), ExpectedKeys: 10_000, Logger: quietEngine})
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
