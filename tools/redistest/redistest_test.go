package redistest

import (
	"strings"
	"testing"
	"time"
)

// A server started on a port another process's server holds fails to
// bind and exits, while a PING to the port is answered by the other
// server: Start must report that, not a server it does not run (test
// harness; R-SRV-3's Redis suites start every server through it).
func TestStartRefusesAnotherProcessAnswering_RSRV3(t *testing.T) {
	holder := StartServer(t)
	s := &Server{Port: holder.Port, Addr: holder.Addr, dir: t.TempDir()}
	err := s.Start()
	if err == nil {
		s.Kill()
		t.Fatalf("unexpected start on %s, held by another server; got nil; want an error", holder.Addr)
	}
	if !strings.Contains(err.Error(), holder.Addr) {
		t.Fatalf("unexpected error; got %v; want one naming %s", err, holder.Addr)
	}
	// The holder is untouched.
	if reply, err := holder.Do("PING"); err != nil || reply != "PONG" {
		t.Fatalf("unexpected reply of the holder; got %q, %v; want PONG", reply, err)
	}
}

// Ports lie below the kernel's ephemeral range, and a port reserved by
// one process is refused to any other (reserve's lock is per open file,
// so a second reservation in this process stands for another's).
func TestPortsReservedOutsideEphemeralRange_RSRV3(t *testing.T) {
	for _, cluster := range []bool{false, true} {
		lo, hi := portRange(cluster)
		port, err := freePortPair(cluster)
		if err != nil {
			t.Fatal(err)
		}
		if port < lo || port >= hi {
			t.Fatalf("unexpected port (cluster %v); got %d; want in [%d, %d)", cluster, port, lo, hi)
		}
		if reserve(port) {
			t.Fatalf("unexpected second reservation of %d; got true; want false (held)", port)
		}
		if cluster && reserve(port+10000) {
			t.Fatalf("unexpected second reservation of bus port %d; got true; want false (held)", port+10000)
		}
	}
}

// WaitReplicated waits for what the replica applied, where WAIT through
// Do answers 1 at once: with the replica stopped, a write on the master
// is not replicated, and WaitReplicated says so (test harness; the
// Sentinel failover test relies on it, R-SRV-3).
func TestWaitReplicatedNeedsTheReplicasOffset_RSRV3(t *testing.T) {
	master := StartServer(t)
	replica := StartReplica(t, master)
	if err := replica.Pause(); err != nil {
		t.Fatal(err)
	}
	if reply, err := master.Do("SET", "k", "v"); err != nil || reply != "OK" {
		t.Fatalf("unexpected reply to SET; got %q, %v; want OK", reply, err)
	}
	if reply, err := master.Do("WAIT", "1", "2000"); err != nil || reply != "1" {
		t.Logf("WAIT through redis-cli answered %q, %v (it answered 1 before: it counts its own connection's writes)", reply, err)
	}
	if err := WaitReplicated(master, replica, 300*time.Millisecond); err == nil {
		t.Fatal("unexpected replication to a stopped replica; got nil; want an error")
	}
	if err := replica.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := WaitReplicated(master, replica, 10*time.Second); err != nil {
		t.Fatalf("unexpected replication after the replica resumed; got %v; want nil", err)
	}
	if reply, err := replica.Do("GET", "k"); err != nil || reply != "v" {
		t.Fatalf("unexpected value on the replica; got %q, %v; want v", reply, err)
	}
}

// CommandCalls counts what the server ran since CONFIG RESETSTAT, by
// command, commands run inside a script included: the Redis
// figures of BENCHMARKS.md (commands per proxied request, R-SRV-3) and
// the registry's batch-release test read it.
func TestCommandCallsCountsSinceReset_RSRV3(t *testing.T) {
	s := StartServer(t)
	if _, err := s.Do("CONFIG", "RESETSTAT"); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := s.Do("SET", "k", "v"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Do("EVAL", "return redis.call('GET', KEYS[1])", "1", "k"); err != nil {
		t.Fatal(err)
	}
	calls, err := s.CommandCalls()
	if err != nil {
		t.Fatal(err)
	}
	for cmd, want := range map[string]int64{"set": 3, "eval": 1, "get": 1} {
		if calls[cmd] != want {
			t.Errorf("unexpected %s calls; got %d; want %d (all: %v)", cmd, calls[cmd], want, calls)
		}
	}
	if _, ok := calls["hset"]; ok {
		t.Errorf("unexpected hset in %v; want commands never run absent", calls)
	}
}

func TestStatField(t *testing.T) {
	for _, c := range []struct {
		stats string
		name  string
		want  int64
		ok    bool
	}{
		{"calls=12,usec=40,usec_per_call=3.33", "calls", 12, true},
		{"usec=40,calls=7", "calls", 7, true},
		{"usec=40", "calls", 0, false},
		{"calls=x", "calls", 0, false},
		{"rejected_calls=2,calls=5", "calls", 5, true},
	} {
		got, ok := statField(c.stats, c.name)
		if got != c.want || ok != c.ok {
			t.Errorf("statField(%q, %q): got %d, %v; want %d, %v", c.stats, c.name, got, ok, c.want, c.ok)
		}
	}
}
