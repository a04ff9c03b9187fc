package proxy

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

// The data plane's authorization matrix (R-TR-4, docs/PROTOCOL.md §2
// "Namespace policies"): every policy form — anonymous, authenticated,
// authenticated with scopes, deny, the "*" catch-all, a glob — × every
// kind of credential, each with its status and body. An admitted passport
// credential is consumed (no Authorization reaches the worker, the account
// rides in the attestation); any other Authorization passes untouched
// where the policy admits anonymous clients.
func TestDataPlaneAuthorizationMatrix_RTR4(t *testing.T) {
	raw := `{"providers":[{"type":"staticToken","id":"p","keys":[
		{"name":"all","token":{"env":"ALL"},"scopes":["app:read"],"claims":{"pinboard":{"namespaces":["*"]}}},
		{"name":"auth-only","token":{"env":"AUTH"},"scopes":["app:read"],"claims":{"pinboard":{"namespaces":["/auth"]}}},
		{"name":"noscope","token":{"env":"NOSCOPE"},"claims":{"pinboard":{"namespaces":["*"]}}},
		{"name":"noclaims","token":{"env":"NOCLAIMS"},"scopes":["app:read","pinboard:operator"]}
	]}],"namespaces":{
		"*":{"allow":"authenticated"},
		"/anon":{"allow":"anonymous"},
		"/auth":{"allow":"authenticated"},
		"/scoped":{"allow":"authenticated","scopes":["app:read"]},
		"/locked":{"allow":"deny"},
		"/pub-*":{"allow":"anonymous"}}}`
	pp := tokPassport(t, raw)
	rg := newRig(t, func(o *Options) { o.Passport = pp })
	rg.warm()
	w := newStandin(t, "w")
	rg.add(w, 1, "/anon", "/auth", "/scoped", "/locked", "/pub-eu", "/plain")

	const (
		unauthorized = `{"error":"unauthorized"}`
		forbidden    = `{"error":"forbidden"}`
	)
	creds := []struct {
		name, auth string // auth "" sends none
		sub        string // the passport account it presents, if any
	}{
		{"none", "", ""},
		{"basic", "Basic dXNlcjpwYXNz", ""},
		{"unknown bearer", "Bearer app-jwt", ""},
		{"all", "Bearer tok-ALL", "p:all"},
		{"all, scheme lower case", "bearer tok-ALL", "p:all"},
		{"auth-only", "Bearer tok-AUTH", "p:auth-only"},
		{"noscope", "Bearer tok-NOSCOPE", "p:noscope"},
		{"noclaims", "Bearer tok-NOCLAIMS", "p:noclaims"},
	}
	// want per namespace, per credential: 200, 401 or 403.
	want := map[string]map[string]int{
		"/anon":   {"none": 200, "basic": 200, "unknown bearer": 200, "all": 200, "all, scheme lower case": 200, "auth-only": 200, "noscope": 200, "noclaims": 200},
		"/pub-eu": {"none": 200, "basic": 200, "unknown bearer": 200, "all": 200, "all, scheme lower case": 200, "auth-only": 200, "noscope": 200, "noclaims": 200},
		"/auth":   {"none": 401, "basic": 401, "unknown bearer": 401, "all": 200, "all, scheme lower case": 200, "auth-only": 200, "noscope": 200, "noclaims": 403},
		"/scoped": {"none": 401, "basic": 401, "unknown bearer": 401, "all": 200, "all, scheme lower case": 200, "auth-only": 403, "noscope": 403, "noclaims": 403},
		// "*": authenticated, with the claims of the key.
		"/plain": {"none": 401, "basic": 401, "unknown bearer": 401, "all": 200, "all, scheme lower case": 200, "auth-only": 403, "noscope": 200, "noclaims": 403},
		// Deny: no credential can help, so 403 even without one.
		"/locked": {"none": 403, "basic": 403, "unknown bearer": 403, "all": 403, "all, scheme lower case": 403, "auth-only": 403, "noscope": 403, "noclaims": 403},
	}
	for ns, row := range want {
		for _, c := range creds {
			status, found := row[c.name]
			if !found {
				t.Fatalf("BUG: the matrix has no cell for %s × %s", ns, c.name)
			}
			t.Run(ns+"/"+c.name, func(t *testing.T) {
				hdr := map[string]string{}
				if c.auth != "" {
					hdr["Authorization"] = c.auth
				}
				before := w.hits.Load()
				res, body := rg.get(ns+"/x/value", hdr)
				if res.StatusCode != status {
					t.Fatalf("unexpected status; got %d %s; want %d", res.StatusCode, body, status)
				}
				switch status {
				case 401, 403:
					wantBody := forbidden
					if status == 401 {
						wantBody = unauthorized
					}
					if body != wantBody || res.Header.Get("Content-Type") != "application/json" {
						t.Fatalf("unexpected refusal; got %s (%s); want %s (application/json)", body, res.Header.Get("Content-Type"), wantBody)
					}
					if n := w.hits.Load() - before; n != 0 {
						t.Fatalf("a refused request reached the worker %d times", n)
					}
					return
				}
				s := decodeSeen(t, body)
				got := http.Header(s.Header).Get("Authorization")
				switch {
				case c.sub != "":
					// Consumed: the account rides in the attestation.
					if got != "" || s.Claims.Acct == nil || s.Claims.Acct.Sub != c.sub {
						t.Fatalf("unexpected credential at the worker; got Authorization %q, acct %+v; want none, acct %s", got, s.Claims.Acct, c.sub)
					}
				default:
					if got != c.auth || s.Claims.Acct != nil {
						t.Fatalf("unexpected Authorization at the worker; got %q, acct %+v; want %q untouched, no acct", got, s.Claims.Acct, c.auth)
					}
				}
			})
		}
	}
}

// A passport credential on an attested cluster call (R-TR-6) is consumed
// as on any data-plane request (R-TR-4): the call is attested by its
// session, and the Authorization of a passport key never reaches a worker.
// Forwarded, an instance that called through a client carrying its
// deployment's pinboard token handed that token to the callee's worker —
// another tenant's, on a namespace open to anonymous clients — which could
// then register, heartbeat or drain as that account. Any other
// Authorization still passes untouched, and the WebSocket path is the
// same.
func TestClusterCallPassportCredentialConsumed_RTR4_RTR6(t *testing.T) {
	raw := `{"providers":[{"type":"staticToken","id":"p","keys":[
		{"name":"tenant-a","token":{"env":"A"},"scopes":["pinboard:worker","pinboard:operator"],"claims":{"pinboard":{"namespaces":["/a"],"allowedBackendHosts":["*"]}}}
	]}],"namespaces":{"*":{"allow":"authenticated"},"/open":{"allow":"anonymous"}}}`
	pp := tokPassport(t, raw)
	rg := newRig(t, func(o *Options) { o.Passport = pp })
	rg.warm()
	a, b := newStandin(t, "a"), newStandin(t, "b")
	rg.add(a, 1, "/a")
	rg.add(b, 1, "/open")
	call := func(auth string) map[string]string {
		return map[string]string{
			"Pinboard-Session":        a.session.Load().(string),
			"Pinboard-Session-Secret": a.secret,
			"Pinboard-From":           "/a/alice",
			"Authorization":           auth,
		}
	}
	for _, c := range []struct{ auth, want string }{
		{"Bearer tok-A", ""},
		{"bearer tok-A", ""},
		{"Bearer app-jwt", "Bearer app-jwt"},
	} {
		res, body := rg.get("/open/bob/value", call(c.auth))
		if res.StatusCode != 200 {
			t.Fatalf("unexpected reply to a cluster call with Authorization %q; got %d %s; want 200", c.auth, res.StatusCode, body)
		}
		s := decodeSeen(t, body)
		if got := http.Header(s.Header).Get("Authorization"); got != c.want || s.Worker != "b" {
			t.Fatalf("unexpected Authorization at worker %s for a cluster call sending %q; got %q; want %q", s.Worker, c.auth, got, c.want)
		}
	}
	// A WebSocket handshake: the worker's answer (a 404 here) is relayed,
	// and what reached it is recorded.
	var seenAuth atomic.Pointer[[]string]
	b.route("/ws", func(rw http.ResponseWriter, r *http.Request) {
		v := r.Header.Values("Authorization")
		seenAuth.Store(&v)
		rw.WriteHeader(http.StatusNotFound)
	})
	req := upgradeRequest("/open/carol/ws")
	req = strings.TrimSuffix(req, "\r\n") + "Pinboard-Session: " + a.session.Load().(string) + "\r\nPinboard-Session-Secret: " + a.secret +
		"\r\nPinboard-From: /a/alice\r\nAuthorization: Bearer tok-A\r\n\r\n"
	if line, _ := rg.rawStatus(req); !strings.Contains(line, " 404") {
		t.Fatalf("unexpected answer to a cluster call's upgrade; got %q; want the worker's 404", line)
	}
	if v := seenAuth.Load(); v == nil || len(*v) != 0 {
		t.Fatalf("unexpected Authorization at the worker for a cluster call's upgrade; got %v; want none", v)
	}
}
