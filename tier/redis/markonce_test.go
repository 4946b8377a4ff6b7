package redis

import (
	"context"
	"testing"

	goredis "github.com/redis/go-redis/v9"
)

// TestMarkOnceIsNotRetried: a mark's command, as the pipeline receives it,
// tells go-redis not to send it again (a copy applied after a Forget and
// another process's mark would answer for a state the first changed), and
// passing it as a Cmder allocates nothing.
func TestMarkOnceIsNotRetried(t *testing.T) {
	cmd := goredis.NewStatusCmd(context.Background(), "set", "k", "v", "px", 1, "nx", "get")
	if cmd.NoRetry() {
		t.Fatal("a plain SET says NoRetry: the test would show nothing")
	}
	var c goredis.Cmder = markOnce{cmd}
	if !c.NoRetry() {
		t.Fatal("markOnce is retried")
	}
	if n := testing.AllocsPerRun(100, func() { c = markOnce{cmd} }); n != 0 {
		t.Fatalf("markOnce as a Cmder: %v allocations", n)
	}
	_ = c
}
