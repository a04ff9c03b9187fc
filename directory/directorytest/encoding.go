package directorytest

import (
	"errors"
	"slices"
	"testing"

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
