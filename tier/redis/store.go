package redis

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strings"
	"sync"
	"time"

	"github.com/tierdedup/tierdedup/tier"

	goredis "github.com/redis/go-redis/v9"
)

// Errors returned by a Store; match them with errors.Is.
var (
	// ErrUnavailable reports Redis unreachable, too slow for the caller's
	// deadline, or failing a command. It is transient: nothing is known to
	// have changed, and the call may be retried.
	ErrUnavailable = errors.New("redis: unavailable")
	// ErrPastLogBy reports a write behind the archive log that reached
	// Redis after its Request.LogBy (the archive read it relies on is too
	// old: a stall, or this host's clock behind Redis's): nothing was
	// written for that key. It comes wrapped in ErrUnavailable.
	ErrPastLogBy = errors.New("redis: reached Redis after its LogBy")
	// ErrEvictionPolicy reports a server whose maxmemory-policy may evict
	// dedup keys (anything but noeviction), when Options.RequireNoEviction
	// is set.
	ErrEvictionPolicy = errors.New("redis: maxmemory-policy may evict dedup keys")
	// ErrOptions reports invalid Options.
	ErrOptions = errors.New("redis: invalid options")
	// ErrLayout reports a prefix whose recorded window or MaxAttempts
	// differs from the Options: processes sharing a prefix must agree, or a
	// shorter window on one would expire keys another promises to keep.
	ErrLayout = errors.New("redis: prefix layout mismatch")
)

// DefaultPrefix starts every key this package writes.
const DefaultPrefix = "tierdedup:"

// Options configure a Store.
type Options struct {
	// Prefix starts every Redis key; zero means DefaultPrefix. It must not
	// contain '{' or '}' (a Redis Cluster hash tag) or a NUL byte: keys are
	// Prefix ‖ NUL ‖ …, so no prefix's keys can be another prefix's.
	Prefix string
	// Window is how long a committed key lives (its TTL); required.
	Window time.Duration
	// RequireNoEviction makes New fail with ErrEvictionPolicy when a server's
	// maxmemory-policy is not noeviction; otherwise New only logs a warning.
	RequireNoEviction bool
	// MaxAttempts, when positive, keeps each key's attempt count (releases
	// and lease expiries of its claims, by any process) in its Redis value
	// for the window after the last attempt, and answers Poisoned once it
	// reaches MaxAttempts. Processes sharing a Prefix should agree on it.
	// Zero counts nothing: a released key is deleted and a claim lives for
	// its lease only. At most 65535.
	MaxAttempts int
	// NamespaceWindows are the windows of namespaces that have their own
	// (the engine's Options.NamespaceWindows): a commit's TTL is set from
	// them when it is made, so processes sharing a prefix must agree on
	// them, and the prefix's layout records them.
	NamespaceWindows map[string]time.Duration
	// Uncached records that every process sharing the prefix keeps no
	// commits cached in memory (the engine's Options.NoSharedCache, which
	// Forget needs): the layout records it, so a process that caches is
	// refused rather than answering Duplicate for a key another forgot.
	Uncached bool
	// ArchiveLog keeps the archive log (tier.ArchiveLog): every commit
	// of a Request with Archive set, and every Forget and undone commit,
	// is appended to a Redis Stream in the script that makes it. The
	// layout records it, so no process on the prefix commits without
	// appending. A Cluster or Ring keeps no log (ErrOptions): a script may touch
	// one slot only.
	ArchiveLog bool
	// WaitReplicas, when positive, acknowledges a write (a claim, mark,
	// commit, extension, forget or advance) only once that many replicas
	// have it: each write's pipeline ends with WAIT WaitReplicas
	// WaitTimeout, and fewer replicas answering in time fail the call
	// with ErrUnavailable (its outcome unknown, as with a lost reply). So
	// a replica promoted after the master dies holds every acknowledged
	// write. Zero waits for none: replication is asynchronous, and a
	// failover may lose the last writes. A single server or Sentinel
	// only (ErrOptions with a Cluster or Ring); at most maxWaitReplicas.
	WaitReplicas int
	// WaitTimeout bounds each WAIT; zero means DefaultWaitTimeout, at
	// most a minute. The caller's context deadline bounds it too.
	WaitTimeout time.Duration
	// Logger receives warnings; nil means the standard logger.
	Logger *log.Logger
}

// DefaultWaitTimeout is Options.WaitTimeout's default: a replica on the
// same network acknowledges in well under a millisecond; one that lags
// by a second is one a failover would lose writes to.
const DefaultWaitTimeout = time.Second

// maxWaitReplicas bounds Options.WaitReplicas: more replicas than any
// deployment runs is a mistake, not a policy.
const maxWaitReplicas = 64

// Validate reports every invalid field at once.
func (o *Options) Validate() error {
	var errs []error
	if strings.ContainsAny(o.Prefix, "{}\x00") {
		errs = append(errs, fmt.Errorf("%w: Prefix %q contains a hash tag brace or a NUL byte", ErrOptions, o.Prefix))
	}
	if o.Window < time.Millisecond {
		errs = append(errs, fmt.Errorf("%w: Window %v is below a millisecond", ErrOptions, o.Window))
	}
	if err := tier.CheckAttempts(o.MaxAttempts); err != nil {
		errs = append(errs, fmt.Errorf("%w: %w", ErrOptions, err))
	}
	if o.WaitReplicas < 0 || o.WaitReplicas > maxWaitReplicas {
		errs = append(errs, fmt.Errorf("%w: WaitReplicas %d outside [0, %d]", ErrOptions, o.WaitReplicas, maxWaitReplicas))
	}
	if o.WaitTimeout < 0 || o.WaitTimeout > time.Minute {
		errs = append(errs, fmt.Errorf("%w: WaitTimeout %v outside [0, 1m]", ErrOptions, o.WaitTimeout))
	}
	return errors.Join(errs...)
}

// Request names one key of a batch and its claim (tier.Request: NS, Key,
// Token, and Digest for Commit).
type Request = tier.Request

// Result is the per-key answer of Claim (tier.Answer): Acquired (with the
// attempt count the new claim carries), Held, Committed (with the
// committer's Token and the Digest) or Poisoned (with the count reached);
// Expired when the claim found another's lease ended and counted it.
// Partition is always -1: Redis expires keys itself, so no answer may be
// cached beyond what Redis says.
type Result = tier.Answer

// Claims reports where claims live: in Redis, shared by every process.
func (s *Store) Claims() tier.Where { return tier.ClaimsInStore }

// Store is the Redis tier. It is safe for concurrent use.
type Store struct {
	c      goredis.UniversalClient
	prefix string
	window time.Duration
	max    int // Options.MaxAttempts
	logger *log.Logger
	// nsWindows are Options.NamespaceWindows, and uncached
	// Options.Uncached, recorded in the layout.
	nsWindows map[string]time.Duration
	uncached  bool
	logKey    string // the archive log's key; "" without Options.ArchiveLog
	// sharded is set for a client whose keys live on several servers
	// (Cluster, Ring): scripts run once per key, not once per batch.
	sharded bool
	late    sync.WaitGroup // pipelines still running after their caller's deadline
	// replicas and waitMS are Options.WaitReplicas and WaitTimeout (ms).
	replicas, waitMS int64
}

// exec runs pipe and returns by ctx's deadline, whatever the client's own
// timeouts: go-redis applies a context's deadline to the connection only
// with ContextTimeoutEnabled, and otherwise a paused server holds a call
// for ReadTimeout times its retries (5 s measured with default options
// against a 100 ms deadline). A pipeline still running then finishes in the
// background (bounded by the client's timeouts), its results discarded;
// Close waits for it. Commands are built before exec, so nothing of the
// caller's is read after exec returns.
func (s *Store) exec(ctx context.Context, pipe goredis.Pipeliner) error {
	return s.execWait(ctx, pipe, false)
}

// execWrites is exec for a pipeline of writes the caller is answered on:
// with Options.WaitReplicas the pipeline ends with a WAIT on the same
// connection, and fewer replicas than asked, in time, is ErrUnavailable.
func (s *Store) execWrites(ctx context.Context, pipe goredis.Pipeliner) error {
	return s.execWait(ctx, pipe, true)
}

func (s *Store) execWait(ctx context.Context, pipe goredis.Pipeliner, writes bool) error {
	var wait *goredis.Cmd
	if writes && s.replicas > 0 {
		ms := s.waitMS
		if d, ok := ctx.Deadline(); ok {
			ms = max(min(ms, time.Until(d).Milliseconds()), 1)
		}
		wait = pipe.Do(ctx, "WAIT", s.replicas, ms)
	}
	err := s.run(ctx, pipe)
	if wait == nil || err != nil && !errors.Is(err, goredis.Nil) {
		return err
	}
	// goredis.Nil is a command's empty answer (SET … GET of an absent
	// key), not a failure: the WAIT decides.
	if n, werr := wait.Int64(); werr != nil {
		return fmt.Errorf("%w: WAIT: %w", ErrUnavailable, werr)
	} else if n < s.replicas {
		return fmt.Errorf("%w: %d of %d replicas acknowledged the write within %d ms", ErrUnavailable, n, s.replicas, s.waitMS)
	}
	return err
}

// run runs pipe and returns by ctx's deadline (see exec).
func (s *Store) run(ctx context.Context, pipe goredis.Pipeliner) error {
	if ctx.Done() == nil {
		_, err := pipe.Exec(ctx)
		return err
	}
	done := make(chan error, 1)
	s.late.Add(1)
	go func() {
		defer s.late.Done()
		_, err := pipe.Exec(ctx)
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close waits for pipelines that outlived their caller's deadline. The
// client stays the caller's to close, after this returns.
func (s *Store) Close() error {
	s.late.Wait()
	return nil
}

// New returns a Store over client, after checking each server's
// maxmemory-policy and loading the scripts.
func New(ctx context.Context, client goredis.UniversalClient, opts *Options) (*Store, error) {
	if client == nil || opts == nil {
		return nil, fmt.Errorf("%w: nil client or options", ErrOptions)
	}
	o := *opts
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if o.Logger == nil {
		o.Logger = log.Default()
	}
	s := &Store{c: client, prefix: o.Prefix, window: o.Window, max: o.MaxAttempts, logger: o.Logger, nsWindows: o.NamespaceWindows, uncached: o.Uncached}
	_, single := client.(*goredis.Client) // one server, or Sentinel's failover client
	s.sharded = !single
	if o.WaitReplicas > 0 {
		if s.sharded {
			return nil, fmt.Errorf("%w: WaitReplicas needs a single Redis (or Sentinel) deployment: WAIT acknowledges one connection's writes on one server", ErrOptions)
		}
		if o.WaitTimeout == 0 {
			o.WaitTimeout = DefaultWaitTimeout
		}
		s.replicas, s.waitMS = int64(o.WaitReplicas), max(o.WaitTimeout.Milliseconds(), 1)
	}
	if o.ArchiveLog {
		if s.sharded {
			return nil, fmt.Errorf("%w: an archive log needs a single Redis (or Sentinel) deployment: a Cluster or Ring script touches one slot or shard only", ErrOptions)
		}
		s.logKey = s.prefix + "\x00\x00"
	}
	if err := s.checkPolicy(ctx, o.RequireNoEviction); err != nil {
		return nil, err
	}
	if err := s.loadScripts(ctx); err != nil {
		return nil, err
	}
	if err := s.checkLayout(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// KeepsResults reports that a commit's result is stored with it.
func (s *Store) KeepsResults() bool { return true }
