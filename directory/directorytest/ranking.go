package directorytest

import (
	"fmt"
	"slices"
	"testing"

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
