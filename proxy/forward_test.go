package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/attest"
	"github.com/pinboard-go/pinboard/directory"
)

// A rig is a proxy on 127.0.0.1 in front of Go stand-in workers that verify
// attestations exactly as the reference worker does (attest.VerifyAttestation
// mirrors pinned.pinboard.attestation.verify_attestation).

const clientToken = "client-token"

func rigPassport(t *testing.T) *attest.Passport {
	t.Helper()
	raw := `{"providers":[{"type":"staticToken","id":"p","keys":[
		{"name":"client","token":{"env":"C"},"scopes":["app:read"],"claims":{"pinboard":{"namespaces":["/secure"]},"team":"blue"}}
	]}],"namespaces":{"*":{"allow":"anonymous"},"/secure":{"allow":"authenticated","scopes":["app:read"]}}}`
	pp, err := attest.ParsePassport([]byte(raw), func(k string) (string, bool) { return clientToken, k == "C" })
	if err != nil {
		t.Fatal(err)
	}
	return pp
}

// tokPassport parses the passport raw, each key's token.env NAME holding
// the token "tok-NAME".
func tokPassport(t *testing.T, raw string) *attest.Passport {
	t.Helper()
	pp, err := attest.ParsePassport([]byte(raw), func(k string) (string, bool) { return "tok-" + k, true })
	if err != nil {
		t.Fatal(err)
	}
	return pp
}

type seen struct {
	Worker  string              `json:"worker"`
	Method  string              `json:"method"`
	URI     string              `json:"uri"`
	Header  map[string][]string `json:"header"`
	BodyLen int                 `json:"bodyLen"`
	Claims  *attest.AttestationClaims
}

type standin struct {
	name    string
	srv     *httptest.Server
	secret  string
	session atomic.Value
	// handle overrides the default echo for a path suffix.
	mu     sync.Mutex
	routes map[string]http.HandlerFunc
	hits   atomic.Int64
	// unattested runs on every 403 "invalid attestation" answered.
	unattested atomic.Pointer[func()]
}

func newStandin(t *testing.T, name string) *standin {
	t.Helper()
	s := &standin{name: name, secret: "secret-" + name, routes: map[string]http.HandlerFunc{}}
	s.session.Store("")
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *standin) serve(w http.ResponseWriter, r *http.Request) {
	s.hits.Add(1)
	claims, err := attest.VerifyAttestation(r.Header.Get("pinboard-attestation"), []byte(s.secret), []string{s.session.Load().(string)}, time.Now())
	if err != nil {
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte(`{"detail":"invalid attestation"}`))
		if fn := s.unattested.Load(); fn != nil {
			(*fn)()
		}
		return
	}
	s.mu.Lock()
	var h http.HandlerFunc
	for suffix, fn := range s.routes {
		if strings.HasSuffix(r.URL.Path, suffix) {
			h = fn
		}
	}
	s.mu.Unlock()
	if h != nil {
		h(w, r)
		return
	}
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(seen{Worker: s.name, Method: r.Method, URI: r.RequestURI, Header: r.Header, BodyLen: len(body), Claims: claims})
}

// unattestedOnce makes s refuse the attestations of its next request, as a
// worker that has not taken its session from the register ack yet, and
// take the session back at that refusal; the returned func ends it.
func (s *standin) unattestedOnce() (done func()) {
	session := s.session.Load().(string)
	s.session.Store("")
	fn := func() { s.session.Store(session) }
	s.unattested.Store(&fn)
	return func() { s.unattested.Store(nil) }
}

func (s *standin) route(suffix string, fn http.HandlerFunc) {
	s.mu.Lock()
	s.routes[suffix] = fn
	s.mu.Unlock()
}

// waitUntil polls cond for up to 10 s (generous for a loaded machine
// under -race), failing the test with what it waited for.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("unexpected wait of 10s for %s", what)
		}
	}
}

// readHead reads a response's status line and header from br, up to and
// including the blank line that ends them, and returns those lines without
// their line ends (the status line first); br is left at the body.
func readHead(t *testing.T, br *bufio.Reader) []string {
	t.Helper()
	var head []string
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("cannot read the response header after %q: %v", head, err)
		}
		if line == "\r\n" {
			return head
		}
		head = append(head, strings.TrimSpace(line))
	}
}

type rig struct {
	t     *testing.T
	store *directory.Memory
	p     *Proxy
	url   string
	clock atomic.Pointer[time.Time]
}

func newRig(t *testing.T, opts func(*Options)) *rig {
	t.Helper()
	rg := &rig{t: t}
	now := time.Now()
	rg.clock.Store(&now)
	rg.store = directory.NewMemory(10*time.Second, now)
	// Relayed event streams resume on the rig's server, as on a node.
	var srv *fasthttp.Server
	o := Options{Store: rg.store, Passport: rigPassport(t), Now: rg.now,
		Resume: func(c net.Conn) error { return srv.ServeConn(c) }}
	if opts != nil {
		opts(&o)
	}
	rg.p = New(o)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv = &fasthttp.Server{
		Handler: rg.p.ServeHTTP, StreamRequestBody: true, DisablePreParseMultipartForm: true,
		NoDefaultServerHeader: true, NoDefaultDate: true, NoDefaultContentType: true,
		MaxRequestBodySize: 1 << 40, KeepHijackedConns: true,
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { rg.p.CloseStreams(); _ = srv.Shutdown() })
	rg.url = "http://" + ln.Addr().String()
	return rg
}

func (rg *rig) now() time.Time { return *rg.clock.Load() }

func (rg *rig) advance(d time.Duration) {
	n := rg.now().Add(d)
	rg.clock.Store(&n)
}

// add registers a stand-in for namespaces and returns it.
func (rg *rig) add(s *standin, headroom float64, ns ...string) {
	rg.t.Helper()
	res, err := rg.store.Register(rg.t.Context(), &directory.Registration{
		ClientID: "client-" + s.name, Sub: "p:worker", Secret: s.secret, Namespaces: ns,
		AdvertiseURL: s.srv.URL, Headroom: headroom,
	}, rg.now())
	if err != nil {
		rg.t.Fatal(err)
	}
	s.session.Store(res.SessionID)
}

// newRigWorker is a warm rig with one stand-in worker "w" serving
// /counters: the set-up most data-plane tests start from.
func newRigWorker(t *testing.T, opts func(*Options)) (*rig, *standin) {
	t.Helper()
	rg := newRig(t, opts)
	rg.warm()
	w := newStandin(t, "w")
	rg.add(w, 1, "/counters")
	return rg, w
}

// warm passes the cold-start quarantine.
func (rg *rig) warm() {
	_, err := rg.store.Place(rg.t.Context(), &directory.PlaceRequest{NS: "/warm", ID: "x", Now: rg.now()})
	var q *directory.QuarantineError
	if errors.As(err, &q) {
		rg.advance(q.Remaining)
	}
}

func (rg *rig) do(req *http.Request) (*http.Response, string) {
	rg.t.Helper()
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		rg.t.Fatalf("cannot %s %s: %v", req.Method, req.URL, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

func (rg *rig) get(path string, hdr map[string]string) (*http.Response, string) {
	req, _ := http.NewRequest("GET", rg.url+path, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	return rg.do(req)
}

func decodeSeen(t *testing.T, body string) seen {
	t.Helper()
	var s seen
	if err := json.Unmarshal([]byte(body), &s); err != nil {
		t.Fatalf("cannot decode the worker's echo %q: %v", body, err)
	}
	return s
}

func TestForward_RDP1_RTR5(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	w := newStandin(t, "w1")
	rg.add(w, 10, "/counters")
	req, _ := http.NewRequest("POST", rg.url+"/counters/alice/inc/x?by=2&z=%2F", strings.NewReader(`{"n":1}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Pinboard-Attestation", "forged")
	req.Header.Set("Pinboard-Session-Secret", "x")
	req.Header.Set("Connection", "keep-alive, X-Hop")
	req.Header.Set("X-Hop", "1")
	req.Header.Set("X-Forwarded-For", "6.6.6.6")
	req.Header.Set("Traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	res, body := rg.do(req)
	if res.StatusCode != 200 {
		t.Fatalf("unexpected status %d %s", res.StatusCode, body)
	}
	s := decodeSeen(t, body)
	if s.Method != "POST" || s.URI != "/counters/alice/inc/x?by=2&z=%2F" || s.BodyLen != 7 {
		t.Fatalf("unexpected forward; got %+v", s)
	}
	if s.Claims.Aud != w.session.Load().(string) || s.Claims.HasCaller || s.Claims.Acct != nil || s.Claims.Expires != s.Claims.IssuedAt+30 {
		t.Fatalf("unexpected attestation claims %+v", s.Claims)
	}
	hdr := http.Header(s.Header)
	if hdr.Get("X-Hop") != "" || hdr.Get("Pinboard-Session-Secret") != "" {
		t.Fatalf("unexpected hop-by-hop or reserved header forwarded: %v", hdr)
	}
	if hdr.Get("X-Forwarded-For") != "127.0.0.1" || hdr.Get("X-Forwarded-Proto") != "http" {
		t.Fatalf("unexpected forwarding headers (untrusted XFF must be replaced): %v", hdr)
	}
	if hdr.Get("Traceparent") != "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" {
		t.Fatalf("unexpected traceparent: %q", hdr.Get("Traceparent"))
	}
	if hdr.Get("Content-Type") != "application/json" || hdr.Get("User-Agent") != "Go-http-client/1.1" {
		t.Fatalf("unexpected end-to-end headers: %v", hdr)
	}
	p, _ := rg.store.Placement(t.Context(), "/counters", "alice", rg.now())
	if hdr.Get("Pinboard-Epoch") != formatUint(p.Epoch) {
		t.Fatalf("unexpected epoch header %q; want %d", hdr.Get("Pinboard-Epoch"), p.Epoch)
	}
	// The attestation is issued at the node's clock, and a later second
	// gets a fresh one (the per-second cache must not hand out its first
	// token for ever: workers refuse it 30 s past its exp).
	if want := rg.now().Unix(); s.Claims.IssuedAt != want {
		t.Fatalf("unexpected attestation iat; got %d; want %d", s.Claims.IssuedAt, want)
	}
	rg.advance(5 * time.Second)
	res, body = rg.get("/counters/alice/inc/x", nil)
	if res.StatusCode != 200 {
		t.Fatalf("unexpected status 5s on; got %d %s", res.StatusCode, body)
	}
	if got, want := decodeSeen(t, body).Claims.IssuedAt, rg.now().Unix(); got != want {
		t.Fatalf("unexpected attestation iat 5s on; got %d; want %d", got, want)
	}
}

func formatUint(n uint64) string { return fmt.Sprint(n) }

func TestErrors_RDP4_RPL5_RCS1(t *testing.T) {
	// A dead owner must fail fast, not after the dial timeout or the wait
	// for a pooled connection: an hour each here, so that a bounded wait
	// tells the two apart on any machine (no bound on a duration).
	rg := newRig(t, func(o *Options) { o.Upstream.DialTimeout, o.Upstream.ConnWait = time.Hour, time.Hour })
	// Cold start: the first placement attempt stamps the quarantine.
	res, body := rg.get("/counters/alice/value", nil)
	if res.StatusCode != 503 || res.Header.Get("Retry-After") != "10" || !strings.HasPrefix(body, `{"error":"cold start`) {
		t.Fatalf("unexpected cold start reply; got %d %q %s", res.StatusCode, res.Header.Get("Retry-After"), body)
	}
	// The rest of the quarantine in whole seconds, rounded up: 7.5 s is 8.
	rg.advance(2500 * time.Millisecond)
	if res, body := rg.get("/counters/alice/value", nil); res.StatusCode != 503 || res.Header.Get("Retry-After") != "8" {
		t.Fatalf("unexpected reply 7.5s before the quarantine ends; got %d Retry-After %q %s; want 503 and 8", res.StatusCode, res.Header.Get("Retry-After"), body)
	}
	rg.advance(7500 * time.Millisecond)
	cases := []struct {
		path   string
		status int
		body   string
	}{
		{"/counters/alice/value", 404, `{"error":"unknown namespace"}`},
		{"/counters", 404, `{"error":"not found"}`},
		{"/counters/al%20ice/value", 400, `{"error":"id must contain only [A-Za-z0-9._~-]"}`},
		{"/counters/alice/../../x", 400, `{"error":"path must not contain . or .. segments"}`},
	}
	for _, tc := range cases {
		res, body := rg.get(tc.path, nil)
		if res.StatusCode != tc.status || body != tc.body || res.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("unexpected reply for %s; got %d %s; want %d %s", tc.path, res.StatusCode, body, tc.status, tc.body)
		}
	}
	// A registered but dead owner: connection refused fails fast with 502.
	w := newStandin(t, "dead")
	rg.add(w, 1, "/counters")
	w.srv.Close()
	client := &http.Client{Timeout: 20 * time.Second}
	res, err := client.Get(rg.url + "/counters/alice/value")
	if err != nil {
		t.Fatalf("unexpected wait for a dead owner (dial timeout and connection wait 1h); got %v; want 502 at once", err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if body = string(b); res.StatusCode != 502 || body != `{"error":"owner unreachable"}` {
		t.Fatalf("unexpected reply for a dead owner; got %d %s", res.StatusCode, body)
	}
	// Draining workers only: 503 with Retry-After.
	_, _ = rg.store.SetDrain(t.Context(), "client-dead", directory.DrainState{Draining: true}, rg.now())
	res, body = rg.get("/counters/bob/value", nil)
	if res.StatusCode != 503 || res.Header.Get("Retry-After") != "1" || !strings.HasPrefix(body, `{"error":"no worker`) {
		t.Fatalf("unexpected reply with only drained workers; got %d %s", res.StatusCode, body)
	}
	// A store that does not answer: 503 with Retry-After too.
	down := newRig(t, func(o *Options) { o.Store = unplaceableStore{o.Store} })
	res, body = down.get("/counters/bob/value", nil)
	if res.StatusCode != 503 || res.Header.Get("Retry-After") != "1" || body != `{"error":"directory unavailable"}` {
		t.Fatalf("unexpected reply with the store down; got %d Retry-After %q %s; want 503, 1, directory unavailable", res.StatusCode, res.Header.Get("Retry-After"), body)
	}
}

// unplaceableStore is a store whose placements fail as a store that does
// not answer does.
type unplaceableStore struct{ directory.Store }

func (unplaceableStore) Place(context.Context, *directory.PlaceRequest) (directory.Route, error) {
	return directory.Route{}, context.DeadlineExceeded
}

// refuseActivation answers as the reference worker does while its lease
// is unhealthy: 503 with the in-band refusal marker (R-PL-6).
func refuseActivation(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Pinned-Refusal", "lease-unhealthy")
	w.Header().Set("Retry-After", "1")
	w.WriteHeader(503)
	_, _ = w.Write([]byte(`{"detail":"lease unhealthy; refusing new activations"}`))
}

// A worker refusing a new activation in-band is released and the id
// placed once more elsewhere; a second refusal answers 503 (R-PL-6).
func TestInBandRefusal_RPL6(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	a, b := newStandin(t, "a"), newStandin(t, "b")
	a.route("/value", refuseActivation)
	rg.add(a, 1000, "/counters")
	rg.add(b, 1, "/counters")
	res, body := rg.get("/counters/alice/value", nil)
	if res.StatusCode != 200 || decodeSeen(t, body).Worker != "b" {
		t.Fatalf("unexpected reply after one refusal; got %d %s; want b's answer", res.StatusCode, body)
	}
	p, _ := rg.store.Placement(t.Context(), "/counters", "alice", rg.now())
	if p.SessionID != b.session.Load().(string) {
		t.Fatalf("unexpected owner after the retry; got %s", p.SessionID)
	}
	// Both refuse: one retry, then 503 + Retry-After, and no row left on
	// the refusing worker.
	b.route("/value", refuseActivation)
	res, body = rg.get("/counters/carol/value", nil)
	if res.StatusCode != 503 || res.Header.Get("Retry-After") != "1" || !strings.Contains(body, "refused") {
		t.Fatalf("unexpected reply after two refusals; got %d %s", res.StatusCode, body)
	}
	if res.Header.Get("Pinned-Refusal") != "" {
		t.Fatalf("unexpected refusal marker relayed to the client")
	}
	if _, err := rg.store.Placement(t.Context(), "/counters", "carol", rg.now()); !errors.Is(err, directory.ErrNoPlacement) {
		t.Fatalf("unexpected placement left after refusals: %v", err)
	}
	// The retry is elsewhere, never on the worker that refused: with no
	// other worker serving the namespace the refusal is not sent to it a
	// second time, and the answer is still a 503 with Retry-After.
	c := newStandin(t, "c")
	c.route("/value", refuseActivation)
	rg.add(c, 1000, "/solo")
	c.hits.Store(0)
	res, body = rg.get("/solo/dave/value", nil)
	if res.StatusCode != 503 || res.Header.Get("Retry-After") == "" || res.Header.Get("Pinned-Refusal") != "" || c.hits.Load() != 1 {
		t.Fatalf("unexpected reply from a lone refusing worker; got %d %s (Retry-After %q) after %d hits; want 503 with Retry-After after 1", res.StatusCode, body, res.Header.Get("Retry-After"), c.hits.Load())
	}
	// A plain 503 without the marker is relayed as is.
	a.route("/busy", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(503); _, _ = w.Write([]byte("busy")) })
	b.route("/busy", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(503); _, _ = w.Write([]byte("busy")) })
	if res, body := rg.get("/counters/alice/busy", nil); res.StatusCode != 503 || body != "busy" {
		t.Fatalf("unexpected reply for a plain 503; got %d %s", res.StatusCode, body)
	}
}

// The reference worker refuses a WebSocket upgrade for a new activation
// the same way: its resolve dependency raises the refusal before accept
// and starlette sends it as an HTTP denial response, 503 with the marker.
// The id is released and placed once more elsewhere; a second refusal
// answers pinboard's 503, never the marker (R-PL-6).
func TestInBandRefusalWebSocket_RPL6(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	serve := func(w http.ResponseWriter, r *http.Request) {
		if conn, _, ok := accept101(w); ok {
			conn.Close()
		}
	}
	a, b := newStandin(t, "a"), newStandin(t, "b")
	a.route("/ws", refuseActivation)
	b.route("/ws", serve)
	rg.add(a, 1000, "/counters")
	rg.add(b, 1, "/counters")
	if line := rg.upgrade("/counters/alice/ws"); !strings.HasPrefix(line, "HTTP/1.1 101") {
		t.Fatalf("unexpected answer after one refusal; got %q; want b's 101", line)
	}
	p, _ := rg.store.Placement(t.Context(), "/counters", "alice", rg.now())
	if p.SessionID != b.session.Load().(string) {
		t.Fatalf("unexpected owner after the retry; got %s", p.SessionID)
	}
	b.route("/ws", refuseActivation)
	_, br := rg.dialUpgrade("/counters/carol/ws", "")
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != 503 || res.Header.Get("Retry-After") != "1" || !strings.Contains(string(body), "refused") || res.Header.Get("Pinned-Refusal") != "" {
		t.Fatalf("unexpected reply after two refusals; got %d %v %s", res.StatusCode, res.Header, body)
	}
	if _, err := rg.store.Placement(t.Context(), "/counters", "carol", rg.now()); !errors.Is(err, directory.ErrNoPlacement) {
		t.Fatalf("unexpected placement left after refusals: %v", err)
	}
}

// The answer a request gets after the session gap's retry (R-TR-5) is
// relayed with the worker's header fields only: one without Content-Type
// gets none (R-DP-1). Before, the reset between tries turned the server's
// NoDefaultContentType off and it went out as "text/plain; charset=utf-8".
func TestAnswerAfterRetryKeepsHeader_RDP1_RTR5(t *testing.T) {
	rg, w := newRigWorker(t, nil)
	w.route("/bare", func(rw http.ResponseWriter, r *http.Request) {
		rw.Header()["Content-Type"] = nil // no sniffing either
		_, _ = io.WriteString(rw, "bare")
	})
	defer w.unattestedOnce()()
	w.hits.Store(0)
	res, body := rg.get("/counters/alice/bare", nil)
	if res.StatusCode != 200 || body != "bare" || w.hits.Load() != 2 {
		t.Fatalf("unexpected reply; got %d %q after %d hits; want 200 \"bare\" after 2", res.StatusCode, body, w.hits.Load())
	}
	if v, ok := res.Header["Content-Type"]; ok {
		t.Fatalf("unexpected Content-Type on the answer after a retry; got %q; want none, as the worker sent it", v)
	}
}

// A worker learns its session from the register ack, so for a moment
// after pinboard wrote the ack — and for a whole re-registration — it
// refuses attestations for that session with 403 "invalid attestation"
// (R-TR-5). The route never ran, so the proxy asks the directory again
// and resends, a few times over 75 ms, instead of relaying the 403.
func TestUnattestedRetried_RTR5(t *testing.T) {
	rg, w := newRigWorker(t, nil)
	// restore gives the worker back the session alice is placed on.
	restore := func() {
		p, _ := rg.store.Placement(t.Context(), "/counters", "alice", rg.now())
		w.session.Store(p.SessionID)
	}

	t.Run("ack not yet taken", func(t *testing.T) {
		defer w.unattestedOnce()()
		w.hits.Store(0)
		res, body := rg.get("/counters/alice/value", nil)
		if res.StatusCode != 200 || decodeSeen(t, body).Worker != "w" || w.hits.Load() != 2 {
			t.Fatalf("unexpected reply; got %d %s after %d hits; want 200 after 2", res.StatusCode, body, w.hits.Load())
		}
	})

	t.Run("re-registration moves the id", func(t *testing.T) {
		old := w.session.Load().(string)
		// The worker dropped its session and re-registers; the retry must
		// resolve the id again and reach the new session.
		w.session.Store("")
		fn := func() {
			w.unattested.Store(nil)
			res, err := rg.store.Register(t.Context(), &directory.Registration{
				ClientID: "client-w", Sub: "p:worker", Secret: w.secret, Namespaces: []string{"/counters"},
				AdvertiseURL: w.srv.URL, Headroom: 1, PrevSessionID: old,
				Instances: map[string][]string{"/counters": {"alice"}},
			}, rg.now())
			if err != nil {
				t.Error(err)
				return
			}
			w.session.Store(res.SessionID)
		}
		w.unattested.Store(&fn)
		res, body := rg.get("/counters/alice/value", nil)
		if res.StatusCode != 200 || decodeSeen(t, body).Claims.Aud != w.session.Load().(string) {
			t.Fatalf("unexpected reply; got %d %s; want 200 attested for the new session", res.StatusCode, body)
		}
	})

	t.Run("a worker that keeps refusing", func(t *testing.T) {
		w.session.Store("not-the-session")
		defer restore()
		w.hits.Store(0)
		res, body := rg.get("/counters/alice/value", nil)
		if res.StatusCode != 403 || body != `{"detail":"invalid attestation"}` || w.hits.Load() != int64(1+len(unattestedWaits)) {
			t.Fatalf("unexpected reply; got %d %s after %d hits; want the worker's 403 after %d", res.StatusCode, body, w.hits.Load(), 1+len(unattestedWaits))
		}
	})

	t.Run("a streamed body is not replayed", func(t *testing.T) {
		w.session.Store("not-the-session")
		defer restore()
		w.hits.Store(0)
		// Over SmallBody: streamed through. Sent on a connection of its
		// own, the answer read whatever becomes of the body's writes: the
		// worker answers before it read the body, and the rig's server
		// then closes with the body unread. Go's client, writing the body
		// while it waits, reported its failed write instead of the answer
		// now and then (pinboard's own server lingers: server/linger_test.go).
		c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		const size = 1 << 20
		fmt.Fprintf(c, "POST /counters/alice/value HTTP/1.1\r\nHost: pb\r\nContent-Length: %d\r\n\r\n", size)
		go func() { _, _ = c.Write(make([]byte, size)) }()
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("unexpected failure reading the answer; got %v", err)
		}
		b, _ := io.ReadAll(res.Body)
		if res.StatusCode != 403 || string(b) != `{"detail":"invalid attestation"}` || w.hits.Load() != 1 {
			t.Fatalf("unexpected reply; got %d %s after %d hits; want the 403 after 1", res.StatusCode, b, w.hits.Load())
		}
	})

	t.Run("another 403 is relayed at once", func(t *testing.T) {
		w.route("/private", func(rw http.ResponseWriter, r *http.Request) {
			rw.WriteHeader(403)
			_, _ = rw.Write([]byte(`{"detail":"not yours, go away!"}`))
		})
		w.hits.Store(0)
		res, body := rg.get("/counters/alice/private", nil)
		if res.StatusCode != 403 || body != `{"detail":"not yours, go away!"}` || w.hits.Load() != 1 {
			t.Fatalf("unexpected reply; got %d %s after %d hits", res.StatusCode, body, w.hits.Load())
		}
	})
}

// Namespace policies (R-TR-4): an authenticated namespace needs a passport
// credential, which is consumed; the account rides in the attestation.
func TestNamespacePolicy_RTR4(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	w := newStandin(t, "w")
	rg.add(w, 1, "/secure", "/open")
	if res, body := rg.get("/secure/x/value", nil); res.StatusCode != 401 || body != `{"error":"unauthorized"}` {
		t.Fatalf("unexpected anonymous reply; got %d %s", res.StatusCode, body)
	}
	if res, body := rg.get("/secure/x/value", map[string]string{"Authorization": "Bearer wrong"}); res.StatusCode != 401 {
		t.Fatalf("unexpected reply for a wrong token; got %d %s", res.StatusCode, body)
	}
	res, body := rg.get("/secure/x/value", map[string]string{"Authorization": "Bearer " + clientToken})
	if res.StatusCode != 200 {
		t.Fatalf("unexpected reply; got %d %s", res.StatusCode, body)
	}
	s := decodeSeen(t, body)
	if http.Header(s.Header).Get("Authorization") != "" {
		t.Fatalf("unexpected pinboard credential forwarded to the worker")
	}
	if s.Claims.Acct == nil || s.Claims.Acct.Sub != "p:client" || len(s.Claims.Acct.Scopes) != 1 || !strings.Contains(string(s.Claims.Acct.Claims), `"team":"blue"`) {
		t.Fatalf("unexpected acct in the attestation: %+v", s.Claims.Acct)
	}
	// An anonymous namespace passes a non-passport Authorization through.
	// Its attestation names no account, though the account's token for
	// the same session was minted within the same second.
	_, body = rg.get("/open/x/value", map[string]string{"Authorization": "Bearer app-jwt"})
	if got := http.Header(decodeSeen(t, body).Header).Get("Authorization"); got != "Bearer app-jwt" {
		t.Fatalf("unexpected Authorization at the worker; got %q", got)
	}
	if acct := decodeSeen(t, body).Claims.Acct; acct != nil {
		t.Fatalf("unexpected acct in an anonymous request's attestation; got %+v; want none", acct)
	}
	// Authorization is a singleton field (RFC 9110 §11.6.2): a request
	// with two lines is refused before anything else, on either policy —
	// a passport token in a line after the first is neither checked nor
	// consumed, and would otherwise reach the worker.
	for _, path := range []string{"/open/x/value", "/secure/x/value"} {
		before := w.hits.Load()
		got := rg.raw("GET "+path+" HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer app-jwt\r\nAuthorization: Bearer "+clientToken+"\r\n\r\n", 10*time.Second)
		want := `{"error":"more than one Authorization header"}`
		if !strings.HasPrefix(got, "HTTP/1.1 400 ") || !strings.HasSuffix(got, "\r\n\r\n"+want) {
			t.Fatalf("unexpected reply to two Authorization lines on %s; got %q; want 400 %s", path, got, want)
		}
		if n := w.hits.Load() - before; n != 0 {
			t.Fatalf("a request with two Authorization lines reached the worker %d times", n)
		}
	}
}

// A 401 names the scheme that would be accepted (RFC 9110 §15.5.2: the
// server MUST send WWW-Authenticate with at least one challenge; RFC 6750
// §3 for Bearer), with no credential and with a wrong one alike (R-TR-4).
// Before, pinboard's 401 carried none, and a client or an edge that reads
// the challenge to pick its credential had nothing to go on.
func TestUnauthorizedCarriesChallenge_RTR4(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	w := newStandin(t, "w")
	rg.add(w, 1, "/secure")
	for _, hdr := range []map[string]string{nil, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic dTpw"}} {
		res, body := rg.get("/secure/x/value", hdr)
		if res.StatusCode != 401 || body != `{"error":"unauthorized"}` {
			t.Fatalf("unexpected reply with %v; got %d %s; want 401", hdr, res.StatusCode, body)
		}
		if got := res.Header.Values("WWW-Authenticate"); len(got) != 1 || got[0] != "Bearer" {
			t.Fatalf("unexpected challenge with %v; got %q; want [Bearer]", hdr, got)
		}
	}
	if res, _ := rg.get("/secure/x/value", map[string]string{"Authorization": "Bearer " + clientToken}); res.StatusCode != 200 || res.Header.Get("WWW-Authenticate") != "" {
		t.Fatalf("unexpected admitted reply; got %d, challenge %q; want 200 without one", res.StatusCode, res.Header.Get("WWW-Authenticate"))
	}
}

// Attested cluster calls (R-TR-6): the caller's session secret is checked,
// the caller's namespace must be one the session serves, the attestation
// names the caller and depth, and a new id prefers the
// caller's own worker (R-PL-4).
func TestClusterCall_RTR6_RPL4(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	a, b := newStandin(t, "a"), newStandin(t, "b")
	rg.add(a, 1, "/counters")
	rg.add(b, 1000, "/counters")
	call := map[string]string{
		"Pinboard-Session":          a.session.Load().(string),
		"Pinboard-Session-Secret":   a.secret,
		"Pinboard-From":             "/counters/alice",
		"Pinboard-Subrequest-Depth": "3",
	}
	res, body := rg.get("/counters/bob/value", call)
	if res.StatusCode != 200 {
		t.Fatalf("unexpected reply; got %d %s", res.StatusCode, body)
	}
	s := decodeSeen(t, body)
	if s.Worker != "a" {
		t.Fatalf("unexpected owner for a cluster call's new id; got %s; want the caller's worker a", s.Worker)
	}
	if ns, id, ok := s.Claims.CallerInstance(); !ok || ns != "/counters" || id != "alice" || s.Claims.Depth != 3 {
		t.Fatalf("unexpected caller claims %+v", s.Claims)
	}
	for k := range call {
		if http.Header(s.Header).Get(k) != "" {
			t.Fatalf("unexpected %s forwarded to the worker", k)
		}
	}
	bad := map[string]string{}
	for k, v := range call {
		bad[k] = v
	}
	bad["Pinboard-Session-Secret"] = "guess"
	if res, body := rg.get("/counters/bob/value", bad); res.StatusCode != 403 || !strings.Contains(body, "secret") {
		t.Fatalf("unexpected reply for a wrong session secret; got %d %s", res.StatusCode, body)
	}
	bad["Pinboard-Session"] = "nope"
	if res, _ := rg.get("/counters/bob/value", bad); res.StatusCode != 403 {
		t.Fatalf("unexpected reply for an unknown session; got %d", res.StatusCode)
	}
	// The caller must be in a namespace the calling session serves.
	for _, from := range []string{"/admin/root", "/counters/alice/x", "/count/ers"} {
		forged := map[string]string{}
		for k, v := range call {
			forged[k] = v
		}
		forged["Pinboard-From"] = from
		if res, body := rg.get("/counters/bob/value", forged); res.StatusCode != 403 || !strings.Contains(body, "caller namespace") {
			t.Fatalf("unexpected reply for a caller %s the session does not serve; got %d %s; want 403", from, res.StatusCode, body)
		}
	}
	call["Pinboard-Subrequest-Depth"] = "51"
	if res, _ := rg.get("/counters/bob/value", call); res.StatusCode != 400 {
		t.Fatalf("unexpected reply past the depth limit; got %d", res.StatusCode)
	}
	// Not a non-negative decimal integer (docs/PROTOCOL.md §2): strconv
	// took a sign.
	for _, d := range []string{"+3", "-0", "0x3", "1e1", "3.0", "99999999999999999999"} {
		call["Pinboard-Subrequest-Depth"] = d
		if res, body := rg.get("/counters/bob/value", call); res.StatusCode != 400 || body != `{"error":"malformed pinboard-subrequest-depth"}` {
			t.Fatalf("unexpected reply for depth %q; got %d %s; want 400 malformed", d, res.StatusCode, body)
		}
	}
	call["Pinboard-Subrequest-Depth"] = "007"
	if res, body := rg.get("/counters/bob/value", call); res.StatusCode != 200 || decodeSeen(t, body).Claims.Depth != 7 {
		t.Fatalf("unexpected reply for depth 007; got %d %s; want 200 at depth 7", res.StatusCode, body)
	}
}

// A cluster call is bound by the claims of the account that registered
// the calling session (R-TR-3, R-TR-6): a key covering only /a registers a
// worker for /a, and its session secret must not reach /b's instances,
// which the key itself is refused. Namespaces that admit anonymous
// clients stay open to every cluster call.
func TestClusterCallBoundByCallerClaims_RTR3_RTR6(t *testing.T) {
	raw := `{"providers":[{"type":"staticToken","id":"p","keys":[
		{"name":"tenant-a","token":{"env":"A"},"claims":{"pinboard":{"namespaces":["/a"]}}},
		{"name":"tenant-b","token":{"env":"B"},"claims":{"pinboard":{"namespaces":["/b"]}}}
	]}],"namespaces":{"*":{"allow":"authenticated"},"/open":{"allow":"anonymous"}}}`
	pp := tokPassport(t, raw)
	rg := newRig(t, func(o *Options) { o.Passport = pp })
	rg.warm()
	a, b := newStandin(t, "a"), newStandin(t, "b")
	for _, w := range []struct {
		s   *standin
		sub string
		ns  []string
	}{{a, "p:tenant-a", []string{"/a"}}, {b, "p:tenant-b", []string{"/b", "/open"}}} {
		res, err := rg.store.Register(t.Context(), &directory.Registration{
			ClientID: "client-" + w.s.name, Sub: w.sub, Secret: w.s.secret, Namespaces: w.ns,
			AdvertiseURL: w.s.srv.URL, Headroom: 1,
		}, rg.now())
		if err != nil {
			t.Fatal(err)
		}
		w.s.session.Store(res.SessionID)
	}
	call := map[string]string{
		"Pinboard-Session":        a.session.Load().(string),
		"Pinboard-Session-Secret": a.secret,
		"Pinboard-From":           "/a/alice",
	}
	if res, body := rg.get("/b/bob/value", map[string]string{"Authorization": "Bearer tok-A"}); res.StatusCode != 403 {
		t.Fatalf("unexpected reply to tenant a's key on /b; got %d %s; want 403", res.StatusCode, body)
	}
	if res, body := rg.get("/b/bob/value", call); res.StatusCode != 403 || b.hits.Load() != 0 {
		t.Fatalf("unexpected reply to tenant a's cluster call on /b; got %d %s after %d hits at b; want 403 and none", res.StatusCode, body, b.hits.Load())
	}
	for _, path := range []string{"/a/carol/value", "/open/dave/value"} {
		if res, body := rg.get(path, call); res.StatusCode != 200 {
			t.Fatalf("unexpected reply to a cluster call on %s; got %d %s; want 200", path, res.StatusCode, body)
		}
	}
}

// A cluster call naming a session a higher epoch superseded (R-LS-4) is
// refused as an unknown caller session (R-TR-6): the stores answer such a
// session with their superseded error, not ErrUnknownSession, and it was
// answered 503 "directory unavailable" with Retry-After, which tells the
// calling instance to retry a call that can never pass.
func TestClusterCallFromSupersededSession_RTR6_RLS4(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	old, next := newStandin(t, "old"), newStandin(t, "next")
	for _, w := range []struct {
		s     *standin
		epoch int64
	}{{old, 1}, {next, 2}} {
		res, err := rg.store.Register(t.Context(), &directory.Registration{
			ClientID: "client-" + w.s.name, Sub: "p:worker", Secret: w.s.secret, Namespaces: []string{"/counters"},
			AdvertiseURL: w.s.srv.URL, Headroom: 1, Hostname: "app.example", Epoch: w.epoch,
		}, rg.now())
		if err != nil {
			t.Fatal(err)
		}
		w.s.session.Store(res.SessionID)
	}
	if _, err := rg.store.Session(t.Context(), old.session.Load().(string), rg.now()); err == nil {
		t.Fatal("unexpected live session for the superseded worker")
	}
	res, body := rg.get("/counters/bob/value", map[string]string{
		"Pinboard-Session":        old.session.Load().(string),
		"Pinboard-Session-Secret": old.secret,
		"Pinboard-From":           "/counters/alice",
	})
	if res.StatusCode != 403 || body != `{"error":"unknown caller session"}` || res.Header.Get("Retry-After") != "" {
		t.Fatalf("unexpected reply to a superseded session's cluster call; got %d %s (Retry-After %q); want 403 unknown caller session",
			res.StatusCode, body, res.Header.Get("Retry-After"))
	}
	if n := next.hits.Load() + old.hits.Load(); n != 0 {
		t.Fatalf("unexpected %d worker hits for a refused cluster call", n)
	}
}

// The request's host picks the workers bound to it for a new placement
// (hostname-aware bindings, R-LS-4): a Host with a port and in another
// case still names the binding, and any other host places by headroom.
// The directory's contract tests the rule given the host; this is the
// data plane handing it over.
func TestHostnameRoutesNewPlacements_RLS4(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	bound, plain := newStandin(t, "bound"), newStandin(t, "plain")
	res, err := rg.store.Register(t.Context(), &directory.Registration{
		ClientID: "client-bound", Sub: "p:worker", Secret: bound.secret, Namespaces: []string{"/counters"},
		AdvertiseURL: bound.srv.URL, Headroom: 1, Hostname: "app.example", Env: "blue", Epoch: 1,
	}, rg.now())
	if err != nil {
		t.Fatal(err)
	}
	bound.session.Store(res.SessionID)
	rg.add(plain, 1000, "/counters")
	for _, c := range []struct{ host, id, want string }{
		{"App.Example:8443", "h1", "bound"},
		{"app.example", "h2", "bound"},
		{"", "p1", "plain"},
		{"other.example", "p2", "plain"},
	} {
		req, _ := http.NewRequest("GET", rg.url+"/counters/"+c.id+"/value", nil)
		if c.host != "" {
			req.Host = c.host
		}
		res, body := rg.do(req)
		if res.StatusCode != 200 {
			t.Fatalf("unexpected reply for Host %q; got %d %s; want 200", c.host, res.StatusCode, body)
		}
		if got := decodeSeen(t, body).Worker; got != c.want {
			t.Fatalf("unexpected worker for a new id with Host %q; got %s; want %s", c.host, got, c.want)
		}
	}
}

// Server-Sent Events leave as they are produced (R-DP-2).
func TestSSEFlushedPerEvent_RDP2(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	w := newStandin(t, "w")
	release := make(chan struct{})
	w.route("/events", func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "text/event-stream")
		rw.WriteHeader(200)
		for i := 0; i < 3; i++ {
			fmt.Fprintf(rw, "data: %d\n\n", i)
			rw.(http.Flusher).Flush()
			<-release
		}
	})
	rg.add(w, 1, "/t")
	res, err := http.Get(rg.url + "/t/x/events")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("unexpected content type %q", res.Header.Get("Content-Type"))
	}
	br := bufio.NewReader(res.Body)
	for i := 0; i < 3; i++ {
		line, err := readLineWithin(br, 5*time.Second)
		if err != nil || line != fmt.Sprintf("data: %d\n", i) {
			t.Fatalf("unexpected event %d before the next was produced; got %q, %v", i, line, err)
		}
		_, _ = br.ReadString('\n')
		release <- struct{}{}
	}
	if rg.p.OpenStreams() > 1 {
		t.Fatalf("unexpected open streams %d", rg.p.OpenStreams())
	}
}

func readLineWithin(br *bufio.Reader, d time.Duration) (string, error) {
	type result struct {
		s   string
		err error
	}
	c := make(chan result, 1)
	go func() { s, err := br.ReadString('\n'); c <- result{s, err} }()
	select {
	case r := <-c:
		return r.s, r.err
	case <-time.After(d):
		return "", errors.New("timed out: the event was buffered")
	}
}

// A worker that closes its connections must not close the client's.
func TestUpstreamConnectionCloseStaysHopByHop_RDP3(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	w := newStandin(t, "w")
	w.route("/close", func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Connection", "close")
		_, _ = rw.Write([]byte("ok"))
	})
	rg.add(w, 1, "/c")
	conn, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	for i := 0; i < 3; i++ {
		fmt.Fprintf(conn, "GET /c/x/close HTTP/1.1\r\nHost: pb\r\n\r\n")
		var res fasthttp.Response
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		if err := res.Read(br); err != nil {
			t.Fatalf("cannot read response %d on a kept-alive client connection: %v", i, err)
		}
		if string(res.Body()) != "ok" || res.ConnectionClose() {
			t.Fatalf("unexpected response %d: %q close=%v", i, res.Body(), res.ConnectionClose())
		}
	}
}

func TestHeadKeepsContentLength(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	w := newStandin(t, "w")
	w.route("/blob", func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Length", "12345")
		if r.Method != "HEAD" {
			_, _ = rw.Write(make([]byte, 12345))
		}
	})
	rg.add(w, 1, "/c")
	req, _ := http.NewRequest("HEAD", rg.url+"/c/x/blob", nil)
	res, _ := rg.do(req)
	if res.StatusCode != 200 || res.ContentLength != 12345 {
		t.Fatalf("unexpected HEAD reply; got %d length %d", res.StatusCode, res.ContentLength)
	}
}

// echoFullDuplex answers 200 and writes back each piece of the request
// body as it reads it, flushing each: the answer goes down while the upload
// is still coming up.
func echoFullDuplex(rw http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(rw)
	_ = rc.EnableFullDuplex()
	rw.WriteHeader(200)
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Body.Read(buf)
		if n > 0 {
			_, _ = rw.Write(buf[:n])
			_ = rc.Flush()
		}
		if err != nil {
			return
		}
	}
}

// Large bodies stream both ways at once (R-DP-2): an echo that writes
// while it reads must not deadlock against the proxy.
func TestFullDuplexEcho_RDP2(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	w := newStandin(t, "w")
	w.route("/echo", echoFullDuplex)
	rg.add(w, 1, "/c")
	const size = 32 << 20
	pr, pw := io.Pipe()
	go func() {
		chunk := make([]byte, 64<<10)
		for i := range chunk {
			chunk[i] = byte(i)
		}
		for sent := 0; sent < size; sent += len(chunk) {
			if _, err := pw.Write(chunk); err != nil {
				return
			}
		}
		_ = pw.Close()
	}()
	req, _ := http.NewRequest("POST", rg.url+"/c/x/echo", pr)
	req.ContentLength = size
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	n, err := io.Copy(io.Discard, res.Body)
	if err != nil || n != size {
		t.Fatalf("unexpected echo; got %d bytes, %v; want %d", n, err, size)
	}
}

// The programmatic affinity key (R-PL-4): a string is a rendezvous key, so
// independent ids with one key share a preferred worker; null spreads them
// by power of two choices.
func TestAffinityKeyOption_RPL4(t *testing.T) {
	rg := newRig(t, func(o *Options) {
		o.AffinityKey = func(ctx *fasthttp.RequestCtx) (string, bool) {
			k := ctx.Request.Header.Peek("X-Thread")
			return string(k), len(k) > 0
		}
	})
	rg.warm()
	ws := []*standin{newStandin(t, "a"), newStandin(t, "b"), newStandin(t, "c"), newStandin(t, "d")}
	for _, w := range ws {
		rg.add(w, 1000, "/t")
	}
	owner := func(id string, hdr map[string]string) string {
		_, body := rg.get("/t/"+id+"/x", hdr)
		return decodeSeen(t, body).Worker
	}
	first := owner("k0", map[string]string{"X-Thread": "thread-7"})
	for i := 1; i < 20; i++ {
		if got := owner(fmt.Sprintf("k%d", i), map[string]string{"X-Thread": "thread-7"}); got != first {
			t.Fatalf("unexpected owner for key thread-7; got %s; want %s", got, first)
		}
	}
	seen := map[string]bool{}
	for i := 0; i < 40; i++ {
		seen[owner(fmt.Sprintf("n%d", i), nil)] = true
	}
	if len(seen) < 3 {
		t.Fatalf("unexpected spread for null keys; got %v", seen)
	}
}

// An affinity callback answering an empty key is null, not a key: the
// guide gives rendezvous to a non-empty string only. Before, a callback
// deriving its key from a header (ok=true) sent every request without
// that header to the one worker the empty key hashed to (R-PL-4).
func TestAffinityKeyEmptyIsNull_RPL4(t *testing.T) {
	rg := newRig(t, func(o *Options) {
		o.AffinityKey = func(ctx *fasthttp.RequestCtx) (string, bool) {
			return string(ctx.Request.Header.Peek("X-Thread")), true
		}
	})
	rg.warm()
	for _, n := range []string{"a", "b", "c", "d"} {
		rg.add(newStandin(t, n), 1000, "/t")
	}
	seen := map[string]bool{}
	for i := 0; i < 40; i++ {
		_, body := rg.get(fmt.Sprintf("/t/e%d/x", i), nil)
		seen[decodeSeen(t, body).Worker] = true
	}
	if len(seen) < 3 {
		t.Fatalf("unexpected spread for empty keys; got %v; want power of two choices over 4 workers", seen)
	}
}

// The client IP comes through PINBOARD_TRUSTED_PROXIES only: an untrusted
// X-Forwarded-For cannot pick a worker (R-PL-4).
func TestClientIPThroughTrustedProxiesOnly_RPL4(t *testing.T) {
	owners := func(trusted string) map[string]bool {
		tp, err := ParseTrustedProxies(trusted)
		if err != nil {
			t.Fatal(err)
		}
		rg := newRig(t, func(o *Options) { o.TrustedProxies = tp })
		rg.warm()
		for _, n := range []string{"a", "b", "c", "d"} {
			rg.add(newStandin(t, n), 1000, "/t")
		}
		seen := map[string]bool{}
		for i := 0; i < 32; i++ {
			_, body := rg.get(fmt.Sprintf("/t/ip%d/x", i), map[string]string{"X-Forwarded-For": fmt.Sprintf("198.51.100.%d", i)})
			seen[decodeSeen(t, body).Worker] = true
		}
		return seen
	}
	if got := owners(""); len(got) != 1 {
		t.Fatalf("unexpected spread with untrusted X-Forwarded-For; got %v; want one worker (the peer's affinity)", got)
	}
	if got := owners("127.0.0.1"); len(got) < 3 {
		t.Fatalf("unexpected spread with a trusted proxy; got %v; want the client IPs to spread", got)
	}
}

// An HTTP/1.0 client cannot read chunked (RFC 9112 §6.1): an unsized
// response reaches it delimited by the connection's close, as nginx
// sends it, whether or not it asked for keep-alive; each event still
// leaves as it arrives (R-DP-2).
func TestHTTP10ClientUnsizedBody_RDP2(t *testing.T) {
	rg, w := newRigWorker(t, nil)
	next, stop := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(stop) }) // before the worker's Close waits for the handler
	w.route("/events", func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(rw, "data: 1\n\n")
		rw.(http.Flusher).Flush()
		select {
		case <-next:
			_, _ = io.WriteString(rw, "data: 2\n\n")
		case <-stop:
		}
	})
	for _, conn := range []string{"", "Connection: keep-alive\r\n"} {
		c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET /counters/alice/events HTTP/1.0\r\nHost: pb\r\n%s\r\n", conn)
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		br := bufio.NewReader(c)
		hdr := readHead(t, br)
		for _, h := range hdr {
			if l := strings.ToLower(h); strings.HasPrefix(l, "transfer-encoding:") || l == "connection: keep-alive" {
				t.Fatalf("unexpected header line for an HTTP/1.0 client; got %q in %q; want a close-delimited body", h, hdr)
			}
		}
		if line, err := readLineWithin(br, 5*time.Second); err != nil || line != "data: 1\n" {
			t.Fatalf("unexpected first body line; got %q, %v; want %q as it is sent", line, err, "data: 1\n")
		}
		next <- struct{}{}
		rest, err := io.ReadAll(br)
		if err != nil || string(rest) != "\ndata: 2\n\n" {
			t.Fatalf("unexpected rest of the body; got %q, %v; want %q then the close", rest, err, "\ndata: 2\n\n")
		}
	}
}

// placementCounter is a Metrics that counts placements.
type placementCounter struct {
	nopMetrics
	placed, replaced atomic.Int64
}

func (c *placementCounter) Placement(replaced bool) {
	if replaced {
		c.replaced.Add(1)
	} else {
		c.placed.Add(1)
	}
}

// An id whose owner's lease passed moves to another worker and counts as
// replaced, as one moved off a refusing worker does; a first placement
// counts as new (pinboard_placements_total, R-LS-2, R-PL-6).
func TestPlacementMetrics_RLS2_RPL6(t *testing.T) {
	var m placementCounter
	rg := newRig(t, func(o *Options) { o.Metrics = &m })
	rg.warm()
	a, b := newStandin(t, "a"), newStandin(t, "b")
	rg.add(a, 1000, "/counters")
	rg.add(b, 1, "/counters")
	count := func(placed, replaced int64) {
		t.Helper()
		if p, r := m.placed.Load(), m.replaced.Load(); p != placed || r != replaced {
			t.Fatalf("unexpected placements; got new %d, replaced %d; want %d, %d", p, r, placed, replaced)
		}
	}
	if res, body := rg.get("/counters/alice/value", nil); res.StatusCode != 200 || decodeSeen(t, body).Worker != "a" {
		t.Fatalf("unexpected first reply; got %d %s; want a's", res.StatusCode, body)
	}
	count(1, 0)
	rg.get("/counters/alice/value", nil)
	count(1, 0)
	// a stops heartbeating; b goes on. Past a's lease, alice moves to b.
	rg.advance(5 * time.Second)
	if _, err := rg.store.Heartbeat(t.Context(), &directory.Beat{SessionID: b.session.Load().(string), Sub: "p:worker", Headroom: 1}, rg.now()); err != nil {
		t.Fatal(err)
	}
	rg.advance(5*time.Second + time.Millisecond)
	if res, body := rg.get("/counters/alice/value", nil); res.StatusCode != 200 || decodeSeen(t, body).Worker != "b" {
		t.Fatalf("unexpected reply after a's lease passed; got %d %s; want b's", res.StatusCode, body)
	}
	count(1, 1)
	if res, _ := rg.get("/counters/bob/value", nil); res.StatusCode != 200 {
		t.Fatalf("unexpected reply for a new id; got %d", res.StatusCode)
	}
	count(2, 1)
}

// A namespace outside ASCII is sent percent-escaped by HTTP clients
// ("/caf%C3%A9"), and the worker's server decodes the path before routing
// it to the host of "/café": pinboard resolves the decoded namespace and
// forwards the path as the client sent it. Resolved raw, it was 404
// unknown namespace (R-DP-1, R-PL-5).
func TestPercentEscapedNamespace_RDP1_RPL5(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	w := newStandin(t, "w1")
	rg.add(w, 10, "/café")
	for _, tc := range []struct{ path, ns string }{
		{"/caf%C3%A9/alice/v", "/café"},
		{"/caf%c3%a9/alice/v", "/café"},
	} {
		res, body := rawGet(t, rg.url, tc.path)
		if res.StatusCode != http.StatusOK {
			t.Fatalf("unexpected answer for %s (namespace %q); got %d %s; want 200", tc.path, tc.ns, res.StatusCode, body)
		}
		if s := decodeSeen(t, body); s.URI != tc.path {
			t.Fatalf("unexpected path forwarded for %s; got %q; want it as sent", tc.path, s.URI)
		}
	}
	if res, body := rg.get("/caf%C3%A8/alice/v", nil); res.StatusCode != http.StatusNotFound || body != `{"error":"unknown namespace"}` {
		t.Fatalf("unexpected answer for another namespace; got %d %s; want 404 unknown namespace", res.StatusCode, body)
	}
	if p, err := rg.store.Placement(t.Context(), "/café", "alice", rg.now()); err != nil || p.SessionID != w.session.Load().(string) {
		t.Fatalf("unexpected placement of /café alice; got %+v, %v; want on w1", p, err)
	}
}

// rawGet sends GET path as written (Go's client refuses or re-escapes some
// paths) on a connection of its own and returns the answer and its body.
func rawGet(t *testing.T, base, path string) (*http.Response, string) {
	t.Helper()
	return rawExchange(t, base, "GET "+path+" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
}

// rawExchange sends req as written on a connection of its own and
// returns the answer and its whole body.
func rawExchange(t *testing.T, base, req string) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("cannot read the answer to %q: %v", req, err)
	}
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("cannot read the body of the answer to %q: %v", req, err)
	}
	return res, string(b)
}

// The worker's own namespace (/_pinned: its challenge and stats routes)
// is not forwarded even when a worker registered it, however the client
// spells it, and nothing is placed for it (R-DP-1). Neither is an
// instance's wake route. e2e: TestWorkerNamespaceNotForwarded_RDP1,
// TestWakeRouteNotForwarded_RDP1.
func TestWorkerRoutesNotForwarded_RDP1(t *testing.T) {
	rg, w := newRigWorker(t, nil)
	rg.add(w, 1, "/counters", "/_pinned")
	for _, path := range []string{"/_pinned/stats", "/%5Fpinned/stats", "/%5fpinned/challenge?challenge=x", "/_pinned/alice/value", "/counters/alice/_wake", "/counters/alice/%5Fwake%0A"} {
		req, _ := http.NewRequest("POST", rg.url+"/", nil)
		req.URL.Opaque = path // sent as it is
		if res, body := rg.do(req); res.StatusCode != 404 || body != `{"error":"not found"}` {
			t.Fatalf("unexpected reply for %s; got %d %s; want 404 not found", path, res.StatusCode, body)
		}
	}
	if n := w.hits.Load(); n != 0 {
		t.Fatalf("unexpected requests forwarded; got %d; want 0", n)
	}
	if _, ok := rg.store.Lookup([]byte("/_pinned"), []byte("stats"), rg.now()); ok {
		t.Fatalf("unexpected placement of /_pinned/stats")
	}
	// The namespace's neighbours still go through.
	if res, body := rg.get("/counters/alice/_wakes", nil); res.StatusCode != 200 {
		t.Fatalf("unexpected reply for /counters/alice/_wakes; got %d %s; want 200", res.StatusCode, body)
	}
}

// A request target holds no fragment (RFC 9112 §3.2.1: origin-form is an
// absolute path and a query; '#' is in neither). uvicorn on httptools —
// uvicorn[standard], its default parser when installed — routes by
// httptools.parse_url's path, which ends at '#': "/counters/alice/_wake#x"
// reached the wake route pinboard refuses (wakeRoute saw "/_wake#x"), and
// a query was cut short there. A target with '#' is refused, nothing
// forwarded or placed (R-DP-1).
func TestFragmentInTargetRefused_RDP1(t *testing.T) {
	rg, w := newRigWorker(t, nil)
	for _, target := range []string{"/counters/alice/_wake#x", "/counters/alice/_wake#", "/counters/alice/v?x=1#y", "/counters/bob/_wake#x"} {
		res, body := rawExchange(t, rg.url, "POST "+target+" HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		if res.StatusCode != http.StatusBadRequest {
			t.Fatalf("unexpected answer for %s; got %d %s; want 400", target, res.StatusCode, body)
		}
	}
	if n := w.hits.Load(); n != 0 {
		t.Fatalf("unexpected requests forwarded; got %d; want 0", n)
	}
	if _, ok := rg.store.Lookup([]byte("/counters"), []byte("bob"), rg.now()); ok {
		t.Fatalf("unexpected placement of /counters bob")
	}
}

// A pooled request carries nothing of the last one past reset: every
// per-request scalar and pointer (a bool, a count, a string, an owner, the
// second of the attestation) is zero again; scratch buffers keep their
// capacity. A field added without its reset fails here, whatever the
// value the next request happens to write before reading it.
func TestRequestResetClearsScalars(t *testing.T) {
	rq := &request{}
	v := reflect.ValueOf(rq).Elem()
	for i := range v.NumField() {
		f := v.Field(i)
		switch f.Kind() {
		case reflect.Bool:
			reflect.NewAt(f.Type(), f.Addr().UnsafePointer()).Elem().SetBool(true)
		case reflect.Int, reflect.Int64, reflect.Int32:
			reflect.NewAt(f.Type(), f.Addr().UnsafePointer()).Elem().SetInt(7)
		case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			reflect.NewAt(f.Type(), f.Addr().UnsafePointer()).Elem().SetUint(7)
		case reflect.String:
			reflect.NewAt(f.Type(), f.Addr().UnsafePointer()).Elem().SetString("x")
		case reflect.Pointer:
			reflect.NewAt(f.Type(), f.Addr().UnsafePointer()).Elem().Set(reflect.New(f.Type().Elem()))
		}
	}
	rq.reset()
	for i := range v.NumField() {
		f := v.Field(i)
		switch f.Kind() {
		case reflect.Bool, reflect.Int, reflect.Int64, reflect.Int32, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.String, reflect.Pointer:
			if !f.IsZero() {
				t.Errorf("unexpected request.%s after reset; got %v; want its zero value", v.Type().Field(i).Name, f)
			}
		}
	}
}

// A cluster call naming a session the directory does not know, during the
// cold-start quarantine, gets the quarantine's 503 and Retry-After: after
// a wipe or a memory: restart the session is most likely one the wipe
// took, whose worker re-registers at its next heartbeat, and the call
// would meet the quarantine anyway. Once the quarantine has passed, the
// same call is the 403 it always was (R-TR-6, R-CS-1).
func TestClusterCallUnknownSessionDuringQuarantine_RTR6_RCS1(t *testing.T) {
	rg := newRig(t, nil)
	// The first placement attempt starts the quarantine.
	_, err := rg.store.Place(t.Context(), &directory.PlaceRequest{NS: "/warm", ID: "x", Now: rg.now()})
	var q *directory.QuarantineError
	if !errors.As(err, &q) {
		t.Fatalf("unexpected first placement; got %v; want a quarantine", err)
	}
	call := map[string]string{
		"Pinboard-Session":        "0123456789abcdef0123456789abcdef",
		"Pinboard-Session-Secret": "s",
		"Pinboard-From":           "/counters/alice",
	}
	res, body := rg.get("/counters/bob/value", call)
	if res.StatusCode != 503 || !strings.HasPrefix(body, `{"error":"cold start: placements resume in `) || res.Header.Get("Retry-After") == "" {
		t.Fatalf("unexpected reply during the quarantine; got %d %s (Retry-After %q); want 503 cold start with Retry-After",
			res.StatusCode, body, res.Header.Get("Retry-After"))
	}
	rg.advance(q.Remaining)
	res, body = rg.get("/counters/bob/value", call)
	if res.StatusCode != 403 || body != `{"error":"unknown caller session"}` || res.Header.Get("Retry-After") != "" {
		t.Fatalf("unexpected reply after the quarantine; got %d %s (Retry-After %q); want 403 unknown caller session",
			res.StatusCode, body, res.Header.Get("Retry-After"))
	}
}
