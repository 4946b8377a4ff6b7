package bench_test

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// BenchmarkOperator measures the operator calls in the default
// configuration, b.N random 32-byte keys each: Advance (batches of 256
// distinct entities, each advanced from nothing and committed), Lookup
// and Forget (batches of 256 committed keys) and one-time tokens (issue
// then consume, one at a time: two synced writes a token). It reports keys
// (or tokens) per second, and for Advance the store's bytes per entity
// after a full compaction.
func BenchmarkOperator(b *testing.B) {
	ctx := context.Background()
	open := func(b *testing.B) *engine.Engine {
		e, err := engine.Open(&engine.Options{Backend: embedded.Dir(b.TempDir()), ExpectedKeys: max(b.N, 1000), Logger: quietEngine})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { e.Close() })
		return e
	}
	b.Run("advance", func(b *testing.B) {
		e := open(b)
		ks := distinct(b.N)
		versions := make([]uint64, 256)
		claims := make([]engine.Claim, 256)
		for i := range versions {
			versions[i] = uint64(1 + i%5)
		}
		b.ResetTimer()
		t0 := time.Now()
		for i := 0; i < len(ks); i += 256 {
			batch := ks[i:min(i+256, len(ks))]
			out := claims[:len(batch)]
			if err := e.AdvanceBatch(ctx, batch, versions[:len(batch)], out); err != nil {
				b.Fatal(err)
			}
			if err := e.CommitBatch(ctx, out, nil); err != nil {
				b.Fatal(err)
			}
		}
		elapsed := time.Since(t0)
		b.StopTimer()
		if err := e.Compact(ctx); err != nil {
			b.Fatal(err)
		}
		s := e.Stats()
		if s.Calls.New != uint64(len(ks)) {
			b.Fatalf("%d of %d entities New", s.Calls.New, len(ks))
		}
		b.ReportMetric(float64(s.Store.TableBytes)/float64(len(ks)), "bytes/entity")
		b.ReportMetric(float64(len(ks))/elapsed.Seconds(), "keys/s")
	})
	b.Run("lookup", func(b *testing.B) {
		e := open(b)
		ks := distinct(b.N)
		mark(b, e, ks)
		out := make([]engine.KeyInfo, 256)
		b.ResetTimer()
		t0 := time.Now()
		for i := 0; i < len(ks); i += 256 {
			batch := ks[i:min(i+256, len(ks))]
			if err := e.LookupBatch(ctx, batch, out[:len(batch)]); err != nil {
				b.Fatal(err)
			}
			if out[0].Outcome != engine.Duplicate {
				b.Fatalf("lookup of a committed key: %v", out[0].Outcome)
			}
		}
		b.ReportMetric(float64(len(ks))/time.Since(t0).Seconds(), "keys/s")
	})
	b.Run("forget", func(b *testing.B) {
		e := open(b)
		ks := distinct(b.N)
		mark(b, e, ks)
		b.ResetTimer()
		t0 := time.Now()
		out := make([]engine.KeyInfo, 256)
		for i := 0; i < len(ks); i += 256 {
			batch := ks[i:min(i+256, len(ks))]
			if err := e.ForgetBatch(ctx, batch, out[:len(batch)]); err != nil || out[0].Outcome != engine.Duplicate {
				b.Fatal(out[0].Outcome, err)
			}
		}
		b.ReportMetric(float64(len(ks))/time.Since(t0).Seconds(), "keys/s")
	})
	b.Run("token", func(b *testing.B) {
		e := open(b)
		b.ResetTimer()
		t0 := time.Now()
		for range b.N {
			tok, err := e.IssueToken(ctx, time.Hour)
			if err != nil {
				b.Fatal(err)
			}
			if err := e.ConsumeToken(ctx, tok); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/time.Since(t0).Seconds(), "tokens/s")
	})
}

// distinct returns n distinct keys.
func distinct(n int) [][]byte {
	ks := make([][]byte, n)
	rng := rand.New(rand.NewPCG(uint64(n), 11))
	for i := range ks {
		// Random, as UUIDs are: sequential keys would compress to nothing.
		k := make([]byte, 16)
		binary.LittleEndian.PutUint64(k, rng.Uint64())
		binary.LittleEndian.PutUint64(k[8:], uint64(i))
		ks[i] = []byte(hex.EncodeToString(k))
	}
	return ks
}

// mark commits every key, in batches of 256.
func mark(b *testing.B, e *engine.Engine, ks [][]byte) {
	out := make([]engine.Outcome, 256)
	for i := 0; i < len(ks); i += 256 {
		batch := ks[i:min(i+256, len(ks))]
		if err := e.MarkBatch(context.Background(), batch, nil, out[:len(batch)]); err != nil {
			b.Fatal(err)
		}
	}
}
