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
	srv := startVariant(t, "a sentinel", func(_ int, dir string) (*Server, error) {
		// Sentinel rewrites its configuration file: it must be its own.
		conf := filepath.Join(dir, "sentinel.conf")
		body := fmt.Sprintf("sentinel monitor %[1]s 127.0.0.1 %[2]d 1\n"+
			"sentinel down-after-milliseconds %[1]s 1000\nsentinel failover-timeout %[1]s 10000\n", name, master.Port)
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			return nil, err
		}
		return &Server{conf: conf, extra: []string{"--sentinel"}}, nil
	})
	s := &Sentinel{Server: srv, MasterName: name}
	want := net.JoinHostPort("127.0.0.1", strconv.Itoa(master.Port))
	deadline := time.Now().Add(startTimeout)
	for {
		addr, err := s.MasterAddr()
		if err == nil && addr == want {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("sentinel on %s does not report master %s at %s: %q %v", s.Addr, name, want, addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// URL is redis+sentinel://127.0.0.1:Port/MasterName.
func (s *Sentinel) URL() string { return "redis+sentinel://" + s.Addr + "/" + s.MasterName }

// StartReplica starts a server replicating master and waits until the
// link is up; t.Cleanup kills it. The master sends its first full copy at
// once: by default (repl-diskless-sync-delay 5) it waits 5 s for more
// replicas first, half of startTimeout gone before the copy even starts.
func StartReplica(t testing.TB, master *Server) *Server {
	t.Helper()
	if _, err := master.Do("CONFIG", "SET", "repl-diskless-sync-delay", "0"); err != nil {
		t.Fatalf("cannot configure master %s for a replica: %v", master.Addr, err)
	}
	s := startVariant(t, "a replica", func(int, string) (*Server, error) {
		return &Server{extra: []string{"--replicaof", "127.0.0.1", strconv.Itoa(master.Port)}}, nil
	})
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

// WaitReplicated waits until replica has applied everything master had
// written when it was called: master's replication offset then, against
// the offset replica has processed. WAIT through Do would not do: it
// counts only the writes of its own connection — none — and answers at
// once whatever the replica has.
func WaitReplicated(master, replica *Server, timeout time.Duration) error {
	want, err := replOffset(master, "master_repl_offset")
	if err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for {
		got, err := replOffset(replica, "slave_repl_offset")
		if err == nil && got >= want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("replica %s at offset %d, %v, after %v; master %s was at %d", replica.Addr, got, err, timeout, master.Addr, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// replOffset reads field (an offset) from s's INFO replication.
func replOffset(s *Server, field string) (int64, error) {
	info, err := s.Info("replication")
	if err != nil {
		return 0, err
	}
	v, ok := info[field]
	if !ok {
		return 0, fmt.Errorf("no %s in INFO replication of %s", field, s.Addr)
	}
	return strconv.ParseInt(v, 10, 64)
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
