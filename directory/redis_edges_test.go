package directory_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/tools/redistest"
)

// Release then Place on the same node re-places the id, as on the memory
// store: the release's own invalidation is handled before Release returns,
// so the next read through the client cache cannot return the released row
// (R-PL-2, R-PL-6: a refused id is released and placed again).
func TestRedisReleaseThenPlaceSameNode_RPL2(t *testing.T) {
	srv := redistest.StartServer(t)
	ctx := ctxT(t)
	a := openNode(t, srv.URL(), "rel", 10*time.Second)
	b := openNode(t, srv.URL(), "rel", 10*time.Second)
	now := warmRedis(t, a, time.Now())
	wa := register(t, a, "a", 1e6, now)
	const rounds = 1000
	for i := range rounds {
		id := "r" + strconv.Itoa(i)
		r1, err := b.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: id, Now: now})
		if err != nil || r1.Owner.SessionID != wa {
			t.Fatalf("cannot place through B: %+v %v", r1, err)
		}
		// A resolves B's placement: the row is now in A's client cache.
		if r, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: id, Now: now}); err != nil || r.Epoch != r1.Epoch {
			t.Fatalf("cannot resolve through A: %+v %v", r, err)
		}
		if ok, err := a.Release(ctx, &directory.ReleaseRequest{SessionID: wa, NS: "/c", ID: id, Epoch: r1.Epoch}, now); err != nil || !ok {
			t.Fatalf("cannot release: %v %v", ok, err)
		}
		r2, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: id, Now: now})
		if err != nil {
			t.Fatal(err)
		}
		if !r2.Placed || r2.Epoch <= r1.Epoch {
			t.Fatalf("unexpected placement after a release (round %d); got %+v; want a new placement above epoch %d", i, r2, r1.Epoch)
		}
	}
}

// A restart that restores an older snapshot keeps the era key, so it is
// not seen as a wipe (docs/DIRECTORY.md, limits) — but placement epochs
// never go back: workers fence on them.
func TestRedisSnapshotRestoreKeepsEpochsRising_RPL1(t *testing.T) {
	srv := redistest.StartServer(t)
	ctx := ctxT(t)
	a := openNode(t, srv.URL(), "roll", 30*time.Second)
	now := warmRedis(t, a, time.Now())
	register(t, a, "a", 1e6, now)
	if _, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: now}); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Do("SAVE"); err != nil {
		t.Fatal(err)
	}
	r1, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "y", Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Restart(); err != nil { // SIGKILL, then dump.rdb loads
		t.Fatal(err)
	}
	later := now.Add(time.Millisecond)
	var r2 directory.Route
	waitFor(t, 10*time.Second, "the node to place again", func() bool {
		r2, err = a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "y", Now: later})
		return err == nil
	})
	if r2.Epoch <= r1.Epoch {
		t.Fatalf("unexpected epoch after a snapshot restore; got %d after %d", r2.Epoch, r1.Epoch)
	}
}

// After Redis comes back from an outage, a node drops the rows it cached
// on the lost connection promptly (revalidateRetryMax), so a re-placement
// made through another node meanwhile is seen well within the staleness
// budget (docs/DIRECTORY.md).
func TestRedisOutageRecoveryDropsStaleRows_RPL1(t *testing.T) {
	srv := redistest.StartServer(t)
	ctx := ctxT(t)
	a := openNode(t, srv.URL(), "rec", 30*time.Second)
	b := openNode(t, srv.URL(), "rec", 30*time.Second)
	now := warmRedis(t, a, time.Now())
	wa := register(t, a, "a", 1e6, now)
	wb := register(t, a, "b", 1, now)
	if r, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: now}); err != nil || r.Owner.SessionID != wa {
		t.Fatalf("unexpected placement; got %+v %v", r, err)
	}
	if err := srv.StopSaving(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2500 * time.Millisecond) // long enough for the old backoff to reach its cap
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	var r2 directory.Route
	waitFor(t, 5*time.Second, "B to re-place x", func() bool {
		var err error
		r2, err = b.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: now, Exclude: wa})
		return err == nil
	})
	if r2.Owner.SessionID != wb {
		t.Fatalf("unexpected re-placement; got %+v", r2)
	}
	d := waitFor(t, 3*time.Second, "A to stop routing x to the replaced owner", func() bool {
		r, ok := a.Lookup([]byte("/c"), []byte("x"), now)
		return !ok || r.Owner.SessionID != wa
	})
	if d > 300*time.Millisecond {
		t.Fatalf("unexpected stale route on A for %v after Redis returned and B re-placed x", d)
	}
}

// The sweep frees hostname bindings no live session holds (R-LS-4): a
// binding key outlives its holder only until the next sweep, and one a
// live session holds stays.
func TestRedisSweepFreesUnheldBindings_RLS4(t *testing.T) {
	srv := redistest.StartServer(t)
	ctx := ctxT(t)
	a := openNode(t, srv.URL(), "bind", 10*time.Second)
	now := warmRedis(t, a, time.Now())
	reg := func(client, host string) string {
		res, err := a.Register(ctx, &directory.Registration{ClientID: client, Sub: "sub", Secret: "k", Namespaces: []string{"/c"},
			AdvertiseURL: "http://127.0.0.1:9/" + client, Headroom: 1, Hostname: host, Env: "blue", Epoch: 1}, now)
		if err != nil {
			t.Fatal(err)
		}
		return res.SessionID
	}
	gone := reg("a", "Gone.Example")
	reg("b", "kept.example")
	bindings := func() string {
		out, err := srv.Do("--raw", "KEYS", "{bind}:b:*")
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	if got := bindings(); !strings.Contains(got, "gone.example") || !strings.Contains(got, "kept.example") {
		t.Fatalf("unexpected bindings before the sweep; got %q", got)
	}
	if err := a.Void(ctx, gone, now); err != nil {
		t.Fatal(err)
	}
	if err := a.Sweep(ctx, now); err != nil {
		t.Fatal(err)
	}
	if got := bindings(); strings.Contains(got, "gone.example") || !strings.Contains(got, "kept.example") {
		t.Fatalf("unexpected bindings after the sweep; got %q; want only kept.example's", got)
	}
}

// A Redis that lost its script cache (a restart with persistence, a
// failover to a replica that never ran the scripts, SCRIPT FLUSH) answers
// EVALSHA with NOSCRIPT; every kind of script call then runs the script
// with EVAL and succeeds (R-PL-1, R-REG-2, R-REG-3).
func TestRedisScriptCacheLost_RPL1_RREG2_RREG3(t *testing.T) {
	srv := redistest.StartServer(t)
	ctx := ctxT(t)
	a := openNode(t, srv.URL(), "nos", 10*time.Second)
	now := warmRedis(t, a, time.Now())
	wa := register(t, a, "a", 100, now)
	flush := func() {
		t.Helper()
		if _, err := srv.Do("SCRIPT", "FLUSH"); err != nil {
			t.Fatal(err)
		}
	}
	flush() // place: a tracked pipeline (execTracked)
	r, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: now})
	if err != nil || !r.Placed || r.Owner.SessionID != wa {
		t.Fatalf("cannot place after SCRIPT FLUSH: %+v %v", r, err)
	}
	flush() // heartbeat: rueidis.Lua
	if _, err := a.Heartbeat(ctx, &directory.Beat{SessionID: wa, Sub: "sub", Headroom: 10}, now); err != nil {
		t.Fatalf("cannot heartbeat after SCRIPT FLUSH: %v", err)
	}
	flush() // release: a write with a trailing read (runWrite)
	if ok, err := a.Release(ctx, &directory.ReleaseRequest{SessionID: wa, NS: "/c", ID: "x", Epoch: r.Epoch}, now); err != nil || !ok {
		t.Fatalf("cannot release after SCRIPT FLUSH: %v %v", ok, err)
	}
	if p, err := a.Placement(ctx, "/c", "x", now); !errors.Is(err, directory.ErrNoPlacement) {
		t.Fatalf("placement still there after the release: %+v %v", p, err)
	}
	flush() // sweep: runWrite as well
	if err := a.Sweep(ctx, now.Add(time.Minute)); err != nil {
		t.Fatalf("cannot sweep after SCRIPT FLUSH: %v", err)
	}
	if _, err := a.Heartbeat(ctx, &directory.Beat{SessionID: wa, Sub: "sub", Headroom: 10}, now.Add(time.Minute)); !errors.Is(err, directory.ErrUnknownSession) {
		t.Fatalf("session survived a sweep one minute past its lease: %v", err)
	}
}
