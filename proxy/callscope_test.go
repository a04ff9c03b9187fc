package proxy

import (
	"testing"

	"github.com/pinboard-go/pinboard/directory"
)

// A namespace whose policy lists scopes refuses a cluster call from a
// session whose registering key lacks them, as it refuses that key's own
// requests: before, AdmitCall checked the namespaces claim only, and the
// call reached /admin (R-TR-3, R-TR-4, R-TR-6).
func TestClusterCallBoundByPolicyScopes_RTR4_RTR6(t *testing.T) {
	raw := `{"providers":[{"type":"staticToken","id":"p","keys":[
		{"name":"worker","token":{"env":"A"},"scopes":["pinboard:worker"],"claims":{"pinboard":{"namespaces":["*"]}}}
	]}],"namespaces":{"*":{"allow":"authenticated"},"/admin":{"allow":"authenticated","scopes":["admin"]}}}`
	pp := tokPassport(t, raw)
	rg := newRig(t, func(o *Options) { o.Passport = pp })
	rg.warm()
	a, b := newStandin(t, "a"), newStandin(t, "b")
	for _, w := range []struct {
		s  *standin
		ns []string
	}{{a, []string{"/a"}}, {b, []string{"/admin"}}} {
		res, err := rg.store.Register(t.Context(), &directory.Registration{
			ClientID: "client-" + w.s.name, Sub: "p:worker", Secret: w.s.secret, Namespaces: w.ns,
			AdvertiseURL: w.s.srv.URL, Headroom: 1,
		}, rg.now())
		if err != nil {
			t.Fatal(err)
		}
		w.s.session.Store(res.SessionID)
	}
	if res, body := rg.get("/admin/root/value", map[string]string{"Authorization": "Bearer tok-A"}); res.StatusCode != 403 {
		t.Fatalf("key's own request: got %d %s; want 403", res.StatusCode, body)
	}
	res, body := rg.get("/admin/root/value", map[string]string{
		"Pinboard-Session": a.session.Load().(string), "Pinboard-Session-Secret": a.secret, "Pinboard-From": "/a/alice",
	})
	// The refusal names the scope, so an operator knows to add it to the
	// worker key rather than widen its namespaces claim.
	const want = `{"error":"calling session's credential lacks scope \"admin\" that the namespace's policy asks of clients"}`
	if res.StatusCode != 403 || string(body) != want {
		t.Fatalf("cluster call from that key's worker: got %d %s (%d hits at /admin's worker); want 403 %s", res.StatusCode, body, b.hits.Load(), want)
	}
}
