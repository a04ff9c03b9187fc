// Package directorytest is the directory.Store contract suite. Every store
// (memory:, Redis, Redis Cluster) runs the same tests, so behaviour the
// registry and proxy rely on cannot drift between them.
package directorytest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
)

// TTL is the lease the suite asks factories for.
const TTL = 2 * time.Second

// Factory returns a fresh, empty store with the given lease TTL whose
// epoch counter is seeded at now. The suite closes it.
type Factory func(t *testing.T, ttl time.Duration, now time.Time) directory.Store

// Run runs the whole contract against stores from f.
func Run(t *testing.T, f Factory) {
	tests := []struct {
		name string
		fn   func(t *testing.T, f Factory)
	}{
		{"ColdStartQuarantine_RCS1", testColdStart},
		{"UnknownNamespace_RPL5", testUnknownNamespace},
		{"ConcurrentClaimsOneOwner_RPL1", testConcurrentClaims},
		{"StickyUntilLeaseLapses_RPL2_RLS2", testSticky},
		{"RetainedIdlePlacementsStay_RPL2", testRetainedIdle},
		{"HeadroomDecrement_RPL3", testHeadroomDecrement},
		{"ZeroHeadroomStaysEligible_RPL3", testZeroHeadroom},
		{"FractionalHeadroomDecrement_RPL3_RREG4", testFractionalHeadroom},
		{"DrainingAndDegradedNotEligible_RPL1_RLS3", testIneligible},
		{"HeartbeatRenews_RLS1", testHeartbeatRenews},
		{"HeartbeatUnknownAndForbidden_RREG2_RLS2", testHeartbeatErrors},
		{"ReregisterReclaimsAndDuplicates_RREG1", testReregister},
		{"LostRegisterAnswerIsNoDuplicate_RREG1", testLostRegisterAnswer},
		{"ReclaimKeepsEpoch_RREG1_RREG3", testReclaimKeepsEpoch},
		{"ReleaseAndDeregister_RREG3", testRelease},
		{"ReleaseBatch_RREG3", testReleaseBatch},
		{"VoidDropsRecords_RLS3", testVoid},
		{"URLTakeoverVoidsEarlierProcess_RLS3", testURLTakeover},
		{"EpochsGrowPerID_RPL2", testEpochs},
		{"WorkersListing_RREG4", testWorkers},
		{"OperatorDrain_RREG6", testOperatorDrain},
		{"TimedDrainCapsLeaseAndForcesRelease_RLS5", testTimedDrain},
		{"SpentTimedDrainDoesNotLockOut_RLS5", testSpentTimedDrain},
		{"ControlMessagesFollowReclaimedIDs_RCM1", testControlMessagesReregister},
		{"UndrainWithoutLiveSession_RREG6", testUndrainWithoutSession},
		{"ControlMessages_RCM1", testControlMessages},
		{"WindDownDeadlineFreesPlacement_RCM1", testWindDownFrees},
		{"ExcludeRefusingWorker_RPL6", testExclude},
		{"CandidatesInSessionOrder_RPL1_RPL4", testCandidatesInSessionOrder},
		{"SweepRemovesDeadSessions", testSweep},
		{"ExpiredCountedUntilSwept_RLS2", testExpired},
		{"HostnameBindingsSupersede_RLS4", testSupersede},
		{"HeldBindingSurvivesSweep_RLS4", testHeldBindingSurvivesSweep},
		{"HostnameRoutesNewPlacements_RLS4", testHostRouting},
		{"HostnameASCIIFold_RLS4", testHostnameASCIIFold},
		{"PlacementReportsLiveness_RLS2", testPlacementLiveness},
		{"WindDownNeedsLiveOwner_RCM1", testWindDownDeadOwner},
		{"WindDownChecksNamedOwner_RCM1", testWindDownNamedOwner},
		{"DegradedSinceKeepsFirstFailure_RLS3", testDegradedSince},
		{"StaleReleaseKeepsNewOwner_RREG3", testStaleRelease},
		{"ReclaimedOwnerServesDuringQuarantine_RCS1", testReclaimDuringQuarantine},
		{"LookupDoesNotAllocate", testLookupAllocs},
		{"NamespaceBytesKept_RREG4_RPL5", testNamespaceBytes},
		{"InstanceListedTwiceIsNoDuplicate_RREG1", testInstanceListedTwice},
		{"ReregisterAcrossBatches_RREG1", testReregisterAcrossBatches},
		{"SupersededRowsAreDuplicates_RLS4_RREG1", testSupersededRowsAreDuplicates},
		{"DeregisterAcrossBatches_RREG3", testDeregisterAcrossBatches},
		{"VoidAcrossBatches_RLS3", testVoidAcrossBatches},
		{"SweepAcrossBatches_RLS2", testSweepAcrossBatches},
		{"DroppedEarlierAndSupersededAcrossBatches_RREG1_RLS4", testDroppedEarlierAcrossBatches},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, f) })
	}
}

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

type fixture struct {
	t   *testing.T
	s   directory.Store
	now time.Time
	ctx context.Context
}

func newFixture(t *testing.T, f Factory) *fixture {
	t.Helper()
	s := f(t, TTL, t0)
	t.Cleanup(func() { _ = s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return &fixture{t: t, s: s, now: t0, ctx: ctx}
}

func (fx *fixture) advance(d time.Duration) { fx.now = fx.now.Add(d) }

func (fx *fixture) register(client string, ns []string, headroom float64) string {
	fx.t.Helper()
	res, err := fx.s.Register(fx.ctx, &directory.Registration{
		ClientID:     client,
		Sub:          "test:worker",
		Secret:       "secret-" + client,
		Namespaces:   ns,
		AdvertiseURL: "http://127.0.0.1:9/" + client,
		Headroom:     headroom,
	}, fx.now)
	if err != nil {
		fx.t.Fatalf("cannot register %s: %v", client, err)
	}
	return res.SessionID
}

func (fx *fixture) beat(session string, headroom float64, draining, degraded bool, acks ...string) *directory.BeatResult {
	fx.t.Helper()
	res, err := fx.s.Heartbeat(fx.ctx, &directory.Beat{
		SessionID: session, Sub: "test:worker", Headroom: headroom,
		Draining: draining, Degraded: degraded, Acks: acks,
	}, fx.now)
	if err != nil {
		fx.t.Fatalf("unexpected heartbeat error for %s: %v", session, err)
	}
	return res
}

// warm runs the first placement attempt and waits out the quarantine.
func (fx *fixture) warm() {
	fx.t.Helper()
	_, err := fx.s.Place(fx.ctx, &directory.PlaceRequest{NS: "/warm", ID: "x", Now: fx.now})
	var q *directory.QuarantineError
	if !errors.As(err, &q) {
		fx.t.Fatalf("unexpected first placement result; got %v; want a quarantine", err)
	}
	fx.advance(q.Remaining)
}

func (fx *fixture) place(ns, id string) directory.Route {
	fx.t.Helper()
	r, err := fx.s.Place(fx.ctx, &directory.PlaceRequest{NS: ns, ID: id, Now: fx.now})
	if err != nil {
		fx.t.Fatalf("cannot place %s/%s: %v", ns, id, err)
	}
	return r
}

func (fx *fixture) lookup(ns, id string) (directory.Route, bool) {
	return fx.s.Lookup([]byte(ns), []byte(id), fx.now)
}

func testColdStart(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	if q, err := fx.s.Quarantine(fx.ctx, fx.now); err != nil || q != 0 {
		t.Fatalf("unexpected quarantine before the first attempt; got %v, %v; want 0", q, err)
	}
	a := fx.register("a", []string{"/c"}, 10)
	_, err := fx.s.Place(fx.ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: fx.now})
	var qe *directory.QuarantineError
	if !errors.As(err, &qe) || qe.Remaining != TTL {
		t.Fatalf("unexpected first placement; got %v; want quarantine of %v", err, TTL)
	}
	fx.advance(TTL / 2)
	if q, err := fx.s.Quarantine(fx.ctx, fx.now); err != nil || q != TTL/2 {
		t.Fatalf("unexpected quarantineMs; got %v, %v; want %v", q, err, TTL/2)
	}
	// Unknown namespaces are quarantined too: after a wipe nobody has
	// re-registered yet, and a 404 would be a lie.
	_, err = fx.s.Place(fx.ctx, &directory.PlaceRequest{NS: "/nobody", ID: "x", Now: fx.now})
	if !errors.As(err, &qe) {
		t.Fatalf("unexpected placement during quarantine; got %v; want quarantine", err)
	}
	fx.beat(a, 10, false, false)
	// The quarantine lasts the whole lease: a millisecond before its end
	// placement still refuses, with that millisecond left.
	fx.advance(TTL/2 - time.Millisecond)
	_, err = fx.s.Place(fx.ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: fx.now})
	if !errors.As(err, &qe) || qe.Remaining != time.Millisecond {
		t.Fatalf("unexpected placement 1ms before the quarantine ends; got %v; want a quarantine of 1ms", err)
	}
	fx.advance(time.Millisecond)
	r := fx.place("/c", "x")
	if !r.Placed {
		t.Fatalf("unexpected route after quarantine; got %+v; want a new placement", r)
	}
	if q, err := fx.s.Quarantine(fx.ctx, fx.now); err != nil || q != 0 {
		t.Fatalf("unexpected quarantine after it passed; got %v, %v; want 0, nil", q, err)
	}
}

func testUnknownNamespace(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	fx.register("a", []string{"/c"}, 10)
	_, err := fx.s.Place(fx.ctx, &directory.PlaceRequest{NS: "/other", ID: "x", Now: fx.now})
	if !errors.Is(err, directory.ErrUnknownNamespace) {
		t.Fatalf("unexpected error; got %v; want ErrUnknownNamespace", err)
	}
}

func testConcurrentClaims(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	for i := range 4 {
		fx.register(fmt.Sprintf("w%d", i), []string{"/c"}, 100)
	}
	const n = 64
	owners := make([]string, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := fx.s.Place(fx.ctx, &directory.PlaceRequest{NS: "/c", ID: "hot", Now: fx.now})
			if err != nil {
				errs <- err
				return
			}
			owners[i] = r.Owner.SessionID
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("cannot place: %v", err)
	}
	for i := 1; i < n; i++ {
		if owners[i] != owners[0] {
			t.Fatalf("unexpected second owner; got %s and %s; want one owner", owners[0], owners[i])
		}
	}
	r, ok := fx.lookup("/c", "hot")
	if !ok || r.Owner.SessionID != owners[0] {
		t.Fatalf("unexpected lookup; got %+v, %v; want %s", r, ok, owners[0])
	}
}

func testSticky(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	a := fx.register("a", []string{"/c"}, 10)
	first := fx.place("/c", "x")
	if first.Owner.SessionID != a || first.Replaced {
		t.Fatalf("unexpected owner; got %+v; want a new placement on %s", first, a)
	}
	b := fx.register("b", []string{"/c"}, 1000)
	for range 5 {
		if r := fx.place("/c", "x"); r.Owner.SessionID != a || r.Placed {
			t.Fatalf("unexpected re-placement while a is live; got %+v", r)
		}
	}
	// a stops heartbeating; b keeps beating. Past a's lease the id moves.
	fx.advance(TTL - time.Millisecond)
	fx.beat(b, 1000, false, false)
	if _, ok := fx.lookup("/c", "x"); !ok {
		t.Fatalf("unexpected miss inside the lease")
	}
	fx.advance(time.Millisecond)
	if _, ok := fx.lookup("/c", "x"); ok {
		t.Fatalf("unexpected lookup hit once the owner's lease lapsed")
	}
	r := fx.place("/c", "x")
	if r.Owner.SessionID != b || !r.Placed || !r.Replaced {
		t.Fatalf("unexpected re-placement; got %+v; want new placement on %s, replacing a's row", r, b)
	}
	if r.Epoch <= first.Epoch {
		t.Fatalf("unexpected epoch; got %d; want > %d", r.Epoch, first.Epoch)
	}
}

// testRetainedIdle: a placement nobody requests stays with its owner, same
// epoch, for as long as the owner heartbeats — many leases, sweeps
// between — and is not re-placed when it is asked for again (R-PL-2:
// retained idle placements stay).
func testRetainedIdle(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	a := fx.register("a", []string{"/c"}, 10)
	first := fx.place("/c", "idle")
	b := fx.register("b", []string{"/c"}, 1000)
	for range 10 {
		fx.advance(TTL - 100*time.Millisecond)
		fx.beat(a, 10, false, false)
		fx.beat(b, 1000, false, false)
		if err := fx.s.Sweep(fx.ctx, fx.now); err != nil {
			t.Fatalf("cannot sweep: %v", err)
		}
	}
	if r, ok := fx.lookup("/c", "idle"); !ok || r.Owner.SessionID != a || r.Epoch != first.Epoch {
		t.Fatalf("unexpected lookup of an idle placement ten leases on; got %+v, %v; want %s at epoch %d", r, ok, a, first.Epoch)
	}
	if r := fx.place("/c", "idle"); r.Owner.SessionID != a || r.Placed || r.Epoch != first.Epoch {
		t.Fatalf("unexpected resolve of an idle placement; got %+v; want the existing one on %s", r, a)
	}
}

// A placement subtracts one unit from a fractional headroom in float64
// arithmetic on every store (R-PL-3), so the workers listing (R-REG-4)
// and the policy's comparisons see the same value. Redis's HINCRBYFLOAT
// computed in long double: 1.1 less one was 0.1 there and
// 0.10000000000000009 in memory, so a worker reporting 0.1 tied with it
// on one store and not on the other.
func testFractionalHeadroom(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	a := fx.register("a", []string{"/c"}, 1.1)
	want := 1.1
	for i := range 3 {
		if r := fx.place("/c", fmt.Sprintf("id%d", i)); r.Owner.SessionID != a {
			t.Fatalf("unexpected owner of id%d; got %s; want a", i, r.Owner.SessionID)
		}
		want--
		info, err := fx.s.Session(fx.ctx, a, fx.now)
		if err != nil {
			t.Fatal(err)
		}
		if info.Headroom != want {
			t.Fatalf("unexpected headroom after %d placements from 1.1; got %v; want %v (float64)", i+1, info.Headroom, want)
		}
	}
	ws, err := fx.s.Workers(fx.ctx, fx.now)
	if err != nil || len(ws) != 1 || ws[0].Headroom != want {
		t.Fatalf("unexpected workers listing; got %+v, %v; want a with headroom %v", ws, err, want)
	}
}

func testHeadroomDecrement(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	a := fx.register("a", []string{"/c"}, 3)
	b := fx.register("b", []string{"/c"}, 1)
	counts := map[string]int{}
	for i := range 4 {
		counts[fx.place("/c", fmt.Sprintf("id%d", i)).Owner.SessionID]++
	}
	// Power of two choices with 2 workers always compares both: a (3) wins
	// until it drops to b's 1; ties go to either.
	if counts[a] < 2 {
		t.Fatalf("unexpected spread; got %v; want a to take at least 2 of 4", counts)
	}
	ws, err := fx.s.Workers(fx.ctx, fx.now)
	if err != nil || len(ws) != 2 {
		t.Fatalf("unexpected workers; got %d, %v; want a and b", len(ws), err)
	}
	total := 0.0
	for _, w := range ws {
		total += w.Headroom
	}
	if total != 0 {
		t.Fatalf("unexpected headroom after 4 placements from 4; got %v; want 0", total)
	}
	fx.beat(a, 50, false, false)
	fx.beat(b, 1, false, false)
	ws, err = fx.s.Workers(fx.ctx, fx.now)
	seen := false
	for _, w := range ws {
		if w.SessionID == a {
			seen = true
			if w.Headroom != 50 {
				t.Fatalf("unexpected headroom after heartbeat; got %v; want 50 (heartbeat replaces)", w.Headroom)
			}
		}
	}
	if err != nil || !seen {
		t.Fatalf("unexpected workers after heartbeat; got %+v, %v; want a listed", ws, err)
	}
}

func testZeroHeadroom(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	a := fx.register("a", []string{"/c"}, 0)
	for i := range 3 {
		if r := fx.place("/c", fmt.Sprintf("z%d", i)); r.Owner.SessionID != a {
			t.Fatalf("unexpected owner; got %s; want %s", r.Owner.SessionID, a)
		}
	}
}

func testIneligible(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	a := fx.register("a", []string{"/c"}, 10)
	kept := fx.place("/c", "kept")
	fx.beat(a, 10, true, false)
	if _, err := fx.s.Place(fx.ctx, &directory.PlaceRequest{NS: "/c", ID: "new", Now: fx.now}); !errors.Is(err, directory.ErrNoEligible) {
		t.Fatalf("unexpected placement on a draining worker; got %v; want ErrNoEligible", err)
	}
	if r, ok := fx.lookup("/c", "kept"); !ok || r.Owner.SessionID != kept.Owner.SessionID {
		t.Fatalf("unexpected loss of an existing placement while draining")
	}
	fx.beat(a, 10, false, true)
	if _, err := fx.s.Place(fx.ctx, &directory.PlaceRequest{NS: "/c", ID: "new", Now: fx.now}); !errors.Is(err, directory.ErrNoEligible) {
		t.Fatalf("unexpected placement on a degraded worker; got %v; want ErrNoEligible", err)
	}
	if _, ok := fx.lookup("/c", "kept"); !ok {
		t.Fatalf("unexpected loss of an existing placement while degraded (R-LS-3 keeps routing)")
	}
	info, _ := fx.s.Session(fx.ctx, a, fx.now)
	if !info.Degraded || info.DegradedSince.IsZero() {
		t.Fatalf("unexpected session state; got %+v; want degraded with degradedSince", info)
	}
	fx.beat(a, 10, false, false)
	if r := fx.place("/c", "new"); r.Owner.SessionID != a {
		t.Fatalf("unexpected owner after the probe passed again")
	}
}

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

func testEpochs(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	a := fx.register("a", []string{"/c"}, 100)
	e1 := fx.place("/c", "x").Epoch
	if e1 < uint64(t0.UnixMicro()) {
		t.Fatalf("unexpected epoch %d; want seeded at or above boot time in µs (%d)", e1, t0.UnixMicro())
	}
	if ok, _ := fx.s.Release(fx.ctx, &directory.ReleaseRequest{SessionID: a, NS: "/c", ID: "x"}, fx.now); !ok {
		t.Fatalf("cannot release")
	}
	e2 := fx.place("/c", "x").Epoch
	if e2 <= e1 {
		t.Fatalf("unexpected epoch after release; got %d; want > %d (workers fence released epochs)", e2, e1)
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
	revokeID, _, _ := fx.s.WindDown(fx.ctx, "/c", "x", "", nil, fx.now)
	for range 2 {
		res := fx.beat(a, 10, false, false)
		if len(res.Messages) != 2 || res.Messages[0].MsgID != msgID || res.Messages[1].Deadline != nil {
			t.Fatalf("unexpected messages; got %+v; want both, redelivered until acked", res.Messages)
		}
		if !res.Messages[0].Deadline.Equal(deadline) || res.Messages[0].NS != "/c" || res.Messages[0].ID != "x" || res.Messages[0].Type != "wind_down" {
			t.Fatalf("unexpected message; got %+v", res.Messages[0])
		}
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

func testExclude(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	a := fx.register("a", []string{"/c"}, 1000)
	b := fx.register("b", []string{"/c"}, 1)
	r := fx.place("/c", "x")
	if r.Owner.SessionID != a {
		t.Fatalf("unexpected owner; got %s; want %s", r.Owner.SessionID, a)
	}
	if ok, _ := fx.s.Release(fx.ctx, &directory.ReleaseRequest{SessionID: a, NS: "/c", ID: "x", Epoch: r.Epoch}, fx.now); !ok {
		t.Fatalf("cannot release")
	}
	r2, err := fx.s.Place(fx.ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: fx.now, Exclude: a})
	if err != nil || r2.Owner.SessionID != b {
		t.Fatalf("unexpected retry placement; got %+v, %v; want %s", r2, err, b)
	}
	fx.beat(b, 1, true, false)
	if _, err := fx.s.Place(fx.ctx, &directory.PlaceRequest{NS: "/c", ID: "y", Now: fx.now, Exclude: a}); !errors.Is(err, directory.ErrNoEligible) {
		t.Fatalf("unexpected placement; got %v; want ErrNoEligible", err)
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

func testLookupAllocs(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	fx.register("a", []string{"/c"}, 10)
	fx.place("/c", "alice")
	ns, id := []byte("/c"), []byte("alice")
	if _, ok := fx.s.Lookup(ns, id, fx.now); !ok {
		t.Fatalf("unexpected miss")
	}
	allocs := testing.AllocsPerRun(1000, func() {
		if _, ok := fx.s.Lookup(ns, id, fx.now); !ok {
			panic("miss")
		}
	})
	if allocs != 0 {
		t.Fatalf("unexpected allocations per Lookup; got %v; want 0", allocs)
	}
}

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
}
