package main

import (
	"flag"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// countValue is a flag of a count of things (keys, messages): an integer
// written plainly (1000000), with underscores (1_000_000), or in
// scientific notation (1e6, 2.5e5), as -ids-per-day takes it; a fraction
// or a number past max is refused. set stores it, get reads it back.
type countValue struct {
	set func(int64)
	get func() int64
	max int64
}

func (c countValue) String() string {
	if c.get == nil {
		return "0"
	}
	return strconv.FormatInt(c.get(), 10)
}

func (c countValue) Set(s string) error {
	n, err := parseCount(s, c.max)
	if err != nil {
		return err
	}
	c.set(n)
	return nil
}

// parseCount reads a count as countValue does.
func parseCount(s string, limit int64) (int64, error) {
	t := strings.ReplaceAll(s, "_", "")
	if n, err := strconv.ParseInt(t, 10, 64); err == nil {
		if n > limit {
			return 0, fmt.Errorf("%s is over %d", s, limit)
		}
		return n, nil
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("%q is not a count (write 1000000, 1_000_000 or 1e6)", s)
	}
	if f != math.Trunc(f) {
		return 0, fmt.Errorf("%s is not a whole number", s)
	}
	// 2^63 is the first float64 past MaxInt64 (which rounds up to it):
	// converting it, or more, is undefined.
	if f >= 0x1p63 || f < -0x1p63 || int64(f) > limit {
		return 0, fmt.Errorf("%s is over %d", s, limit)
	}
	return int64(f), nil
}

// countVar defines a count flag of int64.
func countVar(fs *flag.FlagSet, p *int64, name string, value int64, usage string) {
	*p = value
	fs.Var(countValue{set: func(n int64) { *p = n }, get: func() int64 { return *p }, max: math.MaxInt64}, name, usage+" (1000000, 1_000_000 or 1e6)")
}

// intCountVar defines a count flag of int.
func intCountVar(fs *flag.FlagSet, p *int, name string, value int, usage string) {
	*p = value
	fs.Var(countValue{set: func(n int64) { *p = int(n) }, get: func() int64 { return int64(*p) }, max: math.MaxInt32}, name, usage+" (1000000, 1_000_000 or 1e6)")
}
