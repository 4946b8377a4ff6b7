package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/cockroachdb/pebble/v2"
	pebblebloom "github.com/cockroachdb/pebble/v2/bloom"
	tpebble "github.com/tierdedup/tierdedup/tier/pebble"
)

// PebbleBaseline is the embedded store's own write path with nothing of
// the engine around it: Pebble configured as the embedded store configures
// its hot database (its memtable size, a 64 MiB block cache, 10 bits a key
// of table filter), each call's keys one synced Pebble batch, called from
// as many goroutines as the engine's run. It is what the default
// configuration's MarkBatch is measured against (`dedupbench compare`):
// the engine adds the memory tier, the filters, the partitions and the
// answers for every key on top of these writes.
//
// With Read, each key is first read (Get) and only the absent ones are
// written: the dedup table on Pebble that the default configuration
// replaces, exact but without expiry. Without it, every key is written
// blind, and fresh is set for every key: the floor under any durable
// mark, not a dedup table. Keys are written as given, each with its
// arrival time (8 bytes) as the value.
type PebbleBaseline struct {
	db    *pebble.DB
	cache *pebble.Cache
	dir   string // removed at Close when the baseline made it
	read  bool
	sync  *pebble.WriteOptions
}

// PebbleBaselineOptions configure a PebbleBaseline.
type PebbleBaselineOptions struct {
	// Dir is the database's directory; empty means a temporary one,
	// removed at Close.
	Dir string
	// Read reads each key before writing it, and writes only the absent.
	Read bool
	// NoSync commits without fsync, as embedded.Backend.NoSync does.
	NoSync bool
	// CacheSize is the block cache in bytes; zero means 64 MiB, the
	// embedded store's default.
	CacheSize int64
}

// OpenPebbleBaseline opens a PebbleBaseline.
func OpenPebbleBaseline(o PebbleBaselineOptions) (*PebbleBaseline, error) {
	dir, made := o.Dir, ""
	if dir == "" {
		d, err := os.MkdirTemp("", "dedupbench-pebble-")
		if err != nil {
			return nil, err
		}
		dir, made = d, d
	}
	if o.CacheSize <= 0 {
		o.CacheSize = 64 << 20
	}
	cache := pebble.NewCache(o.CacheSize)
	po := &pebble.Options{Cache: cache, MemTableSize: tpebble.DefaultMemTableSize, Logger: quietPebble{}}
	for i := range po.Levels {
		po.Levels[i].FilterPolicy = pebblebloom.FilterPolicy(10)
	}
	db, err := pebble.Open(dir, po)
	if err != nil {
		cache.Unref()
		if made != "" {
			os.RemoveAll(made)
		}
		return nil, err
	}
	sync := pebble.Sync
	if o.NoSync {
		sync = pebble.NoSync
	}
	return &PebbleBaseline{db: db, cache: cache, dir: made, read: o.Read, sync: sync}, nil
}

// Mark writes keys as one synced batch (with Read, only those absent; with
// NoSync, not synced) and
// sets fresh[i] for each key written.
func (p *PebbleBaseline) Mark(_ context.Context, keys [][]byte, fresh []bool) error {
	b := p.db.NewBatch()
	defer b.Close()
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], uint64(time.Now().UnixNano()))
	for i, k := range keys {
		if p.read {
			_, closer, err := p.db.Get(k)
			switch {
			case err == nil:
				closer.Close()
				fresh[i] = false
				continue
			case !errors.Is(err, pebble.ErrNotFound):
				return err
			}
		}
		if err := b.Set(k, v[:], nil); err != nil {
			return err
		}
		fresh[i] = true
	}
	return b.Commit(p.sync)
}

// Close closes the database and removes the directory it made.
func (p *PebbleBaseline) Close() {
	_ = p.db.Close()
	p.cache.Unref()
	if p.dir != "" {
		_ = os.RemoveAll(p.dir)
	}
}

// quietPebble keeps Pebble's informational logging out of the output.
type quietPebble struct{}

func (quietPebble) Infof(string, ...any)  {}
func (quietPebble) Errorf(string, ...any) {}
func (quietPebble) Fatalf(f string, args ...any) {
	panic(fmt.Sprintf("pebble: "+f, args...)) // Pebble does not go on after Fatalf
}
