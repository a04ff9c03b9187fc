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
		body := fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 1\nsentinel down-after-milliseconds %s 2000\n", name, master.Port, name)
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
