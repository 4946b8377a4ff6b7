package crashtest_test

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/internal/crashtest"
)

func TestMain(m *testing.M) {
	crashtest.Main(m, map[string]func(string) int{
		// echo prints its spec's comma-separated words, one a line, and
		// exits with the status given after a "|".
		"echo": func(spec string) int {
			words, code, _ := strings.Cut(spec, "|")
			for _, w := range strings.Split(words, ",") {
				fmt.Println(w)
			}
			fmt.Fprintln(os.Stderr, "first stderr line\nsecond")
			n, err := strconv.Atoi(code)
			if err != nil {
				fmt.Fprintln(os.Stderr, "echo: bad exit status:", err)
				return 2
			}
			return n
		},
		// hang says it is ready and waits forever, ignoring SIGTERM.
		"hang": func(string) int {
			signal.Ignore(syscall.SIGTERM)
			fmt.Println("ready")
			for {
				time.Sleep(time.Hour)
			}
		},
		// term ends cleanly on SIGTERM.
		"term": func(string) int {
			term := make(chan os.Signal, 1)
			signal.Notify(term, syscall.SIGTERM)
			fmt.Println("ready")
			<-term
			return 0
		},
		"args": func(string) int {
			fmt.Println(strings.Join(os.Args[1:], " "), os.Getenv("CRASHTEST_EXTRA"))
			return 0
		},
	})
}

// recorder is a testing.TB whose Errorf is recorded instead of failing.
type recorder struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func (r *recorder) failures() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.errs...)
}

func TestLinesExitAndStderr(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	c := crashtest.Start(t, "echo", "a,b,c|3", &crashtest.Options{StderrApart: true, OnLine: func(l string) {
		mu.Lock()
		seen = append(seen, l)
		mu.Unlock()
	}})
	if l, ok := c.Next(); !ok || l != "a" {
		t.Fatalf("Next = %q, %v", l, ok)
	}
	if l, ok := c.WaitLine(10*time.Second, func(l string) bool { return l == "c" }); !ok || l != "c" {
		t.Fatalf("WaitLine = %q, %v", l, ok)
	}
	if _, ok := c.Next(); ok {
		t.Fatal("Next after the last line")
	}
	err := c.Wait()
	var ee interface{ ExitCode() int }
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("Wait = %v, want exit status 3", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if got := strings.Join(seen, ","); got != "a,b,c" || strings.Join(c.Lines(), ",") != got {
		t.Fatalf("OnLine saw %s, Lines %v", got, c.Lines())
	}
	if c.StderrLine() != "first stderr line" || !strings.Contains(c.Stderr(), "second") {
		t.Fatalf("stderr %q", c.Stderr())
	}
	if d := c.Describe(); !strings.Contains(d, "exit status 3") || !strings.Contains(d, "first stderr line") || !strings.Contains(d, "\n  c") {
		t.Fatalf("Describe = %s", d)
	}
}

func TestArgsAndEnv(t *testing.T) {
	c := crashtest.Start(t, "args", "", &crashtest.Options{Args: []string{"x", "-y"}, Env: []string{"CRASHTEST_EXTRA=z"}})
	if l, _ := c.Next(); l != "x -y z" {
		t.Fatalf("child saw %q", l)
	}
	if err := c.Wait(); err != nil {
		t.Fatal(err)
	}
	out, err := crashtest.Command(t, "echo", "p|0", nil).Output()
	if err != nil || string(out) != "p\n" {
		t.Fatalf("Command: %q, %v", out, err)
	}
}

func TestKillAndStop(t *testing.T) {
	c := crashtest.Start(t, "hang", "", &crashtest.Options{Timeout: crashtest.NoTimeout})
	if _, ok := c.WaitLine(time.Minute, func(l string) bool { return l == "ready" }); !ok {
		t.Fatal("not ready")
	}
	if err := c.Kill(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("Kill = %v", err)
	}
	c = crashtest.Start(t, "hang", "", &crashtest.Options{Timeout: crashtest.NoTimeout})
	c.WaitLine(time.Minute, func(l string) bool { return l == "ready" })
	if err := c.Stop(syscall.SIGTERM, 200*time.Millisecond); !errors.Is(err, crashtest.ErrNotStopped) {
		t.Fatalf("Stop of a child ignoring SIGTERM = %v", err)
	}
	c = crashtest.Start(t, "term", "", nil)
	c.WaitLine(time.Minute, func(l string) bool { return l == "ready" })
	if err := c.Stop(syscall.SIGTERM, time.Minute); err != nil {
		t.Fatalf("Stop of a child that ends = %v", err)
	}
}

// TestHangFails: a child past its deadline is killed and fails the test;
// the wait on it returns.
func TestHangFails(t *testing.T) {
	r := &recorder{TB: t}
	c := crashtest.Start(r, "hang", "", &crashtest.Options{Timeout: 500 * time.Millisecond})
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	select {
	case err := <-done:
		if err == nil || !c.Hung() {
			t.Fatalf("Wait = %v, Hung %v", err, c.Hung())
		}
	case <-time.After(time.Minute):
		t.Fatal("Wait on a hung child did not return")
	}
	if f := r.failures(); len(f) != 1 || !strings.Contains(f[0], "a hang") || !strings.Contains(f[0], "ready") {
		t.Fatalf("failures %q", f)
	}
	// A child left running when the test ends is killed, silently.
	var left *crashtest.Child
	t.Cleanup(func() { // runs after the cleanups Start registers
		select {
		case <-left.Done():
		default:
			t.Error("a child left running outlived its test's cleanup")
		}
		if f := r.failures(); len(f) != 1 {
			t.Errorf("failures %q", f)
		}
	})
	left = crashtest.Start(r, "hang", "", nil)
}

func TestCommandHangFails(t *testing.T) {
	r := &recorder{TB: t}
	t.Run("inner", func(t *testing.T) {
		r.TB = t
		cmd := crashtest.Command(r, "hang", "", &crashtest.Options{Timeout: 300 * time.Millisecond})
		if err := cmd.Run(); err == nil {
			t.Fatal("a hung command ended cleanly")
		}
	})
	if f := r.failures(); len(f) != 1 || !strings.Contains(f[0], "a hang") {
		t.Fatalf("failures %q", f)
	}
}

func TestUnknownChild(t *testing.T) {
	c := crashtest.Start(t, "nobody", "", &crashtest.Options{StderrApart: true})
	err := c.Wait()
	var ee interface{ ExitCode() int }
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(c.StderrLine(), `no child "nobody"`) {
		t.Fatalf("Wait = %v, stderr %q", err, c.Stderr())
	}
}
