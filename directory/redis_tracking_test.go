package directory_test

import (
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/tools/redistest"
)

// A FLUSHDB of another database on the same Redis (another application
// sharing the server) sends every tracking client a nil invalidation and
// frees the server's whole tracking table, the directory's keys included,
// while the connection and the directory's data stay. The node found the
// same era on the same connection and kept its rows, which Redis no longer
// tracked: a re-placement through another node was never pushed, and the
// node kept routing the id to the old owner while that owner lived.
func TestRedisForeignFlushDropsUntrackedRows_RPL1(t *testing.T) {
	srv := redistest.StartServer(t)
	ctx := ctxT(t)
	a := openNode(t, srv.URL(), "fdb", 10*time.Second)
	b := openNode(t, srv.URL(), "fdb", 10*time.Second)
	now, wa, wb := warmPair(t, a, b)
	r1, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: now})
	if err != nil || r1.Owner.SessionID != wa {
		t.Fatalf("unexpected placement through A; got %+v, %v; want owner %s", r1, err, wa)
	}
	flushes := a.Stats().Flushes
	if _, err := srv.Do("-n", "1", "FLUSHDB"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "A to handle the flush", func() bool { return a.Stats().Flushes > flushes })
	if err := a.Revalidate(ctx); err != nil {
		t.Fatal(err)
	}
	r2, err := b.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: now, Exclude: wa})
	if err != nil || r2.Owner.SessionID != wb || !r2.Placed {
		t.Fatalf("unexpected re-placement through B; got %+v, %v; want a new placement on %s", r2, err, wb)
	}
	// Bounded at 5 s: half the lease, and below the 10 s periodic check.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if r, ok := a.Lookup([]byte("/c"), []byte("x"), now); !ok || r.Owner.SessionID != wa {
			return
		}
		time.Sleep(time.Millisecond)
	}
	r, ok := a.Lookup([]byte("/c"), []byte("x"), now)
	t.Fatalf("unexpected lookup on A after the re-placement through B; got %+v, %v; want not %s", r, ok, wa)
}
