package pebble

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/internal/crashtest"
	"github.com/tierdedup/tierdedup/internal/faultfs"
	"github.com/tierdedup/tierdedup/tier"
)

var quiet = log.New(io.Discard, "", 0)

// TestMain sends a child process (this test binary, re-executed by
// crashtest.Start) to its code.
func TestMain(m *testing.M) {
	crashtest.Main(m, map[string]func(spec string) int{
		"lock": lockChild, // TestOpenRefusedWhileAnotherProcessHoldsTheDirectory
	})
}

func open(t testing.TB, o Options) *Store {
	t.Helper()
	if o.Logger == nil {
		o.Logger = quiet
	}
	if o.Partition == 0 {
		o.Partition, o.Window = time.Hour, 4*time.Hour
	}
	s, err := Open(&o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestEncodingGolden freezes the on-disk key and value formats: changing
// them silently would make every existing store unreadable.
func TestEncodingGolden(t *testing.T) {
	k := appendRecordKey(nil, 20423, "orders", []byte("order:42"))
	if got, want := hex.EncodeToString(k), "0100004fc7066f72646572736f726465723a3432"; got != want {
		t.Errorf("record key = %s, want %s", got, want)
	}
	d := Digest{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	tests := []struct {
		v    Value
		want string
	}{
		{Value{State: StateCommitted}, "010200"},
		{Value{State: StateCommitted, Digest: d}, "0102010102030405060708090a0b0c0d0e0f10"},
		{Value{State: StateClaimed, LeaseUntil: 1764460800000000000, Token: 0xabcdef}, "01010000001ac4bf9f7c18efcdab0000000000"},
		{Value{State: StateReleased, Attempts: 0x0203}, "0103000302"},
		{Value{State: StateCommitted, Result: []byte("ok"), At: 0x0102}, "01020602010000000000006f6b"},
		{Value{State: StateCommitted, Digest: d, Result: []byte{7}, At: 1}, "0102070102030405060708090a0b0c0d0e0f10010000000000000007"},
		{Value{State: StateCommitted, At: 0x0102}, "0102020201000000000000"},
	}
	for _, tt := range tests {
		got := appendValue(nil, tt.v)
		if hex.EncodeToString(got) != tt.want {
			t.Errorf("value %+v = %x, want %s", tt.v, got, tt.want)
		}
		back, err := decodeValue(got)
		if err != nil || !reflect.DeepEqual(back, tt.v) {
			t.Errorf("decode(%x) = %+v, %v", got, back, err)
		}
	}
}

func FuzzDecodeValue(f *testing.F) {
	f.Add(appendValue(nil, Value{State: StateCommitted}))
	f.Add(appendValue(nil, Value{State: StateClaimed, Token: 9, Digest: Digest{1}}))
	f.Add([]byte{1, 2, 1})
	f.Add(appendValue(nil, Value{State: StateReleased, Attempts: 7}))
	f.Add(appendValue(nil, Value{State: StateCommitted, Digest: Digest{2}, Result: []byte("{}"), At: 5}))
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := decodeValue(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if again := appendValue(nil, v); !bytes.Equal(again, b) {
			t.Fatalf("decode is not the inverse of encode: %x -> %+v -> %x", b, v, again)
		}
	})
}

func FuzzParseRecordKey(f *testing.F) {
	f.Add(appendRecordKey(nil, 3, "ns", []byte("k")))
	f.Add([]byte{1, 0, 0, 0, 0, 9})
	f.Fuzz(func(t *testing.T, b []byte) {
		part, ns, key, err := parseRecordKey(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if again := appendRecordKey(nil, part, string(ns), key); !bytes.Equal(again, b) {
			t.Fatalf("parse is not the inverse of append: %x", b)
		}
	})
}

func TestSecondOpenIsRefused(t *testing.T) {
	dir := t.TempDir()
	s := open(t, Options{Dir: dir})
	defer s.Close()
	_, err := Open(&Options{Dir: dir, Logger: quiet, Partition: time.Hour, Window: 4 * time.Hour})
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open: %v, want ErrLocked", err)
	}
	if !strings.Contains(err.Error(), dir) {
		t.Errorf("error %q does not name the directory", err)
	}
}

func TestOptionsValidate(t *testing.T) {
	err := (&Options{MemTableSize: -1, CacheSize: -1, Partition: time.Hour, Window: time.Hour}).Validate()
	for _, want := range []string{"Dir", "MemTableSize", "CacheSize"} {
		if !errors.Is(err, ErrOptions) || !strings.Contains(err.Error(), want) {
			t.Errorf("err %v does not report %s", err, want)
		}
	}
}

func lookup(t *testing.T, s *Store, ns, key string, oldest int64, mask uint64) tier.Answer {
	t.Helper()
	out := make([]tier.Answer, 1)
	if err := s.Claim(context.Background(), []tier.Request{{NS: ns, Key: []byte(key), Oldest: oldest, Mask: mask}}, 0, out); err != nil {
		t.Fatal(err)
	}
	return out[0]
}

func TestWriteLookupDropReopen(t *testing.T) {
	dir := t.TempDir()
	s := open(t, Options{Dir: dir})
	recs := []Record{
		{Partition: 10, Key: []byte("a"), Value: Value{State: StateCommitted}},
		{Partition: 11, NS: "biz", Key: []byte("a"), Value: Value{State: StateCommitted, Digest: Digest{7}}},
		{Partition: 12, Key: []byte("claimed"), Value: Value{State: StateClaimed, LeaseUntil: 120, Token: 3}},
	}
	if err := s.write(recs); err != nil {
		t.Fatal(err)
	}
	if h := lookup(t, s, "", "a", 10, 0b111); h.Status != tier.Committed || h.Partition != 10 {
		t.Errorf("a = %+v", h)
	}
	if h := lookup(t, s, "", "a", 10, 0b110); h.Status != tier.Absent {
		t.Errorf("a found outside the partitions asked: %+v", h)
	}
	if h := lookup(t, s, "biz", "a", 10, 0b111); h.Status != tier.Committed || h.Digest != (Digest{7}) {
		t.Errorf("biz/a = %+v", h)
	}
	if h := lookup(t, s, "", "ab", 10, 0b111); h.Status != tier.Absent {
		t.Errorf("a prefix of a stored key was found: %+v", h)
	}
	if h := lookup(t, s, "", "claimed", 10, 0b111); h.Status != tier.Absent {
		t.Errorf("a stored claim counts as committed: %+v", h)
	}
	if err := s.Drop(11, 12345); err != nil {
		t.Fatal(err)
	}
	if h := lookup(t, s, "", "a", 10, 0b111); h.Status != tier.Absent {
		t.Errorf("a survived the drop of its partition")
	}
	if h := lookup(t, s, "biz", "a", 10, 0b111); h.Status != tier.Committed {
		t.Errorf("biz/a (partition 11) was dropped early")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := s.write(recs); !errors.Is(err, ErrClosed) {
		t.Fatalf("Write after Close: %v", err)
	}
	s = open(t, Options{Dir: dir})
	defer s.Close()
	if hw, err := s.HighWater(); err != nil || hw != 12345 {
		t.Fatalf("HighWater = %d, %v", hw, err)
	}
	if h := lookup(t, s, "biz", "a", 10, 0b111); h.Status != tier.Committed {
		t.Errorf("biz/a lost across reopen")
	}
	var seen []string
	if err := s.Scan(context.Background(), 0, MaxPartition+1, func(p int64, ns, key []byte) error {
		seen = append(seen, fmt.Sprintf("%d/%s/%s", p, ns, key))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(seen, ","); got != "11/biz/a,12//claimed" {
		t.Errorf("Scan = %s", got)
	}
}

// TestDroppedPartitionLeavesDisk writes a partition large enough to reach
// SSTs, drops it and checks that compaction returns its bytes.
func TestDroppedPartitionLeavesDisk(t *testing.T) {
	s := open(t, Options{Dir: t.TempDir(), MemTableSize: 4 << 20})
	defer s.Close()
	const n = 200_000
	writeFlushed(t, s, 1, n)
	if err := s.Compact(context.Background()); err != nil {
		t.Fatal(err)
	}
	full := sstBytes(s)
	if err := s.Drop(2, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.Compact(context.Background()); err != nil {
		t.Fatal(err)
	}
	after := sstBytes(s)
	t.Logf("SST bytes: %d with partition 1, %d after dropping it", full, after)
	if full < n*5 || after > full/100 {
		t.Fatalf("SST bytes %d -> %d: the dropped partition is still on disk", full, after)
	}
}

func sstBytes(s *Store) int64 { return int64(s.Disk().Tables) }

// writeFlushed writes n committed records into partition p, a thousand a
// batch, and flushes them to a table.
func writeFlushed(t *testing.T, s *Store, p int64, n int) {
	t.Helper()
	recs := make([]Record, 0, 1000)
	for i := 0; i < n; i++ {
		recs = append(recs, Record{Partition: p, Key: fmt.Appendf(nil, "%08d-6ba7b810-9dad-11d1-80b4", i), Value: Value{State: StateCommitted}})
		if len(recs) == cap(recs) {
			if err := s.write(recs); err != nil {
				t.Fatal(err)
			}
			recs = recs[:0]
		}
	}
	if err := s.flush(); err != nil {
		t.Fatal(err)
	}
}

// TestCompactLeavesNoTrimmedJournal: the journal entries a filter
// checkpoint trimmed leave the tables at Compact, as dropped partitions
// do, so a measurement after Compact counts only what the store holds
// (with the records' keyspace alone compacted, 200,000 keys' journal,
// 3.2 MB of fingerprints in tables of their own, stayed until one of
// Pebble's own compactions reached it, beside 1.1 MB of records).
func TestCompactLeavesNoTrimmedJournal(t *testing.T) {
	s := open(t, Options{Dir: t.TempDir(), MemTableSize: 4 << 20, Journal: true})
	defer s.Close()
	const n = 200_000
	writeFlushed(t, s, 1, n)
	journal := func() uint64 {
		u, err := s.db.EstimateDiskUsage([]byte{spaceJournal}, []byte{spaceJournal + 1})
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	// Compacted once before the checkpoint, the journal lies in tables of
	// its own at the bottom level, apart from the records' tables.
	if err := s.Compact(context.Background()); err != nil {
		t.Fatal(err)
	}
	written := journal()
	if err := s.SaveFilterCheckpoint(FilterCheckpoint{Gen: s.NextJournalGen(), Current: 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.Compact(context.Background()); err != nil {
		t.Fatal(err)
	}
	left, tables := journal(), sstBytes(s)
	t.Logf("journal %d bytes written, %d after the checkpoint and Compact; tables %d bytes", written, left, tables)
	if written < n*16 || left > written/100 || tables > int64(written) {
		t.Fatalf("journal %d -> %d bytes, tables %d after Compact: the trimmed journal is still on disk", written, left, tables)
	}
}

// TestWriteFailureIsTypedAndSticky injects a WAL sync failure: the write
// must fail with ErrStorage (not exit), later writes must be refused, and
// the records acknowledged before must survive a reopen.
func TestWriteFailureIsTypedAndSticky(t *testing.T) {
	for name, wal := range map[string]faultfs.Match{"sync": faultfs.WALSyncs, "write": faultfs.WALWrites} {
		t.Run(name, func(t *testing.T) {
			mem := vfs.NewMem()
			var fault faultfs.Fault
			s := open(t, Options{Dir: "db", FS: faultfs.Wrap(mem, &fault)})
			ok := Record{Partition: 1, Key: []byte("acked"), Value: Value{State: StateCommitted}}
			if err := s.write([]Record{ok}); err != nil {
				t.Fatal(err)
			}
			fault.Arm(wal)
			err := s.write([]Record{{Partition: 1, Key: []byte("lost"), Value: Value{State: StateCommitted}}})
			if !errors.Is(err, ErrStorage) {
				t.Fatalf("Write under a failing WAL = %v, want ErrStorage", err)
			}
			fault.Disarm()
			if err := s.write([]Record{ok}); !errors.Is(err, ErrStorage) {
				t.Fatalf("Write after a failure = %v, want ErrStorage (the store must stay failed)", err)
			}
			if s.Broken() == nil {
				t.Fatal("Broken() is nil after a failure")
			}
			_ = s.Close()
			// A new process would open the same files; the lock belongs to
			// the abandoned handle, so reopen from a copy of the filesystem.
			s2 := open(t, Options{Dir: "db", FS: cloneMem(t, mem)})
			defer s2.Close()
			if h := lookup(t, s2, "", "acked", 1, 1); h.Status != tier.Committed {
				t.Fatal("an acknowledged record is missing after the failure")
			}
		})
	}
}

func cloneMem(t *testing.T, src *vfs.MemFS) vfs.FS {
	t.Helper()
	dst := vfs.NewMem()
	if _, err := vfs.Clone(src, dst, "db", "db"); err != nil {
		t.Fatal(err)
	}
	_ = dst.Remove(filepath.Join("db", "LOCK"))
	return dst
}

// TestOpenRefusedWhileAnotherProcessHoldsTheDirectory runs a child process
// (this test binary) that opens the directory, and checks that this process
// cannot open it too.
func TestOpenRefusedWhileAnotherProcessHoldsTheDirectory(t *testing.T) {
	dir := t.TempDir()
	child := crashtest.Start(t, "lock", dir, nil) // killed when the test ends
	if line, ok := child.Next(); !ok || line != "open" {
		t.Fatalf("child did not open the directory: %q\n%s", line, child.Describe())
	}
	if _, err := Open(&Options{Dir: dir, Logger: quiet, Partition: time.Hour, Window: 4 * time.Hour}); !errors.Is(err, ErrLocked) {
		t.Fatalf("Open while another process holds the directory: %v, want ErrLocked", err)
	}
}

// lockChild opens the store in dir and holds it until killed; it exits 3
// if it cannot open it.
func lockChild(dir string) int {
	if _, err := Open(&Options{Dir: dir, Logger: quiet, Partition: time.Hour, Window: 4 * time.Hour}); err != nil {
		return 3
	}
	fmt.Println("open")
	for {
		time.Sleep(time.Hour)
	}
}

// TestLayoutGolden freezes the layout record's encoding.
func TestLayoutGolden(t *testing.T) {
	l := Layout{Partition: time.Hour, Window: 7 * 24 * time.Hour, Secret: [16]byte{1, 2, 3}, ID: [16]byte{0xaa, 0xbb}, version: FormatVersion}
	got := hex.EncodeToString(appendLayout(nil, l))
	const want = "03000000" + "00a0b83046030000" + "000029f90f260200" + "01020300000000000000000000000000" + "aabb0000000000000000000000000000"
	if got != want {
		t.Fatalf("layout encoding\n got %s\nwant %s", got, want)
	}
	if back, err := decodeLayout(appendLayout(nil, l)); err != nil || back != l {
		t.Fatalf("decode = %+v, %v", back, err)
	}
	for _, bad := range [][]byte{nil, {2, 0, 0, 0}, append(appendLayout(nil, l), 0)} {
		if _, err := decodeLayout(bad); !errors.Is(err, ErrCorrupt) {
			t.Errorf("decode of %d bytes: %v, want ErrCorrupt", len(bad), err)
		}
	}
	for _, v := range []byte{0, FormatVersion + 1} {
		if _, err := decodeLayout([]byte{v, 0, 0, 0}); !errors.Is(err, ErrLayout) {
			t.Errorf("decode of version %d: %v, want ErrLayout", v, err)
		}
	}
}

// TestLayoutVersion1IsUpgraded: a store whose layout records format
// version 1 (values without times or results) opens, reads its records
// unchanged, and records version 2 before anything is written, so a
// binary of version 1 refuses it from then on.
func TestLayoutVersion1IsUpgraded(t *testing.T) {
	fs := vfs.NewMem()
	o := &Options{Dir: "db", FS: fs, Logger: quiet, Partition: time.Hour, Window: 4 * time.Hour}
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	p := time.Now().UnixNano() / int64(time.Hour)
	if err := s.Commit(context.Background(), p, []tier.Request{{NS: "n", Key: []byte("old"), Digest: Digest{7}}}, nil); err != nil {
		t.Fatal(err)
	}
	v1 := appendLayout(nil, s.Layout())
	v1[0] = 1
	if err := s.db.Set(keyLayout, v1, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(o); err != nil {
		t.Fatalf("open of a version 1 store: %v", err)
	}
	defer s.Close()
	raw, closer, err := s.db.Get(keyLayout)
	if err != nil {
		t.Fatal(err)
	}
	if raw[0] != FormatVersion {
		t.Fatalf("layout still records version %d", raw[0])
	}
	closer.Close()
	out := make([]tier.Answer, 1)
	if err := s.Claim(context.Background(), []tier.Request{{NS: "n", Key: []byte("old"), Oldest: p, Mask: 1}}, 0, out); err != nil || out[0].Status != tier.Committed || out[0].Digest != (Digest{7}) {
		t.Fatalf("a version 1 record after the upgrade: %+v, %v", out[0], err)
	}
}

// TestLayoutIsRecordedAndEnforced: a store keeps the partition length,
// window, secret and ID it was created with; a different partition length
// or a shorter window is refused naming the field; a longer window is
// accepted and recorded.
func TestLayoutIsRecordedAndEnforced(t *testing.T) {
	dir := t.TempDir()
	s := open(t, Options{Dir: dir, Partition: time.Hour, Window: 4 * time.Hour})
	first := s.Layout()
	if first.Secret == ([16]byte{}) || first.ID == ([16]byte{}) || first.Partition != time.Hour || first.Window != 4*time.Hour {
		t.Fatalf("new store's layout: %+v", first)
	}
	_ = s.Close()
	for _, tt := range []struct {
		partition, window time.Duration
		field             string
	}{
		{30 * time.Minute, 4 * time.Hour, "Partition"},
		{2 * time.Hour, 4 * time.Hour, "Partition"},
		{time.Hour, 3 * time.Hour, "Window"},
	} {
		_, err := Open(&Options{Dir: dir, Logger: quiet, Partition: tt.partition, Window: tt.window})
		var le *LayoutError
		if !errors.Is(err, ErrLayout) || !errors.As(err, &le) || le.Field != tt.field {
			t.Fatalf("Open with partition %v window %v: %v, want a LayoutError on %s", tt.partition, tt.window, err, tt.field)
		}
	}
	s = open(t, Options{Dir: dir, Partition: time.Hour, Window: 8 * time.Hour})
	if l := s.Layout(); l.Window != 8*time.Hour || l.Secret != first.Secret || l.ID != first.ID {
		t.Fatalf("after lengthening the window: %+v", l)
	}
	_ = s.Close()
	if _, err := Open(&Options{Dir: dir, Logger: quiet, Partition: time.Hour, Window: 4 * time.Hour}); !errors.Is(err, ErrLayout) {
		t.Fatalf("the lengthened window was not recorded: %v", err)
	}
}

// TestSnapshotEpochIsTakenOnce: an epoch sealed at close is returned by the
// next TakeSnapshotEpoch only, and never again.
func TestSnapshotEpochIsTakenOnce(t *testing.T) {
	dir := t.TempDir()
	s := open(t, Options{Dir: dir})
	if e, err := s.TakeSnapshotEpoch(); err != nil || e != 0 {
		t.Fatalf("new store epoch = %d, %v", e, err)
	}
	sealed, err := s.SealSnapshot()
	if err != nil || sealed == 0 {
		t.Fatal(sealed, err)
	}
	_ = s.Close()
	s = open(t, Options{Dir: dir})
	if e, err := s.TakeSnapshotEpoch(); err != nil || e != sealed {
		t.Fatalf("epoch after reopen = %d, %v; want %d", e, err, sealed)
	}
	_ = s.Close()
	s = open(t, Options{Dir: dir})
	defer s.Close()
	if e, err := s.TakeSnapshotEpoch(); err != nil || e != 0 {
		t.Fatalf("epoch taken twice: %d, %v", e, err)
	}
}

// TestExactContract drives the Store through tier.Exact and its optional
// interfaces: a commit is read back Committed with its digest and
// partition, a release with an attempt count Released, a give-back and a
// release without a count write nothing, and writes made with a commit
// are scanned back.
func TestExactContract(t *testing.T) {
	ctx := context.Background()
	s := open(t, Options{Dir: t.TempDir()})
	defer s.Close()
	var x tier.Exact = s
	if x.Claims() != tier.ClaimsInEngine {
		t.Fatalf("claims live in %v", x.Claims())
	}
	reqs := []tier.Request{{Key: []byte("c"), Digest: Digest{9}}, {Key: []byte("r"), Attempts: 2}, {Key: []byte("g"), Attempts: 5}, {Key: []byte("z")}}
	st := make([]tier.Status, 1)
	if err := s.CommitWith(ctx, 3, reqs[:1], []tier.Write{{Key: []byte("off/0"), Value: []byte("42")}}, st); err != nil || st[0] != tier.OK {
		t.Fatal(st, err)
	}
	st = make([]tier.Status, 3)
	if err := x.Release(ctx, 4, reqs[2:3], true, st[:1]); err != nil || st[0] != tier.OK {
		t.Fatal(st, err)
	}
	if err := x.Release(ctx, 4, reqs[1:2], false, st[:1]); err != nil {
		t.Fatal(err)
	}
	// A zero count is written too: an engine restoring the count a durable
	// claim raised (Options.DurableClaims) shadows the older record.
	if err := x.Release(ctx, 3, []tier.Request{{Key: reqs[3].Key, Attempts: 1}}, false, st[:1]); err != nil {
		t.Fatal(err)
	}
	if err := x.Release(ctx, 4, reqs[3:], false, st[:1]); err != nil {
		t.Fatal(err)
	}
	out := make([]tier.Answer, len(reqs))
	for i := range reqs {
		reqs[i].Oldest, reqs[i].Mask = 0, 1<<3|1<<4
	}
	if err := x.Claim(ctx, reqs, 0, out); err != nil {
		t.Fatal(err)
	}
	want := []tier.Answer{
		{Status: tier.Committed, Digest: Digest{9}, Partition: 3},
		{Status: tier.Released, Attempts: 2, Partition: 4},
		{Status: tier.Absent, Partition: -1},
		{Status: tier.Released, Attempts: 0, Partition: 4},
	}
	for i := range want {
		if !reflect.DeepEqual(out[i], want[i]) {
			t.Errorf("%s: %+v, want %+v", reqs[i].Key, out[i], want[i])
		}
	}
	var got []string
	if err := s.ScanWrites([]byte("off/"), func(k, v []byte) error { got = append(got, string(k)+"="+string(v)); return nil }); err != nil || len(got) != 1 || got[0] != "off/0=42" {
		t.Fatalf("writes %v, %v", got, err)
	}
}

// TestCancelledCompactionIsNotLogged: a flush or compaction that an Excise
// cancelled (Pebble retries it) is routine and stays out of the Logger;
// every other background error is logged.
func TestCancelledCompactionIsNotLogged(t *testing.T) {
	var buf bytes.Buffer
	ev := logger{log.New(&buf, "", 0)}.events()
	ev.BackgroundError(fmt.Errorf("flush: %w", pebble.ErrCancelledCompaction))
	if buf.Len() != 0 {
		t.Fatalf("a cancelled compaction was logged: %q", buf.String())
	}
	ev.BackgroundError(errors.New("disk on fire"))
	if !strings.Contains(buf.String(), "background error: disk on fire") {
		t.Fatalf("a background error was not logged: %q", buf.String())
	}
}

// TestCompactCallerGivesUp runs the background loop's compaction of a
// partition with a context that has already ended, as Close leaves it,
// while the partition is still in the memtable and the flush that
// compaction starts is held writing its table. Pebble's Compact is never
// handed the ended context (Pebble panics in a background goroutine when a
// queued manual compaction's context ends at the wrong moment), so the
// compaction waits for its flush, still runs, and Close waits for it:
// after a reopen the partition is in the last level and not in L0, where
// its flush put it. Compact with an ended context returns that context's
// error, not ErrStorage.
func TestCompactCallerGivesUp(t *testing.T) {
	dir := t.TempDir()
	gate := faultfs.NewGate(faultfs.Match{Kinds: faultfs.Writes, Suffix: ".sst"})
	s := open(t, Options{Dir: dir, FS: faultfs.Wrap(vfs.Default, gate)})
	recs := make([]Record, 0, 1000)
	for i := 0; i < cap(recs); i++ {
		recs = append(recs, Record{Partition: 5, Key: fmt.Appendf(nil, "%08d", i), Value: Value{State: StateCommitted}})
	}
	if err := s.write(recs); err != nil {
		t.Fatal(err)
	}
	gate.Shut()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s.compact(ctx, compaction{s.db, recordPrefix(5), recordPrefix(6)})
	waitFor(t, "the compaction's flush", func() bool { return gate.Waited() > 0 })
	gate.Open()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, Options{Dir: dir})
	defer s.Close()
	if l0, last := tables(t, s, 0, 5), tables(t, s, 6, 5); l0 != 0 || last == 0 {
		t.Fatalf("partition 5 in %d tables of L0 and %d of L6 after Close: the compaction the loop gave up on did not run", l0, last)
	}
	if err := s.Compact(ctx); !errors.Is(err, context.Canceled) || errors.Is(err, ErrStorage) {
		t.Fatalf("Compact with an ended context = %v, want context.Canceled alone", err)
	}
}

// tables counts the hot database's tables in level holding keys of
// partition.
func tables(t *testing.T, s *Store, level int, partition int64) int {
	t.Helper()
	levels, err := s.db.SSTables()
	if err != nil {
		t.Fatal(err)
	}
	lo, hi := recordPrefix(partition), recordPrefix(partition+1)
	n := 0
	for _, tb := range levels[level] {
		if bytes.Compare(tb.Smallest.UserKey, hi) < 0 && bytes.Compare(tb.Largest.UserKey, lo) >= 0 {
			n++
		}
	}
	return n
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
	}
}

// TestCompactAsCloseBegins: a background compaction the loop starts just
// as Close begins (the store closed, its loop's context not yet
// cancelled) finds the store closed; that is no storage failure, and
// Close then closes the databases.
func TestCompactAsCloseBegins(t *testing.T) {
	s := open(t, Options{Dir: t.TempDir()})
	s.closed.Store(true)
	s.compact(context.Background(), compaction{s.db, recordPrefix(1), recordPrefix(2)})
	s.closed.Store(false)
	if err := s.Broken(); err != nil {
		t.Fatalf("a compaction refused as Close began broke the store: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
