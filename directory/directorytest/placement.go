package directorytest

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/internal/raceflag"
)

// Contract cases about placement: the cold-start quarantine, claims,
// stickiness, headroom, eligibility and epochs (run by Run with the rest).

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

// With ExcludeEpoch, only the refuser's row at that epoch is placed anew:
// a live row on it at another epoch — placed since, by another request —
// is returned like any live owner, so the id never has two owners; the
// refused epoch's row, its release failed, still moves (R-PL-1, R-PL-6).
func testExcludeEpoch(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	a := fx.register("a", []string{"/c"}, 1000)
	b := fx.register("b", []string{"/c"}, 1)
	r1 := fx.place("/c", "x")
	if ok, _ := fx.s.Release(fx.ctx, &directory.ReleaseRequest{SessionID: a, NS: "/c", ID: "x", Epoch: r1.Epoch}, fx.now); !ok {
		t.Fatalf("cannot release")
	}
	r2 := fx.place("/c", "x") // another request's, on a again
	if r2.Owner.SessionID != a || r2.Epoch == r1.Epoch {
		t.Fatalf("unexpected second placement; got %s at %d; want a at a new epoch", r2.Owner.SessionID, r2.Epoch)
	}
	got, err := fx.s.Place(fx.ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: fx.now, Exclude: a, ExcludeEpoch: r1.Epoch})
	if err != nil || got.Placed || got.Owner.SessionID != a || got.Epoch != r2.Epoch {
		t.Fatalf("unexpected placement excluding a's refused epoch; got %+v, %v; want a's live row at %d returned", got, err, r2.Epoch)
	}
	got, err = fx.s.Place(fx.ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: fx.now, Exclude: a, ExcludeEpoch: r2.Epoch})
	if err != nil || !got.Placed || got.Owner.SessionID != b {
		t.Fatalf("unexpected placement excluding a's row at its own epoch; got %+v, %v; want a new placement on b", got, err)
	}
}

// Lookup allocates nothing for any namespace and id the data plane
// routes: a short pair, and the longest id (256 characters, R-DP-1) under
// namespaces past the key's stack buffer — a namespace is any single path
// segment a worker registers, with no bound of its own.
func testLookupAllocs(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	long := strings.Repeat("i", directory.MaxIDLen)
	cases := []struct{ ns, id string }{
		{"/c", "alice"},
		{"/" + strings.Repeat("n", 63), long},
		{"/" + strings.Repeat("n", 4095), long},
	}
	var nss []string
	for _, c := range cases {
		nss = append(nss, c.ns)
	}
	fx.register("a", nss, 10)
	for i, c := range cases {
		fx.place(c.ns, c.id)
		if i > 0 && raceflag.Enabled {
			continue // long keys are built in a pooled buffer (raceflag)
		}
		ns, id := []byte(c.ns), []byte(c.id)
		if _, ok := fx.s.Lookup(ns, id, fx.now); !ok {
			t.Fatalf("unexpected miss for a namespace of %d bytes", len(c.ns))
		}
		allocs := testing.AllocsPerRun(1000, func() {
			if _, ok := fx.s.Lookup(ns, id, fx.now); !ok {
				panic("miss")
			}
		})
		if allocs != 0 {
			t.Fatalf("unexpected allocations per Lookup with a namespace of %d bytes and an id of %d; got %v; want 0", len(c.ns), len(c.id), allocs)
		}
	}
}
