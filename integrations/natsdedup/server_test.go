package natsdedup_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// requireNATSEnv makes a missing nats-server binary a test failure instead
// of a skip (CI sets it).
const requireNATSEnv = "TIERDEDUP_REQUIRE_NATS"

// natsServer is a nats-server with JetStream that a test started on a free
// loopback port, with its own store directory, and stops by PID.
type natsServer struct {
	URL string
	cmd *exec.Cmd
}

// startNATS starts `nats-server -js` for the test.
func startNATS(t *testing.T) *natsServer {
	t.Helper()
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		if os.Getenv(requireNATSEnv) != "" {
			t.Fatalf("nats-server is required (%s is set): %v", requireNATSEnv, err)
		}
		t.Skipf("no nats-server binary (set %s to make this a failure): %v", requireNATSEnv, err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command(bin, "-a", "127.0.0.1", "-p", fmt.Sprint(port), "-js", "-sd", t.TempDir())
	cmd.Stdout, cmd.Stderr = nil, nil // its log is not the test's
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &natsServer{URL: fmt.Sprintf("nats://127.0.0.1:%d", port), cmd: cmd}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		nc, err := nats.Connect(s.URL)
		if err == nil {
			nc.Close()
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("nats-server on port %d did not start: %v", port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
