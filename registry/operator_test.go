package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
)

func TestReleaseAndDeregister_RREG3(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		s := h.register(map[string]any{"instances": map[string][]string{"/counters": {"x", "y", "z"}}})
		p, err := h.ds.Placement(t.Context(), "/counters", "x", h.clock())
		if err != nil {
			t.Fatal(err)
		}
		epoch := formatEpoch(p.Epoch)
		// The worker's wire form: an array, epoch as a string.
		res := h.post("/registry/release", workerToken, `[{"sessionId":"`+s+`","namespace":"/counters","id":"x","epoch":"`+epoch+`"},{"sessionId":"`+s+`","namespace":"/counters","id":"y","epoch":"1"}]`)
		if res.status != 200 || res.body != `{"released":1}` {
			t.Fatalf("unexpected release reply; got %d %s", res.status, res.body)
		}
		res = h.post("/registry/release", workerToken, `{"sessionId":"`+s+`","namespace":"/counters","id":"y"}`)
		if res.status != 200 || res.body != `{"released":1}` {
			t.Fatalf("unexpected single-object release; got %d %s", res.status, res.body)
		}
		if res := h.post("/registry/release", otherToken, `[{"sessionId":"`+s+`","namespace":"/counters","id":"z"}]`); res.status != 403 || res.body != `{"error":"forbidden"}` {
			t.Fatalf("unexpected release by another account; got %d %s", res.status, res.body)
		}
		if res := h.post("/registry/release", workerToken, `[{"sessionId":"nope","namespace":"/counters","id":"z"}]`); res.status != 200 || res.body != `{"released":0}` {
			t.Fatalf("unexpected release for an unknown session; got %d %s", res.status, res.body)
		}
		for _, bad := range []string{`[{"namespace":"/c","id":"z"}]`, `[{"sessionId":"s","namespace":"/c","id":"z","epoch":7}]`, `[{"sessionId":"s","namespace":"/c","id":"z","epoch":"x"}]`, `"x"`} {
			if res := h.post("/registry/release", workerToken, bad); res.status != 400 || res.body != `{"error":"expected [{ sessionId, namespace, id, epoch? }]"}` {
				t.Fatalf("unexpected reply for %s; got %d %s", bad, res.status, res.body)
			}
		}
		if res := h.post("/registry/deregister", otherToken, `{"sessionId":"`+s+`"}`); res.status != 403 {
			t.Fatalf("unexpected deregister by another account; got %d %s", res.status, res.body)
		}
		if res := h.post("/registry/deregister", workerToken, `{"sessionId":"`+s+`"}`); res.status != 200 || res.body != `{"ok":true}` {
			t.Fatalf("unexpected deregister; got %d %s", res.status, res.body)
		}
		if _, err := h.ds.Placement(t.Context(), "/counters", "z", h.clock()); !errors.Is(err, directory.ErrNoPlacement) {
			t.Fatalf("unexpected placement after deregister: %v", err)
		}
		if res := h.post("/registry/deregister", workerToken, `{"sessionId":"`+s+`"}`); res.status != 200 {
			t.Fatalf("unexpected second deregister; got %d %s", res.status, res.body)
		}
		if res := h.post("/registry/deregister", workerToken, `{}`); res.status != 400 || res.body != `{"error":"expected { sessionId }"}` {
			t.Fatalf("unexpected reply; got %d %s", res.status, res.body)
		}
	})
}

func TestWorkersListing_RREG4_RTR3(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		s := h.register(map[string]any{"clientId": "c-1", "hostname": "", "instances": map[string][]string{"/counters": {"a"}}})
		res := h.get("/registry/workers", operatorToken)
		var out struct {
			Workers []map[string]any `json:"workers"`
		}
		if err := json.Unmarshal([]byte(res.body), &out); err != nil || res.status != 200 || len(out.Workers) != 1 {
			t.Fatalf("unexpected listing; got %d %s", res.status, res.body)
		}
		w := out.Workers[0]
		for k, want := range map[string]any{
			"clientId": "c-1", "sessionId": s, "advertiseUrl": h.fw.srv.URL, "headroom": 100.0,
			"draining": false, "degraded": false, "expiresInMs": 15000.0, "placements": 1.0, "operatorDrain": false,
		} {
			if w[k] != want {
				t.Fatalf("unexpected %s; got %v; want %v (listing %s)", k, w[k], want, res.body)
			}
		}
		if _, ok := w["secret"]; ok || strings.Contains(res.body, h.fw.secret) {
			t.Fatalf("unexpected secret in the listing: %s", res.body)
		}
		// A credential covering only /other sees nothing of this worker.
		if res := h.get("/registry/workers", narrowToken); res.body != `{"workers":[]}` {
			t.Fatalf("unexpected listing for a narrow credential; got %s", res.body)
		}
		if res := h.get("/registry/workers", workerToken); res.status != 403 {
			t.Fatalf("unexpected listing with the worker scope; got %d", res.status)
		}
		if res := h.get("/registry/workers", ""); res.status != 401 || res.body != `{"error":"unauthorized"}` {
			t.Fatalf("unexpected anonymous listing; got %d %s", res.status, res.body)
		}
	})
}

func TestHealthQuarantine_RREG5_RCS1(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		h.register(nil)
		if res := h.get("/registry/health", operatorToken); res.body != `{"ok":true,"store":"`+h.ds.Name()+`","quarantineMs":0,"leaseTtlMs":15000,"workers":1}` {
			t.Fatalf("unexpected health; got %d %s", res.status, res.body)
		}
		// The workers count is the listing's: a credential whose claims cover
		// none of the fleet's namespaces counts none of it (R-TR-3).
		if res := h.get("/registry/health", narrowToken); res.body != `{"ok":true,"store":"`+h.ds.Name()+`","quarantineMs":0,"leaseTtlMs":15000,"workers":0}` {
			t.Fatalf("unexpected health for a credential covering /other only; got %d %s; want workers 0", res.status, res.body)
		}
		h.register(map[string]any{"clientId": "c-other", "namespaces": []string{"/other"}, "advertiseUrl": h.fw.srv.URL + "/other"})
		if res := h.get("/registry/health", narrowToken); !strings.HasSuffix(res.body, `"workers":1}`) {
			t.Fatalf("unexpected health for a credential covering /other only; got %d %s; want workers 1", res.status, res.body)
		}
		if res := h.get("/registry/health", operatorToken); !strings.HasSuffix(res.body, `"workers":2}`) {
			t.Fatalf("unexpected health; got %d %s; want workers 2", res.status, res.body)
		}
		_, err := h.ds.Place(t.Context(), &directory.PlaceRequest{NS: "/counters", ID: "x", Now: h.clock()})
		var q *directory.QuarantineError
		if !errors.As(err, &q) {
			t.Fatalf("unexpected first placement: %v", err)
		}
		h.advance(4 * time.Second)
		if res := h.get("/registry/health", operatorToken); !strings.Contains(res.body, `"quarantineMs":11000`) {
			t.Fatalf("unexpected health during quarantine; got %s", res.body)
		}
	})
}

func TestOperatorDrain_RREG6(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		h.register(map[string]any{"clientId": "drain-me"})
		cases := []struct {
			path, token, body string
			status            int
			want              string
		}{
			{"/registry/drain", operatorToken, `{"clientId":"nobody"}`, 404, `{"error":"unknown clientId"}`},
			{"/registry/drain", workerToken, `{"clientId":"drain-me"}`, 403, `{"error":"forbidden"}`},
			{"/registry/drain", narrowToken, `{"clientId":"drain-me"}`, 403, `{"error":"forbidden"}`},
			{"/registry/drain", operatorToken, `{}`, 400, `{"error":"expected { clientId, deadline? }"}`},
			{"/registry/drain", operatorToken, `{"clientId":"drain-me","deadline":-1}`, 400, `{"error":"deadline must be from 0 to 604800 seconds (7 days)"}`},
			{"/registry/drain", operatorToken, `{"clientId":"drain-me","deadline":604801}`, 400, `{"error":"deadline must be from 0 to 604800 seconds (7 days)"}`},
			{"/registry/drain", operatorToken, `{"clientId":"drain-me","deadline":"5m"}`, 400, `{"error":"expected { clientId, deadline? }"}`},
			{"/registry/drain", operatorToken, `{"clientId":"drain-me"}`, 200, `{"clientId":"drain-me","draining":true}`},
			{"/registry/undrain", operatorToken, `{}`, 400, `{"error":"expected { clientId }"}`},
			{"/registry/undrain", operatorToken, `{"clientId":"drain-me"}`, 200, `{"clientId":"drain-me","draining":false}`},
		}
		for _, tc := range cases {
			if res := h.post(tc.path, tc.token, tc.body); res.status != tc.status || res.body != tc.want {
				t.Fatalf("unexpected reply to %s %s; got %d %s; want %d %s", tc.path, tc.body, res.status, res.body, tc.status, tc.want)
			}
		}
	})
}

// A drain outlives sessions: with the client's session lapsed (a timed
// drain ended it), undrain still clears it for an operator covering every
// namespace; a narrower operator cannot see the client (R-REG-6).
func TestUndrainWithoutLiveSession_RREG6(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		h.register(map[string]any{"clientId": "gone"})
		if res := h.post("/registry/drain", operatorToken, `{"clientId":"gone","deadline":1}`); res.status != 200 {
			t.Fatalf("cannot drain; got %d %s", res.status, res.body)
		}
		h.advance(testTTL + 2*time.Second)
		cases := []struct {
			token, body string
			status      int
			want        string
		}{
			{narrowToken, `{"clientId":"gone"}`, 404, `{"error":"unknown clientId"}`},
			{operatorToken, `{"clientId":"gone"}`, 200, `{"clientId":"gone","draining":false}`},
			{operatorToken, `{"clientId":"gone"}`, 404, `{"error":"unknown clientId"}`},
			{operatorToken, `{"clientId":"never"}`, 404, `{"error":"unknown clientId"}`},
		}
		for _, tc := range cases {
			if res := h.post("/registry/undrain", tc.token, tc.body); res.status != tc.status || res.body != tc.want {
				t.Fatalf("unexpected undrain %s with %s; got %d %s; want %d %s", tc.body, tc.token, res.status, res.body, tc.status, tc.want)
			}
		}
		if res := h.post("/registry/drain", operatorToken, `{"clientId":"gone"}`); res.status != 404 {
			t.Fatalf("unexpected drain of a client without a live session; got %d %s", res.status, res.body)
		}
	})
}

func TestPlacementAndWindDown_RCM1(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		s := h.register(map[string]any{"instances": map[string][]string{"/counters": {"alice"}}})
		res := h.get("/registry/placement?namespace=/counters&id=alice", operatorToken)
		if res.status != 200 || !strings.Contains(res.body, `"sessionId":"`+s+`"`) || !strings.Contains(res.body, `"live":true`) {
			t.Fatalf("unexpected placement; got %d %s", res.status, res.body)
		}
		if res := h.get("/registry/placement?namespace=/counters&id=bob", operatorToken); res.status != 404 || res.body != `{"error":"no placement"}` {
			t.Fatalf("unexpected reply; got %d %s", res.status, res.body)
		}
		if res := h.get("/registry/placement?namespace=/counters", operatorToken); res.status != 400 {
			t.Fatalf("unexpected reply; got %d %s", res.status, res.body)
		}
		for _, bad := range []string{`{"namespace":"/counters","id":"alice"}`, `{"namespace":"/counters","id":"alice","deadline":"soon"}`, `{"id":"alice","deadline":1}`} {
			if res := h.post("/registry/wind-down", operatorToken, bad); res.status != 400 || res.body != `{"error":"expected { namespace, id, deadline }"}` {
				t.Fatalf("unexpected reply for %s; got %d %s", bad, res.status, res.body)
			}
		}
		for _, bad := range []string{`{"namespace":"/counters","id":"alice","deadline":-1}`, `{"namespace":"/counters","id":"alice","deadline":604801}`} {
			if res := h.post("/registry/wind-down", operatorToken, bad); res.status != 400 || res.body != `{"error":"deadline must be from 0 to 604800 seconds (7 days)"}` {
				t.Fatalf("unexpected reply to %s; got %d %s; want 400 with the deadline's range", bad, res.status, res.body)
			}
		}
		if res := h.post("/registry/wind-down", operatorToken, `{"namespace":"/counters","id":"bob","deadline":1}`); res.status != 404 {
			t.Fatalf("unexpected wind-down of an unplaced id; got %d %s", res.status, res.body)
		}
		// A namespace is one a worker could register (R-REG-1's rule): a NUL
		// in it, which the stores use between namespace and id, addressed
		// another namespace's row ("/c\0x" and "y" made the key of "/c" and
		// "x\0y"); an id must not hold a NUL either.
		for _, q := range []string{"namespace=/counters%00alice&id=y", "namespace=counters&id=alice", "namespace=/a/b&id=alice", "namespace=/counters&id=al%00ice"} {
			if res := h.get("/registry/placement?"+q, operatorToken); res.status != 400 || res.body != `{"error":"expected ?namespace=&id="}` {
				t.Fatalf("unexpected placement reply to %s; got %d %s; want the 400", q, res.status, res.body)
			}
		}
		for _, bad := range []string{`{"namespace":"/counters\u0000alice","id":"y","deadline":1}`, `{"namespace":"counters","id":"alice","deadline":1}`, `{"namespace":"/counters","id":"al\u0000ice","deadline":1}`} {
			if res := h.post("/registry/wind-down", operatorToken, bad); res.status != 400 || res.body != `{"error":"expected { namespace, id, deadline }"}` {
				t.Fatalf("unexpected wind-down reply to %s; got %d %s; want the 400", bad, res.status, res.body)
			}
		}
	})
}

func TestRoutingErrors(t *testing.T) {
	h := newHarness(t)
	if res := h.get("/registry/heartbeat", workerToken); res.status != 405 || res.body != `{"error":"method not allowed"}` || string(res.header.Peek("Allow")) != "POST" {
		t.Fatalf("unexpected reply; got %d %s", res.status, res.body)
	}
	if res := h.post("/registry/workers", operatorToken, `{}`); res.status != 405 {
		t.Fatalf("unexpected reply; got %d %s", res.status, res.body)
	}
	if res := h.get("/registry/nope", operatorToken); res.status != 404 || res.body != `{"error":"not found"}` {
		t.Fatalf("unexpected reply; got %d %s", res.status, res.body)
	}
}

// Saturation: past the pool's queue the registry answers 503 + Retry-After
// instead of queueing without bound.
func TestRegistrySaturated(t *testing.T) {
	h := newHarness(t)
	r := h.registryWith(Options{Workers: 1, Queue: 1})
	release := saturate(t, r)
	res := h.do(r, "GET", "/registry/health", operatorToken, "")
	release()
	if res.status != 503 || res.body != `{"error":"registry busy"}` || string(res.header.Peek("Retry-After")) != "1" {
		t.Fatalf("unexpected reply from a saturated registry; got %d %s", res.status, res.body)
	}
}

// A request without an accepted credential, or without the endpoint's
// scope, is answered before it reaches the pool: the registry shares the
// public listener with the data plane, and a flood of anonymous requests
// each queued for a pool worker filled the queue, so that workers'
// heartbeats were answered 503 "registry busy" until their leases lapsed
// (R-TR-2, R-REG-2).
func TestCredentialsCheckedBeforePool_RTR2(t *testing.T) {
	h := newHarness(t)
	session := h.register(nil)
	r := h.registryWith(Options{Workers: 1, Queue: 1})
	release := saturate(t, r)
	defer release()
	for _, c := range []struct {
		method, path, token, body string
		status                    int
	}{
		{"GET", "/registry/workers", "", "", 401},
		{"GET", "/registry/health", "wrong", "", 401},
		{"POST", "/registry/heartbeat", "", h.beatBody(session, nil), 401},
		{"POST", "/registry/register", "wrong", `{}`, 401},
		{"GET", "/registry/workers", workerToken, "", 403},
		{"POST", "/registry/heartbeat", operatorToken, h.beatBody(session, nil), 403},
	} {
		if res := h.do(r, c.method, c.path, c.token, c.body); res.status != c.status {
			t.Fatalf("unexpected reply to %s %s with token %q on a full pool; got %d %s; want %d", c.method, c.path, c.token, res.status, res.body, c.status)
		}
	}
}

// saturate fills r's pool (one worker, a queue of one: Options Workers 1,
// Queue 1) until release: one task running, one waiting.
func saturate(t *testing.T, r *Registry) (release func()) {
	t.Helper()
	block := make(chan struct{})
	started := make(chan struct{})
	if err := r.pool.Submit(func() { close(started); <-block }); err != nil {
		t.Fatal(err)
	}
	<-started
	queued := make(chan struct{})
	go func() {
		defer close(queued)
		_ = r.pool.Submit(func() {})
	}()
	waitQueued(t, r)
	return func() {
		close(block)
		<-queued
	}
}

// A release batch naming a session of another account is refused whole:
// the items before it stay placed, not freed before the 403 (R-REG-3: bad
// input gets its error and loses nothing).
func TestReleaseBatchForbiddenFreesNothing_RREG3(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		mine := h.register(map[string]any{"instances": map[string][]string{"/counters": {"x"}}})
		c, v := h.fw.pair("other")
		res := h.post("/registry/register", otherToken, mustJSON(t, map[string]any{
			"clientId": "other-client", "secret": h.fw.secret, "namespaces": []string{"/counters"},
			"advertiseUrl": h.fw.srv.URL + "/other", "headroom": 1, "draining": false, "challenge": c, "challengeValue": v,
			"instances": map[string][]string{"/counters": {"y"}},
		}))
		if res.status != 200 {
			t.Fatalf("unexpected register reply; got %d %s; want 200", res.status, res.body)
		}
		var ack struct{ SessionID string }
		_ = json.Unmarshal([]byte(res.body), &ack)
		body := `[{"sessionId":"` + mine + `","namespace":"/counters","id":"x"},{"sessionId":"` + ack.SessionID + `","namespace":"/counters","id":"y"}]`
		if res := h.post("/registry/release", workerToken, body); res.status != 403 || res.body != `{"error":"forbidden"}` {
			t.Fatalf("unexpected reply; got %d %s; want 403 %s", res.status, res.body, `{"error":"forbidden"}`)
		}
		for id, owner := range map[string]string{"x": mine, "y": ack.SessionID} {
			p, err := h.ds.Placement(t.Context(), "/counters", id, h.clock())
			if err != nil || p.SessionID != owner {
				t.Fatalf("unexpected placement of %s after a refused release; got %+v, %v; want owner %s", id, p, err, owner)
			}
		}
	})
}

// A release body of null is neither the array workers send nor one item:
// a schema failure, like every other endpoint's null body (R-REG-7).
func TestReleaseNullBody_RREG7(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		want := `{"error":"expected [{ sessionId, namespace, id, epoch? }]"}`
		for _, body := range []string{`null`, ` null `} {
			if res := h.post("/registry/release", workerToken, body); res.status != 400 || res.body != want {
				t.Fatalf("unexpected reply for %q; got %d %s; want 400 %s", body, res.status, res.body, want)
			}
		}
	})
}

// outcomes records the heartbeat outcomes a Registry reports.
type outcomes struct {
	mu  sync.Mutex
	got []string
}

func (o *outcomes) Heartbeat(_ time.Duration, outcome string) {
	o.mu.Lock()
	o.got = append(o.got, outcome)
	o.mu.Unlock()
}
func (o *outcomes) Probe(time.Duration, ProbeResult) {}
func (o *outcomes) QueueDepth(int)                   {}

func (o *outcomes) last() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.got) == 0 {
		return ""
	}
	return o.got[len(o.got)-1]
}

// A heartbeat the registry turns away before it runs — its pool full
// (503 registry busy) or the node stopping (503 not the serving fleet) —
// is an answered heartbeat all the same: pinboard_registry_heartbeats_total
// counts it by why, "busy" or "stopping", and an operator sees workers
// being refused, where before nothing was counted (R-REG-2).
func TestRefusedHeartbeatsObserved_RREG2(t *testing.T) {
	h := newHarness(t)
	session := h.register(nil)
	obs := &outcomes{}
	r := h.registryWith(Options{Workers: 1, Queue: 1, Observer: obs})
	release := saturate(t, r)
	res := h.do(r, "POST", "/registry/heartbeat", workerToken, h.beatBody(session, nil))
	release()
	if res.status != 503 || res.body != `{"error":"registry busy"}` || obs.last() != "busy" {
		t.Fatalf("unexpected heartbeat on a full pool; got %d %s, outcome %q; want 503 registry busy, busy", res.status, res.body, obs.last())
	}

	r.Stop()
	res = h.do(r, "POST", "/registry/heartbeat", workerToken, h.beatBody(session, nil))
	if res.status != 503 || obs.last() != "stopping" {
		t.Fatalf("unexpected heartbeat on a stopping node; got %d %s, outcome %q; want 503, stopping", res.status, res.body, obs.last())
	}
	res = h.do(r, "POST", "/registry/heartbeat", "wrong", h.beatBody(session, nil))
	if res.status != 401 || obs.last() != "auth" {
		t.Fatalf("unexpected heartbeat with a bad token on a stopping node; got %d %s, outcome %q; want 401, auth", res.status, res.body, obs.last())
	}
}

// A degraded session's heartbeat probes off the pool and then goes back
// to it with the answer; turned away there — the pool full (503 registry
// busy) — it is counted as "busy" like one turned away on arrival, where
// before nothing was counted for it (R-REG-2).
func TestRefusedDegradedHeartbeatObserved_RREG2(t *testing.T) {
	h := newHarness(t)
	obs := &outcomes{}
	r := h.registryWith(Options{ProbeTimeout: time.Minute, Workers: 1, MinWorkers: 1, Queue: 1, Observer: obs})
	h.r = r
	session := h.register(nil)
	h.fw.mode.Store("404")
	if res := h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil)); !strings.Contains(res.body, `"degraded":true`) {
		t.Fatalf("cannot degrade the session; got %d %s", res.status, res.body)
	}
	h.fw.mode.Store("hang")
	before := h.fw.probes.Load()
	got := make(chan response, 1)
	go func() { got <- h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil)) }()
	for deadline := time.Now().Add(10 * time.Second); h.fw.probes.Load() == before; {
		if time.Now().After(deadline) {
			t.Fatal("the degraded session's probe did not start")
		}
		time.Sleep(5 * time.Millisecond)
	}
	release := saturate(t, r)
	close(h.fw.hang) // the probe answers; the pool is full
	res := <-got
	release()
	if res.status != 503 || res.body != `{"error":"registry busy"}` || obs.last() != "busy" {
		t.Fatalf("unexpected heartbeat turned away after its probe; got %d %s, outcome %q; want 503 registry busy, busy", res.status, res.body, obs.last())
	}
}

// Scopes (R-TR-2): pinboard:worker is what register, heartbeat, release
// and deregister need, pinboard:operator what the registry reads, drain,
// undrain and wind-down need. Each refuses the other scope alone with 403
// {"error":"forbidden"} and no credential with 401, and admits its own.
func TestScopes_RTR2(t *testing.T) {
	h := newHarness(t)
	s := h.register(map[string]any{"clientId": "scoped", "instances": map[string][]string{"/counters": {"alice"}}})
	c, v := h.fw.pair("scopes")
	reg := mustJSON(t, map[string]any{
		"clientId": "scoped-2", "secret": h.fw.secret, "namespaces": []string{"/counters"}, "advertiseUrl": h.fw.srv.URL + "/w2",
		"headroom": 1, "draining": false, "challenge": c, "challengeValue": v,
	})
	cases := []struct {
		method, path, body string
		scope              string // the token that holds the scope
	}{
		{"POST", "/registry/register", reg, workerToken},
		{"POST", "/registry/heartbeat", h.beatBody(s, nil), workerToken},
		{"POST", "/registry/release", `[{"sessionId":"` + s + `","namespace":"/counters","id":"nobody"}]`, workerToken},
		{"GET", "/registry/workers", "", operatorToken},
		{"GET", "/registry/health", "", operatorToken},
		{"GET", "/registry/placement?namespace=/counters&id=alice", "", operatorToken},
		{"POST", "/registry/wind-down", `{"namespace":"/counters","id":"alice","deadline":30}`, operatorToken},
		{"POST", "/registry/drain", `{"clientId":"scoped"}`, operatorToken},
		{"POST", "/registry/undrain", `{"clientId":"scoped"}`, operatorToken},
		// Last: it ends the session the others use.
		{"POST", "/registry/deregister", `{"sessionId":"` + s + `"}`, workerToken},
	}
	for _, tc := range cases {
		other := operatorToken
		if tc.scope == operatorToken {
			other = workerToken
		}
		if res := h.do(h.r, tc.method, tc.path, other, tc.body); res.status != 403 || res.body != `{"error":"forbidden"}` {
			t.Fatalf("unexpected reply to %s %s without its scope; got %d %s; want 403 {\"error\":\"forbidden\"}", tc.method, tc.path, res.status, res.body)
		}
		if res := h.do(h.r, tc.method, tc.path, "", tc.body); res.status != 401 || res.body != `{"error":"unauthorized"}` {
			t.Fatalf("unexpected reply to %s %s without a credential; got %d %s; want 401", tc.method, tc.path, res.status, res.body)
		}
		if res := h.do(h.r, tc.method, tc.path, tc.scope, tc.body); res.status != 200 {
			t.Fatalf("unexpected reply to %s %s with its scope; got %d %s; want 200", tc.method, tc.path, res.status, res.body)
		}
	}
}

// The listing's shape (R-REG-4): each worker's own namespaces — only those
// the credential's claims cover (R-TR-3) — and its state: headroom,
// draining (own or operator), the operator drain's deadline, degraded with
// degradedSince, and the lease expiry.
func TestWorkersListingNamespacesAndState_RREG4_RTR3(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		s := h.register(map[string]any{"clientId": "c-ns", "namespaces": []string{"/counters", "/other"}})
		nsOf := func(w map[string]any) string { b, _ := json.Marshal(w["namespaces"]); return string(b) }
		if got := nsOf(onlyListed(t, h, operatorToken)); got != `["/counters","/other"]` {
			t.Fatalf("unexpected namespaces for a credential covering all; got %s", got)
		}
		if got := nsOf(onlyListed(t, h, narrowToken)); got != `["/other"]` {
			t.Fatalf("unexpected namespaces for a credential covering /other only; got %s; want [\"/other\"]", got)
		}

		// Degraded: the heartbeat's probe failed.
		h.advance(3 * time.Second)
		h.fw.mode.Store("500")
		if res := h.post("/registry/heartbeat", workerToken, h.beatBody(s, map[string]any{"headroom": 4})); res.status != 200 || !strings.Contains(res.body, `"degraded":true`) {
			t.Fatalf("cannot degrade the session; got %d %s", res.status, res.body)
		}
		h.fw.mode.Store("ok")
		// A timed operator drain.
		if res := h.post("/registry/drain", operatorToken, `{"clientId":"c-ns","deadline":60}`); res.status != 200 {
			t.Fatalf("cannot drain; got %d %s", res.status, res.body)
		}
		h.advance(2 * time.Second)
		w := onlyListed(t, h, operatorToken)
		now := h.clock()
		for k, want := range map[string]any{
			"clientId": "c-ns", "sessionId": s, "headroom": 4.0, "draining": true, "operatorDrain": true,
			"drainDeadline": 58.0, "degraded": true, "degradedSince": float64(now.Add(-2 * time.Second).UnixMilli()),
			"expiresInMs": 13000.0, "leaseExpiresAt": float64(now.Add(13 * time.Second).UnixMilli()),
		} {
			if w[k] != want {
				t.Fatalf("unexpected %s; got %v; want %v (worker %v)", k, w[k], want, w)
			}
		}
	})
}

// The listing writes a worker's epoch as the reference does: a
// JavaScript number, so a nanosecond timestamp past 2^53 reads
// 1700000000223456800 (the double's shortest decimal), not the double's
// exact integer 1700000000223456768, which a Python or Go client would
// read as a different epoch than the Node pinboard lists (R-REG-4, R-LS-4).
func TestWorkersListingEpochAsJavaScriptNumber_RREG4_RLS4(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		h.register(map[string]any{"clientId": "c-big", "hostname": "app.example", "env": "blue", "epoch": 1_700_000_000_223_456_789,
			"advertiseUrl": h.fw.srv.URL + "/big"})
		h.register(map[string]any{"clientId": "c-small", "hostname": "other.example", "env": "blue", "epoch": 7,
			"advertiseUrl": h.fw.srv.URL + "/small"})
		h.register(map[string]any{"clientId": "c-none", "advertiseUrl": h.fw.srv.URL + "/none"})
		res := h.get("/registry/workers", operatorToken)
		for _, want := range []string{`"epoch":1700000000223456800}`, `"epoch":7}`} {
			if res.status != 200 || !strings.Contains(res.body, want) {
				t.Fatalf("unexpected listing; got %d %s; want it to hold %s", res.status, res.body, want)
			}
		}
		if strings.Count(res.body, `"epoch"`) != 2 {
			t.Fatalf("unexpected listing; got %s; want no epoch for the worker without one", res.body)
		}
	})
}

// A headroom of -0, which JSON allows and a worker may send, is listed as
// the reference lists it: JSON.stringify writes 0 (R-REG-4).
func TestWorkersListingNegativeZeroHeadroom_RREG4(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		h.register(map[string]any{"clientId": "c-zero", "headroom": math.Copysign(0, -1)})
		res := h.get("/registry/workers", operatorToken)
		if res.status != 200 || !strings.Contains(res.body, `"headroom":0,`) || strings.Contains(res.body, `-0`) {
			t.Fatalf("unexpected listing; got %d %s; want \"headroom\":0", res.status, res.body)
		}
	})
}

// The listing counts a session's placements only for a credential that
// covers every namespace the session serves: one covering some of them
// sees the entry without the count, which would tell it how busy other
// tenants keep the worker (R-TR-3, R-REG-4).
func TestWorkersListingPlacementsOnlyWhenAllCovered_RREG4_RTR3(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		s := h.register(map[string]any{"clientId": "c-count", "namespaces": []string{"/counters", "/other"}})
		// The first placement attempt starts the cold-start quarantine (R-CS-1).
		if _, err := h.ds.Place(t.Context(), &directory.PlaceRequest{NS: "/counters", ID: "x", Now: h.clock()}); err == nil {
			t.Fatal("unexpected placement during the cold-start quarantine")
		}
		h.advance(10 * time.Second)
		h.post("/registry/heartbeat", workerToken, h.beatBody(s, nil))
		h.advance(6 * time.Second)
		for _, id := range []string{"x", "y"} {
			if r, err := h.ds.Place(t.Context(), &directory.PlaceRequest{NS: "/counters", ID: id, Now: h.clock()}); err != nil || r.Owner.SessionID != s {
				t.Fatalf("cannot place %s: %+v %v", id, r, err)
			}
		}
		if got := onlyListed(t, h, operatorToken)["placements"]; got != 2.0 {
			t.Fatalf("unexpected placements for a credential covering every namespace; got %v; want 2", got)
		}
		if w := onlyListed(t, h, narrowToken); w["placements"] != nil {
			t.Fatalf("unexpected placements for a credential covering /other only; got %v; want none (worker %v)", w["placements"], w)
		}
	})
}

// onlyListed is the one worker GET /registry/workers lists for token.
func onlyListed(t *testing.T, h *harness, token string) map[string]any {
	t.Helper()
	res := h.get("/registry/workers", token)
	var out struct {
		Workers []map[string]any `json:"workers"`
	}
	if err := json.Unmarshal([]byte(res.body), &out); err != nil || res.status != 200 || len(out.Workers) != 1 {
		t.Fatalf("unexpected listing; got %d %s; want one worker", res.status, res.body)
	}
	return out.Workers[0]
}

// downStore is a directory that stops answering once down is set.
type downStore struct {
	*directory.Memory
	down atomic.Bool
}

func (s *downStore) Register(ctx context.Context, reg *directory.Registration, now time.Time) (*directory.RegisterResult, error) {
	if s.down.Load() {
		return nil, directory.ErrUnavailable
	}
	return s.Memory.Register(ctx, reg, now)
}

func (s *downStore) Session(ctx context.Context, id string, now time.Time) (*directory.SessionInfo, error) {
	if s.down.Load() {
		return nil, directory.ErrUnavailable
	}
	return s.Memory.Session(ctx, id, now)
}

func (s *downStore) Heartbeat(ctx context.Context, b *directory.Beat, now time.Time) (*directory.BeatResult, error) {
	if s.down.Load() {
		return nil, directory.ErrUnavailable
	}
	return s.Memory.Heartbeat(ctx, b, now)
}

func (s *downStore) Workers(ctx context.Context, now time.Time) ([]directory.SessionInfo, error) {
	if s.down.Load() {
		return nil, directory.ErrUnavailable
	}
	return s.Memory.Workers(ctx, now)
}

// A registry that cannot serve yet — its directory not answering, or the
// node not (or no longer) the serving fleet — answers 503 with
// Retry-After, which the worker honours as a deferral (R-REG-7), for
// register and heartbeat alike, and for the operator's reads.
func TestColdRegistry503RetryAfter_RREG7(t *testing.T) {
	h := newHarness(t)
	ds := &downStore{Memory: h.store}
	r := h.registryWith(Options{Store: ds, ProbeTimeout: time.Second, Workers: 4, Queue: 16})
	h.r = r
	s := h.register(nil)
	ds.down.Store(true)
	c, v := h.fw.pair("cold")
	reg := mustJSON(t, map[string]any{
		"clientId": "cold", "secret": h.fw.secret, "namespaces": []string{"/counters"}, "advertiseUrl": h.fw.srv.URL + "/cold",
		"headroom": 1, "draining": false, "challenge": c, "challengeValue": v,
	})
	check := func(what string, res response, want string) {
		t.Helper()
		if res.status != 503 || res.body != want || string(res.header.Peek("Retry-After")) == "" {
			t.Fatalf("unexpected reply to %s; got %d %s retry-after=%q; want 503 %s with Retry-After", what, res.status, res.body, res.header.Peek("Retry-After"), want)
		}
	}
	const unavailable = `{"error":"directory unavailable"}`
	check("register, directory down", h.post("/registry/register", workerToken, reg), unavailable)
	check("heartbeat, directory down", h.post("/registry/heartbeat", workerToken, h.beatBody(s, nil)), unavailable)
	check("workers, directory down", h.get("/registry/workers", operatorToken), unavailable)
	ds.down.Store(false)
	if res := h.post("/registry/heartbeat", workerToken, h.beatBody(s, nil)); res.status != 200 {
		t.Fatalf("unexpected reply once the directory answers; got %d %s", res.status, res.body)
	}
	r.Stop()
	const notServing = `{"error":"not the serving fleet"}`
	check("register, not serving", h.post("/registry/register", workerToken, reg), notServing)
	check("heartbeat, not serving", h.post("/registry/heartbeat", workerToken, h.beatBody(s, nil)), notServing)
}

// A release batch is bounded by the body limit alone (R-REG-7: 1 MiB), as
// the worker sends it: RegistrationClient._flush_releases posts every
// release queued behind the one in flight as one array, so a worker whose
// instances close together (a drain's idle evictions, the closes queued
// while it re-registers) sends more than 10,000 items well within the
// limit. They were refused whole with the schema 400, retried unchanged
// and dropped, and the placements stayed on the worker.
func TestReleaseBatchBoundByBodyLimit_RREG3_RREG7(t *testing.T) {
	h := newHarness(t)
	const n = 10_001
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("i%05d", i)
	}
	sid := h.register(map[string]any{"instances": map[string][]string{"/counters": ids}})
	// The worker's encoding: httpx's json= is json.dumps with its default
	// ", " and ": " separators.
	var b strings.Builder
	b.WriteByte('[')
	for i, id := range ids {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, `{"sessionId": %q, "namespace": "/counters", "id": %q}`, sid, id)
	}
	b.WriteByte(']')
	if b.Len() > 1<<20 {
		t.Fatalf("BUG: the batch is %d bytes, past the body limit", b.Len())
	}
	want := fmt.Sprintf(`{"released":%d}`, n)
	if res := h.post("/registry/release", workerToken, b.String()); res.status != 200 || res.body != want {
		t.Fatalf("unexpected reply; got %d %.200s; want 200 %s", res.status, res.body, want)
	}
}

// Claims bound what an operator may touch (R-TR-3): hostnames and env as
// well as namespaces. An operator key limited to the env "staging" lists,
// counts, drains, looks up and winds down only staging's workers; it saw
// production's and could drain them.
func TestOperatorBoundByEnvClaims_RTR3(t *testing.T) {
	h := newHarness(t)
	prod := h.register(map[string]any{"clientId": "c-prod", "hostname": "app.example", "env": "prod",
		"instances": map[string][]string{"/counters": {"p1"}}})
	staging := h.register(map[string]any{"clientId": "c-staging", "hostname": "staging.example", "env": "staging",
		"advertiseUrl": h.fw.srv.URL + "/staging", "instances": map[string][]string{"/tickers": {"s1"}}})
	res := h.get("/registry/workers", stagingOpToken)
	if res.status != 200 || strings.Contains(res.body, prod) || !strings.Contains(res.body, staging) {
		t.Fatalf("unexpected listing for a staging operator; got %d %s; want staging's worker only", res.status, res.body)
	}
	if res := h.get("/registry/health", stagingOpToken); !strings.HasSuffix(res.body, `"workers":1}`) {
		t.Fatalf("unexpected health for a staging operator; got %d %s; want workers 1", res.status, res.body)
	}
	if res := h.get("/registry/workers", operatorToken); !strings.Contains(res.body, prod) || !strings.Contains(res.body, staging) {
		t.Fatalf("unexpected listing for an operator of every env; got %s", res.body)
	}
	for _, c := range []struct {
		method, path, body string
		status             int
	}{
		{"POST", "/registry/drain", `{"clientId":"c-prod"}`, 403},
		{"POST", "/registry/undrain", `{"clientId":"c-prod"}`, 403},
		{"GET", "/registry/placement?namespace=/counters&id=p1", "", 403},
		{"POST", "/registry/wind-down", `{"namespace":"/counters","id":"p1","deadline":5}`, 403},
		{"POST", "/registry/drain", `{"clientId":"c-staging"}`, 200},
		{"POST", "/registry/undrain", `{"clientId":"c-staging"}`, 200},
		{"GET", "/registry/placement?namespace=/tickers&id=s1", "", 200},
		{"POST", "/registry/wind-down", `{"namespace":"/tickers","id":"s1","deadline":5}`, 200},
		// A client with no live session has no env to check: only a key
		// that covers every env may clear its drain.
		{"POST", "/registry/undrain", `{"clientId":"c-gone"}`, 404},
	} {
		res := h.do(h.r, c.method, c.path, stagingOpToken, c.body)
		if res.status != c.status || c.status == 403 && res.body != `{"error":"forbidden"}` {
			t.Errorf("unexpected reply to %s %s %s for a staging operator; got %d %s; want %d", c.method, c.path, c.body, res.status, res.body, c.status)
		}
	}
	// Past prod's lease its placement row stays until the sweep, its owner
	// gone: no env is left to check, so only a key covering every env may
	// look it up (reachesOwner).
	h.advance(testTTL)
	if res := h.get("/registry/placement?namespace=/counters&id=p1", stagingOpToken); res.status != 403 || res.body != `{"error":"forbidden"}` {
		t.Errorf("unexpected lookup of a dead prod owner's placement by a staging operator; got %d %s; want 403", res.status, res.body)
	}
	if res := h.get("/registry/placement?namespace=/counters&id=p1", operatorToken); res.status != 200 || !strings.Contains(res.body, `"live":false`) {
		t.Errorf("unexpected lookup of a dead owner's placement by an operator of every env; got %d %s; want 200, not live", res.status, res.body)
	}
}

// movingStore moves an id to another worker just before the first
// wind-down reaches the store: between the operator's check of the owner
// and the queueing.
type movingStore struct {
	*directory.Memory
	move func()
}

func (s *movingStore) WindDown(ctx context.Context, ns, id, owner string, deadline *time.Time, now time.Time) (string, string, error) {
	if s.move != nil {
		s.move()
		s.move = nil
	}
	return s.Memory.WindDown(ctx, ns, id, owner, deadline, now)
}

// A wind-down goes to the owner the operator's credential was checked
// against (R-CM-1, R-TR-3): an id that moved between the check and the
// queueing — here from staging's worker to prod's — is checked again, and
// a staging operator is refused instead of winding down prod's instance.
func TestWindDownOfMovedIDChecksNewOwner_RCM1_RTR3(t *testing.T) {
	h := newHarness(t)
	ms := &movingStore{Memory: h.store}
	h.r = h.registryOn(ms, testPassport(t))
	// Past the cold-start quarantine (R-CS-1), so that the id may move.
	_, _ = h.store.Place(t.Context(), &directory.PlaceRequest{NS: "/tickers", ID: "warm", Now: h.clock()})
	h.advance(testTTL)
	prod := h.register(map[string]any{"clientId": "c-prod", "hostname": "app.example", "env": "prod"})
	staging := h.register(map[string]any{"clientId": "c-staging", "hostname": "staging.example", "env": "staging",
		"advertiseUrl": h.fw.srv.URL + "/staging", "instances": map[string][]string{"/tickers": {"s1"}}})
	ms.move = func() {
		ctx, now := t.Context(), h.clock()
		if ok, err := h.store.Release(ctx, &directory.ReleaseRequest{SessionID: staging, NS: "/tickers", ID: "s1"}, now); !ok || err != nil {
			t.Errorf("cannot release s1: %v, %v", ok, err)
		}
		r, err := h.store.Place(ctx, &directory.PlaceRequest{NS: "/tickers", ID: "s1", Exclude: staging, Now: now})
		if err != nil || r.Owner.SessionID != prod {
			t.Errorf("unexpected move of s1; got %+v, %v; want it on prod's worker %s", r, err, prod)
		}
	}
	res := h.do(h.r, "POST", "/registry/wind-down", stagingOpToken, `{"namespace":"/tickers","id":"s1","deadline":5}`)
	if res.status != 403 || res.body != `{"error":"forbidden"}` {
		t.Fatalf("unexpected wind-down of an id moved to prod by a staging operator; got %d %s; want 403", res.status, res.body)
	}
	if res := h.post("/registry/heartbeat", workerToken, h.beatBody(prod, nil)); res.status != 200 || strings.Contains(res.body, "wind_down") {
		t.Fatalf("unexpected heartbeat for prod's worker; got %d %s; want no wind_down", res.status, res.body)
	}
	res = h.do(h.r, "POST", "/registry/wind-down", operatorToken, `{"namespace":"/tickers","id":"s1","deadline":5}`)
	if res.status != 200 || !strings.Contains(res.body, `"sessionId":"`+prod+`"`) {
		t.Fatalf("unexpected wind-down by an operator of every env; got %d %s; want 200 on %s", res.status, res.body, prod)
	}
}

// A drain names a client: an empty clientId is the schema failure, not a
// drain of nothing; and the deadline's range is inclusive, 604800 s (7
// days) a timed drain like any other (R-REG-6, R-REG-7).
func TestDrainClientIDAndDeadlineBounds_RREG6(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		h.register(map[string]any{"clientId": "week"})
		for _, tc := range []struct {
			path, body string
			status     int
			want       string
		}{
			{"/registry/drain", `{"clientId":""}`, 400, `{"error":"expected { clientId, deadline? }"}`},
			{"/registry/undrain", `{"clientId":""}`, 400, `{"error":"expected { clientId }"}`},
			{"/registry/drain", `{"clientId":"week","deadline":604800}`, 200, `{"clientId":"week","draining":true,"drainDeadline":604800}`},
			{"/registry/drain", `{"clientId":"week","deadline":0}`, 200, `{"clientId":"week","draining":true,"drainDeadline":0}`},
		} {
			if res := h.post(tc.path, operatorToken, tc.body); res.status != tc.status || res.body != tc.want {
				t.Fatalf("unexpected reply to %s %s; got %d %s; want %d %s", tc.path, tc.body, res.status, res.body, tc.status, tc.want)
			}
		}
	})
}

// An operator whose claims do not cover a namespace is refused there
// before the store is asked: 403, whether or not the id is placed — a
// 404 for unplaced ids would tell it which ids of another tenant are
// live (R-TR-3).
func TestPlacementOutsideClaimsForbiddenWhenUnplaced_RTR3(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		h.register(map[string]any{"instances": map[string][]string{"/counters": {"alice"}}})
		for _, id := range []string{"alice", "nobody"} {
			if res := h.get("/registry/placement?namespace=/counters&id="+id, narrowToken); res.status != 403 || res.body != `{"error":"forbidden"}` {
				t.Fatalf("unexpected placement of %s outside the claims; got %d %s; want 403", id, res.status, res.body)
			}
			if res := h.post("/registry/wind-down", narrowToken, `{"namespace":"/counters","id":"`+id+`","deadline":1}`); res.status != 403 || res.body != `{"error":"forbidden"}` {
				t.Fatalf("unexpected wind-down of %s outside the claims; got %d %s; want 403", id, res.status, res.body)
			}
		}
	})
}
