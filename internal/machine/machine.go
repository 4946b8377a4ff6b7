package machine

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// cgroupFiles are the cgroup memory limits read, v2 then v1.
var cgroupFiles = []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}

// Memory returns the memory this process may use: /proc/meminfo's
// MemTotal, or a cgroup's limit when one is set and lower, and which of
// them it is ("/proc/meminfo MemTotal" or the cgroup file). Where there is
// no /proc/meminfo (not Linux) it returns an error.
func Memory() (bytes float64, source string, err error) {
	total, err := ProcKB("/proc/meminfo", "MemTotal:")
	if err != nil {
		return 0, "", fmt.Errorf("machine memory: %w", err)
	}
	bytes, source = total, "/proc/meminfo MemTotal"
	for _, f := range cgroupFiles {
		if limit, ok := CgroupLimit(f); ok && limit < bytes {
			bytes, source = limit, f
		}
	}
	return bytes, source, nil
}

// ProcKB reads the line "key N kB" of a /proc file (meminfo, status) and
// returns N KiB in bytes.
func ProcKB(path, key string) (float64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == key {
			kb, err := strconv.ParseFloat(fields[1], 64)
			if err != nil {
				return 0, fmt.Errorf("%s: %s: %w", path, key, err)
			}
			return kb * 1024, nil
		}
	}
	return 0, fmt.Errorf("no %s in %s", strings.TrimSuffix(key, ":"), path)
}

// CgroupLimit reads a cgroup memory limit file: false when it is absent or
// says there is no limit ("max", or cgroup v1's huge number).
func CgroupLimit(path string) (float64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	s := strings.TrimSpace(string(b))
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v <= 0 || v >= 1<<60 {
		return 0, false
	}
	return v, true
}
