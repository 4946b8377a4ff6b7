package engine

import (
	"fmt"
	"time"

	"github.com/tierdedup/tierdedup/tier"
)

// Namespace is one key space of an Engine: the same key bytes in two
// namespaces are two keys. Consumers commonly dedup message IDs in one and
// business keys (order:42) in another. The Engine's own methods use the
// default namespace, named "". A Namespace is safe for concurrent use.
type Namespace struct {
	e    *Engine
	name string
	// window is the namespace's own window (NamespaceOptions.Window),
	// zero for the engine's; cacheFor is how long memory keeps its commits.
	window, cacheFor int64
	// sliding: a duplicate refreshes its key's life (NamespaceOptions.Sliding).
	sliding bool
	// archiveWindow is how long the archive answers for its keys: its own
	// (NamespaceOptions.ArchiveWindow), the engine's ArchiveWindow, or
	// zero (not archived: no archive, a window of its own, or the
	// engine's own namespaces).
	archiveWindow int64
}

// Namespace returns the namespace called name (at most MaxNamespace bytes,
// not starting with a NUL byte, which marks the engine's own); "" is the
// default namespace.
func (e *Engine) Namespace(name string) (*Namespace, error) {
	if err := checkNamespace(name); err != nil {
		return nil, err
	}
	if name == "" {
		return &e.def, nil
	}
	return e.newNamespace(name), nil
}

// checkNamespace is the rule for a caller's namespace name.
func checkNamespace(name string) error {
	switch {
	case len(name) > MaxNamespace:
		return fmt.Errorf("%w: name of %d bytes, max %d", ErrNamespace, len(name), MaxNamespace)
	case ownNamespace(name):
		return fmt.Errorf("%w: names starting with a NUL byte are the engine's own", ErrNamespace)
	}
	return nil
}

// ownNamespace reports whether name is one of the engine's own
// namespaces (tokens, versions): their names start with a NUL byte.
func ownNamespace(name string) bool { return len(name) > 0 && name[0] == 0 }

// newNamespace is the namespace called name with its window.
func (e *Engine) newNamespace(name string) *Namespace {
	n := &Namespace{e: e, name: name, cacheFor: e.cacheFor, sliding: e.opts.Namespaces[name].Sliding && !ownNamespace(name)}
	if e.arch != nil && !ownNamespace(name) {
		n.archiveWindow = int64(e.archiveWindow)
		if w, ok := e.nsArchiveWindows[name]; ok {
			n.archiveWindow = int64(w)
		}
	}
	if w, ok := e.nsWindows[name]; ok {
		n.archiveWindow = 0
		n.window = w
		n.cacheFor = w
		if e.where == tier.ClaimsInStore {
			n.cacheFor = w / 2 // as the engine's: a process clock behind the server's
		}
		n.cacheFor = min(n.cacheFor, e.cacheFor)
	}
	return n
}

// cacheUntil is when memory stops answering, by itself, for a commit the
// namespace made or found current at now. In a sliding namespace with a
// slower tier behind memory, a duplicate that must refresh its key has to
// reach that tier: memory answers only until the current partition ends
// (the refresh's granularity), or not at all with a namespace window
// (every duplicate refreshes). Memory-only refreshes its own entries.
func (n *Namespace) cacheUntil(now int64) int64 {
	until := now + n.cacheFor
	if n.sliding && !n.e.memoryOnly() {
		if n.window > 0 {
			return now
		}
		until = min(until, (n.e.parts.Of(now)+1)*n.e.parts.Length)
	}
	return until
}

// refreshes reports whether a duplicate at now of a key committed in
// partition refreshes it: in a sliding namespace, when the record is not
// in the current partition, or always with a namespace window (the record's
// time is the window's start).
func (n *Namespace) refreshes(partition, now int64) bool {
	return n.sliding && (n.window > 0 || partition < n.e.parts.Of(now))
}

// Sliding reports whether a duplicate refreshes its key's life in the
// namespace (NamespaceOptions.Sliding).
func (n *Namespace) Sliding() bool { return n.sliding }

// Window returns how long a commit in the namespace stays a Duplicate: its
// own window (NamespaceOptions.Window), or the engine's.
func (n *Namespace) Window() time.Duration {
	if n.window > 0 {
		return time.Duration(n.window)
	}
	return time.Duration(n.e.window)
}

// expired reports whether a commit the exact tier found in partition (at
// at, zero if it stored no time) has outlived the namespace's own window
// by now. A commit without a time is dated at its partition's end, so it
// is never judged older than it is.
func (n *Namespace) expired(partition, at, now int64) bool {
	if n.window == 0 || partition < 0 {
		return false
	}
	if at == 0 {
		at = (partition + 1) * n.e.parts.Length
	}
	return now-at >= n.window
}

// archiveExpired reports whether a commit the archive found in partition
// (at at, zero if it stored no time) has outlived the namespace's archive
// window by now, dated as expired dates it.
func (n *Namespace) archiveExpired(partition, at, now int64) bool {
	if at == 0 {
		at = (partition + 1) * n.e.parts.Length
	}
	return now-at >= n.archiveWindow
}

// Name returns the namespace's name.
func (n *Namespace) Name() string { return n.name }
