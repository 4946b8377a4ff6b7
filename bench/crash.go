package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tierdedup/tierdedup/engine"
)

// Strategy is how a consumer orders processing and committing its offset.
type Strategy string

// The three strategies of the crash table.
const (
	OffsetFirst  Strategy = "commit offset, then process"
	ProcessFirst Strategy = "process, then commit offset"
	WithEngine   Strategy = "process with the dedup engine, then commit offset"
)

// Strategies lists them in table order.
var Strategies = []Strategy{OffsetFirst, ProcessFirst, WithEngine}

// CrashConfig is the crash experiment: Messages messages, the offset
// committed every Every, the consumer killed (SIGKILL) just before it
// processes message KillAt, then restarted.
type CrashConfig struct {
	Messages, Every, KillAt int
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
	for i, s := range Strategies {
		dir, err := os.MkdirTemp("", "dedupbench-crash-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		args := []string{"-strategy", strconv.Itoa(i), "-dir", dir, "-messages", strconv.Itoa(c.Messages), "-every", strconv.Itoa(c.Every)}
		if err := runUntilKilled(ctx, child(append(args, "-kill-at", strconv.Itoa(c.KillAt))...), c.KillAt); err != nil {
			return nil, fmt.Errorf("%s: %w", s, err)
		}
		if out, err := child(args...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("%s: restart: %w\n%s", s, err, out)
		}
		row, err := countEffects(filepath.Join(dir, "effects"), c.Messages)
		if err != nil {
			return nil, err
		}
		row.Strategy = s
		rows = append(rows, row)
	}
	return rows, nil
}

// runUntilKilled starts cmd, waits until it reports reaching message at,
// and kills it with SIGKILL.
func runUntilKilled(ctx context.Context, cmd *exec.Cmd, at int) error {
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	sc := bufio.NewScanner(out)
	want := "AT " + strconv.Itoa(at)
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

func countEffects(path string, messages int) (CrashRow, error) {
	f, err := os.Open(path)
	if err != nil {
		return CrashRow{}, err
	}
	defer f.Close()
	seen := map[int]int{}
	var row CrashRow
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		n, err := strconv.Atoi(sc.Text())
		if err != nil {
			return CrashRow{}, fmt.Errorf("effects file: %w", err)
		}
		seen[n]++
		row.Processed++
	}
	for m := 1; m <= messages; m++ {
		switch {
		case seen[m] == 0:
			row.Lost++
		case seen[m] > 1:
			row.Duplicated += seen[m] - 1
		}
	}
	return row, sc.Err()
}

// CrashChild is the consumer of the crash experiment: it reads its offset,
// processes messages in batches of every (each effect appended and fsynced
// to dir/effects), commits its offset per the strategy, and, given killAt,
// prints "AT killAt" before that message and waits to be killed.
func CrashChild(ctx context.Context, strategy Strategy, dir string, messages, every, killAt int) error {
	offsetPath := filepath.Join(dir, "offset")
	effects, err := os.OpenFile(filepath.Join(dir, "effects"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer effects.Close()
	effect := func(m int) error {
		if _, err := fmt.Fprintf(effects, "%d\n", m); err != nil {
			return err
		}
		return effects.Sync()
	}
	var e *engine.Engine
	if strategy == WithEngine {
		if e, err = engine.Open(&engine.Options{Dir: filepath.Join(dir, "dedup"), ExpectedKeys: 10_000}); err != nil {
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
			if m == killAt {
				fmt.Println("AT", m)
				select { // wait for the SIGKILL
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(time.Minute):
					return errors.New("not killed")
				}
			}
			if e == nil {
				if err := effect(m); err != nil {
					return err
				}
				continue
			}
			if _, err := e.Do(ctx, []byte("msg-"+strconv.Itoa(m)), func(context.Context) error { return effect(m) }); err != nil {
				return err
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
