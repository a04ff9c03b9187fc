package registry

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/attest"
	"github.com/pinboard-go/pinboard/directory"
)

const (
	workerToken   = "worker-token"
	operatorToken = "operator-token"
	otherToken    = "other-token"
	narrowToken   = "narrow-token"
	stagingToken  = "staging-token"
	// stagingOpToken: an operator key limited to the env "staging".
	stagingOpToken = "staging-op-token"
)

// testPassport has a worker key, an operator key, a second worker account
// a worker key whose claims cover only /other, and a worker key limited to
// the env "staging".
func testPassport(t testing.TB) *attest.Passport {
	t.Helper()
	raw := `{"providers":[{"type":"staticToken","id":"p","keys":[
		{"name":"worker","token":{"env":"W"},"scopes":["pinboard:worker"],"claims":{"pinboard":{"namespaces":["*"],"allowedBackendHosts":["127.0.0.1"]}}},
		{"name":"operator","token":{"env":"O"},"scopes":["pinboard:operator"],"claims":{"pinboard":{"namespaces":["*"]}}},
		{"name":"other","token":{"env":"X"},"scopes":["pinboard:worker"],"claims":{"pinboard":{"namespaces":["*"],"allowedBackendHosts":["*"]}}},
		{"name":"narrow","token":{"env":"N"},"scopes":["pinboard:worker","pinboard:operator"],"claims":{"pinboard":{"namespaces":["/other"],"allowedBackendHosts":["*"]}}},
		{"name":"staging","token":{"env":"S"},"scopes":["pinboard:worker"],"claims":{"pinboard":{"namespaces":["*"],"allowedBackendHosts":["127.0.0.1"],"envs":["staging"]}}},
		{"name":"staging-op","token":{"env":"SO"},"scopes":["pinboard:operator"],"claims":{"pinboard":{"namespaces":["*"],"envs":["staging"]}}}
	]}],"namespaces":{"*":{"allow":"anonymous"}}}`
	env := map[string]string{"W": workerToken, "O": operatorToken, "X": otherToken, "N": narrowToken, "S": stagingToken, "SO": stagingOpToken}
	pp, err := attest.ParsePassport([]byte(raw), func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatalf("cannot parse the test passport: %v", err)
	}
	return pp
}

// fakeWorker answers the challenge probe the way pinned's PinnedWorker
// does (pinned.pinboard.worker: _mount_challenge, _verify_probe), also
// under a base path: one server stands for workers at distinct advertise
// URLs (srv.URL + "/w1"), as registrations of other processes at one URL
// void each other (R-LS-3).
type fakeWorker struct {
	srv    *httptest.Server
	secret string
	mode   atomic.Value  // "ok", "slow", "hang", "mismatch", "404", "late404", "500", "nobody", "notjson", "truncated"
	hang   chan struct{} // "hang" and "late404" answer once this closes
	mu     sync.Mutex
	value  map[string]string // challenge -> value
	probes atomic.Int64
}

func newFakeWorker(t testing.TB) *fakeWorker {
	t.Helper()
	fw := &fakeWorker{secret: "s3cret", value: map[string]string{}, hang: make(chan struct{})}
	fw.mode.Store("ok")
	fw.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fw.probes.Add(1)
		if !strings.HasSuffix(r.URL.Path, "/_pinned/challenge") {
			http.NotFound(w, r)
			return
		}
		if r.Header.Get("pinboard-proxy-secret") != fw.secret {
			w.WriteHeader(http.StatusForbidden)
			_, _ = w.Write([]byte(`{"detail":"invalid proxy secret"}`))
			return
		}
		fw.mu.Lock()
		v, ok := fw.value[r.URL.Query().Get("challenge")]
		fw.mu.Unlock()
		switch fw.mode.Load().(string) {
		case "slow":
			time.Sleep(50 * time.Millisecond)
		case "hang":
			<-fw.hang
		case "mismatch":
			v = "something-else"
		case "404":
			ok = false
		case "late404":
			// A worker that gave up on its heartbeat (WorkerTimeout) has a
			// new challenge: the old one's probe, come late (once hang
			// closes), is a 404.
			<-fw.hang
			ok = false
		case "500":
			w.WriteHeader(http.StatusInternalServerError)
			return
		case "nobody":
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{}`))
			return
		case "notjson":
			w.Header().Set("Content-Type", "text/html")
			_, _ = w.Write([]byte(`<html>ok</html>`))
			return
		case "truncated":
			// The answer's body never arrives whole: the connection
			// closes after part of what Content-Length announced.
			conn, buf, err := w.(http.Hijacker).Hijack()
			if err == nil {
				_, _ = buf.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"value\":\"" + v)
				_ = buf.Flush()
				_ = conn.Close()
			}
			return
		}
		if !ok {
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"detail":"unknown challenge"}`))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]string{"value": v})
	}))
	t.Cleanup(fw.srv.Close)
	return fw
}

// pair mints a challenge pair the worker will answer.
func (fw *fakeWorker) pair(n string) (string, string) {
	c, v := "challenge-"+n, "value-"+n
	fw.mu.Lock()
	fw.value[c] = v
	fw.mu.Unlock()
	return c, v
}

type harness struct {
	t     testing.TB
	r     *Registry
	store *directory.Memory
	// ds is the store the harness's registries run on: store, or a
	// Redis directory (newRedisHarness, which leaves store nil).
	ds  directory.Store
	now time.Time
	mu  sync.Mutex
	fw  *fakeWorker
	seq int
}

const testTTL = 15 * time.Second

func newHarness(t testing.TB) *harness {
	t.Helper()
	h := &harness{t: t, now: time.Unix(1_800_000_000, 0), fw: newFakeWorker(t)}
	h.store = directory.NewMemory(testTTL, h.now)
	h.ds = h.store
	h.r = h.registry(testPassport(t))
	return h
}

func (h *harness) registry(pp *attest.Passport) *Registry {
	return h.registryOn(h.ds, pp)
}

// registryOn is a registry on store, which wraps h.ds.
func (h *harness) registryOn(store directory.Store, pp *attest.Passport) *Registry {
	return h.registryWith(Options{Store: store, Passport: pp, ProbeTimeout: time.Second, Workers: 4, Queue: 16})
}

// registryWith is a registry with o's settings on h's lease and clock,
// on h.store and with testPassport unless o names its own; it closes
// when the test ends.
func (h *harness) registryWith(o Options) *Registry {
	h.t.Helper()
	if o.Store == nil {
		o.Store = h.store
	}
	if o.Passport == nil {
		o.Passport = testPassport(h.t)
	}
	o.LeaseTTL, o.Now = testTTL, h.clock
	r, err := New(o)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { _ = r.Close(time.Second) })
	return r
}

func (h *harness) clock() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.now
}

func (h *harness) advance(d time.Duration) {
	h.mu.Lock()
	h.now = h.now.Add(d)
	h.mu.Unlock()
}

type response struct {
	status int
	body   string
	header *fasthttp.ResponseHeader
}

// do runs one request through the registry in process.
func (h *harness) do(r *Registry, method, path, token, body string) response {
	h.t.Helper()
	if token == "" {
		return h.doAuth(r, method, path, nil, body)
	}
	auth := "Bearer " + token
	return h.doAuth(r, method, path, &auth, body)
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}

func (h *harness) post(path, token, body string) response {
	return h.do(h.r, "POST", path, token, body)
}

func (h *harness) get(path, token string) response {
	return h.do(h.r, "GET", path, token, "")
}

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// register registers the fake worker and returns its session id.
func (h *harness) register(extra map[string]any) string {
	h.t.Helper()
	h.seq++
	c, v := h.fw.pair("r" + itoa(h.seq))
	body := map[string]any{
		"clientId": "client-" + itoa(h.seq), "secret": h.fw.secret,
		"namespaces": []string{"/counters", "/tickers"}, "advertiseUrl": h.fw.srv.URL,
		"headroom": 100, "draining": false, "challenge": c, "challengeValue": v,
	}
	for k, x := range extra {
		body[k] = x
	}
	res := h.post("/registry/register", workerToken, mustJSON(h.t, body))
	if res.status != 200 {
		h.t.Fatalf("cannot register; got %d %s", res.status, res.body)
	}
	var ack struct{ SessionID string }
	_ = json.Unmarshal([]byte(res.body), &ack)
	return ack.SessionID
}

// lateRegisterBody is the body of a register of the fake worker as
// client "late" for /counters, its challenge answered: the register a
// test holds back (queued, or probed past its worker's wait).
func (h *harness) lateRegisterBody() string {
	c, v := h.fw.pair("late-register")
	return mustJSON(h.t, map[string]any{
		"clientId": "late", "secret": h.fw.secret, "namespaces": []string{"/counters"},
		"advertiseUrl": h.fw.srv.URL, "headroom": 1, "draining": false, "challenge": c, "challengeValue": v,
	})
}

func (h *harness) beatBody(session string, extra map[string]any) string {
	h.seq++
	c, v := h.fw.pair("h" + itoa(h.seq))
	body := map[string]any{"sessionId": session, "headroom": 50, "draining": false, "challenge": c, "challengeValue": v}
	for k, x := range extra {
		body[k] = x
	}
	return mustJSON(h.t, body)
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// wantBeatAnswered fails unless the healthy session's heartbeat through r
// is answered 200 within d: it must not wait behind what the test holds
// the pool with (behind, for the failure).
func (h *harness) wantBeatAnswered(r *Registry, healthy string, d time.Duration, behind string) {
	h.t.Helper()
	got := make(chan response, 1)
	go func() { got <- h.do(r, "POST", "/registry/heartbeat", workerToken, h.beatBody(healthy, nil)) }()
	select {
	case res := <-got:
		if res.status != 200 {
			h.t.Fatalf("unexpected reply to the healthy worker; got %d %s; want 200", res.status, res.body)
		}
	case <-time.After(d):
		h.t.Fatalf("unexpected wait: a healthy worker's heartbeat waited behind %s", behind)
	}
}

// Running is pinboard_registry_running, "registry requests being
// handled": once the requests are answered it is 0, however many pool
// workers still idle until they expire (ants counts those as running).
func TestRunningCountsRequestsBeingHandled(t *testing.T) {
	h := newHarness(t)
	h.register(nil)
	for range 3 {
		if res := h.get("/registry/workers", operatorToken); res.status != 200 {
			t.Fatalf("unexpected answer; got %d %s; want 200", res.status, res.body)
		}
	}
	if got := h.r.Running(); got != 0 {
		t.Fatalf("unexpected registry requests being handled with none in flight; got %d; want 0", got)
	}
}
