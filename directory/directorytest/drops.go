package directorytest

import (
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
)

// A dropped session — deregistered, voided, swept, superseded or handed
// over — is gone at once, and its rows are freed directory.RegisterBatch
// at a time, each batch one atomic step of the store, so that other calls
// proceed in between (docs/DIRECTORY.md, "Scripts"). These tests pin down
// that once the drop returns every row is freed, whatever it held.

// dropHeld is more rows than one batch frees.
const dropHeld = 3*directory.RegisterBatch + 7

// wantFreed fails unless no id of /c in list is placed.
func (fx *fixture) wantFreed(list []string) {
	fx.t.Helper()
	for _, id := range list {
		if p, err := fx.s.Placement(fx.ctx, "/c", id, fx.now); !errors.Is(err, directory.ErrNoPlacement) {
			fx.t.Fatalf("unexpected placement of %s after its owner was dropped; got %+v, %v; want none", id, p, err)
		}
	}
}

// wantGone fails unless sid is unknown to heartbeats and to Session.
func (fx *fixture) wantGone(sid string) {
	fx.t.Helper()
	if _, err := fx.s.Heartbeat(fx.ctx, &directory.Beat{SessionID: sid, Sub: "test:worker"}, fx.now); !errors.Is(err, directory.ErrUnknownSession) {
		fx.t.Fatalf("unexpected heartbeat of a dropped session; got %v; want ErrUnknownSession", err)
	}
	if _, err := fx.s.Session(fx.ctx, sid, fx.now); !errors.Is(err, directory.ErrUnknownSession) {
		fx.t.Fatalf("unexpected session read of a dropped session; got %v; want ErrUnknownSession", err)
	}
}

// replaceOn places every id of /c in list and fails unless each lands on sid.
func (fx *fixture) replaceOn(list []string, sid string) {
	fx.t.Helper()
	for _, id := range list {
		if r := fx.place("/c", id); r.Owner.SessionID != sid || !r.Placed {
			fx.t.Fatalf("unexpected placement of %s after its owner was dropped; got %+v; want placed on %s", id, r, sid)
		}
	}
}

// testDeregisterAcrossBatches: a deregister of a session holding more
// rows than one batch frees them all before it returns (R-REG-3); its
// ids place on another worker; deregistering again, or twice at once, is
// harmless.
func testDeregisterAcrossBatches(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	list := ids(dropHeld)
	a := fx.holding(list)
	b := fx.register("b", []string{"/c"}, float64(dropHeld))
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fx.s.Deregister(fx.ctx, a, fx.now)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("cannot deregister twice at once: %v", err)
	}
	fx.wantGone(a)
	fx.wantFreed(list)
	if err := fx.s.Deregister(fx.ctx, a, fx.now); err != nil {
		t.Fatalf("cannot deregister again: %v", err)
	}
	fx.replaceOn(list, b)
	if err := fx.s.Void(fx.ctx, a, fx.now); err != nil {
		t.Fatalf("cannot void a session deregistered: %v", err)
	}
	fx.wantOwner(list, b)
}

// testVoidAcrossBatches: a void drops the records of a session holding
// more rows than one batch, every row freed when it returns (R-LS-3).
func testVoidAcrossBatches(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	list := ids(dropHeld)
	a := fx.holding(list)
	if err := fx.s.Void(fx.ctx, a, fx.now); err != nil {
		t.Fatalf("cannot void: %v", err)
	}
	fx.wantGone(a)
	fx.wantFreed(list)
	for _, id := range list {
		if _, ok := fx.lookup("/c", id); ok {
			t.Fatalf("unexpected lookup of %s after void", id)
		}
	}
	b := fx.register("b", []string{"/c"}, float64(dropHeld))
	fx.replaceOn(list, b)
}

// testSweepAcrossBatches: the sweep of a dead session holding more rows
// than one batch frees them all before it returns (R-LS-2), and its ids
// place on a live worker.
func testSweepAcrossBatches(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	list := ids(dropHeld)
	a := fx.holding(list)
	fx.advance(2*TTL + time.Millisecond)
	if err := fx.s.Sweep(fx.ctx, fx.now); err != nil {
		t.Fatalf("cannot sweep: %v", err)
	}
	fx.wantGone(a)
	fx.wantFreed(list)
	b := fx.register("b", []string{"/c"}, float64(dropHeld))
	fx.replaceOn(list, b)
}

// testDroppedEarlierAcrossBatches: a re-registration that no longer lists
// most of what its earlier session held frees all of it with that session
// (R-REG-1); so does one that supersedes a session holding more than one
// batch (R-LS-4), whatever it lists.
func testDroppedEarlierAcrossBatches(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	list := ids(dropHeld)
	a := fx.holding(list)
	res, err := fx.registerListing(a, map[string][]string{"/c": list[:3]})
	if err != nil || len(res.Duplicates) != 0 {
		t.Fatalf("cannot re-register; got %+v, %v", res, err)
	}
	fx.wantGone(a)
	fx.wantOwner(list[:3], res.SessionID)
	fx.wantFreed(list[3:])

	for _, listed := range [][]string{list[:3], list[:2*directory.RegisterBatch]} {
		blue, err := fx.s.Register(fx.ctx, &directory.Registration{
			ClientID: "blue", Sub: "test:worker", Secret: "s", Namespaces: []string{"/c"},
			AdvertiseURL: "http://127.0.0.1:9/blue", Headroom: 10, Hostname: "app.example", Env: "blue", Epoch: 1,
			Instances: map[string][]string{"/c": list[3:]},
		}, fx.now)
		if err != nil || len(blue.Duplicates) != 0 {
			t.Fatalf("cannot register blue: %+v, %v", blue, err)
		}
		green, err := fx.s.Register(fx.ctx, &directory.Registration{
			ClientID: "green", Sub: "test:worker", Secret: "s", Namespaces: []string{"/c"},
			AdvertiseURL: "http://127.0.0.1:9/green", Headroom: 10, Hostname: "app.example", Env: "green", Epoch: 2,
			Instances: map[string][]string{"/c": listed},
		}, fx.now)
		if err != nil {
			t.Fatalf("cannot register green: %v", err)
		}
		var dups int
		for _, d := range green.Duplicates {
			if d.ID >= list[3] {
				dups++
			}
		}
		if want := max(len(listed)-3, 0); dups != want {
			t.Fatalf("unexpected duplicates of green listing %d; got %d; want the %d ids blue held", len(listed), dups, want)
		}
		fx.wantFreed(list[3:])
		if err := fx.s.Deregister(fx.ctx, green.SessionID, fx.now); err != nil {
			t.Fatal(err)
		}
		fx.advance(3 * TTL) // blue's tomb and green's binding pass
		if err := fx.s.Sweep(fx.ctx, fx.now); err != nil {
			t.Fatal(err)
		}
	}
}

// RunBetweenDropBatches runs the tests of what may happen between two
// batches of the rows a dropped session frees, against stores from f
// with hook installed (directory's export_test.go: SetAfterDropBatch).
func RunBetweenDropBatches(t *testing.T, f Factory, hook BatchHook) {
	tests := []struct {
		name string
		fn   func(t *testing.T, f Factory, hook BatchHook)
	}{
		{"GoneBeforeItsRowsAreFreed_RREG3", testGoneBetweenDropBatches},
		{"SweepGoneBeforeItsRowsAreFreed_RLS2", testSweptBetweenDropBatches},
		{"TimedDrainReleaseAcrossBatches_RLS5", testDrainReleasedBetweenBatches},
		{"UndrainDuringForcedRelease_RLS5", testUndrainedBetweenReleaseBatches},
		{"SweepDuringSupersedeKeepsDuplicates_RLS4_RREG1", testSweptWhileSuperseding},
		{"VoidDuringSupersedeKeepsDuplicates_RLS4_RREG1", testVoidedWhileSuperseding},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, f, hook) })
	}
}

// testGoneBetweenDropBatches: between two batches of a deregister, the
// session is gone — its heartbeat is unknown, and an id it still holds
// re-places on another worker, which keeps it after the deregister
// returns; other calls proceed; the rest is freed (R-REG-3).
func testGoneBetweenDropBatches(t *testing.T, f Factory, hook BatchHook) {
	fx := newFixture(t, f)
	fx.warm()
	list := ids(dropHeld)
	a := fx.holding(list)
	b := fx.register("b", []string{"/c"}, float64(dropHeld))
	calls := 0
	hook(fx.s, func() {
		calls++
		if calls > 1 {
			return
		}
		fx.wantGone(a)
		fx.beat(b, float64(dropHeld), false, false)
		fx.replaceOn(list[len(list)-1:], b)
		fx.replaceOn(list[:1], b)
	})
	if err := fx.s.Deregister(fx.ctx, a, fx.now); err != nil {
		t.Fatalf("cannot deregister: %v", err)
	}
	if calls == 0 {
		t.Fatalf("unexpected deregister of %d rows in one batch", dropHeld)
	}
	fx.wantOwner(list[:1], b)
	fx.wantOwner(list[len(list)-1:], b)
	fx.wantFreed(list[1 : len(list)-1])
}

// testSweptBetweenDropBatches: the sweep of a dead session holding more
// than one batch lets other calls in between, and frees every row its
// calls did not see re-placed (R-LS-2).
func testSweptBetweenDropBatches(t *testing.T, f Factory, hook BatchHook) {
	fx := newFixture(t, f)
	fx.warm()
	list := ids(dropHeld)
	a := fx.holding(list)
	fx.advance(2*TTL + time.Millisecond)
	b := fx.register("b", []string{"/c"}, float64(dropHeld))
	calls := 0
	hook(fx.s, func() {
		calls++
		if calls == 1 {
			fx.wantGone(a)
			fx.replaceOn(list[:1], b)
		}
	})
	if err := fx.s.Sweep(fx.ctx, fx.now); err != nil {
		t.Fatalf("cannot sweep: %v", err)
	}
	if calls == 0 {
		t.Fatalf("unexpected sweep of %d rows in one batch", dropHeld)
	}
	fx.wantOwner(list[:1], b)
	fx.wantFreed(list[1:])
}

// testDrainReleasedBetweenBatches: the forced release of a timed drain
// past its deadline (R-LS-5), for a client holding more rows than one
// batch, frees them a batch per step with other calls in between — the
// drained session stays live, its ids not yet freed still route to it —
// and every row is free, forgotten by Lookup and placeable on another
// worker, once the sweep returns. The session itself survives until its
// capped lease passes, and a later sweep does not release again.
func testDrainReleasedBetweenBatches(t *testing.T, f Factory, hook BatchHook) {
	fx := newFixture(t, f)
	fx.warm()
	list := ids(dropHeld)
	a := fx.holding(list)
	b := fx.register("b", []string{"/c"}, float64(dropHeld))
	deadline := fx.now.Add(TTL / 2)
	if found, err := fx.s.SetDrain(fx.ctx, "a", directory.DrainState{Draining: true, Deadline: deadline}, fx.now); !found || err != nil {
		t.Fatalf("cannot drain a; got %v, %v", found, err)
	}
	fx.advance(TTL / 2)
	fx.wantOwner(list, a) // cached from here on
	calls := 0
	hook(fx.s, func() {
		calls++
		if calls > 1 {
			return
		}
		fx.beat(a, 100, false, false)
		held := 0
		for _, id := range list {
			if p, err := fx.s.Placement(fx.ctx, "/c", id, fx.now); err == nil && p.SessionID == a {
				held++
			}
		}
		if held == 0 || held >= len(list) {
			t.Errorf("unexpected rows still held by the drained session between batches; got %d; want 1 to %d", held, len(list)-1)
		}
	})
	if err := fx.s.Sweep(fx.ctx, fx.now); err != nil {
		t.Fatalf("cannot sweep: %v", err)
	}
	hook(fx.s, nil)
	if calls == 0 {
		t.Fatalf("unexpected forced release of %d rows in one batch", dropHeld)
	}
	fx.wantFreed(list)
	for _, id := range list {
		if r, ok := fx.lookup("/c", id); ok {
			t.Fatalf("unexpected lookup of %s after the forced release; got %+v; want none", id, r)
		}
	}
	fx.beat(a, 100, false, false)
	fx.replaceOn(list, b)
	fx.advance(TTL / 4)
	if err := fx.s.Sweep(fx.ctx, fx.now); err != nil {
		t.Fatalf("cannot sweep again: %v", err)
	}
	fx.wantOwner(list, b)
}

// testUndrainedBetweenReleaseBatches: an operator undrains a client while
// the forced release of its timed drain still has batches to go (R-LS-5).
// The release begun finishes, but only for the ids the session held at
// the deadline: an id placed on the session once undrained is a new
// activation on a live worker, and is still its owner after the sweep and
// after the next one. The session may take no new id before its release
// ends (ErrNoEligible), but one once it has.
func testUndrainedBetweenReleaseBatches(t *testing.T, f Factory, hook BatchHook) {
	fx := newFixture(t, f)
	fx.warm()
	list := ids(dropHeld)
	a := fx.holding(list)
	deadline := fx.now.Add(TTL / 2)
	if found, err := fx.s.SetDrain(fx.ctx, "a", directory.DrainState{Draining: true, Deadline: deadline}, fx.now); !found || err != nil {
		t.Fatalf("cannot drain a; got %v, %v", found, err)
	}
	fx.advance(TTL / 2)
	placed, undrained := false, false
	hook(fx.s, once(func() {
		undrained = true
		if found, err := fx.s.SetDrain(fx.ctx, "a", directory.DrainState{}, fx.now); !found || err != nil {
			t.Errorf("cannot undrain a; got %v, %v", found, err)
			return
		}
		fx.beat(a, 100, false, false)
		r, err := fx.s.Place(fx.ctx, &directory.PlaceRequest{NS: "/c", ID: "fresh", Now: fx.now})
		switch {
		case err == nil && r.Placed && r.Owner.SessionID == a:
			placed = true
		case !errors.Is(err, directory.ErrNoEligible):
			t.Errorf("unexpected placement on the undrained session between release batches; got %+v, %v; want placed on %s or ErrNoEligible", r, err, a)
		}
	}))
	if err := fx.s.Sweep(fx.ctx, fx.now); err != nil {
		t.Fatalf("cannot sweep: %v", err)
	}
	hook(fx.s, nil)
	if !undrained {
		t.Fatalf("unexpected forced release of %d rows in one batch; want the undrain between two", dropHeld)
	}
	fx.wantFreed(list)
	if !placed {
		fx.beat(a, 100, false, false)
		fx.replaceOn([]string{"fresh"}, a)
	}
	for i := range 2 {
		if p, err := fx.s.Placement(fx.ctx, "/c", "fresh", fx.now); err != nil || p.SessionID != a {
			t.Fatalf("unexpected placement of an id placed after the undrain (sweep %d); got %+v, %v; want held by %s", i+1, p, err, a)
		}
		fx.advance(TTL / 8)
		fx.beat(a, 100, false, false)
		if err := fx.s.Sweep(fx.ctx, fx.now); err != nil {
			t.Fatalf("cannot sweep again: %v", err)
		}
	}
}

// testSweptWhileSuperseding: a registration that supersedes a session
// holding more rows than one batch frees (R-LS-4) lists them all; a sweep
// — any node's — runs between the batches that free the superseded
// session's rows. The ids that session held were another live session's
// when the registration came: every one is a duplicate, whichever call
// freed its row, and none is the new session's (R-REG-1).
func testSweptWhileSuperseding(t *testing.T, f Factory, hook BatchHook) {
	whileSuperseding(t, f, hook, func(fx *fixture, _ string) error { return fx.s.Sweep(fx.ctx, fx.now) })
}

// testVoidedWhileSuperseding: the same with a void of the superseded
// session between the batches — its heartbeat's probe found another
// process at its advertise URL just then (R-LS-3). The void finds the
// session gone; the rows stay the registration's to free.
func testVoidedWhileSuperseding(t *testing.T, f Factory, hook BatchHook) {
	whileSuperseding(t, f, hook, func(fx *fixture, blue string) error { return fx.s.Void(fx.ctx, blue, fx.now) })
}

// whileSuperseding runs act (with the superseded session) between the
// batches of a superseding registration.
func whileSuperseding(t *testing.T, f Factory, hook BatchHook, act func(fx *fixture, blue string) error) {
	fx := newFixture(t, f)
	fx.warm()
	held := ids(dropHeld)
	reg := func(client string, epoch int64, instances []string) *directory.RegisterResult {
		t.Helper()
		res, err := fx.s.Register(fx.ctx, &directory.Registration{
			ClientID: client, Sub: "test:worker", Secret: "s", Namespaces: []string{"/c"},
			AdvertiseURL: "http://127.0.0.1:9/" + client, Headroom: 10, Hostname: "app.example", Env: client, Epoch: epoch,
			Instances: map[string][]string{"/c": instances},
		}, fx.now)
		if err != nil {
			t.Fatalf("cannot register %s: %v", client, err)
		}
		return res
	}
	blue := reg("blue", 1, held)
	if len(blue.Duplicates) != 0 {
		t.Fatalf("unexpected duplicates of blue; got %d; want 0", len(blue.Duplicates))
	}
	swept, sweeping := 0, false
	hook(fx.s, func() {
		if sweeping {
			return // act's own batches
		}
		sweeping = true
		defer func() { sweeping = false }()
		swept++
		if err := act(fx, blue.SessionID); err != nil {
			t.Errorf("cannot act between the batches: %v", err)
		}
	})
	res := reg("green", 2, append(slices.Clone(held), "free"))
	hook(fx.s, nil)
	if swept == 0 {
		t.Fatalf("unexpected drops of %d rows in one batch; want a sweep between two", dropHeld)
	}
	if len(res.Duplicates) != len(held) {
		t.Fatalf("unexpected duplicates; got %d; want the %d ids blue held", len(res.Duplicates), len(held))
	}
	fx.wantOwner([]string{"free"}, res.SessionID)
	fx.wantFreed(held)
}
