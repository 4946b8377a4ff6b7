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
// or a number past the type's range is refused.
type countValue struct {
	p   *int64
	max int64
}

func (c countValue) String() string {
	if c.p == nil {
		return "0"
	}
	return strconv.FormatInt(*c.p, 10)
}

func (c countValue) Set(s string) error {
	n, err := parseCount(s, c.max)
	if err != nil {
		return err
	}
	*c.p = n
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
	if f > float64(limit) || f < math.MinInt64 {
		return 0, fmt.Errorf("%s is over %d", s, limit)
	}
	return int64(f), nil
}

// countVar defines a count flag of int64.
func countVar(fs *flag.FlagSet, p *int64, name string, value int64, usage string) {
	*p = value
	fs.Var(countValue{p: p, max: math.MaxInt64}, name, usage+" (1000000, 1_000_000 or 1e6)")
}

// intCountVar defines a count flag of int.
func intCountVar(fs *flag.FlagSet, p *int, name string, value int, usage string) {
	*p = value
	v := int64(value)
	fs.Var(intCount{countValue{p: &v, max: math.MaxInt32}, p}, name, usage+" (1000000, 1_000_000 or 1e6)")
}

// intCount is a countValue that also stores into an int.
type intCount struct {
	countValue
	p *int
}

func (c intCount) Set(s string) error {
	if err := c.countValue.Set(s); err != nil {
		return err
	}
	*c.p = int(*c.countValue.p)
	return nil
}
