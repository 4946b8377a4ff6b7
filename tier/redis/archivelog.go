package redis

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/tier"
)

// The archive log (Options.ArchiveLog) is a Redis Stream at Prefix ‖ NUL
// ‖ NUL. A call of the commit script appends the commits it makes as one
// entry, {c: for each commit in turn, a 4-byte big-endian length ‖ the
// record's Redis key ‖ a 4-byte length ‖ its committed value}, at the end
// of the script run that commits them, so a commit Redis holds is in the
// log whatever process dies next; Forget and an undone commit append {k:
// the key, f: 1} and record it in the log's removals hash until the drain
// trims it (Removing). (Logs written before commits were grouped hold {k, v}
// entries of one commit, which ReadLog reads too.) The engine holding the
// drain lease reads the log in order, applies it to the archive (which
// records the last position it applied, in the same transaction) and
// trims what it applied; the commits of one entry share its position and
// are read, applied and trimmed together. What makes an entry invalid (a
// key of another prefix, a value that is no commit, a grouped entry whose
// lengths do not add up to its size): ReadLog refuses the batch
// (ErrUnavailable), and the drain stops there rather than skip a commit.

// logs returns the commit script's archive flag for r.
func (s *Store) logs(r *Request) string {
	if s.logKey != "" && r.Archive {
		return "1"
	}
	return "0"
}

// logsRemovals returns the archive flag of a Forget or an undone commit:
// every removal is appended (one of a key never archived changes nothing).
func (s *Store) logsRemovals() string {
	if s.logKey != "" {
		return "1"
	}
	return "0"
}

func (s *Store) leaseKey() string { return s.prefix + "\x00\xffdrain" }

// LogOwner returns "redis:" ‖ the prefix.
func (s *Store) LogOwner() string { return "redis:" + s.prefix }

func (s *Store) needLog() error {
	if s.logKey == "" {
		return fmt.Errorf("%w: the store keeps no archive log (Options.ArchiveLog)", ErrOptions)
	}
	return nil
}

func parsePos(id string) (tier.LogPos, error) {
	ms, seq, ok := strings.Cut(id, "-")
	if !ok {
		return tier.LogPos{}, fmt.Errorf("stream id %q", id)
	}
	m, err1 := strconv.ParseUint(ms, 10, 64)
	q, err2 := strconv.ParseUint(seq, 10, 64)
	if err1 != nil || err2 != nil {
		return tier.LogPos{}, fmt.Errorf("stream id %q", id)
	}
	return tier.LogPos{MS: m, Seq: q}, nil
}

func formatPos(p tier.LogPos) string {
	return strconv.FormatUint(p.MS, 10) + "-" + strconv.FormatUint(p.Seq, 10)
}

// ReadLog reads up to n stream entries after `after`, in one pipeline
// after the server's TIME: every commit of each, in order (several share
// an entry's position).
func (s *Store) ReadLog(ctx context.Context, after tier.LogPos, n int) ([]tier.LogEntry, int64, error) {
	if err := s.needLog(); err != nil {
		return nil, 0, err
	}
	start := "-"
	if after != (tier.LogPos{}) {
		start = "(" + formatPos(after)
	}
	pipe := s.c.Pipeline()
	tm := pipe.Time(ctx)
	rng := pipe.XRangeN(ctx, s.logKey, start, "+", int64(n))
	if err := s.exec(ctx, pipe); err != nil {
		return nil, 0, fmt.Errorf("%w: reading the archive log: %w", ErrUnavailable, err)
	}
	now, err := tm.Result()
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	msgs, err := rng.Result()
	if err != nil {
		return nil, 0, fmt.Errorf("%w: reading the archive log: %w", ErrUnavailable, err)
	}
	out := make([]tier.LogEntry, 0, len(msgs))
	for _, m := range msgs {
		if out, err = s.decodeEntry(out, m); err != nil {
			return nil, 0, fmt.Errorf("%w: archive log entry %s: %w", ErrUnavailable, m.ID, err)
		}
	}
	return out, now.UnixNano(), nil
}

// decodeEntry appends what stream entry m holds to out: its commits in
// order (a grouped entry), one commit, or a removal.
func (s *Store) decodeEntry(out []tier.LogEntry, m goredis.XMessage) ([]tier.LogEntry, error) {
	pos, err := parsePos(m.ID)
	if err != nil {
		return out, err
	}
	if c, ok := m.Values["c"].(string); ok {
		if len(m.Values) != 1 || c == "" {
			return out, errors.New("a grouped entry holds other fields, or no commit")
		}
		for c != "" {
			var k, v string
			if k, c, ok = cutLength(c); ok {
				v, c, ok = cutLength(c)
			}
			if !ok {
				return out, errors.New("a grouped entry's lengths do not add up to its size")
			}
			e, err := s.logEntry(pos, k)
			if err == nil {
				err = commitOf(&e, v)
			}
			if err != nil {
				return out, err
			}
			out = append(out, e)
		}
		return out, nil
	}
	k, _ := m.Values["k"].(string)
	e, err := s.logEntry(pos, k)
	if err != nil {
		return out, err
	}
	if f, _ := m.Values["f"].(string); f == "1" {
		e.Forget = true
		return append(out, e), nil
	}
	v, _ := m.Values["v"].(string)
	if err := commitOf(&e, v); err != nil {
		return out, err
	}
	return append(out, e), nil
}

// cutLength cuts a 4-byte big-endian length and that many bytes from the
// front of c.
func cutLength(c string) (field, rest string, ok bool) {
	if len(c) < 4 {
		return "", c, false
	}
	n := uint64(binary.BigEndian.Uint32([]byte(c[:4])))
	if uint64(len(c)-4) < n {
		return "", c, false
	}
	return c[4 : 4+n], c[4+n:], true
}

// logEntry is the entry at pos of the record whose Redis key is k.
func (s *Store) logEntry(pos tier.LogPos, k string) (tier.LogEntry, error) {
	rest, ok := strings.CutPrefix(k, s.prefix+"\x00")
	if !ok || len(rest) < 2 || len(rest) < 1+int(rest[0])+1 {
		return tier.LogEntry{}, fmt.Errorf("key %q is no record of prefix %q", k, s.prefix)
	}
	nl := int(rest[0])
	return tier.LogEntry{Pos: pos, Record: tier.Record{NS: []byte(rest[1 : 1+nl]), Key: []byte(rest[1+nl:]), At: int64(pos.MS) * int64(time.Millisecond)}}, nil
}

// commitOf fills e's record from v, a committed value.
func commitOf(e *tier.LogEntry, v string) error {
	r, err := decodeClaim(v)
	if err != nil || r.Status != tier.Committed {
		return errors.New("value is no commit")
	}
	e.Record.Digest, e.Record.Result = r.Digest, r.Result
	if r.At != 0 {
		e.Record.At = r.At // the committing engine's time, as Redis answers it
	}
	return nil
}

// TrimLog deletes the entries up to and including upTo (XTRIM MINID).
func (s *Store) TrimLog(ctx context.Context, upTo tier.LogPos) error {
	if err := s.needLog(); err != nil {
		return err
	}
	pipe := s.c.Pipeline()
	trimScript.EvalSha(ctx, pipe, []string{s.logKey, s.trimmedKey()}, formatPos(tier.LogPos{MS: upTo.MS, Seq: upTo.Seq + 1}), upTo.MS, upTo.Seq)
	err := s.exec(ctx, pipe)
	if err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT") {
		if err = s.loadScripts(ctx); err == nil {
			return s.TrimLog(ctx, upTo)
		}
	}
	if err != nil {
		return fmt.Errorf("%w: trimming the archive log: %w", ErrUnavailable, err)
	}
	return nil
}

func (s *Store) trimmedKey() string { return s.prefix + "\x00\xfftrimmed" }

// removingChunk is how many fields Removing reads in one HMGET.
const removingChunk = 1000

// removingKey is the log's removals hash (logRemoval in logEntryLua).
func (s *Store) removingKey() string { return s.prefix + "\x00\xffremoving" }

// Removing reads the removals hash for each key of namespace ns (HMGET):
// the position of its newest removal the drain has not trimmed yet, or
// the zero position; then, in the same pipeline, the newest position
// trimmed. A trim deletes the fields it passes and records its position
// in one script, so every removal missing from the hash at the HMGET that
// was appended before it is at or before the position read. A field that
// is no stream ID fails the read (ErrUnavailable): the caller cannot know
// what it hides.
func (s *Store) Removing(ctx context.Context, ns string, keys [][]byte) ([]tier.LogPos, tier.LogPos, error) {
	if err := s.needLog(); err != nil {
		return nil, tier.LogPos{}, err
	}
	fields := make([]string, len(keys))
	for i, k := range keys {
		fields[i] = s.Key(ns, k)
	}
	pipe := s.c.Pipeline()
	// HMGETs of removingChunk fields each, so that a batch of many hits
	// does not hold the server in one command; the trim mark is read after
	// the last, which keeps the argument above for every chunk.
	gets := make([]*goredis.SliceCmd, 0, (len(fields)+removingChunk-1)/removingChunk)
	for lo := 0; lo < len(fields); lo += removingChunk {
		gets = append(gets, pipe.HMGet(ctx, s.removingKey(), fields[lo:min(lo+removingChunk, len(fields))]...))
	}
	mark := pipe.Get(ctx, s.trimmedKey())
	if err := s.exec(ctx, pipe); err != nil && !errors.Is(err, goredis.Nil) {
		return nil, tier.LogPos{}, fmt.Errorf("%w: reading the archive log's removals: %w", ErrUnavailable, err)
	}
	vals := make([]any, 0, len(fields))
	for _, get := range gets {
		v, err := get.Result()
		if err != nil {
			return nil, tier.LogPos{}, fmt.Errorf("%w: reading the archive log's removals: %w", ErrUnavailable, err)
		}
		vals = append(vals, v...)
	}
	if len(vals) != len(keys) {
		return nil, tier.LogPos{}, fmt.Errorf("%w: the archive log's removals: %d answers for %d keys", ErrUnavailable, len(vals), len(keys))
	}
	trimmed, err := trimMark(mark)
	if err != nil {
		return nil, tier.LogPos{}, err
	}
	out := make([]tier.LogPos, len(keys))
	for i, v := range vals {
		if v == nil {
			continue
		}
		id, _ := v.(string)
		pos, err := parsePos(id)
		if err != nil {
			return nil, tier.LogPos{}, fmt.Errorf("%w: the archive log's removal of %q: %w", ErrUnavailable, keys[i], err)
		}
		out[i] = pos
	}
	return out, trimmed, nil
}

// trimMark reads the newest position trimmed from mark, the trim mark's
// GET: the zero position where no trim ran yet.
func trimMark(mark *goredis.StringCmd) (tier.LogPos, error) {
	v, err := mark.Result()
	if errors.Is(err, goredis.Nil) {
		return tier.LogPos{}, nil
	}
	if err != nil {
		return tier.LogPos{}, fmt.Errorf("%w: reading the archive log's trim mark: %w", ErrUnavailable, err)
	}
	p, err := parsePos(v)
	if err != nil {
		return tier.LogPos{}, fmt.Errorf("%w: the archive log's trim mark: %w", ErrUnavailable, err)
	}
	return p, nil
}

// LogTail reads the stream's last generated ID, the newest position
// trimmed (as TrimLog recorded it) and the stream's length.
func (s *Store) LogTail(ctx context.Context) (tail, trimmed tier.LogPos, n int64, err error) {
	if err := s.needLog(); err != nil {
		return tail, trimmed, 0, err
	}
	pipe := s.c.Pipeline()
	mark := pipe.Get(ctx, s.trimmedKey())
	info := pipe.XInfoStream(ctx, s.logKey)
	err = s.exec(ctx, pipe)
	if err != nil && ctx.Err() != nil {
		// exec returned at the deadline: the pipeline may still be
		// writing its commands' results.
		return tail, trimmed, 0, fmt.Errorf("%w: reading the archive log: %w", ErrUnavailable, err)
	}
	trimmed, merr := trimMark(mark)
	if merr != nil {
		return tail, trimmed, 0, merr
	}
	if ierr := info.Err(); ierr != nil && strings.Contains(ierr.Error(), "no such key") {
		return tail, trimmed, 0, nil // nothing ever appended
	}
	if err != nil && !errors.Is(err, goredis.Nil) {
		return tail, trimmed, 0, fmt.Errorf("%w: reading the archive log: %w", ErrUnavailable, err)
	}
	in, err := info.Result()
	if err == nil {
		tail, err = parsePos(in.LastGeneratedID)
	}
	if err != nil {
		return tail, trimmed, 0, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return tail, trimmed, in.Length, nil
}

func (s *Store) bindKey() string { return s.prefix + "\x00\xffarchive" }

// Bind records archive beside the layout on first use (SET NX) and
// refuses another.
func (s *Store) Bind(ctx context.Context, archive string) error {
	if err := s.needLog(); err != nil {
		return err
	}
	set, err := s.c.SetNX(ctx, s.bindKey(), archive, 0).Result()
	if err != nil {
		return fmt.Errorf("%w: recording the archive: %w", ErrUnavailable, err)
	}
	if set {
		return nil
	}
	got, err := s.c.Get(ctx, s.bindKey()).Result()
	if err != nil {
		return fmt.Errorf("%w: reading the archive: %w", ErrUnavailable, err)
	}
	if got != archive {
		return fmt.Errorf("%w: %w: prefix %q feeds the archive %q, this process %q (to change it, stop every process on the prefix and delete %q)", tier.ErrLayout, ErrLayout, s.prefix, got, archive, s.bindKey())
	}
	return nil
}

// DrainLease takes or renews the drain lease.
func (s *Store) DrainLease(ctx context.Context, owner string, ttl time.Duration) (bool, error) {
	if err := s.needLog(); err != nil {
		return false, err
	}
	pipe := s.c.Pipeline()
	cmd := leaseScript.EvalSha(ctx, pipe, []string{s.leaseKey()}, owner, max(ttl.Milliseconds(), 1))
	err := s.exec(ctx, pipe)
	if err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT") {
		if err = s.loadScripts(ctx); err == nil {
			return s.DrainLease(ctx, owner, ttl)
		}
	}
	if err != nil {
		return false, fmt.Errorf("%w: the drain lease: %w", ErrUnavailable, err)
	}
	n, err := cmd.Int()
	if err != nil {
		return false, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return n == 1, nil
}

var _ tier.ArchiveLog = (*Store)(nil)
