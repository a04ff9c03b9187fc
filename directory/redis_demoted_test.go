package directory_test

import (
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/tools/redistest"
)

// A failover that moves the master behind one address — a managed
// primary endpoint whose DNS name now resolves to the promoted replica, a
// Kubernetes Service that follows the master — leaves the node's open
// connection on the old master, now a replica: Redis keeps it open and
// refuses every write with READONLY. Before, the node stayed there: every
// heartbeat, registration and new placement answered 503 for as long as
// the process ran, leases lapsed, and readiness said ready all along. The
// node must drop that connection, reconnect through the address (to the
// new master) and go on with the placements the failover kept
// (R-SRV-3, R-LS-1).
func TestRedisDemotedMasterReconnects_RSRV3_RLS1(t *testing.T) {
	a := redistest.StartServer(t)
	b := redistest.StartReplica(t, a)
	fw := startForwarder(t, a.Addr)
	ctx := ctxT(t)
	n := openNode(t, "redis://"+fw.addr(), "demoted", 10*time.Second)
	now := warmRedis(t, n, time.Now())
	sid := register(t, n, "a", 10, now)
	r1, err := n.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: now})
	if err != nil {
		t.Fatal(err)
	}
	// Applied by B before the failover (WAIT through redis-cli counts no
	// writes of the store's connections, and answers at once).
	if err := redistest.WaitReplicated(a, b, 10*time.Second); err != nil {
		t.Fatalf("unexpected replication before the failover; got %v; want B at A's offset", err)
	}

	// The failover: B promoted, the address now leads to B, A demoted.
	if _, err := b.Do("REPLICAOF", "NO", "ONE"); err != nil {
		t.Fatal(err)
	}
	fw.retarget(b.Addr)
	if _, err := a.Do("REPLICAOF", "127.0.0.1", strconv.Itoa(b.Port)); err != nil {
		t.Fatal(err)
	}

	var last error
	d := waitFor(t, 5*time.Second, "a heartbeat to be acked after the failover", func() bool {
		_, last = n.Heartbeat(ctx, &directory.Beat{SessionID: sid, Sub: "sub", Headroom: 10}, now)
		if last != nil && !errors.Is(last, directory.ErrUnavailable) {
			t.Fatalf("unexpected heartbeat error during the failover; got %v; want ErrUnavailable", last)
		}
		if last != nil {
			time.Sleep(50 * time.Millisecond)
		}
		return last == nil
	})
	t.Logf("heartbeats acked again %v after the failover", d)
	if r, err := n.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: now}); err != nil || r.Owner.SessionID != sid || r.Epoch != r1.Epoch || r.Placed {
		t.Fatalf("unexpected resolution after the failover; got %+v, %v; want %+v", r, err, r1)
	}
	if _, err := n.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "y", Now: now}); err != nil {
		t.Fatalf("cannot place after the failover: %v", err)
	}
}

// forwarder relays TCP connections to a target it can change: new
// connections go to the new target, open ones stay where they are, as
// with a DNS name that changed.
type forwarder struct {
	ln     net.Listener
	target atomic.Value // string
	mu     sync.Mutex
	conns  []net.Conn
}

func startForwarder(t *testing.T, target string) *forwarder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &forwarder{ln: ln}
	f.target.Store(target)
	go f.serve()
	t.Cleanup(f.close)
	return f
}

func (f *forwarder) addr() string { return f.ln.Addr().String() }

func (f *forwarder) retarget(target string) { f.target.Store(target) }

func (f *forwarder) serve() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.DialTimeout("tcp", f.target.Load().(string), 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		f.mu.Lock()
		f.conns = append(f.conns, c, up)
		f.mu.Unlock()
		go pipeClose(c, up)
		go pipeClose(up, c)
	}
}

func pipeClose(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
}

func (f *forwarder) close() {
	f.ln.Close()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.conns {
		c.Close()
	}
}
