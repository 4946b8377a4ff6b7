package engine_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
)

// Fault modes of a faultInjector.
const (
	faultNone = iota
	faultDown // the command fails before reaching the server
	faultLost // the command runs on the server, its reply is lost
)

// faultInjector makes the shared tier's commands fail (faultDown) or lose
// their replies after running (faultLost), for commands whose arguments
// contain match ("" matches every command), at most budget times when
// budget is positive.
type faultInjector struct {
	mode    atomic.Int32
	match   atomic.Value // string
	budget  atomic.Int64
	limited atomic.Bool
	skip    atomic.Int64 // matching commands let through before the fault applies
	hits    atomic.Int64
	delay   atomic.Int64 // every command waits this long first (a slow tier)
}

var errInjectedFault = fmt.Errorf("connection reset (injected fault)")

func (f *faultInjector) set(mode int32, match string, budget int64) {
	f.match.Store(match)
	f.budget.Store(budget)
	f.limited.Store(budget > 0)
	f.skip.Store(0)
	f.mode.Store(mode)
}

func (f *faultInjector) off() { f.mode.Store(faultNone) }

func containsArg(v any, m string) bool {
	switch x := v.(type) {
	case string:
		return strings.Contains(x, m)
	case []byte:
		return bytes.Contains(x, []byte(m))
	case []string:
		for _, s := range x {
			if strings.Contains(s, m) {
				return true
			}
		}
	case [][]byte:
		for _, s := range x {
			if bytes.Contains(s, []byte(m)) {
				return true
			}
		}
	case []any:
		for _, s := range x {
			if containsArg(s, m) {
				return true
			}
		}
	}
	return false
}

// hit reports which fault applies to a command with args.
func (f *faultInjector) hit(args []any) int32 {
	if d := f.delay.Load(); d > 0 {
		time.Sleep(time.Duration(d))
	}
	mode := f.mode.Load()
	if mode == faultNone {
		return faultNone
	}
	m, _ := f.match.Load().(string)
	if m != "" && !containsArg(args, m) {
		return faultNone
	}
	if f.skip.Load() > 0 && f.skip.Add(-1) >= 0 {
		return faultNone
	}
	if f.limited.Load() && f.budget.Add(-1) < 0 {
		return faultNone
	}
	f.hits.Add(1)
	return mode
}

func (f *faultInjector) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (f *faultInjector) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		return processFault(ctx, next, cmd, f.hit(cmd.Args()))
	}
}

func (f *faultInjector) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		var args []any
		for _, c := range cmds {
			args = append(args, c.Args()...)
		}
		return pipelineFault(ctx, next, cmds, f.hit(args))
	}
}

// processFault runs a Redis command as mode says: it fails before
// reaching the server (faultDown), runs with its reply lost (faultLost),
// or runs.
func processFault(ctx context.Context, next goredis.ProcessHook, cmd goredis.Cmder, mode int32) error {
	switch mode {
	case faultDown:
		cmd.SetErr(errInjectedFault)
		return errInjectedFault
	case faultLost:
		_ = next(ctx, cmd)
		cmd.SetErr(errInjectedFault)
		return errInjectedFault
	}
	return next(ctx, cmd)
}

// pipelineFault is processFault for a pipeline, its commands together.
func pipelineFault(ctx context.Context, next goredis.ProcessPipelineHook, cmds []goredis.Cmder, mode int32) error {
	switch mode {
	case faultDown:
		for _, c := range cmds {
			c.SetErr(errInjectedFault)
		}
		return errInjectedFault
	case faultLost:
		_ = next(ctx, cmds)
		for _, c := range cmds {
			c.SetErr(errInjectedFault)
		}
		return errInjectedFault
	}
	return next(ctx, cmds)
}

// faultDB is faultInjector for the PostgreSQL tier.
type faultDB struct {
	*pgxpool.Pool
	f *faultInjector
}

func (d faultDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return execFault(ctx, d.Pool, d.f.hit(args), netFault, sql, args)
}

func (d faultDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return queryFault(ctx, d.Pool, d.f.hit(args), netFault, sql, args)
}

// netFault is the error of an injected PostgreSQL fault as the network
// would give it: a dial error for faultDown, a read error for faultLost.
func netFault(mode int32) error {
	op := "dial"
	if mode == faultLost {
		op = "read"
	}
	return &net.OpError{Op: op, Net: "tcp", Err: errInjectedFault}
}

// execFault runs an Exec on p as mode says (see processFault); the
// injected fault's error is faultErr(mode).
func execFault(ctx context.Context, p *pgxpool.Pool, mode int32, faultErr func(int32) error, sql string, args []any) (pgconn.CommandTag, error) {
	switch mode {
	case faultDown:
		return pgconn.CommandTag{}, faultErr(mode)
	case faultLost:
		_, _ = p.Exec(ctx, sql, args...)
		return pgconn.CommandTag{}, faultErr(mode)
	}
	return p.Exec(ctx, sql, args...)
}

// queryFault is execFault for a Query; a lost one is read to its end.
func queryFault(ctx context.Context, p *pgxpool.Pool, mode int32, faultErr func(int32) error, sql string, args []any) (pgx.Rows, error) {
	switch mode {
	case faultDown:
		return nil, faultErr(mode)
	case faultLost:
		if rows, err := p.Query(ctx, sql, args...); err == nil {
			for rows.Next() {
			}
			rows.Close()
		}
		return nil, faultErr(mode)
	}
	return p.Query(ctx, sql, args...)
}

// within fails the test if fn does not return within d (a deadlock).
func within(t *testing.T, d time.Duration, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s did not return within %v (deadlock?)", what, d)
	}
}

// noPanic runs fn and returns the panic it raised, if any.
func noPanic(fn func()) (p any) {
	defer func() { p = recover() }()
	fn()
	return nil
}
