package directorytest

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
)

// A registration reclaims the instances it lists directory.RegisterBatch
// at a time, each batch one atomic step of the store, so that other calls
// proceed in between (docs/DIRECTORY.md, "Scripts"). These tests pin down
// that the result is still the one a single atomic step would give.

// ids returns n instance ids, "i0000" on.
func ids(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("i%04d", i)
	}
	return out
}

// registerListing registers client a (account test:worker) serving /c,
// continuing prev ("" for none) and listing instances.
func (fx *fixture) registerListing(prev string, instances map[string][]string) (*directory.RegisterResult, error) {
	return fx.s.Register(fx.ctx, &directory.Registration{
		ClientID: "a", Sub: "test:worker", Secret: "secret-a", Namespaces: []string{"/c"},
		AdvertiseURL: "http://127.0.0.1:9/a", Headroom: 100, PrevSessionID: prev, Instances: instances,
	}, fx.now)
}

// holding registers client a holding every id of /c in list.
func (fx *fixture) holding(list []string) string {
	fx.t.Helper()
	res, err := fx.registerListing("", map[string][]string{"/c": list})
	if err != nil || len(res.Duplicates) != 0 {
		fx.t.Fatalf("cannot register a holding %d ids; got %+v, %v", len(list), res, err)
	}
	return res.SessionID
}

// wantOwner fails unless every id of /c in list resolves to sid.
func (fx *fixture) wantOwner(list []string, sid string) {
	fx.t.Helper()
	for _, id := range list {
		if r, ok := fx.lookup("/c", id); !ok || r.Owner.SessionID != sid {
			fx.t.Fatalf("unexpected owner of %s; got %+v, %v; want %s", id, r, ok, sid)
		}
	}
}

// sessionsOf returns the live sessions of a client id.
func (fx *fixture) sessionsOf(client string) []string {
	fx.t.Helper()
	ws, err := fx.s.Workers(fx.ctx, fx.now)
	if err != nil {
		fx.t.Fatalf("cannot list workers: %v", err)
	}
	var out []string
	for _, w := range ws {
		if w.ClientID == client {
			out = append(out, w.SessionID)
		}
	}
	return out
}

// testReregisterAcrossBatches: a re-registration listing more instances
// than one batch gets exactly what one atomic step gives (R-REG-1): the
// ids another live session took meanwhile and the ids of a namespace the
// worker does not serve are duplicates, in the order listed, on both
// sides of every batch boundary; every other id — one listed twice
// across batches too — is the new session's; the old session is gone.
func testReregisterAcrossBatches(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	const b = directory.RegisterBatch
	list := ids(2*b + b/2)
	old := fx.holding(list)
	// a freezes past its lease; w, the only live worker, takes the ids at
	// the batch boundaries.
	fx.advance(TTL)
	w := fx.register("w", []string{"/c"}, 1e6)
	var want []directory.NSID
	for _, i := range []int{0, b - 1, b, b + 1, 2*b - 1, 2 * b, len(list) - 1} {
		if r := fx.place("/c", list[i]); r.Owner.SessionID != w {
			t.Fatalf("unexpected owner of %s; got %s; want %s", list[i], r.Owner.SessionID, w)
		}
		want = append(want, directory.NSID{NS: "/c", ID: list[i]})
	}
	want = append(want, directory.NSID{NS: "/other", ID: "q"})
	// a wakes and re-registers, listing i0003 a second time after the
	// last batch boundary.
	res, err := fx.registerListing(old, map[string][]string{"/c": append(slices.Clone(list), list[3]), "/other": {"q"}})
	if err != nil {
		t.Fatalf("cannot re-register: %v", err)
	}
	if !slices.Equal(res.Duplicates, want) {
		t.Fatalf("unexpected duplicates; got %v; want %v", res.Duplicates, want)
	}
	taken := make(map[string]bool)
	for _, d := range want {
		taken[d.ID] = true
	}
	for _, id := range list {
		owner := res.SessionID
		if taken[id] {
			owner = w
		}
		fx.wantOwner([]string{id}, owner)
	}
	info, err := fx.s.Session(fx.ctx, res.SessionID, fx.now)
	if err != nil || info.Placements != len(list)-len(want)+1 {
		t.Fatalf("unexpected new session; got %+v, %v; want %d placements", info, err, len(list)-len(want)+1)
	}
	if _, err := fx.s.Session(fx.ctx, old, fx.now); !errors.Is(err, directory.ErrUnknownSession) {
		t.Fatalf("unexpected old session; got %v; want ErrUnknownSession", err)
	}
	if s := fx.sessionsOf("a"); len(s) != 1 {
		t.Fatalf("unexpected sessions of a; got %v; want only %s", s, res.SessionID)
	}
}

// testSupersededRowsAreDuplicates: a registration that supersedes a
// session bound to its hostname (R-LS-4) finds the ids that session held
// taken — they belonged to another live session when it came — whether
// it lists one batch or several: they are duplicates and freed with the
// superseded session; the free ids it lists are its own (R-REG-1).
func testSupersededRowsAreDuplicates(t *testing.T, f Factory) {
	for _, n := range []int{4, 3*directory.RegisterBatch + 1} {
		t.Run(fmt.Sprintf("listed=%d", n), func(t *testing.T) {
			fx := newFixture(t, f)
			fx.warm()
			list := ids(n)
			held := list[n/2:]
			res, err := fx.s.Register(fx.ctx, &directory.Registration{
				ClientID: "blue", Sub: "test:worker", Secret: "s", Namespaces: []string{"/c"},
				AdvertiseURL: "http://127.0.0.1:9/blue", Headroom: 10, Hostname: "app.example", Env: "blue", Epoch: 1,
				Instances: map[string][]string{"/c": held},
			}, fx.now)
			if err != nil || len(res.Duplicates) != 0 {
				t.Fatalf("cannot register blue: %+v, %v", res, err)
			}
			blue := res.SessionID
			res, err = fx.s.Register(fx.ctx, &directory.Registration{
				ClientID: "green", Sub: "test:worker", Secret: "s", Namespaces: []string{"/c"},
				AdvertiseURL: "http://127.0.0.1:9/green", Headroom: 10, Hostname: "app.example", Env: "green", Epoch: 2,
				Instances: map[string][]string{"/c": list},
			}, fx.now)
			if err != nil {
				t.Fatalf("cannot register green: %v", err)
			}
			if len(res.Duplicates) != len(held) || res.Duplicates[0].ID != held[0] || res.Duplicates[len(held)-1].ID != held[len(held)-1] {
				t.Fatalf("unexpected duplicates; got %d, %v; want the %d ids blue held", len(res.Duplicates), res.Duplicates[:min(4, len(res.Duplicates))], len(held))
			}
			fx.wantOwner(list[:n/2], res.SessionID)
			for _, id := range held {
				if _, err := fx.s.Placement(fx.ctx, "/c", id, fx.now); !errors.Is(err, directory.ErrNoPlacement) {
					t.Fatalf("unexpected placement of %s after its owner was superseded; got %v", id, err)
				}
			}
			_, err = fx.s.Session(fx.ctx, blue, fx.now)
			wantSuperseded(t, err, "app.example", "/c", "green", 2)
		})
	}
}

// BatchHook installs fn on s: s calls it between two batches of the
// instances a registration reclaims, while the store is not held
// (directory's export_test.go: SetAfterRegisterBatch).
type BatchHook func(s directory.Store, fn func())

// RunBetweenBatches runs the tests of what may happen between two batches
// of a registration, against stores from f with hook installed.
func RunBetweenBatches(t *testing.T, f Factory, hook BatchHook) {
	tests := []struct {
		name string
		fn   func(t *testing.T, f Factory, hook BatchHook)
	}{
		{"OtherCallsProceed_RREG1", testOtherCallsBetweenBatches},
		{"SupersededBetweenBatches_RLS4", testSupersededBetweenBatches},
		{"ReregisteredBetweenBatches_RREG1", testReregisteredBetweenBatches},
		{"EarlierDeregisteredBetweenBatches_RREG1_RREG3", testEarlierDeregisteredBetweenBatches},
		{"ControlMessagesKeepOrderBetweenBatches_RCM1", testControlMessagesOrderBetweenBatches},
		{"ControlMessagesOrderAcrossEarlierSessions_RCM1", testControlMessagesOrderAcrossEarlierSessions},
		{"SupersededRowPlacedBetweenBatches_RLS4_RREG1", testSupersededRowPlacedBetweenBatches},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, f, hook) })
	}
}

// once runs fn at the first call only.
func once(fn func()) func() {
	done := false
	return func() {
		if !done {
			done = true
			fn()
		}
	}
}

// testOtherCallsBetweenBatches: while a worker re-registers listing three
// batches of instances, the store serves other calls between the batches:
// another worker's heartbeat and a new placement complete there, and the
// re-registration's result is unaffected (R-REG-1).
func testOtherCallsBetweenBatches(t *testing.T, f Factory, hook BatchHook) {
	fx := newFixture(t, f)
	fx.warm()
	list := ids(3 * directory.RegisterBatch)
	old := fx.holding(list)
	w := fx.register("w", []string{"/c"}, 10)
	calls := 0
	hook(fx.s, func() {
		calls++
		fx.beat(w, 10, false, false)
		fx.place("/c", fmt.Sprintf("new%d", calls))
	})
	res, err := fx.registerListing(old, map[string][]string{"/c": list})
	if err != nil || len(res.Duplicates) != 0 {
		t.Fatalf("unexpected re-registration; got %+v, %v; want no duplicates", res, err)
	}
	if calls != 2 {
		t.Fatalf("unexpected calls between batches; got %d; want 2 (three batches)", calls)
	}
	fx.wantOwner(list, res.SessionID)
}

// testSupersededBetweenBatches: a registration at a higher epoch for the
// same hostname supersedes the new session between two of its batches
// (R-LS-4). The registration fails with the superseded error, and no row
// is left pointing at the session it opened: what it reclaimed was freed
// with it, and nothing more was written for it.
func testSupersededBetweenBatches(t *testing.T, f Factory, hook BatchHook) {
	fx := newFixture(t, f)
	fx.warm()
	list := ids(3 * directory.RegisterBatch)
	reg := &directory.Registration{
		ClientID: "a", Sub: "test:worker", Secret: "secret-a", Namespaces: []string{"/c"},
		AdvertiseURL: "http://127.0.0.1:9/a", Headroom: 10, Hostname: "app.example", Env: "blue", Epoch: 1,
		Instances: map[string][]string{"/c": list},
	}
	res, err := fx.s.Register(fx.ctx, reg, fx.now)
	if err != nil {
		t.Fatal(err)
	}
	old := res.SessionID
	var opened string
	hook(fx.s, once(func() {
		for _, sid := range fx.sessionsOf("a") {
			if sid != old {
				opened = sid
			}
		}
		if _, err := fx.registerBound("green", "app.example", "green", 2, "", "/c"); err != nil {
			t.Errorf("cannot register the higher epoch: %v", err)
		}
	}))
	reg.PrevSessionID = old
	_, err = fx.s.Register(fx.ctx, reg, fx.now)
	wantSuperseded(t, err, "app.example", "/c", "green", 2)
	if opened == "" {
		t.Fatalf("unexpected registration; no session of a opened before the first batch boundary")
	}
	for _, id := range list {
		p, err := fx.s.Placement(fx.ctx, "/c", id, fx.now)
		if err == nil && p.SessionID == opened {
			t.Fatalf("unexpected row of %s left pointing at the superseded session %s", id, opened)
		}
	}
	if s := fx.sessionsOf("a"); len(s) != 0 {
		t.Fatalf("unexpected live sessions of a; got %v; want none (both superseded)", s)
	}
}

// testReregisteredBetweenBatches: the worker gave up waiting and
// registered again, and that registration ran between two batches of the
// first (R-REG-1: process continuity). The later one takes over the
// session the first opened and every id as its own; the first fails, as
// its session is gone, and writes nothing more.
func testReregisteredBetweenBatches(t *testing.T, f Factory, hook BatchHook) {
	fx := newFixture(t, f)
	fx.warm()
	list := ids(3 * directory.RegisterBatch)
	old := fx.holding(list)
	var later *directory.RegisterResult
	hook(fx.s, once(func() {
		var err error
		if later, err = fx.registerListing(old, map[string][]string{"/c": list}); err != nil {
			t.Errorf("cannot register again: %v", err)
		}
	}))
	_, err := fx.registerListing(old, map[string][]string{"/c": list})
	var se *directory.SupersededError
	if err == nil || errors.As(err, &se) {
		t.Fatalf("unexpected result of the first registration; got %v; want its session gone", err)
	}
	if later == nil || len(later.Duplicates) != 0 {
		t.Fatalf("unexpected later registration; got %+v; want every id its own", later)
	}
	fx.wantOwner(list, later.SessionID)
	if s := fx.sessionsOf("a"); !slices.Equal(s, []string{later.SessionID}) {
		t.Fatalf("unexpected sessions of a; got %v; want only %s", s, later.SessionID)
	}
	if info, err := fx.s.Session(fx.ctx, later.SessionID, fx.now); err != nil || info.Placements != len(list) {
		t.Fatalf("unexpected later session; got %+v, %v; want %d placements", info, err, len(list))
	}
}

// testEarlierDeregisteredBetweenBatches: the earlier session deregisters
// between two batches (R-REG-3): the ids it still held are freed, and the
// re-registration claims them all the same, none a duplicate (R-REG-1).
func testEarlierDeregisteredBetweenBatches(t *testing.T, f Factory, hook BatchHook) {
	fx := newFixture(t, f)
	fx.warm()
	list := ids(3 * directory.RegisterBatch)
	old := fx.holding(list)
	deregistered := false
	hook(fx.s, once(func() {
		if err := fx.s.Deregister(fx.ctx, old, fx.now); err != nil {
			t.Errorf("cannot deregister: %v", err)
		}
		deregistered = true
	}))
	res, err := fx.registerListing(old, map[string][]string{"/c": list})
	if err != nil || len(res.Duplicates) != 0 {
		t.Fatalf("unexpected re-registration; got %+v, %v; want no duplicates", res, err)
	}
	if !deregistered {
		t.Fatalf("unexpected re-registration of %d ids in one batch; want the earlier session deregistered between two", len(list))
	}
	fx.wantOwner(list, res.SessionID)
}

// testReleaseBatch: a worker's release batch (RegistrationClient.
// _flush_releases) frees, across several RegisterBatch steps, exactly the
// rows a plain Release of each item would: its session's rows at their
// epoch or any epoch, not one at another epoch, not another session's row
// named with its session, nothing twice (R-REG-3).
func testReleaseBatch(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	list := ids(2*directory.RegisterBatch + 10)
	a := fx.holding(list)
	res, err := fx.s.Register(fx.ctx, &directory.Registration{
		ClientID: "b", Sub: "test:worker", Secret: "secret-b", Namespaces: []string{"/c"},
		AdvertiseURL: "http://127.0.0.1:9/b", Headroom: 1, Instances: map[string][]string{"/c": {"bx"}},
	}, fx.now)
	if err != nil || len(res.Duplicates) != 0 {
		t.Fatalf("cannot register b: %+v, %v", res, err)
	}
	b := res.SessionID
	bx, _ := fx.lookup("/c", "bx")
	var reqs []directory.ReleaseRequest
	for i, id := range list {
		r, ok := fx.lookup("/c", id)
		if !ok || r.Owner.SessionID != a {
			t.Fatalf("unexpected row of %s; got %+v, %v; want %s", id, r, ok, a)
		}
		rr := directory.ReleaseRequest{SessionID: a, NS: "/c", ID: id, Epoch: r.Epoch}
		switch i {
		case 0:
			rr.Epoch++ // another epoch: kept
		case 1:
			rr.Epoch = 0 // any epoch
		case 2:
			reqs = append(reqs, rr) // listed twice: freed once
		}
		reqs = append(reqs, rr)
	}
	reqs = append(reqs,
		directory.ReleaseRequest{SessionID: a, NS: "/c", ID: "bx"},                      // b's row
		directory.ReleaseRequest{SessionID: b, NS: "/c", ID: "bx", Epoch: bx.Epoch + 1}, // b's, another epoch
		directory.ReleaseRequest{SessionID: a, NS: "/c", ID: "nobody"},
	)
	n, err := fx.s.ReleaseBatch(fx.ctx, reqs, fx.now)
	if err != nil || n != len(list)-1 {
		t.Fatalf("unexpected release batch; got %d, %v; want %d freed", n, err, len(list)-1)
	}
	if r, ok := fx.lookup("/c", list[0]); !ok || r.Owner.SessionID != a {
		t.Fatalf("unexpected row of %s released at another epoch; got %+v, %v; want kept on %s", list[0], r, ok, a)
	}
	if r, ok := fx.lookup("/c", "bx"); !ok || r.Owner.SessionID != b || r.Epoch != bx.Epoch {
		t.Fatalf("unexpected row of bx; got %+v, %v; want kept on %s", r, ok, b)
	}
	for _, id := range list[1:] {
		if r, ok := fx.lookup("/c", id); ok {
			t.Fatalf("unexpected row of %s after its release; got %+v", id, r)
		}
		if p, err := fx.s.Placement(fx.ctx, "/c", id, fx.now); !errors.Is(err, directory.ErrNoPlacement) {
			t.Fatalf("unexpected placement of %s after its release; got %+v, %v", id, p, err)
		}
	}
	if ws := fx.sessionsOf("a"); len(ws) != 1 {
		t.Fatalf("unexpected sessions of a; got %v", ws)
	}
	if n, err := fx.s.ReleaseBatch(fx.ctx, nil, fx.now); n != 0 || err != nil {
		t.Fatalf("unexpected empty release batch; got %d, %v", n, err)
	}
}

// testControlMessagesOrderBetweenBatches: a wind-down queued for an id
// before the worker re-registers, and its revoke queued between two
// batches of that registration — once the id is the new session's — are
// delivered in the order they were queued (R-CM-1: null revokes an
// earlier wind-down). The earlier session's messages were appended after
// the new session's, so the worker applied the revoke first and then the
// wind-down: the instance it was told to keep was aborted.
func testControlMessagesOrderBetweenBatches(t *testing.T, f Factory, hook BatchHook) {
	fx := newFixture(t, f)
	fx.warm()
	list := ids(2 * directory.RegisterBatch)
	old := fx.holding(list)
	deadline := fx.now.Add(30 * time.Second)
	windDown, _, err := fx.s.WindDown(fx.ctx, "/c", list[0], "", &deadline, fx.now)
	if err != nil {
		t.Fatalf("cannot wind down: %v", err)
	}
	var revoke string
	hook(fx.s, once(func() {
		var err error
		if revoke, _, err = fx.s.WindDown(fx.ctx, "/c", list[0], "", nil, fx.now); err != nil {
			t.Errorf("cannot revoke between batches: %v", err)
		}
	}))
	res, err := fx.registerListing(old, map[string][]string{"/c": list})
	if err != nil || len(res.Duplicates) != 0 {
		t.Fatalf("unexpected re-registration; got %+v, %v; want no duplicates", res, err)
	}
	fx.wantWindDownThenRevoke(res.SessionID, windDown, revoke)
}

// wantWindDownThenRevoke requires the next heartbeat of session to carry
// the wind-down, then its revoke, and nothing else (R-CM-1).
func (fx *fixture) wantWindDownThenRevoke(session, windDown, revoke string) {
	fx.t.Helper()
	beat := fx.beat(session, 100, false, false)
	var got []string
	for _, m := range beat.Messages {
		got = append(got, m.MsgID)
	}
	if want := []string{windDown, revoke}; !slices.Equal(got, want) {
		fx.t.Fatalf("unexpected messages; got %v; want the wind-down then its revoke %v", got, want)
	}
}

// testControlMessagesOrderAcrossEarlierSessions: the worker's
// registration (naming its session as previous) is between two batches
// when the worker, its answer late, registers again naming the same
// previous session. The id's wind-down was queued on the first session,
// its revoke on the session the interrupted registration opened (which
// held the id by then). The second registration hands both earlier
// sessions over: the worker must get the wind-down before its revoke
// (R-CM-1), whatever order the store keeps the earlier sessions in.
func testControlMessagesOrderAcrossEarlierSessions(t *testing.T, f Factory, hook BatchHook) {
	fx := newFixture(t, f)
	fx.warm()
	list := ids(2 * directory.RegisterBatch)
	old := fx.holding(list)
	deadline := fx.now.Add(30 * time.Second)
	windDown, _, err := fx.s.WindDown(fx.ctx, "/c", list[0], "", &deadline, fx.now)
	if err != nil {
		t.Fatalf("cannot wind down: %v", err)
	}
	var revoke string
	var later *directory.RegisterResult
	hook(fx.s, once(func() {
		var err error
		if revoke, _, err = fx.s.WindDown(fx.ctx, "/c", list[0], "", nil, fx.now); err != nil {
			t.Errorf("cannot revoke between batches: %v", err)
		}
		if later, err = fx.registerListing(old, map[string][]string{"/c": list}); err != nil {
			t.Errorf("cannot register again: %v", err)
		}
	}))
	_, _ = fx.registerListing(old, map[string][]string{"/c": list})
	if later == nil {
		t.Fatal("the second registration did not run between batches")
	}
	fx.wantWindDownThenRevoke(later.SessionID, windDown, revoke)
}

// testSupersededRowPlacedBetweenBatches: green supersedes blue (R-LS-4)
// while listing more than one batch, one of them an id blue held. Between
// two batches a request places that id, on green's new session (the only
// eligible one). Whatever the store answers, the worker and the directory
// must agree (R-REG-1, R-PL-1): an id reported as a duplicate (the worker
// aborts it) is not routed to the session, and one routed to the session
// is not reported as a duplicate.
func testSupersededRowPlacedBetweenBatches(t *testing.T, f Factory, hook BatchHook) {
	fx := newFixture(t, f)
	fx.warm()
	list := ids(2 * directory.RegisterBatch)
	x := list[len(list)-1]
	if _, err := fx.s.Register(fx.ctx, &directory.Registration{
		ClientID: "blue", Sub: "test:worker", Secret: "s", Namespaces: []string{"/c"},
		AdvertiseURL: "http://127.0.0.1:9/blue", Headroom: 10, Hostname: "app.example", Env: "blue", Epoch: 1,
		Instances: map[string][]string{"/c": {x}},
	}, fx.now); err != nil {
		t.Fatal(err)
	}
	hook(fx.s, once(func() { fx.place("/c", x) }))
	res, err := fx.s.Register(fx.ctx, &directory.Registration{
		ClientID: "green", Sub: "test:worker", Secret: "s", Namespaces: []string{"/c"},
		AdvertiseURL: "http://127.0.0.1:9/green", Headroom: 10, Hostname: "app.example", Env: "green", Epoch: 2,
		Instances: map[string][]string{"/c": list},
	}, fx.now)
	if err != nil {
		t.Fatalf("cannot register green: %v", err)
	}
	dup := slices.Contains(res.Duplicates, directory.NSID{NS: "/c", ID: x})
	p, err := fx.s.Placement(fx.ctx, "/c", x, fx.now)
	routed := err == nil && p.SessionID == res.SessionID
	if dup == routed {
		t.Fatalf("unexpected %s: duplicate=%v, routed to green's session=%v; want exactly one", x, dup, routed)
	}
}
