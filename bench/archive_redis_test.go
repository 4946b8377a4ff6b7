package bench_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/postgres"
	"github.com/tierdedup/tierdedup/tier/postgres/pgtest"
	"github.com/tierdedup/tierdedup/tier/redis"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// archiveRedisKeysEnv sets the keys of history BenchmarkArchiveRedis puts
// in the archive (default 200000).
const archiveRedisKeysEnv = "ARCHIVE_REDIS_BENCH_KEYS"

// The windows of BenchmarkArchiveRedis: Redis keeps a minute, the archive
// ten minutes, in 10 s partitions (Redis expires keys by the wall clock,
// so the history is real time).
const (
	redisArchWindow    = time.Minute
	redisArchPartition = 10 * time.Second
	redisArchHistory   = 10 * redisArchWindow
)

// fillRedisArchive writes n keys (dayKey(0, i)) into the archive behind
// prefix, spread over the partitions of the history that left Redis's
// window, as the drain would have, and seals every partition before the
// current one.
func fillRedisArchive(b *testing.B, db *pgxpool.Pool, table, prefix string, n int) {
	ctx := context.Background()
	parts, err := tier.NewPartitions(redisArchWindow, redisArchPartition)
	if err != nil {
		b.Fatal(err)
	}
	a, err := postgres.Archive{DB: db, Table: table}.Open(ctx, tier.ArchiveEnv{Partitions: parts, Window: redisArchHistory,
		Owner: "redis:" + prefix, Log: true, Logger: quiet}) // the Redis tier's LogOwner
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	app := a.(tier.ArchiveAppender)
	now := time.Now().UnixNano()
	first, last := parts.Of(now-int64(redisArchHistory))+2, parts.Of(now-int64(redisArchWindow))-1
	if _, err := app.Start(ctx, first); err != nil {
		b.Fatal(err)
	}
	span := last - first
	batch := make([]tier.LogEntry, 0, 4096)
	for i := 0; i < n; i++ {
		p := first + int64(i)*span/int64(n)
		at := p*parts.Length + int64(i%1000)*int64(time.Millisecond)
		batch = append(batch, tier.LogEntry{Pos: tier.LogPos{MS: uint64(at / int64(time.Millisecond)), Seq: uint64(i)}, Partition: p,
			Record: tier.Record{NS: []byte{}, Key: dayKey(0, i), At: at}})
		if len(batch) == cap(batch) || i == n-1 {
			if err := app.Apply(ctx, batch); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	if err := app.Seal(ctx, parts.Of(now)-1); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkArchiveRedis measures the archive behind Redis, in one run
// against one redis-server and the loopback PostgreSQL: MarkBatch of new
// keys, batch 256, with an archive holding ten windows of history and
// without one (keys/s), and MarkBatch of archived keys, each found in the
// archive. With the archive each commit also appends to the log in its
// script (one entry a call), and the engine drains the log into
// PostgreSQL meanwhile. redis-cpu-µs/key is the server's own CPU time a
// key (INFO cpu, user and system), what bounds the rate where Redis has
// cores of its own.
//
//	go test -run '^$' -bench ArchiveRedis -benchtime 200000x -cpu 2 ./bench/
func BenchmarkArchiveRedis(b *testing.B) {
	n := 200000
	if v, err := strconv.Atoi(os.Getenv(archiveRedisKeysEnv)); err == nil && v > 0 {
		n = v
	}
	srv := redistest.Start(b)
	client := srv.ClientWith(b, &goredis.Options{PoolSize: 64})
	db := pgtest.Pool(b)
	table := fmt.Sprintf("bench_rarch_%d", time.Now().UnixNano()%1e9)
	b.Cleanup(func() {
		for _, s := range []string{"", "_layout", "_parts", "_blobs", "_log", "_open"} {
			_, _ = db.Exec(context.Background(), "DROP TABLE IF EXISTS "+table+s+" CASCADE")
		}
	})
	prefix := fmt.Sprintf("ra%d:", time.Now().UnixNano())
	fillRedisArchive(b, db, table, prefix, n)
	open := func(prefix string, archive tier.ArchiveBackend) *engine.Engine {
		o := engine.Options{Backend: redis.NewBackend(client, redis.Config{Prefix: prefix}), Window: redisArchWindow, Partition: redisArchPartition,
			// Sized for the rate the benchmark commits at (about 100 k
			// keys/s, a million a partition), not the history's: a
			// partition sealed while it runs holds that many.
			ExpectedKeys: 1 << 20, MemoryCapacity: 1 << 16, Logger: quietEngine}
		if archive != nil {
			o.Archive, o.ArchiveWindow = archive, redisArchHistory
			if fp, err := strconv.ParseFloat(os.Getenv(archiveFPEnv), 64); err == nil {
				o.ArchiveFalsePositive = fp
			}
		}
		e, err := engine.Open(&o)
		if err != nil {
			b.Fatal(err)
		}
		return e
	}
	engines := map[string]*engine.Engine{
		archiveNone:     open(fmt.Sprintf("rn%d:", time.Now().UnixNano()), nil),
		archivePostgres: open(prefix, postgres.Archive{DB: db, Table: table}),
	}
	defer func() {
		for _, e := range engines {
			_ = e.Close()
		}
	}()
	fresh := 0
	mark := func(b *testing.B, e *engine.Engine, key func(i int) []byte, want engine.Outcome) {
		out := make([]engine.Outcome, 256)
		batch := make([][]byte, 0, 256)
		before := e.Stats().Archive
		cpu0 := serverCPU(b, client)
		if err := client.ConfigResetStat(context.Background()).Err(); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		t0 := time.Now()
		for i := 0; i < b.N; i++ {
			batch = append(batch, key(i))
			if len(batch) == cap(batch) || i == b.N-1 {
				if err := e.MarkBatch(context.Background(), batch, nil, out[:len(batch)]); err != nil {
					b.Fatal(err)
				}
				for j, o := range out[:len(batch)] {
					if o != want {
						b.Fatalf("%s: %v, want %v", batch[j], o, want)
					}
				}
				batch = batch[:0]
			}
		}
		b.ReportMetric(float64(b.N)/time.Since(t0).Seconds(), "keys/s")
		b.ReportMetric((serverCPU(b, client)-cpu0).Seconds()*1e6/float64(b.N), "redis-cpu-µs/key")
		// Where the server's time went (INFO commandstats): the scripts'
		// time includes the commands they call, SET's the SETs called
		// from scripts too.
		usec := serverCommandUsec(b, client)
		b.ReportMetric((usec["evalsha"]+usec["eval"])/float64(b.N), "redis-script-µs/key")
		b.ReportMetric(usec["set"]/float64(b.N), "redis-set-µs/key")
		if after := e.Stats().Archive; after != nil && before != nil {
			b.ReportMetric(float64(after.Reads-before.Reads)/float64(b.N), "archive-reads/key")
		}
	}
	for _, kind := range []string{archiveNone, archivePostgres} {
		b.Run("new/archive="+kind, func(b *testing.B) {
			mark(b, engines[kind], func(int) []byte { fresh++; return dayKey(99, fresh) }, engine.New)
		})
	}
	b.Run("archived-duplicates/archive="+archivePostgres, func(b *testing.B) {
		if b.N > n {
			b.Skipf("only %d archived keys to mark once each", n)
		}
		mark(b, engines[archivePostgres], func(i int) []byte { return dayKey(0, i) }, engine.Duplicate)
	})
}

// serverCommandUsec reads the server's time by command since the last
// CONFIG RESETSTAT (INFO commandstats: cmdstat_<name>:calls=…,usec=…).
func serverCommandUsec(b *testing.B, c goredis.UniversalClient) map[string]float64 {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(info, "\r\n") {
		name, stats, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":")
		if !ok || name == line {
			continue
		}
		for _, kv := range strings.Split(stats, ",") {
			if v, ok := strings.CutPrefix(kv, "usec="); ok {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					b.Fatalf("commandstats line %q: %v", line, err)
				}
				out[name] = f
			}
		}
	}
	return out
}

// serverCPU reads the Redis server's CPU time (used_cpu_user +
// used_cpu_sys, INFO cpu).
func serverCPU(b *testing.B, c goredis.UniversalClient) time.Duration {
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var sum float64
	for _, line := range strings.Split(info, "\r\n") {
		k, v, _ := strings.Cut(line, ":")
		if k == "used_cpu_user" || k == "used_cpu_sys" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatal(err)
			}
			sum += f
		}
	}
	return time.Duration(sum * float64(time.Second))
}
