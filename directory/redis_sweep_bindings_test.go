package directory_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/tools/redistest"
)

// The sweep frees hostname bindings no live session holds (R-LS-4). It
// checked each binding against every session of its namespace: quadratic
// in the hostname-bound workers sharing a namespace, in one script that
// every node runs every second. 300 such workers held Redis about 0.4 s
// per sweep, and 1,000 longer than the connection's staleness budget, so
// every sweep failed and took every node's connection down with it. The
// sessions of a namespace are now read once per sweep: the commands one
// sweep runs grow with the workers, not their square. Counted with
// Redis's own total (commands inside scripts included), which timing on a
// shared machine could not show reliably.
func TestRedisSweepBindingsLinear_RLS4(t *testing.T) {
	srv := redistest.StartServer(t)
	ctx := ctxT(t)
	s := openNode(t, srv.URL(), "bindsweep", time.Hour)
	now := time.Now()
	const n = 200
	var first string
	for i := range n {
		res, err := s.Register(ctx, &directory.Registration{ClientID: "c" + strconv.Itoa(i), Sub: "sub", Secret: "k",
			Namespaces: []string{"/c"}, AdvertiseURL: "http://127.0.0.1:9/" + strconv.Itoa(i), Headroom: 1,
			Hostname: "Host" + strconv.Itoa(i), Env: "e", Epoch: 1}, now)
		if err != nil {
			t.Fatalf("cannot register worker %d: %v", i, err)
		}
		if i == 0 {
			first = res.SessionID
		}
	}
	// One binding loses its holder: the sweep frees it, and only it.
	if err := s.Deregister(ctx, first, now); err != nil {
		t.Fatal(err)
	}
	before := totalCommands(t, srv)
	if err := s.Sweep(context.Background(), now); err != nil {
		t.Fatal(err)
	}
	if d := totalCommands(t, srv) - before; d > 20*n {
		t.Fatalf("unexpected commands for one sweep of %d bound workers; got %d; want at most %d (linear)", n, d, 20*n)
	}
	c := rawClient(t, srv.Addr)
	if left, err := c.Do(ctx, c.B().Scard().Key("{bindsweep}:bindings").Build()).AsInt64(); err != nil || left != n-1 {
		t.Fatalf("unexpected bindings after the sweep; got %d, %v; want %d (the deregistered worker's freed)", left, err, n-1)
	}
	if ex, err := c.Do(ctx, c.B().Exists().Key("{bindsweep}:b:host0\x00/c").Build()).AsInt64(); err != nil || ex != 0 {
		t.Fatalf("unexpected binding of the deregistered worker; got exists=%d, %v; want it freed", ex, err)
	}
}
