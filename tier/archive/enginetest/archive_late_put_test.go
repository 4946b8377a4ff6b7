package enginetest_test

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/tier"
)

// latePut loses the reply of the first Put of partition target (its
// records captured, the call failed), and lands that Put late: just
// before the next Put of target, which then finds the partition held and
// returns nil without reading its scan, as an archive does for a
// partition it holds. It is what a Put whose commit reached the server
// after the client gave up (Close, a deadline) does to the next process.
type latePut struct {
	mu       sync.Mutex
	target   int64
	captured []tier.Record
	armed    bool
	lost     chan struct{} // closed once the reply was lost; never reassigned
}

type latePutStore struct {
	tier.Archive
	l *latePut
}

func (s latePutStore) Put(ctx context.Context, p int64, scan func(func(*tier.Record) error) error) error {
	l := s.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if p != l.target {
		return s.Archive.Put(ctx, p, scan)
	}
	if l.armed {
		err := scan(func(r *tier.Record) error {
			c := *r
			c.NS, c.Key, c.Result = bytes.Clone(r.NS), bytes.Clone(r.Key), bytes.Clone(r.Result)
			l.captured = append(l.captured, c)
			return nil
		})
		if err != nil {
			return err
		}
		close(l.lost)
		l.armed = false
		return errors.New("reply lost")
	}
	if l.captured != nil {
		recs := l.captured
		l.captured = nil
		if err := s.Archive.Put(ctx, p, func(put func(*tier.Record) error) error {
			for i := range recs {
				if err := put(&recs[i]); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return err
		}
	}
	return s.Archive.Put(ctx, p, scan) // held: nil, the scan unread
}

// TestArchiveLatePutKeepsItsKeys: a partition whose Put landed after the
// process that made it had closed is found held by the next process's Put,
// which reads nothing: the keys must still reach that process's archive
// filter (from the archive), or once the partition leaves the hot window
// they are answered New.
func TestArchiveLatePutKeepsItsKeys(t *testing.T) {
	l := &latePut{armed: true, lost: make(chan struct{})}
	r := newArchiveRun(t, func(fs vfs.FS) tier.ArchiveBackend {
		return wrappedArchive{filesArchive(fs), func(a tier.Archive) tier.Archive { return latePutStore{a, l} }}
	})
	l.mu.Lock()
	l.target = r.start + 2
	l.mu.Unlock()
	for r.days < 4 {
		r.commitDay()
	}
	select {
	case <-l.lost:
	case <-time.After(20 * time.Second):
		t.Fatal("the archiver never tried partition 2")
	}
	if err := r.e.Close(); err != nil { // before the archiver's retry
		t.Fatal(err)
	}
	r.open()
	defer func() { r.e.Close() }()
	for r.days < 12 { // day 2 leaves the hot window
		r.commitDay()
		waitArchived(t, r.e)
	}
	if bad := r.check(); len(bad) > 0 {
		t.Fatalf("%d wrong answers, first: %s", len(bad), bad[0])
	}
}
