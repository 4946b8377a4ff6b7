package bench

import (
	"errors"
	"slices"
	"testing"
	"time"
)

func TestStreamShapesRatiosAndReach(t *testing.T) {
	for _, shape := range []KeyShape{UUIDv4, UUIDv7, Snowflake, Business} {
		t.Run(shape.String(), func(t *testing.T) {
			c := WorkloadConfig{Keys: 200_000, Shape: shape, DupRatio: 0.2, InBatchRepeat: 0.02, DupReach: time.Hour, Span: 24 * time.Hour, Seed: 9}
			s, err := NewStream(c)
			if err != nil {
				t.Fatal(err)
			}
			firstSeen := map[string]int64{}
			var pos, repeats, inBatch int64
			var keys [][]byte
			var kinds []Kind
			maxBack := int64(0)
			for s.Len() > 0 {
				keys, kinds = s.Batch(keys, kinds, 256)
				for i, k := range keys {
					at, seen := firstSeen[string(k)]
					switch kinds[i] {
					case Fresh:
						if seen {
							t.Fatalf("fresh key %q was seen at %d", k, at)
						}
						firstSeen[string(k)] = pos
					case Repeat:
						repeats++
						if !seen {
							t.Fatalf("repeat %q was never seen", k)
						}
						maxBack = max(maxBack, pos-at)
					case InBatch:
						inBatch++
						if !slices.ContainsFunc(keys[:i], func(b []byte) bool { return string(b) == string(k) }) {
							t.Fatalf("in-batch repeat %q not in its batch", k)
						}
					}
					if shape == UUIDv4 || shape == UUIDv7 {
						if len(k) != 36 || k[14] != "47"[shape] {
							t.Fatalf("%s key %q", shape, k)
						}
					}
					pos++
				}
			}
			if r := float64(repeats) / float64(pos); r < 0.18 || r > 0.22 {
				t.Errorf("repeat share %.3f, want ≈ 0.2", r)
			}
			if r := float64(inBatch) / float64(pos); r < 0.015 || r > 0.025 {
				t.Errorf("in-batch share %.3f, want ≈ 0.02", r)
			}
			// One hour of a 200k/day stream is ≈ 8.3k messages.
			if maxBack > 10_000 || maxBack < 5_000 {
				t.Errorf("duplicates reach %d messages back, want ≈ 8300", maxBack)
			}
		})
	}
}

func TestStreamIsDeterministic(t *testing.T) {
	c := WorkloadConfig{Keys: 5000, DupRatio: 0.3, Zipf: 1.2, Seed: 4}
	a, _ := Generate(c)
	b, _ := Generate(c)
	for i := range a.Keys {
		if string(a.Keys[i]) != string(b.Keys[i]) {
			t.Fatalf("key %d differs between two generations", i)
		}
	}
}

func TestWorkloadConfigValidate(t *testing.T) {
	err := (&WorkloadConfig{Keys: -1, DupRatio: 1, InBatchRepeat: -1, Zipf: 0.5, Span: -1}).Validate()
	if !errors.Is(err, ErrConfig) {
		t.Fatal(err)
	}
	for _, f := range []string{"Keys", "DupRatio", "InBatchRepeat", "Zipf", "Span"} {
		if !contains(err.Error(), f) {
			t.Errorf("%v does not name %s", err, f)
		}
	}
	if _, err := ParseKeyShape("uuid9"); !errors.Is(err, ErrConfig) {
		t.Error(err)
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// TestKeySizePadsEveryShape checks that KeySize gives every key exactly
// that length, keeps distinct keys distinct and a repeat equal to its
// first occurrence, and that sizes a shape cannot reach are refused.
func TestKeySizePadsEveryShape(t *testing.T) {
	for _, shape := range []KeyShape{UUIDv4, UUIDv7, Snowflake, Business} {
		for _, size := range []int{shape.minSize(), 64, MaxKeySize} {
			c := WorkloadConfig{Keys: 20_000, Shape: shape, KeySize: size, DupRatio: 0.3, DupReach: time.Hour, Seed: 3}
			s, err := NewStream(c)
			if err != nil {
				t.Fatalf("%s/%d: %v", shape, size, err)
			}
			seen := map[string]bool{}
			var keys [][]byte
			var kinds []Kind
			for s.Len() > 0 {
				keys, kinds = s.Batch(keys, kinds, 256)
				for i, k := range keys {
					if len(k) != size {
						t.Fatalf("%s/%d: key %q has %d bytes", shape, size, k, len(k))
					}
					if (kinds[i] == Fresh) == seen[string(k)] {
						t.Fatalf("%s/%d: %v key %q seen before: %v", shape, size, kinds[i], k, seen[string(k)])
					}
					seen[string(k)] = true
				}
			}
		}
		for _, size := range []int{-1, shape.minSize() - 1, MaxKeySize + 1} {
			c := WorkloadConfig{Keys: 1, Shape: shape, KeySize: size}
			if _, err := NewStream(c); !errors.Is(err, ErrConfig) {
				t.Errorf("%s: KeySize %d accepted: %v", shape, size, err)
			}
		}
	}
}
