package pgtest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Server is a private PostgreSQL a test can kill: its own data directory
// and loopback port, started with the machine's PostgreSQL binaries (as the
// postgres user when the test runs as root, which initdb refuses).
type Server struct {
	// DSN reaches the server's postgres database, trust authentication.
	DSN  string
	t    testing.TB
	bin  string
	data string
	port int
	cred *syscall.Credential
	cmd  *exec.Cmd
	exit chan error
}

// StartServer initialises a data directory and starts a server on it; it
// is killed and removed when the test ends. Without PostgreSQL's binaries
// the test is skipped, or fails under TIERDEDUP_REQUIRE_POSTGRES.
func StartServer(t testing.TB) *Server {
	t.Helper()
	bin, err := binDir()
	if err != nil {
		if os.Getenv("TIERDEDUP_REQUIRE_POSTGRES") != "" {
			t.Fatalf("PostgreSQL server binaries: %v", err)
		}
		t.Skipf("PostgreSQL server binaries: %v", err)
	}
	s := &Server{t: t, bin: bin}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root, a private server needs the postgres user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	root, err := os.MkdirTemp("", "tierdedup-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	s.data = filepath.Join(root, "data")
	if err := os.Mkdir(s.data, 0o700); err != nil {
		t.Fatal(err)
	}
	if s.cred != nil {
		if err := os.Chown(s.data, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	initdb := s.command("initdb", "-D", s.data, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8")
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	// The port is free when chosen, not when the server binds it: another
	// test's server (packages run in parallel) may take it first, and
	// would then answer for this one. A start that finds it taken tries
	// another port.
	for try := 0; ; try++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		s.port = l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		s.DSN = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres", s.port)
		err = s.start()
		if err == nil {
			break
		}
		if try == 4 {
			t.Fatal(err)
		}
		t.Logf("postgres on port %d: %v; trying another port", s.port, err)
	}
	t.Cleanup(s.Kill)
	return s
}

// binDir finds the directory of initdb and postgres.
func binDir() (string, error) {
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dir := strings.TrimSpace(string(out))
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err == nil {
			return dir, nil
		}
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(found) == 0 {
		return "", fmt.Errorf("no initdb found (pg_config --bindir, /usr/lib/postgresql/*/bin)")
	}
	return filepath.Dir(found[len(found)-1]), nil
}

func (s *Server) command(name string, args ...string) *exec.Cmd {
	c := exec.Command(filepath.Join(s.bin, name), args...)
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: s.cred}
	return c
}

// Start starts the server on its data directory (after Kill: with crash
// recovery) and waits until it accepts connections.
func (s *Server) Start() {
	s.t.Helper()
	if err := s.start(); err != nil {
		s.t.Fatal(err)
	}
}

// start is Start, returning its failure: the server exited at start, was
// not ready in 30 s, or the port answers with another server (its data
// directory is not this one's), which is then left alone.
func (s *Server) start() error {
	s.cmd = s.command("postgres", "-D", s.data, "-p", strconv.Itoa(s.port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
		"-c", "fsync=on", "-c", "synchronous_commit=on", "-c", "max_connections=50")
	log, err := os.Create(filepath.Join(filepath.Dir(s.data), "server.log"))
	if err != nil {
		return err
	}
	defer log.Close()
	s.cmd.Stdout, s.cmd.Stderr = log, log
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("starting postgres: %w", err)
	}
	s.exit = make(chan error, 1)
	go func(c *exec.Cmd, exit chan error) { exit <- c.Wait() }(s.cmd, s.exit)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		var dataDir string
		p, err := pgxpool.New(ctx, s.DSN)
		if err == nil {
			err = p.QueryRow(ctx, "SHOW data_directory").Scan(&dataDir)
			p.Close()
		}
		cancel()
		if err == nil {
			if filepath.Clean(dataDir) != filepath.Clean(s.data) {
				s.Kill()
				return fmt.Errorf("port %d answers with the server of %s, not %s", s.port, dataDir, s.data)
			}
			return nil
		}
		select {
		case werr := <-s.exit:
			body, _ := os.ReadFile(log.Name())
			s.cmd = nil
			return fmt.Errorf("postgres exited at start: %v\n%s", werr, body)
		default:
		}
		if time.Now().After(deadline) {
			body, _ := os.ReadFile(log.Name())
			s.Kill()
			return fmt.Errorf("postgres not ready in 30 s: %v\n%s", err, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Pause stops the server and every process it started (SIGSTOP): what
// clients send waits in their sockets, and runs once Resume continues it,
// after the callers may have given up on it. (Each process of the server
// leads a session of its own: they are found by their parent, not their
// process group.)
func (s *Server) Pause() {
	s.t.Helper()
	s.signal(syscall.SIGSTOP) // the postmaster first: it forks nothing more
}

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume() {
	s.t.Helper()
	s.signal(syscall.SIGCONT)
}

// signal sends sig to the postmaster and every process under it.
func (s *Server) signal(sig syscall.Signal) {
	s.t.Helper()
	if s.cmd == nil || s.cmd.Process == nil {
		s.t.Fatal("pgtest: the server is not running")
	}
	for _, pid := range s.processes() {
		if err := syscall.Kill(pid, sig); err != nil && err != syscall.ESRCH {
			s.t.Fatalf("pgtest: %v to process %d of the server: %v", sig, pid, err)
		}
	}
}

// processes lists the postmaster, then every process under it.
func (s *Server) processes() []int {
	pids := []int{s.cmd.Process.Pid}
	for i := 0; i < len(pids); i++ {
		kids, err := children(pids[i])
		if err != nil {
			s.t.Fatalf("pgtest: the server's processes: %v", err)
		}
		pids = append(pids, kids...)
	}
	return pids
}

// children lists the processes whose parent is pid (/proc).
func children(pid int) ([]int, error) {
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		return nil, err
	}
	var out []int
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(string(b[i+1:]))
		if len(fields) < 2 {
			continue
		}
		if ppid, _ := strconv.Atoi(fields[1]); ppid == pid {
			child, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(f, "/proc/"), "/stat"))
			out = append(out, child)
		}
	}
	return out, nil
}

// Kill SIGKILLs the server and every process it started (a crash: what
// reached the operating system stays, what was in the processes' memory is
// gone), and waits until they are gone. Each process of the server leads a
// session of its own, so they are found by their parent.
func (s *Server) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	pids := s.processes()
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL) // stopped ones too: SIGKILL needs no SIGCONT
	}
	<-s.exit
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		left := 0
		for _, pid := range pids[1:] {
			if syscall.Kill(pid, 0) == nil && !zombie(pid) {
				left++
			}
		}
		if left == 0 {
			break
		}
	}
	s.cmd = nil
}

// zombie reports whether pid has exited and waits for its parent to reap it.
func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(b), ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'Z'
}
