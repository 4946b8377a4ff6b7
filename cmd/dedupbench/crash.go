package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"text/tabwriter"

	"github.com/tierdedup/tierdedup/bench"
)

// crashCmd reproduces the crash table with real processes: this binary,
// re-executed as crash-child, killed with SIGKILL and restarted.
func crashCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("crash", flag.ContinueOnError)
	fs.SetOutput(stderr)
	messages := fs.Int("messages", 2000, "messages in the topic")
	every := fs.Int("every", 100, "commit the offset every this many messages")
	kills := fs.Int("kills", 10, "SIGKILL the consumer this many times, each at a random message and phase (before it, or between its effect and its mark)")
	seed := fs.Uint64("seed", 1, "seed of the kill points")
	broker := fs.String("broker", "file", "where offsets are committed: file (a synced file), kafka (a Kafka consumer group on an in-process cluster speaking the real protocol), or both (one table each)")
	asJSON := fs.Bool("json", false, "print the table as JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	child := func(a ...string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, exe, append([]string{"crash-child"}, a...)...)
		cmd.Env = os.Environ()
		return cmd
	}
	var brokers []string
	switch *broker {
	case "file", "kafka":
		brokers = []string{*broker}
	case "both":
		brokers = []string{"file", "kafka"}
	default:
		return fmt.Errorf("crash: -broker %q: want file, kafka or both", *broker)
	}
	cfg := bench.CrashConfig{Messages: *messages, Every: *every, Kills: bench.RandomKills(*messages, *every, *kills, rand.New(rand.NewPCG(*seed, 0)))}
	tables := map[string][]bench.CrashRow{}
	for _, b := range brokers {
		run := bench.CrashTable
		if b == "kafka" {
			run = bench.CrashTableKafka
		}
		rows, err := run(ctx, cfg, child)
		if err != nil {
			return fmt.Errorf("crash (%s): %w", b, err)
		}
		tables[b] = rows
	}
	if *asJSON {
		if len(brokers) == 1 {
			return writeJSON(stdout, tables[brokers[0]])
		}
		return writeJSON(stdout, tables)
	}
	after := 0
	for _, k := range cfg.Kills {
		if k.AfterEffect {
			after++
		}
	}
	for i, b := range brokers {
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		where := "a synced file"
		if b == "kafka" {
			where = "a Kafka consumer group (kafkadedup's row: the offset stored with the marks)"
		}
		fmt.Fprintf(stdout, "%d messages, offset committed every %d to %s, consumer killed (SIGKILL) %d times at random messages (%d of them between an effect and its mark), restarted after each:\n\n", *messages, *every, where, len(cfg.Kills), after)
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "strategy\tprocessed\tduplicated\tlost")
		for _, r := range tables[b] {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\n", r.Strategy, r.Processed, r.Duplicated, r.Lost)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

func crashChildCmd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("crash-child", flag.ContinueOnError)
	strategy := fs.Int("strategy", 0, "index into bench.Strategies")
	dir := fs.String("dir", "", "state directory")
	messages := fs.Int("messages", 1000, "")
	every := fs.Int("every", 100, "")
	killAt := fs.Int("kill-at", 0, "")
	phase := fs.String("kill-phase", "before", "before, or effect (between the effect and its mark)")
	brokers := fs.String("brokers", "", "Kafka brokers (comma-separated); none: the offset is a file")
	topic := fs.String("topic", "", "Kafka topic")
	group := fs.String("group", "", "Kafka consumer group")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *strategy < 0 || *strategy >= len(bench.Strategies) {
		return fmt.Errorf("strategy %d", *strategy)
	}
	s := bench.Strategies[*strategy]
	if *brokers != "" {
		k := bench.KafkaCrash{Brokers: strings.Split(*brokers, ","), Topic: *topic}
		return bench.CrashChildKafka(ctx, s, *dir, k, *group, *messages, *every, *killAt, *phase == "effect")
	}
	return bench.CrashChild(ctx, s, *dir, *messages, *every, *killAt, *phase == "effect")
}
