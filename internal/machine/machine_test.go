package machine

import (
	"os"
	"path/filepath"
	"testing"
)

// TestMemory reads this machine's memory, a cgroup limit file in each of
// its forms, and a meminfo file's MemTotal.
func TestMemory(t *testing.T) {
	m, source, err := Memory()
	if err != nil || m < 64<<20 || source == "" {
		t.Fatalf("Memory: %v from %q, %v", m, source, err)
	}
	dir := t.TempDir()
	for _, c := range []struct {
		content string
		want    float64
		ok      bool
	}{{"max\n", 0, false}, {"1073741824\n", 1 << 30, true}, {"9223372036854771712\n", 0, false}, {"junk", 0, false}} {
		p := filepath.Join(dir, "limit")
		if err := os.WriteFile(p, []byte(c.content), 0o600); err != nil {
			t.Fatal(err)
		}
		if got, ok := CgroupLimit(p); got != c.want || ok != c.ok {
			t.Errorf("cgroup limit %q: %v, %v; want %v, %v", c.content, got, ok, c.want, c.ok)
		}
	}
	p := filepath.Join(dir, "meminfo")
	if err := os.WriteFile(p, []byte("MemFree: 1 kB\nMemTotal:  2048 kB\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := ProcKB(p, "MemTotal:"); err != nil || got != 2048*1024 {
		t.Fatalf("MemTotal: %v, %v", got, err)
	}
	if _, err := ProcKB(p, "VmRSS:"); err == nil {
		t.Fatal("a missing line read without an error")
	}
}
