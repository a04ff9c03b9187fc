package directory_test

import (
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
)

// What a node knows of a session for the registry's check before a
// heartbeat's probe (directory.KnownSessions, R-REG-2): nothing until it
// read the session, then its identity and the lease its reads and
// heartbeats returned; nothing once that lease passed, once the node ended
// the session, or once the directory was wiped (R-LS-2, R-CS-1).
func TestRedisKnownSessions_RREG2_RLS2(t *testing.T) {
	const ttl = 30 * time.Second
	srv, nodes, _, now := startDirectory(t, "known", ttl, 2)
	ctx, a, b := ctxT(t), nodes[0], nodes[1]
	sid := register(t, a, "w1", 10, now)
	if _, ok := a.KnownSession(sid, now); ok {
		t.Fatalf("unexpected known session before any read")
	}
	read, err := a.Session(ctx, sid, now)
	if err != nil {
		t.Fatal(err)
	}
	got, ok := a.KnownSession(sid, now)
	if !ok || got.SessionID != sid || got.ClientID != "w1" || got.Sub != "sub" || got.Secret != "k-w1" ||
		got.AdvertiseURL != read.AdvertiseURL || len(got.Namespaces) != 1 || got.Namespaces[0] != "/c" || !got.LeaseUntil.Equal(now.Add(ttl)) {
		t.Fatalf("unexpected known session; got %+v, %v; want the identity read and lease %v", got, ok, now.Add(ttl))
	}
	got.Namespaces[0] = "/changed" // the caller's copy
	if again, _ := a.KnownSession(sid, now); again.Namespaces[0] != "/c" {
		t.Fatalf("unexpected known session shared with a caller; got namespaces %v", again.Namespaces)
	}

	// A heartbeat's answer moves the known lease and the degraded hint.
	later := now.Add(ttl - time.Second)
	if _, err := a.Heartbeat(ctx, &directory.Beat{SessionID: sid, Sub: "sub", Headroom: 1, Degraded: true}, later); err != nil {
		t.Fatal(err)
	}
	if got, ok := a.KnownSession(sid, now.Add(ttl)); !ok || !got.LeaseUntil.Equal(later.Add(ttl)) || !got.Degraded {
		t.Fatalf("unexpected known session after a heartbeat; got %+v, %v; want lease %v, degraded", got, ok, later.Add(ttl))
	}
	if _, ok := a.KnownSession(sid, later.Add(ttl)); ok {
		t.Fatalf("unexpected known session at the end of its lease")
	}
	if _, ok := b.KnownSession(sid, later); ok {
		t.Fatalf("unexpected known session on a node that never read it")
	}

	// Ended through this node: forgotten at once.
	if _, err := a.Session(ctx, sid, later); err != nil {
		t.Fatal(err)
	}
	if err := a.Deregister(ctx, sid, later); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.KnownSession(sid, later); ok {
		t.Fatalf("unexpected known session after the node deregistered it")
	}

	// The sweep prunes sessions whose known lease passed (at most once a
	// lease): a session that stopped heartbeating through this node.
	s2 := register(t, a, "w2", 10, later)
	if _, err := a.Session(ctx, s2, later); err != nil {
		t.Fatal(err)
	}
	if err := a.Sweep(ctx, later.Add(2*ttl)); err != nil {
		t.Fatal(err)
	}
	if n := a.KnownSessionCount(); n != 0 {
		t.Fatalf("unexpected known sessions left by the sweep; got %d; want 0", n)
	}

	// A wipe forgets every session.
	s3 := register(t, a, "w3", 10, later)
	if _, err := a.Session(ctx, s3, later); err != nil {
		t.Fatal(err)
	}
	wipes := a.Stats().Wipes
	if _, err := srv.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "node A to find the wipe", func() bool {
		_ = a.Revalidate(ctx)
		return a.Stats().Wipes > wipes
	})
	if _, ok := a.KnownSession(s3, later); ok {
		t.Fatalf("unexpected known session after a wipe")
	}
}
