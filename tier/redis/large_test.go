package redis_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/backendtest"
	"github.com/tierdedup/tierdedup/tier/redis"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// TestLargeResultsCommit: a commit group of large results (here 40 of
// 4 MiB, MaxResultSize's largest: the commit queue can group several
// callers' commits) is sent in script calls of at most 16 MiB of
// arguments each, and every result is stored and answered whole, under a
// server whose query buffer is limited to 64 MiB. (Redis 7.0 took the
// 160 MiB call of the code before the bound too: it reads each large
// argument on its own; the bound keeps a single command's size, and the
// time it holds the server, independent of the group.)
func TestLargeResultsCommit(t *testing.T) {
	srv := redistest.Start(t, "--client-query-buffer-limit", "64mb")
	o := engine.Options{Window: time.Hour, Partition: 10 * time.Minute, MaxResultSize: engine.MaxResultSize, Logger: quietEngine}
	o.Backend = redis.NewBackend(srv.Client(t), redis.Config{Prefix: fmt.Sprintf("large-%d:", time.Now().UnixNano())})
	e, err := engine.Open(&o)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	backendtest.LargeResults(t, e)
}
