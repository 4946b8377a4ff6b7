package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/tier"
)

// Config is what a caller chooses of the Redis tier; the engine supplies
// the rest (its window, MaxAttempts, namespace windows, NoSharedCache and
// logger) when it opens the Backend.
type Config struct {
	// Prefix starts every Redis key; zero means DefaultPrefix. Processes
	// that deduplicate together use the same prefix. It must not contain
	// '{', '}' or NUL; deployments with different prefixes never share a
	// key, even when one prefix starts the other.
	Prefix string
	// RequireNoEviction makes Open fail when a server's maxmemory-policy
	// could evict dedup keys (ErrEvictionPolicy, an ErrOptions);
	// otherwise Open logs a warning.
	RequireNoEviction bool
	// WaitReplicas, when positive, acknowledges every claim, mark, commit
	// and forget only once that many replicas hold it (WAIT, bounded by
	// WaitTimeout, DefaultWaitTimeout when zero): a failover then loses
	// no acknowledged write; fewer replicas in time is ErrUnavailable. A
	// single Redis or Sentinel deployment only. See Options.WaitReplicas
	// and docs/shared-tiers.md for its cost.
	WaitReplicas int
	WaitTimeout  time.Duration
}

// Backend is the Redis tier as an engine's backend (engine.Options.Backend).
type Backend struct {
	client goredis.UniversalClient
	config Config
}

// NewBackend returns the Redis tier over client, a go-redis Client,
// ClusterClient or FailoverClient. The caller owns the client and closes it
// after the engine.
func NewBackend(client goredis.UniversalClient, c Config) *Backend {
	return &Backend{client: client, config: c}
}

// Name returns "redis".
func (b *Backend) Name() string { return "redis" }

// Claims returns tier.ClaimsInStore: every process on the prefix shares
// the claims.
func (b *Backend) Claims() tier.Where { return tier.ClaimsInStore }

// Validate reports a nil client (also a typed nil, such as a
// *goredis.Client left nil) and a prefix Redis keys cannot carry, all at
// once; each error matches tier.ErrOptions and ErrOptions.
func (b *Backend) Validate(env tier.Env) error {
	var errs []error
	if b == nil {
		return fmt.Errorf("%w: %w: a nil Redis backend", tier.ErrOptions, ErrOptions)
	}
	if tier.Nil(b.client) {
		errs = append(errs, fmt.Errorf("%w: %w: the Redis backend needs a client (it is nil)", tier.ErrOptions, ErrOptions))
	}
	if strings.ContainsAny(b.config.Prefix, "{}") {
		errs = append(errs, fmt.Errorf("%w: %w: Prefix %q contains a hash-tag brace, which would pin every key to one cluster slot", tier.ErrOptions, ErrOptions, b.config.Prefix))
	}
	if strings.ContainsRune(b.config.Prefix, 0) {
		errs = append(errs, fmt.Errorf("%w: %w: Prefix %q contains a NUL byte, which ends a prefix in the key layout", tier.ErrOptions, ErrOptions, b.config.Prefix))
	}
	if _, single := b.client.(*goredis.Client); !single && b.config.WaitReplicas > 0 {
		errs = append(errs, fmt.Errorf("%w: %w: WaitReplicas needs a single Redis (or Sentinel) deployment: WAIT acknowledges one connection's writes on one server", tier.ErrOptions, ErrOptions))
	}
	if _, single := b.client.(*goredis.Client); !single && env.ArchiveLog {
		errs = append(errs, fmt.Errorf("%w: %w: an archive behind Redis needs a single Redis (or Sentinel) deployment, not a Cluster or Ring: the log is appended in the commit's own script, which touches one slot or shard only", tier.ErrOptions, ErrOptions))
	}
	return errors.Join(errs...)
}

// Open checks every server's maxmemory-policy, loads the scripts and
// checks (or records) the prefix's layout: the window, MaxAttempts,
// namespace windows and NoSharedCache of env. Errors wrap tier.ErrOptions
// (ErrOptions, ErrEvictionPolicy), tier.ErrLayout (ErrLayout) or
// ErrUnavailable.
func (b *Backend) Open(ctx context.Context, env tier.Env) (tier.Exact, error) {
	if err := b.Validate(env); err != nil {
		return nil, err
	}
	s, err := New(ctx, b.client, &Options{
		Prefix: b.config.Prefix, Window: env.Window, RequireNoEviction: b.config.RequireNoEviction, Logger: env.Logger,
		MaxAttempts: env.MaxAttempts, NamespaceWindows: env.NamespaceWindows, Uncached: env.NoSharedCache, ArchiveLog: env.ArchiveLog,
		WaitReplicas: b.config.WaitReplicas, WaitTimeout: b.config.WaitTimeout,
	})
	if err != nil {
		return nil, tier.Classify(err, ErrLayout, ErrOptions, ErrEvictionPolicy)
	}
	return s, nil
}
