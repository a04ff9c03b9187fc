package proxy

import (
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
)

// A worker whose advertise URL reaches pinboard itself — a key whose
// allowedBackendHosts cover pinboard's address registered it — is
// refused at the first hop: the request pinboard forwarded comes back
// carrying an attestation that verifies for that session, and is
// answered 508. Before, it was forwarded again, and again, each hop
// holding a worker connection until the pool's cap: one client request
// held a thousand connections, each for up to the worker header timeout
// (R-TR-5, R-DP-4). A forged attestation, or one for a session the
// directory does not know, is still stripped and the request forwarded.
func TestRequestFromPinboardItselfRefused_RTR5_RDP4(t *testing.T) {
	rg, w := newRigWorker(t, func(o *Options) {
		// Bounded without the check: the loop ends at the pool's cap.
		o.Upstream.MaxConns = 8
		o.Upstream.ConnWait = 200 * time.Millisecond
	})
	res, err := rg.store.Register(t.Context(), &directory.Registration{
		ClientID: "client-loop", Sub: "p:worker", Secret: "secret-loop", Namespaces: []string{"/loop"},
		AdvertiseURL: rg.url + "/", Headroom: 1,
	}, rg.now())
	if err != nil {
		t.Fatal(err)
	}
	got, body := rg.get("/loop/alice/x", nil)
	want := `{"error":"loop detected: a worker's advertise URL reaches pinboard"}`
	if got.StatusCode != 508 || body != want {
		t.Fatalf("unexpected answer through a worker that is pinboard; got %d %s; want 508 %s", got.StatusCode, body, want)
	}
	route, ok := rg.store.Lookup([]byte("/loop"), []byte("alice"), rg.now())
	if !ok || route.Owner.SessionID != res.SessionID {
		t.Fatalf("unexpected placement of /loop/alice; got %+v, %v; want the looping session %s", route, ok, res.SessionID)
	}

	// What a client sends in the header is stripped, as before: a forgery,
	// and a well-formed token for a session nobody registered.
	for _, tok := range []string{"forged", "eyJhbGciOiJIUzI1NiIsInR5cCI6InBpbmJvYXJkK2p3dCJ9.eyJhdWQiOiJub2JvZHkiLCJpYXQiOjEsImV4cCI6MzF9.c2ln"} {
		got, body := rg.get("/counters/alice/x", map[string]string{"Pinboard-Attestation": tok})
		if got.StatusCode != 200 {
			t.Fatalf("unexpected answer to a request with attestation %q; got %d %s; want 200", tok, got.StatusCode, body)
		}
		if s := decodeSeen(t, body); s.Claims == nil || s.Claims.Aud != w.session.Load().(string) || len(s.Header["Pinboard-Attestation"]) != 1 {
			t.Fatalf("unexpected attestation at the worker; got %+v, %q; want pinboard's own only", s.Claims, s.Header["Pinboard-Attestation"])
		}
	}
}
