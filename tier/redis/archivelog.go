package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/tier"
)

// The archive log (Options.ArchiveLog) is a Redis Stream at Prefix ‖ NUL
// ‖ NUL. The commit script appends {k: the record's Redis key, v: its
// committed value} in the step that commits, so a commit Redis holds is
// in the log whatever process dies next; Forget and an undone commit
// append {k, f: 1}. The engine holding the drain lease reads the log in
// order, applies it to the archive (which records the last position it
// applied, in the same transaction) and trims what it applied. What makes
// an entry invalid (a key of another prefix, a value that is no commit):
// ReadLog refuses the batch (ErrUnavailable), and the drain stops there
// rather than skip a commit.

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

// ReadLog reads up to n entries after `after`, in one pipeline after the
// server's TIME.
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
		e, err := s.decodeEntry(m)
		if err != nil {
			return nil, 0, fmt.Errorf("%w: archive log entry %s: %w", ErrUnavailable, m.ID, err)
		}
		out = append(out, e)
	}
	return out, now.UnixNano(), nil
}

// decodeEntry reads one stream entry.
func (s *Store) decodeEntry(m goredis.XMessage) (tier.LogEntry, error) {
	pos, err := parsePos(m.ID)
	if err != nil {
		return tier.LogEntry{}, err
	}
	k, _ := m.Values["k"].(string)
	rest, ok := strings.CutPrefix(k, s.prefix+"\x00")
	if !ok || len(rest) < 2 || len(rest) < 1+int(rest[0])+1 {
		return tier.LogEntry{}, fmt.Errorf("key %q is no record of prefix %q", k, s.prefix)
	}
	nl := int(rest[0])
	e := tier.LogEntry{Pos: pos, Record: tier.Record{NS: []byte(rest[1 : 1+nl]), Key: []byte(rest[1+nl:]), At: int64(pos.MS) * int64(time.Millisecond)}}
	if f, _ := m.Values["f"].(string); f == "1" {
		e.Forget = true
		return e, nil
	}
	v, _ := m.Values["v"].(string)
	r, err := decodeClaim(v)
	if err != nil || r.Status != tier.Committed {
		return tier.LogEntry{}, errors.New("value is no commit")
	}
	e.Record.Digest, e.Record.Result = r.Digest, r.Result
	if r.At != 0 {
		e.Record.At = r.At // the committing engine's time, as Redis answers it
	}
	return e, nil
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
	if v, merr := mark.Result(); merr == nil {
		if trimmed, merr = parsePos(v); merr != nil {
			return tail, trimmed, 0, fmt.Errorf("%w: the archive log's trim mark: %w", ErrUnavailable, merr)
		}
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
