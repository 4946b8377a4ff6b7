package enginetest_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/crashtest"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier/embedded"
	"github.com/tierdedup/tierdedup/tier/pebble"
)

// killArchiveOptions: hour partitions, a 4-hour window and a 12-hour
// archive behind it.
func killArchiveOptions(dir string, clock engine.Clock) engine.Options {
	return engine.Options{Backend: embedded.Dir(filepath.Join(dir, "store")), Clock: clock, Window: 4 * time.Hour, Partition: time.Hour,
		ExpectedKeys: 5_000, Archive: pebble.ArchiveDir{Dir: filepath.Join(dir, "archive")}, ArchiveWindow: 12 * time.Hour, Logger: quiet}
}

// archiveChild (spec "dir|stage|start ns") marks batches of fresh keys,
// five simulated minutes apart, printing "A key" for every key
// acknowledged New and "T ns" after each batch. When the archiver reaches
// the stage ("put", "held", "blob" or "drop") it waits there until six
// simulated hours have passed (so the partition it holds has left the
// 4-hour window), prints "STALL" and blocks there for good: the parent
// kills the process. The clock stops at seven hours; the writes go on.
func archiveChild(spec string) int {
	parts := strings.Split(spec, "|")
	dir, stage := parts[0], parts[1]
	start, _ := strconv.ParseInt(parts[2], 10, 64)
	clock := &stepClock{Base: time.Unix(0, start)}
	enginetest.SetInArchive(func(s string) {
		if s == stage {
			// Held here until the partition being archived has left the
			// window, so the kill finds the archive behind it.
			for clock.Now().Sub(clock.Base) < 6*time.Hour {
				time.Sleep(time.Millisecond)
			}
			fmt.Println("STALL")
			select {}
		}
	})
	e, err := engine.Open(ptr(killArchiveOptions(dir, clock)))
	if err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	out := bufio.NewWriter(os.Stdout)
	for i := 0; ; i++ {
		keys := make([][]byte, 32)
		for j := range keys {
			keys[j] = fmt.Appendf(nil, "%d-%d", start, i*32+j)
		}
		res := make([]engine.Outcome, len(keys))
		if err := e.MarkBatch(context.Background(), keys, nil, res); err != nil {
			fmt.Println("ERR", err)
			return 1
		}
		for j, r := range res {
			if r == engine.New {
				fmt.Fprintf(out, "A %s\n", keys[j])
			}
		}
		fmt.Fprintf(out, "T %d\n", clock.Now().UnixNano())
		out.Flush()
		if clock.Now().Sub(clock.Base) < 7*time.Hour {
			// Then the clock stays, writes go on, and the archiver
			// catches up to its stage (under the race detector it may
			// otherwise never end a pass, which the "drop" stage needs).
			clock.Steps.Add(5)
		}
	}
}

// TestKillWhileArchiving kills a child inside each stage of archiving a
// partition (inside the archive's Put, after it before the partition is
// counted archived, after its filter blob, before the exact tier drops),
// twice each over one directory, with three simulated hours between
// rounds so keys leave the window and the archive window. After each kill
// every key acknowledged inside the archive window is a Duplicate, every
// key older than the archive window and a partition is New, and a key
// never sent is New.
func TestKillWhileArchiving(t *testing.T) {
	dir := t.TempDir()
	now := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC).UnixNano()
	acked := map[string]int64{} // key → when it was acknowledged
	for round, stage := range []string{"put", "held", "blob", "drop", "put", "held", "blob", "drop"} {
		start := now
		child := crashtest.Start(t, "archive", fmt.Sprintf("%s|%s|%d", dir, stage, now), &crashtest.Options{Timeout: time.Minute})
		stalled, batches := false, 0
		read := func(line string) {
			kind, rest, _ := strings.Cut(line, " ")
			switch kind {
			case "A":
				acked[rest] = now
			case "T":
				now, _ = strconv.ParseInt(rest, 10, 64)
				if stalled {
					batches++
				}
			case "STALL":
				stalled = true
			case "ERR":
				t.Fatalf("round %d: child: %s", round, rest)
			}
		}
		for !stalled || batches < 5 { // writes go on past the stall
			line, ok := child.Next()
			if !ok {
				t.Fatalf("round %d (%s): the child ended before stalling", round, stage)
			}
			read(line)
		}
		_ = child.Kill()
		// The child wrote on while this read: every line it printed
		// counts (its keys acknowledged, its clock). Its clock may also
		// have moved a step past the last batch it printed, in a batch
		// the kill cut short, and the engine keeps the latest time it
		// recorded: the checks read at that time, or ages counted here
		// would be up to a few batches short of the engine's own.
		for line, ok := child.Next(); ok; line, ok = child.Next() {
			read(line)
		}
		if time.Duration(now-start) < 7*time.Hour {
			now += int64(5 * time.Minute)
		}
		e := open(t, killArchiveOptions(dir, fixedClock(now)))
		var dups, gone [][]byte
		for k, at := range acked {
			switch age := time.Duration(now - at); {
			case age < 12*time.Hour:
				dups = append(dups, []byte(k))
			case age >= 14*time.Hour: // past the archive window and its partition
				gone = append(gone, []byte(k))
			}
		}
		infos := make([]engine.KeyInfo, len(dups))
		if err := e.LookupBatch(context.Background(), dups, infos); err != nil {
			t.Fatal(err)
		}
		fromArchive := 0
		for i, in := range infos {
			if in.Outcome != engine.Duplicate {
				t.Fatalf("round %d (%s): acknowledged key %s (age %v) is %v from %v after the kill", round, stage, dups[i], time.Duration(now-acked[string(dups[i])]), in.Outcome, in.Source)
			}
			if in.Source == engine.SourceArchive {
				fromArchive++
			}
		}
		infos = make([]engine.KeyInfo, len(gone))
		if err := e.LookupBatch(context.Background(), gone, infos); err != nil {
			t.Fatal(err)
		}
		for i, in := range infos {
			if in.Outcome != engine.New {
				t.Fatalf("round %d (%s): key %s past the archive window is %v from %v", round, stage, gone[i], in.Outcome, in.Source)
			}
		}
		if o, err := e.MarkIfAbsent(context.Background(), fmt.Appendf(nil, "never-%d", round)); err != nil || o != engine.New {
			t.Fatalf("round %d: a new key: %v, %v", round, o, err)
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d (%s): %d duplicates (%d from the archive), %d expired keys checked", round, stage, len(dups), fromArchive, len(gone))
		now += int64(3 * time.Hour)
	}
}
