package redistest

import (
	"strings"
	"testing"
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
