package directorytest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
)

// Contract cases about hostname bindings and supersession (run by Run
// with the rest).

func (fx *fixture) registerBound(client, hostname, env string, epoch int64, takeover string, ns ...string) (string, error) {
	fx.t.Helper()
	res, err := fx.s.Register(fx.ctx, &directory.Registration{
		ClientID: client, Sub: "test:worker", Secret: "s-" + client, Namespaces: ns,
		AdvertiseURL: "http://127.0.0.1:9/" + client, Headroom: 10,
		Hostname: hostname, Env: env, Epoch: epoch, Takeover: takeover,
	}, fx.now)
	if err != nil {
		return "", err
	}
	return res.SessionID, nil
}

// testHeldBindingSurvivesSweep: a sweep drops the bindings no live session
// holds and keeps the others — among many sessions and bindings — so a
// stale registration is still refused after it (R-LS-4).
func testHeldBindingSurvivesSweep(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	if _, err := fx.registerBound("a", "app.example", "green", 2, "", "/c", "/d"); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if _, err := fx.registerBound(fmt.Sprintf("gone-%d", i), fmt.Sprintf("h%d.example", i), "blue", 1, "", "/c", "/d"); err != nil {
			t.Fatal(err)
		}
	}
	keep, err := fx.registerBound("keep", "APP.example", "green", 2, "", "/d")
	if err != nil {
		t.Fatal(err)
	}
	fx.advance(TTL / 2)
	fx.beat(keep, 10, false, false)
	fx.advance(TTL/2 + time.Millisecond) // a and gone-* lapse; keep holds app.example/d
	if err := fx.s.Sweep(fx.ctx, fx.now); err != nil {
		t.Fatalf("cannot sweep: %v", err)
	}
	_, err = fx.registerBound("stale", "app.example", "blue", 1, "", "/d")
	wantSuperseded(t, err, "app.example", "/d", "green", 2)
	// The bindings nobody holds any more are free.
	if _, err := fx.registerBound("new-c", "app.example", "blue", 1, "", "/c"); err != nil {
		t.Fatalf("unexpected refusal of a binding no live session holds: %v", err)
	}
	if _, err := fx.registerBound("new-h", "h3.example", "red", 0, "", "/d"); err != nil {
		t.Fatalf("unexpected refusal of a binding no live session holds: %v", err)
	}
}

func wantSuperseded(t *testing.T, err error, host, ns, env string, epoch int64) {
	t.Helper()
	var se *directory.SupersededError
	if !errors.As(err, &se) || se.Hostname != host || se.NS != ns || se.Env != env || se.Epoch != epoch {
		t.Fatalf("unexpected error; got %v; want superseded: %s%s bound to env %s at epoch %d", err, host, ns, env, epoch)
	}
}

func testSupersede(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	a, err := fx.registerBound("a", "app.example", "blue", 1, "", "/c", "/d")
	if err != nil {
		t.Fatal(err)
	}
	other, err := fx.registerBound("o", "other.example", "blue", 1, "", "/c")
	if err != nil {
		t.Fatal(err)
	}
	r := fx.place("/d", "x")
	if r.Owner.SessionID != a {
		t.Fatalf("unexpected owner %s", r.Owner.SessionID)
	}
	// A higher epoch takes app.example/c: a is superseded, its records go.
	b, err := fx.registerBound("b", "APP.example", "green", 2, "", "/c")
	if err != nil {
		t.Fatalf("cannot register the higher epoch: %v", err)
	}
	_, err = fx.s.Heartbeat(fx.ctx, &directory.Beat{SessionID: a, Sub: "test:worker"}, fx.now)
	wantSuperseded(t, err, "APP.example", "/c", "green", 2)
	_, err = fx.s.Session(fx.ctx, a, fx.now)
	wantSuperseded(t, err, "APP.example", "/c", "green", 2)
	if _, ok := fx.lookup("/d", "x"); ok {
		t.Fatalf("unexpected placement of a superseded session")
	}
	if _, err := fx.s.Session(fx.ctx, other, fx.now); err != nil {
		t.Fatalf("unexpected effect on another hostname: %v", err)
	}
	// A stale registration is refused and leaves no trace.
	_, err = fx.registerBound("stale", "app.example", "blue", 1, "", "/c")
	wantSuperseded(t, err, "app.example", "/c", "green", 2)
	// Replicas of the same deployment join.
	b2, err := fx.registerBound("b2", "app.example", "green", 2, "", "/c")
	if err != nil {
		t.Fatalf("cannot join the binding: %v", err)
	}
	// Same epoch, another env: refused unless takeover is wind_down.
	_, err = fx.registerBound("red", "app.example", "red", 2, "deny", "/c")
	wantSuperseded(t, err, "app.example", "/c", "green", 2)
	red, err := fx.registerBound("red", "app.example", "red", 2, "wind_down", "/c")
	if err != nil {
		t.Fatalf("cannot take over with wind_down: %v", err)
	}
	for _, s := range []string{b, b2} {
		_, err = fx.s.Heartbeat(fx.ctx, &directory.Beat{SessionID: s, Sub: "test:worker"}, fx.now)
		wantSuperseded(t, err, "app.example", "/c", "red", 2)
	}
	if _, err := fx.s.Heartbeat(fx.ctx, &directory.Beat{SessionID: red, Sub: "test:worker"}, fx.now); err != nil {
		t.Fatalf("unexpected heartbeat error for the new holder: %v", err)
	}
	// Once no live session holds it, anyone may take the binding again.
	fx.advance(TTL)
	_ = fx.s.Sweep(fx.ctx, fx.now)
	if _, err := fx.registerBound("late", "app.example", "blue", 1, "", "/c"); err != nil {
		t.Fatalf("unexpected refusal of a free binding: %v", err)
	}
}

func testHostRouting(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	bound, err := fx.registerBound("bound", "app.example", "blue", 1, "", "/c")
	if err != nil {
		t.Fatal(err)
	}
	plain := fx.register("plain", []string{"/c"}, 1000)
	for i := range 5 {
		r, err := fx.s.Place(fx.ctx, &directory.PlaceRequest{NS: "/c", ID: fmt.Sprintf("h%d", i), Now: fx.now, Host: "App.Example"})
		if err != nil || r.Owner.SessionID != bound {
			t.Fatalf("unexpected owner for Host app.example; got %+v, %v; want the bound worker", r, err)
		}
	}
	counts := map[string]int{}
	for i := range 20 {
		r, err := fx.s.Place(fx.ctx, &directory.PlaceRequest{NS: "/c", ID: fmt.Sprintf("p%d", i), Now: fx.now, Host: "pinboard.internal"})
		if err != nil {
			t.Fatal(err)
		}
		counts[r.Owner.SessionID]++
	}
	if counts[plain] == 0 {
		t.Fatalf("unexpected placements for an unbound host; got %v; want the plain worker used", counts)
	}
	// A bound worker that drains still binds its host: no other worker
	// takes the host's new ids (docs/PROTOCOL.md).
	fx.beat(bound, 1, true, false)
	if _, err := fx.s.Place(fx.ctx, &directory.PlaceRequest{NS: "/c", ID: "drained", Now: fx.now, Host: "app.example"}); !errors.Is(err, directory.ErrNoEligible) {
		t.Fatalf("unexpected placement for Host app.example while its bound worker drains; got %v; want ErrNoEligible", err)
	}
	// A bound worker whose lease lapsed, its session not swept yet, binds
	// its host's ids no more: they place on the live workers, as for a
	// host nobody is bound to, instead of finding no eligible worker until
	// the sweep (R-LS-2). Its own ids re-place there too.
	fx.advance(TTL - time.Millisecond)
	fx.beat(plain, 1000, false, false)
	fx.advance(time.Millisecond)
	for _, id := range []string{"h0", "after"} {
		r, err := fx.s.Place(fx.ctx, &directory.PlaceRequest{NS: "/c", ID: id, Now: fx.now, Host: "app.example"})
		if err != nil || r.Owner.SessionID != plain || !r.Placed {
			t.Fatalf("unexpected placement of %s for Host app.example once its bound worker's lease lapsed; got %+v, %v; want a new one on the plain worker", id, r, err)
		}
	}
}

// testRegistrationNotAliased: the store keeps its own copy of what a
// registration names and hands out copies of what it keeps, so a caller
// that reuses or edits its Registration, or the SessionInfo it read,
// cannot change the bindings and namespaces another request sees
// (R-REG-1, R-LS-4).
func testRegistrationNotAliased(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	reg := &directory.Registration{
		ClientID: "a", Sub: "test:worker", Secret: "s-a", Namespaces: []string{"/c", "/d"},
		AdvertiseURL: "http://127.0.0.1:9/a", Headroom: 10,
		Hostname: "app.example", Env: "blue", Envs: map[string]string{"/d": "green"}, Epoch: 1,
	}
	res, err := fx.s.Register(fx.ctx, reg, fx.now)
	if err != nil {
		t.Fatal(err)
	}
	reg.Envs["/d"] = "red"
	reg.Envs["/c"] = "red"
	reg.Namespaces[0] = "/x"
	want := func() {
		t.Helper()
		info, err := fx.s.Session(fx.ctx, res.SessionID, fx.now)
		if err != nil {
			t.Fatal(err)
		}
		if len(info.Envs) != 1 || info.Envs["/d"] != "green" || len(info.Namespaces) != 2 || info.Namespaces[0] != "/c" {
			t.Fatalf("unexpected session; got envs %v, namespaces %v; want envs map[/d:green], namespaces [/c /d]", info.Envs, info.Namespaces)
		}
		info.Envs["/d"] = "red"
		info.Namespaces[1] = "/x"
	}
	want()
	want() // the edits to the first copy did not reach the store either
	// The binding is still app.example/d to green at epoch 1: an older
	// epoch is refused with it.
	_, err = fx.registerBound("b", "app.example", "red", 0, "", "/d")
	wantSuperseded(t, err, "app.example", "/d", "green", 1)
}
