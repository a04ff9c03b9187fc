package directorytest

import (
	"errors"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
)

// Contract cases about sessions: heartbeats, re-registration, releases,
// voids, the workers listing and the sweep (run by Run with the rest).

func testHeartbeatRenews(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	a := fx.register("a", []string{"/c"}, 10)
	for range 5 {
		fx.advance(TTL - 10*time.Millisecond)
		res := fx.beat(a, 10, false, false)
		if want := fx.now.Add(TTL); !res.LeaseUntil.Equal(want) {
			t.Fatalf("unexpected lease; got %v; want %v", res.LeaseUntil, want)
		}
	}
	if _, err := fx.s.Session(fx.ctx, a, fx.now); err != nil {
		t.Fatalf("unexpected session loss: %v", err)
	}
}

// testLeaseNotShort: a lease runs a whole TTL from the registration or
// heartbeat that set it (R-LS-1), on a clock that reads nanoseconds as
// time.Now does — not short of it by the part of a microsecond a store
// keeping microseconds (Redis) would cut from now: the registry answers
// expiresInMs in whole milliseconds, and 15 s less a few nanoseconds is
// 14999. A store may round up, by less than a microsecond.
func testLeaseNotShort(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.advance(123_456_789) // 789 ns past the microsecond
	wantLease := func(what string, got time.Time) {
		t.Helper()
		if want := fx.now.Add(TTL); got.Before(want) || !got.Before(want.Add(time.Microsecond)) {
			t.Fatalf("unexpected lease from %s; got %v; want %v (within a microsecond above)", what, got, want)
		}
	}
	res, err := fx.s.Register(fx.ctx, &directory.Registration{ClientID: "a", Sub: "test:worker", Secret: "s",
		Namespaces: []string{"/c"}, AdvertiseURL: "http://127.0.0.1:9/a", Headroom: 10}, fx.now)
	if err != nil {
		t.Fatal(err)
	}
	wantLease("the registration", res.LeaseUntil)
	fx.advance(time.Second + 1)
	wantLease("a heartbeat", fx.beat(res.SessionID, 10, false, false).LeaseUntil)
	info, err := fx.s.Session(fx.ctx, res.SessionID, fx.now)
	if err != nil {
		t.Fatal(err)
	}
	wantLease("the session read", info.LeaseUntil)
}

// A heartbeat reports the degraded state and own drain flag it replaced,
// read in the same atomic step: the registry logs each transition once
// from them, whichever node took the beat before (R-LS-3).
func testHeartbeatReportsStateReplaced(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	a := fx.register("a", []string{"/c"}, 10)
	for i, c := range []struct{ draining, degraded, wasDraining, wasDegraded bool }{
		{false, false, false, false},
		{false, true, false, false},
		{true, true, false, true},
		{true, false, true, true},
		{false, false, true, false},
		{false, false, false, false},
	} {
		fx.advance(time.Second)
		res := fx.beat(a, 10, c.draining, c.degraded)
		if res.WasDraining != c.wasDraining || res.WasDegraded != c.wasDegraded {
			t.Fatalf("unexpected state replaced by beat %d; got draining %v, degraded %v; want %v, %v",
				i, res.WasDraining, res.WasDegraded, c.wasDraining, c.wasDegraded)
		}
	}
}

func testHeartbeatErrors(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	a := fx.register("a", []string{"/c"}, 10)
	_, err := fx.s.Heartbeat(fx.ctx, &directory.Beat{SessionID: "nope", Sub: "test:worker"}, fx.now)
	if !errors.Is(err, directory.ErrUnknownSession) {
		t.Fatalf("unexpected error; got %v; want ErrUnknownSession", err)
	}
	_, err = fx.s.Heartbeat(fx.ctx, &directory.Beat{SessionID: a, Sub: "test:other"}, fx.now)
	if !errors.Is(err, directory.ErrForbidden) {
		t.Fatalf("unexpected error; got %v; want ErrForbidden", err)
	}
	fx.advance(TTL)
	_, err = fx.s.Heartbeat(fx.ctx, &directory.Beat{SessionID: a, Sub: "test:worker"}, fx.now)
	if !errors.Is(err, directory.ErrUnknownSession) {
		t.Fatalf("unexpected error for a frozen worker past its lease; got %v; want ErrUnknownSession (R-LS-2)", err)
	}
}

func testReregister(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	a := fx.register("a", []string{"/c"}, 100)
	for _, id := range []string{"x", "y", "z"} {
		fx.place("/c", id)
	}
	// a freezes past its lease; b takes y meanwhile.
	fx.advance(TTL)
	b := fx.register("b", []string{"/c"}, 100)
	if r := fx.place("/c", "y"); r.Owner.SessionID != b {
		t.Fatalf("unexpected owner of y; got %s; want %s", r.Owner.SessionID, b)
	}
	// a wakes, gets 409, re-registers listing what it still hosts.
	res, err := fx.s.Register(fx.ctx, &directory.Registration{
		ClientID: "a", Sub: "test:worker", Secret: "secret-a", Namespaces: []string{"/c"},
		AdvertiseURL: "http://127.0.0.1:9/a", Headroom: 100, PrevSessionID: a,
		Instances: map[string][]string{"/c": {"x", "y", "z"}, "/other": {"q"}},
	}, fx.now)
	if err != nil {
		t.Fatalf("cannot re-register: %v", err)
	}
	if res.SessionID == a {
		t.Fatalf("unexpected reuse of the old session id")
	}
	want := map[directory.NSID]bool{{NS: "/c", ID: "y"}: true, {NS: "/other", ID: "q"}: true}
	if len(res.Duplicates) != len(want) {
		t.Fatalf("unexpected duplicates; got %v; want %v", res.Duplicates, want)
	}
	for _, d := range res.Duplicates {
		if !want[d] {
			t.Fatalf("unexpected duplicate %v; want %v", d, want)
		}
	}
	for _, id := range []string{"x", "z"} {
		r, ok := fx.lookup("/c", id)
		if !ok || r.Owner.SessionID != res.SessionID {
			t.Fatalf("unexpected owner of %s after re-registration; got %+v, %v; want %s", id, r, ok, res.SessionID)
		}
	}
	if r, _ := fx.lookup("/c", "y"); r.Owner.SessionID != b {
		t.Fatalf("unexpected owner of y; got %+v; want %s", r, b)
	}
	if _, err := fx.s.Session(fx.ctx, a, fx.now); !errors.Is(err, directory.ErrUnknownSession) {
		t.Fatalf("unexpected old session; got %v; want ErrUnknownSession", err)
	}
}

func testRelease(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	a := fx.register("a", []string{"/c"}, 100)
	r := fx.place("/c", "x")
	fx.place("/c", "y")
	ok, err := fx.s.Release(fx.ctx, &directory.ReleaseRequest{SessionID: "other", NS: "/c", ID: "x"}, fx.now)
	if err != nil || ok {
		t.Fatalf("unexpected release by another session; got %v, %v", ok, err)
	}
	ok, err = fx.s.Release(fx.ctx, &directory.ReleaseRequest{SessionID: a, NS: "/c", ID: "x", Epoch: r.Epoch + 1}, fx.now)
	if err != nil || ok {
		t.Fatalf("unexpected release at another epoch; got %v, %v; want false, nil", ok, err)
	}
	ok, err = fx.s.Release(fx.ctx, &directory.ReleaseRequest{SessionID: a, NS: "/c", ID: "x", Epoch: r.Epoch}, fx.now)
	if err != nil || !ok {
		t.Fatalf("unexpected failure to release x; got %v, %v; want true, nil", ok, err)
	}
	if _, found := fx.lookup("/c", "x"); found {
		t.Fatalf("unexpected lookup hit after release")
	}
	if err := fx.s.Deregister(fx.ctx, a, fx.now); err != nil {
		t.Fatalf("cannot deregister: %v", err)
	}
	if _, found := fx.lookup("/c", "y"); found {
		t.Fatalf("unexpected lookup hit after deregister")
	}
	if err := fx.s.Deregister(fx.ctx, a, fx.now); err != nil {
		t.Fatalf("unexpected error deregistering twice: %v", err)
	}
	b := fx.register("b", []string{"/c"}, 1)
	if r := fx.place("/c", "y"); r.Owner.SessionID != b || !r.Placed {
		t.Fatalf("unexpected placement after deregister; got %+v", r)
	}
}

func testVoid(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	a := fx.register("a", []string{"/c"}, 100)
	fx.place("/c", "x")
	if err := fx.s.Void(fx.ctx, a, fx.now); err != nil {
		t.Fatalf("cannot void: %v", err)
	}
	if _, ok := fx.lookup("/c", "x"); ok {
		t.Fatalf("unexpected placement after void")
	}
	if _, err := fx.s.Heartbeat(fx.ctx, &directory.Beat{SessionID: a, Sub: "test:worker"}, fx.now); !errors.Is(err, directory.ErrUnknownSession) {
		t.Fatalf("unexpected heartbeat result after void; got %v", err)
	}
}

func testWorkers(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	a := fx.register("a", []string{"/c", "/t"}, 7)
	fx.advance(time.Millisecond)
	fx.register("b", []string{"/c"}, 9)
	fx.place("/t", "x")
	ws, err := fx.s.Workers(fx.ctx, fx.now)
	if err != nil || len(ws) != 2 {
		t.Fatalf("unexpected workers; got %d, %v; want 2", len(ws), err)
	}
	w := ws[0]
	if w.SessionID != a || w.ClientID != "a" || len(w.Namespaces) != 2 || w.Placements != 1 || w.AdvertiseURL != "http://127.0.0.1:9/a" {
		t.Fatalf("unexpected first worker; got %+v", w)
	}
	fx.advance(TTL)
	ws, err = fx.s.Workers(fx.ctx, fx.now)
	if err != nil || len(ws) != 0 {
		t.Fatalf("unexpected expired workers listed; got %d, %v; want none", len(ws), err)
	}
}

func testSweep(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	fx.register("a", []string{"/c"}, 10)
	fx.place("/c", "x")
	fx.advance(2*TTL + time.Millisecond)
	if err := fx.s.Sweep(fx.ctx, fx.now); err != nil {
		t.Fatalf("cannot sweep: %v", err)
	}
	if _, err := fx.s.Placement(fx.ctx, "/c", "x", fx.now); !errors.Is(err, directory.ErrNoPlacement) {
		t.Fatalf("unexpected dead row after sweep; got %v", err)
	}
}

// testExpired: a session past its lease is counted expired until the
// sweep drops it; one that deregistered is not (ExpiredCounter, for
// pinboard_workers{state="expired"}).
func testExpired(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	ec, ok := fx.s.(directory.ExpiredCounter)
	if !ok {
		t.Fatalf("unexpected store without directory.ExpiredCounter")
	}
	expired := func(want int) {
		t.Helper()
		if n, err := ec.Expired(fx.ctx, fx.now); err != nil || n != want {
			t.Fatalf("unexpected expired sessions; got %d, %v; want %d", n, err, want)
		}
	}
	a := fx.register("a", []string{"/c"}, 10)
	b := fx.register("b", []string{"/c"}, 10)
	gone := fx.register("gone", []string{"/c"}, 10)
	expired(0)
	fx.advance(TTL / 2)
	fx.beat(b, 10, false, false)
	if err := fx.s.Deregister(fx.ctx, gone, fx.now); err != nil {
		t.Fatalf("cannot deregister: %v", err)
	}
	fx.advance(TTL / 2)
	expired(1) // a; b renewed, gone deregistered
	if _, err := fx.s.Heartbeat(fx.ctx, &directory.Beat{SessionID: a, Sub: "test:worker", Headroom: 10}, fx.now); !errors.Is(err, directory.ErrUnknownSession) {
		t.Fatalf("unexpected heartbeat past the lease; got %v; want ErrUnknownSession", err)
	}
	fx.advance(TTL + time.Millisecond)
	expired(2) // b's lease passed too
	if err := fx.s.Sweep(fx.ctx, fx.now); err != nil {
		t.Fatalf("cannot sweep: %v", err)
	}
	expired(1) // a was one lease past its expiry: dropped
}

// testEndedSessionRevoked: a session the store ended — deregistered, or
// dropped by the sweep a lease after its lease ran out — revokes the
// Owner its routes carried, for good; one whose lease only ran out is not
// revoked yet (the proxy ends event streams of revoked owners only:
// Owner.Revoked is the store's word, a lapsed lease may be this node's
// view of a Redis it cannot reach).
func testEndedSessionRevoked(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	fx.register("a", []string{"/c"}, 10)
	fx.register("b", []string{"/d"}, 10)
	x, y := fx.place("/c", "x"), fx.place("/d", "y")
	if x.Owner.Revoked() || y.Owner.Revoked() {
		t.Fatalf("unexpected revoked owner of a live session")
	}
	if err := fx.s.Deregister(fx.ctx, x.Owner.SessionID, fx.now); err != nil {
		t.Fatal(err)
	}
	if !x.Owner.Revoked() {
		t.Fatalf("unexpected owner not revoked after its session deregistered")
	}
	fx.advance(TTL + time.Millisecond)
	if y.Owner.Live(fx.now) || y.Owner.Revoked() {
		t.Fatalf("unexpected owner a millisecond past its lease; got live %v, revoked %v; want neither", y.Owner.Live(fx.now), y.Owner.Revoked())
	}
	fx.advance(TTL)
	if err := fx.s.Sweep(fx.ctx, fx.now); err != nil {
		t.Fatalf("cannot sweep: %v", err)
	}
	if !y.Owner.Revoked() {
		t.Fatalf("unexpected owner not revoked after the sweep dropped its session")
	}
	y.Owner.SetLeaseUntil(fx.now.Add(time.Hour))
	if !y.Owner.Revoked() || y.Owner.Live(fx.now) {
		t.Fatalf("unexpected revoked owner brought back by a late lease")
	}
}
