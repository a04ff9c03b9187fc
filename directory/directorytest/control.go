package directorytest

import (
	"errors"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
)

// Contract cases about control messages and wind-downs (run by Run with
// the rest).

func testControlMessages(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	a := fx.register("a", []string{"/c"}, 10)
	fx.place("/c", "x")
	if _, _, err := fx.s.WindDown(fx.ctx, "/c", "nothing", "", nil, fx.now); !errors.Is(err, directory.ErrNoPlacement) {
		t.Fatalf("unexpected wind-down of an unplaced id; got %v", err)
	}
	deadline := fx.now.Add(30 * time.Second)
	msgID, sid, err := fx.s.WindDown(fx.ctx, "/c", "x", "", &deadline, fx.now)
	if err != nil || sid != a || len(msgID) != 16 {
		t.Fatalf("cannot wind down: %q %q %v", msgID, sid, err)
	}
	// The queued deadline is the store's: neither the caller's variable
	// nor a delivered message's shares memory with it.
	want := deadline
	deadline = deadline.Add(time.Hour)
	revokeID, _, _ := fx.s.WindDown(fx.ctx, "/c", "x", "", nil, fx.now)
	for range 2 {
		res := fx.beat(a, 10, false, false)
		if len(res.Messages) != 2 || res.Messages[0].MsgID != msgID || res.Messages[1].Deadline != nil {
			t.Fatalf("unexpected messages; got %+v; want both, redelivered until acked", res.Messages)
		}
		if !res.Messages[0].Deadline.Equal(want) || res.Messages[0].NS != "/c" || res.Messages[0].ID != "x" || res.Messages[0].Type != "wind_down" {
			t.Fatalf("unexpected message; got %+v (deadline %v); want deadline %v", res.Messages[0], res.Messages[0].Deadline, want)
		}
		*res.Messages[0].Deadline = want.Add(time.Minute)
	}
	res := fx.beat(a, 10, false, false, msgID)
	if len(res.Messages) != 1 || res.Messages[0].MsgID != revokeID {
		t.Fatalf("unexpected messages after ack; got %+v", res.Messages)
	}
}

// testWindDownNamedOwner: a wind-down naming the owner its caller
// checked (an operator whose credential reaches that worker) queues
// nothing when another session owns the id by then, and says so
// (ErrOwnerChanged), with no timed deadline listed for it either; naming
// the owner that holds it works as naming none.
func testWindDownNamedOwner(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	a := fx.register("a", []string{"/c"}, 10)
	fx.place("/c", "x")
	b := fx.register("b", []string{"/c"}, 10)
	deadline := fx.now.Add(time.Second)
	if _, sid, err := fx.s.WindDown(fx.ctx, "/c", "x", b, &deadline, fx.now); !errors.Is(err, directory.ErrOwnerChanged) {
		t.Fatalf("unexpected wind-down naming another owner; got %q, %v; want ErrOwnerChanged", sid, err)
	}
	if res := fx.beat(a, 10, false, false); len(res.Messages) != 0 {
		t.Fatalf("unexpected messages for the owner nobody named; got %+v; want none", res.Messages)
	}
	if res := fx.beat(b, 10, false, false); len(res.Messages) != 0 {
		t.Fatalf("unexpected messages for the named session, which owns nothing; got %+v; want none", res.Messages)
	}
	fx.advance(1500 * time.Millisecond) // past the deadline, within the lease
	fx.beat(a, 10, false, false)
	fx.beat(b, 10, false, false)
	if err := fx.s.Sweep(fx.ctx, fx.now); err != nil {
		t.Fatal(err)
	}
	if r := fx.place("/c", "x"); r.Owner.SessionID != a {
		t.Fatalf("unexpected owner after the deadline of the refused wind-down; got %s; want %s (nothing freed it)", r.Owner.SessionID, a)
	}
	msgID, sid, err := fx.s.WindDown(fx.ctx, "/c", "x", a, nil, fx.now)
	if err != nil || sid != a {
		t.Fatalf("unexpected wind-down naming the owner; got %q, %v; want %s", sid, err, a)
	}
	if res := fx.beat(a, 10, false, false); len(res.Messages) != 1 || res.Messages[0].MsgID != msgID {
		t.Fatalf("unexpected messages; got %+v; want %s", res.Messages, msgID)
	}
}

// testWindDownFrees: a wind_down's deadline is when the placement is
// freed (the heartbeat reference: "seconds from now until the placement
// is freed"). The worker aborts a loaded instance then and releases it;
// a placement it holds with nothing loaded (retained idle) is freed by
// the sweep past the deadline. A revoked wind-down frees nothing, nor
// does one for a placement released and placed again since (another
// epoch); a re-registration that reclaims the id keeps its epoch, and the
// deadline with it. A later wind-down of the same placement replaces the
// deadline.
func testWindDownFrees(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	a := fx.register("a", []string{"/c"}, 10)
	for _, id := range []string{"x", "revoked", "replaced", "later", "reclaimed"} {
		fx.place("/c", id)
	}
	at := func(d time.Duration) *time.Time { t := fx.now.Add(d); return &t }
	for _, id := range []string{"x", "revoked", "replaced", "reclaimed"} {
		if _, _, err := fx.s.WindDown(fx.ctx, "/c", id, "", at(TTL/2), fx.now); err != nil {
			t.Fatalf("cannot wind down %s: %v", id, err)
		}
	}
	if _, _, err := fx.s.WindDown(fx.ctx, "/c", "later", "", at(TTL/4), fx.now); err != nil {
		t.Fatal(err)
	}
	if _, _, err := fx.s.WindDown(fx.ctx, "/c", "later", "", at(TTL), fx.now); err != nil {
		t.Fatal(err)
	}
	if _, _, err := fx.s.WindDown(fx.ctx, "/c", "revoked", "", nil, fx.now); err != nil {
		t.Fatal(err)
	}
	if ok, err := fx.s.Release(fx.ctx, &directory.ReleaseRequest{SessionID: a, NS: "/c", ID: "replaced"}, fx.now); !ok || err != nil {
		t.Fatalf("cannot release: %v, %v", ok, err)
	}
	fx.place("/c", "replaced")
	res, err := fx.s.Register(fx.ctx, &directory.Registration{ClientID: "a", Sub: "test:worker", Secret: "s", Namespaces: []string{"/c"},
		AdvertiseURL: "http://127.0.0.1:9/a", Headroom: 10, PrevSessionID: a,
		Instances: map[string][]string{"/c": {"x", "revoked", "replaced", "later", "reclaimed"}}}, fx.now)
	if err != nil {
		t.Fatal(err)
	}
	a = res.SessionID
	fx.advance(TTL/2 - time.Millisecond)
	if err := fx.s.Sweep(fx.ctx, fx.now); err != nil {
		t.Fatal(err)
	}
	fx.wantOwner([]string{"x", "revoked", "replaced", "later", "reclaimed"}, a)
	fx.advance(time.Millisecond)
	fx.beat(a, 10, false, false)
	if err := fx.s.Sweep(fx.ctx, fx.now); err != nil {
		t.Fatal(err)
	}
	fx.wantFreed([]string{"x", "reclaimed"})
	if _, ok := fx.lookup("/c", "x"); ok {
		t.Fatalf("unexpected route to a placement freed at its wind-down's deadline")
	}
	fx.wantOwner([]string{"revoked", "replaced", "later"}, a)
	fx.advance(TTL / 2)
	fx.beat(a, 10, false, false)
	if err := fx.s.Sweep(fx.ctx, fx.now); err != nil {
		t.Fatal(err)
	}
	fx.wantFreed([]string{"later"})
	fx.wantOwner([]string{"revoked", "replaced"}, a)
}

// testControlMessagesReregister: a wind_down queued for an id is still
// delivered after the worker lost its session and re-registered with
// prevSessionId, reclaiming the id; one for an id it did not reclaim goes
// with the old session.
func testControlMessagesReregister(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	a := fx.register("a", []string{"/c"}, 10)
	fx.place("/c", "x")
	fx.place("/c", "y")
	deadline := fx.now.Add(30 * time.Second)
	keep, _, err := fx.s.WindDown(fx.ctx, "/c", "x", "", &deadline, fx.now)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := fx.s.WindDown(fx.ctx, "/c", "y", "", &deadline, fx.now); err != nil {
		t.Fatal(err)
	}
	res, err := fx.s.Register(fx.ctx, &directory.Registration{ClientID: "a", Sub: "test:worker", Secret: "s", Namespaces: []string{"/c"},
		AdvertiseURL: "http://127.0.0.1:9/a", Headroom: 10, PrevSessionID: a, Instances: map[string][]string{"/c": {"x"}}}, fx.now)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		beat := fx.beat(res.SessionID, 10, false, false)
		if len(beat.Messages) != 1 || beat.Messages[0].MsgID != keep || beat.Messages[0].ID != "x" || !beat.Messages[0].Deadline.Equal(deadline) {
			t.Fatalf("unexpected messages after re-registration; got %+v; want the wind_down for x, until acked", beat.Messages)
		}
	}
	if beat := fx.beat(res.SessionID, 10, false, false, keep); len(beat.Messages) != 0 {
		t.Fatalf("unexpected messages after the ack; got %+v", beat.Messages)
	}
}
