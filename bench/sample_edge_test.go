//go:build !race

// Without -race, as sample_test.go says why.

package bench

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

// Edge cases of the key sample (sample.go): adversarial samples, the
// uniqueness and determinism the benchmark's ground truth rests on, and
// the errors bad input gets.

// edgeRecipe makes the lines of a sample file.
type edgeRecipe struct {
	name  string
	lines func(r *rand.Rand) []string
	// mayRefuse: the sample's patterns may be too small for the streams
	// the test asks of it, in which case ErrSample is the right answer.
	mayRefuse bool
}

const (
	edgeAlnum     = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	edgeB64URL    = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	edgeCrockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
)

func edgeRand(r *rand.Rand, alphabet string, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[r.IntN(len(alphabet))]
	}
	return string(b)
}

func edgeRecipes() []edgeRecipe {
	return []edgeRecipe{
		{name: "mixed-lengths", lines: func(r *rand.Rand) []string {
			var out []string
			for range 2000 {
				out = append(out, edgeRand(r, edgeAlnum, 6+r.IntN(30)))
			}
			return out
		}},
		{name: "many-patterns", mayRefuse: true, lines: func(r *rand.Rand) []string {
			seps := []string{"-", "_", ":", "/", ".", "|"}
			var out []string
			for range 3000 {
				k := edgeRand(r, edgeAlnum, 1+r.IntN(4))
				for range 1 + r.IntN(3) {
					k += seps[r.IntN(len(seps))] + edgeRand(r, edgeAlnum, 1+r.IntN(5))
				}
				out = append(out, k)
			}
			return out
		}},
		{name: "digits-varying-length", mayRefuse: true, lines: func(r *rand.Rand) []string {
			var out []string
			for range 2000 {
				n := 1 + r.IntN(12)
				out = append(out, strconv.FormatUint(r.Uint64N(uint64(math.Pow10(n))), 10))
			}
			return out
		}},
		{name: "digits-long-varying", lines: func(r *rand.Rand) []string {
			var out []string
			for range 2000 {
				n := 9 + r.IntN(6)
				out = append(out, edgeRand(r, "123456789", 1)+edgeRand(r, "0123456789", n-1))
			}
			return out
		}},
		{name: "heavy-duplication", lines: func(r *rand.Rand) []string {
			var base []string
			for range 100 {
				base = append(base, "cust-"+edgeRand(r, edgeAlnum, 10))
			}
			var out []string
			for i := range 5000 {
				if i%2 == 0 {
					out = append(out, base[(i/50)%len(base)]) // runs of the same line
				} else {
					out = append(out, base[r.IntN(len(base))])
				}
			}
			return out
		}},
		{name: "mostly-identical", lines: func(r *rand.Rand) []string {
			var out []string
			for range 2000 {
				if r.IntN(100) < 95 {
					out = append(out, "order-000001")
				} else {
					out = append(out, "order-"+edgeRand(r, "0123456789", 6))
				}
			}
			return out
		}},
		{name: "base64url-random-punct", lines: func(r *rand.Rand) []string {
			var out []string
			for range 2000 {
				out = append(out, edgeRand(r, edgeB64URL, 22))
			}
			return out
		}},
		{name: "base64-std-padded", lines: func(r *rand.Rand) []string {
			var out []string
			for range 2000 {
				out = append(out, edgeRand(r, edgeB64URL[:62]+"+/", 22)+"==")
			}
			return out
		}},
		{name: "uuid7", lines: func(r *rand.Rand) []string {
			var out []string
			ms := uint64(1_767_000_000_000)
			for range 2000 {
				ms += uint64(r.IntN(3))
				h := fmt.Sprintf("%012x7%03x%x%03x%012x", ms, r.IntN(4096), 8+r.IntN(4), r.IntN(4096), r.Uint64()&(1<<48-1))
				out = append(out, h[0:8]+"-"+h[8:12]+"-"+h[12:16]+"-"+h[16:20]+"-"+h[20:32])
			}
			return out
		}},
		{name: "ulid", lines: func(r *rand.Rand) []string {
			var out []string
			ms := uint64(1_767_000_000_000)
			for range 2000 {
				ms += uint64(r.IntN(2))
				var t [10]byte
				for i, v := 9, ms; i >= 0; i, v = i-1, v>>5 {
					t[i] = edgeCrockford[v&31]
				}
				out = append(out, string(t[:])+edgeRand(r, edgeCrockford, 16))
			}
			return out
		}},
		{name: "high-bytes-spaces-tabs", lines: func(r *rand.Rand) []string {
			tenants := []string{"Zürich AG", "東京", "São Paulo", "tab\tbed", "  lead"}
			var out []string
			for range 2000 {
				out = append(out, tenants[r.IntN(len(tenants))]+"\t"+edgeRand(r, "0123456789", 8)+" é")
			}
			return out
		}},
		{name: "random-high-bytes", lines: func(r *rand.Rand) []string {
			var out []string
			for range 2000 {
				b := make([]byte, 12)
				for i := range b {
					b[i] = byte(0x20 + r.IntN(0xe0))
					if b[i] == 0x7f {
						b[i] = 0xff
					}
				}
				out = append(out, string(b))
			}
			return out
		}},
		{name: "nul-bytes", lines: func(r *rand.Rand) []string {
			var out []string
			for i := range 2000 {
				k := []byte(edgeRand(r, edgeAlnum, 8))
				if i%3 == 0 {
					k[2] = 0
				}
				if i%5 == 0 {
					k[5] = 0
				}
				out = append(out, string(k))
			}
			return out
		}},
		{name: "max-key-size", lines: func(r *rand.Rand) []string {
			var out []string
			prefix := strings.Repeat("p", MaxKeySize-12)
			for range 150 {
				out = append(out, prefix+edgeRand(r, edgeAlnum, 12))
			}
			return out
		}},
		{name: "max-key-size-random", lines: func(r *rand.Rand) []string {
			var out []string
			for range 120 {
				out = append(out, edgeRand(r, edgeAlnum, MaxKeySize))
			}
			return out
		}},
		{name: "interior-cr", lines: func(r *rand.Rand) []string {
			var out []string
			for range 500 {
				out = append(out, edgeRand(r, edgeAlnum, 4)+"\r"+edgeRand(r, edgeAlnum, 4)+"\r\r")
			}
			return out
		}},
	}
}

func edgeSample(t testing.TB, name string, lines []string) *Sample {
	t.Helper()
	s, err := ReadSample(strings.NewReader(strings.Join(lines, "\n")+"\n"), name)
	if err != nil {
		t.Fatalf("ReadSample(%s): %v", name, err)
	}
	return s
}

// edgeCheckKey checks a key's form.
func edgeCheckKey(t testing.TB, what string, i int64, k []byte) bool {
	t.Helper()
	if len(k) == 0 || len(k) > MaxKeySize || bytes.IndexByte(k, '\n') >= 0 {
		t.Errorf("%s: index %d gives a key of %d bytes %q", what, i, len(k), k)
		return false
	}
	return true
}

// edgeCheckSource builds s.source(fresh, limit, seed) and, if it builds,
// checks that every index in [0, limit) gives its own well-formed key, the
// same when asked again. It returns the source's error.
func edgeCheckSource(t testing.TB, s *Sample, fresh, limit int64, seed uint64) error {
	t.Helper()
	src, err := s.source(fresh, limit, seed)
	if err != nil {
		if !errors.Is(err, ErrSample) {
			t.Errorf("source(%d, %d): an error not ErrSample: %v", fresh, limit, err)
		}
		return err
	}
	n := max(limit, fresh, 1)
	seen := make(map[string]int64, n)
	var k, again []byte
	bad := 0
	for i := range n {
		k = src.AppendKey(k[:0], i)
		if !edgeCheckKey(t, s.Name, i, k) {
			if bad++; bad > 5 {
				t.FailNow()
			}
			continue
		}
		if j, dup := seen[string(k)]; dup {
			t.Errorf("%s: source(%d, %d): fresh indices %d and %d both give %q", s.Name, fresh, limit, j, i, k)
			if bad++; bad > 5 {
				t.FailNow()
			}
			continue
		}
		seen[string(k)] = i
		if i%997 == 0 {
			if again = src.AppendKey(again[:0], i); !bytes.Equal(again, k) {
				t.Errorf("%s: index %d gives %q, then %q", s.Name, i, k, again)
			}
		}
	}
	return nil
}

// edgeCheckStream runs a whole stream and checks the ground truth a run
// relies on: fresh messages carry keys never seen before, each message's
// key is the key of its index, and no key is malformed.
func edgeCheckStream(t testing.TB, c WorkloadConfig) error {
	t.Helper()
	st, err := NewStream(c)
	if err != nil {
		return err
	}
	byIdx := map[int64]string{}
	byKey := map[string]int64{}
	var batch [][]byte
	var kinds []Kind
	idx := make([]int64, 0, 1000) // non-nil: IndexedBatch fills it
	bad := 0
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf(format, args...)
		if bad++; bad > 5 {
			t.FailNow()
		}
	}
	for st.Len() > 0 {
		batch, kinds, idx = st.IndexedBatch(batch, kinds, idx, 1000)
		for j, k := range batch {
			if !edgeCheckKey(t, c.Sample.Name, idx[j], k) {
				fail("malformed")
				continue
			}
			switch kinds[j] {
			case Fresh:
				if o, dup := byKey[string(k)]; dup {
					fail("%s: fresh index %d gives %q, the key of fresh index %d", c.Sample.Name, idx[j], k, o)
					continue
				}
				byKey[string(k)] = idx[j]
				byIdx[idx[j]] = string(k)
			default:
				if want, ok := byIdx[idx[j]]; !ok || want != string(k) {
					fail("%s: a %v message of index %d gives %q, its fresh copy %q", c.Sample.Name, kinds[j], idx[j], k, want)
				}
			}
		}
	}
	return nil
}

// TestSampleEdgeDistinctAdversarial: for samples of many makes, every
// fresh index of a stream 10x and 100x the sample's size gives its own
// key, both at the limit (DupRatio 0: every message fresh) and through
// NewStream with duplicates and in-batch repeats.
func TestSampleEdgeDistinctAdversarial(t *testing.T) {
	for ri, rc := range edgeRecipes() {
		t.Run(rc.name, func(t *testing.T) {
			s := edgeSample(t, rc.name, rc.lines(rand.New(rand.NewPCG(uint64(ri), 1))))
			n := int64(s.Keys())
			t.Logf("%s, mean %.1f B", s, s.MeanKeySize())
			refused := 0
			for _, mult := range []int64{10, 100} {
				limit := mult * n
				if limit > 300_000 {
					limit = 300_000
				}
				for _, fresh := range []int64{limit, limit / 3} {
					if err := edgeCheckSource(t, s, fresh, limit, uint64(mult)); err != nil {
						t.Logf("source(%d, %d): %v", fresh, limit, err)
						refused++
					}
				}
				c := WorkloadConfig{Keys: min(limit, 100_000), Sample: s, DupRatio: 0.3, InBatchRepeat: 0.05, Seed: uint64(mult)}
				if err := edgeCheckStream(t, c); err != nil {
					if !errors.Is(err, ErrSample) {
						t.Errorf("NewStream: an error not ErrSample: %v", err)
					}
					t.Logf("NewStream(Keys %d): %v", c.Keys, err)
					refused++
				}
			}
			if refused > 0 && !rc.mayRefuse {
				t.Errorf("%s refused %d streams of 10x-100x its size", rc.name, refused)
			}
		})
	}
}

// TestSampleEdgeShortKeys: keys of 1 to 3 bytes hold few distinct
// values. A stream needing more fails with ErrSample; one that fits gives
// distinct keys, up to the whole capacity.
func TestSampleEdgeShortKeys(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	type tc struct {
		name     string
		lines    []string
		capacity int64 // the most distinct keys like these (an upper bound)
	}
	var cases []tc
	mk := func(name string, capacity int64, f func(i int) string) {
		var l []string
		for i := range 400 {
			l = append(l, f(i))
		}
		cases = append(cases, tc{name, l, capacity})
	}
	mk("one-letter", 26, func(int) string { return edgeRand(r, "abcdefghijklmnopqrstuvwxyz", 1) })
	mk("one-digit", 10, func(int) string { return edgeRand(r, "0123456789", 1) })
	mk("one-digit-few", 10, func(int) string { return edgeRand(r, "123", 1) })
	mk("two-letters", 26*26, func(int) string { return edgeRand(r, "abcdefghijklmnopqrstuvwxyz", 2) })
	mk("three-mixed", 62*62*62, func(int) string { return edgeRand(r, edgeAlnum, 3) })
	mk("one-to-three", 10+100+1000, func(int) string { return edgeRand(r, "0123456789", 1+r.IntN(3)) })
	mk("punct-1", 26*26, func(int) string { return edgeRand(r, "ab", 1) + "-" + edgeRand(r, "xyz", 1) })
	mk("same-letter", 1, func(int) string { return "q" })
	mk("same-digit", 10, func(int) string { return "7" })
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := edgeSample(t, c.name, c.lines)
			worked := int64(0)
			for _, limit := range []int64{1, 2, 9, 10, 11, 26, 27, 100, 400, 676, 677, 1110, 1111, 4000, 40_000, 238_328, 238_329} {
				err := edgeCheckSource(t, s, limit, limit, 1)
				if err == nil {
					worked = max(worked, limit)
				}
				if err == nil && limit > c.capacity {
					t.Errorf("source(%d) built for keys with at most %d values", limit, c.capacity)
				}
				if err := edgeCheckStream(t, WorkloadConfig{Keys: min(limit, 50_000), Sample: s, Seed: 3}); err != nil && !errors.Is(err, ErrSample) {
					t.Errorf("NewStream(Keys %d): an error not ErrSample: %v", limit, err)
				}
			}
			t.Logf("%s: streams of up to %d keys built (capacity %d)", s, worked, c.capacity)
		})
	}
}

// TestSampleEdgeReadFormats: CRLF files, no trailing newline, blank
// lines, a key of MaxKeySize bytes (with and without a CR), bytes of
// 0x80 and above, spaces and tabs are all read as the keys they are.
func TestSampleEdgeReadFormats(t *testing.T) {
	var want []string
	for i := range 150 {
		want = append(want, fmt.Sprintf("Key %03d\twith\xc3\xa9\xff", i))
	}
	long := strings.Repeat("L", MaxKeySize)
	checkR := func(t *testing.T, r io.Reader, want []string) *Sample {
		t.Helper()
		s, err := ReadSample(r, "in")
		if err != nil {
			t.Fatal(err)
		}
		if s.Keys() != len(want) {
			t.Fatalf("%d keys, want %d", s.Keys(), len(want))
		}
		for p, w := range want {
			if string(s.key(p)) != w {
				t.Fatalf("key %d is %q, want %q", p, s.key(p), w)
			}
		}
		if s.Truncated {
			t.Error("Truncated")
		}
		return s
	}
	check := func(t *testing.T, input string, want []string) *Sample {
		t.Helper()
		return checkR(t, strings.NewReader(input), want)
	}
	t.Run("lf", func(t *testing.T) { check(t, strings.Join(want, "\n")+"\n", want) })
	t.Run("crlf", func(t *testing.T) { check(t, strings.Join(want, "\r\n")+"\r\n", want) })
	t.Run("no-trailing-newline", func(t *testing.T) { check(t, strings.Join(want, "\n"), want) })
	t.Run("crlf-no-trailing-newline", func(t *testing.T) { check(t, strings.Join(want, "\r\n"), want) })
	t.Run("final-cr-only", func(t *testing.T) { check(t, strings.Join(want, "\r\n")+"\r", want) })
	t.Run("blank-lines", func(t *testing.T) {
		check(t, "\n\r\n\n"+strings.Join(want, "\n\n\r\n")+"\n\n\n", want)
	})
	t.Run("max-key-size", func(t *testing.T) {
		// Keys of exactly MaxKeySize bytes, CRLF-terminated (the line is
		// MaxKeySize+2 bytes) and the last one without a newline.
		var w []string
		for i := range 150 {
			w = append(w, long[:MaxKeySize-6]+fmt.Sprintf("%06d", i*7919%1_000_000))
		}
		s := check(t, strings.Join(w, "\r\n"), w)
		if err := edgeCheckSource(t, s, 20_000, 20_000, 1); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("mean", func(t *testing.T) {
		s := check(t, strings.Join(want, "\n"), want)
		total := 0
		for _, w := range want {
			total += len(w)
		}
		if got := s.MeanKeySize(); math.Abs(got-float64(total)/float64(len(want))) > 1e-9 {
			t.Errorf("MeanKeySize %v, want %v", got, float64(total)/float64(len(want)))
		}
	})
	t.Run("one-byte-reads", func(t *testing.T) {
		checkR(t, iotest.OneByteReader(strings.NewReader(strings.Join(want, "\r\n"))), want)
	})
	t.Run("file", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "ids.txt")
		if err := os.WriteFile(path, []byte(strings.Join(want, "\r\n")), 0o644); err != nil {
			t.Fatal(err)
		}
		s, err := LoadSample(path)
		if err != nil {
			t.Fatal(err)
		}
		if s.Keys() != len(want) || s.Name != path {
			t.Errorf("LoadSample: %d keys named %q", s.Keys(), s.Name)
		}
	})
	t.Run("stdin", func(t *testing.T) {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			io.WriteString(w, strings.Join(want, "\n"))
			w.Close()
		}()
		old := os.Stdin
		os.Stdin = r
		defer func() { os.Stdin = old; r.Close() }()
		s, err := LoadSample("-")
		if err != nil {
			t.Fatal(err)
		}
		if s.Keys() != len(want) || s.Name != "-" {
			t.Errorf("LoadSample(-): %d keys named %q", s.Keys(), s.Name)
		}
	})
}

// TestSampleEdgeTruncated: a sample of more than MaxSampleKeys lines
// keeps the first MaxSampleKeys and says it was truncated; one of exactly
// MaxSampleKeys lines is not truncated.
func TestSampleEdgeTruncated(t *testing.T) {
	var b bytes.Buffer
	word := func(i int) string { return fmt.Sprintf("%08x", uint32(i)*uint32(2654435761)) }
	line := func(i int) { b.WriteString(word(i) + "\n") }
	for i := range MaxSampleKeys {
		line(i)
	}
	exact := bytes.Clone(b.Bytes())
	for i := MaxSampleKeys; i < MaxSampleKeys+10; i++ {
		line(i)
	}
	b.WriteString(strings.Repeat("x", MaxKeySize+1) + "\n") // beyond the limit: not read
	s, err := ReadSample(bytes.NewReader(b.Bytes()), "big")
	if err != nil {
		t.Fatal(err)
	}
	if !s.Truncated || s.Keys() != MaxSampleKeys {
		t.Errorf("Truncated %v, %d keys; want true, %d", s.Truncated, s.Keys(), MaxSampleKeys)
	}
	if got, want := string(s.key(s.Keys()-1)), word(MaxSampleKeys-1); got != want {
		t.Errorf("last key %q, want %q", got, want)
	}
	src, err := s.source(1000, 1000, 1)
	if err != nil {
		t.Fatal(err)
	}
	if k := src.AppendKey(nil, 999); len(k) != 8 {
		t.Errorf("key %q", k)
	}
	s2, err := ReadSample(bytes.NewReader(exact), "exact")
	if err != nil {
		t.Fatal(err)
	}
	if s2.Truncated || s2.Keys() != MaxSampleKeys {
		t.Errorf("exactly MaxSampleKeys lines: Truncated %v, %d keys", s2.Truncated, s2.Keys())
	}
}

// TestSampleEdgeDeterministic: one index gives one key, in one source or
// in two built alike, and a stream is a function of its seed.
func TestSampleEdgeDeterministic(t *testing.T) {
	for ri, rc := range edgeRecipes() {
		t.Run(rc.name, func(t *testing.T) {
			s := edgeSample(t, rc.name, rc.lines(rand.New(rand.NewPCG(uint64(ri), 1))))
			keys := int64(20 * s.Keys())
			a, errA := s.source(keys, keys, 42)
			b, errB := s.source(keys, keys, 42)
			if (errA == nil) != (errB == nil) {
				t.Fatalf("%v vs %v", errA, errB)
			}
			if errA != nil {
				t.Skip(errA)
			}
			for i := int64(0); i < keys; i += 7 {
				ka, kb, ka2 := a.AppendKey(nil, i), b.AppendKey(nil, i), a.AppendKey([]byte("junk"), i)
				if !bytes.Equal(ka, kb) || !bytes.Equal(ka2[4:], ka) || string(ka2[:4]) != "junk" {
					t.Fatalf("index %d: %q, %q, %q", i, ka, kb, ka2)
				}
			}
			c := WorkloadConfig{Keys: min(keys, 50_000), Sample: s, DupRatio: 0.2, InBatchRepeat: 0.02, Zipf: 1.2, Seed: 9}
			h1, err := edgeStreamDigest(c)
			if err != nil {
				t.Fatal(err)
			}
			h2, _ := edgeStreamDigest(c)
			if h1 != h2 {
				t.Errorf("the same config gives two streams")
			}
		})
	}
}

// edgeStreamDigest is the stream's keys, kinds and indices, joined.
func edgeStreamDigest(c WorkloadConfig) (string, error) {
	st, err := NewStream(c)
	if err != nil {
		return "", err
	}
	var out bytes.Buffer
	var batch [][]byte
	var kinds []Kind
	idx := make([]int64, 0, 777)
	for st.Len() > 0 {
		batch, kinds, idx = st.IndexedBatch(batch, kinds, idx, 777)
		for j, k := range batch {
			fmt.Fprintf(&out, "%q %d %d\n", k, kinds[j], idx[j])
		}
	}
	return out.String(), nil
}

// edgeFreshKeys is the keys of the first n fresh messages of c's stream.
func edgeFreshKeys(c WorkloadConfig, n int) ([]string, error) {
	st, err := NewStream(c)
	if err != nil {
		return nil, err
	}
	var out []string
	var batch [][]byte
	var kinds []Kind
	for st.Len() > 0 && len(out) < n {
		batch, kinds = st.Batch(batch, kinds, 100)
		for j, k := range batch {
			if kinds[j] == Fresh && len(out) < n {
				out = append(out, string(k))
			}
		}
	}
	return out, nil
}

// TestSampleEdgeSeedsDiffer: streams of two seeds hold different keys,
// even when every message is fresh (DupRatio 0), so that two runs with
// different seeds do not write the same keys.
func TestSampleEdgeSeedsDiffer(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 8))
	type tc = edgeSeedCase
	var cases []tc
	for _, rc := range edgeRecipes() {
		if !rc.mayRefuse {
			cases = append(cases, tc{rc.name, rc.lines(r), 20_000})
		}
	}
	edgeSeedsDiffer(t, cases)
}

// TestSampleEdgeSeedsDifferDenseCounter: the same for a sample of
// consecutive numbers (an auto-increment ID column) and a stream denser
// than it: the keys are as ordered as the sample's, and a different seed
// gives a different stream. (A stream no denser than such a sample, one
// key a sample key, has one choice: the sample's own keys, whatever the
// seed; TestSampleEdgeDenseCounterAsDense checks that.)
func TestSampleEdgeSeedsDifferDenseCounter(t *testing.T) {
	type tc = edgeSeedCase
	var seq []string
	for i := range 300_000 {
		seq = append(seq, strconv.Itoa(100_000+i))
	}
	edgeSeedsDiffer(t, []tc{{"sequential-6-digits", seq, 600_000}})
}

// TestSampleEdgeDenseCounterAsDense: a stream of one key a sample key from
// a sample of consecutive numbers is that counter: distinct and in order.
func TestSampleEdgeDenseCounterAsDense(t *testing.T) {
	var seq []string
	for i := range 300_000 {
		seq = append(seq, strconv.Itoa(100_000+i))
	}
	s := edgeSample(t, "dense", seq)
	keys, err := edgeFreshKeys(WorkloadConfig{Keys: 20_000, Sample: s, Seed: 1}, 2000)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(keys); i++ {
		if keys[i] <= keys[i-1] {
			t.Fatalf("fresh keys %d and %d: %q then %q", i-1, i, keys[i-1], keys[i])
		}
	}
}

type edgeSeedCase struct {
	name  string
	lines []string
	keys  int64
}

func edgeSeedsDiffer(t *testing.T, cases []edgeSeedCase) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := edgeSample(t, c.name, c.lines)
			const n = 2000
			a, err := edgeFreshKeys(WorkloadConfig{Keys: c.keys, Sample: s, Seed: 1}, n)
			if err != nil {
				t.Fatal(err)
			}
			b, err := edgeFreshKeys(WorkloadConfig{Keys: c.keys, Sample: s, Seed: 2}, n)
			if err != nil {
				t.Fatal(err)
			}
			same := 0
			for i := range a {
				if a[i] == b[i] {
					same++
				}
			}
			t.Logf("%s: seeds 1 and 2 give the same key at %d of the first %d fresh indices (e.g. %q vs %q)", s, same, len(a), a[len(a)/2], b[len(b)/2])
			if same == len(a) {
				t.Errorf("seeds 1 and 2 give the same first %d fresh keys (Keys %d, DupRatio 0)", len(a), c.keys)
			}
		})
	}
}

// TestSampleEdgeNoPanic: degenerate stream sizes neither panic nor hang,
// and keys of huge streams stay distinct where they are looked at.
func TestSampleEdgeNoPanic(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	uuids := edgeRecipes()[8].lines(r) // uuid7
	short := make([]string, 200)
	for i := range short {
		short[i] = edgeRand(r, "abc", 2)
	}
	us := edgeSample(t, "uuid7", uuids)
	ss := edgeSample(t, "short", short)
	for _, s := range []*Sample{us, ss} {
		for _, fl := range [][2]int64{{0, 0}, {0, 1}, {1, 0}, {-5, -5}, {100, 10}, {10, 100}, {1, 1}, {5000, 0}} {
			func() {
				defer func() {
					if p := recover(); p != nil {
						t.Errorf("%s: source(%d, %d) panics: %v", s.Name, fl[0], fl[1], p)
					}
				}()
				if err := edgeCheckSource(t, s, fl[0], fl[1], 7); err != nil {
					t.Logf("%s: source(%d, %d): %v", s.Name, fl[0], fl[1], err)
				}
			}()
		}
		for _, c := range []WorkloadConfig{
			{Keys: 0, Sample: s},
			{Keys: 1, Sample: s},
			{Keys: 1, Sample: s, DupRatio: 0.99, InBatchRepeat: 0.99},
			{Keys: 3000, Sample: s, DupRatio: 0.5, InBatchRepeat: 0.6}, // fresh estimate negative
			{Keys: 3000, Sample: s, DupRatio: 0.999999},
		} {
			func() {
				defer func() {
					if p := recover(); p != nil {
						t.Errorf("%s: %+v panics: %v", s.Name, c, p)
					}
				}()
				if err := edgeCheckStream(t, c); err != nil {
					if !errors.Is(err, ErrSample) {
						t.Errorf("%s: Keys %d: an error not ErrSample: %v", s.Name, c.Keys, err)
					}
					t.Logf("%s: Keys %d DupRatio %v InBatch %v: %v", s.Name, c.Keys, c.DupRatio, c.InBatchRepeat, err)
				}
			}()
		}
	}
	// Huge streams: the short-key sample refuses them, the UUID sample
	// builds them quickly, and its keys far out are well formed and
	// distinct from each other and from the first ones.
	for _, keys := range []int64{1e12, 1 << 50, math.MaxInt64 - 1, math.MaxInt64} {
		for _, dup := range []float64{0, 0.5} {
			start := time.Now()
			_, err := NewStream(WorkloadConfig{Keys: keys, Sample: ss, DupRatio: dup})
			if !errors.Is(err, ErrSample) {
				t.Errorf("short keys, Keys %d: %v, want ErrSample", keys, err)
			}
			st, err := NewStream(WorkloadConfig{Keys: keys, Sample: us, DupRatio: dup, Seed: 1})
			if err != nil {
				t.Errorf("uuid7, Keys %d: %v", keys, err)
				continue
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("Keys %d: NewStream took %v", keys, d)
			}
			src := st.src
			seen := map[string]int64{}
			probe := func(i int64) {
				k := src.AppendKey(nil, i)
				if !edgeCheckKey(t, "uuid7", i, k) {
					return
				}
				if j, dup := seen[string(k)]; dup && j != i {
					t.Errorf("Keys %d: fresh indices %d and %d both give %q", keys, j, i, k)
				}
				seen[string(k)] = i
			}
			n := int64(us.Keys())
			for i := range int64(5000) {
				probe(i)
				probe(keys - 1 - i)
				probe(r.Int64N(keys))
				probe(i * n)          // one sample key's first key, cycle after cycle
				probe(keys/2 + i*997) // the middle
			}
			batch, kinds := st.Batch(nil, nil, 1000)
			if len(batch) != 1000 || len(kinds) != 1000 {
				t.Errorf("Keys %d: a batch of %d", keys, len(batch))
			}
		}
	}
}

// TestSampleEdgeErrors: bad input fails with ErrSample (the sample) or
// ErrConfig (the workload).
func TestSampleEdgeErrors(t *testing.T) {
	keys := func(n int) string {
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, "k%05d\n", i)
		}
		return b.String()
	}
	for _, c := range []struct {
		name string
		r    io.Reader
	}{
		{"empty", strings.NewReader("")},
		{"blank-lines", strings.NewReader(strings.Repeat("\r\n\n", 500))},
		{"too-few", strings.NewReader(keys(MinSampleKeys - 1))},
		{"too-few-crlf", strings.NewReader(strings.ReplaceAll(keys(MinSampleKeys-1), "\n", "\r\n"))},
		{"key-over-max", strings.NewReader(keys(200) + strings.Repeat("y", MaxKeySize+1) + "\n")},
		{"key-over-max-no-newline", strings.NewReader(keys(200) + strings.Repeat("y", MaxKeySize+1))},
		{"first-line-over-max", strings.NewReader(strings.Repeat("y", MaxKeySize+1) + "\n" + keys(200))},
		{"line-over-buffer", strings.NewReader(keys(200) + strings.Repeat("z", 100<<10) + "\n")},
		{"line-over-buffer-no-newline", strings.NewReader(keys(200) + strings.Repeat("z", 100<<10))},
		{"read-error", io.MultiReader(strings.NewReader(keys(500)), iotest.ErrReader(errors.New("disk gone")))},
		{"read-error-first", iotest.ErrReader(errors.New("disk gone"))},
		{"timeout-reader", iotest.TimeoutReader(strings.NewReader(keys(500)))},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := ReadSample(c.r, c.name)
			if !errors.Is(err, ErrSample) || s != nil {
				t.Errorf("ReadSample: %v, %v; want ErrSample", s, err)
			}
		})
	}
	t.Run("files", func(t *testing.T) {
		dir := t.TempDir()
		_, err := LoadSample(filepath.Join(dir, "missing.txt"))
		if !errors.Is(err, ErrSample) || !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("a missing file: %v", err)
		}
		if _, err := LoadSample(dir); !errors.Is(err, ErrSample) {
			t.Errorf("a directory: %v", err)
		}
		empty := filepath.Join(dir, "empty.txt")
		os.WriteFile(empty, nil, 0o644)
		if _, err := LoadSample(empty); !errors.Is(err, ErrSample) {
			t.Errorf("an empty file: %v", err)
		}
	})
	s, err := ReadSample(strings.NewReader(keys(300)), "ok")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []WorkloadConfig{
		{Keys: 10, Sample: s, KeySize: 40},
		{Keys: 10, Sample: s, KeySize: -1},
		{Keys: 10, Sample: s, Source: funcKeys(func(d []byte, i int64) []byte { return d })},
		{Keys: -1, Sample: s},
		{Keys: 10, Sample: s, DupRatio: 1},
		{Keys: 10, Sample: s, DupRatio: -0.1},
		{Keys: 10, Sample: s, InBatchRepeat: 1},
		{Keys: 10, Sample: s, Zipf: 0.5},
		{Keys: 10, Sample: s, Shape: 99},
	} {
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Errorf("%+v panics: %v", c, p)
				}
			}()
			if _, err := NewStream(c); !errors.Is(err, ErrConfig) {
				t.Errorf("NewStream(Keys %d, KeySize %d, Source %v, DupRatio %v, InBatch %v, Zipf %v, Shape %d): %v, want ErrConfig",
					c.Keys, c.KeySize, c.Source != nil, c.DupRatio, c.InBatchRepeat, c.Zipf, c.Shape, err)
			}
		}()
	}
	// A stream the sample cannot hold: ErrSample, not ErrConfig.
	if _, err := NewStream(WorkloadConfig{Keys: 1e12, Sample: s}); !errors.Is(err, ErrSample) || errors.Is(err, ErrConfig) {
		t.Errorf("1e12 keys from 300 six-byte keys: %v, want ErrSample", err)
	}
	// A plan that cannot be calibrated from the sample says so by type.
	if err := (&WorkloadConfig{Sample: s, KeySize: 36}).Validate(); !errors.Is(err, ErrConfig) {
		t.Errorf("Validate: %v", err)
	}
}

// TestSampleEdgeConfigNaN: a NaN ratio is bad input like any other out
// of range, and fails with ErrConfig rather than giving a stream whose
// duplicate share is silently zero.
func TestSampleEdgeConfigNaN(t *testing.T) {
	s := edgeSample(t, "uuid7", edgeRecipes()[8].lines(rand.New(rand.NewPCG(1, 1))))
	for _, c := range []WorkloadConfig{
		{Keys: 1000, Sample: s, DupRatio: math.NaN()},
		{Keys: 1000, Sample: s, InBatchRepeat: math.NaN()},
		{Keys: 1000, Sample: s, Zipf: math.NaN()},
	} {
		if _, err := NewStream(c); !errors.Is(err, ErrConfig) {
			t.Errorf("NewStream(DupRatio %v, InBatchRepeat %v, Zipf %v): %v, want ErrConfig", c.DupRatio, c.InBatchRepeat, c.Zipf, err)
		}
	}
}

// TestSampleEdgeSequentialFromOne: the ID column of a young table,
// exported whole (1, 2, …, 300000: the doc's "a few hundred thousand
// lines"), sizes streams up to the keys its longest IDs hold (the short
// ones take the form of the next longer ones); a stream of more keys than
// six digits hold is refused with ErrSample naming the pattern: its keys
// would be longer than any in the sample.
func TestSampleEdgeSequentialFromOne(t *testing.T) {
	var b strings.Builder
	for i := 1; i <= 300_000; i++ {
		b.WriteString(strconv.Itoa(i))
		b.WriteByte('\n')
	}
	s, err := ReadSample(strings.NewReader(b.String()), "seq")
	if err != nil {
		t.Fatal(err)
	}
	for _, keys := range []int64{300_000, 300_001, 600_000} {
		_, err := NewStream(WorkloadConfig{Keys: keys, Sample: s, DupRatio: 0.1, Seed: 1})
		if err != nil {
			t.Errorf("%s, Keys %d: %v", s, keys, err)
		}
	}
	if _, err := NewStream(WorkloadConfig{Keys: 4_000_000, Sample: s, DupRatio: 0.1, Seed: 1}); !errors.Is(err, ErrSample) || !strings.Contains(err.Error(), `like "100000"`) {
		t.Errorf("%s, Keys 4000000: %v, want ErrSample naming the six-digit pattern", s, err)
	}
}

// TestSampleEdgeOutlierLine: one line that is not like the others (a
// CSV header, a test row) or a few NULLs as COPY writes them (\N) in an
// otherwise usable sample of 2000 UUIDv7s should not make every stream
// larger than the sample fail.
func TestSampleEdgeOutlierLine(t *testing.T) {
	uuids := edgeRecipes()[8].lines(rand.New(rand.NewPCG(4, 4)))
	for _, c := range []struct {
		name  string
		lines []string
	}{
		{"clean", uuids},
		{"csv-header", append([]string{"order_id"}, uuids...)},
		{"test-row", append(append(uuids[:1000:1000], "test"), uuids[1000:]...)},
		{"two-nulls", append(append(uuids[:1000:1000], `\N`), append(uuids[1000:1500:1500], append([]string{`\N`}, uuids[1500:]...)...)...)},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := edgeSample(t, c.name, c.lines)
			for _, keys := range []int64{1000, int64(s.Keys()) + 1, 10 * int64(s.Keys())} {
				if err := edgeCheckStream(t, WorkloadConfig{Keys: keys, Sample: s, Seed: 1}); err != nil {
					t.Errorf("%s, Keys %d: %v", s, keys, err)
				}
			}
		})
	}
}

// TestSampleEdgeUnwalkedPattern: a stream walks the sample in its order,
// each sample key giving the next few keys; a stream smaller than the
// sample never reaches its last keys, so a pattern found only there
// cannot be what makes it fail.
func TestSampleEdgeUnwalkedPattern(t *testing.T) {
	uuids := edgeRecipes()[8].lines(rand.New(rand.NewPCG(6, 6)))
	for _, c := range []struct {
		name string
		tail []string
	}{
		{"nulls-at-the-end", []string{`\N`, `\N`, `\N`}},
		{"one-digit-keys-at-the-end", strings.Split("1 2 3 4 5 6 7 8 9 1 2 3", " ")},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := edgeSample(t, c.name, append(slices.Clone(uuids), c.tail...))
			// 1000 messages, every one fresh: fresh indices 0-999 from
			// sample keys 0-999, all UUIDs.
			if err := edgeCheckStream(t, WorkloadConfig{Keys: 1000, Sample: s, Seed: 1}); err != nil {
				t.Errorf("%s, Keys 1000: %v", s, err)
			}
		})
	}
}

// TestSampleEdgeRandomSamples: many small random samples of random
// makes (short keys, few characters, punctuation, duplicates, sorted or
// not, several lengths) and random stream sizes: each source either
// fails with ErrSample or gives distinct keys over its whole range.
func TestSampleEdgeRandomSamples(t *testing.T) {
	r := rand.New(rand.NewPCG(2026, 12))
	alphabets := []string{"0123456789", "ab", "abc-", "01", edgeAlnum, edgeB64URL, "xyz.:", "\x00a\xff ", "0123456789abcdef"}
	built, refused := 0, 0
	for trial := range 1500 {
		n := 100 + r.IntN(300)
		var lines []string
		nAlpha := 1 + r.IntN(3)
		var alphas []string
		for range nAlpha {
			alphas = append(alphas, alphabets[r.IntN(len(alphabets))])
		}
		lens := []int{1 + r.IntN(8), 1 + r.IntN(8)}
		prefix := []string{"", "k-", "T:", "ord_"}[r.IntN(4)]
		dupShare := []float64{0, 0, 0.3, 0.9}[r.IntN(4)]
		for range n {
			if len(lines) > 0 && r.Float64() < dupShare {
				lines = append(lines, lines[r.IntN(len(lines))])
				continue
			}
			a := alphas[r.IntN(len(alphas))]
			lines = append(lines, prefix+edgeRand(r, a, lens[r.IntN(2)]))
		}
		if r.IntN(2) == 0 {
			slices.Sort(lines)
		}
		s, err := ReadSample(strings.NewReader(strings.Join(lines, "\n")), fmt.Sprint("trial", trial))
		if err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		limit := int64(1 + r.IntN(20_000))
		fresh := int64(r.IntN(int(limit) + 1))
		if err := edgeCheckSource(t, s, fresh, limit, r.Uint64()); err != nil {
			refused++
		} else {
			built++
		}
		if t.Failed() {
			t.Fatalf("trial %d: %s, alphabets %q, lengths %v, prefix %q, dups %.1f, stream %d/%d", trial, s, alphas, lens, prefix, dupShare, fresh, limit)
		}
	}
	t.Logf("%d sources built and checked, %d refused with ErrSample", built, refused)
	if built < 300 {
		t.Errorf("only %d of the random sources built", built)
	}
}
