package bench

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/shard"
)

// ErrConfig reports an invalid WorkloadConfig.
var ErrConfig = errors.New("bench: invalid workload config")

// KeyShape is the form of message keys.
type KeyShape uint8

// Key shapes seen in message brokers.
const (
	// UUIDv4 is a random UUID in its 36-byte text form.
	UUIDv4 KeyShape = iota
	// UUIDv7 is a time-ordered UUID (48-bit millisecond prefix), 36 bytes.
	UUIDv7
	// Snowflake is a 64-bit time-ordered numeric ID in decimal, ≈ 19 bytes.
	Snowflake
	// Business is a business key such as "order:12345678".
	Business
)

var shapeNames = [...]string{"uuid4", "uuid7", "snowflake", "business"}

// String returns the shape's flag name.
func (s KeyShape) String() string {
	if int(s) < len(shapeNames) {
		return shapeNames[s]
	}
	return "KeyShape(" + strconv.Itoa(int(s)) + ")"
}

// ParseKeyShape parses a KeyShape name.
func ParseKeyShape(s string) (KeyShape, error) {
	for i, n := range shapeNames {
		if n == s {
			return KeyShape(i), nil
		}
	}
	return 0, fmt.Errorf("%w: key shape %q (want uuid4, uuid7, snowflake or business)", ErrConfig, s)
}

// MaxKeySize is the longest key a workload generates: the engine's limit.
const MaxKeySize = engine.DefaultMaxKeySize

// minSize is the length KeySize must reach for every key of the shape
// to fit: a business key of a 64-bit index takes 6+19 bytes.
func (s KeyShape) minSize() int {
	switch s {
	case Snowflake:
		return 20
	case Business:
		return 26
	default:
		return 36
	}
}

// WorkloadConfig describes a stream of message keys over simulated time.
type WorkloadConfig struct {
	// Keys is the number of messages in the stream.
	Keys int64
	// Shape is the key form.
	Shape KeyShape
	// KeySize, if not zero, is every key's length in bytes, at least the
	// shape's own (MaxKeySize at most), padded with varied characters that
	// the store cannot compress away: after a business key's number
	// ("order:12345/k3v…"), before the other shapes' own form. Zero leaves
	// each shape its natural length (36 for UUIDs, ≈ 19 for snowflakes,
	// 7–15 for business keys).
	KeySize int
	// DupRatio is the share of messages that repeat an earlier key, [0, 1).
	DupRatio float64
	// DupReach is how far back in simulated time a duplicate reaches,
	// uniformly (or Zipf-skewed towards recent keys with Zipf > 1): a few
	// seconds models producer retries and redeliveries, hours a replayed
	// partition, days a reprocessed backlog. Zero means 10 seconds.
	DupReach time.Duration
	// Zipf > 1 skews duplicates towards the most recent keys with that
	// exponent (hot keys); 0 means uniform.
	Zipf float64
	// InBatchRepeat is the share of messages that repeat a key of the same
	// batch (a producer retry landing in one poll), [0, 1).
	InBatchRepeat float64
	// Span is the simulated time the stream covers; zero means one day.
	Span time.Duration
	// Seed makes the stream reproducible.
	Seed uint64
	// Sample, if set, replaces Shape and KeySize: fresh keys are
	// synthesised from the sample's model of the user's keys (see
	// Sample), the stream walking the sample in its order.
	Sample *Sample
	// Source, if set, replaces Shape, KeySize and Sample: the key of
	// fresh index i is Source.AppendKey(dst, i) (a generator of the
	// user's own).
	Source KeySource `json:"-"`
}

// KeysName names the keys of c for reports: the shape, the sample or
// "custom".
func (c WorkloadConfig) KeysName() string {
	switch {
	case c.Source != nil:
		return "custom"
	case c.Sample != nil:
		return c.Sample.String()
	}
	return c.Shape.String()
}

// Validate reports every invalid field at once.
func (c *WorkloadConfig) Validate() error {
	var errs []error
	if c.Keys < 0 {
		errs = append(errs, fmt.Errorf("%w: Keys %d is negative", ErrConfig, c.Keys))
	}
	if c.Shape > Business {
		errs = append(errs, fmt.Errorf("%w: Shape %d", ErrConfig, c.Shape))
	}
	if !(c.DupRatio >= 0 && c.DupRatio < 1) {
		errs = append(errs, fmt.Errorf("%w: DupRatio %v outside [0, 1)", ErrConfig, c.DupRatio))
	}
	if !(c.InBatchRepeat >= 0 && c.InBatchRepeat < 1) {
		errs = append(errs, fmt.Errorf("%w: InBatchRepeat %v outside [0, 1)", ErrConfig, c.InBatchRepeat))
	}
	if c.DupReach < 0 || c.Span < 0 {
		errs = append(errs, fmt.Errorf("%w: DupReach %v and Span %v must not be negative", ErrConfig, c.DupReach, c.Span))
	}
	if (c.Sample != nil || c.Source != nil) && c.KeySize != 0 {
		errs = append(errs, fmt.Errorf("%w: KeySize %d with a Sample or Source, whose keys have their own lengths", ErrConfig, c.KeySize))
	}
	if c.Sample != nil && c.Source != nil {
		errs = append(errs, fmt.Errorf("%w: both a Sample and a Source", ErrConfig))
	}
	if c.KeySize < 0 || c.KeySize > MaxKeySize || c.KeySize > 0 && c.KeySize < c.Shape.minSize() {
		errs = append(errs, fmt.Errorf("%w: KeySize %d outside [%d, %d] for %s keys", ErrConfig, c.KeySize, c.Shape.minSize(), MaxKeySize, c.Shape))
	}
	if c.Zipf != 0 && !(c.Zipf > 1) {
		errs = append(errs, fmt.Errorf("%w: Zipf %v must be 0 or above 1", ErrConfig, c.Zipf))
	}
	return errors.Join(errs...)
}

// Stream produces the configured messages in order. Key i of the stream is
// a pure function of the seed and the index of the fresh key it names, so a
// duplicate days back costs no memory: it is recomputed. A Stream is used by
// one goroutine; Split gives each worker its own.
type Stream struct {
	c       WorkloadConfig
	rng     *rand.Rand
	zipf    *rand.Zipf
	next    int64 // messages produced
	fresh   int64 // fresh keys produced
	step    time.Duration
	perStep float64 // fresh keys per nanosecond of simulated time
	start   time.Time
	src     KeySource // Source, or the Sample's; nil: Shape and KeySize
}

// Start is the simulated time of the first message.
var Start = time.Date(2026, 1, 5, 0, 0, 0, 0, time.UTC)

// NewStream returns the stream for c.
func NewStream(c WorkloadConfig) (*Stream, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if c.DupReach == 0 {
		c.DupReach = 10 * time.Second
	}
	if c.Span == 0 {
		c.Span = 24 * time.Hour
	}
	s := &Stream{c: c, rng: rand.New(rand.NewPCG(c.Seed, 0x5eed)), start: Start}
	if c.Keys > 0 {
		s.step = c.Span / time.Duration(c.Keys)
		s.perStep = float64(c.Keys) * (1 - c.DupRatio) / float64(c.Span)
	}
	if c.Zipf > 1 {
		s.zipf = rand.NewZipf(s.rng, c.Zipf, 1, 1<<40)
	}
	s.src = c.Source
	if c.Sample != nil && c.Source == nil {
		fresh := float64(c.Keys) * (1 - c.DupRatio - c.InBatchRepeat)
		src, err := c.Sample.source(int64(fresh), c.Keys, c.Seed)
		if err != nil {
			return nil, err
		}
		s.src = src
	}
	return s, nil
}

// Config returns the stream's configuration with defaults applied.
func (s *Stream) Config() WorkloadConfig { return s.c }

// Len returns the number of messages left.
func (s *Stream) Len() int64 { return s.c.Keys - s.next }

// Now returns the simulated time of the next message.
func (s *Stream) Now() time.Time { return s.start.Add(time.Duration(s.next) * s.step) }

// Kind says why a message's key is what it is.
type Kind uint8

// Kinds of message.
const (
	Fresh   Kind = iota // a key never seen before
	Repeat              // a duplicate of an earlier message
	InBatch             // a repeat of a key earlier in the same batch
)

// Batch appends up to n messages' keys to dst (reusing its buffers) and
// their kinds to kinds, and returns both. It returns fewer at the end.
func (s *Stream) Batch(dst [][]byte, kinds []Kind, n int) ([][]byte, []Kind) {
	dst, kinds, _ = s.IndexedBatch(dst, kinds, nil, n)
	return dst, kinds
}

// IndexedBatch is Batch that also appends, for each message, the index of
// the fresh key it carries (0 for the first fresh key of the stream, and
// so on): the ground truth a run checks each answer against.
func (s *Stream) IndexedBatch(dst [][]byte, kinds []Kind, idx []int64, n int) ([][]byte, []Kind, []int64) {
	dst, kinds, idx = dst[:0], kinds[:0], idx[:0]
	for len(dst) < n && s.next < s.c.Keys {
		var key []byte
		if cap(dst) > len(dst) {
			key = dst[:len(dst)+1][len(dst)][:0]
		}
		kind := Fresh
		var i int64
		switch r := s.rng.Float64(); {
		case len(dst) > 0 && r < s.c.InBatchRepeat:
			j := s.rng.IntN(len(dst))
			key = append(key, dst[j]...)
			kind = InBatch
			if idx != nil {
				i = idx[j]
			}
		case s.fresh > 0 && r < s.c.InBatchRepeat+s.c.DupRatio:
			i = s.earlier()
			key = s.appendKey(key, i)
			kind = Repeat
		default:
			i = s.fresh
			key = s.appendKey(key, s.fresh)
			s.fresh++
		}
		dst = append(dst, key)
		kinds = append(kinds, kind)
		if idx != nil {
			idx = append(idx, i)
		}
		s.next++
	}
	return dst, kinds, idx
}

// earlier picks the fresh index a duplicate repeats: within DupReach of
// simulated time back, uniformly or Zipf-skewed to the most recent.
func (s *Stream) earlier() int64 {
	reach := int64(float64(s.c.DupReach) * s.perStep)
	reach = max(1, min(reach, s.fresh))
	var back int64
	if s.zipf != nil {
		back = int64(s.zipf.Uint64()) % reach
	} else {
		back = s.rng.Int64N(reach)
	}
	return s.fresh - 1 - back
}

// padAlphabet is what pads keys to WorkloadConfig.KeySize: varied
// characters, as real long keys carry (tenants, types, random suffixes),
// so the store cannot compress the padding away.
const padAlphabet = "abcdefghijklmnopqrstuvwxyz234567"

// appendKey appends the key of fresh index i, padded to KeySize: business
// keys after their number ("order:123/k3v…"), other shapes before their
// own form. The padding is a function of i, so a duplicate repeats it.
func (s *Stream) appendKey(dst []byte, i int64) []byte {
	if s.src != nil {
		return s.src.AppendKey(dst, i)
	}
	if s.c.KeySize == 0 {
		return s.appendShaped(dst, i)
	}
	var buf [36]byte
	k := s.appendShaped(buf[:0], i)
	if s.c.Shape == Business {
		dst = append(append(dst, k...), '/')
		return s.appendPad(dst, i, s.c.KeySize-len(k)-1)
	}
	dst = s.appendPad(dst, i, s.c.KeySize-len(k))
	return append(dst, k...)
}

// appendPad appends n padding characters drawn from fresh index i.
func (s *Stream) appendPad(dst []byte, i int64, n int) []byte {
	h := uint64(i) ^ s.c.Seed*0x9e3779b97f4a7c15 ^ 0x7061646469676e67
	for j := 0; j < n; j++ {
		if j%12 == 0 {
			h = shard.Mix(h + 1)
		}
		dst = append(dst, padAlphabet[(h>>(5*(j%12)))&31])
	}
	return dst
}

// appendShaped appends the key of fresh index i in its shape's own length.
func (s *Stream) appendShaped(dst []byte, i int64) []byte {
	h := shard.Mix(uint64(i) ^ s.c.Seed*0x9e3779b97f4a7c15) // bijective: distinct indices, distinct keys
	t := s.start.Add(time.Duration(float64(i) / max(s.perStep, 1e-300)))
	switch s.c.Shape {
	case UUIDv7:
		var u [16]byte
		binary.BigEndian.PutUint64(u[:8], uint64(t.UnixMilli())<<16|h&0xffff)
		binary.BigEndian.PutUint64(u[8:], shard.Mix(h))
		u[6] = u[6]&0x0f | 0x70
		u[8] = u[8]&0x3f | 0x80
		return appendUUID(dst, u)
	case Snowflake:
		// 41 bits of milliseconds, 10 of worker, 12 of sequence.
		id := uint64(t.UnixMilli()-1288834974657)<<22 | (h & (1<<22 - 1))
		return strconv.AppendUint(dst, id, 10)
	case Business:
		return strconv.AppendInt(append(dst, "order:"...), i, 10)
	default:
		var u [16]byte
		binary.LittleEndian.PutUint64(u[:8], h)
		binary.LittleEndian.PutUint64(u[8:], shard.Mix(h^0xa5a5a5a5))
		u[6] = u[6]&0x0f | 0x40
		u[8] = u[8]&0x3f | 0x80
		return appendUUID(dst, u)
	}
}

func appendUUID(dst []byte, u [16]byte) []byte {
	var s [36]byte
	hex.Encode(s[0:8], u[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], u[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], u[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], u[8:10])
	s[23] = '-'
	hex.Encode(s[24:36], u[10:16])
	return append(dst, s[:]...)
}

// Workload is a pre-generated key stream, for go test benchmarks that must
// generate their keys before the timer.
type Workload struct {
	Keys [][]byte
	// Dups is the number of keys that repeat an earlier one.
	Dups int
}

// Generate pre-generates the first c.Keys messages of c's stream. A
// 10M-key UUID stream costs ≈ 600 MB (36 B of key and a 24 B slice header
// each).
func Generate(c WorkloadConfig) (*Workload, error) {
	s, err := NewStream(c)
	if err != nil {
		return nil, err
	}
	w := &Workload{Keys: make([][]byte, 0, c.Keys)}
	var batch [][]byte
	var kinds []Kind
	for s.Len() > 0 {
		batch, kinds = s.Batch(batch[:0], kinds, 4096)
		for i, k := range batch {
			w.Keys = append(w.Keys, append([]byte(nil), k...))
			if kinds[i] != Fresh {
				w.Dups++
			}
		}
	}
	return w, nil
}
