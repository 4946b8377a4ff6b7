package bloom

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
)

func parts(t testing.TB, window, partition time.Duration) tier.Partitions {
	t.Helper()
	p, err := tier.NewPartitions(window, partition)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func newFilters(t testing.TB, n int, fp float64, newest int64) *Filters {
	t.Helper()
	f, err := New(&Options{Partitions: parts(t, 7*24*time.Hour, 24*time.Hour), ExpectedKeys: n, FalsePositive: fp}, newest)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func keys(prefix string, n int) []shard.Fingerprint {
	out := make([]shard.Fingerprint, n)
	for i := range out {
		out[i] = shard.Sum(shard.Hasher{}, "", strconv.AppendInt([]byte(prefix), int64(i), 10))
	}
	return out
}

func TestOptionsValidate(t *testing.T) {
	err := (&Options{ExpectedKeys: -1, FalsePositive: 1.5}).Validate()
	if !errors.Is(err, ErrOptions) {
		t.Fatalf("err = %v", err)
	}
	for _, want := range []string{"Partitions", "ExpectedKeys", "FalsePositive"} {
		if !bytes.Contains([]byte(err.Error()), []byte(want)) {
			t.Errorf("%q does not mention %s", err, want)
		}
	}
	for _, fp := range []float64{-0.1, 1, math.NaN()} {
		if _, err := New(&Options{Partitions: parts(t, time.Hour, time.Hour), FalsePositive: fp}, 0); !errors.Is(err, ErrOptions) {
			t.Errorf("FalsePositive %v: err = %v", fp, err)
		}
	}
}

// TestFalsePositiveAtCapacity fills every live partition to its expected key
// count and checks that the measured whole-window false-positive rate is
// within 1.5× of the target (and not suspiciously far below it).
func TestFalsePositiveAtCapacity(t *testing.T) {
	for _, target := range []float64{0.01, 0.001} {
		const n = 20_000
		f := newFilters(t, n, target, 0)
		live := f.parts.Live
		for p := 0; p < live; p++ {
			f.Add(keys("p"+strconv.Itoa(p)+"-", n), int64(p))
		}
		got := windowRate(f, keys("absent-", 400_000))
		t.Logf("target %.4f: measured %.5f over %d live filters (theory at fill %.5f)", target, got, live, f.EstimatedFalsePositive())
		if got > 1.5*target || got < target/1.5 {
			t.Errorf("target %v: measured false-positive rate %v", target, got)
		}
	}
}

func TestProbeNamesPartitionsAndRotationDrops(t *testing.T) {
	f := newFilters(t, 1000, 0.001, 10)
	a, b := keys("a", 1), keys("b", 1)
	f.Add(a, 5) // oldest live partition when newest is 10 (live = 8: 3..10)
	f.Add(b, 10)
	f.Add(a, 9)
	out := make([]Probe, 2)
	oldest := f.Test(append(a, b...), out)
	if oldest != 3 {
		t.Fatalf("oldest = %d, want 3", oldest)
	}
	if want := uint64(1<<(5-3) | 1<<(9-3)); out[0].Maybe != want {
		t.Errorf("probe a = %b, want %b", out[0].Maybe, want)
	}
	if want := uint64(1 << (10 - 3)); out[1].Maybe != want {
		t.Errorf("probe b = %b, want %b", out[1].Maybe, want)
	}
	// A clock stepping back changes nothing.
	if d := f.Rotate(4); d != 0 || f.newestPartition() != 10 {
		t.Fatalf("Rotate(4) dropped %d, newest %d", d, f.newestPartition())
	}
	f.Add(b, 2) // too old: ignored
	// Forward: partition 5 falls out when 13 is newest (live 6..13).
	if d := f.Rotate(13); d != 1 {
		t.Fatalf("Rotate(13) dropped %d filters, want 1", d)
	}
	f.Test(append(a, b...), out)
	if want := uint64(1 << (9 - 6)); out[0].Maybe != want {
		t.Errorf("after rotation probe a = %b, want %b", out[0].Maybe, want)
	}
}

func TestSnapshotRoundTrip(t *testing.T) {
	f := newFilters(t, 5000, 0.01, 100)
	in := keys("k", 3000)
	f.Add(in[:1000], 97)
	f.Add(in[1000:], 100)
	var buf bytes.Buffer
	meta := SnapshotMeta{Kind: SnapshotCache, StoreID: [16]byte{1, 2}, Epoch: 77, Secret: [16]byte{9}, HighWater: 12345}
	if _, err := f.WriteSnapshot(&buf, meta); err != nil {
		t.Fatal(err)
	}
	g := newFilters(t, 5000, 0.01, 99)
	var seen SnapshotMeta
	if err := g.ReadSnapshot(bytes.NewReader(buf.Bytes()), int64(buf.Len()), func(h SnapshotHeader) error { seen = h.SnapshotMeta; return nil }); err != nil {
		t.Fatal(err)
	}
	if seen != meta {
		t.Fatalf("meta = %+v, want %+v", seen, meta)
	}
	if g.newestPartition() != 100 {
		t.Fatalf("newest = %d", g.newestPartition())
	}
	want, got := make([]Probe, len(in)), make([]Probe, len(in))
	f.Test(in, want)
	g.Test(in, got)
	for i := range want {
		if want[i] != got[i] || got[i].Maybe == 0 {
			t.Fatalf("key %d: restored probe %b, saved %b", i, got[i].Maybe, want[i].Maybe)
		}
	}
}

func TestSnapshotRejectsDamageAndKeepsState(t *testing.T) {
	f := newFilters(t, 1000, 0.01, 7)
	f.Add(keys("k", 100), 7)
	var buf bytes.Buffer
	if _, err := f.WriteSnapshot(&buf, SnapshotMeta{Kind: SnapshotState}); err != nil {
		t.Fatal(err)
	}
	good := buf.Bytes()
	damaged := map[string][]byte{
		"empty":     {},
		"truncated": good[:len(good)-1],
		"oversized": append(append([]byte{}, good...), 0),
		"flipped":   flip(good, headerSize+100),
		"magic":     flip(good, 0),
		"trailer":   flip(good, len(good)-1),
	}
	other := newFilters(t, 2000, 0.01, 7) // other parameters
	var ob bytes.Buffer
	_, _ = other.WriteSnapshot(&ob, SnapshotMeta{})
	damaged["params"] = ob.Bytes()
	v1 := append([]byte{}, good...)
	binary.LittleEndian.PutUint32(v1[8:], 1)
	damaged["version 1"] = v1
	refused := errors.New("refused by accept")

	g := newFilters(t, 1000, 0.01, 7)
	mark := keys("mark", 1)
	g.Add(mark, 7)
	damaged["accept"] = good
	for name, b := range damaged {
		err := g.ReadSnapshot(bytes.NewReader(b), int64(len(b)), func(SnapshotHeader) error {
			if name == "accept" {
				return refused
			}
			return nil
		})
		if want := map[bool]error{true: refused, false: ErrSnapshot}[name == "accept"]; !errors.Is(err, want) {
			t.Errorf("%s: err = %v, want %v", name, err, want)
		}
		out := make([]Probe, 1)
		g.Test(mark, out)
		if out[0].Maybe == 0 {
			t.Fatalf("%s: a rejected snapshot changed the filters", name)
		}
	}
}

// windowRate is the share of keys (none of them added) that any live
// filter reports as maybe present.
func windowRate(f *Filters, absent []shard.Fingerprint) float64 {
	out := make([]Probe, len(absent))
	f.Test(absent, out)
	hits := 0
	for _, pr := range out {
		if pr.Maybe != 0 {
			hits++
		}
	}
	return float64(hits) / float64(len(absent))
}

func flip(b []byte, i int) []byte {
	c := append([]byte{}, b...)
	c[i] ^= 0x40
	return c
}

// FuzzReadSnapshot feeds arbitrary bytes to the loader: it must return
// ErrSnapshot or load, never panic or allocate past the configured size.
func FuzzReadSnapshot(f *testing.F) {
	fl := newFilters(f, 64, 0.1, 3)
	fl.Add(keys("k", 10), 3)
	var buf bytes.Buffer
	if _, err := fl.WriteSnapshot(&buf, SnapshotMeta{Kind: SnapshotState}); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	f.Add(buf.Bytes()[:headerSize])
	f.Add([]byte("tdbloom\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		g := newFilters(t, 64, 0.1, 3)
		if err := g.ReadSnapshot(bytes.NewReader(b), int64(len(b)), nil); err != nil && !errors.Is(err, ErrSnapshot) {
			t.Fatalf("untyped error %v", err)
		}
	})
}

// TestCheckSnapshotRefusesWhatMergeRefuses: records whose checksum holds
// but whose head is wrong (a repeated or out-of-window partition, a
// negative add count, an inner filter header that disagrees with the
// envelope) are refused by CheckSnapshot, which a clean Open uses to keep
// a sealed file without loading it, exactly as by MergeSnapshot; the
// intact snapshot passes both.
func TestCheckSnapshotRefusesWhatMergeRefuses(t *testing.T) {
	f := newFilters(t, 1000, 0.01, 9)
	f.Add(keys("a", 100), 8)
	f.Add(keys("b", 100), 9)
	var buf bytes.Buffer
	if _, err := f.WriteSnapshot(&buf, SnapshotMeta{Kind: SnapshotState}); err != nil {
		t.Fatal(err)
	}
	good := buf.Bytes()
	m, _, _ := f.Params()
	second := headerSize + int(recordSize(m)) // the second record's head
	edit := func(off int, v uint64, big bool) []byte { return editSnapshot(good, off, v, big) }
	first := binary.LittleEndian.Uint64(good[headerSize:])
	bad := map[string][]byte{
		"repeated partition":  edit(second, first, false),
		"partition too old":   edit(second, 1, false),
		"partition too new":   edit(second, 10, false),
		"negative adds":       edit(second+8, ^uint64(0), false),
		"inner m":             edit(second+16, m+64, true),
		"inner k":             edit(second+24, 99, true),
		"inner bit length":    edit(second+32, m-64, true),
		"first record's head": edit(headerSize+16, m+64, true),
	}
	for name, b := range bad {
		g := newFilters(t, 1000, 0.01, 9)
		errCheck := g.CheckSnapshot(bytes.NewReader(b), int64(len(b)), nil)
		errMerge := g.MergeSnapshot(bytes.NewReader(b), int64(len(b)), nil)
		if !errors.Is(errCheck, ErrSnapshot) || !errors.Is(errMerge, ErrSnapshot) {
			t.Errorf("%s: CheckSnapshot %v, MergeSnapshot %v, want ErrSnapshot from both", name, errCheck, errMerge)
		}
	}
	g := newFilters(t, 1000, 0.01, 9)
	if err := g.CheckSnapshot(bytes.NewReader(good), int64(len(good)), nil); err != nil {
		t.Fatalf("intact snapshot: %v", err)
	}
	if err := g.MergeSnapshot(bytes.NewReader(good), int64(len(good)), nil); err != nil {
		t.Fatalf("intact snapshot: %v", err)
	}
}
