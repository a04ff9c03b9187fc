// Package directorytest is the directory.Store contract suite. Every store
// (memory:, Redis, Redis Cluster) runs the same tests, so behaviour the
// registry and proxy rely on cannot drift between them.
package directorytest

import (
	"context"
	"errors"
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
		{"LeaseNotShortOnNanosecondClock_RLS1", testLeaseNotShort},
		{"HeartbeatReportsStateReplaced_RLS3", testHeartbeatReportsStateReplaced},
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
		{"ExcludeEpochKeepsNewerLiveRow_RPL1_RPL6", testExcludeEpoch},
		{"CandidatesInSessionOrder_RPL1_RPL4", testCandidatesInSessionOrder},
		{"PolicySeesCurrentState_RPL1_RPL3_RPL4_RLS3_RREG6", testPolicySeesCurrentState},
		{"SweepRemovesDeadSessions", testSweep},
		{"EndedSessionRevoked_RLS2_RREG3", testEndedSessionRevoked},
		{"ExpiredCountedUntilSwept_RLS2", testExpired},
		{"HostnameBindingsSupersede_RLS4", testSupersede},
		{"HeldBindingSurvivesSweep_RLS4", testHeldBindingSurvivesSweep},
		{"HostnameRoutesNewPlacements_RLS4", testHostRouting},
		{"HostnameASCIIFold_RLS4", testHostnameASCIIFold},
		{"RegistrationNotAliased_RREG1_RLS4", testRegistrationNotAliased},
		{"PlacementReportsLiveness_RLS2", testPlacementLiveness},
		{"LeaseEndsEverywhereAtOnce_RLS1_RLS2", testLeaseEndsEverywhere},
		{"WindDownNeedsLiveOwner_RCM1", testWindDownDeadOwner},
		{"WindDownChecksNamedOwner_RCM1", testWindDownNamedOwner},
		{"DegradedSinceKeepsFirstFailure_RLS3", testDegradedSince},
		{"StaleReleaseKeepsNewOwner_RREG3", testStaleRelease},
		{"ReclaimedOwnerServesDuringQuarantine_RCS1", testReclaimDuringQuarantine},
		{"LookupDoesNotAllocate_RDP1", testLookupAllocs},
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
