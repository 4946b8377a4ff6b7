package engine

import (
	"errors"
	"fmt"

	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/bloom"
)

// Validate reports every invalid field at once; each error matches
// ErrOptions.
func (o *Options) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrOptions}, args...)...))
	}
	o.validateTiers(bad)
	if o.Window < 0 || o.Window > MaxWindow {
		bad("Window %v is outside [0, %v]", o.Window, MaxWindow)
	}
	if o.Partition < 0 || (o.Partition > 0 && o.Partition < MinPartition) || o.Partition > MaxWindow {
		bad("Partition %v is outside [%v, %v]", o.Partition, MinPartition, MaxWindow)
	}
	if o.Lease < 0 {
		bad("Lease %v is negative", o.Lease)
	}
	if o.Needs&^needAll != 0 {
		bad("unknown Needs %s", o.Needs&^needAll)
	}
	d := o.WithDefaults()
	for name, n := range o.Namespaces {
		if err := checkNamespace(name); err != nil {
			bad("Namespaces: %v", err)
			continue
		}
		if n.Sliding && o.Backend != nil && !o.local() {
			bad("Namespaces[%q].Sliding is not supported with a shared Backend (%s): only the embedded store, memory and bloom-only refresh a key", name, o.Backend.Name())
		}
		switch w := n.Window; {
		case w == 0:
		case o.Tiers == BloomOnly:
			bad("Namespaces[%q].Window: a window of its own is not supported by %v", name, o.Tiers)
		case w < 0 || w > d.Window:
			bad("Namespaces[%q].Window %v is outside (Lease %v, Window %v]", name, w, d.Lease, d.Window)
		case w <= d.Lease:
			bad("Namespaces[%q].Window %v must be longer than Lease %v", name, w, d.Lease)
		}
	}
	if d.Window > 0 && d.Partition > 0 {
		if _, err := tier.NewPartitions(d.Window, d.Partition); err != nil {
			bad("Window %v / Partition %v: %v", d.Window, d.Partition, err)
		}
	}
	if d.Lease > 0 && d.Window > 0 && d.Lease >= d.Window {
		bad("Lease %v must be shorter than Window %v", d.Lease, d.Window)
	}
	if o.MemoryCapacity < 0 || o.MemoryCapacity > MaxMemoryCapacity {
		bad("MemoryCapacity %d is outside [0, %d]", o.MemoryCapacity, MaxMemoryCapacity)
	}
	if o.Stripes != 0 {
		if err := shard.CheckStripes(o.Stripes); err != nil {
			bad("%v", err)
		}
	}
	if o.ExpectedKeys < 0 || o.ExpectedKeys > MaxExpectedKeys {
		bad("ExpectedKeys %d is outside [0, %d]", o.ExpectedKeys, MaxExpectedKeys)
	}
	if fp := o.FalsePositive; fp != 0 {
		live := 1
		if parts, err := tier.NewPartitions(d.Window, d.Partition); err == nil {
			live = parts.Live
		}
		if err := bloom.CheckFalsePositive(fp, max(d.ExpectedKeys, 1), live); err != nil {
			bad("%v", err)
		}
	}
	if err := tier.CheckAttempts(o.MaxAttempts); err != nil {
		bad("%v", err)
	}
	if o.DurableClaims && o.MaxAttempts == 0 {
		bad("DurableClaims needs MaxAttempts: a claim a crash abandoned is counted as an attempt")
	}
	if o.CommitQueue < 0 || o.CommitQueue > MaxCommitQueue {
		bad("CommitQueue %d is outside [0, %d]", o.CommitQueue, MaxCommitQueue)
	}
	if o.MaxKeySize < 0 || o.MaxKeySize > MaxKeySize {
		bad("MaxKeySize %d is outside [1, %d]", o.MaxKeySize, MaxKeySize)
	}
	if o.MaxResultSize < 0 || o.MaxResultSize > MaxResultSize {
		bad("MaxResultSize %d is outside [1, %d]", o.MaxResultSize, MaxResultSize)
	}
	o.validateArchive(d, bad)
	if o.Backend != nil {
		if err := o.Backend.Validate(d.env()); err != nil {
			errs = append(errs, err) // each matches tier.ErrOptions, which ErrOptions is
		}
	}
	return errors.Join(errs...)
}

// validateTiers reports, through bad, a configuration whose tiers and
// their fields disagree.
func (o *Options) validateTiers(bad func(format string, args ...any)) {
	shared := o.Backend != nil && o.Backend.Claims() == tier.ClaimsInStore
	switch {
	case o.Tiers == Default && o.Backend == nil:
		bad("%v needs a Backend: embedded.Dir(dir) for the embedded store, or a shared tier", o.Tiers)
	case o.Tiers == MemoryOnly && o.Backend != nil:
		bad("Backend %s is not used by %v (leave Tiers zero)", o.Backend.Name(), o.Tiers)
	case o.Tiers == BloomOnly && !o.local():
		bad("%v keeps its filters in the embedded store's Backend (&embedded.Backend{}, with a Dir to keep them across restarts), not %v", o.Tiers, o.Backend)
	case o.Tiers > BloomOnly:
		bad("Tiers %d is not a configuration", o.Tiers)
	}
	if o.NoSharedCache && !shared {
		bad("NoSharedCache applies only to a shared tier (a Backend such as Redis or PostgreSQL)")
	}
	if o.FailOpen && !shared {
		bad("FailOpen applies only to a shared tier (a Backend such as Redis or PostgreSQL)")
	}
	if o.DurableClaims && o.Tiers != Default {
		bad("DurableClaims needs a durable tier (the embedded store or a shared one), not %v", o.Tiers)
	}
}

// validateArchive reports, through bad, archive settings that cannot
// work, and the ones the configuration cannot keep.
func (o *Options) validateArchive(d Options, bad func(format string, args ...any)) {
	if o.Archive == nil {
		if o.ArchiveWindow != 0 || o.ArchiveFalsePositive != 0 || len(o.nsArchiveWindows()) > 0 {
			bad("ArchiveWindow, ArchiveFalsePositive and a namespace's ArchiveWindow need an Archive")
		}
		if o.DetachArchive && (!o.local() || o.Tiers != Default) {
			bad("DetachArchive lets an embedded store (Tiers Default, embedded.Dir) go of its archive; a shared tier's archive log is the prefix's (see docs/archive.md)")
		}
		return
	}
	if o.DetachArchive {
		bad("DetachArchive opens a store without its archive: Archive must be nil")
	}
	for name, n := range o.Namespaces {
		switch w := n.ArchiveWindow; {
		case w == 0, checkNamespace(name) != nil:
		case n.Window != 0:
			bad("Namespaces[%q] has both a Window (shorter than the engine's, never archived) and an ArchiveWindow", name)
		case w <= d.Window || w > d.ArchiveWindow:
			bad("Namespaces[%q].ArchiveWindow %v is outside (Window %v, ArchiveWindow %v]", name, w, d.Window, d.ArchiveWindow)
		}
	}
	switch {
	case tier.Nil(o.Archive):
		bad("Archive is a nil %T", o.Archive)
		return
	case o.Backend != nil && o.Backend.Claims() == tier.ClaimsInStore:
		// A shared tier archives through its log (tier.ArchiveLog): its
		// Validate refuses the log if it keeps none. Its keys leave it at
		// the end of their window; the partition holding them must be
		// sealed in the archive by then.
		if d.Partition > 0 && d.Window < 2*d.Partition {
			bad("Archive behind a shared tier needs Window %v of at least two partitions (Partition %v): a partition is sealed in the archive after it ends, and before its first keys leave the shared tier", d.Window, d.Partition)
		}
		// A read at t (the engine's clock) waits until every partition
		// ending before t - Window + LogSkew is sealed; a partition is
		// sealed once it has ended by the shared tier's clock, which may
		// be up to LogSkew behind the engine's. Below Partition +
		// 2*LogSkew an engine whose clock is ahead within that bound
		// waits for a seal that cannot have come, for part of every
		// partition or (ahead by Window - LogSkew - Partition or more)
		// for good, however fast the drain: every call answers
		// ErrUnavailable then.
		if d.Partition > 0 && d.Window < d.Partition+2*tier.LogSkew {
			bad("Archive behind a shared tier needs Window %v of at least Partition %v plus twice the clock skew it allows (%v): a read waits until the partitions its window left are sealed, a partition is sealed only after it ends by the shared tier's clock, and an engine's clock may be up to %v ahead of it", d.Window, d.Partition, 2*tier.LogSkew, tier.LogSkew)
		}
		if o.FailOpen {
			bad("Archive with FailOpen: a claim the archive cannot answer would be New")
		}
	case o.Tiers != Default || !o.local():
		bad("Archive %s needs the embedded store (Tiers Default, embedded.Dir) or a shared tier (Redis), have %s", o.Archive.Name(), o.Name())
	}
	if o.ArchiveWindow < 0 || o.ArchiveWindow > MaxWindow {
		bad("ArchiveWindow %v is outside [0, %v]", o.ArchiveWindow, MaxWindow)
	} else if d.ArchiveWindow <= d.Window {
		bad("ArchiveWindow %v must be longer than Window %v", d.ArchiveWindow, d.Window)
	}
	if fp := o.ArchiveFalsePositive; fp != 0 && !(fp > 0 && fp < 1) {
		bad("ArchiveFalsePositive %v is outside (0, 1)", fp)
	}
	if d.Window > 0 && d.Partition > 0 && d.ArchiveWindow > d.Window {
		if parts, err := tier.NewPartitions(d.Window, d.Partition); err == nil {
			if err := o.Archive.Validate(d.archiveEnv(parts)); err != nil {
				bad("%v", err)
			}
		}
	}
}

// archiveEnv is what Validate tells the archive (Open adds the owner and
// the secret's check).
