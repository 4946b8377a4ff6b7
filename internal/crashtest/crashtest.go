package crashtest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// The variables that tell a re-executed test binary it is a child, and
// what its spec is.
const (
	childEnv = "TIERDEDUP_CRASHTEST_CHILD"
	specEnv  = "TIERDEDUP_CRASHTEST_SPEC"
)

// DefaultTimeout bounds a child's life when Options.Timeout is zero.
const DefaultTimeout = 3 * time.Minute

// NoTimeout, as Options.Timeout, lets a child run until its test stops it
// (Kill, Stop) or ends: for a consumer that runs until it is killed.
const NoTimeout time.Duration = -1

// killWait bounds each wait for a child to end once it was sent SIGKILL,
// and for its stdout to close once it exited.
const killWait = 30 * time.Second

// maxLine is the longest stdout line a child may print.
const maxLine = 4 << 20

// ErrNotStopped is returned by Stop for a child that did not end within
// its grace after the signal, and was killed.
var ErrNotStopped = errors.New("crashtest: the child did not end after the signal and was killed with SIGKILL")

// Main is the body of a test package's TestMain. In a process started by
// Start or Command it runs the child function registered under the name
// it was started with, given its spec, and exits with the function's
// result; in any other process it runs the tests. A name that is not
// registered exits 2.
func Main(m *testing.M, children map[string]func(spec string) int) {
	if name, ok := os.LookupEnv(childEnv); ok {
		os.Exit(runChild(name, children))
	}
	os.Exit(m.Run())
}

func runChild(name string, children map[string]func(spec string) int) int {
	child, ok := children[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "crashtest: no child %q is registered in this test binary's TestMain\n", name)
		return 2
	}
	return child(os.Getenv(specEnv))
}

// Options are how a child is started. The zero value (or nil) starts it
// with no arguments but -test.run=^$, stderr copied to the test's output,
// and DefaultTimeout.
type Options struct {
	// Args are the child's command-line arguments (os.Args[1:] in the
	// child); "-test.run=^$" when empty.
	Args []string
	// Env adds "NAME=value" variables to the child's environment, which
	// is otherwise this process's.
	Env []string
	// Timeout bounds the child's life from its start: a child still
	// running then is killed with SIGKILL and fails the test. Zero means
	// DefaultTimeout, NoTimeout none.
	Timeout time.Duration
	// OnLine, if set, is called with each line of the child's stdout as
	// it comes, in order, on the goroutine that reads them, before Next
	// can return that line.
	OnLine func(line string)
	// StderrApart keeps the child's stderr out of the test's output (a
	// child expected to die printing every goroutine's stack). It is kept
	// for Stderr either way.
	StderrApart bool
}

func (o *Options) timeout() time.Duration {
	switch {
	case o.Timeout == 0:
		return DefaultTimeout
	case o.Timeout < 0:
		return 0
	}
	return o.Timeout
}

func (o *Options) command(ctx context.Context, name, spec string) *exec.Cmd {
	args := o.Args
	if len(args) == 0 {
		args = []string{"-test.run=^$"}
	}
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(append(os.Environ(), childEnv+"="+name, specEnv+"="+spec), o.Env...)
	return cmd
}

// Command returns, not started, the command that runs this test binary
// as the child registered under name with spec, for code that starts,
// reads and kills the process itself. Its stdout and stderr are unset;
// Options.OnLine and StderrApart do not apply. A command still running
// Options.Timeout after Command returned is killed with SIGKILL and fails
// the test, and one still running when the test ends is killed.
func Command(t testing.TB, name, spec string, o *Options) *exec.Cmd {
	t.Helper()
	if o == nil {
		o = &Options{}
	}
	timeout := o.timeout()
	var ctx context.Context
	var cancel context.CancelFunc
	if timeout > 0 {
		ctx, cancel = context.WithTimeout(context.Background(), timeout)
	} else {
		ctx, cancel = context.WithCancel(context.Background())
	}
	cmd := o.command(ctx, name, spec)
	var hung atomic.Bool
	cmd.Cancel = func() error {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			hung.Store(true)
		}
		return cmd.Process.Kill()
	}
	cmd.WaitDelay = killWait
	t.Cleanup(func() {
		cancel()
		if hung.Load() {
			t.Errorf("crashtest: child %s was still running %v after its command was made: killed with SIGKILL (a hang?)", name, timeout)
		}
	})
	return cmd
}

// Child is a running child process: this test binary, re-executed.
type Child struct {
	t       testing.TB
	name    string
	cmd     *exec.Cmd
	stdout  *os.File
	onLine  func(string)
	timeout time.Duration

	exited chan struct{} // the process was waited for; err is set
	eof    chan struct{} // its stdout was read to the end
	done   chan struct{} // both
	err    error

	stopGuard, guardDone chan struct{}
	hung                 atomic.Bool

	mu     sync.Mutex
	lines  []string
	pos    int           // the next line Next returns
	wake   chan struct{} // closed when a line comes or stdout ends
	closed bool          // stdout ended
	stderr bytes.Buffer
}

// Start runs this test binary as the child registered under name (see
// Main) with spec, which may not hold a NUL byte. The child is killed with
// SIGKILL, and waited for, when the test ends.
func Start(t testing.TB, name, spec string, o *Options) *Child {
	t.Helper()
	if o == nil {
		o = &Options{}
	}
	c := &Child{
		t: t, name: name, cmd: o.command(context.Background(), name, spec), onLine: o.OnLine, timeout: o.timeout(),
		exited: make(chan struct{}), eof: make(chan struct{}), done: make(chan struct{}),
		stopGuard: make(chan struct{}), guardDone: make(chan struct{}), wake: make(chan struct{}),
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatalf("crashtest: child %s: %v", name, err)
	}
	c.stdout = pr
	c.cmd.Stdout = pw
	c.cmd.Stderr = &stderrWriter{c: c, tee: !o.StderrApart}
	c.cmd.WaitDelay = killWait
	if err := c.cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		t.Fatalf("crashtest: starting child %s: %v", name, err)
	}
	pw.Close()
	go c.read()
	go func() {
		c.err = c.cmd.Wait()
		close(c.exited)
	}()
	go func() {
		<-c.exited
		select {
		case <-c.eof:
		case <-time.After(killWait): // another process holds the pipe
			c.stdout.Close()
			<-c.eof
		}
		close(c.done)
	}()
	go c.guard()
	t.Cleanup(c.cleanup)
	return c
}

// stderrWriter keeps the child's stderr and copies it to the test's
// output unless the child's stderr is apart.
type stderrWriter struct {
	c   *Child
	tee bool
}

func (w *stderrWriter) Write(p []byte) (int, error) {
	w.c.mu.Lock()
	w.c.stderr.Write(p)
	w.c.mu.Unlock()
	if w.tee {
		_, _ = os.Stderr.Write(p)
	}
	return len(p), nil
}

func (c *Child) read() {
	sc := bufio.NewScanner(c.stdout)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	for sc.Scan() {
		line := sc.Text()
		if c.onLine != nil {
			c.onLine(line)
		}
		c.mu.Lock()
		c.lines = append(c.lines, line)
		close(c.wake)
		c.wake = make(chan struct{})
		c.mu.Unlock()
	}
	if sc.Err() != nil { // a line too long, or the pipe closed under it
		_, _ = io.Copy(io.Discard, c.stdout)
	}
	c.stdout.Close()
	c.mu.Lock()
	c.closed = true
	close(c.wake)
	c.mu.Unlock()
	close(c.eof)
}

// guard kills the child at its deadline, failing the test.
func (c *Child) guard() {
	defer close(c.guardDone)
	if c.timeout <= 0 {
		select {
		case <-c.exited:
		case <-c.stopGuard:
		}
		return
	}
	tm := time.NewTimer(c.timeout)
	defer tm.Stop()
	select {
	case <-c.exited:
	case <-c.stopGuard:
	case <-tm.C:
		// The failure first: a Wait returns once the kill ends the child,
		// and the test must find it failed by then.
		c.hung.Store(true)
		c.t.Errorf("crashtest: %s was still running %v after its start: killed with SIGKILL (a hang?)\n%s", c, c.timeout, c.Describe())
		c.Signal(syscall.SIGKILL)
	}
}

func (c *Child) cleanup() {
	close(c.stopGuard)
	<-c.guardDone
	select {
	case <-c.done:
		return
	default:
	}
	c.Signal(syscall.SIGKILL)
	select {
	case <-c.done:
	case <-time.After(killWait):
		c.t.Errorf("crashtest: %s had not ended %v after SIGKILL at the end of the test\n%s", c, killWait, c.Describe())
	}
}

// String names the child and its process.
func (c *Child) String() string {
	return fmt.Sprintf("child %s (pid %d)", c.name, c.Pid())
}

// Pid returns the child's process ID.
func (c *Child) Pid() int { return c.cmd.Process.Pid }

// Signal sends sig to the child; a child that has ended is left alone.
func (c *Child) Signal(sig os.Signal) { _ = c.cmd.Process.Signal(sig) }

// SignalAfter sends sig to the child after d, unless the returned timer
// is stopped first.
func (c *Child) SignalAfter(d time.Duration, sig os.Signal) *time.Timer {
	return time.AfterFunc(d, func() { c.Signal(sig) })
}

// Kill sends SIGKILL and waits for the child to end, its stdout read and
// every OnLine call returned. It returns the child's exit error (a
// "signal: killed" unless it ended first). A child that has not ended
// within 30 s fails the test.
func (c *Child) Kill() error {
	c.Signal(syscall.SIGKILL)
	return c.waitAfter("SIGKILL", killWait)
}

// Stop sends sig and waits up to grace for the child to end, as Kill. A
// child still running then is killed with SIGKILL, and Stop returns an
// error matching ErrNotStopped; the caller decides whether that fails the
// test.
func (c *Child) Stop(sig os.Signal, grace time.Duration) error {
	c.Signal(sig)
	select {
	case <-c.done:
		return c.err
	case <-time.After(grace):
	}
	c.Signal(syscall.SIGKILL)
	if err := c.waitAfter("SIGKILL", killWait); err != nil && !c.ended() {
		return err
	}
	return fmt.Errorf("%w (%s, still running %v after %v)", ErrNotStopped, c, grace, sig)
}

// waitAfter waits up to d for the child to end once sent what, failing
// the test if it does not.
func (c *Child) waitAfter(what string, d time.Duration) error {
	select {
	case <-c.done:
		return c.err
	case <-time.After(d):
		err := fmt.Errorf("crashtest: %s had not ended %v after %s", c, d, what)
		c.t.Errorf("%v\n%s", err, c.Describe())
		return err
	}
}

func (c *Child) ended() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// Wait waits for the child to end by itself, its stdout read and every
// OnLine call returned, and returns its exit error. Its deadline
// (Options.Timeout) bounds the wait; with NoTimeout, Wait returns only
// when the child ends.
func (c *Child) Wait() error {
	<-c.done
	return c.err
}

// Done is closed once the child has ended, its stdout read and every
// OnLine call returned.
func (c *Child) Done() <-chan struct{} { return c.done }

// Hung reports whether the child was killed at its deadline.
func (c *Child) Hung() bool { return c.hung.Load() }

// Next returns the child's next stdout line not yet returned by Next or
// WaitLine, waiting for it; false once stdout has ended and every line was
// returned.
func (c *Child) Next() (string, bool) { return c.next(nil) }

func (c *Child) next(deadline <-chan time.Time) (string, bool) {
	for {
		c.mu.Lock()
		if c.pos < len(c.lines) {
			line := c.lines[c.pos]
			c.pos++
			c.mu.Unlock()
			return line, true
		}
		if c.closed {
			c.mu.Unlock()
			return "", false
		}
		wake := c.wake
		c.mu.Unlock()
		select {
		case <-wake:
		case <-deadline:
			return "", false
		}
	}
}

// WaitLine returns, as Next, the first of the child's next lines for which
// match is true; false if stdout ends first or d passes (d <= 0: no
// deadline but the child's).
func (c *Child) WaitLine(d time.Duration, match func(line string) bool) (string, bool) {
	var deadline <-chan time.Time
	if d > 0 {
		tm := time.NewTimer(d)
		defer tm.Stop()
		deadline = tm.C
	}
	for {
		line, ok := c.next(deadline)
		if !ok {
			return "", false
		}
		if match(line) {
			return line, true
		}
	}
}

// Lines returns every stdout line the child printed so far.
func (c *Child) Lines() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.lines...)
}

// Stderr returns everything the child wrote to stderr so far.
func (c *Child) Stderr() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stderr.String()
}

// StderrLine returns the first line the child wrote to stderr.
func (c *Child) StderrLine() string {
	line, _, _ := strings.Cut(c.Stderr(), "\n")
	return line
}

// Describe says, for a failure message, whether the child has ended and
// how, stderr's first line and the child's last stdout lines.
func (c *Child) Describe() string {
	var b strings.Builder
	state := "running"
	select {
	case <-c.exited:
		state = fmt.Sprintf("ended: %v", c.err)
		if c.err == nil {
			state = "ended: exit status 0"
		}
	default:
	}
	fmt.Fprintf(&b, "%s, %s", c, state)
	if line := c.StderrLine(); line != "" {
		fmt.Fprintf(&b, "; stderr: %s", line)
	}
	lines := c.Lines()
	const last = 10
	if len(lines) > last {
		fmt.Fprintf(&b, "\n(%d stdout lines, the last %d:)", len(lines), last)
		lines = lines[len(lines)-last:]
	}
	for _, l := range lines {
		b.WriteString("\n  ")
		b.WriteString(l)
	}
	return b.String()
}

// Say returns what a child reports its progress with: each call prints one
// line (format and args, as fmt.Printf) on stdout, flushed at once, whole
// even from concurrent goroutines, so the parent's OnLine sees every line
// the child printed before it was killed.
func Say() func(format string, args ...any) {
	out := bufio.NewWriter(os.Stdout)
	var mu sync.Mutex
	return func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, format+"\n", args...)
		out.Flush()
	}
}
