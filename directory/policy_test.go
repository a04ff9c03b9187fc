package directory_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/directory/directorytest"
	"github.com/pinboard-go/pinboard/tools/redistest"
)

// onBothStores runs fn against the memory store and against a Redis store
// (R-PL-3, R-PL-4 hold on both: the Redis store ranks its cached view of
// the candidates' headroom, the memory store its own records).
func onBothStores(t *testing.T, fn func(t *testing.T, f directorytest.Factory)) {
	t.Run("memory", func(t *testing.T) {
		fn(t, func(_ *testing.T, ttl time.Duration, now time.Time) directory.Store {
			return directory.NewMemory(ttl, now)
		})
	})
	t.Run("redis", func(t *testing.T) {
		fn(t, redisFactory(redistest.StartServer(t).URL()))
	})
}

type fleet struct {
	t   *testing.T
	s   directory.Store
	now time.Time
	ids map[string]string // session -> name
}

func newFleetOn(t *testing.T, store directorytest.Factory, headroom float64, names ...string) *fleet {
	t.Helper()
	f := &fleet{t: t, now: time.Unix(1_800_000_000, 0), ids: map[string]string{}}
	f.s = store(t, time.Hour, f.now)
	ctx := context.Background()
	_, _ = f.s.Place(ctx, &directory.PlaceRequest{NS: "/x", ID: "warm", Now: f.now})
	f.now = f.now.Add(time.Hour - time.Second)
	for _, n := range names {
		res, err := f.s.Register(ctx, &directory.Registration{ClientID: n, Sub: "s", Secret: "k", Namespaces: []string{"/c"}, AdvertiseURL: "http://127.0.0.1:1/" + n, Headroom: headroom}, f.now)
		if err != nil {
			t.Fatal(err)
		}
		f.ids[res.SessionID] = n
	}
	f.now = f.now.Add(time.Second)
	return f
}

func (f *fleet) place(id string, pick directory.PickInput, policy directory.Policy) string {
	f.t.Helper()
	r, err := f.s.Place(context.Background(), &directory.PlaceRequest{NS: "/c", ID: id, Now: f.now, Pick: pick, Policy: policy})
	if err != nil {
		f.t.Fatalf("cannot place %s: %v", id, err)
	}
	return f.ids[r.Owner.SessionID]
}

// 10,000 new ids over 4 workers with equal headroom and no affinity key
// land within ±10% of even (R-PL-3, R-PL-4: null key → power of two
// choices).
func TestDistributionWithoutAffinity_RPL3_RPL4(t *testing.T) {
	onBothStores(t, testDistributionWithoutAffinity)
}

func testDistributionWithoutAffinity(t *testing.T, store directorytest.Factory) {
	f := newFleetOn(t, store, 1024, "a", "b", "c", "d")
	counts := map[string]int{}
	for i := range 10_000 {
		counts[f.place(fmt.Sprintf("id-%d", i), directory.PickInput{}, nil)]++
	}
	for name, n := range counts {
		if math.Abs(float64(n)-2500) > 250 {
			t.Fatalf("unexpected spread; got %v; want every worker within 2500±250 (%s has %d)", counts, name, n)
		}
	}
	if len(counts) != 4 {
		t.Fatalf("unexpected spread; got %v; want all 4 workers", counts)
	}
}

// Ids from one client IP stay on one worker until the balance-factor
// guard moves them, and the headroom spread stays within the factor
// (R-PL-4).
func TestClientIPAffinityBoundedByBalanceFactor_RPL4(t *testing.T) {
	onBothStores(t, testClientIPAffinityBoundedByBalanceFactor)
}

func testClientIPAffinityBoundedByBalanceFactor(t *testing.T, store directorytest.Factory) {
	for _, factor := range []float64{1.5, 2, 4} {
		t.Run(fmt.Sprint(factor), func(t *testing.T) {
			const headroom = 400
			f := newFleetOn(t, store, headroom, "a", "b", "c", "d")
			policy := &directory.HeadroomPolicy{BalanceFactor: factor}
			pick := directory.PickInput{Key: "203.0.113.7", HasKey: true}
			first := f.place("id-0", pick, policy)
			// The preferred worker keeps new ids until its headroom falls
			// below the best one's divided by the factor.
			sticky := 1
			for i := 1; ; i++ {
				if f.place(fmt.Sprintf("id-%d", i), pick, policy) != first {
					break
				}
				sticky++
			}
			want := int(math.Ceil(headroom - headroom/factor))
			if sticky < want-1 || sticky > want+1 {
				t.Fatalf("unexpected affinity run; got %d ids on %s; want about %d (headroom %d, factor %v)", sticky, first, want, headroom, factor)
			}
			// Under sustained load the guard keeps every worker's headroom
			// within the factor of the best.
			for i := 0; i < 2000; i++ {
				f.place(fmt.Sprintf("more-%d", i), pick, policy)
				ws, err := f.s.Workers(context.Background(), f.now)
				if err != nil || len(ws) != 4 {
					t.Fatalf("unexpected workers after %d placements; got %d, %v; want the 4", i, len(ws), err)
				}
				maxH, minH := math.Inf(-1), math.Inf(1)
				for _, w := range ws {
					maxH, minH = math.Max(maxH, w.Headroom), math.Min(minH, w.Headroom)
				}
				if maxH > 0 && minH < maxH/factor-1 {
					t.Fatalf("unexpected spread after %d placements: min %v, max %v, factor %v", i, minH, maxH, factor)
				}
			}
		})
	}
}

// With every worker at zero headroom (full, as the guide's slot probes
// report it) the guard still bounds affinity: one client IP's new ids do
// not all pile onto its preferred worker, which would otherwise be
// overcommitted without limit until the next heartbeat (R-PL-4, R-PL-3).
func TestAffinityBoundedBelowZeroHeadroom_RPL4_RPL3(t *testing.T) {
	onBothStores(t, testAffinityBoundedBelowZeroHeadroom)
}

func testAffinityBoundedBelowZeroHeadroom(t *testing.T, store directorytest.Factory) {
	const factor = 2
	f := newFleetOn(t, store, 0, "a", "b", "c", "d")
	policy := &directory.HeadroomPolicy{BalanceFactor: factor}
	pick := directory.PickInput{Key: "203.0.113.7", HasKey: true}
	for i := range 200 {
		f.place(fmt.Sprintf("id-%d", i), pick, policy)
	}
	ws, err := f.s.Workers(context.Background(), f.now)
	if err != nil {
		t.Fatal(err)
	}
	maxH, minH := math.Inf(-1), math.Inf(1)
	for _, w := range ws {
		maxH, minH = math.Max(maxH, w.Headroom), math.Min(minH, w.Headroom)
	}
	// Overcommit stays within the factor of the least overcommitted.
	if minH < maxH*factor-1 {
		t.Fatalf("unexpected spread after 200 placements from zero headroom; got min %v, max %v; want min >= %v", minH, maxH, maxH*factor-1)
	}
}

// Different client IPs prefer different workers (rendezvous), and the same
// IP prefers the same worker on every node (the score is deterministic).
func TestRendezvousIsStableAndSpreads_RPL4(t *testing.T) {
	onBothStores(t, testRendezvousIsStableAndSpreads)
}

func testRendezvousIsStableAndSpreads(t *testing.T, store directorytest.Factory) {
	f1 := newFleetOn(t, store, 1000, "a", "b", "c", "d")
	f2 := newFleetOn(t, store, 1000, "a", "b", "c", "d")
	policy := &directory.HeadroomPolicy{}
	seen := map[string]bool{}
	for i := range 64 {
		pick := directory.PickInput{Key: fmt.Sprintf("10.0.0.%d", i), HasKey: true}
		a := f1.place(fmt.Sprintf("x%d", i), pick, policy)
		b := f2.place(fmt.Sprintf("x%d", i), pick, policy)
		if a != b {
			t.Fatalf("unexpected preference for %s: node 1 chose %s, node 2 chose %s", pick.Key, a, b)
		}
		seen[a] = true
	}
	if len(seen) != 4 {
		t.Fatalf("unexpected rendezvous spread over 64 IPs; got %v", seen)
	}
}

// Attested cluster calls prefer the caller's own worker even against
// headroom (R-PL-4).
func TestCallerPreference_RPL4(t *testing.T) {
	onBothStores(t, testCallerPreference)
}

func testCallerPreference(t *testing.T, store directorytest.Factory) {
	f := newFleetOn(t, store, 10, "a", "b")
	var caller string
	for sid, n := range f.ids {
		if n == "b" {
			caller = sid
		}
	}
	for i := range 20 {
		if got := f.place(fmt.Sprintf("c%d", i), directory.PickInput{CallerSession: caller, Key: "1.2.3.4", HasKey: true}, nil); got != "b" {
			t.Fatalf("unexpected owner for a cluster call; got %s; want the caller's worker b", got)
		}
	}
}

// Existing ids keep their owners whatever the request's affinity
// (R-PL-2, R-PL-4).
func TestExistingIDsKeepOwners_RPL2_RPL4(t *testing.T) {
	onBothStores(t, testExistingIDsKeepOwners)
}

func testExistingIDsKeepOwners(t *testing.T, store directorytest.Factory) {
	f := newFleetOn(t, store, 100, "a", "b", "c")
	owner := f.place("keep", directory.PickInput{Key: "1.1.1.1", HasKey: true}, nil)
	for i := range 50 {
		if got := f.place("keep", directory.PickInput{Key: fmt.Sprintf("9.9.9.%d", i), HasKey: true}, nil); got != owner {
			t.Fatalf("unexpected move of an existing id; got %s; want %s", got, owner)
		}
	}
}

// A balance factor that is no finite number >= 1 (NaN, +Inf: the
// programmatic options are not parsed like PINBOARD_AFFINITY_BALANCE_FACTOR)
// uses the default, as the zero value does: NaN compared false with every
// headroom and switched the guard off, leaving affinity unbounded (R-PL-4).
func TestBalanceFactorNotANumberUsesDefault_RPL4(t *testing.T) {
	in := &directory.PickInput{Key: "198.51.100.9", HasKey: true}
	cands := []directory.Candidate{{SessionID: "a", ClientID: "a", Headroom: 100}, {SessionID: "b", ClientID: "b", Headroom: 100}}
	pref := (&directory.HeadroomPolicy{}).Rank(nil, cands, in)[0]
	cands[pref].Headroom = 10 // below 100 / DefaultBalanceFactor
	for _, factor := range []float64{math.NaN(), math.Inf(1), 0.5, 0} {
		if got := (&directory.HeadroomPolicy{BalanceFactor: factor}).Rank(nil, cands, in)[0]; got == pref {
			t.Fatalf("unexpected pick with balance factor %v; got the preferred worker %s at headroom 10; want the other at 100", factor, cands[got].SessionID)
		}
	}
}

func TestPolicyRankAllocs(t *testing.T) {
	cands := []directory.Candidate{{SessionID: "a", ClientID: "a", Headroom: 5}, {SessionID: "b", ClientID: "b", Headroom: 9}, {SessionID: "c", ClientID: "c", Headroom: 7}}
	p := &directory.HeadroomPolicy{}
	dst := make([]int, 0, 4)
	in := &directory.PickInput{Key: "10.1.2.3", HasKey: true}
	if n := testing.AllocsPerRun(1000, func() { dst = p.Rank(dst[:0], cands, in) }); n != 0 {
		t.Fatalf("unexpected allocations in Rank; got %v", n)
	}
}

// rankPicks counts, over 256 affinity keys, how often Rank puts each
// candidate first.
func rankPicks(p *directory.HeadroomPolicy, cands []directory.Candidate) map[string]int {
	picks := map[string]int{}
	for i := range 256 {
		in := &directory.PickInput{Key: fmt.Sprintf("203.0.113.%d", i), HasKey: true}
		picks[cands[p.Rank(nil, cands, in)[0]].SessionID]++
	}
	return picks
}

// The balance factor bounds rendezvous inclusively: a worker at exactly
// the best headroom over the factor stays eligible, one below it does
// not; a factor of 1 (PINBOARD_AFFINITY_BALANCE_FACTOR=1) is a valid
// factor, strict headroom, not the default (R-PL-4).
func TestRendezvousBoundInclusive_RPL4(t *testing.T) {
	at := []directory.Candidate{{SessionID: "a", ClientID: "a", Headroom: 100}, {SessionID: "b", ClientID: "b", Headroom: 50}}
	if got := rankPicks(&directory.HeadroomPolicy{BalanceFactor: 2}, at); got["b"] == 0 {
		t.Fatalf("unexpected picks with b at exactly 100/2; got %v; want b among them", got)
	}
	below := []directory.Candidate{{SessionID: "a", ClientID: "a", Headroom: 100}, {SessionID: "b", ClientID: "b", Headroom: 99}}
	if got := rankPicks(&directory.HeadroomPolicy{BalanceFactor: 1}, below); got["b"] != 0 {
		t.Fatalf("unexpected picks with a balance factor of 1; got %v; want a only", got)
	}
	if got := rankPicks(&directory.HeadroomPolicy{BalanceFactor: 2}, below); got["b"] == 0 {
		t.Fatalf("unexpected picks with a balance factor of 2; got %v; want b among them", got)
	}
}

// Below zero headroom the bound widens by the factor (best × factor), as
// above zero it narrows by it: at -10 and -15, both stay eligible with
// the default factor (R-PL-3: zero headroom stays eligible, and a
// placement burst may take a worker below it; R-PL-4).
func TestRendezvousBoundBelowZero_RPL3_RPL4(t *testing.T) {
	cands := []directory.Candidate{{SessionID: "a", ClientID: "a", Headroom: -10}, {SessionID: "b", ClientID: "b", Headroom: -15}}
	if got := rankPicks(&directory.HeadroomPolicy{}, cands); got["a"] == 0 || got["b"] == 0 {
		t.Fatalf("unexpected picks at headroom -10 and -15; got %v; want both", got)
	}
	cands[1].Headroom = -21 // below -10 × 2
	if got := rankPicks(&directory.HeadroomPolicy{}, cands); got["b"] != 0 {
		t.Fatalf("unexpected picks at headroom -10 and -21; got %v; want a only", got)
	}
}

// A cluster call ranks the caller's worker first and, behind it, the
// other worker with the most headroom: the one the Redis script claims on
// when the caller can no longer take it (R-PL-4).
func TestCallerPreferenceFallback_RPL4(t *testing.T) {
	cands := []directory.Candidate{{SessionID: "low", ClientID: "low", Headroom: 5}, {SessionID: "caller", ClientID: "caller", Headroom: 1}, {SessionID: "high", ClientID: "high", Headroom: 50}, {SessionID: "mid", ClientID: "mid", Headroom: 20}}
	got := (&directory.HeadroomPolicy{}).Rank(nil, cands, &directory.PickInput{CallerSession: "caller"})
	if len(got) != 2 || got[0] != 1 || got[1] != 2 {
		t.Fatalf("unexpected ranking for a cluster call; got %v; want [1 2] (the caller, then the most headroom)", got)
	}
}

// Power of two choices compares two distinct workers and ranks the one
// with more headroom first, whatever the random draws (R-PL-4: null key).
func TestTwoChoicesDistinct_RPL4(t *testing.T) {
	cands := []directory.Candidate{{SessionID: "a", ClientID: "a", Headroom: 1}, {SessionID: "b", ClientID: "b", Headroom: 100}, {SessionID: "c", ClientID: "c", Headroom: 50}}
	p := &directory.HeadroomPolicy{IntN: func(int) int { return 0 }}
	got := p.Rank(nil, cands, &directory.PickInput{})
	if len(got) != 2 || got[0] != 1 || got[1] != 0 {
		t.Fatalf("unexpected ranking with both draws 0; got %v; want [1 0] (b, the second distinct draw, over a)", got)
	}
}

// A placement the owner refused (PlaceRequest.Exclude, R-PL-6) moves to
// another worker: the refusing session no longer counts it among its
// placements (GET /registry/workers), the new owner does (R-PL-1).
func TestExcludedPlacementMovesCount_RPL6_RREG4(t *testing.T) {
	onBothStores(t, func(t *testing.T, store directorytest.Factory) {
		f := newFleetOn(t, store, 10, "a", "b")
		ctx := context.Background()
		first, err := f.s.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "alice", Now: f.now})
		if err != nil {
			t.Fatal(err)
		}
		moved, err := f.s.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "alice", Now: f.now, Exclude: first.Owner.SessionID})
		if err != nil || moved.Owner.SessionID == first.Owner.SessionID {
			t.Fatalf("unexpected placement excluding its owner; got %+v, %v", moved, err)
		}
		for sid, want := range map[string]int{first.Owner.SessionID: 0, moved.Owner.SessionID: 1} {
			if info, err := f.s.Session(ctx, sid, f.now); err != nil || info.Placements != want {
				t.Fatalf("unexpected placements of %s; got %+v, %v; want %d", f.ids[sid], info, err, want)
			}
		}
	})
}

// A superseded session answers superseded for two leases from its
// supersession, the last instant included, and unknown after: both
// stores end the tomb at the same instant (R-LS-4, R-REG-2: the worker
// stops registering on the first, registers again on the second).
func TestSupersededTombLastsTwoLeases_RLS4(t *testing.T) {
	onBothStores(t, func(t *testing.T, store directorytest.Factory) {
		const ttl = 15 * time.Second
		now := time.Unix(1_800_000_000, 0)
		s := store(t, ttl, now)
		ctx := context.Background()
		reg := func(client string, epoch int64) string {
			res, err := s.Register(ctx, &directory.Registration{ClientID: client, Sub: "s", Secret: "k", Namespaces: []string{"/c"},
				AdvertiseURL: "http://127.0.0.1:1/" + client, Headroom: 1, Hostname: "app.example", Env: "green", Epoch: epoch}, now)
			if err != nil {
				t.Fatal(err)
			}
			return res.SessionID
		}
		old := reg("a", 1)
		reg("b", 2)
		var se *directory.SupersededError
		if _, err := s.Heartbeat(ctx, &directory.Beat{SessionID: old, Sub: "s"}, now.Add(2*ttl)); !errors.As(err, &se) {
			t.Fatalf("unexpected heartbeat two leases after the supersession; got %v; want superseded", err)
		}
		if _, err := s.Heartbeat(ctx, &directory.Beat{SessionID: old, Sub: "s"}, now.Add(2*ttl+time.Microsecond)); !errors.Is(err, directory.ErrUnknownSession) {
			t.Fatalf("unexpected heartbeat past two leases after the supersession; got %v; want unknown session", err)
		}
	})
}

// rankNothing is a policy that ranks no candidate: on Redis the claim
// script then picks on its own, as it does when every ranked candidate
// turned ineligible since the node's view was read.
type rankNothing struct{}

func (rankNothing) Rank(dst []int, _ []directory.Candidate, _ *directory.PickInput) []int { return dst }

// The claim script's own pick, when no ranked candidate can take the id,
// is still biased toward headroom: the eligible worker with the most
// (R-PL-1, R-PL-3).
func TestRedisClaimFallbackPicksMostHeadroom_RPL1_RPL3(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	s := redisFactory(redistest.StartServer(t).URL())(t, time.Hour, now)
	ctx := context.Background()
	_, _ = s.Place(ctx, &directory.PlaceRequest{NS: "/x", ID: "warm", Now: now})
	now = now.Add(time.Hour)
	names := map[string]string{}
	for name, hr := range map[string]float64{"low": 5, "high": 50, "mid": 20} {
		res, err := s.Register(ctx, &directory.Registration{ClientID: name, Sub: "s", Secret: "k", Namespaces: []string{"/c"}, AdvertiseURL: "http://127.0.0.1:1/" + name, Headroom: hr}, now)
		if err != nil {
			t.Fatal(err)
		}
		names[res.SessionID] = name
	}
	for i := range 3 {
		r, err := s.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: fmt.Sprintf("id%d", i), Now: now, Policy: rankNothing{}})
		if err != nil {
			t.Fatal(err)
		}
		if got := names[r.Owner.SessionID]; got != "high" {
			t.Fatalf("unexpected owner of id%d by the claim script's own pick; got %s; want high (headroom %d)", i, got, 50-i)
		}
	}
}
