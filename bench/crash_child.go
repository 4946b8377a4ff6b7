package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// CrashChild is the consumer of the crash experiment: it reads its offset,
// processes messages in batches of every (each effect appended and fsynced
// to dir/effects, or, for WithLedger, written as a record in the engine's
// commit), commits its offset per the strategy, and, given killAt, prints
// "AT killAt before" before that message (or "AT killAt effect" after its
// effect, with afterEffect) and waits to be killed.
func CrashChild(ctx context.Context, strategy Strategy, dir string, messages, every, killAt int, afterEffect bool) error {
	offsetPath := filepath.Join(dir, "offset")
	effects, err := os.OpenFile(filepath.Join(dir, "effects"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer effects.Close()
	c := &crashConsumer{strategy: strategy, effects: effects, killAt: killAt, afterEffect: afterEffect}
	// For WithLedger's kill inside its commit: the store's files stop at
	// their first sync once armed, say so, and wait for the SIGKILL.
	hook := &syncHook{FS: vfs.Default}
	if strategy == WithEngine || strategy == WithLedger {
		if c.e, err = engine.Open(&engine.Options{Backend: &embedded.Backend{Dir: filepath.Join(dir, "dedup"), FS: hook}, ExpectedKeys: 10_000}); err != nil {
			return err
		}
		defer c.e.Close()
	}
	offset := 0
	if b, err := os.ReadFile(offsetPath); err == nil {
		offset, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	commitOffset := func(o int) error { return writeSynced(offsetPath, strconv.Itoa(o)) }
	for offset < messages {
		end := min(offset+every, messages)
		if strategy == OffsetFirst {
			if err := commitOffset(end); err != nil {
				return err
			}
		}
		for m := offset + 1; m <= end; m++ {
			if err := c.killBefore(ctx, m); err != nil {
				return err
			}
			key := []byte("msg-" + strconv.Itoa(m))
			if strategy == WithLedger {
				err = c.commitLedger(ctx, hook, m, key)
			} else {
				err = c.process(ctx, m, key)
			}
			if err != nil {
				return err
			}
		}
		if strategy != OffsetFirst {
			if err := commitOffset(end); err != nil {
				return err
			}
		}
		offset = end
	}
	return nil
}

// crashConsumer is what a crash consumer (CrashChild, CrashChildKafka)
// needs to handle one message: its strategy, the effects file, the engine
// (WithEngine, and CrashChild's WithLedger) and the kill point.
type crashConsumer struct {
	strategy    Strategy
	effects     *os.File
	e           *engine.Engine
	killAt      int
	afterEffect bool
}

// killBefore waits to be killed when the kill point is just before
// message m.
func (c *crashConsumer) killBefore(ctx context.Context, m int) error {
	if m == c.killAt && !c.afterEffect {
		return waitKill(ctx, m, "before")
	}
	return nil
}

// process applies message m (its key key) as OffsetFirst, ProcessFirst or
// WithEngine does: its effect appended, directly or inside the engine's
// Do, and, when the kill point is after that effect, the wait to be
// killed.
func (c *crashConsumer) process(ctx context.Context, m int, key []byte) error {
	afterThisEffect := func() error {
		if m == c.killAt && c.afterEffect {
			return waitKill(ctx, m, "effect")
		}
		return nil
	}
	switch c.strategy {
	case OffsetFirst, ProcessFirst:
		if err := appendEffect(c.effects, m); err != nil {
			return err
		}
		if err := afterThisEffect(); err != nil {
			return err
		}
	case WithEngine:
		if _, err := c.e.Do(ctx, key, func(context.Context) error {
			if err := appendEffect(c.effects, m); err != nil {
				return err
			}
			return afterThisEffect()
		}); err != nil {
			return err
		}
	}
	return nil
}

// commitLedger applies message m as WithLedger does: when its key claims
// New, its effect is a record written in the commit of its mark; a kill
// after the effect, armed on hook, lands inside that write.
func (c *crashConsumer) commitLedger(ctx context.Context, hook *syncHook, m int, key []byte) error {
	cl, err := c.e.Claim(ctx, key)
	if err != nil {
		return err
	}
	if cl.Outcome != engine.New {
		return nil
	}
	// The effect is the write below, with the mark: the kill
	// lands inside it, at its first sync.
	if m == c.killAt && c.afterEffect {
		hook.arm(func() { _ = waitKill(ctx, m, "effect") })
	}
	record := []engine.Write{{Key: fmt.Appendf(nil, "effect/%d/%d-%d", m, os.Getpid(), m), Value: []byte{1}}}
	return c.e.CommitBatchWith(ctx, []engine.Claim{cl}, nil, record)
}

// appendEffect appends message m's effect to the effects file, synced.
func appendEffect(effects *os.File, m int) error {
	if _, err := fmt.Fprintf(effects, "%d\n", m); err != nil {
		return err
	}
	return effects.Sync()
}

// waitKill says the consumer reached message m in phase and waits for the
// SIGKILL that follows (an error if it does not come within a minute).
func waitKill(ctx context.Context, m int, phase string) error {
	fmt.Println("AT", m, phase)
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Minute):
		return fmt.Errorf("not killed at %d %s", m, phase)
	}
}

// writeSynced replaces the file at path with content, synced, through a
// temporary file renamed over it.
func writeSynced(path, content string) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(content); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// syncHook is a filesystem whose files, once armed, run the hook at their
// first sync (before syncing): where a kill lands inside a durable write.
type syncHook struct {
	vfs.FS
	armed atomic.Pointer[func()]
}

func (h *syncHook) arm(fn func()) { h.armed.Store(&fn) }

func (h *syncHook) fire() {
	if fn := h.armed.Swap(nil); fn != nil {
		(*fn)()
	}
}

func (h *syncHook) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := h.FS.Create(name, c)
	return h.wrap(f, err)
}

func (h *syncHook) ReuseForWrite(oldname, newname string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := h.FS.ReuseForWrite(oldname, newname, c)
	return h.wrap(f, err)
}

func (h *syncHook) OpenReadWrite(name string, c vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := h.FS.OpenReadWrite(name, c, opts...)
	return h.wrap(f, err)
}

func (h *syncHook) wrap(f vfs.File, err error) (vfs.File, error) {
	if err != nil {
		return nil, err
	}
	return hookedFile{File: f, h: h}, nil
}

type hookedFile struct {
	vfs.File
	h *syncHook
}

func (f hookedFile) Sync() error {
	f.h.fire()
	return f.File.Sync()
}

func (f hookedFile) SyncData() error {
	f.h.fire()
	return f.File.SyncData()
}

func (f hookedFile) SyncTo(length int64) (bool, error) {
	f.h.fire()
	return f.File.SyncTo(length)
}
