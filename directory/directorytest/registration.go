package directorytest

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
)

// testNamespaceBytes: a namespace is any "/" + bytes without "/" or ASCII
// space, tab, CR, LF, FF (the registry's ^/[^/\s]+$ in Go's regexp), so it
// may hold a vertical tab or a Unicode space. The store keeps it as one
// namespace, byte for byte: listed as registered, and serving no other
// namespace (R-REG-4, R-PL-5).
func testNamespaceBytes(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	ns := []string{"/a\u00a0b", "/x\vy", "/p\u2003q"}
	a := fx.register("a", ns, 10)
	info, err := fx.s.Session(fx.ctx, a, fx.now)
	if err != nil {
		t.Fatalf("cannot read session: %v", err)
	}
	if !slices.Equal(info.Namespaces, ns) {
		t.Fatalf("unexpected namespaces; got %q; want %q", info.Namespaces, ns)
	}
	ws, err := fx.s.Workers(fx.ctx, fx.now)
	if err != nil || len(ws) != 1 || !slices.Equal(ws[0].Namespaces, ns) {
		t.Fatalf("unexpected workers; got %+v, %v; want one with namespaces %q", ws, err, ns)
	}
	for _, other := range []string{"/x", "/a", "/p"} {
		_, err := fx.s.Place(fx.ctx, &directory.PlaceRequest{NS: other, ID: "i", Now: fx.now})
		if !errors.Is(err, directory.ErrUnknownNamespace) {
			t.Fatalf("unexpected placement in %q; got %v; want ErrUnknownNamespace", other, err)
		}
	}
	for _, n := range ns {
		if r := fx.place(n, "i"); r.Owner.SessionID != a {
			t.Fatalf("unexpected owner in %q; got %s; want %s", n, r.Owner.SessionID, a)
		}
	}
}

// testInstanceListedTwice: a re-registration listing one id twice hosts
// it once; the id is not a duplicate of itself (R-REG-1: duplicates are ids
// another live session owns, and the worker drops them).
func testInstanceListedTwice(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	res, err := fx.s.Register(fx.ctx, &directory.Registration{
		ClientID: "a", Sub: "test:worker", Secret: "secret-a", Namespaces: []string{"/c"},
		AdvertiseURL: "http://127.0.0.1:9/a", Headroom: 10,
		Instances: map[string][]string{"/c": {"x", "x"}},
	}, fx.now)
	if err != nil {
		t.Fatalf("cannot register: %v", err)
	}
	if len(res.Duplicates) != 0 {
		t.Fatalf("unexpected duplicates; got %v; want none", res.Duplicates)
	}
	if r := fx.place("/c", "x"); r.Owner.SessionID != res.SessionID || r.Placed {
		t.Fatalf("unexpected owner of x; got %+v; want the reclaiming session %s", r, res.SessionID)
	}
}

// testHostnameASCIIFold: hostnames compare by ASCII case only, the DNS
// rule (RFC 4343) and what Redis's string.lower does, so both stores agree
// on which Host a binding routes: "ÅPP.example" matches "Åpp.EXAMPLE" but
// not "åpp.example" (R-LS-4).
func testHostnameASCIIFold(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	bound, err := fx.registerBound("bound", "ÅPP.example", "blue", 1, "", "/c")
	if err != nil {
		t.Fatal(err)
	}
	// Another hostname, differing only outside ASCII, holds its own
	// binding: it is not the same host, so nothing is superseded.
	other, err := fx.registerBound("other", "åpp.example", "green", 1, "", "/c")
	if err != nil {
		t.Fatalf("unexpected refusal of a different (non-ASCII case) hostname: %v", err)
	}
	for i, tc := range []struct{ host, want string }{
		{"Åpp.EXAMPLE", bound},
		{"åpp.example", other},
	} {
		r, err := fx.s.Place(fx.ctx, &directory.PlaceRequest{NS: "/c", ID: fmt.Sprintf("h%d", i), Now: fx.now, Host: tc.host})
		if err != nil || r.Owner.SessionID != tc.want {
			t.Fatalf("unexpected owner for Host %q; got %+v, %v; want %s", tc.host, r, err, tc.want)
		}
	}
}

// testLostRegisterAnswer: a registration whose answer never reached the
// worker (its HTTP timeout, a connection cut after the store wrote) left a
// session the worker does not know. The worker registers again with the
// same clientId — minted per process — and the same prevSessionId; its
// instances are its own, not duplicates (which the worker would abort),
// and the session it never learnt is gone. Another account's rows stay
// duplicates (R-REG-1).
func testLostRegisterAnswer(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	a := fx.register("a", []string{"/c"}, 100)
	fx.place("/c", "x")
	fx.advance(time.Second)
	again := func(sub string) *directory.RegisterResult {
		t.Helper()
		res, err := fx.s.Register(fx.ctx, &directory.Registration{
			ClientID: "a", Sub: sub, Secret: "secret-a", Namespaces: []string{"/c"},
			AdvertiseURL: "http://127.0.0.1:9/a", Headroom: 100, PrevSessionID: a,
			Instances: map[string][]string{"/c": {"x"}},
		}, fx.now)
		if err != nil {
			t.Fatalf("cannot re-register: %v", err)
		}
		return res
	}
	lost := again("test:worker")
	if len(lost.Duplicates) != 0 {
		t.Fatalf("unexpected duplicates on the first re-registration; got %v", lost.Duplicates)
	}
	retry := again("test:worker")
	if len(retry.Duplicates) != 0 {
		t.Fatalf("unexpected duplicates after a lost answer; got %v; want x reclaimed from the session the worker never learnt", retry.Duplicates)
	}
	if r, ok := fx.lookup("/c", "x"); !ok || r.Owner.SessionID != retry.SessionID {
		t.Fatalf("unexpected owner of x; got %+v, %v; want %s", r, ok, retry.SessionID)
	}
	if _, err := fx.s.Session(fx.ctx, lost.SessionID, fx.now); !errors.Is(err, directory.ErrUnknownSession) {
		t.Fatalf("unexpected session the worker never learnt; got %v; want ErrUnknownSession", err)
	}
	ws, err := fx.s.Workers(fx.ctx, fx.now)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, w := range ws {
		if w.ClientID == "a" {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("unexpected sessions of client a; got %d; want 1", n)
	}
	// Same clientId, another account: not the same process.
	other := again("other:account")
	if len(other.Duplicates) != 1 {
		t.Fatalf("unexpected duplicates for another account's registration; got %v; want x", other.Duplicates)
	}
}

// testReclaimKeepsEpoch: an id a re-registering process reclaims from one
// of its earlier sessions keeps its placement epoch — nothing placed it
// anywhere else meanwhile, and the worker's instance still carries that
// epoch (pinned hosting/directory.py: record.epoch, from pinboard-epoch).
// So the release the worker sends when the instance later closes
// (RegistrationClient.release: the new session, the instance's epoch)
// frees the row. An id the process lists that no earlier session of it
// holds (unowned, or a lapsed stranger's) is a new claim: a fresh epoch
// (R-REG-1, R-REG-3).
func testReclaimKeepsEpoch(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	a := fx.register("a", []string{"/c"}, 100)
	x := fx.place("/c", "x")
	fx.advance(TTL) // a freezes past its lease; its row stays, dead-owner
	b := fx.register("b", []string{"/c"}, 1)
	z, err := fx.s.Place(fx.ctx, &directory.PlaceRequest{NS: "/c", ID: "z", Now: fx.now})
	if err != nil || z.Owner.SessionID != b {
		t.Fatalf("cannot place z on b: %+v, %v", z, err)
	}
	fx.advance(TTL) // b lapses too
	res, err := fx.s.Register(fx.ctx, &directory.Registration{
		ClientID: "a", Sub: "test:worker", Secret: "secret-a", Namespaces: []string{"/c"},
		AdvertiseURL: "http://127.0.0.1:9/a", Headroom: 100, PrevSessionID: a,
		Instances: map[string][]string{"/c": {"x", "y", "z"}},
	}, fx.now)
	if err != nil || len(res.Duplicates) != 0 {
		t.Fatalf("cannot re-register: %+v, %v", res, err)
	}
	r, ok := fx.lookup("/c", "x")
	if !ok || r.Owner.SessionID != res.SessionID || r.Epoch != x.Epoch {
		t.Fatalf("unexpected row of x after re-registration; got %+v, %v; want %s at epoch %d", r, ok, res.SessionID, x.Epoch)
	}
	for _, id := range []string{"y", "z"} {
		r, ok := fx.lookup("/c", id)
		if !ok || r.Owner.SessionID != res.SessionID || r.Epoch == 0 || r.Epoch <= z.Epoch {
			t.Fatalf("unexpected row of %s after re-registration; got %+v, %v; want %s at a fresh epoch above %d", id, r, ok, res.SessionID, z.Epoch)
		}
	}
	freed, err := fx.s.Release(fx.ctx, &directory.ReleaseRequest{SessionID: res.SessionID, NS: "/c", ID: "x", Epoch: x.Epoch}, fx.now)
	if err != nil || !freed {
		t.Fatalf("unexpected release of x at its epoch by the new session; got %v, %v; want freed", freed, err)
	}
}

// testURLTakeover: a registration of another process at an advertise URL
// a live session holds voids that session (R-LS-3) — the registration's
// probe was answered at the URL with the new session's secret, so the URL
// no longer reaches the old one: a worker restarted in place, with a new
// clientId, whose predecessor died without deregistering. Its records go
// (its heartbeat is an unknown session), its ids re-place at once instead
// of going to the new process signed with the old secret until the lease
// lapses, and listed ones it held are duplicates, as a superseded
// session's are. The same process re-registering, and other URLs, void
// nothing; a URL whose session was dropped is free.
func testURLTakeover(t *testing.T, f Factory) {
	fx := newFixture(t, f)
	fx.warm()
	url := "http://127.0.0.1:9/a"
	a := fx.register("a", []string{"/c"}, 100)
	other := fx.register("o", []string{"/c"}, 0)
	for _, id := range []string{"x", "y"} {
		if r := fx.place("/c", id); r.Owner.SessionID != a {
			t.Fatalf("unexpected owner of %s; got %s; want %s (most headroom)", id, r.Owner.SessionID, a)
		}
	}
	fx.advance(time.Second)
	at := func(client, prev string, instances ...string) *directory.RegisterResult {
		t.Helper()
		reg := &directory.Registration{
			ClientID: client, Sub: "test:worker", Secret: "secret-" + client, Namespaces: []string{"/c"},
			AdvertiseURL: url, Headroom: 100, PrevSessionID: prev,
		}
		if len(instances) > 0 {
			reg.Instances = map[string][]string{"/c": instances}
		}
		res, err := fx.s.Register(fx.ctx, reg, fx.now)
		if err != nil {
			t.Fatalf("cannot register %s at %s: %v", client, url, err)
		}
		return res
	}
	b := at("b", "", "y")
	if want := []directory.SessionRef{{SessionID: a, ClientID: "a"}}; !slices.Equal(b.Voided, want) {
		t.Fatalf("unexpected sessions voided by another process's registration at %s; got %v; want %v", url, b.Voided, want)
	}
	if !slices.Equal(b.Duplicates, []directory.NSID{{NS: "/c", ID: "y"}}) {
		t.Fatalf("unexpected duplicates of a registration listing an id the voided session held; got %v; want /c y", b.Duplicates)
	}
	fx.wantGone(a)
	if _, ok := fx.lookup("/c", "x"); ok {
		t.Fatalf("unexpected placement of x after its owner's URL was taken over; want none")
	}
	if r := fx.place("/c", "x"); r.Owner.SessionID != b.SessionID {
		t.Fatalf("unexpected owner of x after its owner's URL was taken over; got %s; want %s", r.Owner.SessionID, b.SessionID)
	}
	if _, err := fx.s.Session(fx.ctx, other, fx.now); err != nil {
		t.Fatalf("unexpected end of a session at another URL; got %v; want live", err)
	}
	again := at("b", b.SessionID, "x")
	if len(again.Voided) != 0 || len(again.Duplicates) != 0 {
		t.Fatalf("unexpected re-registration of the same process at %s; got voided %v, duplicates %v; want none", url, again.Voided, again.Duplicates)
	}
	if r, ok := fx.lookup("/c", "x"); !ok || r.Owner.SessionID != again.SessionID {
		t.Fatalf("unexpected owner of x after its process re-registered; got %+v, %v; want %s", r, ok, again.SessionID)
	}
	if err := fx.s.Deregister(fx.ctx, again.SessionID, fx.now); err != nil {
		t.Fatal(err)
	}
	if c := at("c", ""); len(c.Voided) != 0 {
		t.Fatalf("unexpected sessions voided at a URL whose session deregistered; got %v; want none", c.Voided)
	}
}
