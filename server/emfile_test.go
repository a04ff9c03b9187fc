package server

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/internal/testlog"
)

// Running out of file descriptors is a moment to wait through, not a
// reason to stop: fasthttp's Serve returns on any accept error but a
// timeout, and pinboard then exited — a client opening connections up to
// the process's descriptor limit took the node down, and every stream
// and WebSocket with it. The node runs in a child process (the test
// binary again) whose limit is lowered; this process opens connections
// past it, lets them go, and the node must serve again (R-SRV-1).
func TestAcceptSurvivesFDExhaustion_RSRV1(t *testing.T) {
	if os.Getenv("PINBOARD_TEST_EMFILE_CHILD") == "1" {
		emfileChild(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestAcceptSurvivesFDExhaustion_RSRV1$", "-test.count=1")
	cmd.Env = append(os.Environ(), "PINBOARD_TEST_EMFILE_CHILD=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr testlog.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var exitErr error
	out := bufio.NewReader(stdout)
	addr := make(chan string, 1)
	go func() {
		for {
			line, err := out.ReadString('\n')
			if after, ok := strings.CutPrefix(line, "ADDR="); ok {
				addr <- strings.TrimSpace(after)
			}
			if err != nil {
				exitErr = cmd.Wait()
				close(exited)
				return
			}
		}
	}()
	defer func() {
		stdin.Close() // the child returns on EOF
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
		}
	}()
	var public string
	select {
	case public = <-addr:
	case <-exited:
		t.Fatalf("the child exited before serving: %v\n%s", exitErr, stderr.String())
	case <-time.After(20 * time.Second):
		t.Fatalf("the child did not start within 20s\n%s", stderr.String())
	}
	// Past the child's limit: its accepts fail with EMFILE while these
	// wait in the backlog.
	var conns []net.Conn
	for range 200 {
		c, err := net.DialTimeout("tcp", public, 2*time.Second)
		if err != nil {
			break
		}
		conns = append(conns, c)
	}
	time.Sleep(500 * time.Millisecond) // let the child's accept loop meet the limit
	for _, c := range conns {
		c.Close()
	}
	client := &http.Client{Timeout: 2 * time.Second}
serving:
	for deadline := time.Now().Add(15 * time.Second); ; {
		select {
		case <-exited:
			t.Fatalf("unexpected child exit after running out of descriptors; got %v; want it serving\n%s", exitErr, stderr.String())
		default:
		}
		res, err := client.Get("http://" + public + "/livez")
		if err == nil {
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode == 200 {
				break serving
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("unexpected /livez 15s after the descriptors came back; got %v; want 200\n%s", err, stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The node did meet the limit: a test whose connections all fit under
	// it would pass without exercising anything.
	if !strings.Contains(stderr.String(), "cannot accept connections: out of resources") {
		t.Fatalf("unexpected child log; want the accept loop's out-of-resources warning (EMFILE never hit?)\n%s", stderr.String())
	}
}

// emfileChild serves a node under a descriptor limit a few dozen above
// what it has open, until stdin closes; a Serve that returns fails it.
func emfileChild(t *testing.T) {
	pb, _ := testPinboard(t, "")
	// The accept loop's warning goes to stderr, for the parent to see
	// that the limit was met.
	pb.log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("cannot count descriptors: %v", err)
	}
	lim := uint64(len(fds) + 32)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: lim, Max: lim}); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { served <- pb.Serve(ctx, ln, 0) }()
	fmt.Printf("ADDR=%s\n", ln.Addr())
	stdinDone := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(stdinDone) }()
	select {
	case err := <-served:
		fmt.Fprintf(os.Stderr, "Serve returned: %v\n", err)
		os.Exit(3)
	case <-stdinDone:
	}
	cancel()
	<-served
}
