package registry

import (
	"encoding/json"
	"net"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/attest"
)

// matrixPassport holds one key per kind of credential the authorization
// matrix tries. Its "worker" key has the harness's workerToken, so that
// harness.register registers the victim session as that account.
func matrixPassport(t testing.TB) *attest.Passport {
	t.Helper()
	raw := `{"providers":[{"type":"staticToken","id":"m","keys":[
		{"name":"worker","token":{"env":"W"},"scopes":["pinboard:worker"],"claims":{"pinboard":{"namespaces":["*"],"allowedBackendHosts":["127.0.0.1"]}}},
		{"name":"operator","token":{"env":"O"},"scopes":["pinboard:operator"],"claims":{"pinboard":{"namespaces":["*"]}}},
		{"name":"both","token":{"env":"B"},"scopes":["pinboard:worker","pinboard:operator"],"claims":{"pinboard":{"namespaces":["*"],"allowedBackendHosts":["127.0.0.1"]}}},
		{"name":"narrow","token":{"env":"N"},"scopes":["pinboard:worker","pinboard:operator"],"claims":{"pinboard":{"namespaces":["/other"],"allowedBackendHosts":["*"]}}},
		{"name":"nobackend","token":{"env":"NB"},"scopes":["pinboard:worker","pinboard:operator"],"claims":{"pinboard":{"namespaces":["*"],"allowedBackendHosts":["10.0.0.1"]}}},
		{"name":"hosts","token":{"env":"H"},"scopes":["pinboard:worker","pinboard:operator"],"claims":{"pinboard":{"namespaces":["*"],"allowedBackendHosts":["127.0.0.1"],"hostnames":["*.staging.example"]}}},
		{"name":"envs","token":{"env":"E"},"scopes":["pinboard:worker","pinboard:operator"],"claims":{"pinboard":{"namespaces":["*"],"allowedBackendHosts":["127.0.0.1"],"envs":["staging"]}}},
		{"name":"noclaims","token":{"env":"NC"},"scopes":["pinboard:worker","pinboard:operator"]},
		{"name":"app","token":{"env":"A"},"scopes":["app:read"],"claims":{"pinboard":{"namespaces":["*"],"allowedBackendHosts":["*"]}}}
	]}],"namespaces":{"*":{"allow":"anonymous"}}}`
	env := map[string]string{"W": workerToken, "O": "m-operator", "B": "m-both", "N": "m-narrow", "NB": "m-nobackend",
		"H": "m-hosts", "E": "m-envs", "NC": "m-noclaims", "A": "m-app"}
	pp, err := attest.ParsePassport([]byte(raw), func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatalf("cannot parse the matrix passport: %v", err)
	}
	return pp
}

// doAuth runs one request through r with the Authorization header given
// verbatim (none when authorization is nil).
func (h *harness) doAuth(r *Registry, method, path string, authorization *string, body string) response {
	h.t.Helper()
	var req fasthttp.Request
	req.Header.SetMethod(method)
	req.SetRequestURI(path)
	if authorization != nil {
		req.Header.Set("Authorization", *authorization)
	}
	if body != "" {
		req.Header.SetContentType("application/json")
		req.SetBodyString(body)
	}
	var ctx fasthttp.RequestCtx
	ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}, nil)
	p := []byte(path)
	if i := indexByte(p, '?'); i >= 0 {
		p = p[:i]
	}
	r.ServeHTTP(&ctx, p)
	hdr := &fasthttp.ResponseHeader{}
	ctx.Response.Header.CopyTo(hdr)
	return response{status: ctx.Response.StatusCode(), body: string(ctx.Response.Body()), header: hdr}
}

// The authorization matrix (R-TR-1..3, R-REG-1..6, docs/PROTOCOL.md §2
// and §6): every registry and operator endpoint × every kind of
// credential, each answered with the documented status and body. The
// world each cell runs against: one worker ("victim", clientId victim)
// registered by the worker key with hostname app.example and env prod,
// serving /counters and /tickers and holding /counters/alice.
//
//   - No credential, or one that is not "Bearer <passport token>": 401
//     {"error":"unauthorized"} everywhere, whatever the scheme's case or
//     the token's near misses.
//   - A passport key without the endpoint's scope: 403 {"error":"forbidden"}.
//   - With the scope, the claims decide: namespaces, allowedBackendHosts
//     (register), hostnames and envs (a registration's, and the workers an
//     operator reaches), and the account (a session's heartbeat, release
//     and deregister are its registering account's alone).
func TestAuthorizationMatrix_RTR1_RTR2_RTR3(t *testing.T) {
	const (
		unauthorized = `{"error":"unauthorized"}`
		forbidden    = `{"error":"forbidden"}`
	)
	bearer := func(token string) *string { s := "Bearer " + token; return &s }
	raw := func(s string) *string { return &s }
	type cred struct {
		name string
		auth *string
	}
	// Credentials that never authenticate: each cell answers 401.
	refused := []cred{
		{"none", nil},
		{"empty header", raw("")},
		{"unknown token", bearer("nobody")},
		{"token in another case", bearer(strings.ToUpper(workerToken))},
		{"token prefix", bearer(workerToken[:len(workerToken)-1])},
		{"token with a suffix", bearer(workerToken + "x")},
		{"scheme only", raw("Bearer")},
		{"scheme and space", raw("Bearer ")},
		{"no space after the scheme", raw("Bearer" + workerToken)},
		{"tab after the scheme", raw("Bearer\t" + workerToken)},
		{"bare token", raw(workerToken)},
		{"basic scheme", raw("Basic " + workerToken)},
		{"token scheme", raw("Token " + workerToken)},
		{"two tokens", raw("Bearer " + workerToken + " m-operator")},
		{"token, comma", raw("Bearer " + workerToken + ",")},
	}
	// What a worker-scoped credential registers, per cell (a URL of its own).
	register := func(h *harness) string {
		c, v := h.fw.pair("m")
		return mustJSON(t, map[string]any{
			"clientId": "newcomer", "secret": h.fw.secret, "namespaces": []string{"/counters"},
			"advertiseUrl": h.fw.srv.URL + "/newcomer", "headroom": 1, "draining": false,
			"challenge": c, "challengeValue": v, "hostname": "app.example", "env": "prod",
		})
	}
	type endpoint struct {
		method, path string
		body         func(h *harness, session string) string
	}
	endpoints := map[string]endpoint{
		"register":  {"POST", "/registry/register", func(h *harness, _ string) string { return register(h) }},
		"heartbeat": {"POST", "/registry/heartbeat", func(h *harness, s string) string { return h.beatBody(s, nil) }},
		"release": {"POST", "/registry/release", func(_ *harness, s string) string {
			return `[{"sessionId":"` + s + `","namespace":"/counters","id":"alice"}]`
		}},
		"deregister": {"POST", "/registry/deregister", func(_ *harness, s string) string { return `{"sessionId":"` + s + `"}` }},
		"workers":    {"GET", "/registry/workers", nil},
		"health":     {"GET", "/registry/health", nil},
		"placement":  {"GET", "/registry/placement?namespace=/counters&id=alice", nil},
		"drain":      {"POST", "/registry/drain", func(*harness, string) string { return `{"clientId":"victim"}` }},
		"undrain":    {"POST", "/registry/undrain", func(*harness, string) string { return `{"clientId":"victim"}` }},
		"wind-down": {"POST", "/registry/wind-down", func(*harness, string) string {
			return `{"namespace":"/counters","id":"alice","deadline":30}`
		}},
	}
	order := []string{"register", "heartbeat", "release", "deregister", "workers", "health", "placement", "drain", "undrain", "wind-down"}
	// want is a cell's answer: the status and the exact body, or with a
	// leading "~" a part of it (an answer that names a fresh session).
	type want struct {
		status int
		body   string
	}
	ok := func(body string) want { return want{200, body} }
	no := want{403, forbidden}
	noWorkers := ok(`{"workers":[]}`)
	health := func(n string) want {
		return ok(`{"ok":true,"store":"memory","quarantineMs":0,"leaseTtlMs":15000,"workers":` + n + `}`)
	}
	listed := ok(`~"clientId":"victim"`)
	placed := ok(`~"namespace":"/counters","id":"alice","sessionId":`)
	drained := ok(`{"clientId":"victim","draining":true}`)
	undrained := ok(`{"clientId":"victim","draining":false}`)
	wound := ok(`~"msgId":`)
	registered := ok(`~"sessionId":`)
	// Worker endpoints on the victim's session: its account alone.
	mine := map[string]want{"heartbeat": ok(`{"expiresInMs":15000,"draining":false}`), "release": ok(`{"released":1}`), "deregister": ok(`{"ok":true}`)}
	notMine := map[string]want{"heartbeat": no, "release": no, "deregister": no}
	opScopeOnly := map[string]want{"workers": no, "health": no, "placement": no, "drain": no, "undrain": no, "wind-down": no}
	workerScopeOnly := map[string]want{"register": no, "heartbeat": no, "release": no, "deregister": no}
	merge := func(ms ...map[string]want) map[string]want {
		out := map[string]want{}
		for _, m := range ms {
			for k, v := range m {
				out[k] = v
			}
		}
		return out
	}
	operatorAll := map[string]want{"workers": listed, "health": health("1"), "placement": placed, "drain": drained, "undrain": undrained, "wind-down": wound}
	operatorNone := map[string]want{"workers": noWorkers, "health": health("0"), "placement": no, "drain": no, "undrain": no, "wind-down": no}
	cells := []struct {
		cred
		want map[string]want
	}{
		// Scheme case is free (RFC 9110 §11.1), and optional white space
		// around the token is not part of it.
		{cred{"worker", bearer(workerToken)}, merge(opScopeOnly, mine, map[string]want{"register": registered})},
		{cred{"worker, scheme lower case", raw("bearer " + workerToken)}, merge(opScopeOnly, mine, map[string]want{"register": registered})},
		{cred{"worker, scheme upper case", raw("BEARER " + workerToken)}, merge(opScopeOnly, mine, map[string]want{"register": registered})},
		{cred{"worker, spaces around the token", raw("Bearer   " + workerToken + " \t")}, merge(opScopeOnly, mine, map[string]want{"register": registered})},
		{cred{"operator", bearer("m-operator")}, merge(workerScopeOnly, operatorAll)},
		{cred{"a scope pinboard does not use", bearer("m-app")}, merge(workerScopeOnly, opScopeOnly)},
		// Both scopes, another account: the victim's session is not its.
		{cred{"both scopes", bearer("m-both")}, merge(notMine, operatorAll, map[string]want{"register": registered})},
		{cred{"namespaces exclude /counters", bearer("m-narrow")}, merge(notMine, operatorNone, map[string]want{
			"register": {403, `{"error":"forbidden: namespace /counters is not covered by the credential's claims"}`},
		})},
		{cred{"allowedBackendHosts exclude 127.0.0.1", bearer("m-nobackend")}, merge(notMine, operatorAll, map[string]want{
			"register": {403, `~"error":"forbidden: advertise host \"127.0.0.1:`},
		})},
		{cred{"hostnames exclude app.example", bearer("m-hosts")}, merge(notMine, operatorNone, map[string]want{
			"register": {403, `{"error":"forbidden: hostname app.example is not covered by the credential's claims"}`},
		})},
		{cred{"envs exclude prod", bearer("m-envs")}, merge(notMine, operatorNone, map[string]want{
			"register": {403, `{"error":"forbidden: env prod is not covered by the credential's claims"}`},
		})},
		// Claims missing: a key that reaches nothing.
		{cred{"no claims", bearer("m-noclaims")}, merge(notMine, operatorNone, map[string]want{
			"register": {403, `{"error":"forbidden: namespace /counters is not covered by the credential's claims"}`},
		})},
	}
	for _, c := range refused {
		all := map[string]want{}
		for _, e := range order {
			all[e] = want{401, unauthorized}
		}
		cells = append(cells, struct {
			cred
			want map[string]want
		}{c, all})
	}
	for _, cell := range cells {
		for _, name := range order {
			w, found := cell.want[name]
			if !found {
				t.Fatalf("BUG: the matrix has no cell for %s × %s", cell.name, name)
			}
			t.Run(cell.name+"/"+name, func(t *testing.T) {
				h := newHarness(t)
				h.r = h.registry(matrixPassport(t))
				session := h.register(map[string]any{
					"clientId": "victim", "hostname": "app.example", "env": "prod",
					"instances": map[string][]string{"/counters": {"alice"}},
				})
				e := endpoints[name]
				body := ""
				if e.body != nil {
					body = e.body(h, session)
				}
				res := h.doAuth(h.r, e.method, e.path, cell.auth, body)
				match := res.body == w.body
				if part, ok := strings.CutPrefix(w.body, "~"); ok {
					match = strings.Contains(res.body, part)
				}
				if res.status != w.status || !match {
					t.Fatalf("unexpected reply to %s %s with %s; got %d %s; want %d %s", e.method, e.path, cell.name, res.status, res.body, w.status, w.body)
				}
				// RFC 9110 §15.5.2: a 401 MUST carry a challenge; nothing
				// else does.
				if got, want := string(res.header.Peek("WWW-Authenticate")), map[bool]string{true: "Bearer"}[w.status == 401]; got != want {
					t.Fatalf("unexpected challenge of %d to %s %s with %s; got %q; want %q", res.status, e.method, e.path, cell.name, got, want)
				}
				if w.status != 200 {
					// A refusal touches nothing: the victim keeps its
					// session, its placement and no drain.
					var ws struct {
						Workers []struct {
							SessionID     string `json:"sessionId"`
							OperatorDrain bool   `json:"operatorDrain"`
							Placements    int    `json:"placements"`
						} `json:"workers"`
					}
					got := h.get("/registry/workers", "m-operator")
					if err := json.Unmarshal([]byte(got.body), &ws); err != nil || len(ws.Workers) != 1 ||
						ws.Workers[0].SessionID != session || ws.Workers[0].OperatorDrain || ws.Workers[0].Placements != 1 {
						t.Fatalf("unexpected victim after a refused %s by %s; got %s", name, cell.name, got.body)
					}
				}
			})
		}
	}
}
