package redis_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/redis"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

var quiet = log.New(io.Discard, "", 0)

// quietEngine discards an engine\'s logs.
var quietEngine = slog.New(slog.DiscardHandler)

func newStore(t *testing.T, c goredis.UniversalClient, o redis.Options) *redis.Store {
	t.Helper()
	if o.Window == 0 {
		o.Window = time.Hour
	}
	if o.Logger == nil {
		o.Logger = quiet
	}
	s, err := redis.New(context.Background(), c, &o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func tok(i byte) redis.Token { return redis.Token{i, 1, 2, 3} }

func req(key string, t redis.Token) redis.Request {
	return redis.Request{Key: []byte(key), Token: t}
}

func claim(t *testing.T, s *redis.Store, r redis.Request, lease time.Duration) redis.Result {
	t.Helper()
	out := make([]redis.Result, 1)
	if err := s.Claim(context.Background(), []redis.Request{r}, lease, out); err != nil {
		t.Fatal(err)
	}
	return out[0]
}

func commit(s *redis.Store) func(context.Context, []redis.Request, []redis.Status) error {
	return func(ctx context.Context, r []redis.Request, out []redis.Status) error {
		return s.Commit(ctx, 0, r, out)
	}
}

func release(s *redis.Store) func(context.Context, []redis.Request, []redis.Status) error {
	return func(ctx context.Context, r []redis.Request, out []redis.Status) error {
		return s.Release(ctx, 0, r, false, out)
	}
}

func status(t *testing.T, fn func(context.Context, []redis.Request, []redis.Status) error, r redis.Request) redis.Status {
	t.Helper()
	out := make([]redis.Status, 1)
	if err := fn(context.Background(), []redis.Request{r}, out); err != nil {
		t.Fatal(err)
	}
	return out[0]
}

func TestClaimCommitReleaseAndFencing(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	s := newStore(t, c, redis.Options{})
	ctx := context.Background()

	a, b := req("k", tok(1)), req("k", tok(2))
	if r := claim(t, s, a, time.Minute); r.Status != tier.Acquired {
		t.Fatalf("first claim = %v", r.Status)
	}
	if r := claim(t, s, a, time.Minute); r.Status != tier.Acquired {
		t.Fatalf("the same token again (a retry) = %v, want acquired", r.Status)
	}
	if r := claim(t, s, b, time.Minute); r.Status != tier.Held {
		t.Fatalf("another token = %v, want held", r.Status)
	}
	if st := status(t, commit(s), b); st != tier.Lost {
		t.Fatalf("commit by a non-owner = %v", st)
	}
	if st := status(t, release(s), b); st != tier.Lost {
		t.Fatalf("release by a non-owner = %v", st)
	}
	// The lease ends (forced server-side): b takes over, a is fenced out.
	if err := c.PExpire(ctx, s.Key("", []byte("k")), time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	waitGone(t, c, s.Key("", []byte("k")))
	if r := claim(t, s, b, time.Minute); r.Status != tier.Acquired {
		t.Fatalf("claim after the lease = %v", r.Status)
	}
	if st := status(t, commit(s), a); st != tier.Lost {
		t.Fatalf("commit by the expired owner = %v", st)
	}
	if st := status(t, release(s), a); st != tier.Lost {
		t.Fatalf("release by the expired owner = %v", st)
	}
	b.Digest = redis.Digest{9}
	if st := status(t, commit(s), b); st != tier.OK {
		t.Fatalf("commit by the owner = %v", st)
	}
	if st := status(t, commit(s), b); st != tier.OK {
		t.Fatalf("a retried commit = %v, want ok", st)
	}
	if r := claim(t, s, req("k", tok(3)), time.Minute); r.Status != tier.Committed || r.Digest != (redis.Digest{9}) {
		t.Fatalf("claim after commit = %+v", r)
	}
	ttl, _ := c.PTTL(ctx, s.Key("", []byte("k"))).Result()
	if ttl < 59*time.Minute || ttl > time.Hour {
		t.Fatalf("committed TTL = %v, want the window", ttl)
	}
	// Release frees the key for a redelivery.
	x := req("x", tok(4))
	claim(t, s, x, time.Minute)
	if st := status(t, release(s), x); st != tier.OK {
		t.Fatalf("release by the owner = %v", st)
	}
	if r := claim(t, s, req("x", tok(5)), time.Minute); r.Status != tier.Acquired {
		t.Fatalf("claim after release = %v", r.Status)
	}
}

func waitGone(t *testing.T, c goredis.Cmdable, key string) {
	t.Helper()
	for i := 0; i < 500; i++ {
		if n, _ := c.Exists(context.Background(), key).Result(); n == 0 {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("%q did not expire", key)
}

func TestKeysAreExactAndNamespaced(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, srv.Client(t), redis.Options{Prefix: "app:"})
	if got := s.Key("ns", []byte("k\x00\xff")); got != "app:\x00\x02nsk\x00\xff" {
		t.Fatalf("Key = %q", got)
	}
	a := redis.Request{NS: "a", Key: []byte("bc"), Token: tok(1)}
	b := redis.Request{NS: "ab", Key: []byte("c"), Token: tok(2)}
	claim(t, s, a, time.Minute)
	if r := claim(t, s, b, time.Minute); r.Status != tier.Acquired {
		t.Fatalf("(ab, c) collides with (a, bc): %v", r.Status)
	}
	for _, p := range []string{"{tag}", "a\x00b"} {
		if _, err := redis.New(context.Background(), srv.Client(t), &redis.Options{Prefix: p, Window: time.Hour}); !errors.Is(err, redis.ErrOptions) {
			t.Fatalf("prefix %q: %v, want ErrOptions", p, err)
		}
	}
}

// TestPrefixesNeverShareKeys: with prefix "a:", a 98-byte namespace starts
// with the length byte 'b', so in a layout of prefix ‖ len(ns) ‖ ns ‖ key
// its keys reach those of prefix "a:b:". Two deployments must never see
// each other's claims, whatever their namespaces.
func TestPrefixesNeverShareKeys(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	short := newStore(t, c, redis.Options{Prefix: "a:"})
	long := newStore(t, c, redis.Options{Prefix: "a:b:"})
	tail := strings.Repeat("x", 96)
	// short: "a:" ‖ 'b' ‖ (":\x00" ‖ tail) ‖ "k";  long: "a:b:" ‖ 0 ‖ "" ‖ (tail ‖ "k")
	crafted := redis.Request{NS: ":\x00" + tail, Key: []byte("k"), Token: tok(1)}
	victim := redis.Request{Key: []byte(tail + "k"), Token: tok(2)}
	if len(crafted.NS) != 'b' {
		t.Fatalf("namespace of %d bytes", len(crafted.NS))
	}
	if r := claim(t, short, crafted, time.Minute); r.Status != tier.Acquired {
		t.Fatal(r.Status)
	}
	if r := claim(t, long, victim, time.Minute); r.Status != tier.Acquired {
		t.Fatalf("prefix a:b: sees a claim of prefix a: (%v): the layouts overlap", r.Status)
	}
}

// TestDeadlineIsTheCallers: with a client built with default options
// (3 s read timeout, retries), a call against a paused server returns
// ErrUnavailable by the caller's deadline, not the client's.
func TestDeadlineIsTheCallers(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	s := newStore(t, c, redis.Options{})
	defer s.Close()
	srv.Pause()
	defer srv.Resume()
	const deadline = 100 * time.Millisecond
	for name, call := range map[string]func(context.Context) error{
		"claim": func(ctx context.Context) error {
			return s.Claim(ctx, []redis.Request{req("k", tok(1))}, time.Minute, make([]redis.Result, 1))
		},
		"commit": func(ctx context.Context) error {
			return s.Commit(ctx, 0, []redis.Request{req("k", tok(1))}, make([]redis.Status, 1))
		},
		"release": func(ctx context.Context) error {
			return s.Release(ctx, 0, []redis.Request{req("k", tok(1))}, false, make([]redis.Status, 1))
		},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		start := time.Now()
		err := call(ctx)
		took := time.Since(start)
		cancel()
		if !errors.Is(err, redis.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s against a paused server: %v, want ErrUnavailable and DeadlineExceeded", name, err)
		}
		if took > deadline+250*time.Millisecond {
			t.Fatalf("%s returned after %v, deadline %v", name, took, deadline)
		}
	}
}

func TestEvictionPolicyCheck(t *testing.T) {
	srv := redistest.Start(t, "--maxmemory-policy", "allkeys-lru")
	c := srv.Client(t)
	_, err := redis.New(context.Background(), c, &redis.Options{Window: time.Hour, RequireNoEviction: true, Logger: quiet})
	if !errors.Is(err, redis.ErrEvictionPolicy) {
		t.Fatalf("allkeys-lru with RequireNoEviction: %v", err)
	}
	var buf strings.Builder
	if _, err := redis.New(context.Background(), c, &redis.Options{Window: time.Hour, Logger: log.New(&buf, "", 0)}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "allkeys-lru") {
		t.Fatalf("no warning about the policy: %q", buf.String())
	}
}

// TestRedisDownIsTransient: every call fails with ErrUnavailable while the
// server is gone, and works again when it returns.
func TestRedisDownIsTransient(t *testing.T) {
	srv := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	c := srv.ClientWith(t, &goredis.Options{MaxRetries: 1, DialTimeout: 200 * time.Millisecond})
	s := newStore(t, c, redis.Options{})
	a := req("k", tok(1))
	claim(t, s, a, time.Minute)
	srv.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	out := make([]redis.Result, 1)
	if err := s.Claim(ctx, []redis.Request{req("k2", tok(2))}, time.Minute, out); !errors.Is(err, redis.ErrUnavailable) {
		t.Fatalf("claim with Redis down: %v", err)
	}
	if err := s.Commit(ctx, 0, []redis.Request{a}, make([]redis.Status, 1)); !errors.Is(err, redis.ErrUnavailable) {
		t.Fatalf("commit with Redis down: %v", err)
	}
	srv.Restart()
	if st := status(t, commit(s), a); st != tier.OK {
		t.Fatalf("commit after Redis returned = %v (the claim survived in the AOF)", st)
	}
}

// TestRetriedClaimIsOwnClaim loses the reply of a claim the server applied:
// a loopback proxy the test controls forwards the claim to redis-server,
// swallows its reply and drops the connection, so go-redis retries on a new
// connection. The retry must find the caller's own token and answer
// Acquired, not Held.
func TestRetriedClaimIsOwnClaim(t *testing.T) {
	for _, maxAttempts := range []int{0, 3} { // SET NX, or the counting script
		t.Run(fmt.Sprint("max-attempts=", maxAttempts), func(t *testing.T) {
			srv := redistest.Start(t)
			p := startProxy(t, srv.Addr)
			c := goredis.NewClient(&goredis.Options{Addr: p.addr, MaxRetries: 3, MinRetryBackoff: time.Millisecond, MaxRetryBackoff: 5 * time.Millisecond})
			defer c.Close()
			s := newStore(t, c, redis.Options{MaxAttempts: maxAttempts})
			r := req("retried", tok(7))
			p.dropNextReply.Store(true)
			if got := claim(t, s, r, time.Minute); got.Status != tier.Acquired {
				t.Fatalf("retried claim = %v, want acquired", got.Status)
			}
			if p.dropped.Load() != 1 {
				t.Fatalf("the proxy dropped %d replies, want 1: no retry was exercised", p.dropped.Load())
			}
			v, _ := c.Get(context.Background(), s.Key("", []byte("retried"))).Result()
			if !strings.HasPrefix(v, "C"+string(r.Token[:])) {
				t.Fatalf("stored value %q is not the caller's claim", v)
			}
			if other := claim(t, s, req("retried", tok(8)), time.Minute); other.Status != tier.Held {
				t.Fatalf("another token after the retry = %v, want held", other.Status)
			}
		})
	}
}

// proxy forwards loopback TCP to a Redis server. Armed, it swallows the
// reply to the next request that carries a claim (a SET … NX, or a call
// of a claim script) and drops that connection.
type proxy struct {
	addr          string
	dropNextReply atomic.Bool
	dropped       atomic.Int32
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	p := &proxy{addr: l.Addr().String()}
	go func() {
		for {
			cc, err := l.Accept()
			if err != nil {
				return
			}
			sc, err := net.Dial("tcp", target)
			if err != nil {
				cc.Close()
				continue
			}
			var dropReply atomic.Bool
			go func() {
				defer sc.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := cc.Read(buf)
					if n > 0 {
						req := strings.ToLower(string(buf[:n]))
						isClaim := strings.Contains(req, "\r\nnx\r\n")
						for _, h := range redis.ClaimScriptHashes() {
							isClaim = isClaim || strings.Contains(req, "\r\n"+h+"\r\n")
						}
						if isClaim && p.dropNextReply.CompareAndSwap(true, false) {
							dropReply.Store(true)
						}
						if _, werr := sc.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
			go func() {
				defer cc.Close()
				defer sc.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := sc.Read(buf)
					if n > 0 && dropReply.Load() {
						p.dropped.Add(1)
						return // the server applied the claim; its reply is lost
					}
					if n > 0 {
						if _, werr := cc.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return p
}

func TestClusterSpreadsKeys(t *testing.T) {
	cl := redistest.StartCluster(t)
	c := cl.Client(t)
	s := newStore(t, c, redis.Options{})
	reqs := make([]redis.Request, 300)
	for i := range reqs {
		reqs[i] = req(fmt.Sprintf("6ba7b810-9dad-11d1-80b4-%012d", i), tok(1))
	}
	out := make([]redis.Result, len(reqs))
	if err := s.Claim(context.Background(), reqs, time.Minute, out); err != nil {
		t.Fatal(err)
	}
	st := make([]redis.Status, len(reqs))
	if err := s.Commit(context.Background(), 0, reqs, st); err != nil {
		t.Fatal(err)
	}
	for i := range reqs {
		if out[i].Status != tier.Acquired || st[i] != tier.OK {
			t.Fatalf("key %d: claim %v commit %v", i, out[i].Status, st[i])
		}
	}
	for _, m := range cl.Masters {
		n, err := m.Client(t).DBSize(context.Background()).Result()
		if err != nil || n < 50 {
			t.Fatalf("master %s holds %d keys (%v): keys are not spread", m.Addr, n, err)
		}
	}
}

// TestAttemptsAreShared: with MaxAttempts, releases and lease expiries are
// counted in the key's Redis value, by whichever process makes them, and
// the key answers Poisoned once they reach the limit, for the window; a
// commit after the limit is impossible, and a count below it is carried
// by the next claim.
func TestAttemptsAreShared(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	a := newStore(t, srv.Client(t), redis.Options{Prefix: "att:", MaxAttempts: 3, Window: time.Hour})
	b := newStore(t, srv.Client(t), redis.Options{Prefix: "att:", MaxAttempts: 3, Window: time.Hour})
	k := func(i byte) redis.Request { return req("poison", tok(i)) }
	if r := claim(t, a, k(1), time.Minute); r.Status != tier.Acquired || r.Attempts != 0 {
		t.Fatalf("first claim = %+v", r)
	}
	if st := status(t, release(a), k(1)); st != tier.OK { // attempt 1, process a
		t.Fatal(st)
	}
	if r := claim(t, b, k(2), 50*time.Millisecond); r.Status != tier.Acquired || r.Attempts != 1 {
		t.Fatalf("claim after a release elsewhere = %+v, want attempts 1", r)
	}
	time.Sleep(120 * time.Millisecond) // b's lease ends unreleased (its worker hung)
	r := claim(t, a, k(3), time.Minute)
	if r.Status != tier.Acquired || r.Attempts != 2 || !r.Expired {
		t.Fatalf("claim after an expired lease = %+v, want attempts 2, expired", r)
	}
	if st := status(t, commit(b), k(2)); st != tier.Lost {
		t.Fatalf("the expired claim's commit = %v, want lost", st)
	}
	if st := status(t, release(a), k(3)); st != tier.OK { // attempt 3
		t.Fatal(st)
	}
	for _, s := range []*redis.Store{a, b} {
		if r := claim(t, s, k(4), time.Minute); r.Status != tier.Poisoned || r.Attempts != 3 {
			t.Fatalf("after three attempts = %+v, want poisoned", r)
		}
	}
	if ttl, _ := srv.Client(t).PTTL(ctx, a.Key("", []byte("poison"))).Result(); ttl < 59*time.Minute {
		t.Fatalf("the count is kept for %v, want the window", ttl)
	}
}

// TestCommitAfterLeaseIsLost: with MaxAttempts a claim keeps its lease end
// in its value (its TTL is the window, to keep the count), so the commit
// script itself must compare that lease with the server's clock: a commit
// after the lease ended is Lost, and the key stays free, with the expiry
// counted, for the next claim.
func TestCommitAfterLeaseIsLost(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, srv.Client(t), redis.Options{Prefix: "lease:", MaxAttempts: 5})
	a := req("k", tok(1))
	if r := claim(t, s, a, 50*time.Millisecond); r.Status != tier.Acquired {
		t.Fatalf("claim = %+v", r)
	}
	time.Sleep(120 * time.Millisecond)
	if st := status(t, commit(s), a); st != tier.Lost {
		t.Fatalf("commit after the lease = %v, want lost", st)
	}
	if r := claim(t, s, req("k", tok(2)), time.Minute); r.Status != tier.Acquired || !r.Expired || r.Attempts != 1 {
		t.Fatalf("claim after the expired lease = %+v, want acquired with the expiry counted", r)
	}
}

// TestBatchAnswersInPlace: a batch of more keys than one script call
// takes (several chunks, in one pipeline) answers each key in its own
// place, with the archive log's extra key per request and without; keys
// another token holds, or has committed, are interleaved with free ones.
func TestBatchAnswersInPlace(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	for _, archiveLog := range []bool{false, true} {
		t.Run(fmt.Sprint("archive-log=", archiveLog), func(t *testing.T) {
			s := newStore(t, c, redis.Options{MaxAttempts: 3, ArchiveLog: archiveLog, Prefix: fmt.Sprintf("chunks%v:", archiveLog)})
			ctx := context.Background()
			const n = 700 // three chunks
			mine, others := make([]redis.Request, n), []redis.Request{}
			for i := range mine {
				mine[i] = req(fmt.Sprint("k", i), tok(1))
				if i%3 != 0 {
					others = append(others, req(fmt.Sprint("k", i), tok(2)))
				}
			}
			held := make([]redis.Result, len(others))
			if err := s.Claim(ctx, others, time.Minute, held); err != nil {
				t.Fatal(err)
			}
			var committed []redis.Request
			for i, r := range others {
				if held[i].Status != tier.Acquired {
					t.Fatalf("other's claim %d = %v", i, held[i].Status)
				}
				if i%2 == 0 {
					committed = append(committed, r)
				}
			}
			st := make([]redis.Status, len(committed))
			if err := s.Commit(ctx, 0, committed, st); err != nil {
				t.Fatal(err)
			}
			out := make([]redis.Result, n)
			if err := s.Claim(ctx, mine, time.Minute, out); err != nil {
				t.Fatal(err)
			}
			j := 0
			for i := range mine {
				want := tier.Acquired
				if i%3 != 0 {
					want = tier.Held
					if j%2 == 0 {
						want = tier.Committed
					}
					j++
				}
				if out[i].Status != want {
					t.Fatalf("key %d = %v, want %v", i, out[i].Status, want)
				}
				if want == tier.Committed && out[i].Token != tok(2) {
					t.Fatalf("key %d committed by %x, want the other token", i, out[i].Token)
				}
			}
		})
	}
}
