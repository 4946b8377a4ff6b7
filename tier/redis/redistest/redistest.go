package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// RequireEnv names the variable that turns a missing redis-server into a
// test failure instead of a skip; CI sets it.
const RequireEnv = "TIERDEDUP_REQUIRE_REDIS"

// Server is one redis-server process.
type Server struct {
	t    testing.TB
	Addr string
	Port int
	Dir  string
	args []string
	conf string // a configuration file to start from (sentinels need one)
	cmd  *exec.Cmd
}

// Binary returns the path of redis-server, failing the test when it is
// missing and RequireEnv is set, skipping it otherwise.
func Binary(t testing.TB) string {
	t.Helper()
	path, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv(RequireEnv) != "" {
			t.Fatalf("redis-server not found and %s is set: %v", RequireEnv, err)
		}
		t.Skipf("redis-server not found (set %s to make this a failure): %v", RequireEnv, err)
	}
	return path
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Start runs a redis-server on a free port with a temporary directory and
// the extra configuration arguments given (for example "--appendonly",
// "yes"). It is stopped when the test ends.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	s := &Server{t: t, Dir: t.TempDir(), args: extra}
	s.launch()
	return s
}

// launch starts s on a free port, trying a few in case another process
// took the port meanwhile, and stops it when the test ends.
func (s *Server) launch() {
	s.t.Helper()
	for attempt := 0; ; attempt++ {
		s.Port = FreePort(s.t)
		s.Addr = "127.0.0.1:" + strconv.Itoa(s.Port)
		err := s.start()
		if err == nil {
			break
		}
		if attempt == 3 {
			s.t.Fatal(err)
		}
	}
	s.t.Cleanup(s.Stop)
}

func (s *Server) start() error {
	var args []string
	if s.conf != "" {
		args = append(args, s.conf)
	}
	args = append(append(args,
		"--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1", "--dir", s.Dir,
		"--daemonize", "no", "--logfile", filepath.Join(s.Dir, "redis.log"),
		"--protected-mode", "no",
	), s.args...)
	if s.conf == "" {
		args = append(args, "--save", "")
	}
	s.cmd = exec.Command(Binary(s.t), args...)
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func(c *exec.Cmd) { exited <- c.Wait() }(s.cmd)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			log, _ := os.ReadFile(filepath.Join(s.Dir, "redis.log"))
			return fmt.Errorf("redis-server on %s exited: %v\n%s", s.Addr, err, tail(string(log)))
		default:
		}
		switch pid := s.answeringPid(); {
		case pid == s.cmd.Process.Pid && s.loaded():
			// Answering, and done loading its dataset: before that every
			// command but a few (INFO among them) is refused with LOADING.
			return nil
		case pid == s.cmd.Process.Pid:
		case pid != 0:
			// Another process's server took the port between FreePort and
			// this start (tests run in parallel): ours cannot bind it.
			_ = syscall.Kill(s.cmd.Process.Pid, syscall.SIGKILL)
			<-exited
			return fmt.Errorf("port %d is another server's (pid %d)", s.Port, pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return errors.New("redis-server did not answer within 10s on " + s.Addr)
}

// loaded reports whether the server answering on s.Addr has its dataset
// loaded: a PING answered PONG, not LOADING.
func (s *Server) loaded() bool {
	c, err := net.DialTimeout("tcp", s.Addr, 100*time.Millisecond)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	buf := make([]byte, 256)
	n, _ := c.Read(buf)
	return strings.HasPrefix(string(buf[:n]), "+PONG")
}

// answeringPid returns the process ID of the server answering on s.Addr
// (from INFO server), or 0 if none answers yet.
func (s *Server) answeringPid() int {
	c, err := net.DialTimeout("tcp", s.Addr, 100*time.Millisecond)
	if err != nil {
		return 0
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("INFO server\r\n")); err != nil {
		return 0
	}
	var reply []byte
	buf := make([]byte, 4096)
	for !strings.Contains(string(reply), "\r\nprocess_id:") || !strings.Contains(string(reply[strings.Index(string(reply), "\r\nprocess_id:")+2:]), "\r\n") {
		n, err := c.Read(buf)
		reply = append(reply, buf[:n]...)
		if err != nil {
			return 0
		}
	}
	line := string(reply[strings.Index(string(reply), "\r\nprocess_id:")+len("\r\nprocess_id:"):])
	pid, _ := strconv.Atoi(line[:strings.Index(line, "\r\n")])
	return pid
}

func tail(s string) string {
	if len(s) > 2000 {
		return s[len(s)-2000:]
	}
	return s
}

// Client returns a go-redis client of s with default options, closed when
// the test t (which may be a subtest of the one that started s) ends.
func (s *Server) Client(t testing.TB) *goredis.Client { return s.ClientWith(t, nil) }

// ClientWith is Client with the options o (timeouts, retries, pool size),
// whose Addr is replaced by s's; o is not changed.
func (s *Server) ClientWith(t testing.TB, o *goredis.Options) *goredis.Client {
	var opts goredis.Options
	if o != nil {
		opts = *o
	}
	opts.Addr = s.Addr
	c := goredis.NewClient(&opts)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// SentinelClient returns a go-redis client of s, a sentinel
// (StartSentinel), closed when the test t ends.
func (s *Server) SentinelClient(t testing.TB) *goredis.SentinelClient {
	c := goredis.NewSentinelClient(&goredis.Options{Addr: s.Addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Pid returns the server's process ID.
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// Kill stops the server with SIGKILL, as a crash would.
func (s *Server) Kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = syscall.Kill(s.Pid(), syscall.SIGKILL)
		waitGone(s.Pid())
	}
}

// Pause stops the server with SIGSTOP.
func (s *Server) Pause() { _ = syscall.Kill(s.Pid(), syscall.SIGSTOP) }

// Resume continues a paused server with SIGCONT.
func (s *Server) Resume() { _ = syscall.Kill(s.Pid(), syscall.SIGCONT) }

// Restart starts the server again on the same port and directory, after a
// Kill.
func (s *Server) Restart() {
	s.t.Helper()
	if err := s.start(); err != nil {
		s.t.Fatal(err)
	}
}

// Stop terminates the server; it is idempotent.
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = syscall.Kill(s.Pid(), syscall.SIGCONT)
	_ = syscall.Kill(s.Pid(), syscall.SIGKILL)
	waitGone(s.Pid())
}

func waitGone(pid int) {
	for i := 0; i < 500; i++ {
		var st syscall.WaitStatus
		if wpid, _ := syscall.Wait4(pid, &st, syscall.WNOHANG, nil); wpid == pid {
			return
		}
		if err := syscall.Kill(pid, 0); err != nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// StartReplica runs a redis-server that replicates master.
func StartReplica(t testing.TB, master *Server, extra ...string) *Server {
	t.Helper()
	return Start(t, append([]string{"--replicaof", "127.0.0.1", strconv.Itoa(master.Port)}, extra...)...)
}

// WaitSynced waits until s, a replica, has its link to its master up
// (10 s at most, then the test fails).
func (s *Server) WaitSynced(t testing.TB) {
	t.Helper()
	c := s.Client(t)
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, _ := c.Info(context.Background(), "replication").Result()
		if strings.Contains(info, "master_link_status:up") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica did not sync:\n%s", info)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// StartSentinel runs a Redis Sentinel that monitors master under name,
// alone (quorum 1), declaring it down after downAfter.
func StartSentinel(t testing.TB, name string, master *Server, downAfter time.Duration) *Server {
	t.Helper()
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	body := fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 1\nsentinel down-after-milliseconds %s %d\nsentinel failover-timeout %s 5000\nsentinel parallel-syncs %s 1\n",
		name, master.Port, name, downAfter.Milliseconds(), name, name)
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	s := &Server{t: t, Dir: dir, conf: conf, args: []string{"--sentinel"}}
	s.launch()
	return s
}

// Cluster is three redis-server masters joined into a Redis Cluster.
type Cluster struct {
	Masters []*Server
}

// Addrs returns the masters' addresses.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Masters))
	for i, m := range c.Masters {
		out[i] = m.Addr
	}
	return out
}

// Client returns a go-redis cluster client of c with default options,
// closed when the test t ends.
func (c *Cluster) Client(t testing.TB) *goredis.ClusterClient { return c.ClientWith(t, nil) }

// ClientWith is Client with the options o, whose Addrs are replaced by the
// masters'; o is not changed.
func (c *Cluster) ClientWith(t testing.TB, o *goredis.ClusterOptions) *goredis.ClusterClient {
	var opts goredis.ClusterOptions
	if o != nil {
		opts = *o
	}
	opts.Addrs = c.Addrs()
	cc := goredis.NewClusterClient(&opts)
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// StartCluster starts three masters with cluster-enabled and joins them
// with redis-cli --cluster create, then waits until the cluster is ok.
func StartCluster(t testing.TB, extra ...string) *Cluster {
	t.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		Binary(t) // the same rule: fail under RequireEnv, skip otherwise
		t.Fatalf("redis-cli not found: %v", err)
	}
	c := &Cluster{}
	for range 3 {
		c.Masters = append(c.Masters, Start(t, append([]string{"--cluster-enabled", "yes", "--cluster-node-timeout", "2000"}, extra...)...))
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		ok := true
		for _, m := range c.Masters {
			out, err := exec.Command(cli, "-p", strconv.Itoa(m.Port), "cluster", "info").Output()
			if err != nil || !strings.Contains(string(out), "cluster_state:ok") {
				ok = false
			}
		}
		if ok {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatal("cluster did not reach cluster_state:ok in 20s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Benchmark runs redis-benchmark against s: n requests of the command in
// args (where __rand_int__ draws from a billion), 50 connections
// pipelining 64 each, and returns its requests a second. A missing
// redis-benchmark fails tb when RequireEnv is set and skips it otherwise,
// as a missing redis-server does.
func (s *Server) Benchmark(tb testing.TB, n int, args ...string) float64 {
	tb.Helper()
	tool, err := exec.LookPath("redis-benchmark")
	if err != nil {
		if os.Getenv(RequireEnv) != "" {
			tb.Fatalf("redis-benchmark is required (%s is set): %v", RequireEnv, err)
		}
		tb.Skip("redis-benchmark not installed")
	}
	cmd := append([]string{"-h", "127.0.0.1", "-p", strconv.Itoa(s.Port), "-n", strconv.Itoa(n),
		"-c", "50", "-P", "64", "-r", "1000000000", "-q"}, args...)
	out, err := exec.Command(tool, cmd...).CombinedOutput()
	if err != nil {
		tb.Fatalf("redis-benchmark: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`([0-9.]+) requests per second`).FindSubmatch(out)
	if m == nil {
		tb.Fatalf("unexpected redis-benchmark output: %s", out)
	}
	rps, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		tb.Fatalf("redis-benchmark's rate %q: %v", m[1], err)
	}
	return rps
}
