package directorytest

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
)

// Contract cases about what a placement policy is given (run by Run with
// the rest).

// recordingPolicy ranks the first candidate and records the session ids
// it was given, in order.
type recordingPolicy struct{ got [][]string }

func (p *recordingPolicy) Rank(dst []int, cands []directory.Candidate, _ *directory.PickInput) []int {
	ids := make([]string, len(cands))
	for i := range cands {
		ids[i] = cands[i].SessionID
	}
	p.got = append(p.got, ids)
	return append(dst, 0)
}

// The policy sees the candidates in session-id order on every call and
// every store, so a deterministic policy (or HeadroomPolicy breaking a
// headroom tie in favour of the first sampled) picks the same worker for
// the same state (R-PL-1, R-PL-4). The memory store handed them in map
// order, different from one call to the next.
func testCandidatesInSessionOrder(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	var want []string
	for _, c := range []string{"a", "b", "c", "d", "e", "f"} {
		want = append(want, fx.register(c, []string{"/c"}, 10))
	}
	slices.Sort(want)
	p := &recordingPolicy{}
	for i := range 10 {
		if _, err := fx.s.Place(fx.ctx, &directory.PlaceRequest{NS: "/c", ID: fmt.Sprintf("o%d", i), Now: fx.now, Policy: p}); err != nil {
			t.Fatalf("cannot place o%d: %v", i, err)
		}
	}
	for i, got := range p.got {
		if !slices.Equal(got, want) {
			t.Fatalf("unexpected candidates for placement %d; got %v; want %v (session-id order)", i, got, want)
		}
	}
}

// SinkPolicy ranks the session Sink (the first candidate when it is not
// one) and keeps what its last call was handed in Got: session id →
// headroom. Tests of what a store hands its policy use it.
type SinkPolicy struct {
	Sink string
	Got  map[string]float64
}

// Rank implements directory.Policy.
func (p *SinkPolicy) Rank(dst []int, cands []directory.Candidate, _ *directory.PickInput) []int {
	p.Got = make(map[string]float64, len(cands))
	at := 0
	for i, c := range cands {
		p.Got[c.SessionID] = c.Headroom
		if c.SessionID == p.Sink {
			at = i
		}
	}
	return append(dst, at)
}

// The candidates and headrooms a policy ranks follow every change the
// store took: heartbeats' headroom, own drain and degraded state, operator
// drain and undrain, registrations and deregistrations (R-PL-1, R-PL-3,
// R-PL-4, R-LS-3, R-REG-6). The Redis store keeps a decoded view of each
// namespace and re-reads only what Redis said changed (redis_view.go): a
// change it missed would hand the policy a stale set, which the claim would
// still correct, so only what the policy sees tells. Every new id goes to
// the session sink, whose headroom is not compared; the others change only
// by the steps. A change reaches the Redis store's view as a push that may
// come a little after the call that made it returned (a script's own
// invalidations follow its reply), so each step places new ids until the
// policy sees it, for at most 5 s; the memory store sees it at once.
func testPolicySeesCurrentState(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	sink := fx.register("sink", []string{"/c"}, 1e9)
	a := fx.register("a", []string{"/c"}, 10)
	b := fx.register("b", []string{"/c"}, 20)
	c := fx.register("c", []string{"/c"}, 30)
	want := map[string]float64{a: 10, b: 20, c: 30}
	n := 0
	check := func(step string) {
		t.Helper()
		var got map[string]float64
		deadline := time.Now().Add(5 * time.Second)
		for {
			p := &SinkPolicy{Sink: sink}
			n++
			rt, err := fx.s.Place(fx.ctx, &directory.PlaceRequest{NS: "/c", ID: fmt.Sprintf("v%d", n), Now: fx.now, Policy: p})
			if err != nil || rt.Owner.SessionID != sink || !rt.Placed {
				t.Fatalf("unexpected placement after %s; got %+v, %v; want a new one on the sink", step, rt, err)
			}
			_, hasSink := p.Got[sink]
			delete(p.Got, sink)
			if hasSink && maps.Equal(p.Got, want) {
				return
			}
			got = p.Got
			if time.Now().After(deadline) {
				break
			}
			time.Sleep(time.Millisecond)
		}
		t.Fatalf("unexpected candidates after %s besides the sink; got %v; want %v", step, got, want)
	}
	check("the registrations")
	fx.beat(b, 5, false, false)
	want[b] = 5
	check("a heartbeat")
	fx.beat(c, 30, true, false)
	delete(want, c)
	check("an own drain")
	if found, err := fx.s.SetDrain(fx.ctx, "a", directory.DrainState{Draining: true}, fx.now); err != nil || !found {
		t.Fatalf("cannot drain a: %v, %v", found, err)
	}
	delete(want, a)
	check("an operator drain")
	if found, err := fx.s.SetDrain(fx.ctx, "a", directory.DrainState{}, fx.now); err != nil || !found {
		t.Fatalf("cannot undrain a: %v, %v", found, err)
	}
	want[a] = 10
	check("an undrain")
	fx.beat(c, 7, false, false)
	want[c] = 7
	check("the end of an own drain")
	d := fx.register("d", []string{"/c"}, 40)
	want[d] = 40
	check("a registration")
	if err := fx.s.Deregister(fx.ctx, b, fx.now); err != nil {
		t.Fatal(err)
	}
	delete(want, b)
	check("a deregistration")
	fx.beat(a, 3, false, true)
	delete(want, a)
	check("a failed probe")
}
