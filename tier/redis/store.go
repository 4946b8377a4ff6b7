package redis

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"maps"
	"slices"
	"strconv"
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
	// Logger receives warnings; nil means the standard logger.
	Logger *log.Logger
}

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

// claimScript claims KEYS[1] for the token prefix ARGV[1] ('C' ‖ token)
// for ARGV[2] ms, keeping the value ARGV[3] ms, counting attempts up to
// ARGV[4] (0: none). It returns 'A'|'T'|'O' ‖ attempts (acquired: free,
// taken over from an ended lease, or the caller's own claim: a retry),
// 'P'|'Q' ‖ attempts (poisoned: already, or by this expiry), or the value
// of a live claim ('C'…) or a commit ('D'…).
var claimScript = goredis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local max = tonumber(ARGV[4])
local v = redis.call('GET', KEYS[1])
local n, tag = 0, 'A'
if v then
  local kind = string.sub(v, 1, 1)
  if kind == 'D' then return v end
  if kind == 'C' then
    local lease, cnt = string.match(string.sub(v, 18), '^(%d+):(%d+)$')
    if string.sub(v, 1, 17) == ARGV[1] then
      n, tag = tonumber(cnt) or 0, 'O' -- the caller's own claim: renewed below
    elseif not lease or tonumber(lease) > now then
      return v
    else
      n, tag = tonumber(cnt), 'T'
    end
    if tag == 'T' and max > 0 then
      n = n + 1
      if n >= max then
        redis.call('SET', KEYS[1], 'R' .. n, 'PX', ARGV[3])
        return 'Q' .. n
      end
    end
  elseif kind == 'R' then
    n = tonumber(string.sub(v, 2)) or 0
    if max > 0 and n >= max then return 'P' .. n end
  end
end
local ttl = ARGV[2]
if max > 0 then ttl = ARGV[3] end
redis.call('SET', KEYS[1], ARGV[1] .. (now + tonumber(ARGV[2])) .. ':' .. n, 'PX', ttl)
return tag .. n`)

// commitScript turns the caller's unexpired claim (token prefix ARGV[1])
// into the committed value ARGV[2] with TTL ARGV[3] ms; a value already
// committed with the caller's token is a retry and succeeds.
var commitScript = goredis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 17) == ARGV[1] then
  local lease = string.match(string.sub(v, 18), '^(%d+):')
  local t = redis.call('TIME')
  if lease and tonumber(lease) <= tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) then
    return 0
  end
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
if v and string.sub(v, 1, 17) == string.sub(ARGV[2], 1, 17) then
  return 1
end
return 0`)

// releaseScript frees the key only while it holds the caller's unexpired
// claim (token prefix ARGV[1]): with ARGV[2] > 0 it keeps the attempt
// count, ARGV[4] higher, for ARGV[3] ms (deleting the key if that is 0);
// otherwise it deletes the key. With ARGV[5] = 1 it also deletes a commit
// carrying the caller's token: one whose caller was told it failed.
var releaseScript = goredis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v and ARGV[5] == '1' and string.sub(v, 1, 1) == 'D' and string.sub(v, 2, 17) == string.sub(ARGV[1], 2, 17) then
  redis.call('DEL', KEYS[1])
  return 1
end
if not v or string.sub(v, 1, 17) ~= ARGV[1] then return 0 end
local lease, cnt = string.match(string.sub(v, 18), '^(%d+):(%d+)$')
local t = redis.call('TIME')
if lease and tonumber(lease) <= tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) then
  return 0
end
local n = (tonumber(cnt) or 0) + tonumber(ARGV[4])
if tonumber(ARGV[2]) > 0 and n > 0 then
  redis.call('SET', KEYS[1], 'R' .. n, 'PX', ARGV[3])
else
  redis.call('DEL', KEYS[1])
end
return 1`)

// extendScript makes the lease of the caller's unexpired claim (token
// prefix ARGV[1]) end ARGV[2] ms from now unless it ends later, keeping an
// attempt-counted claim (MaxAttempts) for ARGV[3] ms; a claim without a
// recorded lease (SET NX: its TTL is its lease) has its TTL raised
// instead. It returns 1, or 0 when the key does not hold the caller's live
// claim.
var extendScript = goredis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 17) ~= ARGV[1] then return 0 end
local rest = string.sub(v, 18)
if rest == '' then
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  return 1
end
local lease, cnt = string.match(rest, '^(%d+):(%x*)$')
if not lease then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if tonumber(lease) <= now then return 0 end
local untilMS = now + tonumber(ARGV[2])
if untilMS > tonumber(lease) then
  redis.call('SET', KEYS[1], ARGV[1] .. untilMS .. ':' .. cnt, 'PX', ARGV[3])
end
return 1`)

// lookScript reads KEYS[1] without claiming it: ” (absent), 'H' (a live
// claim), 'E' ‖ attempts (a claim whose lease ended) or the value of a
// commit ('D'…) or an attempt count ('R'…). With ARGV[1] = 1 it also
// deletes the key unless a live claim holds it (Forget).
var lookScript = goredis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then return '' end
local out = v
if string.sub(v, 1, 1) == 'C' then
  local lease, cnt = string.match(string.sub(v, 18), '^(%d+):(%d+)$')
  if not lease then return 'H' end
  local t = redis.call('TIME')
  if tonumber(lease) > tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) then return 'H' end
  out = 'E' .. cnt
end
if ARGV[1] == '1' then redis.call('DEL', KEYS[1]) end
return out`)

// Versions (the engine's Advance) live in keys of the engine's own
// namespaces: committed 'D' ‖ token ‖ version (16 hex digits, the Digest),
// claimed 'C' ‖ token ‖ lease end ‖ ':' ‖ the version the claim replaced
// (” for none), kept for the window, so a claim that ends without a
// commit (released, or left to expire) never loses the version it
// replaced. Versions compare byte by byte (string.byte: no locale).
const versionLE = `
local function le(a, b)
  for i = 1, #a do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return true
end
`

// advanceScript claims KEYS[1] for the token prefix ARGV[1] for ARGV[3] ms
// (keeping the value ARGV[4] ms) when the version ARGV[2] is greater than
// the stored one. It returns 'A' ‖ the version replaced, 'S' ‖ the stored
// version (not greater), or 'H' (a live claim).
var advanceScript = goredis.NewScript(versionLE + `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local v = redis.call('GET', KEYS[1])
local stored = ''
if v then
  local kind = string.sub(v, 1, 1)
  if kind == 'C' then
    local lease, prev = string.match(string.sub(v, 18), '^(%d+):(%x*)$')
    if not lease then return redis.error_reply('not a version key') end
    if string.sub(v, 1, 17) ~= ARGV[1] and tonumber(lease) > now then return 'H' end
    stored = prev
  elseif kind == 'D' and #v == 33 then
    stored = string.sub(v, 18, 33)
  else
    return redis.error_reply('not a version key')
  end
end
if stored ~= '' and le(ARGV[2], stored) then return 'S' .. stored end
redis.call('SET', KEYS[1], ARGV[1] .. (now + tonumber(ARGV[3])) .. ':' .. stored, 'PX', ARGV[4])
return 'A' .. stored`)

// unadvanceScript ends the caller's live claim of a version key (token
// prefix ARGV[1]), restoring the version it replaced as committed value
// ARGV[3] ‖ version for ARGV[2] ms, or deleting the key if it replaced
// none. It returns 1, or 0 when the key does not hold the caller's live
// claim.
var unadvanceScript = goredis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 17) ~= ARGV[1] then return 0 end
local lease, prev = string.match(string.sub(v, 18), '^(%d+):(%x*)$')
local t = redis.call('TIME')
if not lease or tonumber(lease) <= tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) then return 0 end
if prev == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[3] .. prev, 'PX', ARGV[2])
end
return 1`)

// Advance claims each version key whose requested version is greater than
// the stored one (tier.Advancer), in one pipeline of one script call per
// key.
func (s *Store) Advance(ctx context.Context, reqs []Request, lease time.Duration, out []Result) error {
	leaseMS, windowMS := max(lease.Milliseconds(), 1), s.window.Milliseconds()
	return s.evalText(ctx, advanceScript, reqs, func(r *Request) []any {
		return []any{claimPrefix(r.Token), string(r.Digest[:]), leaseMS, windowMS}
	}, func(i int, v string) error {
		out[i] = Result{Partition: -1}
		switch {
		case v == "H":
			out[i].Status = tier.Held
		case v == "A":
			out[i].Status = tier.Acquired
		case len(v) == 17 && (v[0] == 'A' || v[0] == 'S'):
			out[i].Status = tier.Acquired
			if v[0] == 'S' {
				out[i].Status = tier.Committed
			}
			copy(out[i].Digest[:], v[1:])
		default:
			return fmt.Errorf("unexpected advance answer of %d bytes", len(v))
		}
		return nil
	})
}

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
	late      sync.WaitGroup // pipelines still running after their caller's deadline
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

// layoutKey is Prefix ‖ NUL: no record key is that short (a record key has
// a namespace length byte and a non-empty key after it).
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

func (s *Store) loadScripts(ctx context.Context) error {
	return s.eachServer(ctx, func(ctx context.Context, c goredis.Cmdable) error {
		for _, sc := range []*goredis.Script{claimScript, commitScript, releaseScript, extendScript, lookScript, advanceScript, unadvanceScript} {
			if err := sc.Load(ctx, c).Err(); err != nil {
				return fmt.Errorf("%w: loading scripts: %w", ErrUnavailable, err)
			}
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
func commitValue(r *Request) string {
	v := make([]byte, 0, 1+len(r.Token)+len(r.Digest)+8+len(r.Result))
	v = append(append(v, commitTag), r.Token[:]...)
	if len(r.Result) > 0 {
		v = append(v, r.Digest[:]...)
		v = binary.BigEndian.AppendUint64(v, uint64(r.At))
		return string(append(v, r.Result...))
	}
	if r.Digest != (Digest{}) {
		v = append(v, r.Digest[:]...)
	}
	return string(v)
}

// KeepsResults reports that a commit's result is stored with it.
func (s *Store) KeepsResults() bool { return true }

// Claim tries to claim every key for lease, in one pipeline of one script
// call per key; out must have len(reqs). On error nothing is known: some
// keys may hold the caller's claims until their lease ends (a retry with
// the same tokens acquires them again).
func (s *Store) Claim(ctx context.Context, reqs []Request, lease time.Duration, out []Result) error {
	var err error
	if s.max == 0 {
		err = s.claimNX(ctx, reqs, lease, out)
	} else {
		err = s.claimScripted(ctx, reqs, lease, out)
	}
	for i := range out {
		out[i].Partition = -1
	}
	return err
}

// claimScripted is Claim through claimScript.
func (s *Store) claimScripted(ctx context.Context, reqs []Request, lease time.Duration, out []Result) error {
	leaseMS, windowMS := max(lease.Milliseconds(), 1), s.window.Milliseconds()
	return s.evalText(ctx, claimScript, reqs, func(r *Request) []any {
		return []any{claimPrefix(r.Token), leaseMS, windowMS, s.max}
	}, func(i int, v string) (err error) {
		out[i], err = decodeClaim(v)
		return err
	})
}

// evalText runs sc once per request in one pipeline and hands each
// answer's text to decode; a decode error names the key.
func (s *Store) evalText(ctx context.Context, sc *goredis.Script, reqs []Request, args func(*Request) []any, decode func(i int, v string) error) error {
	cmds, err := s.evalBatch(ctx, sc, reqs, args)
	if err != nil {
		return err
	}
	for i, cmd := range cmds {
		v, err := cmd.Text()
		if err != nil {
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		if err := decode(i, v); err != nil {
			return fmt.Errorf("%w: %w at %q", ErrUnavailable, err, s.Key(reqs[i].NS, reqs[i].Key))
		}
	}
	return nil
}

// claimNX is Claim without attempt counting: one SET key 'C'‖token NX PX
// lease GET per key, whose TTL ends the lease (measured 2.2–2.7× the claim
// throughput of the script, which must also read the server's clock).
func (s *Store) claimNX(ctx context.Context, reqs []Request, lease time.Duration, out []Result) error {
	pipe := s.c.Pipeline()
	cmds := make([]*goredis.StatusCmd, len(reqs))
	for i := range reqs {
		r := &reqs[i]
		cmds[i] = pipe.SetArgs(ctx, s.Key(r.NS, r.Key), claimPrefix(r.Token), goredis.SetArgs{Mode: "NX", Get: true, TTL: lease})
	}
	if err := s.exec(ctx, pipe); err != nil && !errors.Is(err, goredis.Nil) {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	var later []int // keys the script must decide
	for i, cmd := range cmds {
		old, err := cmd.Result()
		switch {
		case errors.Is(err, goredis.Nil):
			out[i] = Result{Status: tier.Acquired}
		case err != nil:
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		case len(old) == 17 && old[0] == claimTag && old[1:] == string(reqs[i].Token[:]):
			out[i] = Result{Status: tier.Acquired} // our own claim: a retried SET the server had applied
		case len(old) > 0 && (old[0] == 'R' || old[0] == claimTag && len(old) > 17):
			// An attempt count, or a claim with its lease in the value,
			// left while the prefix had MaxAttempts: the script knows them.
			later = append(later, i)
		default:
			if out[i], err = decodeClaim(old); err != nil || out[i].Status != tier.Held && out[i].Status != tier.Committed {
				return fmt.Errorf("%w: unexpected value of %d bytes at %q", ErrUnavailable, len(old), s.Key(reqs[i].NS, reqs[i].Key))
			}
		}
	}
	if len(later) == 0 {
		return nil
	}
	sub, subOut := make([]Request, len(later)), make([]Result, len(later))
	for j, i := range later {
		sub[j] = reqs[i]
	}
	if err := s.claimScripted(ctx, sub, lease, subOut); err != nil {
		return err
	}
	for j, i := range later {
		out[i] = subOut[j]
	}
	return nil
}

// decodeClaim reads claimScript's answer.
func decodeClaim(v string) (Result, error) {
	if v == "" {
		return Result{}, errors.New("empty claim answer")
	}
	switch v[0] {
	case 'A', 'T', 'O', 'P', 'Q':
		n, err := strconv.ParseUint(v[1:], 10, 16)
		if err != nil {
			return Result{}, fmt.Errorf("claim answer %q: %w", v, err)
		}
		r := Result{Status: tier.Acquired, Attempts: uint16(n), Expired: v[0] == 'T' || v[0] == 'Q'}
		if v[0] == 'P' || v[0] == 'Q' {
			r.Status = tier.Poisoned
		}
		return r, nil
	case claimTag:
		return Result{Status: tier.Held}, nil
	case commitTag:
		if len(v) < 17 {
			return Result{}, fmt.Errorf("committed value of %d bytes", len(v))
		}
		r := Result{Status: tier.Committed}
		copy(r.Token[:], v[1:17])
		switch n := len(v); {
		case n == 17:
		case n == 33:
			copy(r.Digest[:], v[17:])
		case n > 41:
			copy(r.Digest[:], v[17:33])
			r.At = int64(binary.BigEndian.Uint64([]byte(v[33:41])))
			r.Result = []byte(v[41:])
		default:
			return Result{}, fmt.Errorf("committed value of %d bytes", n)
		}
		return r, nil
	}
	return Result{}, fmt.Errorf("unexpected claim answer of %d bytes", len(v))
}

// Lookup answers each key without claiming it, in one pipeline: Absent,
// Held, Committed (with the committer's Token, Digest, Result and At),
// Released (its attempt count; a claim whose lease ended counts one more)
// or Poisoned.
func (s *Store) Lookup(ctx context.Context, reqs []Request, out []Result) error {
	return s.look(ctx, reqs, out, false)
}

// Forget deletes each key unless a live claim holds it (one script call
// per key, atomic per key, in one pipeline), and answers what it found, as
// Lookup does. Another process's cached answer is not reached: see the
// engine's Forget.
func (s *Store) Forget(ctx context.Context, reqs []Request, out []Result) error {
	return s.look(ctx, reqs, out, true)
}

func (s *Store) look(ctx context.Context, reqs []Request, out []Result, forget bool) error {
	flag := 0
	if forget {
		flag = 1
	}
	return s.evalText(ctx, lookScript, reqs, func(*Request) []any { return []any{flag} }, func(i int, v string) (err error) {
		out[i], err = s.decodeLook(v)
		out[i].Partition = -1
		return err
	})
}

// decodeLook reads lookScript's answer.
func (s *Store) decodeLook(v string) (Result, error) {
	if v == "" {
		return Result{Status: tier.Absent}, nil
	}
	counted := func(digits string, plus uint64) (Result, error) {
		n, err := strconv.ParseUint(digits, 10, 16)
		if err != nil {
			return Result{}, fmt.Errorf("attempt count %q: %w", digits, err)
		}
		n = min(n+plus, tier.MaxAttempts)
		r := Result{Status: tier.Released, Attempts: uint16(n)}
		if s.max > 0 && int(n) >= s.max {
			r.Status = tier.Poisoned
		}
		return r, nil
	}
	switch v[0] {
	case 'H':
		return Result{Status: tier.Held}, nil
	case 'E':
		return counted(v[1:], 1)
	case 'R':
		return counted(v[1:], 0)
	case commitTag:
		return decodeClaim(v)
	}
	return Result{}, fmt.Errorf("unexpected value of %d bytes", len(v))
}

// Commit turns each unexpired claim into a committed key with the window
// (or the request's shorter Window) as TTL, in one pipeline; out[i] is OK or Lost. On error the outcome of each
// commit is unknown (a retry is safe: a commit that finds its own value
// succeeds).
// partition is not used: Redis dates keys by their TTL.
func (s *Store) Commit(ctx context.Context, _ int64, reqs []Request, out []Status) error {
	window := s.window.Milliseconds()
	return s.runScript(ctx, commitScript, reqs, out, func(r *Request) []any {
		w := window
		if r.Window > 0 {
			w = max(r.Window.Milliseconds(), 1)
		}
		return []any{claimPrefix(r.Token), commitValue(r), w}
	})
}

// Release frees each key that still holds the caller's unexpired claim
// (keeping its attempt count with MaxAttempts, one more for this release),
// in one pipeline; out[i] is OK or Lost. A retried release whose first
// attempt was applied reports Lost: the key is free either way.
//
// With giveBack the caller gives claims back because its own call failed
// (not because a handler did): the attempt count is kept as it is, and a
// commit carrying the caller's token, applied by the server although the
// caller was told it failed, is deleted too, so that every process finds
// the key free again. partition is not used.
func (s *Store) Release(ctx context.Context, _ int64, reqs []Request, giveBack bool, out []Status) error {
	window := s.window.Milliseconds()
	count, undo := 1, 0
	if giveBack {
		count, undo = 0, 1
	}
	var versioned []int
	for i := range reqs {
		if reqs[i].Versioned {
			versioned = append(versioned, i)
		}
	}
	if len(versioned) == 0 {
		return s.runScript(ctx, releaseScript, reqs, out, func(r *Request) []any {
			return []any{claimPrefix(r.Token), s.max, window, count, undo}
		})
	}
	// Version keys restore the version their claim replaced; the others
	// are released as claims are.
	var plain []int
	for i := range reqs {
		if !reqs[i].Versioned {
			plain = append(plain, i)
		}
	}
	restored := string(append([]byte{commitTag}, make([]byte, len(Token{}))...)) // no committer's token
	for _, part := range []struct {
		idx  []int
		sc   *goredis.Script
		args func(*Request) []any
	}{
		{plain, releaseScript, func(r *Request) []any { return []any{claimPrefix(r.Token), s.max, window, count, undo} }},
		{versioned, unadvanceScript, func(r *Request) []any { return []any{claimPrefix(r.Token), window, restored} }},
	} {
		if len(part.idx) == 0 {
			continue
		}
		sub, st := make([]Request, len(part.idx)), make([]Status, len(part.idx))
		for j, i := range part.idx {
			sub[j] = reqs[i]
		}
		if err := s.runScript(ctx, part.sc, sub, st, part.args); err != nil {
			return err
		}
		for j, i := range part.idx {
			out[i] = st[j]
		}
	}
	return nil
}

// Extend makes each claim that reqs[i].Token holds, unexpired, last lease
// from now unless it lasts longer, in one pipeline; out[i] is OK or Lost.
func (s *Store) Extend(ctx context.Context, reqs []Request, lease time.Duration, out []Status) error {
	leaseMS, windowMS := max(lease.Milliseconds(), 1), s.window.Milliseconds()
	return s.runScript(ctx, extendScript, reqs, out, func(r *Request) []any {
		return []any{claimPrefix(r.Token), leaseMS, windowMS}
	})
}

func (s *Store) runScript(ctx context.Context, sc *goredis.Script, reqs []Request, out []Status, args func(*Request) []any) error {
	cmds, err := s.evalBatch(ctx, sc, reqs, args)
	if err != nil {
		return err
	}
	for i, cmd := range cmds {
		n, err := cmd.Int()
		if err != nil {
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		out[i] = tier.Lost
		if n == 1 {
			out[i] = tier.OK
		}
	}
	return nil
}

// evalBatch runs sc once per request in one pipeline and returns the
// commands, every one answered.
func (s *Store) evalBatch(ctx context.Context, sc *goredis.Script, reqs []Request, args func(*Request) []any) ([]*goredis.Cmd, error) {
	for attempt := 0; ; attempt++ {
		pipe := s.c.Pipeline()
		cmds := make([]*goredis.Cmd, len(reqs))
		for i := range reqs {
			r := &reqs[i]
			cmds[i] = sc.EvalSha(ctx, pipe, []string{s.Key(r.NS, r.Key)}, args(r)...)
		}
		err := s.exec(ctx, pipe)
		if err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT") && attempt == 0 {
			// The server restarted or failed over and lost its scripts;
			// the scripts are idempotent for the caller's token, so the
			// whole batch may run again.
			if err := s.loadScripts(ctx); err != nil {
				return nil, err
			}
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return cmds, nil
	}
}

func isUnavailable(err error) bool {
	var re goredis.Error
	return !errors.As(err, &re) || errors.Is(err, context.DeadlineExceeded)
}
