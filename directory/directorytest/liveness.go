package directorytest

import (
	"errors"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
)

// Contract cases about placement liveness, control messages, degraded
// sessions, releases and reclaims (run by Run with the rest).

// Placement answers for dead owners too, with Live false, until the sweep
// removes the row (R-LS-2: dead-owner rows re-place on the next request).
func testPlacementLiveness(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	a := fx.register("a", []string{"/c"}, 10)
	r := fx.place("/c", "x")
	p, err := fx.s.Placement(fx.ctx, "/c", "x", fx.now)
	if err != nil || p.SessionID != a || p.ClientID != "a" || p.Epoch != r.Epoch || !p.Live || p.Advertise != "http://127.0.0.1:9/a" {
		t.Fatalf("unexpected placement; got %+v, %v; want live on %s at epoch %d", p, err, a, r.Epoch)
	}
	fx.advance(TTL)
	p, err = fx.s.Placement(fx.ctx, "/c", "x", fx.now)
	if err != nil || p.SessionID != a || p.Live {
		t.Fatalf("unexpected placement after the lease; got %+v, %v; want the dead owner, not live", p, err)
	}
	if _, err := fx.s.Placement(fx.ctx, "/c", "nothing", fx.now); !errors.Is(err, directory.ErrNoPlacement) {
		t.Fatalf("unexpected placement of an unplaced id; got %v; want ErrNoPlacement", err)
	}
}

// Control messages go to live owners only.
func testWindDownDeadOwner(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	fx.register("a", []string{"/c"}, 10)
	fx.place("/c", "x")
	fx.advance(TTL)
	if _, _, err := fx.s.WindDown(fx.ctx, "/c", "x", "", nil, fx.now); !errors.Is(err, directory.ErrNoPlacement) {
		t.Fatalf("unexpected wind-down of a dead owner's id; got %v; want ErrNoPlacement", err)
	}
}

// degradedSince is the first failed probe of a run; a passing probe
// clears it.
func testDegradedSince(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	a := fx.register("a", []string{"/c"}, 10)
	first := fx.now
	fx.beat(a, 10, false, true)
	fx.advance(100 * time.Millisecond)
	fx.beat(a, 10, false, true)
	info, err := fx.s.Session(fx.ctx, a, fx.now)
	if err != nil || !info.Degraded || !info.DegradedSince.Equal(first) {
		t.Fatalf("unexpected session; got %+v, %v; want degraded since %v", info, err, first)
	}
	fx.beat(a, 10, false, false)
	info, _ = fx.s.Session(fx.ctx, a, fx.now)
	if info.Degraded || !info.DegradedSince.IsZero() {
		t.Fatalf("unexpected session after a passing probe; got %+v; want not degraded", info)
	}
}

// A release carrying the epoch of an older placement frees nothing: the id
// moved on (the worker fences the same way).
func testStaleRelease(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	a := fx.register("a", []string{"/c"}, 1000)
	r1 := fx.place("/c", "x")
	if r1.Owner.SessionID != a {
		t.Fatalf("unexpected owner %s", r1.Owner.SessionID)
	}
	b := fx.register("b", []string{"/c"}, 1)
	r2, err := fx.s.Place(fx.ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: fx.now, Exclude: a})
	if err != nil || r2.Owner.SessionID != b {
		t.Fatalf("unexpected re-placement; got %+v, %v", r2, err)
	}
	for _, rr := range []*directory.ReleaseRequest{
		{SessionID: a, NS: "/c", ID: "x", Epoch: r1.Epoch},
		{SessionID: a, NS: "/c", ID: "x"},
		{SessionID: b, NS: "/c", ID: "x", Epoch: r1.Epoch},
	} {
		if ok, err := fx.s.Release(fx.ctx, rr, fx.now); ok || err != nil {
			t.Fatalf("unexpected release %+v; got %v, %v; want nothing freed", rr, ok, err)
		}
	}
	if r, ok := fx.lookup("/c", "x"); !ok || r.Owner.SessionID != b || r.Epoch != r2.Epoch {
		t.Fatalf("unexpected lookup; got %+v, %v; want %s at epoch %d", r, ok, b, r2.Epoch)
	}
}

// After a cold start, ids a re-registering worker reclaims keep routing to
// it: an existing live owner is not a new placement, so the quarantine
// does not hold it back (R-CS-1), and no stamp is set by resolving it.
func testReclaimDuringQuarantine(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	res, err := fx.s.Register(fx.ctx, &directory.Registration{
		ClientID: "a", Sub: "test:worker", Secret: "s", Namespaces: []string{"/c"},
		AdvertiseURL: "http://127.0.0.1:9/a", Headroom: 10, Instances: map[string][]string{"/c": {"x"}},
	}, fx.now)
	if err != nil || len(res.Duplicates) != 0 {
		t.Fatalf("cannot register: %+v, %v", res, err)
	}
	r, err := fx.s.Place(fx.ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: fx.now})
	if err != nil || r.Owner.SessionID != res.SessionID || r.Placed {
		t.Fatalf("unexpected resolution of a reclaimed id; got %+v, %v; want the reclaiming owner", r, err)
	}
	if q, err := fx.s.Quarantine(fx.ctx, fx.now); err != nil || q != 0 {
		t.Fatalf("unexpected quarantine after resolving an existing owner; got %v, %v; want 0", q, err)
	}
	_, err = fx.s.Place(fx.ctx, &directory.PlaceRequest{NS: "/c", ID: "y", Now: fx.now})
	var qe *directory.QuarantineError
	if !errors.As(err, &qe) {
		t.Fatalf("unexpected new placement on a cold store; got %v; want a quarantine", err)
	}
}

// testLeaseEndsEverywhere: a lease ends at the same instant for every
// operation (R-LS-1, R-LS-2). One microsecond before it the session is live
// to all of them — the cached lookup, a placement, the session read, the
// placement report, the workers listing, a wind-down, the expired count —
// and at it dead to all: the lookup misses, the placement report says not
// live, a wind-down finds no placement, the session read and its heartbeat
// say unknown, the listing leaves it out, it counts as expired, and the id
// re-places. The Redis store decides some of these in Go from the lease it
// knows and others in its scripts from the lease it holds, in microseconds:
// a comparison off by one there (< for <=) would route to a worker another
// operation holds dead, or place an id twice at the boundary.
func testLeaseEndsEverywhere(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	a := fx.register("a", []string{"/c"}, 10)
	x := fx.place("/c", "x")
	end := fx.now.Add(TTL)
	fx.now = end.Add(-time.Microsecond)
	if r, ok := fx.lookup("/c", "x"); !ok || r.Owner.SessionID != a {
		t.Fatalf("unexpected lookup a microsecond before the lease ends; got %+v, %v; want %s", r, ok, a)
	}
	if r := fx.place("/c", "x"); r.Owner.SessionID != a || r.Placed || r.Epoch != x.Epoch {
		t.Fatalf("unexpected placement a microsecond before the lease ends; got %+v; want the existing one", r)
	}
	if _, err := fx.s.Session(fx.ctx, a, fx.now); err != nil {
		t.Fatalf("unexpected session read a microsecond before the lease ends; got %v", err)
	}
	if p, err := fx.s.Placement(fx.ctx, "/c", "x", fx.now); err != nil || !p.Live {
		t.Fatalf("unexpected placement report a microsecond before the lease ends; got %+v, %v; want live", p, err)
	}
	if ws, err := fx.s.Workers(fx.ctx, fx.now); err != nil || len(ws) != 1 {
		t.Fatalf("unexpected workers a microsecond before the lease ends; got %d, %v; want 1", len(ws), err)
	}
	if n, err := fx.s.(directory.ExpiredCounter).Expired(fx.ctx, fx.now); err != nil || n != 0 {
		t.Fatalf("unexpected expired count a microsecond before the lease ends; got %d, %v; want 0", n, err)
	}
	if _, owner, err := fx.s.WindDown(fx.ctx, "/c", "x", "", nil, fx.now); err != nil || owner != a {
		t.Fatalf("unexpected wind-down a microsecond before the lease ends; got %s, %v; want queued for %s", owner, err, a)
	}

	fx.now = end
	if r, ok := fx.lookup("/c", "x"); ok {
		t.Fatalf("unexpected lookup hit when the lease ends; got %+v", r)
	}
	if p, err := fx.s.Placement(fx.ctx, "/c", "x", fx.now); err != nil || p.Live || p.SessionID != a {
		t.Fatalf("unexpected placement report when the lease ends; got %+v, %v; want %s, not live", p, err, a)
	}
	if _, _, err := fx.s.WindDown(fx.ctx, "/c", "x", "", nil, fx.now); !errors.Is(err, directory.ErrNoPlacement) {
		t.Fatalf("unexpected wind-down when the lease ends; got %v; want ErrNoPlacement", err)
	}
	if ws, err := fx.s.Workers(fx.ctx, fx.now); err != nil || len(ws) != 0 {
		t.Fatalf("unexpected workers when the lease ends; got %d, %v; want none", len(ws), err)
	}
	if n, err := fx.s.(directory.ExpiredCounter).Expired(fx.ctx, fx.now); err != nil || n != 1 {
		t.Fatalf("unexpected expired count when the lease ends; got %d, %v; want 1", n, err)
	}
	if _, err := fx.s.Session(fx.ctx, a, fx.now); !errors.Is(err, directory.ErrUnknownSession) {
		t.Fatalf("unexpected session read when the lease ends; got %v; want ErrUnknownSession", err)
	}
	if _, err := fx.s.Heartbeat(fx.ctx, &directory.Beat{SessionID: a, Sub: "test:worker", Headroom: 10}, fx.now); !errors.Is(err, directory.ErrUnknownSession) {
		t.Fatalf("unexpected heartbeat when the lease ends; got %v; want ErrUnknownSession (409, reregister)", err)
	}
	b := fx.register("b", []string{"/c"}, 10)
	if r := fx.place("/c", "x"); r.Owner.SessionID != b || !r.Placed || !r.Replaced || r.Epoch <= x.Epoch {
		t.Fatalf("unexpected placement when the lease ends; got %+v; want a new one on %s replacing the dead owner's", r, b)
	}
}
