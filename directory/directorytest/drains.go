package directorytest

import (
	"errors"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
)

// Contract cases about operator drains, untimed and timed (run by Run
// with the rest).

func testOperatorDrain(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	a := fx.register("a", []string{"/c"}, 10)
	fx.place("/c", "kept")
	found, err := fx.s.SetDrain(fx.ctx, "a", directory.DrainState{Draining: true}, fx.now)
	if err != nil || !found {
		t.Fatalf("cannot drain: %v, %v", found, err)
	}
	if found, err := fx.s.SetDrain(fx.ctx, "nobody", directory.DrainState{Draining: true}, fx.now); err != nil || found {
		t.Fatalf("unexpected drain of an unknown client; got %v, %v; want false, nil", found, err)
	}
	res := fx.beat(a, 10, false, false)
	if !res.Draining || !res.Drain.Draining {
		t.Fatalf("unexpected ack; got %+v; want draining", res)
	}
	if _, err := fx.s.Place(fx.ctx, &directory.PlaceRequest{NS: "/c", ID: "new", Now: fx.now}); !errors.Is(err, directory.ErrNoEligible) {
		t.Fatalf("unexpected placement on an operator-drained worker; got %v", err)
	}
	if _, ok := fx.lookup("/c", "kept"); !ok {
		t.Fatalf("unexpected loss of an existing placement while drained")
	}
	// The drain belongs to the client id: a re-registration keeps it.
	res2, err := fx.s.Register(fx.ctx, &directory.Registration{ClientID: "a", Sub: "test:worker", Secret: "s", Namespaces: []string{"/c"}, AdvertiseURL: "http://127.0.0.1:9/a", PrevSessionID: a}, fx.now)
	if err != nil || !res2.Drain.Draining {
		t.Fatalf("unexpected re-registration; got %+v, %v; want the drain kept", res2, err)
	}
	if found, _ := fx.s.SetDrain(fx.ctx, "a", directory.DrainState{}, fx.now); !found {
		t.Fatalf("cannot undrain")
	}
	res = fx.beat(res2.SessionID, 10, false, false)
	if res.Draining {
		t.Fatalf("unexpected drain after undrain")
	}
	fx.place("/c", "new")
}

func testTimedDrain(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	a := fx.register("a", []string{"/c"}, 10)
	fx.place("/c", "x")
	deadline := fx.now.Add(TTL / 2)
	if found, _ := fx.s.SetDrain(fx.ctx, "a", directory.DrainState{Draining: true, Deadline: deadline}, fx.now); !found {
		t.Fatalf("cannot drain")
	}
	res := fx.beat(a, 10, false, false)
	if !res.Drain.Deadline.Equal(deadline) {
		t.Fatalf("unexpected drain deadline; got %v; want %v", res.Drain.Deadline, deadline)
	}
	// Heartbeats at the deadline and half a lease past it are renewed up
	// to the cap (deadline plus one lease), neither beyond it nor short of
	// it; the one at the cap finds the session ended.
	limit := deadline.Add(TTL)
	for fx.now.Before(limit) {
		fx.advance(TTL / 2)
		_ = fx.s.Sweep(fx.ctx, fx.now)
		res, err := fx.s.Heartbeat(fx.ctx, &directory.Beat{SessionID: a, Sub: "test:worker", Headroom: 10}, fx.now)
		if !fx.now.Before(limit) {
			if !errors.Is(err, directory.ErrUnknownSession) {
				t.Fatalf("unexpected heartbeat at the drain deadline plus one lease; got %+v, %v; want ErrUnknownSession", res, err)
			}
			break
		}
		if err != nil || !res.LeaseUntil.Equal(limit) {
			t.Fatalf("unexpected heartbeat %v past the drain deadline; got %+v, %v; want the lease capped at %v", fx.now.Sub(deadline), res, err, limit)
		}
	}
	if _, ok := fx.lookup("/c", "x"); ok {
		t.Fatalf("unexpected placement kept past the drain deadline (forced release)")
	}
}

// testSpentTimedDrain: once a timed drain's cap (deadline plus one lease)
// has passed, a process that is still alive and registers again stays
// drained (untimed) but gets a normal lease: no lease that ends before it
// starts, no re-registration every heartbeat. An undrain restores it.
func testSpentTimedDrain(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	a := fx.register("a", []string{"/c"}, 10)
	deadline := fx.now.Add(TTL / 2)
	if found, _ := fx.s.SetDrain(fx.ctx, "a", directory.DrainState{Draining: true, Deadline: deadline}, fx.now); !found {
		t.Fatalf("cannot drain")
	}
	fx.advance(TTL/2 + TTL)
	_ = fx.s.Sweep(fx.ctx, fx.now)
	if _, err := fx.s.Heartbeat(fx.ctx, &directory.Beat{SessionID: a, Sub: "test:worker", Headroom: 10}, fx.now); !errors.Is(err, directory.ErrUnknownSession) {
		t.Fatalf("unexpected heartbeat past the drain cap; got %v; want ErrUnknownSession", err)
	}
	reg := &directory.Registration{ClientID: "a", Sub: "test:worker", Secret: "s", Namespaces: []string{"/c"},
		AdvertiseURL: "http://127.0.0.1:9/a", Headroom: 10, PrevSessionID: a}
	res, err := fx.s.Register(fx.ctx, reg, fx.now)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Drain.Draining || !res.Drain.Deadline.IsZero() || !res.LeaseUntil.Equal(fx.now.Add(TTL)) {
		t.Fatalf("unexpected registration after a spent timed drain; got %+v; want draining, untimed, lease %v", res, fx.now.Add(TTL))
	}
	fx.advance(TTL / 2)
	beat := fx.beat(res.SessionID, 10, false, false)
	if !beat.Draining || !beat.Drain.Deadline.IsZero() || !beat.LeaseUntil.Equal(fx.now.Add(TTL)) {
		t.Fatalf("unexpected heartbeat; got %+v; want draining with a full lease", beat)
	}
	if _, err := fx.s.Place(fx.ctx, &directory.PlaceRequest{NS: "/c", ID: "new", Now: fx.now}); !errors.Is(err, directory.ErrNoEligible) {
		t.Fatalf("unexpected placement on a drained worker; got %v", err)
	}
	if found, _ := fx.s.SetDrain(fx.ctx, "a", directory.DrainState{}, fx.now); !found {
		t.Fatalf("cannot undrain")
	}
	fx.place("/c", "new")
}

// testUndrainWithoutSession: undrain clears a drain even while the client
// has no live session (between a lapsed session and its next register).
func testUndrainWithoutSession(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	fx.register("a", []string{"/c"}, 10)
	if found, _ := fx.s.SetDrain(fx.ctx, "a", directory.DrainState{Draining: true}, fx.now); !found {
		t.Fatalf("cannot drain")
	}
	fx.advance(TTL + time.Second)
	if found, err := fx.s.SetDrain(fx.ctx, "a", directory.DrainState{Draining: true}, fx.now); err != nil || found {
		t.Fatalf("unexpected drain of a client without a live session; got %v, %v; want false, nil", found, err)
	}
	if found, err := fx.s.SetDrain(fx.ctx, "a", directory.DrainState{}, fx.now); !found || err != nil {
		t.Fatalf("unexpected undrain without a live session; got %v, %v; want found", found, err)
	}
	if found, err := fx.s.SetDrain(fx.ctx, "a", directory.DrainState{}, fx.now); err != nil || found {
		t.Fatalf("unexpected second undrain: nothing is left to clear; got %v, %v; want false, nil", found, err)
	}
	res, err := fx.s.Register(fx.ctx, &directory.Registration{ClientID: "a", Sub: "test:worker", Secret: "s", Namespaces: []string{"/c"},
		AdvertiseURL: "http://127.0.0.1:9/a", Headroom: 10}, fx.now)
	if err != nil || res.Drain.Draining {
		t.Fatalf("unexpected registration after undrain; got %+v, %v; want not draining", res, err)
	}
}
