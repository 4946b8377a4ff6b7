package tier

import (
	"errors"
	"fmt"
	"time"
)

// ErrPartitions reports an invalid window or partition length.
var ErrPartitions = errors.New("tier: invalid partitioning")

// MaxLive bounds the number of live partitions: probes report them in one
// 64-bit mask, and past a few dozen the per-key Bloom cost grows with no gain.
const MaxLive = 64

// Partitions cuts time into fixed-length partitions and says which are live
// for a retention window.
type Partitions struct {
	// Length is the duration of one partition in nanoseconds.
	Length int64
	// Live is the number of partitions kept: the current one plus enough
	// older ones to cover the window.
	Live int
}

// NewPartitions returns the partitioning for a window and partition length.
func NewPartitions(window, partition time.Duration) (Partitions, error) {
	if window <= 0 || partition <= 0 {
		return Partitions{}, fmt.Errorf("%w: window %v and partition %v must be positive", ErrPartitions, window, partition)
	}
	older := (window + partition - 1) / partition
	if older+1 > MaxLive {
		return Partitions{}, fmt.Errorf("%w: window %v / partition %v needs %d live partitions, max %d", ErrPartitions, window, partition, older+1, MaxLive)
	}
	return Partitions{Length: int64(partition), Live: int(older) + 1}, nil
}

// Of returns the partition number of a time in Unix nanoseconds.
func (p Partitions) Of(nanos int64) int64 {
	q := nanos / p.Length
	if nanos < 0 && nanos%p.Length != 0 {
		q--
	}
	return q
}

// Oldest returns the oldest live partition when current is the newest.
func (p Partitions) Oldest(current int64) int64 { return current - int64(p.Live) + 1 }

// Expiry returns when a key written in partition q stops being kept.
func (p Partitions) Expiry(q int64) int64 { return (q + int64(p.Live)) * p.Length }
