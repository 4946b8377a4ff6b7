package enginetest

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/crashtest"
	"github.com/tierdedup/tierdedup/tier/postgres/pgtest"
)

// The multi-process race: four OS processes (this test binary re-executed)
// claim the same keys in different orders through one Redis (or one
// PostgreSQL table); exactly one claim per key is New across all of them.

// ProcessesChild is the child of ProcessesRace: register it in the test
// binary's TestMain (crashtest.Main) as ProcessesChildName.
func ProcessesChild(spec string) int {
	parts := strings.Split(spec, "|")
	addr, prefix := parts[0], parts[1]
	id, _ := strconv.Atoi(parts[2])
	n, _ := strconv.Atoi(parts[3])
	o := engine.Options{Logger: Quiet}
	if strings.HasPrefix(addr, "postgres://") { // the PostgreSQL tier; prefix names its table
		p, err := pgxpool.New(context.Background(), addr)
		if err != nil {
			fmt.Println("ERR", err)
			return 1
		}
		defer p.Close()
		o.Backend = PGBackend(p, prefix)
	} else {
		var c goredis.UniversalClient = goredis.NewClient(&goredis.Options{Addr: addr})
		if strings.Contains(addr, ",") { // a cluster's masters
			c = goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: strings.Split(addr, ",")})
		}
		defer c.Close()
		o.Backend = RedisBackend(c, prefix)
	}
	e, err := engine.Open(&o)
	if err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	defer e.Close()
	order := rand.New(rand.NewPCG(uint64(id), 3)).Perm(n)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	for i := 0; i < n; i += 32 {
		idx := order[i:min(i+32, n)]
		keys := make([][]byte, len(idx))
		for j, k := range idx {
			keys[j] = fmt.Appendf(nil, "shared-%d", k)
		}
		claims := make([]engine.Claim, len(keys))
		if err := e.ClaimBatch(context.Background(), keys, nil, claims); err != nil {
			fmt.Fprintln(out, "ERR", err)
			return 1
		}
		for _, cl := range claims {
			if cl.Outcome == engine.New {
				fmt.Fprintln(out, "N", string(cl.Key))
			}
		}
		if id%2 == 0 {
			if err := e.CommitBatch(context.Background(), claims, nil); err != nil {
				fmt.Fprintln(out, "ERR", err)
				return 1
			}
		}
	}
	return 0
}

// ProcessesChildName names ProcessesChild in a test binary's TestMain.
const ProcessesChildName = "processes"

// ProcessesRace runs four OS processes (the test binary re-executed, as
// ProcessesChild) that claim the same keys in different orders through one
// shared tier (addr: a Redis node, a cluster's masters comma-separated, or
// a postgres:// URL), the even ones committing; exactly one claim per key
// must be New across all of them.
func ProcessesRace(t *testing.T, addr string) {
	const procs, keys = 4, 3000
	prefix := fmt.Sprintf("race-%d:", time.Now().UnixNano())
	if strings.HasPrefix(addr, "postgres://") {
		prefix = fmt.Sprintf("race_%d", time.Now().UnixNano())
		p := pgtest.Pool(t)
		t.Cleanup(func() { _, _ = p.Exec(context.Background(), "DROP TABLE IF EXISTS "+prefix) })
	}
	news := map[string]int{}
	var mu sync.Mutex
	children := make([]*crashtest.Child, procs)
	for p := range procs {
		children[p] = crashtest.Start(t, ProcessesChildName, fmt.Sprintf("%s|%s|%d|%d", addr, prefix, p, keys), &crashtest.Options{OnLine: func(line string) {
			kind, key, _ := strings.Cut(line, " ")
			mu.Lock()
			defer mu.Unlock()
			switch kind {
			case "N":
				news[key]++
			case "ERR":
				t.Errorf("process %d: %s", p, key)
			}
		}})
	}
	for p, c := range children {
		if err := c.Wait(); err != nil {
			t.Errorf("process %d: %v\n%s", p, err, c.Describe())
		}
	}
	for i := range keys {
		if n := news[fmt.Sprintf("shared-%d", i)]; n != 1 {
			t.Fatalf("shared-%d was New in %d processes", i, n)
		}
	}
}
