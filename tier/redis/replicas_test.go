package redis_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/redis"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// TestFailoverWithReplicaWait: a master and a replica; the replica made to
// lag (its link to the master cut, what the master sends lost on the way),
// an engine marks a batch, the master is SIGKILLed and the
// replica promoted. Without WaitReplicas the batch was acknowledged and
// the promoted replica lost every key of it (replication is
// asynchronous); with WaitReplicas 1 the batch failed with ErrUnavailable
// (its outcome unknown: never acknowledged), and every key acknowledged
// before is on the replica.
func TestFailoverWithReplicaWait(t *testing.T) {
	for _, wait := range []int{0, 1} {
		t.Run(fmt.Sprint("wait=", wait), func(t *testing.T) {
			master := redistest.Start(t)
			link := newLink(t, master.Addr)
			replica := redistest.Start(t, "--replicaof", "127.0.0.1", fmt.Sprint(link.port))
			replica.WaitSynced(t)
			prefix := fmt.Sprintf("wait-%d:", time.Now().UnixNano())
			opts := func(c goredis.UniversalClient) *engine.Options {
				o := &engine.Options{Window: time.Hour, Partition: 10 * time.Minute, Logger: quietEngine}
				o.Backend = redis.NewBackend(c, redis.Config{Prefix: prefix, WaitReplicas: wait, WaitTimeout: 300 * time.Millisecond})
				return o
			}
			e, err := engine.Open(opts(master.ClientWith(t, &goredis.Options{MaxRetries: -1})))
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			ctx := context.Background()
			batch := func(tag string) [][]byte {
				keys := make([][]byte, 500)
				for i := range keys {
					keys[i] = fmt.Appendf(nil, "%s-%d", tag, i)
				}
				return keys
			}
			var acked [][]byte
			mark := func(keys [][]byte) error {
				out := make([]engine.Outcome, len(keys))
				cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				defer cancel()
				if err := e.MarkBatch(cctx, keys, nil, out); err != nil {
					return err
				}
				for i, o := range out {
					if o != engine.New {
						t.Fatalf("mark of %s: %v", keys[i], o)
					}
				}
				acked = append(acked, keys...)
				return nil
			}
			if err := mark(batch("before")); err != nil {
				t.Fatalf("mark with the replica in sync: %v", err)
			}
			link.cut() // lagging: the replica gets nothing written from now on
			err = mark(batch("lagging"))
			switch {
			case wait == 0 && err != nil:
				t.Fatalf("mark without a replica wait, replica lagging: %v", err)
			case wait > 0 && !errors.Is(err, engine.ErrUnavailable):
				t.Fatalf("mark waiting for 1 replica, replica lagging: %v, want ErrUnavailable", err)
			}
			master.Kill()
			rc := replica.Client(t)
			if err := rc.Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil {
				t.Fatal(err)
			}
			promoted, err := engine.Open(&engine.Options{Window: time.Hour, Partition: 10 * time.Minute, Logger: quietEngine,
				Backend: redis.NewBackend(rc, redis.Config{Prefix: prefix})})
			if err != nil {
				t.Fatal(err)
			}
			defer promoted.Close()
			info := make([]engine.KeyInfo, len(acked))
			if err := promoted.LookupBatch(ctx, acked, info); err != nil {
				t.Fatal(err)
			}
			lost := 0
			for _, in := range info {
				if in.Outcome != engine.Duplicate {
					lost++
				}
			}
			t.Logf("WaitReplicas %d: %d keys acknowledged, %d of them lost by the failover", wait, len(acked), lost)
			switch {
			case wait > 0 && lost > 0:
				t.Fatalf("%d of %d acknowledged keys lost with WaitReplicas 1", lost, len(acked))
			case wait == 0 && lost == 0:
				t.Fatal("no acknowledged key lost without a replica wait: the replica did not lag")
			}
		})
	}
}

// BenchmarkReplicaWait: MarkBatch of 256 new keys on a master with one
// replica, without a replica wait and with WaitReplicas 1, in one run:
// keys/s of each (the cost of acknowledging only what a replica holds).
func BenchmarkReplicaWait(b *testing.B) {
	master := redistest.Start(b)
	replica := redistest.StartReplica(b, master)
	replica.WaitSynced(b)
	for _, wait := range []int{0, 1} {
		b.Run(fmt.Sprint("wait=", wait), func(b *testing.B) {
			o := &engine.Options{Window: time.Hour, Partition: 10 * time.Minute, Logger: quietEngine}
			o.Backend = redis.NewBackend(master.Client(b), redis.Config{Prefix: fmt.Sprintf("bw-%d:", time.Now().UnixNano()), WaitReplicas: wait})
			e, err := engine.Open(o)
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			keys := make([][]byte, 256)
			out := make([]engine.Outcome, len(keys))
			b.ResetTimer()
			for i := 0; i < b.N; i += len(keys) {
				for j := range keys {
					keys[j] = fmt.Appendf(keys[j][:0], "k-%d", i+j)
				}
				if err := e.MarkBatch(context.Background(), keys, nil, out); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "keys/s")
		})
	}
}

// link relays a replica's connections to its master, until cut: from then
// on everything either side sends is dropped, as a partitioned network
// drops it.
type link struct {
	port  int
	down  atomic.Bool
	mu    sync.Mutex
	conns []net.Conn
}

func newLink(t *testing.T, master string) *link {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	k := &link{port: l.Addr().(*net.TCPAddr).Port}
	t.Cleanup(func() {
		l.Close()
		k.mu.Lock()
		defer k.mu.Unlock()
		for _, c := range k.conns {
			c.Close()
		}
	})
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", master)
			if err != nil {
				in.Close()
				continue
			}
			k.mu.Lock()
			k.conns = append(k.conns, in, out)
			k.mu.Unlock()
			go k.pipe(out, in)
			go k.pipe(in, out)
		}
	}()
	return k
}

// pipe copies from src to dst while the link is up, and drops what it
// reads once it is cut.
func (k *link) pipe(dst io.Writer, src io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !k.down.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (k *link) cut() { k.down.Store(true) }
