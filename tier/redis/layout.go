package redis

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// Value layout:
//
//	claim      'C' ‖ token ‖ lease end (ms, server clock, decimal) ‖ ':' ‖ attempts (decimal)
//	committed  'D' ‖ token ‖ [digest], or with a result
//	           'D' ‖ token ‖ digest (zero for none) ‖ At (8 bytes, big endian) ‖ result
//	released   'R' ‖ attempts (decimal), with Options.MaxAttempts only
//
// Keeping the committer's token lets a retried commit recognise its own
// write; keeping the lease end in the value (checked against the server's
// TIME) lets a claim outlive its lease with its attempt count, so a lease
// that ran out is counted. Without MaxAttempts a claim is 'C' ‖ token and
// its TTL is its lease.
const (
	claimTag  = 'C'
	commitTag = 'D'
)

// layoutKey is Prefix ‖ NUL: no record key is that short (a record key has
// a namespace length byte and a non-empty key after it). The archive log
// is Prefix ‖ NUL ‖ NUL, its drain lease Prefix ‖ NUL ‖ 0xFF ‖ "drain" and
// the archive it feeds Prefix ‖ NUL ‖ 0xFF ‖ "archive" and the newest
// position trimmed Prefix ‖ NUL ‖ 0xFF ‖ "trimmed": a record key of namespace "" has a key after its two bytes, one
// of a 255-byte namespace is longer.
func (s *Store) layoutKey() string { return s.prefix + "\x00" }

// checkLayout records the prefix's window, MaxAttempts and namespace
// windows on first use and refuses a process that disagrees. To change
// them, stop every process on the prefix and delete the layout key, or use
// a new prefix.
func (s *Store) checkLayout(ctx context.Context) error {
	want := fmt.Sprintf("tierdedup layout 1 window=%dms max-attempts=%d", s.window.Milliseconds(), s.max)
	if len(s.nsWindows) > 0 {
		names := slices.Sorted(maps.Keys(s.nsWindows))
		var b strings.Builder
		for _, n := range names {
			fmt.Fprintf(&b, " %q=%dms", n, s.nsWindows[n].Milliseconds())
		}
		want += " namespace-windows:" + b.String()
	}
	if s.uncached {
		want += " uncached"
	}
	if s.logKey != "" {
		want += " archive-log"
	}
	set, err := s.c.SetNX(ctx, s.layoutKey(), want, 0).Result()
	if err != nil {
		return fmt.Errorf("%w: recording the layout: %w", ErrUnavailable, err)
	}
	if set {
		return nil
	}
	got, err := s.c.Get(ctx, s.layoutKey()).Result()
	if err != nil {
		return fmt.Errorf("%w: reading the layout: %w", ErrUnavailable, err)
	}
	if got != want {
		return fmt.Errorf("%w: prefix %q records %q, these options %q", ErrLayout, s.prefix, got, want)
	}
	return nil
}

// eachServer runs fn on every master of a cluster, or on the client itself.
func (s *Store) eachServer(ctx context.Context, fn func(context.Context, goredis.Cmdable) error) error {
	if cc, ok := s.c.(*goredis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error { return fn(ctx, c) })
	}
	return fn(ctx, s.c)
}

func (s *Store) checkPolicy(ctx context.Context, require bool) error {
	return s.eachServer(ctx, func(ctx context.Context, c goredis.Cmdable) error {
		res, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
		if err != nil {
			if isUnavailable(err) {
				return fmt.Errorf("%w: %w", ErrUnavailable, err)
			}
			s.logger.Printf("tierdedup/redis: cannot read maxmemory-policy (%v); make sure it is noeviction", err)
			return nil
		}
		if p := res["maxmemory-policy"]; p != "noeviction" {
			if require {
				return fmt.Errorf("%w: %q", ErrEvictionPolicy, p)
			}
			s.logger.Printf("tierdedup/redis: maxmemory-policy is %q: under memory pressure Redis may evict dedup keys and let duplicates through; set it to noeviction", p)
		}
		return nil
	})
}

// Key returns the Redis key of (ns, key): Prefix ‖ NUL ‖ len(ns) ‖ ns ‖
// key, the full key bytes with no hash tag, so keys spread over all cluster
// slots. Prefixes contain no NUL, so the first NUL ends the prefix: the
// keys of two deployments whose prefixes differ never meet, even when one
// prefix starts the other ("a:" and "a:b:").
func (s *Store) Key(ns string, key []byte) string {
	var b strings.Builder
	b.Grow(len(s.prefix) + 2 + len(ns) + len(key))
	b.WriteString(s.prefix)
	b.WriteByte(0)
	b.WriteByte(byte(len(ns)))
	b.WriteString(ns)
	b.Write(key)
	return b.String()
}

// claimPrefix is the start of every claim value of token t.
func claimPrefix(t Token) string {
	return string(append([]byte{claimTag}, t[:]...))
}

// commitValue is the committed value of r (see Value layout).
// It is built in one allocation: a string is the marks' hottest
// argument.
func commitValue(r *Request) string {
	var b strings.Builder
	b.Grow(1 + len(r.Token) + len(r.Digest) + 8 + len(r.Result))
	b.WriteByte(commitTag)
	b.Write(r.Token[:])
	if len(r.Result) > 0 {
		b.Write(r.Digest[:])
		var at [8]byte
		binary.BigEndian.PutUint64(at[:], uint64(r.At))
		b.Write(at[:])
		b.Write(r.Result)
		return b.String()
	}
	if r.Digest != (Digest{}) {
		b.Write(r.Digest[:])
	}
	return b.String()
}

func isUnavailable(err error) bool {
	var re goredis.Error
	return !errors.As(err, &re) || errors.Is(err, context.DeadlineExceeded)
}
