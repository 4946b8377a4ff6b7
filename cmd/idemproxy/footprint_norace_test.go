//go:build !race

package main

// Resident memory is what the OS counts of the binary users run: built
// here without -race (whose shadow memory would be most of it), in CI's
// pass without it.

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/bench"
	"github.com/tierdedup/tierdedup/integrations/httpdedup"
)

// TestIdleProxyFootprint builds idemproxy as a user does (go build), runs
// it with its embedded store in front of an upstream, sends one request
// and its retry (answered from the store, not the upstream), and holds
// the idle process to its footprint: at most 32 MiB resident (VmRSS, read
// from /proc/PID/status) and 16 MiB allocated under its -dir (as du
// counts it).
func TestIdleProxyFootprint(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatal("the go command builds the binary this test measures: ", err)
	}
	tmp := t.TempDir()
	bin := filepath.Join(tmp, "idemproxy")
	if out, err := exec.Command(gobin, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v: %s", err, out)
	}
	u := startUpstream(t)
	dir := filepath.Join(tmp, "store")
	cmd := exec.Command(bin, "-listen", "127.0.0.1:0", "-admin", "", "-dir", dir, "-upstream", u.URL)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) > 4 && f[3] == "serving" {
				select {
				case addr <- f[4]:
				default:
				}
			}
		}
	}()
	var url string
	select {
	case a := <-addr:
		url = "http://" + a
	case <-time.After(time.Minute):
		t.Fatal("the proxy did not say where it serves within a minute")
	}
	first := post(url+"/orders", `"k1"`, `{"sku":"a"}`)
	retry := post(url+"/orders", `"k1"`, `{"sku":"a"}`)
	if first.err != nil || retry.err != nil || first.status != 201 || retry.header.Get(httpdedup.HeaderReplayed) != "true" || retry.body != first.body || u.runs(`"k1"`) != 1 {
		t.Fatalf("first %d %v, retry %d %v (replayed %q), upstream ran %d times",
			first.status, first.err, retry.status, retry.err, retry.header.Get(httpdedup.HeaderReplayed), u.runs(`"k1"`))
	}
	time.Sleep(time.Second) // idle
	rss := vmRSS(t, cmd.Process.Pid)
	disk := bench.Allocated(dir)
	t.Logf("idle after one request and its replay: VmRSS %.1f MiB, %.1f MiB under -dir (du)", float64(rss)/(1<<20), float64(disk)/(1<<20))
	if rss > 32<<20 {
		t.Errorf("idle proxy: VmRSS %.1f MiB, over 32 MiB", float64(rss)/(1<<20))
	}
	if disk > 16<<20 {
		t.Errorf("idle proxy: %.1f MiB under -dir, over 16 MiB", float64(disk)/(1<<20))
	}
}

// vmRSS reads a process's resident set from /proc/PID/status, in bytes.
func vmRSS(t *testing.T, pid int) uint64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmRSS:" && f[2] == "kB" {
			kb, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}
