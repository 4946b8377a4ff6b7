package enginetest_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/crashtest"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier/postgres"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// redisArchiveKillOptions: a 5 s window of 1 s partitions in Redis, two
// minutes of archive in PostgreSQL.
func redisArchiveKillOptions(c goredis.UniversalClient, prefix string, db *pgxpool.Pool, table string) engine.Options {
	o := redisArchiveOptions(c, prefix, postgres.Archive{DB: db, Table: table})
	o.Window, o.Lease, o.ArchiveWindow, o.Logger = 5*time.Second, time.Second, 2*time.Minute, quiet
	return o
}

// redisArchiveChild (spec "redis addr|prefix|postgres URL|table|id|stage")
// marks batches of 28 fresh keys and 4 it was acknowledged before (older
// ones too, which Redis has let go), printing "A key" for each fresh key
// acknowledged New and "R key" for an acknowledged key answered New
// again. An error the archive may give while it lags (ErrUnavailable) is
// printed "E" and the batch retried later. When the drain reaches the
// stage ("put": inside Apply's batch, "held": applied, not trimmed,
// "blob": the filter saved, the partition not sealed, "drop") after its
// first second, it prints "STALL" and blocks there for good.
func redisArchiveChild(spec string) int {
	parts := strings.Split(spec, "|")
	addr, prefix, url, table, stage := parts[0], parts[1], parts[2], parts[3], parts[5]
	id, _ := strconv.Atoi(parts[4])
	started := time.Now()
	enginetest.SetInArchive(func(s string) {
		if s == stage && time.Since(started) > time.Second {
			fmt.Println("STALL")
			select {}
		}
	})
	db, err := pgxpool.New(context.Background(), url)
	if err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	e, err := engine.Open(ptr(redisArchiveKillOptions(c, prefix, db, table)))
	if err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	out := bufio.NewWriter(os.Stdout)
	var acked [][]byte
	for i := 0; ; i++ {
		keys := make([][]byte, 0, 32)
		for j := 0; j < 28; j++ {
			keys = append(keys, fmt.Appendf(nil, "%d-%d-%d", id, i, j))
		}
		for j := 0; j < 4 && len(acked) > 0; j++ {
			keys = append(keys, acked[(i*7+j*131)%len(acked)])
		}
		res := make([]engine.Outcome, len(keys))
		err := e.MarkBatch(context.Background(), keys, nil, res)
		switch {
		case errors.Is(err, engine.ErrUnavailable):
			fmt.Fprintln(out, "E", err)
			out.Flush()
			time.Sleep(50 * time.Millisecond)
			continue
		case err != nil:
			fmt.Println("ERR", err)
			return 1
		}
		for j, r := range res {
			switch {
			case r == engine.New && j < 28:
				fmt.Fprintf(out, "A %s\n", keys[j])
				acked = append(acked, keys[j])
			case r == engine.New:
				fmt.Fprintf(out, "R %s\n", keys[j])
			}
		}
		out.Flush()
		time.Sleep(20 * time.Millisecond)
	}
}

// TestKillWhileArchivingRedis kills engines sharing Redis and a PostgreSQL
// archive: the drainer inside each stage of the drain (its Apply, after
// it before the trim, after a filter blob before the seal, after an
// expiry) and at random moments, with a second engine committing
// throughout and taking the drain over. No acknowledged key is ever New
// again, in the children (which re-send acknowledged keys, Redis having
// let most of them go) or at the end, when every acknowledged key is
// answered by the archive.
func TestKillWhileArchivingRedis(t *testing.T) {
	srv := redistest.Start(t)
	db := postgresPool(t)
	arch := redisArchive(t)
	prefix := fmt.Sprintf("kill-%d:", time.Now().UnixNano())
	url := db.Config().ConnString()
	acked := map[string]bool{}
	read := func(child *crashtest.Child, until func(kind string) bool) {
		t.Helper()
		for {
			line, ok := child.Next()
			if !ok {
				t.Fatalf("%s ended: %s", child, child.StderrLine())
			}
			kind, rest, _ := strings.Cut(line, " ")
			switch kind {
			case "A":
				acked[rest] = true
			case "R":
				t.Fatalf("acknowledged key %s answered New again", rest)
			case "ERR":
				t.Fatalf("child: %s", rest)
			}
			if until(kind) {
				return
			}
		}
	}
	spec := func(id int, stage string) string {
		return fmt.Sprintf("%s|%s|%s|%s|%d|%s", srv.Addr, prefix, url, arch.Table, id, stage)
	}
	stages := []string{"put", "held", "blob", "drop", ""}
	for round, stage := range stages {
		first := crashtest.Start(t, "redis-archive", spec(2*round, stage), &crashtest.Options{Timeout: time.Minute})
		if stage != "" {
			read(first, func(kind string) bool { return kind == "STALL" })
		} else {
			deadline := time.Now().Add(1500 * time.Millisecond)
			read(first, func(string) bool { return time.Now().After(deadline) })
		}
		second := crashtest.Start(t, "redis-archive", spec(2*round+1, ""), &crashtest.Options{Timeout: time.Minute})
		deadline := time.Now().Add(500 * time.Millisecond)
		read(second, func(string) bool { return time.Now().After(deadline) })
		_ = first.Kill()
		// The second takes the drain over (the lease is a second) and
		// goes on; killed at a moment of its own.
		deadline = time.Now().Add(time.Duration(1500+300*round) * time.Millisecond)
		read(second, func(string) bool { return time.Now().After(deadline) })
		_ = second.Kill()
	}
	e := open(t, redisArchiveKillOptions(srv.Client(t), prefix, db, arch.Table))
	keys := make([][]byte, 0, len(acked))
	for k := range acked {
		keys = append(keys, []byte(k))
	}
	if len(keys) < 1000 {
		t.Fatalf("only %d keys acknowledged", len(keys))
	}
	waitFromArchive(t, e, keys, 30*time.Second)
	// A new key is New, once the drain (slowed by the lookups above)
	// has sealed what left Redis: until then the call fails, never New.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		o, err := e.MarkIfAbsent(context.Background(), []byte("never-sent"))
		if err == nil && o == engine.New {
			break
		}
		if !errors.Is(err, engine.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("a new key: %v, %v (%+v)", o, err, *e.Stats().Archive)
		}
	}
	t.Logf("%d acknowledged keys over %d kills, all answered by the archive", len(keys), 2*len(stages))
}
