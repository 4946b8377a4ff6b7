package bench

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/integrations/kafkadedup"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// KafkaCrash is where the Kafka form of the crash experiment runs: a
// cluster's brokers and a topic of one partition holding the messages
// (message m at offset m-1). The offsets are committed to the consumer
// group, except by WithLedger, whose consumer (kafkadedup) stores its
// offset with its marks.
type KafkaCrash struct {
	Brokers []string
	Topic   string
}

// CrashTableKafka runs the crash experiment against an in-process Kafka
// cluster (kfake: the real protocol, consumer groups, offset commits, on
// loopback), the consumer processes started by child as for CrashTable.
func CrashTableKafka(ctx context.Context, c CrashConfig, child func(args ...string) *exec.Cmd) ([]CrashRow, error) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "crash"), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		return nil, err
	}
	defer cluster.Close()
	k := KafkaCrash{Brokers: cluster.ListenAddrs(), Topic: "crash"}
	if err := k.produce(ctx, c.Messages); err != nil {
		return nil, err
	}
	c.Kafka = &k
	return CrashTable(ctx, c, child)
}

func (k KafkaCrash) produce(ctx context.Context, messages int) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...), kgo.DefaultProduceTopic(k.Topic))
	if err != nil {
		return err
	}
	defer cl.Close()
	recs := make([]*kgo.Record, 0, messages)
	for m := 1; m <= messages; m++ {
		v := []byte(strconv.Itoa(m))
		recs = append(recs, &kgo.Record{Key: append([]byte("msg-"), v...), Value: v})
	}
	return cl.ProduceSync(ctx, recs...).FirstErr()
}

// args are the child's arguments naming the cluster; group is one per
// strategy.
func (k KafkaCrash) args(s Strategy) []string {
	return []string{"-brokers", strings.Join(k.Brokers, ","), "-topic", k.Topic, "-group", crashGroup(s)}
}

// crashGroup is the consumer group of strategy s's consumers.
func crashGroup(s Strategy) string { return "crash-" + strconv.Itoa(strategyIndex(s)) }

// crashChildTimeout bounds one Kafka consumer run of the crash experiment.
const crashChildTimeout = 2 * time.Minute

// crashQuiet discards the logs of the Kafka consumers.
var crashQuiet = log.New(io.Discard, "", 0)

// quietEngine discards an engine's logs.
var quietEngine = slog.New(slog.DiscardHandler)

// CrashChildKafka is CrashChild for the Kafka form: it consumes the
// topic in group, in offset batches of every, committing the group's
// offset per the strategy (WithLedger: through kafkadedup, the offset
// stored with the marks), with the same kill points and effects.
func CrashChildKafka(ctx context.Context, strategy Strategy, dir string, k KafkaCrash, group string, messages, every, killAt int, afterEffect bool) (err error) {
	// A consumer that cannot make progress (a group that never settles)
	// fails, saying where it was, instead of running forever.
	ctx, cancel := context.WithTimeout(ctx, crashChildTimeout)
	defer cancel()
	var where string
	defer func() {
		if err != nil && ctx.Err() != nil {
			err = fmt.Errorf("%s consumer gave up after %v at %s: %w", strategy, crashChildTimeout, where, err)
		}
	}()
	effects, err := os.OpenFile(filepath.Join(dir, "effects"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer effects.Close()
	wait := func(m int, phase string) error { return waitKill(ctx, m, phase) }
	common := k.consumerOpts()
	if strategy == WithLedger {
		return crashLedgerKafka(ctx, dir, k, group, common, messages, every, killAt, afterEffect, wait, &where)
	}
	c := &crashConsumer{strategy: strategy, effects: effects, killAt: killAt, afterEffect: afterEffect}
	if strategy == WithEngine {
		if c.e, err = engine.Open(&engine.Options{Backend: embedded.Dir(filepath.Join(dir, "dedup")), ExpectedKeys: 10_000, Logger: quietEngine}); err != nil {
			return err
		}
		defer c.e.Close()
	}
	cl, err := kgo.NewClient(append(common, kgo.ConsumerGroup(group), kgo.DisableAutoCommit())...)
	if err != nil {
		return err
	}
	defer cl.Close()
	var buf []*kgo.Record
	for {
		var done bool
		if buf, done, err = pollOffsetBatch(ctx, cl, k.Topic, buf, messages, every, &where); err != nil || done {
			return err
		}
		start := int(buf[0].Offset)
		end := min((start/every+1)*every, messages)
		batch := buf[:end-start]
		buf = buf[end-start:]
		if strategy == OffsetFirst {
			if err := commitGroupOffset(ctx, cl, k.Topic, end); err != nil {
				return err
			}
		}
		for _, r := range batch {
			m := int(r.Offset) + 1
			if err := c.killBefore(ctx, m); err != nil {
				return err
			}
			if err := c.process(ctx, m, r.Key); err != nil {
				return err
			}
		}
		if strategy != OffsetFirst {
			if err := commitGroupOffset(ctx, cl, k.Topic, end); err != nil {
				return err
			}
		}
		if end == messages {
			return nil
		}
	}
}

// consumerOpts are the client options of every crash consumer of k. Short
// session and rebalance timeouts: each kill leaves a dead member that the
// group must drop before the restarted consumer gets the partition.
func (k KafkaCrash) consumerOpts() []kgo.Opt {
	return []kgo.Opt{
		kgo.SeedBrokers(k.Brokers...), kgo.ConsumeTopics(k.Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(20 * time.Millisecond),
		kgo.SessionTimeout(time.Second), kgo.HeartbeatInterval(100 * time.Millisecond),
		kgo.RebalanceTimeout(3 * time.Second),
	}
}

// pollOffsetBatch polls cl until buf holds one whole offset batch: the
// records from the first one read (the group's committed offset, a batch
// boundary) to the batch's end. It returns buf so filled, or done when
// the group's committed offset is already past the messages; it keeps
// *where saying what it waits for.
func pollOffsetBatch(ctx context.Context, cl *kgo.Client, topic string, buf []*kgo.Record, messages, every int, where *string) (_ []*kgo.Record, done bool, _ error) {
	for len(buf) == 0 || int(buf[len(buf)-1].Offset)+1 < min((int(buf[0].Offset)/every+1)*every, messages) {
		*where = fmt.Sprintf("%d records buffered, committed offsets %v", len(buf), cl.CommittedOffsets())
		if len(buf) == 0 && committedAll(cl, topic, messages) {
			return buf, true, nil // OffsetFirst committed past the messages it was killed in
		}
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		fetches := cl.PollRecords(pctx, every)
		cancel()
		if err := ctx.Err(); err != nil {
			return buf, false, err
		}
		buf = append(buf, fetches.Records()...)
	}
	return buf, false, nil
}

// commitGroupOffset commits the group's offset of the topic's partition 0
// past message end, synchronously, and returns the commit's error or the
// first partition's error code.
func commitGroupOffset(ctx context.Context, cl *kgo.Client, topic string, end int) error {
	// Message end is at offset end-1: the next to read is end.
	var cerr error
	cl.CommitOffsetsSync(ctx, map[string]map[int32]kgo.EpochOffset{topic: {0: {Epoch: -1, Offset: int64(end)}}},
		func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
			cerr = err
			for _, t := range resp.Topics {
				for _, p := range t.Partitions {
					if err := kerr.ErrorForCode(p.ErrorCode); err != nil && cerr == nil {
						cerr = err
					}
				}
			}
		})
	return cerr
}

// crashLedgerKafka is WithLedger's consumer: kafkadedup, each record's
// effect a record written with its mark and the partition's offset. A kill
// after the effect lands inside that write, at its first file sync.
func crashLedgerKafka(ctx context.Context, dir string, k KafkaCrash, group string, common []kgo.Opt, messages, every, killAt int, afterEffect bool, wait func(int, string) error, where *string) error {
	hook := &syncHook{FS: vfs.Default}
	member, err := kafkadedup.New(&kafkadedup.Options{
		Group:  group,
		Dir:    filepath.Join(dir, "dedup"),
		Engine: engine.Options{Backend: &embedded.Backend{FS: hook}, ExpectedKeys: 10_000, Logger: quietEngine},
		Logger: crashQuiet,
	})
	if err != nil {
		return err
	}
	defer member.Close()
	cl, err := kgo.NewClient(append(common, member.Opts()...)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	handle := func(_ context.Context, r *kgo.Record) ([]engine.Write, error) {
		m := int(r.Offset) + 1
		if m == killAt && !afterEffect {
			if err := wait(m, "before"); err != nil {
				return nil, err
			}
		}
		if m == killAt && afterEffect {
			hook.arm(func() { _ = wait(m, "effect") })
		}
		return []engine.Write{{Key: fmt.Appendf(nil, "effect/%d/%d-%d", m, os.Getpid(), m), Value: []byte{1}}}, nil
	}
	for {
		// Polls end at offset batch boundaries, as the other strategies'
		// batches do: a kill inside one batch's commit then never covers
		// the next kill point.
		next, held := member.Offset(k.Topic, 0)
		*where = fmt.Sprintf("stored offset %d (held %v), stats %+v", next, held, member.Stats())
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		fetches := cl.PollRecords(pctx, every-int(next)%every)
		cancel()
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := member.Process(ctx, cl, fetches, handle); err != nil {
			return err
		}
		cl.AllowRebalance()
		if next, ok := member.Offset(k.Topic, 0); ok && next >= int64(messages) {
			return nil
		}
	}
}

// committedAll reports whether the group's committed offset, as the client
// fetched it when it joined, is past the last message.
func committedAll(cl *kgo.Client, topic string, messages int) bool {
	o, ok := cl.CommittedOffsets()[topic][0]
	return ok && o.Offset >= int64(messages)
}
