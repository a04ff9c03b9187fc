package redistest

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Sentinel is one redis-server in sentinel mode watching a master.
type Sentinel struct {
	*Server
	// MasterName is the name the master is monitored under.
	MasterName string
}

// StartSentinel starts a sentinel monitoring master as name (quorum 1)
// and waits until it reports the master's address; t.Cleanup kills it.
func StartSentinel(t testing.TB, master *Server, name string) *Sentinel {
	t.Helper()
	dir := t.TempDir()
	var last error
	for range startAttempts {
		port, err := freePortPair(false)
		if err != nil {
			t.Fatal(err)
		}
		sdir := filepath.Join(dir, strconv.Itoa(port))
		if err := os.MkdirAll(sdir, 0o755); err != nil {
			t.Fatal(err)
		}
		// Sentinel rewrites its configuration file: it must be its own.
		conf := filepath.Join(sdir, "sentinel.conf")
		body := fmt.Sprintf("sentinel monitor %[1]s 127.0.0.1 %[2]d 1\n"+
			"sentinel down-after-milliseconds %[1]s 1000\nsentinel failover-timeout %[1]s 10000\n", name, master.Port)
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		s := &Sentinel{Server: &Server{Port: port, Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: sdir,
			conf: conf, extra: []string{"--sentinel"}}, MasterName: name}
		if last = s.Start(); last != nil {
			continue
		}
		t.Cleanup(s.Kill)
		want := "127.0.0.1\n" + strconv.Itoa(master.Port)
		deadline := time.Now().Add(startTimeout)
		for {
			reply, err := s.Do("SENTINEL", "get-master-addr-by-name", name)
			if err == nil && strings.TrimSpace(reply) == want {
				return s
			}
			if time.Now().After(deadline) {
				t.Fatalf("sentinel on %s does not report master %s at %s: %q %v", s.Addr, name, master.Addr, reply, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	t.Fatalf("cannot start a sentinel: %v", last)
	return nil
}

// URL is redis+sentinel://127.0.0.1:Port/MasterName.
func (s *Sentinel) URL() string { return "redis+sentinel://" + s.Addr + "/" + s.MasterName }

// StartReplica starts a server replicating master and waits until the
// link is up; t.Cleanup kills it.
func StartReplica(t testing.TB, master *Server) *Server {
	t.Helper()
	dir := t.TempDir()
	var last error
	for range startAttempts {
		port, err := freePortPair(false)
		if err != nil {
			t.Fatal(err)
		}
		s := &Server{Port: port, Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: filepath.Join(dir, strconv.Itoa(port)),
			extra: []string{"--replicaof", "127.0.0.1", strconv.Itoa(master.Port)}}
		if err := os.MkdirAll(s.dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if last = s.Start(); last != nil {
			continue
		}
		t.Cleanup(s.Kill)
		deadline := time.Now().Add(startTimeout)
		for {
			info, err := s.Do("INFO", "replication")
			if err == nil && strings.Contains(info, "master_link_status:up") {
				return s
			}
			if time.Now().After(deadline) {
				t.Fatalf("replica on %s not linked to %s: %v %s", s.Addr, master.Addr, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	t.Fatalf("cannot start a replica: %v", last)
	return nil
}

// MasterAddr is the master's address as the sentinel reports it.
func (s *Sentinel) MasterAddr() (string, error) {
	reply, err := s.Do("SENTINEL", "get-master-addr-by-name", s.MasterName)
	if err != nil {
		return "", err
	}
	host, port, ok := strings.Cut(strings.TrimSpace(reply), "\n")
	if !ok {
		return "", fmt.Errorf("unexpected reply %q", reply)
	}
	return net.JoinHostPort(host, port), nil
}
