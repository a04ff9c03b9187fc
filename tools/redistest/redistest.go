// Package redistest starts real redis-server processes for tests: a single
// server (StartServer) or a Redis Cluster of N masters (StartCluster), on
// free 127.0.0.1 ports, without persistence (`--save "" --appendonly no`),
// killed by t.Cleanup. Tests use real servers, not mocks: client-side
// caching, invalidation pushes and cluster slots are what the directory
// depends on, and only a real server has them.
//
// A missing redis-server is a test failure ("run make test"), never a skip:
// make test installs it, and a silently skipped Redis suite would hide a
// broken store.
package redistest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/internal/testlog"
)

// Timeouts bound every step: a test never waits on Redis forever.
const (
	startTimeout   = 10 * time.Second
	stopTimeout    = 5 * time.Second
	clusterTimeout = 30 * time.Second
	startAttempts  = 5
)

// Server is one redis-server process on 127.0.0.1. Its methods are safe for
// concurrent use.
type Server struct {
	// Port is the plain TCP port the server listens on at 127.0.0.1, kept
	// across Stop and Start; a cluster node's bus port is Port+10000.
	Port int
	// Addr is 127.0.0.1:Port.
	Addr string

	dir     string
	cluster bool
	// extra are more arguments after the standard ones (TLS, sentinel).
	extra []string
	// conf, when set, is the config file given first (sentinel mode
	// needs a writable one).
	conf string

	// TLSPort is the TLS listener's port (StartTLSServer), 0 without TLS.
	TLSPort int
	// CAFile is the PEM of the CA that signed the TLS certificate: for
	// SSL_CERT_FILE or a client's root pool.
	CAFile string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	out  *testlog.Buffer // written by exec's copying goroutine while Output reads it
}

// Binaries returns the paths of redis-server and redis-cli, or an error
// telling the reader to run make test.
func Binaries() (server, cli string, err error) {
	server, err = exec.LookPath("redis-server")
	if err != nil {
		return "", "", errors.New("redis-server not found on PATH: run make test (it installs redis-server from Debian's packages)")
	}
	cli, err = exec.LookPath("redis-cli")
	if err != nil {
		return "", "", errors.New("redis-cli not found on PATH: run make test (it installs redis-server and redis-cli)")
	}
	return server, cli, nil
}

// StartServer starts a standalone server for this test; t.Cleanup kills it.
func StartServer(t testing.TB) *Server {
	t.Helper()
	s, err := Start(t.TempDir(), false)
	if err != nil {
		t.Fatalf("cannot start redis-server: %v", err)
	}
	t.Cleanup(s.Kill)
	return s
}

// StartServerArgs is StartServer with more redis-server arguments after the
// standard ones: a renamed command (`--rename-command EVAL_RO ""` stands
// in for a server that lacks it), a configuration knob.
func StartServerArgs(t testing.TB, args ...string) *Server {
	t.Helper()
	return startVariant(t, "redis-server", func(int, string) (*Server, error) { return &Server{extra: args}, nil })
}

// Start starts a server whose files live in dir (for programs that are not
// tests, such as bench/redisfig). The caller must Kill it.
func Start(dir string, cluster bool) (*Server, error) {
	return startIn(dir, cluster, func(int, string) (*Server, error) { return &Server{cluster: cluster}, nil })
}

// startIn starts a server that mk describes, on a free port (and, for a
// cluster node, a free bus port) with its own directory below base,
// retrying when another process takes the port first.
func startIn(base string, cluster bool, mk func(port int, dir string) (*Server, error)) (*Server, error) {
	if _, _, err := Binaries(); err != nil {
		return nil, err
	}
	var last error
	for range startAttempts {
		port, err := freePortPair(cluster)
		if err != nil {
			return nil, err
		}
		dir := filepath.Join(base, strconv.Itoa(port))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("cannot create %s: %w", dir, err)
		}
		s, err := mk(port, dir)
		if err != nil {
			return nil, err
		}
		s.Port, s.Addr, s.dir = port, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir
		if last = s.Start(); last == nil {
			return s, nil
		}
	}
	return nil, last
}

// startVariant is startIn for a test: t.Cleanup kills the server.
func startVariant(t testing.TB, what string, mk func(port int, dir string) (*Server, error)) *Server {
	t.Helper()
	s, err := startIn(t.TempDir(), false, mk)
	if err != nil {
		t.Fatalf("cannot start %s: %v", what, err)
	}
	t.Cleanup(s.Kill)
	return s
}

// URL is redis://127.0.0.1:Port.
func (s *Server) URL() string { return "redis://" + s.Addr }

// Start (re)starts the server on its port. After StopSaving it loads the
// saved data; after Stop or Kill it starts empty, like a restart without
// persistence.
func (s *Server) Start() error {
	bin, _, err := Binaries()
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return fmt.Errorf("redis-server on %s is already running", s.Addr)
	}
	var args []string
	if s.conf != "" {
		args = append(args, s.conf)
	}
	args = append(args,
		"--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
		"--protected-mode", "no", "--loglevel", "warning",
	)
	args = append(args, s.extra...)
	if s.cluster {
		args = append(args, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000")
	}
	cmd := exec.Command(bin, args...)
	out := &testlog.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	// Pdeathsig: a test binary killed by -timeout takes its servers along.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("cannot start redis-server: %w", err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	s.cmd, s.done, s.out = cmd, done, out
	deadline := time.Now().Add(startTimeout)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			s.cmd = nil
			return fmt.Errorf("redis-server on %s exited at start: %s", s.Addr, strings.TrimSpace(out.String()))
		default:
		}
		if reply, err := s.cli("PING"); err == nil && reply == "PONG" {
			// The answer may come from another process's server on the
			// port, ours about to exit on "Address already in use": the
			// one answering must be ours.
			pid, err := s.pid()
			if err == nil && pid == cmd.Process.Pid {
				return nil
			}
			if err == nil {
				s.killLocked()
				return fmt.Errorf("redis-server on %s: the port answers as process %d, not ours (%d): another process holds it: %s",
					s.Addr, pid, cmd.Process.Pid, strings.TrimSpace(out.String()))
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.killLocked()
	return fmt.Errorf("redis-server on %s not answering PING after %v: %s", s.Addr, startTimeout, strings.TrimSpace(out.String()))
}

// pid is the process id of the server answering on the port (INFO
// server's process_id).
func (s *Server) pid() (int, error) {
	info, err := s.Info("server")
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(info["process_id"])
}

// Info returns the fields of INFO section ("field:value" lines; the
// "# Section" headings and blank lines left out).
func (s *Server) Info(section string) (map[string]string, error) {
	fields, reply, err := s.infoFields(section)
	if err == nil && len(fields) == 0 {
		err = fmt.Errorf("unexpected INFO %s reply of %s: %q", section, s.Addr, reply)
	}
	return fields, err
}

// infoFields is INFO section's fields and its reply, which may hold none
// (INFO commandstats right after CONFIG RESETSTAT).
func (s *Server) infoFields(section string) (map[string]string, string, error) {
	reply, err := s.cli("INFO", section)
	if err != nil {
		return nil, "", err
	}
	fields := make(map[string]string)
	for _, line := range strings.Split(reply, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && !strings.HasPrefix(k, "#") {
			fields[k] = v
		}
	}
	return fields, reply, nil
}

// CommandCalls returns, by command name ("evalsha", "get"), how many times
// the server ran each command since it started or its statistics were last
// reset (CONFIG RESETSTAT): INFO commandstats, where commands run inside
// scripts count too, and so does each INFO. A command never run is absent.
func (s *Server) CommandCalls() (map[string]int64, error) {
	fields, _, err := s.infoFields("commandstats")
	if err != nil {
		return nil, err
	}
	calls := make(map[string]int64, len(fields))
	for k, stats := range fields {
		name, ok := strings.CutPrefix(k, "cmdstat_")
		if !ok {
			continue
		}
		n, ok := statField(stats, "calls")
		if !ok {
			return nil, fmt.Errorf("unexpected INFO commandstats field of %s: %s:%s", s.Addr, k, stats)
		}
		calls[name] = n
	}
	return calls, nil
}

// statField reads name's integer from "calls=3,usec=10,…".
func statField(stats, name string) (int64, bool) {
	for _, f := range strings.Split(stats, ",") {
		if v, ok := strings.CutPrefix(f, name+"="); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// Stop ends the server without saving (SIGKILL): its data is gone, as after
// a crash of a server without persistence.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killLocked()
}

// Kill is Stop; named for t.Cleanup.
func (s *Server) Kill() { s.Stop() }

// StopSaving shuts the server down with SHUTDOWN SAVE, so the next Start
// loads the same data: an outage without data loss.
func (s *Server) StopSaving() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return nil
	}
	_, _ = s.cli("SHUTDOWN", "SAVE")
	select {
	case <-s.done:
		s.cmd = nil
		return nil
	case <-time.After(stopTimeout):
		s.killLocked()
		return fmt.Errorf("redis-server on %s did not stop within %v of SHUTDOWN SAVE", s.Addr, stopTimeout)
	}
}

// Pause stops the server's process (SIGSTOP) without closing anything:
// its connections stay open and its port keeps accepting (the kernel
// completes the handshakes), but no command is answered until Resume —
// a Redis stalled by a long command, a fork or a VM pause, or a silent
// partition, which no connection error reveals. Stop and Kill end a
// paused server too.
func (s *Server) Pause() error { return s.signal(syscall.SIGSTOP) }

// Resume continues a server Pause stopped (SIGCONT).
func (s *Server) Resume() error { return s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return fmt.Errorf("redis-server on %s is not running", s.Addr)
	}
	return s.cmd.Process.Signal(sig)
}

// Restart is Stop then Start: the server comes back empty on the same port.
func (s *Server) Restart() error {
	s.Stop()
	return s.Start()
}

func (s *Server) killLocked() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	select {
	case <-s.done:
	case <-time.After(stopTimeout):
	}
	s.cmd = nil
}

// FlushAll wipes every key (FLUSHALL), as an operator or a failover to an
// empty replica would.
func (s *Server) FlushAll() error {
	reply, err := s.Do("FLUSHALL")
	if err != nil {
		return err
	}
	if reply != "OK" {
		return fmt.Errorf("unexpected FLUSHALL reply %q", reply)
	}
	return nil
}

// Do runs one command through redis-cli and returns its raw output.
func (s *Server) Do(args ...string) (string, error) { return s.cli(args...) }

// Output is what the server printed so far.
func (s *Server) Output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.out == nil {
		return ""
	}
	return s.out.String()
}

func (s *Server) cli(args ...string) (string, error) {
	_, cli, err := Binaries()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	full := append([]string{"-h", "127.0.0.1", "-p", strconv.Itoa(s.Port)}, args...)
	out, err := exec.CommandContext(ctx, cli, full...).CombinedOutput()
	reply := strings.TrimSpace(string(out))
	if err != nil {
		return reply, fmt.Errorf("redis-cli %s: %w: %s", strings.Join(args, " "), err, reply)
	}
	if strings.HasPrefix(reply, "Could not connect") || strings.HasPrefix(reply, "ERR ") {
		return reply, fmt.Errorf("redis-cli %s: %s", strings.Join(args, " "), reply)
	}
	return reply, nil
}

// freePortPair picks a port that is free on 127.0.0.1 and, for cluster
// nodes, whose cluster bus port (port+10000) is free too, and reserves it
// for this process's lifetime: once in this process (handedOut), and
// against every other process using redistest (reserve: go test runs
// packages side by side, each its own process). A port a test stopped
// its server on stays referenced — a replica, a sentinel and the store
// under test keep dialing it — so another test's server must never take
// it. The ports lie below the kernel's ephemeral range (portRange), which
// the system hands to outgoing connections and to listeners on port 0.
// Another process may still take a port before the server binds; Start
// then fails and startIn retries.
func freePortPair(cluster bool) (int, error) {
	lo, hi := portRange(cluster)
	for range 100 {
		port := lo + rand.IntN(hi-lo)
		if !portFree(port) || (cluster && !portFree(port+10000)) {
			continue
		}
		// Once per process: two parallel tests on one port would each see
		// the other's server answer PING.
		if _, taken := handedOut.LoadOrStore(port, true); taken {
			continue
		}
		if !reserve(port) || (cluster && !reserve(port+10000)) {
			continue // another process's (the port stays handed out here)
		}
		return port, nil
	}
	return 0, errors.New("cannot find a free port on 127.0.0.1")
}

// handedOut holds every port freePortPair returned (test-helper state).
var handedOut sync.Map

// portBase is the lowest port freePortPair picks.
const portBase = 12000

// portRange is where freePortPair picks ports: from portBase up to the
// start of the kernel's ephemeral range (ip_local_port_range, 32768 by
// default), and for a cluster node low enough that its bus port
// (port+10000) is below it too. The range before reached 44999, half of it
// inside the ephemeral range.
func portRange(cluster bool) (lo, hi int) {
	hi = 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				hi = v
			}
		}
	}
	if cluster {
		hi -= 10000
	}
	if hi-portBase < 1000 { // an unusual ephemeral range: the old range
		return 20000, 45000
	}
	return portBase, hi
}

// reserve takes port for this process against other processes using
// redistest: an exclusive lock on a file named for it, held until the
// process exits (the kernel drops it then, however the process ends).
// A port whose file cannot be locked is another process's.
func reserve(port int) bool {
	dir := filepath.Join(os.TempDir(), "redistest-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return true // no reservation possible: handedOut and Start's retry still apply
	}
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return true
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return false
	}
	reserved.Store(port, f) // kept open: closing it would drop the lock
	return true
}

// reserved holds the files whose locks reserve this process's ports.
var reserved sync.Map

func portFree(port int) bool {
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	ln.Close()
	return true
}
