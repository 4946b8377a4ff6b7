package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"os"
	"slices"
	"sort"

	"github.com/tierdedup/tierdedup/shard"
)

// ErrSample reports a key sample that cannot model a workload: too few
// keys, a key longer than MaxKeySize, or a stream that needs more distinct
// keys than keys like the sample's can hold.
var ErrSample = errors.New("bench: unusable key sample")

// Sample sizes.
const (
	// MaxSampleKeys is the most keys a sample keeps; lines beyond are not
	// read. A few hundred thousand keys show a key format's structure.
	MaxSampleKeys = 1 << 20
	// MinSampleKeys is the fewest keys a sample must hold.
	MinSampleKeys = 100
)

// Sample is a model of a user's own keys, learnt from a sample of them in
// the order they arrived (one per line: an export of the ID column of the
// table a dedup table guards, oldest first). A WorkloadConfig or PlanInput
// with a Sample draws its keys from it, so a run or a plan measures keys
// that look like the user's: their lengths, the characters each position
// holds, the parts that stay alike from key to key (tenants, types, the
// leading digits of a time) and those that vary (sequence numbers, random
// suffixes), in the sample's order. Those decide the store's bytes per key
// (prefix compression and block compression) and its rate (how ordered the
// writes are); the Bloom filters and the memory tier see fingerprints only.
//
// The model groups keys by pattern: their length and where their
// punctuation lies (bytes other than ASCII letters and digits). Within a
// pattern, each position of an alphanumeric run is either kept or
// synthesised. A position is kept when it is the same in every key, when
// its run takes few values (an enumeration: at most one distinct value in
// eight keys), or when it changes from one key to the next less than half
// as often as random characters with its frequencies would (it follows
// time or a counter's high digits). The others are synthesised.
//
// A synthesised key starts from a sample key (the stream walks the sample
// in its order, each sample key giving the next few keys) and draws its
// synthesised positions anew: enough of them to keep keys distinct encode
// a permutation of a counter over the characters each position was seen
// to hold; the rest are drawn from their position's frequencies. Distinct
// fresh indices give distinct keys (the counter is unique among the keys
// sharing the kept positions). Keys are not the sample's own, except where
// the sample is as dense as the stream (a counter exported whole, walked
// at one key a sample key: its values are the only ones in order). When a
// pattern's synthesised positions cannot hold the keys a stream needs,
// kept positions are synthesised too, the least significant first, and
// positions of digits widened to all ten. A pattern that still cannot
// (the short IDs at the start of a young table, a header line, a NULL
// exported as \N) lends its sample keys to the nearest later pattern that
// can. A stream needing more keys than every pattern can give fails with
// ErrSample.
type Sample struct {
	// Name is where the sample came from (a file name, or "-").
	Name string
	// Truncated says the input held more than MaxSampleKeys lines.
	Truncated bool

	arena  []byte
	offs   []uint32 // key p is arena[offs[p]:offs[p+1]]
	group  []uint32 // pattern of key p
	groups []*sampleGroup
}

// sampleGroup is one pattern of a sample: keys of one length and one
// punctuation.
type sampleGroup struct {
	length  int
	members []uint32 // sample keys of the pattern, in order
	pos     []posModel
	tokens  [][2]int // alphanumeric runs [start, end)
	ordered bool     // its keys arrive in ascending order (≥ 90 % of them)
}

// posModel is what a pattern's keys hold at one position.
type posModel struct {
	alphabet []byte   // characters seen, ascending
	cum      []uint32 // cumulative counts, parallel to alphabet
	entropy  float64  // bits
	token    int      // alphanumeric run; -1 for punctuation
	enum     bool     // in a run of few values
	kept     bool     // initial classification: kept from the sample key
}

func isAlnum(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// LoadSample reads a sample from a file, or from standard input for "-".
func LoadSample(path string) (*Sample, error) {
	if path == "-" {
		return ReadSample(os.Stdin, "-")
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSample, err)
	}
	defer f.Close()
	return ReadSample(f, path)
}

// ReadSample reads one key per line from r (a trailing "\r" is dropped,
// empty lines skipped), at most MaxSampleKeys, and learns their model.
func ReadSample(r io.Reader, name string) (*Sample, error) {
	s := &Sample{Name: name, offs: []uint32{0}}
	br := bufio.NewReaderSize(r, 64<<10)
	for line := 1; ; line++ {
		b, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, fmt.Errorf("%w: %s line %d is longer than %d bytes", ErrSample, name, line, MaxKeySize)
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: %s: %w", ErrSample, name, err)
		}
		k := bytes.TrimSuffix(bytes.TrimSuffix(b, []byte("\n")), []byte("\r"))
		switch {
		case len(k) > MaxKeySize:
			return nil, fmt.Errorf("%w: %s line %d: a key of %d bytes (at most %d)", ErrSample, name, line, len(k), MaxKeySize)
		case len(k) > 0 && len(s.offs) > MaxSampleKeys:
			s.Truncated = true
		case len(k) > 0:
			s.arena = append(s.arena, k...)
			s.offs = append(s.offs, uint32(len(s.arena)))
		}
		if err != nil || s.Truncated {
			break
		}
	}
	n := len(s.offs) - 1
	if n < MinSampleKeys {
		return nil, fmt.Errorf("%w: %s holds %d keys (at least %d)", ErrSample, name, n, MinSampleKeys)
	}
	s.learn()
	return s, nil
}

// Keys returns the number of keys the sample holds.
func (s *Sample) Keys() int { return len(s.offs) - 1 }

// MeanKeySize returns the sample's mean key length.
func (s *Sample) MeanKeySize() float64 { return float64(len(s.arena)) / float64(s.Keys()) }

// Patterns returns the number of patterns the model found.
func (s *Sample) Patterns() int { return len(s.groups) }

// String describes the sample for reports.
func (s *Sample) String() string {
	plural := "s"
	if len(s.groups) == 1 {
		plural = ""
	}
	first := ""
	if s.Truncated {
		first = "the first "
	}
	return fmt.Sprintf("%s-like (%s%d sampled, %d pattern%s)", s.Name, first, s.Keys(), len(s.groups), plural)
}

// MarshalJSON describes the sample, not its keys.
func (s *Sample) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Name      string
		Keys      int
		MeanBytes float64
		Patterns  int
		Truncated bool
	}{s.Name, s.Keys(), s.MeanKeySize(), len(s.groups), s.Truncated})
}

func (s *Sample) key(p int) []byte { return s.arena[s.offs[p]:s.offs[p+1]] }

// learn groups the keys by pattern and models each position. Keys whose
// punctuation varies at random (base64, say) would give a pattern each:
// when patterns of fewer than 16 keys hold over 5 % of the sample, keys
// are grouped by length alone and every position is modelled alike.
func (s *Sample) learn() {
	n := s.Keys()
	sig := func(k []byte, punct bool) string {
		b := make([]byte, len(k)) // its length is the key's
		for i, c := range k {
			if punct && !isAlnum(c) {
				b[i] = c
			}
		}
		return string(b)
	}
	for _, punct := range []bool{true, false} {
		idx := map[string]int{}
		s.groups, s.group = s.groups[:0], make([]uint32, n)
		for p := range n {
			k := sig(s.key(p), punct)
			g, ok := idx[k]
			if !ok {
				g = len(s.groups)
				idx[k] = g
				s.groups = append(s.groups, &sampleGroup{length: len(s.key(p))})
			}
			s.group[p] = uint32(g)
			s.groups[g].members = append(s.groups[g].members, uint32(p))
		}
		small := 0
		for _, g := range s.groups {
			if len(g.members) < 16 {
				small += len(g.members)
			}
		}
		if !punct || small*20 <= n {
			for _, g := range s.groups {
				s.model(g, punct)
			}
			return
		}
	}
}

// model learns one pattern's positions.
func (s *Sample) model(g *sampleGroup, punct bool) {
	L := g.length
	g.pos = make([]posModel, L)
	first := s.key(int(g.members[0]))
	for i := 0; i < L; {
		if punct && !isAlnum(first[i]) {
			g.pos[i].token = -1
			i++
			continue
		}
		j := i
		for j < L && (!punct || isAlnum(first[j])) {
			g.pos[j].token = len(g.tokens)
			j++
		}
		g.tokens = append(g.tokens, [2]int{i, j})
		i = j
	}
	counts := make([][256]uint32, L)
	changes := make([]uint32, L)
	var prev []byte
	ascending := 0
	for _, m := range g.members {
		k := s.key(int(m))
		for i, c := range k {
			counts[i][c]++
			if prev != nil && prev[i] != c {
				changes[i]++
			}
		}
		if prev != nil && bytes.Compare(prev, k) <= 0 {
			ascending++
		}
		prev = k
	}
	g.ordered = len(g.members) > 1 && float64(ascending) >= 0.9*float64(len(g.members)-1)
	nm := float64(len(g.members))
	// slow: the position changes from key to key less than half as often
	// as random characters of its frequencies would (1 - Σ q²).
	slow := make([]bool, L)
	for i := range g.pos {
		pm := &g.pos[i]
		var sum uint32
		var sq float64
		for c := range 256 {
			if counts[i][c] > 0 {
				sum += counts[i][c]
				pm.alphabet = append(pm.alphabet, byte(c))
				pm.cum = append(pm.cum, sum)
				q := float64(counts[i][c]) / nm
				sq += q * q
				pm.entropy -= q * math.Log2(q)
			}
		}
		slow[i] = len(g.members) > 1 && float64(changes[i])/(nm-1) < 0.5*(1-sq)
	}
	for _, tok := range g.tokens {
		distinct := map[string]struct{}{}
		for _, m := range g.members {
			distinct[string(s.key(int(m))[tok[0]:tok[1]])] = struct{}{}
			if len(distinct)*8 > len(g.members) {
				break
			}
		}
		enum := len(distinct)*8 <= len(g.members)
		for i := tok[0]; i < tok[1]; i++ {
			g.pos[i].enum = enum
		}
	}
	for i := range g.pos {
		pm := &g.pos[i]
		pm.kept = pm.token < 0 || len(pm.alphabet) == 1 || pm.enum || slow[i]
	}
}

// KeySource makes a stream's fresh keys: the key of fresh index i (0 for
// the stream's first fresh key, and so on). Distinct indices must give
// distinct keys, and one index the same key each time: a duplicate is
// recomputed from its index. A KeySource is used by one goroutine.
type KeySource interface {
	AppendKey(dst []byte, i int64) []byte
}

// sampleSource is a Sample's KeySource for one stream: m fresh keys per
// sample key, the sample walked cycles times at most.
type sampleSource struct {
	s      *Sample
	m      uint64
	groups []groupSource
	host   []uint32 // the sample key whose form key p's keys take: p, or one of a pattern that can give them
	rank   []uint32 // key p's rank among the visits of its host's pattern with the same kept positions
	count  []uint32 // how many visits of its host's pattern share them
	salt   uint64
}

// groupSource is a pattern's synthesis for one stream.
type groupSource struct {
	alphabet [][]byte    // per position: the sample's, or all ten digits (demote)
	carriers []int       // positions encoding the counter, least significant first
	others   []int       // synthesised positions drawn from their frequencies
	draws    [][256]byte // per other position: a byte of randomness to its character
	capacity uint64      // product of the carriers' alphabet sizes
	ordered  bool        // spread the counter in order (stride) instead of permuting it
	offset   uint64      // where the ordered counter starts: the seed\'s, within the slack
	stride   uint64
	bits     uint // of the permutation's domain, a power of two ≥ capacity
	mul, add uint64
}

// source returns the KeySource of a stream expected to take fresh fresh
// keys and at most limit. A pattern too small for the keys its sample
// keys must give (the single-digit IDs at the start of a young table, a
// header line, a NULL written as \N) gives none: its sample keys take the
// form of the nearest later sample key of a pattern that can, as they
// would in a table that grew to the stream's size.
func (s *Sample) source(fresh, limit int64, seed uint64) (*sampleSource, error) {
	n := uint64(s.Keys())
	fresh, limit = max(fresh, 1), max(limit, fresh, 1)
	src := &sampleSource{s: s, m: (uint64(fresh) + n - 1) / n, rank: make([]uint32, n), count: make([]uint32, n),
		host: make([]uint32, n), salt: shard.Mix(seed ^ 0x73616d706c65)}
	cycles := (uint64(limit) + n*src.m - 1) / (n * src.m)
	walked := n // the sample keys the stream reaches
	if cycles == 1 {
		walked = min(n, (uint64(limit)+src.m-1)/src.m)
	}
	for p := range src.host {
		src.host[p] = uint32(p)
	}
	src.groups = make([]groupSource, len(s.groups))
	failed, dirty := make([]bool, len(s.groups)), make([]bool, len(s.groups))
	for g := range dirty {
		dirty[g] = true
	}
	for {
		visits := make([][]uint32, len(s.groups))
		for p := range src.host {
			g := s.group[src.host[p]]
			visits[g] = append(visits[g], uint32(p))
		}
		more := false
		for g := range s.groups {
			if dirty[g] && !failed[g] && !src.fit(g, visits[g], walked, cycles, uint64(limit), seed) {
				failed[g], more = true, true
			}
			dirty[g] = false
		}
		if !more {
			return src, nil
		}
		// The failed patterns' sample keys to the nearest later key of a
		// pattern that has not failed, wrapping round.
		next := -1
		for q := 2*int(n) - 1; q >= 0; q-- {
			p := q % int(n)
			if !failed[s.group[p]] {
				next = p
			}
			if q < int(n) && failed[s.group[src.host[p]]] {
				if next < 0 {
					big := s.groups[0]
					for _, g := range s.groups {
						if len(g.members) > len(big.members) {
							big = g
						}
					}
					return nil, fmt.Errorf("%w: no pattern of the sample can give the keys a stream of %d fresh keys needs (the largest: %d keys of %d bytes like %q)",
						ErrSample, limit, len(big.members), big.length, s.key(int(big.members[0])))
				}
				src.host[p] = uint32(next)
				dirty[s.group[next]] = true
			}
		}
	}
}

// fit sets up pattern g for the sample keys whose keys it gives (visits,
// in order), synthesising or widening kept positions until they can give
// distinct keys. It reports false if they cannot.
func (src *sampleSource) fit(g int, visits []uint32, walked, cycles, limit, seed uint64) bool {
	pat, gs := src.s.groups[g], &src.groups[g]
	gs.alphabet = make([][]byte, pat.length)
	kept := make([]bool, pat.length)
	for i := range pat.pos {
		kept[i], gs.alphabet[i] = pat.pos[i].kept, pat.pos[i].alphabet
	}
	for {
		need := src.rankKept(pat, visits, kept, walked, cycles)
		if gs.choose(pat, kept, min(need, limit), seed^uint64(g)) {
			return true
		}
		if !gs.demote(pat, kept) {
			return false
		}
	}
}

// rankKept sets, for each visit of pat, its rank and count among the
// visits whose keys share the kept positions, and returns the values the
// synthesised positions must hold: the most visits of one kept value the
// stream reaches, times the keys each gives.
func (src *sampleSource) rankKept(pat *sampleGroup, visits []uint32, kept []bool, walked, cycles uint64) uint64 {
	seen := map[string]uint32{}
	buf := make([]byte, 0, pat.length)
	keptOf := func(v uint32) []byte {
		buf = buf[:0]
		for i, c := range src.s.key(int(src.host[v])) {
			if kept[i] {
				buf = append(buf, c)
			}
		}
		return buf
	}
	var most uint32
	for _, v := range visits {
		k := keptOf(v)
		src.rank[v] = seen[string(k)]
		seen[string(k)]++
		if uint64(v) < walked {
			most = max(most, seen[string(k)]) // visits are in order: those reached come first
		}
	}
	for _, v := range visits {
		src.count[v] = seen[string(keptOf(v))]
	}
	return satMul(satMul(uint64(most), src.m), cycles)
}

// demote synthesises one more kept position of g, or widens one: the
// last position of a run that follows time or a counter, else the last
// run of an enumeration (all of it), else the last position of digits
// that has not held all ten (a counter beyond the sample's values). It
// reports false when none is left that could add a value.
func (gs *groupSource) demote(g *sampleGroup, kept []bool) bool {
	for i := g.length - 1; i >= 0; i-- {
		if pm := g.pos[i]; kept[i] && pm.token >= 0 && !pm.enum && len(gs.alphabet[i]) > 1 {
			kept[i] = false
			return true
		}
	}
	for t := len(g.tokens) - 1; t >= 0; t-- {
		tok, any := g.tokens[t], false
		for i := tok[0]; i < tok[1]; i++ {
			if kept[i] && len(gs.alphabet[i]) > 1 {
				kept[i], any = false, true
			}
		}
		if any {
			return true
		}
	}
	for i := g.length - 1; i >= 0; i-- {
		a := gs.alphabet[i]
		if g.pos[i].token >= 0 && len(a) < 10 && a[0] >= '0' && a[len(a)-1] <= '9' {
			gs.alphabet[i], kept[i] = []byte(digits), false
			return true
		}
	}
	return false
}

const digits = "0123456789"

// choose picks g's carriers among its synthesised positions until their
// alphabets hold need values: the most varied first, or, for a pattern
// whose keys arrive in order, from the last position leftwards and as
// many as 63 bits hold, so that the counter's values, spread over them
// (stride), keep the keys in order. The others are drawn from their
// frequencies. It reports false if all of them together hold fewer than
// need.
func (gs *groupSource) choose(g *sampleGroup, kept []bool, need uint64, seed uint64) bool {
	var fast []int
	for i := len(g.pos) - 1; i >= 0; i-- {
		if !kept[i] {
			fast = append(fast, i)
		}
	}
	if !g.ordered {
		sort.SliceStable(fast, func(a, b int) bool { return g.pos[fast[a]].entropy > g.pos[fast[b]].entropy })
	}
	gs.carriers, gs.others, gs.capacity = gs.carriers[:0], gs.others[:0], 1
	for _, i := range fast {
		a := uint64(len(gs.alphabet[i]))
		widened := len(gs.alphabet[i]) != len(g.pos[i].alphabet)
		if !widened && (!g.ordered && gs.capacity >= need || g.ordered && gs.capacity > 1<<63/a) {
			gs.others = append(gs.others, i) // drawn from the sample's frequencies
			continue
		}
		gs.carriers = append(gs.carriers, i)
		gs.capacity = satMul(gs.capacity, a)
	}
	if gs.capacity < need {
		return false
	}
	slices.Sort(gs.others)
	gs.draws = make([][256]byte, len(gs.others))
	for d, i := range gs.others {
		pm := &g.pos[i]
		total := uint64(pm.cum[len(pm.cum)-1])
		for b := range 256 {
			v := uint32(uint64(2*b+1) * total / 512) // the middle of the byte's share
			gs.draws[d][b] = pm.alphabet[sort.Search(len(pm.cum), func(j int) bool { return pm.cum[j] > v })]
		}
	}
	need = max(need, 1)
	gs.ordered, gs.stride = g.ordered, max(1, gs.capacity/need)
	if slack := gs.capacity - need*gs.stride; slack > 0 {
		gs.offset = shard.Mix(seed^0x6f6666) % slack
	}
	gs.bits = uint(bits.Len64(gs.capacity - 1))
	gs.mul = shard.Mix(seed^0x6d756c)*2 + 1
	gs.add = shard.Mix(seed ^ 0x616464)
	return true
}

func satMul(a, b uint64) uint64 {
	if hi, lo := bits.Mul64(a, b); hi == 0 {
		return lo
	}
	return math.MaxUint64
}

// permute is a bijection of [0, capacity): a mix of the power-of-two
// domain above it, walked until it falls inside.
func (gs *groupSource) permute(x uint64) uint64 {
	if gs.bits == 0 {
		return 0
	}
	mask := uint64(1)<<gs.bits - 1
	sh := gs.bits/2 + 1
	for {
		x = (x*gs.mul + gs.add) & mask
		x ^= x >> sh
		x = (x * 0xbf58476d1ce4e5b9) & mask
		x ^= x >> sh
		x = (x * 0x94d049bb133111eb) & mask
		x ^= x >> sh
		x = (x * 0xd6e8feb86659fd93) & mask
		x ^= x >> sh
		if x < gs.capacity {
			return x
		}
	}
}

// AppendKey appends the key of fresh index i.
func (src *sampleSource) AppendKey(dst []byte, i int64) []byte {
	n := uint64(src.s.Keys())
	t := uint64(i) / src.m
	r := uint64(i) % src.m
	cycle, p := t/n, t%n
	host := int(src.host[p])
	gs := &src.groups[src.s.group[host]]
	start := len(dst)
	dst = append(dst, src.s.key(host)...)
	out := dst[start:]
	h := shard.Mix(uint64(i) ^ src.salt)
	x := (cycle*uint64(src.count[p])+uint64(src.rank[p]))*src.m + r
	if gs.ordered {
		x = x*gs.stride + h%gs.stride + gs.offset
	} else {
		x = gs.permute(x)
	}
	for _, pos := range gs.carriers {
		a := gs.alphabet[pos]
		out[pos] = a[x%uint64(len(a))]
		x /= uint64(len(a))
	}
	for d, pos := range gs.others {
		if d%8 == 0 {
			h = shard.Mix(h + uint64(d))
		}
		out[pos] = gs.draws[d][byte(h>>(8*(d%8)))]
	}
	return dst
}
