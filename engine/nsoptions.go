package engine

import "time"

// NamespaceOptions are one namespace's own settings (Options.Namespaces);
// each zero field takes the engine's.
type NamespaceOptions struct {
	// Window gives the namespace a window of its own, shorter than
	// Options.Window (10 minutes for telemetry IDs beside 7 days for
	// payments): a key committed in it is a Duplicate for exactly that
	// window, then New. Storage is reclaimed at the engine's granularity
	// (whole partitions after Window), so a short window saves no disk,
	// only wrong answers. It must exceed Lease and not exceed Window.
	// Memory, Default and Redis; not BloomOnly (a filter cannot date a
	// key) nor Postgres. In Default, changing it between runs applies at
	// once to keys already committed (the store dates each commit in such
	// a namespace; a commit made while its namespace had no window of its
	// own is dated at its partition's end). Redis sets each commit's TTL
	// from its namespace's window, so the prefix records them and refuses
	// a process with others (ErrLayout), as it does the Window.
	Window time.Duration
	// ArchiveWindow gives the namespace an archive window of its own,
	// longer than Window and at most Options.ArchiveWindow: a key
	// committed in it is a Duplicate for that long, then New (dated by its
	// partition's end unless its commit stored a time, so never judged
	// older than it is). A namespace cannot have both a Window (shorter
	// than the engine's, never archived) and an ArchiveWindow. Storage is
	// Options.ArchiveWindow's for every namespace. It needs an Archive.
	ArchiveWindow time.Duration
	// Sliding makes the namespace's window slide: a Duplicate or Conflict
	// refreshes its key's life, re-committing it where the window counts
	// from now (the current partition; with a Window of its own, dated
	// now), so a key that keeps arriving stays a Duplicate for as long as
	// it keeps arriving and becomes New a window after its last arrival.
	// The refresh is durable before the duplicate is answered. It costs
	// one write per refreshing duplicate: with the engine's window, a
	// key's first duplicate in each partition (later ones find it
	// current); with a window of its own, every duplicate. Memory, Default
	// and BloomOnly (the key is added to the current partition's filter);
	// not with a shared Backend. Duplicates answered from the archive do
	// not refresh.
	Sliding bool
}

// nsWindows are the namespaces' own windows (NamespaceOptions.Window).
func (o *Options) nsWindows() map[string]time.Duration {
	var m map[string]time.Duration
	for name, n := range o.Namespaces {
		if n.Window != 0 {
			if m == nil {
				m = map[string]time.Duration{}
			}
			m[name] = n.Window
		}
	}
	return m
}

// nsArchiveWindows are the namespaces' own archive windows
// (NamespaceOptions.ArchiveWindow).
func (o *Options) nsArchiveWindows() map[string]time.Duration {
	var m map[string]time.Duration
	for name, n := range o.Namespaces {
		if n.ArchiveWindow != 0 {
			if m == nil {
				m = map[string]time.Duration{}
			}
			m[name] = n.ArchiveWindow
		}
	}
	return m
}
