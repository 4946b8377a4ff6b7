package enginetest

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// CrashChild (spec "dir|round|mode") is the child of the crash tests: it
// runs round r over dir until killed: each batch mixes fresh keys
// with keys of earlier rounds, acknowledged or not. In the async mode each
// New key is committed alone with CommitBatchAsync, with a ledger record
// of its own in the same write, and acknowledged when its done runs.
func CrashChild(spec string) int {
	parts := strings.Split(spec, "|")
	dir, mode := parts[0], parts[2]
	r, _ := strconv.Atoi(parts[1])
	e, err := engine.Open(&engine.Options{Backend: embedded.Dir(dir), ExpectedKeys: 100_000})
	if err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	var mu sync.Mutex // stdout is shared with the dones
	out := bufio.NewWriter(os.Stdout)
	rng := rand.New(rand.NewPCG(uint64(r), 7))
	ctx := context.Background()
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	for i := 0; ; i++ {
		select {
		case <-term:
			err := e.Close() // runs every pending done first
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				fmt.Fprintln(out, "ERR", err)
				out.Flush()
				return 1
			}
			fmt.Fprintln(out, "CLOSED")
			out.Flush()
			return 0
		default:
		}
		n := 1 + rng.IntN(64)
		keys := make([][]byte, n)
		for j := range keys {
			if r > 0 && rng.IntN(3) == 0 {
				keys[j] = fmt.Appendf(nil, "r%d-%d", rng.IntN(r), rng.IntN(2000))
			} else {
				keys[j] = fmt.Appendf(nil, "r%d-%d", r, i*64+j)
			}
		}
		claims := make([]engine.Claim, n)
		if err := e.ClaimBatch(ctx, keys, nil, claims); err != nil {
			fmt.Fprintln(out, "ERR", err)
			out.Flush()
			return 1
		}
		mu.Lock()
		for _, c := range claims {
			if c.Outcome == engine.New {
				fmt.Fprintln(out, "N", string(c.Key))
			}
		}
		out.Flush()
		mu.Unlock()
		if mode == "async" {
			for _, c := range claims {
				if c.Outcome != engine.New {
					continue
				}
				key := string(c.Key)
				ledger := []engine.Write{{Key: []byte("ledger/" + key), Value: []byte{1}}}
				e.CommitBatchAsync(ctx, []engine.Claim{c}, ledger, func(err error) {
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						fmt.Fprintln(out, "ERR", err)
					} else {
						fmt.Fprintln(out, "A", key)
					}
					out.Flush()
				})
			}
			continue
		}
		if err := e.CommitBatch(ctx, claims, nil); err != nil {
			fmt.Fprintln(out, "ERR", err)
			out.Flush()
			return 1
		}
		mu.Lock()
		for _, c := range claims {
			if c.Outcome == engine.New {
				fmt.Fprintln(out, "A", string(c.Key))
			}
		}
		out.Flush()
		mu.Unlock()
	}
}
