package engine_test

// The promises checked through the public API only, per configuration
// (memory, bloom-only with and without Dir, the embedded default, a Redis
// and a PostgreSQL Backend) and per option, and across Close, restarts,
// crashes, rebuilds and handoffs: every accepted combination keeps them,
// every refused one is ErrOptions and writes nothing.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/crashtest"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/embedded"
	"github.com/tierdedup/tierdedup/tier/postgres"
	"github.com/tierdedup/tierdedup/tier/redis"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// mxOpen is engine.Open with a panic turned into an error, so that a
// table of bad options reports every case.
func mxOpen(o engine.Options) (e *engine.Engine, err error) {
	defer func() {
		if r := recover(); r != nil {
			e, err = nil, fmt.Errorf("PANIC in Open: %v", r)
		}
	}()
	if o.Logger == nil {
		o.Logger = quiet
	}
	return engine.Open(&o)
}

// mxValidate is Options.Validate with a panic turned into an error.
func mxValidate(o engine.Options) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("PANIC in Validate: %v", r)
		}
	}()
	return o.Validate()
}

var mxBadClock = enginetest.ClockAt(time.Date(1960, 1, 1, 0, 0, 0, 0, time.UTC))

// mxPrefixKeys counts the Redis keys under prefix.
func mxPrefixKeys(t *testing.T, c goredis.UniversalClient, prefix string) int {
	t.Helper()
	keys, err := c.Keys(context.Background(), prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	return len(keys)
}

// mxTableExists reports whether table exists in PostgreSQL.
func mxTableExists(t *testing.T, p *pgxpool.Pool, table string) bool {
	t.Helper()
	var ok bool
	if err := p.QueryRow(context.Background(), "SELECT to_regclass($1) IS NOT NULL", table).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

func mxKeys(prefix string, n int) [][]byte {
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "%s-%d", prefix, i)
	}
	return keys
}

func mxMarkAll(t *testing.T, e *engine.Engine, keys [][]byte, want engine.Outcome, what string) {
	t.Helper()
	out := make([]engine.Outcome, len(keys))
	if err := e.MarkBatch(context.Background(), keys, nil, out); err != nil {
		t.Fatalf("%s: MarkBatch: %v", what, err)
	}
	for i, o := range out {
		if o != want {
			t.Fatalf("%s: MarkBatch key %s = %v, want %v", what, keys[i], o, want)
		}
	}
}

func mxLookupAll(t *testing.T, e *engine.Engine, keys [][]byte, want engine.Outcome, what string) {
	t.Helper()
	out := make([]engine.KeyInfo, len(keys))
	if err := e.LookupBatch(context.Background(), keys, out); err != nil {
		t.Fatalf("%s: LookupBatch: %v", what, err)
	}
	for i, o := range out {
		if o.Outcome != want {
			t.Fatalf("%s: Lookup of %s = %v, want %v", what, keys[i], o.Outcome, want)
		}
	}
}

func mxClaimAll(t *testing.T, e *engine.Engine, keys [][]byte, want engine.Outcome, what string) []engine.Claim {
	t.Helper()
	out := make([]engine.Claim, len(keys))
	if err := e.ClaimBatch(context.Background(), keys, nil, out); err != nil {
		t.Fatalf("%s: ClaimBatch: %v", what, err)
	}
	for i, c := range out {
		if c.Outcome != want {
			t.Fatalf("%s: Claim of %s = %v, want %v", what, keys[i], c.Outcome, want)
		}
	}
	return out
}

// TestMatrixBadOptionsAreTypedAndWriteNothing: every refused combination
// (a Backend's own settings, a Backend beside
// Dir or Tiers, options that need a shared tier) is refused by Validate
// and by Open with an error matching engine.ErrOptions, tier.ErrOptions
// and, for a backend's setting, the backend's own ErrOptions; nothing
// panics and nothing is written: no directory, no Redis key, no table.
func TestMatrixBadOptionsAreTypedAndWriteNothing(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	pool := postgresPool(t)
	root := t.TempDir()
	dir := filepath.Join(root, "never") // must never be created
	prefix := fmt.Sprintf("bad-%d:", time.Now().UnixNano())
	table := fmt.Sprintf("mx_bad_%d", time.Now().UnixNano())
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	var nilRB *redis.Backend
	var nilPB *postgres.Backend
	rb := func(p string) tier.Backend { return redis.NewBackend(c, redis.Config{Prefix: p}) }
	pb := func(tb string) tier.Backend { return postgres.NewBackend(pool, postgres.Config{Table: tb}) }
	cases := []struct {
		name string
		o    engine.Options
		own  error // the backend's own ErrOptions, also matched
	}{
		{"redis: NewBackend(nil client)", engine.Options{Backend: redis.NewBackend(nil, redis.Config{Prefix: prefix})}, redis.ErrOptions},
		{"redis: nil *Backend", engine.Options{Backend: nilRB}, redis.ErrOptions},
		{"redis: prefix with {", engine.Options{Backend: rb(prefix + "{x")}, redis.ErrOptions},
		{"redis: prefix with }", engine.Options{Backend: rb(prefix + "x}")}, redis.ErrOptions},
		{"redis: prefix with NUL", engine.Options{Backend: rb(prefix + "\x00x")}, redis.ErrOptions},
		{"postgres: NewBackend(nil db)", engine.Options{Backend: postgres.NewBackend(nil, postgres.Config{Table: table})}, postgres.ErrOptions},
		{"postgres: nil *Backend", engine.Options{Backend: nilPB}, postgres.ErrOptions},
		{"postgres: table with a dash", engine.Options{Backend: pb("bad-" + table)}, postgres.ErrOptions},
		{"postgres: table starting with a digit", engine.Options{Backend: pb("1" + table)}, postgres.ErrOptions},
		{"postgres: table of 64 bytes", engine.Options{Backend: pb(strings.Repeat("t", 64))}, postgres.ErrOptions},
		{"postgres: table with a quote", engine.Options{Backend: pb(table + `"; DROP TABLE x; --`)}, postgres.ErrOptions},
		{"postgres: SweepBlocks negative", engine.Options{Backend: postgres.NewBackend(pool, postgres.Config{Table: table, SweepBlocks: -1})}, postgres.ErrOptions},
		{"postgres: NamespaceWindows", engine.Options{Backend: pb(table), Namespaces: map[string]engine.NamespaceOptions{"a": {Window: time.Hour}}}, postgres.ErrOptions},
		{"redis: Tiers MemoryOnly", engine.Options{Backend: rb(prefix), Tiers: engine.MemoryOnly}, nil},
		{"redis: Tiers BloomOnly", engine.Options{Backend: rb(prefix), Tiers: engine.BloomOnly}, nil},
		{"redis: Tiers 9", engine.Options{Backend: rb(prefix), Tiers: 9}, nil},
		{"redis: NamespaceWindows not above Lease", engine.Options{Backend: rb(prefix), Lease: time.Minute, Namespaces: map[string]engine.NamespaceOptions{"a": {Window: time.Minute}}}, nil},
		{"redis: NamespaceWindows above Window", engine.Options{Backend: rb(prefix), Window: time.Hour, Partition: time.Hour, Namespaces: map[string]engine.NamespaceOptions{"a": {Window: 2 * time.Hour}}}, nil},
		{"redis: NamespaceWindows of an engine name", engine.Options{Backend: rb(prefix), Namespaces: map[string]engine.NamespaceOptions{"\x00v": {Window: time.Hour}}}, nil},
		{"redis: MaxAttempts 70000", engine.Options{Backend: rb(prefix), MaxAttempts: 70000}, nil},
		{"postgres: MaxAttempts 70000", engine.Options{Backend: pb(table), MaxAttempts: 70000}, nil},
		{"redis: Window/Partition over 63", engine.Options{Backend: rb(prefix), Partition: time.Hour}, nil},
		{"redis: Lease not below Window", engine.Options{Backend: rb(prefix), Window: time.Hour, Partition: time.Hour, Lease: time.Hour}, nil},
		{"memory: FailOpen", engine.Options{Tiers: engine.MemoryOnly, FailOpen: true}, nil},
		{"memory: NoSharedCache", engine.Options{Tiers: engine.MemoryOnly, NoSharedCache: true}, nil},
		{"memory: Dir", engine.Options{Tiers: engine.MemoryOnly, Backend: embedded.Dir(dir)}, nil},
		{"bloom: FailOpen", engine.Options{Tiers: engine.BloomOnly, Backend: embedded.Dir(dir), FailOpen: true}, nil},
		{"bloom: NoSharedCache", engine.Options{Tiers: engine.BloomOnly, Backend: embedded.Dir(dir), NoSharedCache: true}, nil},
		{"bloom: NamespaceWindows", engine.Options{Tiers: engine.BloomOnly, Backend: embedded.Dir(dir), Namespaces: map[string]engine.NamespaceOptions{"a": {Window: time.Hour}}}, nil},
		{"bloom: NamespaceWindows without Dir", engine.Options{Backend: &embedded.Backend{}, Tiers: engine.BloomOnly, Namespaces: map[string]engine.NamespaceOptions{"a": {Window: time.Hour}}}, nil},
		{"default: FailOpen", engine.Options{Backend: embedded.Dir(dir), FailOpen: true}, nil},
		{"default: NoSharedCache", engine.Options{Backend: embedded.Dir(dir), NoSharedCache: true}, nil},
		{"default: no Dir", engine.Options{}, nil},
		{"default: Partition over Window/63", engine.Options{Backend: embedded.Dir(dir), Partition: time.Hour}, nil},
		{"default: FalsePositive 1", engine.Options{Backend: embedded.Dir(dir), FalsePositive: 1}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			verr := mxValidate(tc.o)
			if !errors.Is(verr, engine.ErrOptions) || !errors.Is(verr, tier.ErrOptions) {
				t.Errorf("Validate = %v, want an error matching engine.ErrOptions and tier.ErrOptions", verr)
			}
			e, err := mxOpen(tc.o)
			if e != nil {
				_ = e.Close()
				t.Fatalf("Open succeeded")
			}
			if !errors.Is(err, engine.ErrOptions) || !errors.Is(err, tier.ErrOptions) {
				t.Errorf("Open = %v, want an error matching engine.ErrOptions and tier.ErrOptions", err)
			}
			if tc.own != nil && (!errors.Is(err, tc.own) || !errors.Is(verr, tc.own)) {
				t.Errorf("Validate = %v, Open = %v: want both to match the backend's own %v", verr, err, tc.own)
			}
			for _, other := range []error{engine.ErrLayout, engine.ErrStorage, engine.ErrUnavailable, engine.ErrLocked} {
				if errors.Is(err, other) {
					t.Errorf("Open = %v also matches %v", err, other)
				}
			}
		})
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("a refused Open created %s (%v)", dir, err)
	}
	if n := mxPrefixKeys(t, c, prefix); n != 0 {
		t.Errorf("refused Opens left %d Redis keys under %q", n, prefix)
	}
	if mxTableExists(t, pool, table) {
		t.Errorf("a refused Open created table %s", table)
	}
}

// TestTypedNilClientIsErrOptions: a typed nil client (a *goredis.Client,
// *goredis.ClusterClient or *pgxpool.Pool variable left nil, e.g. by
// ignoring pgxpool.New's error) is refused by Validate and Open with
// ErrOptions, never a panic inside go-redis or pgx.
func TestTypedNilClientIsErrOptions(t *testing.T) {
	var nilClient *goredis.Client
	var nilCluster *goredis.ClusterClient
	var nilPool *pgxpool.Pool
	for name, b := range map[string]tier.Backend{
		"redis *Client(nil)":          redis.NewBackend(nilClient, redis.Config{}),
		"redis *ClusterClient(nil)":   redis.NewBackend(nilCluster, redis.Config{}),
		"postgres *pgxpool.Pool(nil)": postgres.NewBackend(nilPool, postgres.Config{}),
	} {
		t.Run(name, func(t *testing.T) {
			o := engine.Options{Backend: b}
			verr := mxValidate(o)
			e, err := mxOpen(o)
			if e != nil {
				_ = e.Close()
			}
			if !errors.Is(verr, engine.ErrOptions) {
				t.Errorf("Validate = %v, want ErrOptions (a nil client)", verr)
			}
			if !errors.Is(err, engine.ErrOptions) {
				t.Errorf("Open = %v, want ErrOptions, never a panic", err)
			}
		})
	}
}

// TestRefusedClockWritesNothing: Open refuses a clock outside [1970,
// 2232] when nothing earlier is recorded (ErrOptions), and writes nothing
// first: no Pebble store or bloom-only directory is created, no Redis
// layout key recorded, no PostgreSQL table created; so the next valid
// Open, with another Window, is not refused with ErrLayout for a prefix,
// table or directory no engine ever used.
func TestRefusedClockWritesNothing(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	pool := postgresPool(t)
	t.Run("memory", func(t *testing.T) {
		if _, err := mxOpen(engine.Options{Tiers: engine.MemoryOnly, Clock: mxBadClock}); !errors.Is(err, engine.ErrOptions) {
			t.Fatalf("Open = %v, want ErrOptions", err)
		}
	})
	t.Run("bloom", func(t *testing.T) {
		if _, err := mxOpen(engine.Options{Backend: &embedded.Backend{}, Tiers: engine.BloomOnly, Clock: mxBadClock}); !errors.Is(err, engine.ErrOptions) {
			t.Fatalf("Open = %v, want ErrOptions", err)
		}
	})
	t.Run("bloom-dir", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "bloom")
		if _, err := mxOpen(engine.Options{Tiers: engine.BloomOnly, Backend: embedded.Dir(dir), Clock: mxBadClock}); !errors.Is(err, engine.ErrOptions) {
			t.Fatalf("Open = %v, want ErrOptions", err)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			ents, _ := os.ReadDir(dir)
			t.Errorf("the refused Open created %s (%d entries)", dir, len(ents))
		}
	})
	t.Run("default", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "db")
		if _, err := mxOpen(engine.Options{Backend: embedded.Dir(dir), Clock: mxBadClock}); !errors.Is(err, engine.ErrOptions) {
			t.Fatalf("Open = %v, want ErrOptions", err)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			var names []string
			ents, _ := os.ReadDir(dir)
			for _, e := range ents {
				names = append(names, e.Name())
			}
			t.Errorf("the refused Open created a store in %s: %v", dir, names)
		}
		e, err := mxOpen(engine.Options{Backend: embedded.Dir(dir), Window: 2 * time.Hour, Partition: time.Hour})
		if err != nil {
			t.Errorf("a valid Open of the directory afterwards, with its own layout = %v", err)
		} else {
			_ = e.Close()
		}
	})
	t.Run("redis", func(t *testing.T) {
		prefix := fmt.Sprintf("clock-%d:", time.Now().UnixNano())
		if _, err := mxOpen(engine.Options{Backend: redisBackend(c, prefix), Clock: mxBadClock}); !errors.Is(err, engine.ErrOptions) {
			t.Fatalf("Open = %v, want ErrOptions", err)
		}
		if n := mxPrefixKeys(t, c, prefix); n != 0 {
			t.Errorf("the refused Open left %d keys under %q (the layout)", n, prefix)
		}
		e, err := mxOpen(engine.Options{Backend: redisBackend(c, prefix), Window: time.Hour, Partition: time.Hour})
		if err != nil {
			t.Errorf("a valid Open of the prefix afterwards, with another Window = %v", err)
		} else {
			_ = e.Close()
		}
	})
	t.Run("postgres", func(t *testing.T) {
		table := pgTable(t, pool, "mx_clock")
		if _, err := mxOpen(engine.Options{Backend: pgBackend(pool, table), Clock: mxBadClock}); !errors.Is(err, engine.ErrOptions) {
			t.Fatalf("Open = %v, want ErrOptions", err)
		}
		if mxTableExists(t, pool, table) {
			t.Errorf("the refused Open created table %s", table)
		}
		e, err := mxOpen(engine.Options{Backend: pgBackend(pool, table), Window: time.Hour, Partition: time.Hour})
		if err != nil {
			t.Errorf("a valid Open of the table afterwards, with another Window = %v", err)
		} else {
			_ = e.Close()
		}
	})
}

// TestMatrixClockOutOfRangeWithStoredReading: a clock outside the range
// is accepted where the directory recorded a reading (the embedded store,
// bloom-only state after a clean Close) and the engine keeps answering
// from that reading: committed keys stay Duplicate.
func TestMatrixClockOutOfRangeWithStoredReading(t *testing.T) {
	ctx := context.Background()
	for _, tiers := range []engine.Tiers{engine.Default, engine.BloomOnly} {
		t.Run(tiers.String(), func(t *testing.T) {
			mem := vfs.NewMem()
			o := engine.Options{Tiers: tiers, Backend: &embedded.Backend{Dir: "d", FS: mem}, ExpectedKeys: 1000, Clock: newClock()}
			e := open(t, o)
			if out, err := e.MarkIfAbsent(ctx, []byte("k")); err != nil || out != engine.New {
				t.Fatal(out, err)
			}
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			o.Clock = mxBadClock
			e = open(t, o)
			defer e.Close()
			if out, err := e.MarkIfAbsent(ctx, []byte("k")); err != nil || out != engine.Duplicate {
				t.Fatalf("after reopening with a clock at 1960 = %v, %v; want Duplicate", out, err)
			}
			if out, err := e.MarkIfAbsent(ctx, []byte("fresh")); err != nil || out != engine.New {
				t.Fatalf("fresh key = %v, %v; want New", out, err)
			}
		})
	}
}

// TestMatrixLayoutErrorsMatchSentinels: a prefix, table or directory
// recorded with other settings is refused with an error matching
// engine.ErrLayout (which is tier.ErrLayout) and the tier's own ErrLayout,
// never ErrOptions; the refusal changes nothing (the engine already on it
// keeps working; a directory's snapshot survives, so the next valid Open
// is warm).
func TestMatrixLayoutErrorsMatchSentinels(t *testing.T) {
	ctx := context.Background()
	if engine.ErrLayout != tier.ErrLayout || engine.ErrOptions != tier.ErrOptions || engine.ErrStorage != tier.ErrStorage || engine.ErrLocked != tier.ErrLocked {
		t.Fatal("engine's sentinels are not package tier's")
	}
	if engine.ErrNoExport != embedded.ErrNoExport || engine.ErrExport != embedded.ErrExport || engine.ErrStaleExport != embedded.ErrStaleExport {
		t.Fatal("engine's export sentinels are not package embedded's")
	}
	refused := func(t *testing.T, what string, err error, own error) {
		t.Helper()
		switch {
		case !errors.Is(err, engine.ErrLayout), !errors.Is(err, tier.ErrLayout):
			t.Errorf("%s: %v, want ErrLayout", what, err)
		case own != nil && !errors.Is(err, own):
			t.Errorf("%s: %v, want it to match %v too", what, err, own)
		case errors.Is(err, engine.ErrOptions), errors.Is(err, engine.ErrUnavailable):
			t.Errorf("%s: %v also matches ErrOptions or ErrUnavailable", what, err)
		}
	}
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Start(t)
		c := srv.Client(t)
		prefix := fmt.Sprintf("layout-%d:", time.Now().UnixNano())
		base := engine.Options{Window: 2 * time.Hour, Partition: time.Hour, MaxAttempts: 2, Namespaces: map[string]engine.NamespaceOptions{"short": {Window: time.Minute}}}
		first := openRedis(t, c, prefix, base)
		defer first.Close()
		if out, err := first.MarkIfAbsent(ctx, []byte("k")); err != nil || out != engine.New {
			t.Fatal(out, err)
		}
		layout, err := c.Get(ctx, prefix+"\x00").Result()
		if err != nil {
			t.Fatal(err)
		}
		for name, change := range map[string]func(o *engine.Options){
			"Window":         func(o *engine.Options) { o.Window = 3 * time.Hour },
			"MaxAttempts":    func(o *engine.Options) { o.MaxAttempts = 3 },
			"no MaxAttempts": func(o *engine.Options) { o.MaxAttempts = 0 },
			"NoSharedCache":  func(o *engine.Options) { o.NoSharedCache = true },
			"NamespaceWindows": func(o *engine.Options) {
				o.Namespaces = map[string]engine.NamespaceOptions{"short": {Window: 2 * time.Minute}}
			},
			"no NamespaceWindows": func(o *engine.Options) { o.Namespaces = nil },
		} {
			o := base
			change(&o)
			o.Backend = redisBackend(c, prefix)
			e, err := mxOpen(o)
			if e != nil {
				e.Close()
			}
			refused(t, "Open with another "+name, err, redis.ErrLayout)
		}
		if got, _ := c.Get(ctx, prefix+"\x00").Result(); got != layout {
			t.Errorf("refused Opens changed the layout %q to %q", layout, got)
		}
		if out, err := first.MarkIfAbsent(ctx, []byte("k")); err != nil || out != engine.Duplicate {
			t.Fatalf("the first engine after the refusals = %v, %v", out, err)
		}
		// Options that are not part of the layout are free.
		o := base
		o.Backend, o.Lease, o.FailOpen, o.CommitQueue = redisBackend(c, prefix), 5*time.Second, true, 1
		second := open(t, o)
		defer second.Close()
		if out, err := second.MarkIfAbsent(ctx, []byte("k")); err != nil || out != engine.Duplicate {
			t.Fatalf("a second engine of other Lease/FailOpen/CommitQueue = %v, %v", out, err)
		}
	})
	t.Run("postgres", func(t *testing.T) {
		pool := postgresPool(t)
		table := pgTable(t, pool, "mx_layout")
		base := engine.Options{Window: 2 * time.Hour, Partition: time.Hour, MaxAttempts: 2}
		o := base
		o.Backend = pgBackend(pool, table)
		first := open(t, o)
		defer first.Close()
		if out, err := first.MarkIfAbsent(ctx, []byte("k")); err != nil || out != engine.New {
			t.Fatal(out, err)
		}
		for name, change := range map[string]func(o *engine.Options){
			"Window":         func(o *engine.Options) { o.Window = 3 * time.Hour },
			"MaxAttempts":    func(o *engine.Options) { o.MaxAttempts = 3 },
			"no MaxAttempts": func(o *engine.Options) { o.MaxAttempts = 0 },
			"NoSharedCache":  func(o *engine.Options) { o.NoSharedCache = true },
		} {
			o := base
			change(&o)
			o.Backend = pgBackend(pool, table)
			e, err := mxOpen(o)
			if e != nil {
				e.Close()
			}
			refused(t, "Open with another "+name, err, postgres.ErrLayout)
		}
		if out, err := first.MarkIfAbsent(ctx, []byte("k")); err != nil || out != engine.Duplicate {
			t.Fatalf("the first engine after the refusals = %v, %v", out, err)
		}
	})
	t.Run("default", func(t *testing.T) {
		mem := vfs.NewMem()
		base := engine.Options{Backend: &embedded.Backend{Dir: "db", FS: mem}, Window: 4 * time.Hour, Partition: time.Hour, ExpectedKeys: 1000}
		e := open(t, base)
		keys := mxKeys("layout", 20)
		mxMarkAll(t, e, keys, engine.New, "first open")
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		for name, change := range map[string]func(o *engine.Options){
			"Partition":       func(o *engine.Options) { o.Partition = 2 * time.Hour },
			"shorter Window":  func(o *engine.Options) { o.Window = 3 * time.Hour },
			"Tiers BloomOnly": func(o *engine.Options) { o.Tiers = engine.BloomOnly },
		} {
			o := base
			change(&o)
			e, err := mxOpen(o)
			if e != nil {
				e.Close()
			}
			refused(t, "Open with another "+name, err, nil)
		}
		e = open(t, base)
		if s := e.Stats(); s.Bloom.Mode != "warm" {
			t.Errorf("after refused Opens the valid one is %q, want warm (the snapshot of the clean Close untouched)", s.Bloom.Mode)
		}
		mxLookupAll(t, e, keys, engine.Duplicate, "after refused Opens")
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		longer := base
		longer.Window = 6 * time.Hour
		e = open(t, longer)
		mxLookupAll(t, e, keys, engine.Duplicate, "with a longer Window")
		e.Close()
	})
	t.Run("bloom-dir", func(t *testing.T) {
		mem := vfs.NewMem()
		base := engine.Options{Tiers: engine.BloomOnly, Backend: &embedded.Backend{Dir: "b", FS: mem}, Window: 4 * time.Hour, Partition: time.Hour, ExpectedKeys: 1000}
		e := open(t, base)
		keys := mxKeys("bl", 20)
		mxMarkAll(t, e, keys, engine.New, "first open")
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		for name, change := range map[string]func(o *engine.Options){
			"Partition":     func(o *engine.Options) { o.Partition = 2 * time.Hour },
			"Window":        func(o *engine.Options) { o.Window = 3 * time.Hour },
			"ExpectedKeys":  func(o *engine.Options) { o.ExpectedKeys = 2000 },
			"FalsePositive": func(o *engine.Options) { o.FalsePositive = 0.001 },
			"Tiers Default": func(o *engine.Options) { o.Tiers = engine.Default },
		} {
			o := base
			change(&o)
			e, err := mxOpen(o)
			if e != nil {
				e.Close()
			}
			refused(t, "Open with another "+name, err, nil)
		}
		e = open(t, base)
		mxMarkAll(t, e, keys, engine.Duplicate, "after refused Opens")
		e.Close()
	})
}

// TestMatrixLockedMatchesSentinel: a directory held by an engine of this
// process is refused with ErrLocked (tier.ErrLocked), for the embedded
// default and bloom-only, under another spelling of the path too, and the
// holder keeps working; Import into it is refused with ErrLocked too.
func TestMatrixLockedMatchesSentinel(t *testing.T) {
	ctx := context.Background()
	for _, tiers := range []engine.Tiers{engine.Default, engine.BloomOnly} {
		t.Run(tiers.String(), func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "held")
			o := engine.Options{Tiers: tiers, Backend: embedded.Dir(dir), ExpectedKeys: 1000}
			e := open(t, o)
			defer e.Close()
			for _, spelling := range []string{dir, dir + "/", filepath.Join(dir, "..", "held")} {
				p := o
				setDir(&p, spelling)
				other, err := mxOpen(p)
				if other != nil {
					other.Close()
					t.Fatalf("a second Open of %s succeeded", spelling)
				}
				if !errors.Is(err, engine.ErrLocked) || !errors.Is(err, tier.ErrLocked) {
					t.Errorf("second Open of %s = %v, want ErrLocked", spelling, err)
				}
			}
			if out, err := e.MarkIfAbsent(ctx, []byte("k")); err != nil || out != engine.New {
				t.Fatalf("the holder after the refusals = %v, %v", out, err)
			}
		})
	}
	t.Run("import", func(t *testing.T) {
		src := open(t, engine.Options{Backend: embedded.Dir(filepath.Join(t.TempDir(), "src")), ExpectedKeys: 1000})
		mxMarkAll(t, src, mxKeys("imp", 5), engine.New, "source")
		exp := filepath.Join(t.TempDir(), "exp")
		if _, err := src.Export(ctx, exp, 1); err != nil {
			t.Fatal(err)
		}
		src.Close()
		dst := filepath.Join(t.TempDir(), "dst")
		held := open(t, engine.Options{Backend: embedded.Dir(dst), ExpectedKeys: 1000})
		defer held.Close()
		if _, err := importExport(ctx, exp, &engine.Options{Backend: embedded.Dir(dst), ExpectedKeys: 1000}, 0); !errors.Is(err, engine.ErrLocked) {
			t.Errorf("Import into a held directory = %v, want ErrLocked", err)
		}
		mxLookupAll(t, held, mxKeys("imp", 5), engine.New, "the holder after the refused Import")
	})
}

// TestMatrixStatsNameEachConfiguration: Stats.Tiers, Stats.Config and
// Options.Name agree for every configuration, a Backend reports Default
// and "memory+"+its name, and BloomMode is set exactly where there are
// filters.
func TestMatrixStatsNameEachConfiguration(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	pool := postgresPool(t)
	cases := []struct {
		name      string
		o         engine.Options
		tiers     engine.Tiers
		config    string
		bloomMode string
	}{
		{"memory", engine.Options{Tiers: engine.MemoryOnly}, engine.MemoryOnly, "memory", ""},
		{"bloom", engine.Options{Backend: &embedded.Backend{}, Tiers: engine.BloomOnly, ExpectedKeys: 1000}, engine.BloomOnly, "bloom", "warm"},
		{"bloom-dir", engine.Options{Tiers: engine.BloomOnly, Backend: embedded.Dir(t.TempDir()), ExpectedKeys: 1000}, engine.BloomOnly, "bloom", "warm"},
		{"default", engine.Options{Backend: embedded.Dir(t.TempDir()), ExpectedKeys: 1000}, engine.Default, "memory+bloom+pebble", "warm"},
		{"redis", engine.Options{Backend: redisBackend(c, fmt.Sprintf("st-%d:", time.Now().UnixNano()))}, engine.Default, "memory+redis", ""},
		{"redis-failopen-uncached", engine.Options{Backend: redisBackend(c, fmt.Sprintf("st2-%d:", time.Now().UnixNano())), FailOpen: true, NoSharedCache: true}, engine.Default, "memory+redis", ""},
		{"postgres", engine.Options{Backend: pgBackend(pool, pgTable(t, pool, "mx_stats"))}, engine.Default, "memory+postgres", ""},
		{"postgres-failopen", engine.Options{Backend: pgBackend(pool, pgTable(t, pool, "mx_stats2")), FailOpen: true}, engine.Default, "memory+postgres", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.o.Name(); got != tc.config {
				t.Errorf("Options.Name() = %q, want %q", got, tc.config)
			}
			e := open(t, tc.o)
			defer e.Close()
			if _, err := e.MarkIfAbsent(context.Background(), []byte("k")); err != nil {
				t.Fatal(err)
			}
			s := e.Stats()
			if s.Tiers != tc.tiers || s.Config != tc.config || s.Bloom.Mode != tc.bloomMode {
				t.Errorf("Stats Tiers %v Config %q BloomMode %q, want %v %q %q", s.Tiers, s.Config, s.Bloom.Mode, tc.tiers, tc.config, tc.bloomMode)
			}
			if s.Window != engine.DefaultWindow || s.Calls.New != 1 || s.Calls.Errors != 0 || s.Calls.FailOpen != 0 {
				t.Errorf("Stats Window %v New %d Errors %d FailOpen %d", s.Window, s.Calls.New, s.Calls.Errors, s.Calls.FailOpen)
			}
			if (tc.bloomMode != "") != (s.Bloom.Bytes > 0) {
				t.Errorf("BloomBytes %d with BloomMode %q", s.Bloom.Bytes, s.Bloom.Mode)
			}
			if tc.name == "default" && (s.Store.DiskBytes == 0 || s.Store.FsyncLatency.Count == 0) {
				t.Errorf("default: DiskBytes %d, FsyncLatency.Count %d", s.Store.DiskBytes, s.Store.FsyncLatency.Count)
			}
			if tc.name != "default" && (s.Store.DiskBytes != 0 || s.Store.FsyncLatency.Count != 0) {
				t.Errorf("%s: DiskBytes %d, FsyncLatency.Count %d, want none", tc.name, s.Store.DiskBytes, s.Store.FsyncLatency.Count)
			}
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			if s := e.Stats(); s.Config != tc.config {
				t.Errorf("Stats after Close: Config %q", s.Config)
			}
		})
	}
}

// mxConfig is one configuration checked here (from the one list,
// enginetest.Configs), on storage of its own: open gives an engine over
// that storage (the same one each call), or Open's error.
type mxConfig struct {
	name    string
	shared  bool // claims in a shared Backend
	durable bool // a clean reopen keeps commits
	exact   bool // never drops a new message
	open    func(t *testing.T, o engine.Options) (*engine.Engine, error)
}

// mxConfigs returns every single-server configuration, each on fresh
// storage.
func mxConfigs(t *testing.T) []mxConfig {
	var out []mxConfig
	for _, c := range enginetest.Pick("memory", "bloom", "bloom-dir", "default", "redis", "postgres") {
		s := c.New(t, "mx_"+c.Name)
		out = append(out, mxConfig{c.Name, c.Shared, c.Durable, c.Exact, func(t *testing.T, o engine.Options) (*engine.Engine, error) {
			if o.ExpectedKeys == 0 {
				o.ExpectedKeys = 10000
			}
			return mxOpen(s.Options(o))
		}})
	}
	return out
}

// mxOption is one option checked here: set changes the options; ok
// says whether the configuration accepts it (refused: ErrOptions).
type mxOption struct {
	name string
	set  func(o *engine.Options)
	ok   func(cfg mxConfig) bool
}

var mxOptions = []mxOption{
	{"plain", func(*engine.Options) {}, func(mxConfig) bool { return true }},
	{"FailOpen", func(o *engine.Options) { o.FailOpen = true }, func(c mxConfig) bool { return c.shared }},
	{"NoSharedCache", func(o *engine.Options) { o.NoSharedCache = true }, func(c mxConfig) bool { return c.shared }},
	{"FailOpen+NoSharedCache", func(o *engine.Options) { o.FailOpen, o.NoSharedCache = true, true }, func(c mxConfig) bool { return c.shared }},
	{"MaxAttempts", func(o *engine.Options) { o.MaxAttempts = 2 }, func(mxConfig) bool { return true }},
	{"CommitQueue", func(o *engine.Options) { o.CommitQueue = 1 }, func(mxConfig) bool { return true }},
	{"NoSync", func(o *engine.Options) { o.Backend = &embedded.Backend{NoSync: true} }, func(mxConfig) bool { return true }},
	{"NamespaceWindows", func(o *engine.Options) {
		o.Lease, o.Namespaces = 200*time.Millisecond, map[string]engine.NamespaceOptions{"short": {Window: 1500 * time.Millisecond}}
	}, func(c mxConfig) bool { return c.name != "bloom" && c.name != "bloom-dir" && c.name != "postgres" }},
}

// mxCapabilities checks docs/reliability.md's table of calls by
// configuration: each call a configuration offers works, each other one
// is ErrOptions.
func mxCapabilities(t *testing.T, e *engine.Engine, cfg mxConfig) {
	t.Helper()
	ctx := context.Background()
	expect := func(what string, offered bool, err error) {
		t.Helper()
		switch {
		case offered && err != nil:
			t.Errorf("%s on %s: %v, want it offered", what, cfg.name, err)
		case !offered && !errors.Is(err, engine.ErrOptions):
			t.Errorf("%s on %s: %v, want ErrOptions", what, cfg.name, err)
		}
	}
	bloom := cfg.name == "bloom" || cfg.name == "bloom-dir"
	embedded := cfg.name == "default"

	out, res, err := e.DoResult(ctx, []byte("with-result"), func(context.Context) ([]byte, error) { return []byte("r1"), nil })
	expect("DoResult", !bloom, err)
	if !bloom {
		if out != engine.New || string(res) != "r1" {
			t.Fatalf("DoResult = %v, %q", out, res)
		}
		if out, res, err := e.DoResult(ctx, []byte("with-result"), func(context.Context) ([]byte, error) { return []byte("r2"), nil }); err != nil || out != engine.Duplicate || string(res) != "r1" {
			t.Fatalf("DoResult again = %v, %q, %v; want Duplicate with the first result", out, res, err)
		}
	}

	adv, err := e.Advance(ctx, []byte("entity"), 3)
	expect("Advance", embedded || cfg.name == "redis", err)
	if err == nil {
		if adv.Outcome != engine.New {
			t.Fatalf("Advance = %v", adv.Outcome)
		}
		if err := e.Commit(ctx, adv); err != nil {
			t.Fatal(err)
		}
		if stale, err := e.Advance(ctx, []byte("entity"), 2); err != nil || stale.Outcome != engine.Stale {
			t.Fatalf("Advance to an older version = %v, %v; want Stale", stale.Outcome, err)
		}
	}

	tok, err := e.IssueToken(ctx, time.Minute)
	expect("IssueToken", cfg.exact && cfg.name != "memory", err)
	if err == nil {
		if err := e.ConsumeToken(ctx, tok); err != nil {
			t.Fatalf("ConsumeToken: %v", err)
		}
		if err := e.ConsumeToken(ctx, tok); !errors.Is(err, engine.ErrTokenUsed) {
			t.Fatalf("second ConsumeToken = %v, want ErrTokenUsed", err)
		}
	}
	expect("ConsumeToken", cfg.exact && cfg.name != "memory", func() error {
		err := e.ConsumeToken(ctx, "not-a-token")
		if errors.Is(err, engine.ErrTokenUnknown) {
			return nil
		}
		return err
	}())

	ext, err := e.Claim(ctx, []byte("extended"))
	if err != nil || ext.Outcome != engine.New {
		t.Fatal(ext.Outcome, err)
	}
	expect("Extend", true, e.Extend(ctx, &ext, time.Minute))
	if err := e.Commit(ctx, ext); err != nil {
		t.Fatalf("Commit after Extend: %v", err)
	}

	wc, err := e.Claim(ctx, []byte("with-writes"))
	if err != nil || wc.Outcome != engine.New {
		t.Fatal(wc.Outcome, err)
	}
	err = e.CommitBatchWith(ctx, []engine.Claim{wc}, nil, []engine.Write{{Key: []byte("rec"), Value: []byte("v")}})
	expect("CommitBatchWith", embedded, err)
	if err != nil {
		if err := e.Commit(ctx, wc); err != nil {
			t.Fatalf("Commit after a refused CommitBatchWith: %v", err)
		}
	}
	expect("ScanWrites", embedded, e.ScanWrites([]byte("rec"), func(k, v []byte) error { return nil }))
	expect("Compact", embedded, e.Compact(ctx))
}

// TestMatrixOptionsByConfiguration runs, for every option against every
// configuration, the consumer's promises through one open, Close and
// reopen: a refused combination is ErrOptions (README and
// docs/reliability.md); an accepted one answers fresh keys New, repeats
// Duplicate, a released key New again, commits acknowledged through the
// commit queue Duplicate, counts attempts where MaxAttempts applies,
// forgets where NoSharedCache allows, expires a namespace's keys after its
// own window, refuses calls after Close with ErrClosed, and after a clean
// reopen keeps exactly what the configuration promises to keep.
func TestMatrixOptionsByConfiguration(t *testing.T) {
	for _, opt := range mxOptions {
		t.Run(opt.name, func(t *testing.T) {
			for _, cfg := range mxConfigs(t) {
				t.Run(cfg.name, func(t *testing.T) { mxScenario(t, cfg, opt) })
			}
		})
	}
}

func mxScenario(t *testing.T, cfg mxConfig, opt mxOption) {
	ctx := context.Background()
	var o engine.Options
	opt.set(&o)
	e, err := cfg.open(t, o)
	if !opt.ok(cfg) {
		if e != nil {
			e.Close()
			t.Fatalf("Open accepted %s on %s", opt.name, cfg.name)
		}
		if !errors.Is(err, engine.ErrOptions) {
			t.Fatalf("Open of %s on %s = %v, want ErrOptions", opt.name, cfg.name, err)
		}
		return
	}
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer e.Close()

	marked := mxKeys("mark", 32)
	mxMarkAll(t, e, marked, engine.New, "fresh keys")
	mxMarkAll(t, e, marked, engine.Duplicate, "marked keys")
	// A batch repeating a key: New once, Duplicate after.
	rep := [][]byte{[]byte("rep"), []byte("rep"), []byte("rep2"), []byte("rep")}
	out := make([]engine.Outcome, len(rep))
	if err := e.MarkBatch(ctx, rep, nil, out); err != nil {
		t.Fatal(err)
	}
	if out[0] != engine.New || out[1] != engine.Duplicate || out[2] != engine.New || out[3] != engine.Duplicate {
		t.Fatalf("MarkBatch with repeats = %v", out)
	}

	committed, err := e.Claim(ctx, []byte("committed"))
	if err != nil || committed.Outcome != engine.New {
		t.Fatal(committed.Outcome, err)
	}
	if again, err := e.Claim(ctx, []byte("committed")); err != nil || again.Outcome != engine.InFlight {
		t.Fatalf("a second claim while the first holds the key = %v, %v; want InFlight", again.Outcome, err)
	}
	if err := e.Commit(ctx, committed); err != nil {
		t.Fatal(err)
	}
	if err := e.Commit(ctx, committed); !errors.Is(err, engine.ErrLeaseLost) {
		t.Fatalf("a second Commit of the claim = %v, want ErrLeaseLost", err)
	}
	if again, err := e.Claim(ctx, []byte("committed")); err != nil || again.Outcome != engine.Duplicate {
		t.Fatalf("claim after commit = %v, %v", again.Outcome, err)
	}

	released, err := e.Claim(ctx, []byte("released"))
	if err != nil || released.Outcome != engine.New {
		t.Fatal(released.Outcome, err)
	}
	if err := e.Release(ctx, released); err != nil {
		t.Fatal(err)
	}
	if again, err := e.Claim(ctx, []byte("released")); err != nil || again.Outcome != engine.New {
		t.Fatalf("claim after release = %v, %v; want New", again.Outcome, err)
	} else if err := e.UnclaimBatch(ctx, []engine.Claim{again}, nil); err != nil {
		t.Fatal(err)
	}

	// Commits through the queue, concurrently (CommitQueue 1 makes them
	// wait for room).
	async := mxKeys("async", 24)
	claims := mxClaimAll(t, e, async, engine.New, "async keys")
	var wg sync.WaitGroup
	errs := make([]error, len(claims))
	for i := range claims {
		wg.Add(1)
		go func() {
			e.CommitAsync(ctx, claims[i], func(err error) { errs[i] = err; wg.Done() })
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("CommitAsync %d: %v", i, err)
		}
	}
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	mxMarkAll(t, e, async, engine.Duplicate, "keys committed asynchronously")

	// Do: a failing handler releases (and counts an attempt with
	// MaxAttempts where attempts are kept).
	boom := errors.New("handler failed")
	for i := range 2 {
		if got, err := e.Do(ctx, []byte("poison"), func(context.Context) error { return boom }); got != engine.New || !errors.Is(err, boom) {
			t.Fatalf("failing Do %d = %v, %v", i, got, err)
		}
	}
	counts := o.MaxAttempts > 0 && cfg.name != "bloom" && cfg.name != "bloom-dir"
	wantPoison := engine.New
	if counts {
		wantPoison = engine.Poison
	}
	if got, err := e.Do(ctx, []byte("poison"), func(context.Context) error { return nil }); got != wantPoison || err != nil {
		t.Fatalf("Do after two failures = %v, %v; want %v", got, err, wantPoison)
	}
	if counts {
		// The Lookup of a key at MaxAttempts is Poison too.
		if info, err := e.Lookup(ctx, []byte("poison")); err != nil || info.Outcome != engine.Poison {
			t.Fatalf("Lookup of the poisoned key = %+v, %v", info, err)
		}
	}

	// Lookup and Forget where the configuration offers them.
	_, lerr := e.Lookup(ctx, []byte("committed"))
	_, ferr := e.Forget(ctx, []byte("forgotten-never-marked"))
	switch {
	case !cfg.exact:
		if !errors.Is(lerr, engine.ErrOptions) || !errors.Is(ferr, engine.ErrOptions) {
			t.Fatalf("bloom-only Lookup %v, Forget %v: want ErrOptions", lerr, ferr)
		}
	case cfg.shared && !o.NoSharedCache:
		if lerr != nil || !errors.Is(ferr, engine.ErrOptions) {
			t.Fatalf("shared Lookup %v, Forget without NoSharedCache %v: want nil, ErrOptions", lerr, ferr)
		}
	default:
		if lerr != nil || ferr != nil {
			t.Fatalf("Lookup %v, Forget %v", lerr, ferr)
		}
		if out, err := e.MarkIfAbsent(ctx, []byte("to-forget")); err != nil || out != engine.New {
			t.Fatal(out, err)
		}
		if info, err := e.Forget(ctx, []byte("to-forget")); err != nil || info.Outcome != engine.Duplicate {
			t.Fatalf("Forget of a marked key = %+v, %v", info, err)
		}
		if out, err := e.MarkIfAbsent(ctx, []byte("to-forget")); err != nil || out != engine.New {
			t.Fatalf("mark after Forget = %v, %v; want New", out, err)
		}
	}

	if o.Namespaces["short"].Window != 0 {
		short, err := e.Namespace("short")
		if err != nil {
			t.Fatal(err)
		}
		if short.Window() != 1500*time.Millisecond {
			t.Fatalf("Namespace(short).Window() = %v", short.Window())
		}
		if out, err := short.MarkIfAbsent(ctx, []byte("brief")); err != nil || out != engine.New {
			t.Fatal(out, err)
		}
		if out, err := e.MarkIfAbsent(ctx, []byte("brief")); err != nil || out != engine.New {
			t.Fatalf("the same key in the default namespace = %v, %v; want New", out, err)
		}
		if out, err := short.MarkIfAbsent(ctx, []byte("brief")); err != nil || out != engine.Duplicate {
			t.Fatalf("inside its window = %v, %v; want Duplicate", out, err)
		}
		time.Sleep(2 * time.Second)
		if out, err := short.MarkIfAbsent(ctx, []byte("brief")); err != nil || out != engine.New {
			t.Fatalf("past its namespace's window = %v, %v; want New", out, err)
		}
		if out, err := e.MarkIfAbsent(ctx, []byte("brief")); err != nil || out != engine.Duplicate {
			t.Fatalf("the default namespace's copy past the short window = %v, %v; want Duplicate", out, err)
		}
	}

	mxCapabilities(t, e, cfg)

	s := e.Stats()
	if s.Calls.Errors != 0 || s.Calls.FailOpen != 0 || s.Queue.Pending != 0 {
		t.Errorf("Stats: Errors %d FailOpen %d CommitsPending %d", s.Calls.Errors, s.Calls.FailOpen, s.Queue.Pending)
	}

	// A claim held across Close: its Commit is refused after it.
	held, err := e.Claim(ctx, []byte("held-at-close"))
	if err != nil || held.Outcome != engine.New {
		t.Fatal(held.Outcome, err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := e.Commit(ctx, held); !errors.Is(err, engine.ErrClosed) {
		t.Errorf("Commit after Close = %v, want ErrClosed", err)
	}
	if err := e.Release(ctx, held); !errors.Is(err, engine.ErrClosed) {
		t.Errorf("Release after Close = %v, want ErrClosed", err)
	}
	if _, err := e.Claim(ctx, []byte("x")); !errors.Is(err, engine.ErrClosed) {
		t.Errorf("Claim after Close = %v, want ErrClosed", err)
	}
	if _, err := e.MarkIfAbsent(ctx, []byte("x")); !errors.Is(err, engine.ErrClosed) {
		t.Errorf("MarkIfAbsent after Close = %v, want ErrClosed", err)
	}
	if _, err := e.Do(ctx, []byte("x"), func(context.Context) error { return nil }); !errors.Is(err, engine.ErrClosed) {
		t.Errorf("Do after Close = %v, want ErrClosed", err)
	}
	doneErr := make(chan error, 1)
	e.CommitAsync(ctx, held, func(err error) { doneErr <- err })
	if err := <-doneErr; !errors.Is(err, engine.ErrClosed) {
		t.Errorf("CommitAsync after Close: done(%v), want ErrClosed", err)
	}
	if cfg.exact {
		if _, err := e.Lookup(ctx, []byte("x")); !errors.Is(err, engine.ErrClosed) {
			t.Errorf("Lookup after Close = %v, want ErrClosed", err)
		}
	}

	// Reopen on the same storage.
	r, err := cfg.open(t, o)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer r.Close()
	want := engine.New
	if cfg.durable {
		want = engine.Duplicate
	}
	mxMarkAll(t, r, marked, want, "marked keys after a clean reopen")
	mxMarkAll(t, r, async, want, "async-committed keys after a clean reopen")
	if cl, err := r.Claim(ctx, []byte("committed")); err != nil || cl.Outcome != want {
		t.Fatalf("committed key after reopen = %v, %v; want %v", cl.Outcome, err, want)
	}
	wantHeld := engine.New // a claim held at Close is void in the engine's memory
	if cfg.shared {
		wantHeld = engine.InFlight // ...but holds its key in a shared tier until its lease ends
	}
	if cl, err := r.Claim(ctx, []byte("held-at-close")); err != nil || (cl.Outcome != wantHeld && o.Lease == 0) {
		t.Fatalf("key claimed at Close, after reopen = %v, %v; want %v", cl.Outcome, err, wantHeld)
	}
	if counts && cfg.durable {
		if got, err := r.Do(ctx, []byte("poison"), func(context.Context) error { return nil }); got != engine.Poison || err != nil {
			t.Fatalf("poisoned key after reopen = %v, %v; want Poison", got, err)
		}
	}
	if s := r.Stats(); s.Calls.Errors != 0 {
		t.Errorf("reopened: Errors %d", s.Calls.Errors)
	}
}

// mxEmbeddedChecks checks, on an engine reopened over a store holding
// old (committed in a sealed partition), recent (committed in the open
// partition), the entity "order" at version 5, the key "failed" released
// once (MaxAttempts 3) and the record "offset"=42, every answer the
// calls give: Lookup, Claim, MarkBatch, Advance, ScanWrites; then fresh
// keys are New. It is run during a rebuild and once warm.
func mxEmbeddedChecks(t *testing.T, e *engine.Engine, old, recent [][]byte, what string) {
	t.Helper()
	ctx := context.Background()
	all := append(append([][]byte{}, old...), recent...)
	mxLookupAll(t, e, all, engine.Duplicate, what+": committed keys")
	if info, err := e.Lookup(ctx, []byte("failed")); err != nil || info.Outcome != engine.New || info.Attempts != 1 {
		t.Fatalf("%s: Lookup of the released key = %+v, %v; want New with 1 attempt", what, info, err)
	}
	for _, tc := range []struct {
		v    uint64
		want engine.Outcome
	}{{4, engine.Stale}, {5, engine.Duplicate}} {
		c, err := e.Advance(ctx, []byte("order"), tc.v)
		if err != nil || c.Outcome != tc.want || c.Version != 5 {
			t.Fatalf("%s: Advance(order, %d) = %v (stored %d), %v; want %v over 5", what, tc.v, c.Outcome, c.Version, err, tc.want)
		}
	}
	if out, res, err := e.DoResult(ctx, []byte("paid"), func(context.Context) ([]byte, error) { return []byte("receipt-2"), nil }); err != nil || out != engine.Duplicate || string(res) != "receipt-1" {
		t.Fatalf("%s: DoResult of the paid key = %v, %q, %v; want Duplicate with receipt-1", what, out, res, err)
	}
	var offset []byte
	if err := e.ScanWrites([]byte("offset"), func(k, v []byte) error { offset = append([]byte{}, v...); return nil }); err != nil || string(offset) != "42" {
		t.Fatalf("%s: ScanWrites(offset) = %q, %v", what, offset, err)
	}
	mxClaimAll(t, e, all, engine.Duplicate, what+": claims of committed keys")
	mxMarkAll(t, e, all, engine.Duplicate, what+": marks of committed keys")
	fresh := mxKeys(what+"-fresh", 16)
	mxLookupAll(t, e, fresh, engine.New, what+": fresh keys")
	mxMarkAll(t, e, fresh, engine.New, what+": fresh keys")
	mxLookupAll(t, e, fresh, engine.Duplicate, what+": fresh keys once marked")
}

// mxFillEmbedded fills an embedded engine for mxEmbeddedChecks:
// old keys in the partition of clock's time, which then closes and is
// sealed, then the rest in the next partition.
func mxFillEmbedded(t *testing.T, e *engine.Engine, clock *fakeClock) (old, recent [][]byte) {
	t.Helper()
	ctx := context.Background()
	sealedAt := clock.Now()
	old = mxKeys("old", 64)
	mxMarkAll(t, e, old, engine.New, "old keys")
	clock.Add(time.Hour)
	recent = mxKeys("recent", 64)
	mxMarkAll(t, e, recent, engine.New, "recent keys")
	for deadline := time.Now().Add(10 * time.Second); !e.Sealed(sealedAt); {
		if time.Now().After(deadline) {
			t.Fatal("the closed partition was not sealed")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if c, err := e.Advance(ctx, []byte("order"), 5); err != nil || c.Outcome != engine.New {
		t.Fatal(c.Outcome, err)
	} else if err := e.Commit(ctx, c); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("failed")
	if out, err := e.Do(ctx, []byte("failed"), func(context.Context) error { return boom }); out != engine.New || !errors.Is(err, boom) {
		t.Fatal(out, err)
	}
	c, err := e.Claim(ctx, []byte("with-record"))
	if err != nil || c.Outcome != engine.New {
		t.Fatal(c.Outcome, err)
	}
	if err := e.CommitBatchWith(ctx, []engine.Claim{c}, nil, []engine.Write{{Key: []byte("offset"), Value: []byte("42")}}); err != nil {
		t.Fatal(err)
	}
	recent = append(recent, []byte("with-record"))
	if out, res, err := e.DoResult(ctx, []byte("paid"), func(context.Context) ([]byte, error) { return []byte("receipt-1"), nil }); err != nil || out != engine.New || string(res) != "receipt-1" {
		t.Fatal(out, string(res), err)
	}
	return old, recent
}

// TestMatrixCrashRebuildAnswers: after a crash (the store's synced state,
// no Close), the embedded store reopens with the sealed partition loaded
// and the open one rebuilding; while the rebuild is held back, Lookup,
// Claim, MarkBatch and Advance (which now share the claim's filter masks)
// answer every committed key Duplicate, every version, attempt count and
// record as written, and fresh keys New; likewise once warm, and after a
// clean restart from there.
func TestMatrixCrashRebuildAnswers(t *testing.T) {
	enginetest.SetNoRestore(true) // the scan path: see TestCheckpointRestore for the restore
	defer enginetest.SetNoRestore(false)
	mem := newCrashFS()
	clock := newClock()
	o := engine.Options{Backend: &embedded.Backend{Dir: "db", FS: mem}, Window: 4 * time.Hour, Partition: time.Hour, ExpectedKeys: 1000, MaxAttempts: 3, Clock: clock}
	e := open(t, o)
	defer e.Close()
	old, recent := mxFillEmbedded(t, e, clock)

	gate := make(chan struct{})
	enginetest.SetRebuildGate(gate)
	defer enginetest.SetRebuildGate(nil)
	setFS(&o, mem.CrashClone(vfs.CrashCloneCfg{}))
	r := open(t, o)
	defer r.Close()
	s := r.Stats()
	if s.Bloom.Mode != "rebuilding" || s.Bloom.SealedLoaded == 0 {
		t.Fatalf("after the crash: BloomMode %q, BloomSealedLoaded %d; want rebuilding with the sealed partition loaded", s.Bloom.Mode, s.Bloom.SealedLoaded)
	}
	mxEmbeddedChecks(t, r, old, recent, "rebuilding")
	if s := r.Stats(); s.Bloom.Negatives != 0 {
		t.Errorf("filters proved %d keys absent while rebuilding", s.Bloom.Negatives)
	}
	close(gate)
	waitWarm(t, r)
	mxEmbeddedChecks(t, r, old, recent, "warm")
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	r = open(t, o)
	if s := r.Stats(); s.Bloom.Mode != "warm" {
		t.Errorf("after a clean Close following the rebuild: %q, want warm", s.Bloom.Mode)
	}
	mxEmbeddedChecks(t, r, old, recent, "restarted")
}

// TestMatrixKilledChildReopen: a child process running claims and commits
// on a directory is killed with SIGKILL; the parent reopens the directory
// (the child's lock is gone with it) and, during the rebuild and once
// warm, every key the child acknowledged is a Duplicate to Lookup, Claim
// and MarkBatch. A second Open while the parent holds it is ErrLocked.
func TestMatrixKilledChildReopen(t *testing.T) {
	enginetest.SetNoRestore(true) // the scan path: see TestCheckpointRestore for the restore
	defer enginetest.SetNoRestore(false)
	dir := t.TempDir()
	child := crashtest.Start(t, "crash", dir+"|0|sync", &crashtest.Options{Timeout: time.Minute})
	var acked [][]byte
	for {
		line, ok := child.Next()
		if !ok {
			break
		}
		kind, key, ok := strings.Cut(line, " ")
		switch {
		case !ok:
		case kind == "A":
			acked = append(acked, []byte(key))
			if len(acked) == 2000 {
				child.Signal(syscall.SIGKILL)
			}
		case kind == "ERR":
			t.Fatalf("child: %s", key)
		}
	}
	_ = child.Wait()
	if len(acked) < 2000 {
		t.Fatalf("child acknowledged %d keys before it ended\n%s", len(acked), child.Describe())
	}
	gate := make(chan struct{})
	enginetest.SetRebuildGate(gate)
	defer enginetest.SetRebuildGate(nil)
	o := engine.Options{Backend: embedded.Dir(dir), ExpectedKeys: 100_000}
	e := open(t, o)
	defer e.Close()
	if s := e.Stats(); s.Bloom.Mode != "rebuilding" {
		t.Fatalf("after SIGKILL: BloomMode %q, want rebuilding", s.Bloom.Mode)
	}
	if _, err := mxOpen(o); !errors.Is(err, engine.ErrLocked) {
		t.Fatalf("a second Open = %v, want ErrLocked", err)
	}
	mxLookupAll(t, e, acked, engine.Duplicate, "rebuilding: acknowledged keys")
	mxMarkAll(t, e, acked[:500], engine.Duplicate, "rebuilding: acknowledged keys")
	close(gate)
	waitWarm(t, e)
	mxLookupAll(t, e, acked, engine.Duplicate, "warm: acknowledged keys")
	mxClaimAll(t, e, acked[500:1000], engine.Duplicate, "warm: acknowledged keys")
	mxMarkAll(t, e, mxKeys("after-kill", 100), engine.New, "fresh keys")
}

// TestMatrixBloomOnlyDirCrashFallsBack: bloom-only with Dir keeps its
// state from the last clean Close; a crash (no Close) falls back to it:
// what was marked before that Close stays Duplicate, and the directory is
// usable (not ErrStorage). Without Dir, nothing survives a Close.
func TestMatrixBloomOnlyDirCrashFallsBack(t *testing.T) {
	mem := newCrashFS()
	mxDurableDir(t, mem, "b") // see TestBloomOnlyNewDirSurvivesPowerLoss
	o := engine.Options{Tiers: engine.BloomOnly, Backend: &embedded.Backend{Dir: "b", FS: mem}, ExpectedKeys: 10000}
	e := open(t, o)
	before := mxKeys("before", 50)
	mxMarkAll(t, e, before, engine.New, "before the clean Close")
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = open(t, o)
	defer e.Close()
	mxMarkAll(t, e, before, engine.Duplicate, "after the clean Close")
	after := mxKeys("after", 50)
	mxMarkAll(t, e, after, engine.New, "after the clean Close")
	setFS(&o, mem.CrashClone(vfs.CrashCloneCfg{}))
	r := open(t, o)
	defer r.Close()
	mxMarkAll(t, r, before, engine.Duplicate, "after a crash")
	if s := r.Stats(); s.Bloom.Mode != "warm" || s.Tiers != engine.BloomOnly {
		t.Errorf("after a crash: %q %v", s.Bloom.Mode, s.Tiers)
	}

	plain := engine.Options{Backend: &embedded.Backend{}, Tiers: engine.BloomOnly, ExpectedKeys: 10000}
	p := open(t, plain)
	mxMarkAll(t, p, before, engine.New, "bloom-only without Dir")
	p.Close()
	p = open(t, plain)
	defer p.Close()
	mxMarkAll(t, p, before, engine.New, "bloom-only without Dir, reopened")
}

// mxDurableDir creates dir on fs and makes its entry durable.
func mxDurableDir(t *testing.T, fs vfs.FS, dir string) {
	t.Helper()
	if err := fs.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	d, err := fs.OpenDir(fs.PathDir(dir))
	if err == nil {
		err = d.Sync()
		_ = d.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestBloomOnlyNewDirSurvivesPowerLoss: bloom-only in a Dir that does not
// exist yet keeps its state across a clean Close and a power loss (a
// crash clone of the file system: only what was synced): Open creates Dir
// and syncs its parent, so the directory's entry is durable and every key
// marked before the clean Close is still a Duplicate.
func TestBloomOnlyNewDirSurvivesPowerLoss(t *testing.T) {
	mem := newCrashFS()
	o := engine.Options{Tiers: engine.BloomOnly, Backend: &embedded.Backend{Dir: "state/bloom", FS: mem}, ExpectedKeys: 10000}
	mxDurableDir(t, mem, "state") // the parent exists and is durable; Dir does not exist
	e := open(t, o)
	keys := mxKeys("acked", 50)
	mxMarkAll(t, e, keys, engine.New, "before the clean Close")
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	setFS(&o, mem.CrashClone(vfs.CrashCloneCfg{}))
	r := open(t, o)
	defer r.Close()
	mxMarkAll(t, r, keys, engine.Duplicate, "after a clean Close and a power loss")
}

// TestMatrixExportImportRoundTrip: an export of an embedded engine (a
// sealed partition, an open one, a version, an attempt count, a record),
// imported into another directory, opens as after a crash: rebuilding,
// and every answer as the exporter gave it, during the rebuild and once
// warm. A stale export, another layout, a damaged export, an Import of
// other Options, an Export of another configuration or into the engine's
// own directory are each refused with their sentinel, changing nothing.
func TestMatrixExportImportRoundTrip(t *testing.T) {
	enginetest.SetNoRestore(true) // the scan path: see TestCheckpointRestore for the restore
	defer enginetest.SetNoRestore(false)
	ctx := context.Background()
	root := t.TempDir()
	clock := newClock()
	o := engine.Options{Backend: embedded.Dir(filepath.Join(root, "src")), Window: 4 * time.Hour, Partition: time.Hour, ExpectedKeys: 1000, MaxAttempts: 3, Clock: clock}
	src := open(t, o)
	defer src.Close()
	old, recent := mxFillEmbedded(t, src, clock)
	exp := filepath.Join(root, "exp")
	info, err := src.Export(ctx, exp, 7)
	if err != nil {
		t.Fatal(err)
	}
	if info.Version != 7 || info.Files == 0 {
		t.Fatalf("Export info %+v", info)
	}
	if got, err := embedded.ReadExport(nil, exp); err != nil || got.Version != 7 || got.Files != info.Files {
		t.Fatalf("ReadExport = %+v, %v", got, err)
	}
	for _, bad := range []string{"", dirOf(o), filepath.Join(dirOf(o), "inside"), root} {
		if _, err := src.Export(ctx, bad, 8); !errors.Is(err, engine.ErrOptions) {
			t.Errorf("Export to %q = %v, want ErrOptions", bad, err)
		}
	}

	dst := o
	setDir(&dst, filepath.Join(root, "dst"))
	if got, err := importExport(ctx, exp, &dst, 0); err != nil || got.Version != 7 {
		t.Fatalf("Import = %+v, %v", got, err)
	}
	gate := make(chan struct{})
	enginetest.SetRebuildGate(gate)
	defer enginetest.SetRebuildGate(nil)
	r := open(t, dst)
	if s := r.Stats(); s.Bloom.Mode != "rebuilding" {
		t.Fatalf("an imported store opens %q, want rebuilding", s.Bloom.Mode)
	}
	mxEmbeddedChecks(t, r, old, recent, "imported, rebuilding")
	close(gate)
	waitWarm(t, r)
	mxEmbeddedChecks(t, r, old, recent, "imported, warm")
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}

	// Refusals, each leaving dst as it is.
	if _, err := importExport(ctx, exp, &dst, 7); !errors.Is(err, engine.ErrStaleExport) || !errors.Is(err, embedded.ErrStaleExport) {
		t.Errorf("Import not newer = %v, want ErrStaleExport", err)
	}
	other := dst
	other.Partition = 2 * time.Hour
	if _, err := importExport(ctx, exp, &other, 0); !errors.Is(err, engine.ErrLayout) {
		t.Errorf("Import with another Partition = %v, want ErrLayout", err)
	}
	for name, io := range map[string]*engine.Options{
		"nil":        nil,
		"bloom":      {Tiers: engine.BloomOnly, Backend: embedded.Dir(dirOf(dst))},
		"memory":     {Tiers: engine.MemoryOnly},
		"backend":    {Backend: redis.NewBackend(nil, redis.Config{})},
		"no Dir":     {},
		"bad Window": {Backend: embedded.Dir(dirOf(dst)), Window: -1},
	} {
		if _, err := importExport(ctx, exp, io, 0); !errors.Is(err, engine.ErrOptions) {
			t.Errorf("Import with %s Options = %v, want ErrOptions", name, err)
		}
	}
	if _, err := embedded.ReadExport(nil, t.TempDir()); !errors.Is(err, engine.ErrNoExport) || !errors.Is(err, embedded.ErrNoExport) {
		t.Errorf("ReadExport of an empty directory = %v, want ErrNoExport", err)
	}
	if _, err := importExport(ctx, t.TempDir(), &dst, 0); !errors.Is(err, engine.ErrNoExport) {
		t.Errorf("Import of an empty directory = %v, want ErrNoExport", err)
	}
	// A damaged export: one file's bytes changed.
	ents, err := os.ReadDir(exp)
	if err != nil {
		t.Fatal(err)
	}
	damaged := false
	for _, ent := range ents {
		if strings.HasSuffix(ent.Name(), ".sst") || strings.HasPrefix(ent.Name(), "MANIFEST-") {
			p := filepath.Join(exp, ent.Name())
			b, err := os.ReadFile(p)
			if err != nil || len(b) == 0 {
				continue
			}
			b[len(b)/2] ^= 0xff
			// A new file in its place: the export's tables are hard links
			// of the source store's, which writing in place would damage.
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
			damaged = true
			break
		}
	}
	if !damaged {
		t.Fatal("no file to damage in the export")
	}
	if _, err := importExport(ctx, exp, &dst, 0); !errors.Is(err, engine.ErrExport) || !errors.Is(err, embedded.ErrExport) {
		t.Errorf("Import of a damaged export = %v, want ErrExport", err)
	}
	r = open(t, dst)
	mxEmbeddedChecks(t, r, old, recent, "after refused Imports")
	r.Close()

	// Export is the embedded store's alone.
	srv := redistest.Start(t)
	pool := postgresPool(t)
	for name, eo := range map[string]engine.Options{
		"memory":    {Tiers: engine.MemoryOnly},
		"bloom":     {Tiers: engine.BloomOnly, ExpectedKeys: 1000},
		"bloom-dir": {Tiers: engine.BloomOnly, Backend: embedded.Dir(filepath.Join(root, "bl")), ExpectedKeys: 1000},
		"redis":     {Backend: redisBackend(srv.Client(t), fmt.Sprintf("exp-%d:", time.Now().UnixNano()))},
		"postgres":  {Backend: pgBackend(pool, pgTable(t, pool, "mx_exp"))},
	} {
		e := open(t, eo)
		target := filepath.Join(root, "exp-"+name)
		if _, err := e.Export(ctx, target, 1); !errors.Is(err, engine.ErrOptions) {
			t.Errorf("Export of %s = %v, want ErrOptions", name, err)
		}
		if err := e.Compact(ctx); !errors.Is(err, engine.ErrOptions) {
			t.Errorf("Compact of %s = %v, want ErrOptions", name, err)
		}
		if _, err := os.Stat(target); !os.IsNotExist(err) {
			t.Errorf("the refused Export of %s created %s", name, target)
		}
		e.Close()
	}
	// And refused after Close.
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Export(ctx, filepath.Join(root, "exp-closed"), 9); !errors.Is(err, engine.ErrClosed) {
		t.Errorf("Export after Close = %v, want ErrClosed", err)
	}
	if err := src.Compact(ctx); !errors.Is(err, engine.ErrClosed) {
		t.Errorf("Compact after Close = %v, want ErrClosed", err)
	}
}

// raceEnabled reports whether the test binary was built with -race
// (enginetest.RaceEnabled).
var raceEnabled = enginetest.RaceEnabled

// TestMatrixAllocMemoryMarkBatch: memory-only (and bloom-only) MarkBatch
// allocates nothing per key in steady state (docs/performance.md: "Memory
// and bloom allocate nothing per key"), for fresh keys (memory full, so
// evicting) and for duplicates, in the default namespace and in another
// one: a call of 1024 keys allocates no more than a call of one key, and
// that is a small constant (2: the context.WithValue and the method value
// of the call's hold on the engine, lifecycle.go).
func TestMatrixAllocMemoryMarkBatch(t *testing.T) {
	if raceEnabled() {
		t.Skip("allocation counts are meaningless under -race")
	}
	ctx := context.Background()
	for _, tiers := range []engine.Tiers{engine.MemoryOnly, engine.BloomOnly} {
		t.Run(tiers.String(), func(t *testing.T) {
			e := open(t, engine.Options{Tiers: tiers, MemoryCapacity: 4096, ExpectedKeys: 1 << 20, Clock: newClock()})
			defer e.Close()
			ns, err := e.Namespace("orders")
			if err != nil {
				t.Fatal(err)
			}
			const runs = 20
			keys := mxKeys("alloc", 1024*150)
			next := 0
			// allocs measures a MarkBatch of n keys: fresh ones, or the
			// same n each time (duplicates once marked).
			allocs := func(m func(context.Context, [][]byte, []engine.Digest, []engine.Outcome) error, n int, fresh bool) float64 {
				out := make([]engine.Outcome, n)
				dups := keys[len(keys)-n:]
				if !fresh {
					if err := m(ctx, dups, nil, out); err != nil {
						t.Fatal(err)
					}
				}
				return testing.AllocsPerRun(runs, func() {
					batch := dups
					if fresh {
						batch, next = keys[next:next+n], next+n
					}
					if err := m(ctx, batch, nil, out); err != nil {
						t.Fatal(err)
					}
					for _, o := range out {
						want := engine.Duplicate
						if fresh {
							want = engine.New
						}
						if o != want && tiers == engine.MemoryOnly {
							t.Fatalf("MarkBatch = %v, want %v", o, want)
						}
					}
				})
			}
			fill := make([]engine.Outcome, 1024)
			for range 100 { // fill memory past its capacity, until its stripes stop growing
				if err := e.MarkBatch(ctx, keys[next:next+1024], nil, fill); err != nil {
					t.Fatal(err)
				}
				next += 1024
			}
			for _, tc := range []struct {
				name  string
				m     func(context.Context, [][]byte, []engine.Digest, []engine.Outcome) error
				fresh bool
			}{{"fresh", e.MarkBatch, true}, {"fresh in a namespace", ns.MarkBatch, true}, {"duplicates", e.MarkBatch, false}} {
				one, many := allocs(tc.m, 1, tc.fresh), allocs(tc.m, 1024, tc.fresh)
				// A stripe may still grow its slab now and then (claims in
				// flight are not counted in the capacity): at most one
				// allocation over the runs, far from one a key.
				// Up to three over the runs: run after the conformance
				// tests in one process (.ci/test's pass without -race) a fresh
				// batch of 1024 was measured at 4 against 2 for one key;
				// still far from one a key.
				if many > one+3 || one > 4 {
					t.Errorf("%s: MarkBatch allocates %v times for 1 key, %v for 1024", tc.name, one, many)
				}
				t.Logf("%s: %v allocations a call of 1 key, %v of 1024", tc.name, one, many)
			}
		})
	}
}

// mxSeqHook makes the next Redis calls (a command or a pipeline each)
// pass, lose their reply after running (faultLost), or fail before
// reaching the server (faultDown), one action a call, then lets every
// call through.
type mxSeqHook struct {
	mu      sync.Mutex
	actions []int32
	calls   []string
}

func (h *mxSeqHook) arm(actions ...int32) {
	h.mu.Lock()
	h.actions, h.calls = actions, nil
	h.mu.Unlock()
}

func (h *mxSeqHook) next(what string) int32 {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.actions) == 0 {
		return faultNone
	}
	a := h.actions[0]
	h.actions = h.actions[1:]
	h.calls = append(h.calls, fmt.Sprintf("%s:%d", what, a))
	return a
}

func (h *mxSeqHook) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *mxSeqHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		return processFault(ctx, next, cmd, h.next(cmd.Name()))
	}
}

func (h *mxSeqHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		return pipelineFault(ctx, next, cmds, h.next(fmt.Sprintf("pipeline(%d)", len(cmds))))
	}
}

// during runs fn with the hook armed with actions, then lets every call
// through, and returns the calls the actions applied to.
func (h *mxSeqHook) during(fn func(), actions ...int32) []string {
	h.arm(actions...)
	fn()
	h.mu.Lock()
	calls := h.calls
	h.mu.Unlock()
	h.arm()
	return calls
}

// mxFailedDo runs a Do of key whose handler fails with boom: it must be
// New, its error boom.
func mxFailedDo(t *testing.T, e *engine.Engine, key []byte, boom error, what string) {
	t.Helper()
	if out, err := e.Do(context.Background(), key, func(context.Context) error { return boom }); out != engine.New || !errors.Is(err, boom) {
		t.Fatalf("%s Do = %v, %v", what, out, err)
	}
}

// mxFailUntilNotNew runs Dos of key whose handler fails with boom while
// they are New, at most 6, and returns how many after the first were New
// and the last outcome.
func mxFailUntilNotNew(e *engine.Engine, key []byte, boom error) (news int, out engine.Outcome) {
	fail := func(context.Context) error { return boom }
	out, _ = e.Do(context.Background(), key, fail)
	for out == engine.New && news < 5 {
		news++
		out, _ = e.Do(context.Background(), key, fail)
	}
	return news, out
}

// TestRedisLostMarkReleaseKeepsCount: with MaxAttempts on Redis, a key
// whose handler failed once holds the count 1. A MarkIfAbsent of it claims
// it (the claim carries the count 1), its commit is applied by Redis but
// the reply is lost (the commit value replaces the count), and its
// give-back fails too: the engine remembers the mark, with the count its
// claim carried, for its retry. The next Claim is New (the retry of the
// caller's own mark) and its handler fails; the consumer's Release undoes
// the commit and leaves the count the claim carried, so the key is not
// given MaxAttempts fresh tries.
func TestRedisLostMarkReleaseKeepsCount(t *testing.T) {
	srv := redistest.Start(t)
	hook := &mxSeqHook{}
	c := srv.ClientWith(t, &goredis.Options{MaxRetries: -1})
	c.AddHook(hook)
	plain := srv.Client(t)
	prefix := fmt.Sprintf("lostmark-%d:", time.Now().UnixNano())
	e := openRedis(t, c, prefix, engine.Options{MaxAttempts: 2, Lease: time.Hour})
	defer e.Close()
	ctx := context.Background()
	key := []byte("order-7")
	rkey := prefix + "\x00\x00" + string(key)
	boom := errors.New("handler failed")
	mxFailedDo(t, e, key, boom, "first")
	if info, err := e.Lookup(ctx, key); err != nil || info.Attempts != 1 {
		t.Fatalf("after one failure: %+v, %v", info, err)
	}

	// The mark: its claim passes, its commit runs with its reply lost, its
	// give-back (and any retry of it) fails.
	var err error
	calls := hook.during(func() { _, err = e.MarkIfAbsent(ctx, key) }, faultNone, faultLost, faultDown, faultDown, faultDown)
	if !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("mark whose commit reply is lost = %v, want ErrUnavailable (calls %v)", err, calls)
	}
	if v, _ := plain.Get(ctx, rkey).Result(); !strings.HasPrefix(v, "D") {
		t.Fatalf("Redis holds %q after the lost commit (calls %v), want the mark's commit", v, calls)
	}

	cl, err := e.Claim(ctx, key)
	if err != nil || cl.Outcome != engine.New {
		t.Fatalf("claim after the lost mark = %v, %v; want New (the retry of its own mark)", cl.Outcome, err)
	}
	// Its handler fails: the consumer releases it.
	if err := e.Release(ctx, cl); err != nil {
		t.Fatalf("Release: %v", err)
	}
	info, err := e.Lookup(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if info.Attempts == 0 {
		v, _ := plain.Get(ctx, rkey).Result()
		t.Errorf("after two failed handlers the key holds no attempt count (Redis value %q, Lookup %+v): the count 1 the mark's claim carried is gone", v, info)
	}
	news, out := mxFailUntilNotNew(e, key, boom)
	t.Logf("after two failed handlers (MaxAttempts 2) the key was New (its handler run) %d more times before %v", news, out)
}

// mxSeqDB is mxSeqHook for the PostgreSQL tier: each Exec or Query
// takes the next action.
type mxSeqDB struct {
	*pgxpool.Pool
	h *mxSeqHook
}

func (d mxSeqDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return execFault(ctx, d.Pool, d.h.next("exec"), plainFault, sql, args)
}

func (d mxSeqDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return queryFault(ctx, d.Pool, d.h.next("query"), plainFault, sql, args)
}

// plainFault is errInjectedFault, whatever the fault.
func plainFault(int32) error { return errInjectedFault }

// TestMatrixPostgresLostMarkReleaseCounts: the same history as
// TestRedisLostMarkReleaseKeepsCount on PostgreSQL (a Marker:
// the mark is one statement, its reply lost): the count the key held
// survives the give-back of the claim over the lost mark.
func TestMatrixPostgresLostMarkReleaseCounts(t *testing.T) {
	pool := postgresPool(t)
	table := pgTable(t, pool, "mx_lostmark")
	hook := &mxSeqHook{}
	e := open(t, engine.Options{Backend: pgBackend(mxSeqDB{pool, hook}, table), MaxAttempts: 2, Lease: time.Hour})
	defer e.Close()
	ctx := context.Background()
	key := []byte("order-7")
	boom := errors.New("handler failed")
	mxFailedDo(t, e, key, boom, "first")
	var err error
	calls := hook.during(func() { _, err = e.MarkIfAbsent(ctx, key) }, faultLost, faultDown, faultDown)
	if !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("mark whose reply is lost = %v, want ErrUnavailable (calls %v)", err, calls)
	}
	var state string
	if err := pool.QueryRow(ctx, "SELECT state::text FROM "+table).Scan(&state); err != nil || state != "D" {
		t.Fatalf("row state %q, %v (calls %v); want the mark's commit", state, err, calls)
	}
	cl, err := e.Claim(ctx, key)
	if err != nil || cl.Outcome != engine.New {
		t.Fatalf("claim after the lost mark = %v, %v; want New (the retry of its own mark)", cl.Outcome, err)
	}
	if err := e.Release(ctx, cl); err != nil {
		t.Fatalf("Release: %v", err)
	}
	info, err := e.Lookup(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if info.Attempts == 0 {
		t.Errorf("after two failed handlers the key holds no attempt count (Lookup %+v)", info)
	}
	// The Release of a claim over its own lost mark is a give-back
	// (release.go, undoCommits: "no attempt counted"), so the key keeps
	// the count it carried and may get one more try than MaxAttempts (the
	// code's stated design: the number of tries is logged), but it must
	// end Poison.
	news, out := mxFailUntilNotNew(e, key, boom)
	if out != engine.Poison {
		t.Errorf("the key never became Poison: %v after %d more failures", out, news)
	}
	t.Logf("after two failed handlers (MaxAttempts 2) the key was New (its handler run) %d more times before %v", news, out)
}

// TestValidateReportsEveryBackendField: Options.Validate reports every
// invalid field at once, the Backend's too: a nil client does not hide a
// bad prefix or table, nor does an invalid Window or Partition hide the
// Backend's own errors.
func TestValidateReportsEveryBackendField(t *testing.T) {
	cases := []struct {
		name string
		o    engine.Options
		want []string // substrings every one of which the error must hold
	}{
		{"redis: nil client and a bad prefix", engine.Options{Backend: redis.NewBackend(nil, redis.Config{Prefix: "a{b}"})}, []string{"client", "Prefix"}},
		{"postgres: nil db and a bad table", engine.Options{Backend: postgres.NewBackend(nil, postgres.Config{Table: "a-b"})}, []string{"database", "Table"}},
		{"redis: nil client and a negative Window", engine.Options{Backend: redis.NewBackend(nil, redis.Config{}), Window: -1}, []string{"client", "Window"}},
		{"postgres: bad table and a negative Window", engine.Options{Backend: pgBackend(mxSeqDB{}, "a-b"), Window: -1}, []string{"Table", "Window"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := mxValidate(tc.o)
			if !errors.Is(err, engine.ErrOptions) {
				t.Fatalf("Validate = %v, want ErrOptions", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate does not report %s: %v", w, err)
				}
			}
		})
	}
}

// TestMatrixRebuildCloseAndForget: an engine closed while its rebuild is
// held back closes promptly (the rebuild stops) and saves no snapshot of
// incomplete filters, so the next Open rebuilds again and answers right;
// a Forget during the rebuild removes the key for good (New now, once
// warm and after a restart), and a key marked during the rebuild is a
// Duplicate throughout.
func TestMatrixRebuildCloseAndForget(t *testing.T) {
	enginetest.SetNoRestore(true) // the scan path: see TestCheckpointRestore for the restore
	defer enginetest.SetNoRestore(false)
	ctx := context.Background()
	mem := newCrashFS()
	clock := newClock()
	o := engine.Options{Backend: &embedded.Backend{Dir: "db", FS: mem}, Window: 4 * time.Hour, Partition: time.Hour, ExpectedKeys: 1000, MaxAttempts: 3, Clock: clock}
	e := open(t, o)
	defer e.Close()
	old, recent := mxFillEmbedded(t, e, clock)
	gate := make(chan struct{})
	enginetest.SetRebuildGate(gate)
	defer enginetest.SetRebuildGate(nil)
	setFS(&o, mem.CrashClone(vfs.CrashCloneCfg{}))
	r := open(t, o)
	during := mxKeys("during", 20)
	mxMarkAll(t, r, during, engine.New, "marked during the rebuild")
	forgotten := [][]byte{old[0], recent[0]}
	for _, k := range forgotten {
		if info, err := r.Forget(ctx, k); err != nil || info.Outcome != engine.Duplicate {
			t.Fatalf("Forget of %s during the rebuild = %+v, %v", k, info, err)
		}
	}
	mxLookupAll(t, r, forgotten, engine.New, "forgotten during the rebuild")
	within(t, 10*time.Second, "Close during a held rebuild", func() {
		if err := r.Close(); err != nil {
			t.Errorf("Close during the rebuild: %v", err)
		}
	})
	r = open(t, o)
	defer r.Close()
	if s := r.Stats(); s.Bloom.Mode != "rebuilding" {
		t.Fatalf("after a Close during the rebuild: %q, want rebuilding again (no snapshot of incomplete filters)", s.Bloom.Mode)
	}
	mxLookupAll(t, r, forgotten, engine.New, "forgotten, reopened while rebuilding")
	mxLookupAll(t, r, during, engine.Duplicate, "marked during the first rebuild, reopened")
	mxLookupAll(t, r, append(append([][]byte{}, old[1:]...), recent[1:]...), engine.Duplicate, "committed keys, reopened while rebuilding")
	close(gate)
	waitWarm(t, r)
	mxLookupAll(t, r, forgotten, engine.New, "forgotten, warm")
	mxMarkAll(t, r, during, engine.Duplicate, "marked during the first rebuild, warm")
	mxMarkAll(t, r, forgotten, engine.New, "forgotten keys marked again")
}

// mxBloomChildEnv makes TestMatrixKilledBloomOnlyChild's re-executed
// binary its child: it names the directory.
const mxBloomChildEnv = "TIERDEDUP_MATRIX_BLOOM_CHILD"

// TestMatrixKilledBloomOnlyChild: a process running bloom-only on a real
// directory (a clean Close, then a reopen and more marks) is killed with
// SIGKILL; its lock dies with it, so the next Open is not ErrLocked, and
// it starts from the state of the clean Close: every key marked before it
// is a Duplicate.
func TestMatrixKilledBloomOnlyChild(t *testing.T) {
	ctx := context.Background()
	if dir := os.Getenv(mxBloomChildEnv); dir != "" {
		o := engine.Options{Tiers: engine.BloomOnly, Backend: embedded.Dir(dir), ExpectedKeys: 10000, Logger: quiet}
		e, err := engine.Open(&o)
		if err != nil {
			fmt.Println("ERR", err)
			os.Exit(1)
		}
		out := make([]engine.Outcome, 100)
		if err := e.MarkBatch(ctx, mxKeys("saved", 100), nil, out); err != nil {
			fmt.Println("ERR", err)
			os.Exit(1)
		}
		if err := e.Close(); err != nil {
			fmt.Println("ERR", err)
			os.Exit(1)
		}
		if e, err = engine.Open(&o); err != nil {
			fmt.Println("ERR", err)
			os.Exit(1)
		}
		if err := e.MarkBatch(ctx, mxKeys("unsaved", 100), nil, out); err != nil {
			fmt.Println("ERR", err)
			os.Exit(1)
		}
		fmt.Println("READY")
		time.Sleep(time.Minute) // until killed
		os.Exit(3)
	}
	dir := filepath.Join(t.TempDir(), "bloom")
	// Not crashtest.Start: its children are the ones TestMain registers.
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, os.Args[0], "-test.run=^TestMatrixKilledBloomOnlyChild$")
	cmd.Env = append(os.Environ(), mxBloomChildEnv+"="+dir)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	var got strings.Builder
	for !strings.Contains(got.String(), "READY") {
		n, err := stdout.Read(buf)
		got.Write(buf[:n])
		if err != nil {
			t.Fatalf("child ended before READY: %q (%v)", got.String(), err)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	e, err := mxOpen(engine.Options{Tiers: engine.BloomOnly, Backend: embedded.Dir(dir), ExpectedKeys: 10000})
	if err != nil {
		t.Fatalf("Open after the holder was killed = %v", err)
	}
	defer e.Close()
	mxMarkAll(t, e, mxKeys("saved", 100), engine.Duplicate, "marked before the child's clean Close")
	// What the child marked after its reopen died with it (the state is
	// the last clean Close's): New but for the filters' false positives.
	out := make([]engine.Outcome, 100)
	if err := e.MarkBatch(ctx, mxKeys("unsaved", 100), nil, out); err != nil {
		t.Fatal(err)
	}
	news := 0
	for _, o := range out {
		if o == engine.New {
			news++
		}
	}
	if news < 95 {
		t.Errorf("%d of 100 keys marked after the child's clean Close are New after the kill; want them lost", news)
	}
}

// TestMatrixFailedOpenReleasesWhatItOpened: an Open refused after it
// opened something (a directory, a backend) closes it on its one cleanup
// path: the same process can then open the directory (no ErrLocked), and
// the caller's Redis client and PostgreSQL pool still work.
func TestMatrixFailedOpenReleasesWhatItOpened(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	c := srv.Client(t)
	pool := postgresPool(t)
	for _, tiers := range []engine.Tiers{engine.Default, engine.BloomOnly} {
		t.Run(tiers.String(), func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "d")
			o := engine.Options{Tiers: tiers, Backend: embedded.Dir(dir), ExpectedKeys: 1000, Window: 2 * time.Hour, Partition: time.Hour}
			if _, err := mxOpen(engine.Options{Tiers: tiers, Backend: embedded.Dir(dir), ExpectedKeys: 1000, Window: 2 * time.Hour, Partition: time.Hour, Clock: mxBadClock}); !errors.Is(err, engine.ErrOptions) {
				t.Fatalf("Open with a bad clock = %v", err)
			}
			e := open(t, o) // not ErrLocked
			mxMarkAll(t, e, mxKeys("k", 10), engine.New, "after a refused Open")
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			bad := o
			bad.Partition = 2 * time.Hour
			if _, err := mxOpen(bad); !errors.Is(err, engine.ErrLayout) {
				t.Fatalf("Open with another Partition = %v, want ErrLayout", err)
			}
			e = open(t, o) // not ErrLocked
			defer e.Close()
			mxMarkAll(t, e, mxKeys("k", 10), engine.Duplicate, "after a refused Open")
		})
	}
	t.Run("redis", func(t *testing.T) {
		prefix := fmt.Sprintf("fo-%d:", time.Now().UnixNano())
		if _, err := mxOpen(engine.Options{Backend: redisBackend(c, prefix), Clock: mxBadClock}); !errors.Is(err, engine.ErrOptions) {
			t.Fatal(err)
		}
		if err := c.Ping(ctx).Err(); err != nil {
			t.Fatalf("the caller's client after a refused Open: %v", err)
		}
		e := openRedis(t, c, prefix, engine.Options{})
		defer e.Close()
		mxMarkAll(t, e, mxKeys("k", 10), engine.New, "after a refused Open")
	})
	t.Run("postgres", func(t *testing.T) {
		table := pgTable(t, pool, "mx_fo")
		if _, err := mxOpen(engine.Options{Backend: pgBackend(pool, table), Clock: mxBadClock}); !errors.Is(err, engine.ErrOptions) {
			t.Fatal(err)
		}
		if err := pool.Ping(ctx); err != nil {
			t.Fatalf("the caller's pool after a refused Open: %v", err)
		}
		e := open(t, engine.Options{Backend: pgBackend(pool, table)})
		defer e.Close()
		mxMarkAll(t, e, mxKeys("k", 10), engine.New, "after a refused Open")
	})
}

// TestMatrixRedisMarkGiveBackRestoresCount: with MaxAttempts on Redis, a key holding the count 1 is marked;
// the mark's commit is applied but its reply lost, and the give-back
// (MarkBatch's releaseAs with giveBack) reaches Redis: it undoes the
// commit and restores the count the claim carried (Request.Attempts), so
// one more failed handler makes the key Poison.
func TestMatrixRedisMarkGiveBackRestoresCount(t *testing.T) {
	srv := redistest.Start(t)
	hook := &mxSeqHook{}
	c := srv.ClientWith(t, &goredis.Options{MaxRetries: -1})
	c.AddHook(hook)
	prefix := fmt.Sprintf("giveback-%d:", time.Now().UnixNano())
	e := openRedis(t, c, prefix, engine.Options{MaxAttempts: 2, Lease: time.Hour})
	defer e.Close()
	ctx := context.Background()
	key := []byte("order-8")
	boom := errors.New("handler failed")
	mxFailedDo(t, e, key, boom, "first")
	var err error
	// The claim passes, the commit's reply is lost, the give-back passes.
	hook.during(func() { _, err = e.MarkIfAbsent(ctx, key) }, faultNone, faultLost)
	if !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("mark whose commit reply is lost = %v, want ErrUnavailable", err)
	}
	if info, err := e.Lookup(ctx, key); err != nil || info.Outcome != engine.New || info.Attempts != 1 {
		t.Fatalf("after the given-back mark: %+v, %v; want New with the count 1 restored", info, err)
	}
	mxFailedDo(t, e, key, boom, "second")
	if out, err := e.Do(ctx, key, func(context.Context) error { return nil }); out != engine.Poison || err != nil {
		t.Fatalf("after two failed handlers = %v, %v; want Poison", out, err)
	}
}

// TestMatrixOneBackendValueManyEngines: a Backend is a description, not a
// connection (tier/backend.go): one value opens several engines, which
// share the tier, and closing one leaves the others (and the caller's
// client) working.
func TestMatrixOneBackendValueManyEngines(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	pool := postgresPool(t)
	for name, b := range map[string]tier.Backend{
		"redis":    redisBackend(c, fmt.Sprintf("one-%d:", time.Now().UnixNano())),
		"postgres": pgBackend(pool, pgTable(t, pool, "mx_one")),
	} {
		t.Run(name, func(t *testing.T) {
			a := open(t, engine.Options{Backend: b})
			bb := open(t, engine.Options{Backend: b})
			defer bb.Close()
			keys := mxKeys(name, 20)
			mxMarkAll(t, a, keys, engine.New, "first engine")
			mxMarkAll(t, bb, keys, engine.Duplicate, "second engine, same Backend value")
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			mxMarkAll(t, bb, mxKeys(name+"-after", 20), engine.New, "second engine after the first closed")
			third := open(t, engine.Options{Backend: b})
			defer third.Close()
			mxMarkAll(t, third, keys, engine.Duplicate, "a third engine of the same value")
		})
	}
}

// TestMatrixHighWaterSurvivesRestart: engine time never runs backwards
// across a restart of a directory (the embedded store persists its
// high-water clock at each partition drop and at Close; bloom-only in its
// state): reopened with the clock 10 h behind, a claim's lease is counted
// from the time the engine had reached, and a key committed inside the
// window stays a Duplicate as the clock catches up, then is New once it
// is older than Window + Partition.
func TestMatrixHighWaterSurvivesRestart(t *testing.T) {
	ctx := context.Background()
	for _, tiers := range []engine.Tiers{engine.Default, engine.BloomOnly} {
		t.Run(tiers.String(), func(t *testing.T) {
			clock := newClock()
			start := clock.Now()
			o := engine.Options{Tiers: tiers, Backend: &embedded.Backend{Dir: "d", FS: vfs.NewMem()}, Window: 4 * time.Hour, Partition: time.Hour, ExpectedKeys: 1000, Clock: clock}
			e := open(t, o)
			if out, err := e.MarkIfAbsent(ctx, []byte("k")); err != nil || out != engine.New {
				t.Fatal(out, err)
			}
			clock.Add(3 * time.Hour)
			reached := clock.Now()
			if out, err := e.MarkIfAbsent(ctx, []byte("later")); err != nil || out != engine.New {
				t.Fatal(out, err)
			}
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			clock.Add(-13 * time.Hour) // 10 h before start
			e = open(t, o)
			defer e.Close()
			c, err := e.Claim(ctx, []byte("leased"))
			if err != nil || c.Outcome != engine.New {
				t.Fatal(c.Outcome, err)
			}
			if c.LeaseUntil < reached.UnixNano() {
				t.Fatalf("lease until %v, before the time the engine had reached (%v): time ran backwards across the restart", time.Unix(0, c.LeaseUntil), reached)
			}
			if err := e.Release(ctx, c); err != nil {
				t.Fatal(err)
			}
			clock.Add(10*time.Hour + 4*time.Hour) // start + 4 h: inside the window of k
			if out, err := e.MarkIfAbsent(ctx, []byte("k")); err != nil || out != engine.Duplicate {
				t.Fatalf("k at start+4h = %v, %v; want Duplicate", out, err)
			}
			clock.Add(2*time.Hour + time.Minute) // past start + Window + Partition
			if out, err := e.MarkIfAbsent(ctx, []byte("k")); err != nil || out != engine.New {
				t.Fatalf("k at %v (committed %v, Window 4h + Partition 1h) = %v, %v; want New", clock.Now().Sub(start), start, out, err)
			}
			if out, err := e.MarkIfAbsent(ctx, []byte("later")); err != nil || out != engine.Duplicate {
				t.Fatalf("later (committed at start+3h) = %v, %v; want Duplicate", out, err)
			}
		})
	}
}
