//go:build !race

// The sample model is computed by one goroutine per stream: the race
// detector has nothing to find here and makes these tests minutes long.
// CI runs them in its pass without -race (go test -run '…|^TestSample' ./...).

package bench

import (
	"bytes"
	"compress/flate"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tierdedup/tierdedup/shard"
)

// Recipes of keys the planner's generator does not make, standing in for a
// user's own: the sample files are cut from them, and the runs that check
// a plan made from a sample use their keys beyond the sample.

// ledgerKeys are 64-byte business keys of another make than the planner's
// Business shape: a region, a tenant (Zipf-skewed over 20,000), a document
// type, the day, a ten-digit sequence number and a random hex tail filling
// the key to 64 bytes ("eu-west-1:acct_004217:invoice:20260105:0000123456:9f3c…").
type ledgerKeys struct{ perDay int64 }

var (
	ledgerRegions = []string{"eu-west-1", "us-east-2", "ap-south-1"}
	ledgerTypes   = []string{"invoice", "invoice", "invoice", "payment", "payment", "refund", "credit-note", "shipment"}
)

func (r ledgerKeys) AppendKey(dst []byte, i int64) []byte {
	h := shard.Mix(uint64(i) ^ 0x6c6564676572)
	start := len(dst)
	dst = append(dst, ledgerRegions[h%3]...)
	// A tenant of Zipf-like weight: the square of a uniform draw.
	u := float64(h>>8&0xffff) / 65536
	dst = fmt.Appendf(dst, ":acct_%06d:%s:", int(u*u*20000), ledgerTypes[h>>24%8])
	day := Start.AddDate(0, 0, int(i/r.perDay))
	dst = fmt.Appendf(dst, "%04d%02d%02d:%010d:", day.Year(), day.Month(), day.Day(), i)
	t := shard.Mix(h)
	for len(dst)-start < 64 {
		dst = append(dst, "0123456789abcdef"[t&15])
		t = t>>4 | shard.Mix(t)<<60
	}
	return dst
}

// snowflakeKeys are Twitter-style IDs, unlike the planner's Snowflake
// shape (uniform low 22 bits): 41 bits of milliseconds at perMs IDs a
// millisecond, one of 37 worker numbers spread over 10 bits, and a
// sequence restarting each millisecond.
type snowflakeKeys struct{ perMs int64 }

var snowflakeWorkers = func() []uint64 {
	w := make([]uint64, 37)
	for i := range w {
		w[i] = shard.Mix(uint64(i)) % 1024
	}
	return w
}()

func (r snowflakeKeys) AppendKey(dst []byte, i int64) []byte {
	ms, j := i/r.perMs, i%r.perMs
	w := (shard.Mix(uint64(ms)) + uint64(j)) % 37
	id := uint64(1_700_000_000_000+ms-1288834974657)<<22 | snowflakeWorkers[w]<<12 | uint64(j/37)
	return strconv.AppendUint(dst, id, 10)
}

// writeSample writes keys [0, n) of src to a file, one a line.
func writeSample(t testing.TB, src KeySource, n int) string {
	t.Helper()
	var b bytes.Buffer
	var k []byte
	for i := range n {
		k = src.AppendKey(k[:0], int64(i))
		b.Write(k)
		b.WriteByte('\n')
	}
	path := filepath.Join(t.TempDir(), "sample.txt")
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// offsetKeys is src from fresh index off on: keys a sample of src's first
// keys does not hold.
type offsetKeys struct {
	src KeySource
	off int64
}

func (o offsetKeys) AppendKey(dst []byte, i int64) []byte { return o.src.AppendKey(dst, o.off+i) }

// positionEntropy is the mean, over the positions of keys of length L,
// of the characters' entropy in bits, and the share of keys of length L.
func positionEntropy(keys [][]byte, L int) (bitsPerPos, share float64) {
	counts := make([][256]int, L)
	n := 0
	for _, k := range keys {
		if len(k) != L {
			continue
		}
		n++
		for i, c := range k {
			counts[i][c]++
		}
	}
	for i := range counts {
		for _, c := range counts[i] {
			if c > 0 {
				q := float64(c) / float64(n)
				bitsPerPos -= q * math.Log2(q)
			}
		}
	}
	return bitsPerPos / float64(L), float64(n) / float64(len(keys))
}

// TestSampleKeysResembleAndAreDistinct synthesises keys from samples of
// several makes and checks what the store and the run rely on: every
// fresh index gives its own key, the same each time, none of them a key
// of the sample; the lengths, the characters each position holds and the
// order (a time-ordered sample gives a time-ordered stream) follow the
// sample's.
func TestSampleKeysResembleAndAreDistinct(t *testing.T) {
	type recipe struct {
		name string
		src  KeySource
	}
	for _, r := range []recipe{
		{"ledger-64", ledgerKeys{perDay: 1_000_000}},
		{"snowflake", snowflakeKeys{perMs: 2}},
		{"counter", funcKeys(func(dst []byte, i int64) []byte {
			return strconv.AppendInt(append(dst, "order:"...), 100_000_000+i, 10)
		})},
		{"uuid4", funcKeys(func(dst []byte, i int64) []byte {
			s, _ := NewStream(WorkloadConfig{Shape: UUIDv4, Seed: 3})
			return s.appendShaped(dst, i)
		})},
		{"base64", funcKeys(func(dst []byte, i int64) []byte {
			const a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
			h := shard.Mix(uint64(i))
			for j := range 22 {
				if j%10 == 0 {
					h = shard.Mix(h + uint64(j))
				}
				dst = append(dst, a[h>>(6*(j%10))&63])
			}
			return dst
		})},
	} {
		t.Run(r.name, func(t *testing.T) {
			const n, fresh = 20_000, 1_000_000
			s, err := LoadSample(writeSample(t, r.src, n))
			if err != nil {
				t.Fatal(err)
			}
			src, err := s.source(fresh, fresh, 1)
			if err != nil {
				t.Fatal(err)
			}
			inSample := map[string]bool{}
			for p := range s.Keys() {
				inSample[string(s.key(p))] = true
			}
			seen := make(map[string]int64, fresh)
			var k []byte
			var synth, real [][]byte
			copied := 0
			for i := range int64(fresh) {
				k = src.AppendKey(k[:0], i)
				if j, dup := seen[string(k)]; dup {
					t.Fatalf("fresh indices %d and %d both give %q", j, i, k)
				}
				seen[string(k)] = i
				if inSample[string(k)] {
					copied++
				}
				if i%50 == 0 {
					synth = append(synth, bytes.Clone(k))
				}
			}
			for _, i := range []int64{0, 7, fresh - 1} {
				if a, b := src.AppendKey(nil, i), src.AppendKey(nil, i); !bytes.Equal(a, b) {
					t.Fatalf("index %d gives %q, then %q", i, a, b)
				}
			}
			for p := range s.Keys() {
				real = append(real, s.key(p))
			}
			realOrdered := 0
			for p := 1; p < len(real); p++ {
				if bytes.Compare(real[p-1], real[p]) <= 0 {
					realOrdered++
				}
			}
			t.Logf("%s; e.g. %q, %q; sample %q", s, synth[0], synth[len(synth)/2], real[len(real)/2])
			if copied > fresh/20 { // a dense counter holds the sample's values too
				t.Errorf("%d synthesised keys are the sample's own", copied)
			}
			// What the store's blocks pay: a stream as dense as the
			// sample, sorted, each key stored past the prefix it shares
			// with the one before, compressed.
			dense, err := s.source(int64(n), int64(n), 2)
			if err != nil {
				t.Fatal(err)
			}
			var same [][]byte
			for i := range int64(n) {
				same = append(same, dense.AppendKey(nil, i))
			}
			rb, sb := storedBytes(real), storedBytes(same)
			t.Logf("sorted, prefix-stripped and compressed: %.2f B a key (sample), %.2f (synthesised)", rb, sb)
			if math.Abs(sb/rb-1) > 0.15 {
				t.Errorf("stored bytes a key: sample %.2f, synthesised %.2f", rb, sb)
			}
			// Ordered pairs: a stream as dense as the sample is ordered
			// where the sample is.
			ordered := 0
			for i := 1; i < len(same); i++ {
				if bytes.Compare(same[i-1], same[i]) <= 0 {
					ordered++
				}
			}
			ro, so := float64(realOrdered)/float64(len(real)-1), float64(ordered)/float64(len(same)-1)
			t.Logf("ordered pairs: sample %.2f, synthesised %.2f", ro, so)
			if math.Abs(ro-so) > 0.1 {
				t.Errorf("ordered pairs: sample %.2f, synthesised %.2f", ro, so)
			}
			for L := range MaxKeySize + 1 {
				re, rs := positionEntropy(real, L)
				se, ss := positionEntropy(synth, L)
				if rs < 0.05 && ss < 0.05 {
					continue
				}
				t.Logf("length %d: share %.3f vs %.3f, %.2f vs %.2f bits per position", L, rs, ss, re, se)
				if math.Abs(rs-ss) > 0.02 || math.Abs(re-se) > 0.15*re+0.1 {
					t.Errorf("length %d: share %.3f (sample) vs %.3f, %.2f vs %.2f bits per position", L, rs, ss, re, se)
				}
			}
		})
	}
}

// storedBytes is the bytes a key of keys sorted, stored past the prefix
// each shares with the one before (as an SST's blocks store them), and
// compressed with DEFLATE.
func storedBytes(keys [][]byte) float64 {
	sorted := slices.Clone(keys)
	slices.SortFunc(sorted, bytes.Compare)
	var b bytes.Buffer
	z, _ := flate.NewWriter(&b, flate.BestSpeed)
	var prev []byte
	for _, k := range sorted {
		shared := 0
		for shared < len(k) && shared < len(prev) && k[shared] == prev[shared] {
			shared++
		}
		z.Write([]byte{byte(shared), byte(len(k) - shared)})
		z.Write(k[shared:])
		prev = k
	}
	z.Close()
	return float64(b.Len()) / float64(len(keys))
}

type funcKeys func(dst []byte, i int64) []byte

func (f funcKeys) AppendKey(dst []byte, i int64) []byte { return f(dst, i) }

// TestSampleRefusesWhatItCannotModel: too few keys, a key over
// MaxKeySize, and a stream needing more keys than the sample's patterns
// hold fail with ErrSample; empty lines and CRLF endings are not keys.
func TestSampleRefusesWhatItCannotModel(t *testing.T) {
	lines := func(n int, f func(i int) string) string {
		var b strings.Builder
		for i := range n {
			b.WriteString(f(i))
			b.WriteString("\r\n\n")
		}
		return b.String()
	}
	if _, err := ReadSample(strings.NewReader(lines(MinSampleKeys-1, strconv.Itoa)), "few"); !errors.Is(err, ErrSample) {
		t.Errorf("%d keys: %v", MinSampleKeys-1, err)
	}
	long := lines(200, strconv.Itoa) + strings.Repeat("x", MaxKeySize+1) + "\n"
	if _, err := ReadSample(strings.NewReader(long), "long"); !errors.Is(err, ErrSample) || !strings.Contains(err.Error(), "line 401") {
		t.Errorf("a key of %d bytes: %v", MaxKeySize+1, err)
	}
	// Two-digit keys: 100 of them at most (each line is followed by an empty
	// one: the long key is on line 401).
	s, err := ReadSample(strings.NewReader(lines(200, func(i int) string { return fmt.Sprintf("%02d", i%100) })), "two-digit")
	if err != nil {
		t.Fatal(err)
	}
	if s.Keys() != 200 || s.MeanKeySize() != 2 {
		t.Errorf("%d keys of %.1f B, want 200 of 2 (CR and empty lines dropped)", s.Keys(), s.MeanKeySize())
	}
	if _, err := s.source(100, 100, 1); err != nil {
		t.Errorf("100 keys: %v", err)
	}
	if _, err := NewStream(WorkloadConfig{Keys: 1000, Sample: s}); !errors.Is(err, ErrSample) {
		t.Errorf("1000 two-digit keys: %v", err)
	}
	if _, err := NewStream(WorkloadConfig{Keys: 1000, Sample: s, KeySize: 40}); !errors.Is(err, ErrConfig) {
		t.Errorf("a sample with KeySize: %v", err)
	}
}
