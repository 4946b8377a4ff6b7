package enginetest_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/archive"
	"github.com/tierdedup/tierdedup/tier/embedded"
	"github.com/tierdedup/tierdedup/tier/postgres"
	"github.com/tierdedup/tierdedup/tier/postgres/pgtest"
)

// The PostgreSQL archive's read (tier/postgres: Lookup, Forget, spanned)
// attacked through the engine's public API: keys held in several archived
// partitions (the newest must win, with its Result, digest and time), long
// keys, Forget then Lookup and Mark, longer windows on reopen, spans on
// both sides of the 16,384-partition list, partitions dropped while reads
// run, concurrent callers, and connections ended mid-statement.

// raArchive is a PostgreSQL archive on a fresh table (dropped when the
// test ends) whose connections carry params (application_name=...), and
// an admin pool without them.
func raArchive(t *testing.T, prefix string, params ...string) (postgres.Archive, *pgxpool.Pool, string) {
	t.Helper()
	p := pgtest.Pool(t, params...)
	admin := p
	if len(params) > 0 {
		admin = postgresPool(t)
	}
	table := fmt.Sprintf("%s_%d", prefix, time.Now().UnixNano()%1e9)
	t.Cleanup(func() {
		// The attached partitions go with the parent; detached ones were dropped.
		rows, err := admin.Query(context.Background(), `SELECT tablename FROM pg_tables WHERE tablename LIKE $1`, table+"%")
		var names []string
		if err == nil {
			for rows.Next() {
				var n string
				if rows.Scan(&n) == nil {
					names = append(names, n)
				}
			}
			rows.Close()
		}
		for _, s := range []string{"", "_layout", "_parts", "_blobs", "_log", "_open"} {
			_, _ = admin.Exec(context.Background(), "DROP TABLE IF EXISTS "+table+s+" CASCADE")
		}
		for _, n := range names {
			_, _ = admin.Exec(context.Background(), "DROP TABLE IF EXISTS "+n+" CASCADE")
		}
	})
	return postgres.Archive{DB: p, Table: table}, admin, table
}

// raClaimCommit claims keys in ns with digests and commits the New ones
// with results; it returns the claims' outcomes.
func raClaimCommit(t *testing.T, e *engine.Engine, ns *engine.Namespace, keys [][]byte, digests []engine.Digest, results [][]byte) []engine.Outcome {
	t.Helper()
	ctx := context.Background()
	claims := make([]engine.Claim, len(keys))
	if err := ns.ClaimBatch(ctx, keys, digests, claims); err != nil {
		t.Fatalf("claim: %v", err)
	}
	out := make([]engine.Outcome, len(keys))
	for i := range claims {
		out[i] = claims[i].Outcome
		if claims[i].Outcome == engine.New {
			claims[i].Result = results[i]
		}
	}
	if err := e.CommitBatch(ctx, claims, nil); err != nil {
		t.Fatalf("commit: %v", err)
	}
	return out
}

// raTick moves the clock by d, makes the engine rotate (a Lookup) and
// waits for the archive.
func raTick(t *testing.T, e *engine.Engine, c *fakeClock, d time.Duration) {
	t.Helper()
	c.Add(d)
	if _, err := e.Lookup(context.Background(), []byte("ra-tick")); err != nil {
		t.Fatalf("tick lookup: %v", err)
	}
	waitArchived(t, e)
}

// raLongKey is a key of n bytes whose first 1,000 bytes are shared by all
// such keys (the archive's hashed form keeps 993 of them), ending in tag.
func raLongKey(n int, tag string) []byte {
	k := make([]byte, 0, n)
	for i := 0; i < 1000 && len(k) < n-len(tag); i++ {
		k = append(k, byte('a'+i%26))
	}
	for len(k) < n-len(tag) {
		k = append(k, 'x')
	}
	return append(k, tag...)
}

// raWant is what a key must answer: its outcome and, for a Duplicate, the
// commit's result, digest and time.
type raWant struct {
	outcome engine.Outcome
	result  []byte
	digest  engine.Digest
	at      int64
	// archived: the answer must come from the archive.
	archived bool
}

func raShort(k []byte) string {
	if len(k) > 40 {
		return fmt.Sprintf("%q...(%d bytes)...%q", k[:12], len(k), k[len(k)-12:])
	}
	return fmt.Sprintf("%q", k)
}

// raCheckAll asks every key through LookupBatch, ClaimBatch (with the
// wanted digest, and with another: Conflict), MarkBatch and DoResult, and
// reports what disagrees with want. New claims are released.
func raCheckAll(t *testing.T, e *engine.Engine, ns *engine.Namespace, keys [][]byte, want []raWant, stage string) []string {
	t.Helper()
	ctx := context.Background()
	var bad []string
	info := make([]engine.KeyInfo, len(keys))
	if err := ns.LookupBatch(ctx, keys, info); err != nil {
		t.Fatalf("%s: lookup: %v", stage, err)
	}
	for i, w := range want {
		in := info[i]
		switch {
		case in.Outcome != w.outcome:
			bad = append(bad, fmt.Sprintf("%s: ns %q key %s: Lookup %v from %v, want %v", stage, ns.Name(), raShort(keys[i]), in.Outcome, in.Source, w.outcome))
		case w.outcome == engine.Duplicate && (!bytes.Equal(in.Result, w.result) || in.Digest != w.digest || in.CommittedAt != w.at || w.archived && in.Source != engine.SourceArchive):
			bad = append(bad, fmt.Sprintf("%s: ns %q key %s: Lookup result %q digest %x at %v from %v, want %q %x %v", stage, ns.Name(), raShort(keys[i]),
				in.Result, in.Digest[:4], time.Unix(0, in.CommittedAt).UTC(), in.Source, w.result, w.digest[:4], time.Unix(0, w.at).UTC()))
		}
	}
	digests := make([]engine.Digest, len(keys))
	for i, w := range want {
		digests[i] = w.digest
	}
	claims := make([]engine.Claim, len(keys))
	if err := ns.ClaimBatch(ctx, keys, digests, claims); err != nil {
		t.Fatalf("%s: claim: %v", stage, err)
	}
	for i, w := range want {
		c := claims[i]
		switch {
		case c.Outcome != w.outcome:
			bad = append(bad, fmt.Sprintf("%s: ns %q key %s: Claim %v, want %v", stage, ns.Name(), raShort(keys[i]), c.Outcome, w.outcome))
		case w.outcome == engine.Duplicate && (!bytes.Equal(c.Result, w.result) || c.CommittedAt != w.at):
			bad = append(bad, fmt.Sprintf("%s: ns %q key %s: Claim result %q at %v, want %q %v", stage, ns.Name(), raShort(keys[i]),
				c.Result, time.Unix(0, c.CommittedAt).UTC(), w.result, time.Unix(0, w.at).UTC()))
		}
	}
	if err := e.ReleaseBatch(ctx, claims, nil); err != nil {
		t.Fatalf("%s: release: %v", stage, err)
	}
	// Another digest: a Duplicate whose stored digest is not zero is a
	// Conflict (the stored digest is the newest commit's).
	for i := range digests {
		digests[i] = engine.DigestOf(fmt.Appendf(nil, "other-%d", i))
	}
	if err := ns.ClaimBatch(ctx, keys, digests, claims); err != nil {
		t.Fatalf("%s: claim (other digest): %v", stage, err)
	}
	for i, w := range want {
		wantO := w.outcome
		if w.outcome == engine.Duplicate && w.digest != (engine.Digest{}) {
			wantO = engine.Conflict
		}
		if claims[i].Outcome != wantO {
			bad = append(bad, fmt.Sprintf("%s: ns %q key %s: Claim with another digest %v, want %v", stage, ns.Name(), raShort(keys[i]), claims[i].Outcome, wantO))
		}
	}
	if err := e.ReleaseBatch(ctx, claims, nil); err != nil {
		t.Fatalf("%s: release: %v", stage, err)
	}
	if !ns.Sliding() { // a mark of a sliding key would refresh it
		for i, w := range want {
			if w.outcome != engine.Duplicate {
				continue
			}
			ran := false
			o, res, err := ns.DoResult(ctx, keys[i], func(context.Context) ([]byte, error) { ran = true; return []byte("ran"), nil })
			if err != nil || o != engine.Duplicate || ran || !bytes.Equal(res, w.result) {
				bad = append(bad, fmt.Sprintf("%s: ns %q key %s: DoResult %v %q ran=%v err=%v, want Duplicate %q", stage, ns.Name(), raShort(keys[i]), o, res, ran, err, w.result))
			}
		}
		var dups [][]byte
		for i, w := range want {
			if w.outcome == engine.Duplicate {
				dups = append(dups, keys[i])
			}
		}
		out := make([]engine.Outcome, len(dups))
		if err := ns.MarkBatch(ctx, dups, nil, out); err != nil {
			t.Fatalf("%s: mark: %v", stage, err)
		}
		for i, o := range out {
			if o != engine.Duplicate {
				bad = append(bad, fmt.Sprintf("%s: ns %q key %s: MarkBatch %v, want Duplicate", stage, ns.Name(), raShort(dups[i]), o))
			}
		}
	}
	return bad
}

// raRowsIn checks that the archive table holds each namespace's keys in
// parts[ns] partitions, n keys in each: the test set up what it meant to.
func raRowsIn(t *testing.T, admin *pgxpool.Pool, table string, parts map[string]int, n int) {
	t.Helper()
	for ns, want := range parts {
		rows, err := admin.Query(context.Background(), `SELECT part, count(*) FROM `+table+` WHERE ns = $1 GROUP BY part ORDER BY part`, []byte(ns))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for rows.Next() {
			var p, c int64
			if err := rows.Scan(&p, &c); err != nil {
				t.Fatal(err)
			}
			if c != int64(n) {
				t.Errorf("ns %q: partition %d holds %d keys, want %d", ns, p, c, n)
			}
			got = append(got, fmt.Sprint(p))
		}
		rows.Close()
		if len(got) != want {
			t.Fatalf("ns %q: the archive holds its keys in partitions %v, want %d partitions", ns, got, want)
		}
	}
}

func raFail(t *testing.T, bad []string) {
	t.Helper()
	if len(bad) > 0 {
		t.Fatalf("%d wrong answers:\n%s", len(bad), strings.Join(bad[:min(len(bad), 12)], "\n"))
	}
}

// TestReadAttackNewestPartitionWins: keys the PostgreSQL archive holds in
// several partitions. In a namespace whose own archive window (10 days)
// is shorter than the engine's (21), a key committed on day 0 (result v1,
// digest A) is New on day 11 and committed again (v2, digest B): both
// partitions are archived, and the read returns every matching row now,
// so the newest must win: Duplicate with v2, B and day 11's time (the
// older row would also be archive-expired: New). In a sliding namespace,
// a key committed with a result on day 0 and refreshed on days 3 and 6 is
// in three archived partitions: its time is day 6's. Short and long keys
// (1,025 to 5,000 bytes, stored hashed, sharing their first 1,000 bytes)
// alike; then the engine reopens with a longer Window and ArchiveWindow
// (filter groups of two partitions: wider spans), and the answers hold
// until the namespace's window ends.
func TestReadAttackNewestPartitionWins(t *testing.T) {
	arch, admin, table := raArchive(t, "ra_newest")
	ctx := context.Background()
	clock := newClock()
	fs := vfs.NewMem()
	o := engine.Options{
		Backend: &embedded.Backend{Dir: "store", FS: fs}, Clock: clock, Window: 7 * day, Partition: day,
		ExpectedKeys: 2000, Archive: arch, ArchiveWindow: 21 * day, MaxKeySize: 8192,
		Namespaces: map[string]engine.NamespaceOptions{"short": {ArchiveWindow: 10 * day}, "slide": {Sliding: true}},
	}
	e := open(t, o)
	defer func() { e.Close() }()
	nsOf := func(name string) *engine.Namespace { return raNamespace(t, e, name) }
	keys := [][]byte{[]byte("k-short-1"), []byte("k-short-2"), raLongKey(1025, "A"), raLongKey(1025, "B"), raLongKey(2000, "C"), raLongKey(5000, "D"), raLongKey(1024, "E")}
	n := len(keys)
	res := func(v string, i int) []byte { return fmt.Appendf(nil, "%s-result-%d", v, i) }
	dg := func(v string, i int) engine.Digest { return engine.DigestOf(fmt.Appendf(nil, "%s-payload-%d", v, i)) }
	results := func(v string) [][]byte {
		out := make([][]byte, n)
		for i := range out {
			out[i] = res(v, i)
		}
		return out
	}
	digests := func(v string) []engine.Digest {
		out := make([]engine.Digest, n)
		for i := range out {
			out[i] = dg(v, i)
		}
		return out
	}
	mustAll := func(what string, got []engine.Outcome, want engine.Outcome) {
		t.Helper()
		for i, o := range got {
			if o != want {
				t.Fatalf("%s: key %s: %v, want %v", what, raShort(keys[i]), o, want)
			}
		}
	}

	// Day 0: the default namespace (d), "short" (v1) and "slide" (s1).
	day0 := clock.Now().UnixNano()
	mustAll("default, day 0", raClaimCommit(t, e, nsOf(""), keys, digests("d"), results("d")), engine.New)
	mustAll("short, day 0", raClaimCommit(t, e, nsOf("short"), keys, digests("v1"), results("v1")), engine.New)
	mustAll("slide, day 0", raClaimCommit(t, e, nsOf("slide"), keys, digests("s1"), results("s1")), engine.New)
	var lastSlide int64
	for d := 1; d <= 11; d++ {
		raTick(t, e, clock, day)
		if d == 3 || d == 6 {
			// A duplicate in a later partition refreshes the sliding key:
			// a commit in the current partition, dated now.
			claims := make([]engine.Claim, n)
			if err := nsOf("slide").ClaimBatch(ctx, keys, digests("s1"), claims); err != nil {
				t.Fatal(err)
			}
			for i, c := range claims {
				if c.Outcome != engine.Duplicate || !bytes.Equal(c.Result, res("s1", i)) {
					t.Fatalf("slide, day %d: key %s: %v %q", d, raShort(keys[i]), c.Outcome, c.Result)
				}
			}
			lastSlide = clock.Now().UnixNano()
		}
	}
	// Day 11: the "short" commits of day 0 are 11 days old, past their
	// namespace's 10 days (and the hot window): New, committed again.
	want := make([]raWant, n)
	for i := range want {
		want[i] = raWant{outcome: engine.New}
	}
	raFail(t, raCheckAll(t, e, nsOf("short"), keys, want, "short, day 11, before the second commit"))
	day11 := clock.Now().UnixNano()
	mustAll("short, day 11", raClaimCommit(t, e, nsOf("short"), keys, digests("v2"), results("v2")), engine.New)

	wants := func(v string, at int64) []raWant {
		out := make([]raWant, n)
		for i := range out {
			out[i] = raWant{outcome: engine.Duplicate, result: res(v, i), digest: dg(v, i), at: at, archived: true}
		}
		return out
	}
	check := func(stage string, short bool) {
		t.Helper()
		var bad []string
		bad = append(bad, raCheckAll(t, e, nsOf(""), keys, wants("d", day0), stage)...)
		if short {
			bad = append(bad, raCheckAll(t, e, nsOf("short"), keys, wants("v2", day11), stage)...)
		}
		bad = append(bad, raCheckAll(t, e, nsOf("slide"), keys, wants("s1", lastSlide), stage)...)
		raFail(t, bad)
	}
	// Day 19: day 11's commits left the hot window; the archive holds the
	// "short" keys in partitions 0 and 11, the sliding ones in 0, 3, 6.
	for range 8 {
		raTick(t, e, clock, day)
	}
	raRowsIn(t, admin, table, map[string]int{"short": 2, "slide": 3, "": 1}, n)
	check("day 19", true)

	// Reopened with a longer Window and ArchiveWindow: spans of two
	// partitions a filter slot, over partitions the hot window covers again.
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	o.Window, o.ArchiveWindow = 9*day, 40*day
	e = open(t, o)
	waitArchived(t, e)
	check("day 19, reopened with Window 9 days, ArchiveWindow 40", true)
	raTick(t, e, clock, day)
	check("day 20 (the short keys' second commit 9 days old)", true)
	raTick(t, e, clock, day)
	raTick(t, e, clock, day)
	// Day 22: the second commit is 11 days old: New in "short", while the
	// default namespace's day-0 commits (22 days, inside 40) stay.
	raFail(t, raCheckAll(t, e, nsOf("short"), keys, want, "short, day 22"))
	check("day 22", false)
	if st := e.Stats().Archive; st.Failures > 0 {
		t.Fatalf("%d archiving passes failed", st.Failures)
	}
}

// raSecondOptions are options of one-second partitions, a 10-second
// window and the given archive window.
func raSecondOptions(clock *fakeClock, fs vfs.FS, arch tier.ArchiveBackend, aw time.Duration) engine.Options {
	return engine.Options{
		Backend: &embedded.Backend{Dir: "store", FS: fs}, Clock: clock, Window: 10 * time.Second, Partition: time.Second,
		Lease: 2 * time.Second, ExpectedKeys: 16, Archive: arch, ArchiveWindow: aw, MaxKeySize: 8192,
	}
}

// TestReadAttackSpanBound: one-second partitions and a 6-day archive
// window (518,401 partitions kept: filter slots of 16,723 partitions), the
// clock placed so that a key's span (its filter slot, from the slot's
// first partition up to the first partition not archived) grows, second
// by second, from below the 16,384 partitions the read lists to above it,
// where the read passes no list (every partition). Throughout, keys in
// the default namespace (one commit), in a namespace with a 100-second
// archive window (committed again 101 seconds later: two partitions, the
// newer must win) and in a sliding one (three partitions) answer
// Duplicate with the newest commit's result, digest and time; Forget (a
// span of the whole archive window: no list) makes them New, and marked
// again they are Duplicate once more, from the archive, with the new
// commit.
func TestReadAttackSpanBound(t *testing.T) {
	pg, admin, table := raArchive(t, "ra_span")
	probe := &spanProbe{}
	arch := probe.wrap(pg)
	const aw = 6 * day
	const group = 16723
	if lay := archive.FilterLayout(time.Second, aw); lay.Group != group {
		t.Fatalf("filter layout %+v, want groups of %d partitions", lay, group)
	}
	ctx := context.Background()
	// Offset 16250 seconds into a filter slot (slot g covers partitions
	// [g*group, (g+1)*group)).
	g := newClock().Now().Unix() / group
	base := g * group
	clock := enginetest.ClockAt(time.Unix(base+16250, 5e8))
	fs := vfs.NewMem()
	o := raSecondOptions(clock, fs, arch, aw)
	o.Namespaces = map[string]engine.NamespaceOptions{"short": {ArchiveWindow: 100 * time.Second}, "slide": {Sliding: true}}
	e := open(t, o)
	defer func() { e.Close() }()
	nsOf := func(name string) *engine.Namespace { return raNamespace(t, e, name) }
	offset := func() int64 { return clock.Now().Unix() - base }
	keys := [][]byte{[]byte("span-a"), []byte("span-b"), raLongKey(1025, "L1"), raLongKey(3000, "L2")}
	n := len(keys)
	gen := func(v string) ([][]byte, []engine.Digest) { return raResults(v, n) }
	wants := func(v string, at int64) []raWant {
		rs, ds := gen(v)
		out := make([]raWant, n)
		for i := range out {
			out[i] = raWant{outcome: engine.Duplicate, result: rs[i], digest: ds[i], at: at, archived: true}
		}
		return out
	}
	news := make([]raWant, n)
	for i := range news {
		news[i] = raWant{outcome: engine.New}
	}
	commit := func(ns, v string) int64 {
		t.Helper()
		rs, ds := gen(v)
		at := clock.Now().UnixNano()
		for i, o := range raClaimCommit(t, e, nsOf(ns), keys, ds, rs) {
			if o != engine.New {
				t.Fatalf("ns %q, offset %d: commit of %s: %v, want New", ns, offset(), raShort(keys[i]), o)
			}
		}
		return at
	}
	atP := commit("", "p")
	atK1 := commit("short", "v1")
	atS := commit("slide", "s1")
	_ = atK1
	var atK2 int64
	for offset() < 16446 {
		raTick(t, e, clock, time.Second)
		switch o := offset(); {
		case o == 16253 || o == 16256:
			_, ds := gen("s1")
			raSlideDuplicates(t, nsOf("slide"), keys, ds, fmt.Sprintf("offset %d", o))
			atS = clock.Now().UnixNano()
		case o == 16351:
			raFail(t, raCheckAll(t, e, nsOf("short"), keys, news, "short, 101 s after its commit"))
			atK2 = commit("short", "v2")
		case o == 16365 || o >= 16380 && o <= 16390 || o == 16400 || o == 16420 || o == 16445:
			// The span of every key here: [base, first not archived) =
			// [base, base+o) (the archiver takes each partition once it
			// closes): o partitions, more than 16,384 from o = 16385.
			stage := fmt.Sprintf("offset %d (spans of %d partitions)", o, o)
			var bad []string
			bad = append(bad, raCheckAll(t, e, nsOf(""), keys, wants("p", atP), stage)...)
			bad = append(bad, raCheckAll(t, e, nsOf("short"), keys, wants("v2", atK2), stage)...)
			bad = append(bad, raCheckAll(t, e, nsOf("slide"), keys, wants("s1", atS), stage)...)
			raFail(t, bad)
		}
	}
	raRowsIn(t, admin, table, map[string]int{"short": 2, "slide": 3, "": 1}, n)
	// Forget: its span is the whole archive window (no list).
	for _, name := range []string{"", "short", "slide"} {
		info := make([]engine.KeyInfo, n)
		if err := nsOf(name).ForgetBatch(ctx, keys, info); err != nil {
			t.Fatal(err)
		}
		for i, in := range info {
			if in.Outcome != engine.Duplicate {
				t.Errorf("ns %q: Forget of %s found %v, want the Duplicate it removed", name, raShort(keys[i]), in.Outcome)
			}
		}
		raFail(t, raCheckAll(t, e, nsOf(name), keys, news, fmt.Sprintf("ns %q after Forget", name)))
	}
	if rows := enginetest.PGRows(t, admin, table); rows != 0 {
		t.Errorf("the archive still holds %d rows after every key was forgotten", rows)
	}
	atP2 := commit("", "p2")
	for range 15 {
		raTick(t, e, clock, time.Second)
	}
	raFail(t, raCheckAll(t, e, nsOf(""), keys, wants("p2", atP2), fmt.Sprintf("offset %d, marked again after Forget", offset())))
	probe.mustCover(t, true, true, true)
}

// maxListed is tier/postgres's maxSpanned: the most partitions a read
// lists.
const maxListed = 1 << 14

// spanProbe counts the archive reads by the partitions their spans cover
// together: listed (at most maxListed) or not (more: every partition).
type spanProbe struct {
	lookupsListed, lookupsAll, forgetsListed, forgetsAll atomic.Int64
	maxLookupListed, maxForgetListed                     atomic.Int64
}

func spanUnion(qs []tier.ArchiveQuery) int64 {
	var spans [][2]int64
	for _, q := range qs {
		if q.From < q.To {
			spans = append(spans, [2]int64{q.From, q.To})
		}
	}
	slices.SortFunc(spans, func(a, b [2]int64) int { return int(min(max(a[0]-b[0], -1), 1)) })
	var n int64
	end := int64(-1 << 62)
	for _, sp := range spans {
		lo := max(sp[0], end)
		if sp[1] > lo {
			n += sp[1] - lo
		}
		end = max(end, sp[1])
	}
	return n
}

func (p *spanProbe) count(qs []tier.ArchiveQuery, listed, all, most *atomic.Int64) {
	n := spanUnion(qs)
	if n > maxListed {
		all.Add(1)
		return
	}
	if n > 0 {
		listed.Add(1)
	}
	for {
		m := most.Load()
		if n <= m || most.CompareAndSwap(m, n) {
			return
		}
	}
}

func (p *spanProbe) wrap(b tier.ArchiveBackend) tier.ArchiveBackend {
	return wrappedArchive{b, func(a tier.Archive) tier.Archive { return probedStore{a, p} }}
}

// mustCover fails t unless the reads included lookups listed and not
// (lookupsAll) and forgets not listed (forgetsAll).
func (p *spanProbe) mustCover(t *testing.T, lookupsListed, lookupsAll, forgetsAll bool) {
	t.Helper()
	t.Logf("archive reads: lookups %d listed (at most %d partitions), %d of every partition; forgets %d listed (at most %d), %d of every partition",
		p.lookupsListed.Load(), p.maxLookupListed.Load(), p.lookupsAll.Load(), p.forgetsListed.Load(), p.maxForgetListed.Load(), p.forgetsAll.Load())
	if lookupsListed && p.lookupsListed.Load() == 0 || lookupsAll && p.lookupsAll.Load() == 0 || forgetsAll && p.forgetsAll.Load() == 0 {
		t.Fatalf("the test did not reach the reads it meant to")
	}
}

type probedStore struct {
	tier.Archive
	p *spanProbe
}

func (s probedStore) Lookup(ctx context.Context, qs []tier.ArchiveQuery, out []tier.Answer) error {
	s.p.count(qs, &s.p.lookupsListed, &s.p.lookupsAll, &s.p.maxLookupListed)
	return s.Archive.Lookup(ctx, qs, out)
}

func (s probedStore) Forget(ctx context.Context, qs []tier.ArchiveQuery, out []tier.Answer) error {
	s.p.count(qs, &s.p.forgetsListed, &s.p.forgetsAll, &s.p.maxForgetListed)
	return s.Archive.Forget(ctx, qs, out)
}

// TestReadAttackForgetSpanBound: Forget's span is the whole archive
// window ([oldest, first not archived)): with one-second partitions and
// archive windows of 16,383, 16,384 and 16,385 seconds it lists 16,383
// and 16,384 partitions, then none (every partition). Keys (short and
// long) committed with a result are forgotten while their partition is
// both archived and still in the hot window (the archiver takes a
// partition once it closes), or once only the archive holds them; each
// is New at once and after the window passed (nothing comes back), the
// others keep their result; marked again with another result they are
// Duplicate with it, from the archive, which holds one row for them.
func TestReadAttackForgetSpanBound(t *testing.T) {
	for _, aw := range []int64{16383, 16384, 16385} {
		t.Run(fmt.Sprint(aw), func(t *testing.T) {
			pg, admin, table := raArchive(t, "ra_fspan")
			probe := &spanProbe{}
			clock := newClock()
			fs := vfs.NewMem()
			e := open(t, raSecondOptions(clock, fs, probe.wrap(pg), time.Duration(aw)*time.Second))
			defer func() { e.Close() }()
			ns, _ := e.Namespace("")
			keys := [][]byte{[]byte("f-a"), []byte("f-b"), []byte("f-c"), raLongKey(1025, "f-d"), raLongKey(1500, "f-e"), raLongKey(4000, "f-f")}
			gen := func(v string) ([][]byte, []engine.Digest) {
				rs, ds := make([][]byte, len(keys)), make([]engine.Digest, len(keys))
				for i := range rs {
					rs[i] = fmt.Appendf(nil, "%s-%d", v, i)
					ds[i] = engine.DigestOf(rs[i])
				}
				return rs, ds
			}
			rs, ds := gen("r1")
			at1 := clock.Now().UnixNano()
			for i, o := range raClaimCommit(t, e, ns, keys, ds, rs) {
				if o != engine.New {
					t.Fatalf("key %d: %v", i, o)
				}
			}
			want := make([]raWant, len(keys))
			for i := range want {
				want[i] = raWant{outcome: engine.Duplicate, result: rs[i], digest: ds[i], at: at1}
			}
			forget := func(idx []int, stage string) {
				t.Helper()
				fk := make([][]byte, len(idx))
				for j, i := range idx {
					fk[j] = keys[i]
				}
				info := make([]engine.KeyInfo, len(fk))
				if err := ns.ForgetBatch(context.Background(), fk, info); err != nil {
					t.Fatalf("%s: forget: %v", stage, err)
				}
				for j, i := range idx {
					if info[j].Outcome != engine.Duplicate || !bytes.Equal(info[j].Result, want[i].result) {
						t.Errorf("%s: Forget of %s found %v %q, want the Duplicate %q", stage, raShort(keys[i]), info[j].Outcome, info[j].Result, want[i].result)
					}
					want[i] = raWant{outcome: engine.New}
				}
			}
			raTick(t, e, clock, 3*time.Second) // partition closed and archived, still hot
			raFail(t, raCheckAll(t, e, ns, keys, want, "3 s on"))
			forget([]int{0, 3}, "3 s on")
			raFail(t, raCheckAll(t, e, ns, keys, want, "3 s on, forgotten"))
			raTick(t, e, clock, 10*time.Second) // only the archive holds them
			for i := range want {
				want[i].archived = want[i].outcome == engine.Duplicate
			}
			raFail(t, raCheckAll(t, e, ns, keys, want, "13 s on"))
			forget([]int{1, 4, 5}, "13 s on")
			raFail(t, raCheckAll(t, e, ns, keys, want, "13 s on, forgotten"))
			// Marked again with another result.
			again := [][]byte{keys[0], keys[1], keys[3], keys[4], keys[5]}
			rs2, ds2 := gen("r2")
			at2 := clock.Now().UnixNano()
			for j, o := range raClaimCommit(t, e, ns, again, []engine.Digest{ds2[0], ds2[1], ds2[3], ds2[4], ds2[5]}, [][]byte{rs2[0], rs2[1], rs2[3], rs2[4], rs2[5]}) {
				if o != engine.New {
					t.Fatalf("forgotten key %s marked again: %v, want New", raShort(again[j]), o)
				}
			}
			for _, i := range []int{0, 1, 3, 4, 5} {
				want[i] = raWant{outcome: engine.Duplicate, result: rs2[i], digest: ds2[i], at: at2}
			}
			raTick(t, e, clock, 12*time.Second)
			for i := range want {
				want[i].archived = true
			}
			raFail(t, raCheckAll(t, e, ns, keys, want, "marked again, 12 s on"))
			if rows := enginetest.PGRows(t, admin, table); rows != len(keys) {
				t.Errorf("the archive holds %d rows, want one a key (%d)", rows, len(keys))
			}
			probe.mustCover(t, false, false, aw > maxListed)
			if aw <= maxListed && (probe.forgetsListed.Load() == 0 || probe.maxForgetListed.Load() < aw-1) {
				t.Fatalf("forgets listed %d partitions at most, want about %d", probe.maxForgetListed.Load(), aw)
			}
		})
	}
}

// raHist is an engine (day partitions, a 7-day window, a 21-day archive
// window, and a namespace "short" with an archive window of 10 days) that
// committed, with results and digests, perDay keys a day for 12 days (a
// tenth of them longer than 1,024 bytes) in the default namespace, and
// the "short" keys on day 0 and again on day 11; the clock then moved to
// day 19, so that every commit left the hot window: the archive holds
// them, the "short" keys in two partitions (the older one past their
// namespace's window).
type raHist struct {
	t     *testing.T
	clock *fakeClock
	e     *engine.Engine
	o     engine.Options
	keys  map[string][][]byte // by namespace
	want  map[string]map[string]raWant
}

func raHistKey(d, i int) []byte {
	if i%10 == 9 {
		return raLongKey(1030+37*i, fmt.Sprintf("h%02d-%03d", d, i))
	}
	return fmt.Appendf(nil, "h%02d-%03d", d, i)
}

func newRaHist(t *testing.T, arch tier.ArchiveBackend, perDay int) *raHist {
	t.Helper()
	clock := newClock()
	fs := vfs.NewMem()
	h := &raHist{t: t, clock: clock, keys: map[string][][]byte{}, want: map[string]map[string]raWant{"": {}, "short": {}}}
	h.o = engine.Options{
		Backend: &embedded.Backend{Dir: "store", FS: fs}, Clock: clock, Window: 7 * day, Partition: day,
		ExpectedKeys: 2000, Archive: arch, ArchiveWindow: 21 * day, MaxKeySize: 8192,
		Namespaces: map[string]engine.NamespaceOptions{"short": {ArchiveWindow: 10 * day}},
	}
	h.e = open(t, h.o)
	commit := func(ns string, keys [][]byte, v string) {
		n, _ := h.e.Namespace(ns)
		rs, ds := make([][]byte, len(keys)), make([]engine.Digest, len(keys))
		for i := range keys {
			rs[i] = fmt.Appendf(nil, "%s-%s-%d", ns, v, i)
			ds[i] = engine.DigestOf(rs[i])
		}
		at := clock.Now().UnixNano()
		for i, o := range raClaimCommit(t, h.e, n, keys, ds, rs) {
			if o != engine.New {
				t.Fatalf("ns %q %s: commit of %s: %v", ns, v, raShort(keys[i]), o)
			}
			h.want[ns][string(keys[i])] = raWant{outcome: engine.Duplicate, result: rs[i], digest: ds[i], at: at, archived: true}
		}
	}
	short := [][]byte{[]byte("s-1"), []byte("s-2"), raLongKey(1200, "s-3"), raLongKey(2500, "s-4")}
	h.keys["short"] = short
	for d := range 12 {
		keys := make([][]byte, perDay)
		for i := range keys {
			keys[i] = raHistKey(d, i)
		}
		h.keys[""] = append(h.keys[""], keys...)
		commit("", keys, fmt.Sprintf("d%02d", d))
		if d == 0 {
			commit("short", short, "v1")
		}
		if d == 11 {
			info := make([]engine.KeyInfo, len(short))
			n, _ := h.e.Namespace("short")
			if err := n.LookupBatch(context.Background(), short, info); err != nil {
				t.Fatal(err)
			}
			for i, in := range info {
				if in.Outcome != engine.New {
					t.Fatalf("short key %s, 11 days old: %v, want New", raShort(short[i]), in.Outcome)
				}
			}
			commit("short", short, "v2")
		}
		raTick(t, h.e, clock, day)
	}
	for range 7 {
		raTick(t, h.e, clock, day)
	}
	return h
}

// check asks every key of ns by LookupBatch and reports what disagrees.
func (h *raHist) check(ns string, extra map[string]raWant) []string {
	n, _ := h.e.Namespace(ns)
	keys := append([][]byte(nil), h.keys[ns]...)
	for k := range extra {
		keys = append(keys, []byte(k))
	}
	info := make([]engine.KeyInfo, len(keys))
	raLookupSettled(h.t, n, keys, info)
	var bad []string
	for i, k := range keys {
		w, ok := extra[string(k)]
		if !ok {
			w = h.want[ns][string(k)]
		}
		if msg := raCompare(info[i], w); msg != "" {
			bad = append(bad, fmt.Sprintf("ns %q key %s: %s", ns, raShort(k), msg))
		}
	}
	return bad
}

// raLookupSettled is LookupBatch once the archive's pool is over a
// nemesis: a connection it ended may still wait in the pool, and the first
// calls that take one fail (ErrUnavailable, as they must).
func raLookupSettled(t *testing.T, n *engine.Namespace, keys [][]byte, info []engine.KeyInfo) {
	t.Helper()
	var err error
	for range 20 {
		if err = n.LookupBatch(context.Background(), keys, info); err == nil {
			return
		}
		if !errors.Is(err, engine.ErrUnavailable) {
			break
		}
	}
	t.Fatalf("lookup: %v", err)
}

// raCompare says how a Lookup's answer disagrees with w ("" if not).
func raCompare(in engine.KeyInfo, w raWant) string {
	switch {
	case in.Outcome != w.outcome:
		return fmt.Sprintf("Lookup %v from %v, want %v", in.Outcome, in.Source, w.outcome)
	case w.outcome == engine.Duplicate && (!bytes.Equal(in.Result, w.result) || in.Digest != w.digest || in.CommittedAt != w.at || w.archived && in.Source != engine.SourceArchive):
		return fmt.Sprintf("Lookup result %q digest %x at %v from %v, want %q %x %v", in.Result, in.Digest[:4], time.Unix(0, in.CommittedAt).UTC(), in.Source, w.result, w.digest[:4], time.Unix(0, w.at).UTC())
	}
	return ""
}

// raNemesis ends every server connection of application app every
// `every` until stop is closed; it returns how many it ended and the
// first error, once stopped.
func raNemesis(admin *pgxpool.Pool, app string, every time.Duration, stop <-chan struct{}) func() (int64, error) {
	var n atomic.Int64
	done := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				done <- nil
				return
			case <-time.After(every):
			}
			var k int64
			if err := admin.QueryRow(context.Background(), "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&k); err != nil {
				done <- err
				return
			}
			n.Add(k)
		}
	}()
	return func() (int64, error) { err := <-done; return n.Load(), err }
}

// raResults is n results of version v ("v-0" …) and their digests.
func raResults(v string, n int) ([][]byte, []engine.Digest) {
	rs, ds := make([][]byte, n), make([]engine.Digest, n)
	for i := range rs {
		rs[i] = fmt.Appendf(nil, "%s-%d", v, i)
		ds[i] = engine.DigestOf(rs[i])
	}
	return rs, ds
}

// raNamespace is e's namespace name, failing t if e refuses it.
func raNamespace(t *testing.T, e *engine.Engine, name string) *engine.Namespace {
	t.Helper()
	n, err := e.Namespace(name)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// raSlideDuplicates claims keys (with digests ds) in the sliding namespace
// ns, which refreshes them, and fails t at stage unless each is a
// Duplicate.
func raSlideDuplicates(t *testing.T, ns *engine.Namespace, keys [][]byte, ds []engine.Digest, stage string) {
	t.Helper()
	claims := make([]engine.Claim, len(keys))
	if err := ns.ClaimBatch(context.Background(), keys, ds, claims); err != nil {
		t.Fatal(err)
	}
	for i, c := range claims {
		if c.Outcome != engine.Duplicate {
			t.Fatalf("slide, %s: %s: %v", stage, raShort(keys[i]), c.Outcome)
		}
	}
}

// raSettle waits for the goroutines of wg, stops the nemesis and fails t
// with every error they reported; it returns how many connections the
// nemesis ended.
func raSettle(t *testing.T, wg *sync.WaitGroup, stop chan struct{}, stopped func() (int64, error), errs chan error) int64 {
	t.Helper()
	wg.Wait()
	close(stop)
	ended, err := stopped()
	if err != nil {
		t.Fatal(err)
	}
	// A connection the nemesis ended while it sat idle in the pool fails
	// the first statement sent on it (ErrUnavailable), unless it idled
	// over a second: pgxpool pings those before handing them out. The
	// checks after the nemesis read the archive once each.
	time.Sleep(1100 * time.Millisecond)
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}
	return ended
}

// TestReadAttackNemesisResults: while a nemesis ends the archive's server
// connections every 25 ms, five goroutines (each with archived keys of
// its own) use the archive's read through every call that reaches it:
// LookupBatch (archived keys, the "short" keys held in two partitions,
// keys never seen), ClaimBatch of archived and fresh keys (the fresh ones committed with a result),
// MarkBatch, DoResult and ForgetBatch. Every answer carries the newest
// commit's result, digest and time; a failed call matches ErrUnavailable
// and changed nothing: its retry answers fresh keys New (not InFlight: no
// claim left behind), DoResult ran nothing, and a Forget's retry
// completes it. Afterwards every key answers as it should.
func TestReadAttackNemesisResults(t *testing.T) {
	app := fmt.Sprintf("ra-nemesis-%d", time.Now().UnixNano())
	pg, admin, _ := raArchive(t, "ra_nem", "application_name="+app)
	h := newRaHist(t, pg, 40)
	defer func() { h.e.Close() }()
	e := h.e
	def, _ := e.Namespace("")
	short, _ := e.Namespace("short")
	ctx := context.Background()

	stop := make(chan struct{})
	stopped := raNemesis(admin, app, 25*time.Millisecond, stop)
	var failed, calls atomic.Int64
	errs := make(chan error, 16)
	report := func(format string, args ...any) { errs <- fmt.Errorf(format, args...) }
	// retry runs call until it succeeds; a failure must match ErrUnavailable.
	retry := func(what string, call func() error) bool {
		for try := 0; ; try++ {
			calls.Add(1)
			err := call()
			if err == nil {
				return true
			}
			if !errors.Is(err, engine.ErrUnavailable) {
				report("%s: %v, want ErrUnavailable", what, err)
				return false
			}
			failed.Add(1)
			if try > 200 {
				report("%s: still failing after %d tries: %v", what, try, err)
				return false
			}
		}
	}
	all := h.keys[""]
	// The last key of each day's first ten is the forgetter's own (days
	// 0..11: keys h..-008); nobody else asks them.
	var forgettable [][]byte
	for d := range 12 {
		forgettable = append(forgettable, raHistKey(d, 8))
	}
	isForgettable := func(k []byte) bool { return bytes.HasSuffix(k, []byte("-008")) }
	var mu sync.Mutex
	fresh := map[string]raWant{} // committed during the run, default namespace
	forgotten := map[string]bool{}
	deadline := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	// Each goroutine asks its own archived keys (a key a concurrent call
	// holds may be answered InFlight meanwhile, as documented).
	pick := func(rng *rand.Rand, n, slot int) [][]byte {
		var out [][]byte
		for len(out) < n {
			j := rng.IntN(len(all))
			if k := all[j]; j%4 == slot && !isForgettable(k) {
				out = append(out, k)
			}
		}
		return out
	}
	// Lookups.
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(1, 1))
		for b := 0; time.Now().Before(deadline); b++ {
			keys := pick(rng, 24, 0)
			keys = append(keys, h.keys["short"]...)
			keys = append(keys, fmt.Appendf(nil, "never-%d", b))
			info := make([]engine.KeyInfo, len(keys))
			if !retry("lookup", func() error { return def.LookupBatch(ctx, keys[:24], info[:24]) }) ||
				!retry("lookup short", func() error { return short.LookupBatch(ctx, keys[24:28], info[24:28]) }) ||
				!retry("lookup never", func() error { return def.LookupBatch(ctx, keys[28:], info[28:]) }) {
				return
			}
			for i, in := range info {
				w := raWant{outcome: engine.New}
				if i < 24 {
					w = h.want[""][string(keys[i])]
				} else if i < 28 {
					w = h.want["short"][string(keys[i])]
				}
				if msg := raCompare(in, w); msg != "" {
					report("lookup batch %d: %s: %s", b, raShort(keys[i]), msg)
					return
				}
			}
		}
	})
	// Claims of archived and fresh keys; the fresh ones committed.
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(2, 2))
		for b := 0; time.Now().Before(deadline); b++ {
			keys := pick(rng, 13, 1)
			for i := range 6 {
				keys = append(keys, fmt.Appendf(nil, "claimed-%d-%d", b, i))
			}
			claims := make([]engine.Claim, len(keys))
			for try := 0; ; try++ {
				if !retry("claim", func() error {
					return def.ClaimBatch(ctx, keys, nil, claims)
				}) {
					return
				}
				break
			}
			for i, c := range claims {
				switch {
				case i < 13:
					w := h.want[""][string(keys[i])]
					if c.Outcome != engine.Duplicate || !bytes.Equal(c.Result, w.result) || c.CommittedAt != w.at {
						report("claim batch %d: %s: %v %q at %d, want Duplicate %q at %d", b, raShort(keys[i]), c.Outcome, c.Result, c.CommittedAt, w.result, w.at)
						return
					}
				case c.Outcome != engine.New:
					report("claim batch %d: fresh %s: %v, want New (a failed claim left it held?)", b, keys[i], c.Outcome)
					return
				default:
					claims[i].Result = fmt.Appendf(nil, "res-%s", keys[i])
				}
			}
			at := h.clock.Now().UnixNano()
			if err := e.CommitBatch(ctx, claims, nil); err != nil {
				report("commit: %v", err)
				return
			}
			mu.Lock()
			for _, k := range keys[13:] {
				fresh[string(k)] = raWant{outcome: engine.Duplicate, result: fmt.Appendf(nil, "res-%s", k), at: at}
			}
			mu.Unlock()
		}
	})
	// Marks.
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(3, 3))
		for b := 0; time.Now().Before(deadline); b++ {
			keys := pick(rng, 16, 2)
			for i := range 8 {
				keys = append(keys, fmt.Appendf(nil, "marked-%d-%d", b, i))
			}
			out := make([]engine.Outcome, len(keys))
			if !retry("mark", func() error { return def.MarkBatch(ctx, keys, nil, out) }) {
				return
			}
			for i, o := range out {
				want := engine.Duplicate
				if i >= 16 {
					want = engine.New
				}
				if o != want {
					report("mark batch %d: %s: %v, want %v (a failed mark marked it?)", b, raShort(keys[i]), o, want)
					return
				}
			}
			mu.Lock()
			for _, k := range keys[16:] {
				fresh[string(k)] = raWant{outcome: engine.Duplicate}
			}
			mu.Unlock()
		}
	})
	// DoResult.
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(4, 4))
		for b := 0; time.Now().Before(deadline); b++ {
			k := pick(rng, 1, 3)[0]
			if b%2 == 1 {
				k = fmt.Appendf(nil, "done-%d", b)
			}
			var ran atomic.Int64
			var o engine.Outcome
			var res []byte
			if !retry("DoResult", func() error {
				var err error
				o, res, err = def.DoResult(ctx, k, func(context.Context) ([]byte, error) {
					ran.Add(1)
					return fmt.Appendf(nil, "did-%s", k), nil
				})
				return err
			}) {
				return
			}
			switch w, archived := h.want[""][string(k)]; {
			case archived && (o != engine.Duplicate || ran.Load() != 0 || !bytes.Equal(res, w.result)):
				report("DoResult %s: %v %q, ran %d times; want Duplicate %q, not run", raShort(k), o, res, ran.Load(), w.result)
				return
			case !archived && (o != engine.New || ran.Load() != 1):
				report("DoResult fresh %s: %v, ran %d times; want New, run once", k, o, ran.Load())
				return
			}
		}
	})
	// Forgets, each followed by a Lookup: New.
	wg.Go(func() {
		for i, k := range forgettable {
			if !time.Now().Before(deadline) {
				break
			}
			info := make([]engine.KeyInfo, 1)
			if !retry("forget", func() error { return def.ForgetBatch(ctx, [][]byte{k}, info) }) {
				return
			}
			mu.Lock()
			forgotten[string(k)] = true
			mu.Unlock()
			if !retry("lookup after forget", func() error { return def.LookupBatch(ctx, [][]byte{k}, info) }) {
				return
			}
			if info[0].Outcome != engine.New {
				report("key %d %s after Forget: %v from %v, want New", i, raShort(k), info[0].Outcome, info[0].Source)
				return
			}
			time.Sleep(150 * time.Millisecond)
		}
	})
	ended := raSettle(t, &wg, stop, stopped, errs)
	t.Logf("%d calls, %d failed, %d connections ended, %d keys forgotten, %d fresh keys", calls.Load(), failed.Load(), ended, len(forgotten), len(fresh))
	if ended == 0 || failed.Load() == 0 {
		t.Fatalf("the nemesis did not bite: %d connections ended, %d calls failed", ended, failed.Load())
	}
	for k := range forgotten {
		h.want[""][k] = raWant{outcome: engine.New}
	}
	extra := map[string]raWant{}
	for k, w := range fresh {
		if w.result == nil {
			// Marked without a result: Duplicate, no result, no time.
			extra[k] = raWant{outcome: engine.Duplicate}
			continue
		}
		extra[k] = w
	}
	var bad []string
	for _, in := range []struct {
		ns    string
		extra map[string]raWant
	}{{"", nil}, {"short", nil}} {
		bad = append(bad, h.check(in.ns, in.extra)...)
	}
	// The fresh keys: Duplicate, with their result where they had one.
	keys := make([][]byte, 0, len(extra))
	for k := range extra {
		keys = append(keys, []byte(k))
	}
	info := make([]engine.KeyInfo, len(keys))
	raLookupSettled(t, def, keys, info)
	for i, k := range keys {
		w := extra[string(k)]
		if info[i].Outcome != engine.Duplicate || w.result != nil && !bytes.Equal(info[i].Result, w.result) {
			bad = append(bad, fmt.Sprintf("fresh key %s: %v %q, want Duplicate %q", k, info[i].Outcome, info[i].Result, w.result))
		}
	}
	raFail(t, bad)
}

// TestReadAttackConcurrentSameKeys: four goroutines mark (MarkBatch) or
// claim and commit with a result (ClaimBatch, CommitBatch) the same 2,400
// fresh keys, each in its own order and in batches mixed with archived
// keys, while a fifth looks them up and a nemesis ends the archive's
// connections every 20 ms. Each fresh key is New exactly once across all
// of them (a failed call marks nothing, so its retry may be the New; a
// call that marked and failed would leave none); an archived key is never
// New; a key once acknowledged New is never looked up New; afterwards
// every fresh key holds the result of the claim that won it.
func TestReadAttackConcurrentSameKeys(t *testing.T) {
	app := fmt.Sprintf("ra-same-%d", time.Now().UnixNano())
	pg, admin, _ := raArchive(t, "ra_same", "application_name="+app)
	h := newRaHist(t, pg, 30)
	defer func() { h.e.Close() }()
	e := h.e
	def, _ := e.Namespace("")
	ctx := context.Background()
	const nFresh = 2400
	fresh := make([][]byte, nFresh)
	for i := range fresh {
		fresh[i] = fmt.Appendf(nil, "same-%03d", i)
		if i%8 == 7 {
			fresh[i] = raLongKey(1100+i, fmt.Sprintf("same-%03d", i))
		}
	}
	index := map[string]int{}
	for i, k := range fresh {
		index[string(k)] = i
	}
	var news [nFresh]atomic.Int32
	var acked [nFresh]atomic.Bool
	var winner [nFresh]atomic.Pointer[[]byte] // the result the New claim committed, nil for a mark
	archived := h.keys[""]

	stop := make(chan struct{})
	stopped := raNemesis(admin, app, 20*time.Millisecond, stop)
	var failed atomic.Int64
	errs := make(chan error, 16)
	report := func(format string, args ...any) { errs <- fmt.Errorf(format, args...) }
	var wg sync.WaitGroup
	var workers sync.WaitGroup
	for g := range 4 {
		workers.Add(1)
		wg.Go(func() {
			defer workers.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			pending := rng.Perm(nFresh)
			for round := 0; len(pending) > 0; round++ {
				if round > 400 {
					report("goroutine %d: %d keys still undecided", g, len(pending))
					return
				}
				var next []int
				for lo := 0; lo < len(pending); lo += 10 {
					idx := pending[lo:min(lo+10, len(pending))]
					keys := make([][]byte, 0, 2*len(idx))
					for _, i := range idx {
						keys = append(keys, fresh[i])
					}
					for range 6 {
						keys = append(keys, archived[rng.IntN(len(archived))])
					}
					out := make([]engine.Outcome, len(keys))
					claims := make([]engine.Claim, len(keys))
					for try := 0; ; try++ {
						var err error
						if g%2 == 0 {
							err = def.MarkBatch(ctx, keys, nil, out)
						} else if err = def.ClaimBatch(ctx, keys, nil, claims); err == nil {
							for i := range claims {
								out[i] = claims[i].Outcome
								if out[i] == engine.New {
									claims[i].Result = fmt.Appendf(nil, "won-by-%d-%d-%d", g, i, len(keys[i]))
								}
							}
							if err := e.CommitBatch(ctx, claims, nil); err != nil {
								report("goroutine %d: commit: %v", g, err)
								return
							}
						}
						if err == nil {
							break
						}
						if !errors.Is(err, engine.ErrUnavailable) {
							report("goroutine %d: %v, want ErrUnavailable", g, err)
							return
						}
						failed.Add(1)
						if try > 200 {
							report("goroutine %d: still failing: %v", g, err)
							return
						}
					}
					for j, o := range out {
						if j >= len(idx) {
							if o == engine.New {
								report("goroutine %d: archived key %s answered New", g, raShort(keys[j]))
								return
							}
							continue
						}
						i := idx[j]
						switch o {
						case engine.New:
							news[i].Add(1)
							if g%2 == 1 {
								r := claims[j].Result
								winner[i].Store(&r)
							}
							acked[i].Store(true)
						case engine.Duplicate:
						case engine.InFlight:
							next = append(next, i)
						default:
							report("goroutine %d: fresh key %s: %v", g, raShort(keys[j]), o)
							return
						}
					}
				}
				pending = next
				if len(pending) > 0 {
					time.Sleep(5 * time.Millisecond)
				}
			}
		})
	}
	// A reader: a key acknowledged New before the lookup began is never New.
	done := make(chan struct{})
	go func() { workers.Wait(); close(done) }()
	var lookups atomic.Int64
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(9, 9))
		for {
			select {
			case <-done:
				return
			default:
			}
			idx := rng.Perm(nFresh)[:16]
			keys := make([][]byte, len(idx))
			was := make([]bool, len(idx))
			for j, i := range idx {
				keys[j], was[j] = fresh[i], acked[i].Load()
			}
			info := make([]engine.KeyInfo, len(keys))
			if err := def.LookupBatch(ctx, keys, info); err != nil {
				if !errors.Is(err, engine.ErrUnavailable) {
					report("lookup: %v, want ErrUnavailable", err)
					return
				}
				failed.Add(1)
				continue
			}
			lookups.Add(1)
			for j := range keys {
				if was[j] && info[j].Outcome == engine.New {
					report("key %s acknowledged New, then looked up New", raShort(keys[j]))
					return
				}
			}
		}
	})
	ended := raSettle(t, &wg, stop, stopped, errs)
	t.Logf("%d calls failed, %d connections ended, %d lookups", failed.Load(), ended, lookups.Load())
	if ended == 0 || failed.Load() == 0 {
		t.Fatalf("the nemesis did not bite: %d connections ended, %d calls failed", ended, failed.Load())
	}
	var bad []string
	for i := range fresh {
		if n := news[i].Load(); n != 1 {
			bad = append(bad, fmt.Sprintf("fresh key %s: New %d times, want exactly once", raShort(fresh[i]), n))
		}
	}
	info := make([]engine.KeyInfo, nFresh)
	raLookupSettled(t, def, fresh, info)
	for i, in := range info {
		var want []byte
		if w := winner[i].Load(); w != nil {
			want = *w
		}
		if in.Outcome != engine.Duplicate || !bytes.Equal(in.Result, want) {
			bad = append(bad, fmt.Sprintf("fresh key %s: %v %q, want Duplicate %q", raShort(fresh[i]), in.Outcome, in.Result, want))
		}
	}
	bad = append(bad, h.check("", nil)...)
	raFail(t, bad)
}

// raDated is a key committed with a result at a time between lo and hi
// (the clock before the claim and after the commit).
type raDated struct {
	key    []byte
	result []byte
	lo, hi int64
}

// raJudge says how an answer at a call that began at or after before and
// ended at or before after disagrees with the archive window aw (and a
// partition p): Duplicate with the key's result while the commit is
// younger than aw at the call's end, New once it is older than aw+p at
// its start, either in between.
func raJudge(in engine.KeyInfo, o engine.Outcome, result []byte, k raDated, before, after int64, aw, p time.Duration) string {
	if o == engine.InFlight {
		return "" // a concurrent claim of the key holds it (documented): neither answer
	}
	switch {
	case after-k.lo < int64(aw):
		if o != engine.Duplicate {
			return fmt.Sprintf("%v, %v after its commit (archive window %v): want Duplicate", o, time.Duration(after-k.hi), aw)
		}
		if !bytes.Equal(result, k.result) {
			return fmt.Sprintf("Duplicate with result %q, want %q", result, k.result)
		}
	case before-k.hi >= int64(aw+p):
		if o != engine.New {
			return fmt.Sprintf("%v (%q, at %d), %v after its commit (archive window %v and a partition): want New", o, result, in.CommittedAt, time.Duration(before-k.hi), aw)
		}
	}
	return ""
}

// TestReadAttackDropWhileReading: one-second partitions, a 5-second
// window and a 40-second archive window; the clock runs ahead a second
// (sometimes three) every 30 ms, so the archiver puts a partition and
// drops the one that left the archive window every few milliseconds,
// while two goroutines look keys up (LookupBatch, ClaimBatch) and a third
// commits new ones with results. Every answer agrees with the key's age
// at the call: Duplicate with its result while inside the archive window,
// New past it and a partition (or InFlight, while the other reader's
// claim holds it). Quiet, no call fails; under a nemesis ending the
// archive's connections every 35 ms (the archiver's Puts and Drops too),
// a call fails only with ErrUnavailable.
func TestReadAttackDropWhileReading(t *testing.T) {
	t.Run("quiet", func(t *testing.T) { testReadAttackDropWhileReading(t, false) })
	t.Run("nemesis", func(t *testing.T) { testReadAttackDropWhileReading(t, true) })
}

func testReadAttackDropWhileReading(t *testing.T, nemesis bool) {
	app := fmt.Sprintf("ra-drop-%d", time.Now().UnixNano())
	pg, admin, table := raArchive(t, "ra_drop", "application_name="+app)
	const aw, part = 40 * time.Second, time.Second
	clock := newClock()
	fs := vfs.NewMem()
	o := raSecondOptions(clock, fs, pg, aw)
	o.Window, o.Lease = 5*time.Second, time.Second
	e := open(t, o)
	defer func() { e.Close() }()
	def, _ := e.Namespace("")
	ctx := context.Background()
	var mu sync.Mutex
	var dated []raDated
	seq := 0
	// commit claims and commits n keys with results; those whose commit
	// succeeded are recorded.
	commit := func(n int) error {
		keys := make([][]byte, n)
		mu.Lock()
		for i := range keys {
			keys[i] = fmt.Appendf(nil, "dw-%05d", seq)
			if seq%7 == 6 {
				keys[i] = raLongKey(1040+seq%300, fmt.Sprintf("dw-%05d", seq))
			}
			seq++
		}
		mu.Unlock()
		lo := clock.Now().UnixNano()
		claims := make([]engine.Claim, n)
		if err := def.ClaimBatch(ctx, keys, nil, claims); err != nil {
			return err
		}
		for i := range claims {
			if claims[i].Outcome != engine.New {
				return fmt.Errorf("fresh key %s claimed %v", raShort(keys[i]), claims[i].Outcome)
			}
			claims[i].Result = fmt.Appendf(nil, "r-%d-%d", lo, i)
		}
		errs := make([]error, n)
		err := e.CommitBatch(ctx, claims, errs)
		hi := clock.Now().UnixNano()
		mu.Lock()
		defer mu.Unlock()
		for i, c := range claims {
			if errs[i] == nil && err == nil {
				dated = append(dated, raDated{key: c.Key, result: c.Result, lo: lo, hi: hi})
			}
		}
		if err != nil && !errors.Is(err, engine.ErrLeaseLost) && !errors.Is(err, engine.ErrUnavailable) {
			return err
		}
		return nil
	}
	// 60 seconds of history, ten keys a second.
	for range 60 {
		if err := commit(10); err != nil {
			t.Fatal(err)
		}
		raTick(t, e, clock, part)
	}

	deadline := time.Now().Add(4 * time.Second)
	errs := make(chan error, 16)
	report := func(format string, args ...any) { errs <- fmt.Errorf(format, args...) }
	var wg sync.WaitGroup
	var readers sync.WaitGroup
	var calls, checked, failed atomic.Int64
	stop := make(chan struct{})
	stopped := func() (int64, error) { return 0, nil }
	if nemesis {
		// Ends the archiver's Puts and Drops mid-transaction too.
		stopped = raNemesis(admin, app, 35*time.Millisecond, stop)
	}
	// unavailable reports whether err is a failure the nemesis may cause.
	unavailable := func(err error) bool {
		if nemesis && errors.Is(err, engine.ErrUnavailable) {
			failed.Add(1)
			return true
		}
		return false
	}
	// The clock runs ahead.
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(5, 5))
		for time.Now().Before(deadline) {
			step := part
			if rng.IntN(5) == 0 {
				step = 3 * part
			}
			clock.Add(step)
			if _, err := e.Lookup(ctx, []byte("ra-tick")); err != nil && !unavailable(err) {
				report("tick: %v", err)
				return
			}
			time.Sleep(30 * time.Millisecond)
		}
	})
	// The committer.
	wg.Go(func() {
		for time.Now().Before(deadline) {
			if err := commit(8); err != nil && !unavailable(err) {
				report("commit: %v", err)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	for r := range 2 {
		readers.Add(1)
		wg.Go(func() {
			defer readers.Done()
			rng := rand.New(rand.NewPCG(uint64(r), 11))
			for b := 0; time.Now().Before(deadline); b++ {
				mu.Lock()
				ks := make([]raDated, 0, 24)
				for _, j := range rng.Perm(len(dated))[:24] {
					ks = append(ks, dated[j])
				}
				mu.Unlock()
				keys := make([][]byte, len(ks))
				for i := range ks {
					keys[i] = ks[i].key
				}
				before := clock.Now().UnixNano()
				info := make([]engine.KeyInfo, len(keys))
				claims := make([]engine.Claim, len(keys))
				var err error
				if b%2 == 0 {
					err = def.LookupBatch(ctx, keys, info)
				} else {
					err = def.ClaimBatch(ctx, keys, nil, claims)
				}
				after := clock.Now().UnixNano()
				calls.Add(1)
				if err != nil {
					if unavailable(err) {
						continue
					}
					report("reader %d batch %d: %v", r, b, err)
					return
				}
				for i := range keys {
					o, res := info[i].Outcome, info[i].Result
					if b%2 == 1 {
						o, res = claims[i].Outcome, claims[i].Result
					}
					if msg := raJudge(info[i], o, res, ks[i], before, after, aw, part); msg != "" {
						report("reader %d batch %d (%s): key %s: %s", r, b, map[bool]string{true: "lookup", false: "claim"}[b%2 == 0], raShort(keys[i]), msg)
						return
					}
					checked.Add(1)
				}
				if b%2 == 1 {
					_ = e.ReleaseBatch(ctx, claims, nil) // a lease the clock ended is ErrLeaseLost
				}
			}
		})
	}
	ended := raSettle(t, &wg, stop, stopped, errs)
	if nemesis {
		t.Logf("%d calls failed, %d connections ended", failed.Load(), ended)
		if ended == 0 || failed.Load() == 0 {
			t.Fatalf("the nemesis did not bite: %d connections ended, %d calls failed", ended, failed.Load())
		}
	}
	waitArchived(t, e)
	// The archiver drops what expired at the end of a pass that archived
	// everything (under the nemesis, passes failed before): give it time.
	var parts int
	for end := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM `+table+`_parts`).Scan(&parts); err != nil {
			t.Fatal(err)
		}
		if parts <= 42 || time.Now().After(end) {
			break
		}
	}
	st := e.Stats().Archive
	t.Logf("%d reads, %d answers checked, %d keys committed; the archive holds %d partitions (%d archived in all), %d hits", calls.Load(), checked.Load(), len(dated), parts, st.Partitions, st.Hits)
	if parts > 42 || st.Partitions < 100 {
		t.Fatalf("the archive holds %d partitions, archived %d: not the churn meant", parts, st.Partitions)
	}
	// Settled: every key as its age says.
	now := clock.Now().UnixNano()
	keys := make([][]byte, len(dated))
	for i := range dated {
		keys[i] = dated[i].key
	}
	info := make([]engine.KeyInfo, len(keys))
	raLookupSettled(t, def, keys, info)
	var bad []string
	for i := range keys {
		if msg := raJudge(info[i], info[i].Outcome, info[i].Result, dated[i], now, now, aw, part); msg != "" {
			bad = append(bad, fmt.Sprintf("settled: key %s: %s", raShort(keys[i]), msg))
		}
	}
	raFail(t, bad)
}

// TestReadAttackClockFarAhead: day partitions; keys committed with
// results on day 0 (the default namespace) and, in a namespace with a
// 10-day archive window, on days 0 and 11. The clock jumps 30 days at
// once (the archiver lags: the answers come from the store's lagging
// partitions, then from the archive); the engine reopens with a 9-day
// Window and a 200-day ArchiveWindow (filter slots of 7 partitions); the
// clock jumps 100 days (the day-0 keys, 141 days old, must still be
// Duplicate with their result), a key is forgotten and committed again,
// then 70 more days (past 200 and a partition: New, the one committed
// again still Duplicate with its new result), then 400 days.
func TestReadAttackClockFarAhead(t *testing.T) {
	pg, _, _ := raArchive(t, "ra_far")
	probe := &spanProbe{}
	ctx := context.Background()
	clock := newClock()
	fs := vfs.NewMem()
	o := engine.Options{
		Backend: &embedded.Backend{Dir: "store", FS: fs}, Clock: clock, Window: 7 * day, Partition: day,
		ExpectedKeys: 2000, Archive: probe.wrap(pg), ArchiveWindow: 60 * day, MaxKeySize: 8192,
		Namespaces: map[string]engine.NamespaceOptions{"short": {ArchiveWindow: 10 * day}},
	}
	e := open(t, o)
	defer func() { e.Close() }()
	nsOf := func(name string) *engine.Namespace { return raNamespace(t, e, name) }
	keys := [][]byte{[]byte("far-1"), []byte("far-2"), raLongKey(1025, "far-3"), raLongKey(6000, "far-4")}
	n := len(keys)
	gen := func(v string) ([][]byte, []engine.Digest) { return raResults(v, n) }
	commit := func(ns, v string, idx ...int) ([]raWant, int64) {
		t.Helper()
		rs, ds := gen(v)
		at := clock.Now().UnixNano()
		var ks [][]byte
		var kd []engine.Digest
		var kr [][]byte
		for _, i := range idx {
			ks, kd, kr = append(ks, keys[i]), append(kd, ds[i]), append(kr, rs[i])
		}
		for j, o := range raClaimCommit(t, e, nsOf(ns), ks, kd, kr) {
			if o != engine.New {
				t.Fatalf("ns %q %s: %s: %v, want New", ns, v, raShort(ks[j]), o)
			}
		}
		w := make([]raWant, n)
		for i := range w {
			w[i] = raWant{outcome: engine.Duplicate, result: rs[i], digest: ds[i], at: at, archived: true}
		}
		return w, at
	}
	everyKey := []int{0, 1, 2, 3}
	news := make([]raWant, n)
	for i := range news {
		news[i] = raWant{outcome: engine.New}
	}
	wantD, _ := commit("", "d0", everyKey...)
	commit("short", "v1", everyKey...)
	for range 11 {
		raTick(t, e, clock, day)
	}
	raFail(t, raCheckAll(t, e, nsOf("short"), keys, news, "short, day 11"))
	commit("short", "v2", everyKey...)
	raTick(t, e, clock, day)

	jump := func(d int, stage string, def, short []raWant) {
		t.Helper()
		clock.Add(time.Duration(d) * day)
		// Before the archiver caught up (it may have, in part).
		var bad []string
		bad = append(bad, raCheckAll(t, e, nsOf(""), keys, raAnySource(def), stage+", at once")...)
		bad = append(bad, raCheckAll(t, e, nsOf("short"), keys, raAnySource(short), stage+", at once")...)
		raFail(t, bad)
		start := time.Now()
		waitArchived(t, e)
		t.Logf("%s: archived in %v", stage, time.Since(start).Round(time.Millisecond))
		bad = append(bad, raCheckAll(t, e, nsOf(""), keys, def, stage+", archived")...)
		bad = append(bad, raCheckAll(t, e, nsOf("short"), keys, short, stage+", archived")...)
		raFail(t, bad)
	}
	// Day 42: the day-0 keys are 42 days old, the short ones' second
	// commit 31 (past their 10 days).
	jump(30, "30 days on (day 42)", wantD, news)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	o.Window, o.ArchiveWindow = 9*day, 200*day
	e = open(t, o)
	waitArchived(t, e)
	raFail(t, raCheckAll(t, e, nsOf(""), keys, wantD, "reopened with Window 9 days, ArchiveWindow 200"))
	// Day 142: still inside 200 days.
	jump(100, "100 days on (day 142)", wantD, news)
	// Forget key 1, commit it again.
	info := make([]engine.KeyInfo, 1)
	if err := nsOf("").ForgetBatch(ctx, keys[1:2], info); err != nil || info[0].Outcome != engine.Duplicate {
		t.Fatalf("forget on day 142: %+v %v", info[0], err)
	}
	again, _ := commit("", "d142", 1)
	raTick(t, e, clock, day)
	// Day 213: day 0 is 213 days old: New; the key committed again on
	// day 142 is 71 days old: Duplicate with its new result.
	want := slices.Clone(news)
	want[1] = again[1]
	jump(70, "70 days on (day 213)", want, news)
	// Day 613: everything New.
	jump(400, "400 days on (day 613)", news, news)
	probe.mustCover(t, true, false, false)
}

// raAnySource is want without the archive as the required source.
func raAnySource(want []raWant) []raWant {
	out := slices.Clone(want)
	for i := range out {
		out[i].archived = false
	}
	return out
}

// TestReadAttackWindowWidenedPastBound: one-second partitions and an
// archive window of 16,000 seconds (filter slots of 517 partitions: every
// span listed, Forget's too), keys committed with results in the default
// namespace, in one with a 30-second archive window (committed again 31
// seconds later) and in a sliding one (refreshed twice); one key is
// forgotten. The engine reopens with a 6-day archive window: filter slots
// of 16,723 partitions (the old slots' blobs no longer fit: scanned
// back), the clock 16,430 seconds into its slot, so every read and
// Forget spans more than 16,384 partitions (no list). Every key answers as
// before, with the newest commit; a second key is forgotten, and both
// forgotten keys, marked again, are Duplicate with the new commit, while
// the 30-second namespace's keys turn New on time.
func TestReadAttackWindowWidenedPastBound(t *testing.T) {
	pg, admin, table := raArchive(t, "ra_widen")
	probe := &spanProbe{}
	const group = 16723
	base := newClock().Now().Unix() / group * group
	clock := enginetest.ClockAt(time.Unix(base+16380, 5e8))
	fs := vfs.NewMem()
	o := raSecondOptions(clock, fs, probe.wrap(pg), 16000*time.Second)
	o.Namespaces = map[string]engine.NamespaceOptions{"short": {ArchiveWindow: 30 * time.Second}, "slide": {Sliding: true}}
	e := open(t, o)
	defer func() { e.Close() }()
	ctx := context.Background()
	nsOf := func(name string) *engine.Namespace { return raNamespace(t, e, name) }
	keys := [][]byte{[]byte("w-1"), []byte("w-2"), raLongKey(1025, "w-3"), raLongKey(2048, "w-4"), []byte("w-5")}
	n := len(keys)
	gen := func(v string) ([][]byte, []engine.Digest) { return raResults(v, n) }
	commit := func(ns, v string, idx []int, want []raWant) {
		t.Helper()
		rs, ds := gen(v)
		at := clock.Now().UnixNano()
		var ks, kr [][]byte
		var kd []engine.Digest
		for _, i := range idx {
			ks, kd, kr = append(ks, keys[i]), append(kd, ds[i]), append(kr, rs[i])
		}
		for j, o := range raClaimCommit(t, e, nsOf(ns), ks, kd, kr) {
			if o != engine.New {
				t.Fatalf("ns %q %s: %s: %v, want New", ns, v, raShort(ks[j]), o)
			}
		}
		for _, i := range idx {
			want[i] = raWant{outcome: engine.Duplicate, result: rs[i], digest: ds[i], at: at, archived: true}
		}
	}
	every := []int{0, 1, 2, 3, 4}
	want := map[string][]raWant{"": make([]raWant, n), "short": make([]raWant, n), "slide": make([]raWant, n)}
	commit("", "d0", every, want[""])
	commit("short", "v1", every, want["short"])
	commit("slide", "s1", every, want["slide"])
	for s := 1; s <= 50; s++ {
		raTick(t, e, clock, time.Second)
		switch s {
		case 3, 6:
			_, ds := gen("s1")
			raSlideDuplicates(t, nsOf("slide"), keys, ds, fmt.Sprintf("%d s", s))
			for i := range keys {
				want["slide"][i].at = clock.Now().UnixNano()
			}
		case 31:
			news := make([]raWant, n)
			for i := range news {
				news[i] = raWant{outcome: engine.New}
			}
			raFail(t, raCheckAll(t, e, nsOf("short"), keys, news, "short, 31 s after its commit"))
			commit("short", "v2", every, want["short"])
		}
	}
	check := func(stage string) {
		t.Helper()
		var bad []string
		for _, name := range []string{"", "short", "slide"} {
			bad = append(bad, raCheckAll(t, e, nsOf(name), keys, want[name], stage)...)
		}
		raFail(t, bad)
	}
	forget := func(i int, stage string) {
		t.Helper()
		info := make([]engine.KeyInfo, 1)
		if err := nsOf("").ForgetBatch(ctx, keys[i:i+1], info); err != nil || info[0].Outcome != engine.Duplicate || !bytes.Equal(info[0].Result, want[""][i].result) {
			t.Fatalf("%s: Forget of %s: %+v %v", stage, raShort(keys[i]), info[0], err)
		}
		want[""][i] = raWant{outcome: engine.New}
	}
	check("50 s on, archive window 16,000 s")
	forget(4, "archive window 16,000 s")
	check("after a Forget, archive window 16,000 s")
	raRowsIn(t, admin, table, map[string]int{"short": 2, "slide": 3}, n)

	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	o.ArchiveWindow = 6 * day
	e = open(t, o)
	waitArchived(t, e)
	check("reopened with a 6-day archive window")
	forget(1, "6-day archive window")
	check("after a Forget, 6-day archive window")
	commit("", "d2", []int{1, 4}, want[""])
	for range 12 {
		raTick(t, e, clock, time.Second)
	}
	// The "short" keys' second commit is 31 s old now: past their 30 s.
	for i := range want["short"] {
		want["short"][i] = raWant{outcome: engine.New}
	}
	check("forgotten keys marked again, 12 s on")
	probe.mustCover(t, true, true, true)
	if probe.forgetsListed.Load() == 0 {
		t.Fatal("no Forget listed its partitions")
	}
}
