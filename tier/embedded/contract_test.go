package embedded_test

import (
	"context"
	"errors"
	"io"
	"log"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/embedded"
	"github.com/tierdedup/tierdedup/tier/tiertest"
)

// TestContract runs the exact tiers' contract suite over the embedded
// store opened as a Backend (its exact tier, started, closing the whole
// store), each in a directory of its own: the embedded store is a backend
// like the others.
func TestContract(t *testing.T) {
	tiertest.RunInDirs(t, tiertest.Options{Partitioned: true}, func(t *testing.T, dir string) tier.Exact {
		parts, err := tier.NewPartitions(4*time.Hour, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		b := &embedded.Backend{Dir: dir, CacheSize: 4 << 20}
		x, err := b.Open(context.Background(), tier.Env{
			Window: 4 * time.Hour, Partitions: parts, Logger: log.New(io.Discard, "", 0),
			ExpectedKeys: 10_000, FalsePositive: 0.01,
			// The suite's partitions count from 64 hours after the epoch:
			// the store's clock stands in the first of them.
			Now: int64(64 * time.Hour),
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = x.Close() }) // idempotent: after the suite's own Close
		return x
	})
}

// TestBackendValidate: the settings the embedded Backend refuses, each
// ErrOptions, and nothing created.
func TestBackendValidate(t *testing.T) {
	parts, _ := tier.NewPartitions(4*time.Hour, time.Hour)
	env := tier.Env{Window: 4 * time.Hour, Partitions: parts, Logger: log.New(io.Discard, "", 0)}
	for name, c := range map[string]struct {
		b   *embedded.Backend
		env tier.Env
	}{
		"nil":             {nil, env},
		"no Dir":          {&embedded.Backend{}, env},
		"CacheSize":       {&embedded.Backend{Dir: "x", CacheSize: -1}, env},
		"archive log":     {&embedded.Backend{Dir: "x"}, func() tier.Env { e := env; e.ArchiveLog = true; return e }()},
		"no layout":       {&embedded.Backend{Dir: "x"}, tier.Env{}},
		"bloom-only Open": {&embedded.Backend{}, func() tier.Env { e := env; e.FiltersOnly = true; return e }()},
	} {
		t.Run(name, func(t *testing.T) {
			var err error
			if name == "bloom-only Open" {
				_, err = c.b.Open(context.Background(), c.env)
			} else {
				err = c.b.Validate(c.env)
			}
			if !errorsIs(err, tier.ErrOptions) {
				t.Fatalf("%v, want ErrOptions", err)
			}
		})
	}
}

func errorsIs(err, target error) bool { return errors.Is(err, target) }
