package directory_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/directory/directorytest"
	"github.com/pinboard-go/pinboard/tools/redistest"
)

// viewNode is one node placing new ids with a directorytest.SinkPolicy.
type viewNode struct {
	t   *testing.T
	s   *directory.Redis
	now time.Time
	n   int
}

// seen places a new id through the node and returns what the policy was
// handed.
func (v *viewNode) seen(pick string) map[string]float64 {
	v.t.Helper()
	v.n++
	p := &directorytest.SinkPolicy{Sink: pick}
	if _, err := v.s.Place(context.Background(), &directory.PlaceRequest{NS: "/c", ID: fmt.Sprintf("v%d", v.n), Now: v.now, Policy: p}); err != nil {
		v.t.Fatalf("cannot place v%d: %v", v.n, err)
	}
	return p.Got
}

// waitSeen places new ids through the node until the policy is handed
// what cond wants, for at most 5 s: another node's write reaches this one
// as a push, a little after that write returns.
func (v *viewNode) waitSeen(pick, what string, cond func(map[string]float64) bool) {
	v.t.Helper()
	var got map[string]float64
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if got = v.seen(pick); cond(got) {
			return
		}
		time.Sleep(time.Millisecond)
	}
	v.t.Fatalf("unexpected candidates; got %v; want %s", got, what)
}

// viewFixture is two nodes on one directory: A places new ids, each on
// the session keep; w is the worker under test. Both registered through A.
type viewFixture struct {
	srv     *redistest.Server
	a, b    *directory.Redis
	v       *viewNode
	keep, w string
	now     time.Time
}

// newViewFixture opens the nodes; hook, when set, is A's SetAfterViewRead.
func newViewFixture(t *testing.T, prefix string, hook func(what string)) *viewFixture {
	t.Helper()
	fx := &viewFixture{srv: redistest.StartServer(t)}
	fx.a = openNode(t, fx.srv.URL(), prefix, 10*time.Second)
	fx.b = openNode(t, fx.srv.URL(), prefix, 10*time.Second)
	if hook != nil {
		directory.SetAfterViewRead(fx.a, hook)
	}
	fx.now = warmRedis(t, fx.a, time.Now())
	fx.keep = register(t, fx.a, "keep", 1e9, fx.now)
	fx.w = register(t, fx.a, "w", 10, fx.now)
	fx.v = &viewNode{t: t, s: fx.a, now: fx.now}
	return fx
}

func beatRedis(t *testing.T, s directory.Store, sid string, headroom float64, now time.Time) {
	t.Helper()
	if _, err := s.Heartbeat(context.Background(), &directory.Beat{SessionID: sid, Sub: "sub", Headroom: headroom}, now); err != nil {
		t.Fatalf("cannot heartbeat %s: %v", sid, err)
	}
}

// Changes made through another node reach this node's placement view as
// Redis pushes: a heartbeat's headroom, an operator drain and undrain, a
// registration and a deregistration (R-PL-3, R-PL-4, R-REG-6). Every new id
// goes to the session "keep", so the others' headroom moves only by the
// changes under test.
func TestRedisViewFollowsOtherNodes_RPL3_RPL4_RREG6(t *testing.T) {
	ctx := ctxT(t)
	fx := newViewFixture(t, "vfollow", nil)
	b, v, keep, w, now := fx.b, fx.v, fx.keep, fx.w, fx.now
	if got := v.seen(keep); !maps.Equal(got, map[string]float64{keep: 1e9, w: 10}) {
		t.Fatalf("unexpected first candidates; got %v", got)
	}

	beatRedis(t, b, w, 77, now)
	v.waitSeen(keep, "w at 77 after its heartbeat through B", func(got map[string]float64) bool { return got[w] == 77 })

	if found, err := b.SetDrain(ctx, "w", directory.DrainState{Draining: true}, now); err != nil || !found {
		t.Fatalf("cannot drain w through B: %v, %v", found, err)
	}
	v.waitSeen(keep, "no w once B drained it", func(got map[string]float64) bool { _, ok := got[w]; return !ok })
	if found, err := b.SetDrain(ctx, "w", directory.DrainState{}, now); err != nil || !found {
		t.Fatalf("cannot undrain w through B: %v, %v", found, err)
	}
	v.waitSeen(keep, "w back once B undrained it", func(got map[string]float64) bool { return got[w] == 77 })

	x := register(t, b, "x", 5, now)
	v.waitSeen(keep, "x once it registered through B", func(got map[string]float64) bool { return got[x] == 5 })
	if err := b.Deregister(ctx, x, now); err != nil {
		t.Fatal(err)
	}
	v.waitSeen(keep, "no x once it deregistered through B", func(got map[string]float64) bool { _, ok := got[x]; return !ok })
}

// A push handled between the read of a view entry and its store wins: the
// value read before it is used for that placement but not kept, so the
// next placement reads the entry again (redis_view.go). Kept, it would
// hand every later placement the value from before the change.
func TestRedisViewReadOvertakenByPush_RPL3(t *testing.T) {
	// during runs once, after the next read of what (the hook's argument).
	var during func()
	var what string
	fx := newViewFixture(t, "vrace", func(read string) {
		if fn := during; fn != nil && read == what {
			during = nil
			fn()
		}
	})
	a, b, v, keep, w, now := fx.a, fx.b, fx.v, fx.keep, fx.w, fx.now
	ctx := ctxT(t)
	nsVer := func() uint64 { n, _ := directory.ViewVersions(a, "/c", ""); return n }
	headVer := func() uint64 { _, h := directory.ViewVersions(a, "/c", w); return h }
	clientVer := func() uint64 { return directory.ViewClientVersion(a, "w") }
	// changed makes a change and waits until A counted its push.
	changed := func(label string, count func() uint64, change func()) {
		t.Helper()
		before := count()
		change()
		waitFor(t, 5*time.Second, "A to count the push for "+label, func() bool { return count() > before })
	}
	// overtaken places through A with change made (and its push counted)
	// between its read of read ("members" or "entries") and their store,
	// and returns what the policy was handed.
	overtaken := func(read, label string, count func() uint64, change func()) map[string]float64 {
		t.Helper()
		what, during = read, func() { changed(label, count, change) }
		got := v.seen(keep)
		if during != nil {
			t.Fatal("BUG: the hook did not run")
		}
		return got
	}

	// The member set: read by the first placement in /c, while a
	// registration through B overtakes it.
	var x string
	if got := overtaken("members", "the member set", nsVer, func() { x = register(t, b, "x", 5, now) }); len(got) != 2 {
		t.Fatalf("unexpected candidates of the placement the push overtook; got %v; want keep and w (the set as read)", got)
	}
	if got := v.seen(keep); got[x] != 5 {
		t.Fatalf("unexpected candidates after the push; got %v; want x at 5", got)
	}

	// One session's headroom: w's entry is stale (a heartbeat through A,
	// whose push follows its reply), read by the next placement, and a
	// heartbeat through B overtakes it.
	changed("A's own heartbeat", headVer, func() { beatRedis(t, a, w, 10, now) })
	if got := overtaken("entries", "w's headroom", headVer, func() { beatRedis(t, b, w, 77, now) }); got[w] != 10 {
		t.Fatalf("unexpected headroom of w in the placement the push overtook; got %v; want 10 (as read)", got)
	}
	if got := v.seen(keep); got[w] != 77 {
		t.Fatalf("unexpected headroom of w after the push; got %v; want 77", got)
	}

	// A client's operator drain: w's client entry is stale (drained
	// through A), read by the next placement, and an undrain through B
	// overtakes it.
	drain := func(s *directory.Redis, on bool) func() {
		return func() {
			if found, err := s.SetDrain(ctx, "w", directory.DrainState{Draining: on}, now); err != nil || !found {
				t.Fatalf("cannot set w's drain to %v: %v, %v", on, found, err)
			}
		}
	}
	changed("A's own drain", clientVer, drain(a, true))
	if got := overtaken("entries", "w's undrain", clientVer, drain(b, false)); got[w] != 0 {
		t.Fatalf("unexpected candidates in the placement the push overtook; got %v; want no w (drained, as read)", got)
	}
	if got := v.seen(keep); got[w] != 77 {
		t.Fatalf("unexpected candidates after the undrain; got %v; want w at 77", got)
	}
}

// A node that resolves ids others placed keeps the view entries it read
// with the row, though it ranks nothing: before, every resolve on a node
// with a stale view read them all again (from the client cache, or from
// Redis after a reconnect) and decoded them.
func TestRedisViewKeptByResolves_RPL1(t *testing.T) {
	ctx := ctxT(t)
	fx := newViewFixture(t, "vres", nil)
	a, b, now := fx.a, fx.b, fx.now
	sids := []string{fx.keep, fx.w}
	for i := range 20 {
		sids = append(sids, register(t, a, fmt.Sprintf("w%d", i), 10, now))
	}
	if _, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: now}); err != nil {
		t.Fatal(err)
	}
	if r, err := b.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: now}); err != nil || r.Placed {
		t.Fatalf("unexpected resolve through B; got %+v, %v; want the owner A placed", r, err)
	}
	for _, sid := range sids {
		if !directory.ViewCurrent(b, sid) {
			t.Fatalf("unexpected stale view entry of %s on B after its resolve; want it kept", sid)
		}
	}
}

// After Redis stopped tracking the node's keys without closing its
// connection (a FLUSHDB of another database frees the whole tracking
// table), changes made elsewhere are never pushed: the view is read again
// from scratch (at once in flushed, and again when the connection check
// finds the node untracked; either alone passes this test).
func TestRedisViewDroppedWhenUntracked_RPL3(t *testing.T) {
	fx := newViewFixture(t, "vflush", nil)
	srv, a, b, v, keep, w, now := fx.srv, fx.a, fx.b, fx.v, fx.keep, fx.w, fx.now
	if got := v.seen(keep); got[w] != 10 {
		t.Fatalf("unexpected first candidates; got %v", got)
	}
	flushes := a.Stats().Flushes
	if _, err := srv.Do("-n", "1", "FLUSHDB"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "A to handle the flush", func() bool { return a.Stats().Flushes > flushes })
	beatRedis(t, b, w, 77, now)
	x := register(t, b, "x", 5, now)
	if got := v.seen(keep); got[w] != 77 || got[x] != 5 {
		t.Fatalf("unexpected candidates after changes Redis did not push; got %v; want w at 77 and x at 5", got)
	}
}

// The view keeps nothing for namespaces nobody serves: a client naming
// endless unknown namespaces does not grow it, and a namespace whose
// workers all left is dropped at its next placement (R-PL-5). A client's
// entry ends with its last session; a session's lives in the session.
func TestRedisViewBounded_RPL5(t *testing.T) {
	srv := redistest.StartServer(t)
	ctx := ctxT(t)
	a := openNode(t, srv.URL(), "vbound", 10*time.Second)
	now := warmRedis(t, a, time.Now())
	var sids []string
	for i := range 5 {
		sids = append(sids, register(t, a, fmt.Sprintf("w%d", i), 10, now))
	}
	v := &viewNode{t: t, s: a, now: now}
	if got := v.seen(""); len(got) != 5 {
		t.Fatalf("unexpected candidates; got %v", got)
	}
	for i := range 100 {
		if _, err := a.Place(ctx, &directory.PlaceRequest{NS: fmt.Sprintf("/nobody%d", i), ID: "x", Now: now}); !errors.Is(err, directory.ErrUnknownNamespace) {
			t.Fatalf("unexpected placement in an unknown namespace; got %v; want %v", err, directory.ErrUnknownNamespace)
		}
	}
	if ns, clients := directory.ViewSizes(a); ns != 1 || clients != 5 {
		t.Fatalf("unexpected view size; got %d namespaces and %d clients; want 1 (/c) and 5", ns, clients)
	}
	for _, sid := range sids {
		if err := a.Deregister(ctx, sid, now); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 5*time.Second, "the ended sessions' clients to leave the view", func() bool {
		_, clients := directory.ViewSizes(a)
		return clients == 0
	})
	if _, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "y", Now: now}); !errors.Is(err, directory.ErrUnknownNamespace) {
		t.Fatalf("unexpected placement with no workers left; got %v; want %v", err, directory.ErrUnknownNamespace)
	}
	if ns, _ := directory.ViewSizes(a); ns != 0 {
		t.Fatalf("unexpected namespaces in the view once nobody serves /c; got %d; want 0", ns)
	}
}

// A member whose session another node deregistered between this node's
// read of the member set and its read of the member's heartbeat hash
// (gone with the session) is no candidate: before, the missing hash
// decoded as a live worker with headroom 0, and the policy could rank
// a worker that no longer exists (R-PL-1, R-PL-3).
func TestRedisViewGoneSessionNoCandidate_RPL1_RPL3(t *testing.T) {
	var during func()
	fx := newViewFixture(t, "vgone", func(read string) {
		if fn := during; fn != nil && read == "members" {
			during = nil
			fn()
		}
	})
	ctx := ctxT(t)
	during = func() {
		if err := fx.b.Deregister(ctx, fx.w, fx.now); err != nil {
			t.Fatal(err)
		}
	}
	got := fx.v.seen(fx.keep)
	if during != nil {
		t.Fatal("BUG: the hook did not run")
	}
	if _, ok := got[fx.w]; ok || got[fx.keep] != 1e9 {
		t.Fatalf("unexpected candidates; got %v; want keep alone (w deregistered after the member set was read)", got)
	}
}

// The claim script's own ExcludeEpoch check: another node places the id
// again on the refuser after this node read the row and before its claim
// (the node's own read is past by then). The newer live row is returned,
// not replaced: replaced, the id ran on two workers (R-PL-1, R-PL-6).
func TestRedisClaimScriptKeepsNewerLiveRow_RPL1_RPL6(t *testing.T) {
	var during func()
	fx := newViewFixture(t, "vxep", func(read string) {
		if fn := during; fn != nil && read == "entries" {
			during = nil
			fn()
		}
	})
	ctx := ctxT(t)
	r1, err := fx.b.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: fx.now, Policy: &directorytest.SinkPolicy{Sink: fx.keep}})
	if err != nil || r1.Owner.SessionID != fx.keep {
		t.Fatalf("unexpected first placement; got %+v, %v; want keep", r1, err)
	}
	if ok, err := fx.b.Release(ctx, &directory.ReleaseRequest{SessionID: fx.keep, NS: "/c", ID: "x", Epoch: r1.Epoch}, fx.now); !ok || err != nil {
		t.Fatalf("cannot release: %v, %v", ok, err)
	}
	var r2 directory.Route
	during = func() {
		var err error
		r2, err = fx.b.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: fx.now, Policy: &directorytest.SinkPolicy{Sink: fx.keep}})
		if err != nil || r2.Owner.SessionID != fx.keep {
			t.Errorf("unexpected placement through B; got %+v, %v; want keep", r2, err)
		}
	}
	got, err := fx.a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: fx.now, Exclude: fx.keep, ExcludeEpoch: r1.Epoch,
		Policy: &directorytest.SinkPolicy{Sink: fx.w}})
	if during != nil {
		t.Fatal("BUG: the hook did not run")
	}
	if err != nil || got.Placed || got.Owner.SessionID != fx.keep || got.Epoch != r2.Epoch {
		t.Fatalf("unexpected placement excluding keep's refused epoch; got %+v, %v; want keep's live row at %d returned", got, err, r2.Epoch)
	}
}

// The session a claim names can end before this node reads it, and the
// request is not answered 503 "directory unavailable" for it: Redis
// answers, and the id is placed again, on a live session (R-PL-1). Here
// another node placed the id on a session this node never read (its
// worker just registered there) while this node ranked its candidates,
// so the claim resolves to that owner; the worker deregisters before this
// node reads its session.
func TestRedisPlaceOwnerEndedAfterClaim_RPL1(t *testing.T) {
	ctx := ctxT(t)
	srv := redistest.StartServer(t)
	a := openNode(t, srv.URL(), "ownergone", 10*time.Second)
	b := openNode(t, srv.URL(), "ownergone", 10*time.Second)
	now := warmRedis(t, a, time.Now())
	one := register(t, a, "one", 10, now)
	three := ""
	directory.SetAfterViewRead(a, func(what string) {
		// "entries": after A read x's row (none yet), before its claim.
		if what != "entries" || three != "" {
			return
		}
		three = register(t, b, "three", 10, now)
		if rt, err := b.Place(context.Background(), &directory.PlaceRequest{NS: "/c", ID: "x", Now: now, Exclude: one}); err != nil || rt.Owner.SessionID != three {
			t.Errorf("cannot place x on three through B; got %+v, %v", rt, err)
		}
	})
	ended := false
	directory.SetAfterClaim(a, func(sid string) {
		if sid == three && !ended {
			ended = true
			if err := b.Deregister(context.Background(), sid, now); err != nil {
				t.Errorf("cannot deregister three through B: %v", err)
			}
		}
	})
	rt, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: now})
	if !ended {
		t.Fatalf("BUG: the claim did not name three (%v, %v)", rt, err)
	}
	if err != nil {
		t.Fatalf("unexpected placement error after the claimed owner ended; got %v; want x placed on one", err)
	}
	if rt.Owner.SessionID != one || !rt.Placed {
		t.Fatalf("unexpected route; got session %s placed=%v; want %s placed", rt.Owner.SessionID, rt.Placed, one)
	}
	if got, ok := a.Lookup([]byte("/c"), []byte("x"), now); !ok || got.Owner.SessionID != one || got.Epoch != rt.Epoch {
		t.Fatalf("unexpected lookup after the placement; got %+v, %v; want one at epoch %d", got, ok, rt.Epoch)
	}
}
