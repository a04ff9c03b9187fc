package registry

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/attest"
	"github.com/pinboard-go/pinboard/directory"
)

func TestRegisterAck_RREG1(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		c, v := h.fw.pair("one")
		res := h.post("/registry/register", workerToken, mustJSON(t, map[string]any{
			"clientId": "c1", "secret": h.fw.secret, "namespaces": []string{"/counters"},
			"advertiseUrl": h.fw.srv.URL, "headroom": 1024, "draining": false,
			"challenge": c, "challengeValue": v,
		}))
		if res.status != 200 {
			t.Fatalf("unexpected reply; got %d %s", res.status, res.body)
		}
		if !regexp.MustCompile(`^\{"sessionId":"[0-9a-f]{32}","expiresInMs":15000,"draining":false\}$`).MatchString(res.body) {
			t.Fatalf("unexpected ack; got %s", res.body)
		}
		if h.fw.probes.Load() != 1 {
			t.Fatalf("unexpected probe count; got %d; want 1", h.fw.probes.Load())
		}
	})
}

func TestRegisterSchema_RREG7(t *testing.T) {
	h := newHarness(t)
	base := func() map[string]any {
		return map[string]any{
			"clientId": "c1", "secret": "s", "namespaces": []string{"/counters"},
			"advertiseUrl": h.fw.srv.URL, "headroom": 1, "draining": false,
			"challenge": "c", "challengeValue": "v",
		}
	}
	shape := string(bodyRegisterShape)
	for _, field := range []string{"clientId", "secret", "namespaces", "advertiseUrl", "headroom", "draining", "challenge", "challengeValue"} {
		b := base()
		delete(b, field)
		if res := h.post("/registry/register", workerToken, mustJSON(t, b)); res.status != 400 || res.body != shape {
			t.Fatalf("unexpected reply without %s; got %d %s", field, res.status, res.body)
		}
	}
	bad := []struct {
		field string
		value any
	}{
		{"namespaces", []string{}},
		{"namespaces", []string{"counters"}},
		{"namespaces", []string{"/a/b"}},
		{"namespaces", []string{"/a", "/a"}},
		{"headroom", "12"},
		{"draining", "no"},
		{"clientId", ""},
		{"takeover", "steal"},
		{"epoch", -1},
		{"epoch", 1.5},
		{"epoch", 1e19},
		{"instances", map[string]any{"/counters": "alice"}},
		{"instances", map[string]any{"nope": []string{"a"}}},
		// Ids as the data plane routes them (directory.CheckID, the
		// reference worker's rule).
		{"instances", map[string][]string{"/counters": {""}}},
		{"instances", map[string][]string{"/counters": {"al ice"}}},
		{"instances", map[string][]string{"/counters": {".."}}},
		{"instances", map[string][]string{"/counters": {strings.Repeat("a", 257)}}},
		{"envs", []string{"x"}},
	}
	for _, b := range bad {
		m := base()
		m[b.field] = b.value
		if res := h.post("/registry/register", workerToken, mustJSON(t, m)); res.status != 400 || res.body != shape {
			t.Fatalf("unexpected reply for %s=%v; got %d %s", b.field, b.value, res.status, res.body)
		}
	}
	if res := h.post("/registry/register", workerToken, `{"clientId":`); res.status != 400 || res.body != `{"error":"invalid json"}` {
		t.Fatalf("unexpected reply for invalid json; got %d %s", res.status, res.body)
	}
	big := `{"clientId":"` + strings.Repeat("x", MaxBody) + `"}`
	if res := h.post("/registry/register", workerToken, big); res.status != 413 || res.body != `{"error":"body too large"}` {
		t.Fatalf("unexpected reply for a large body; got %d %s", res.status, res.body)
	}
	if h.fw.probes.Load() != 0 {
		t.Fatalf("unexpected probes for invalid registrations: %d", h.fw.probes.Load())
	}
}

func TestRegisterAuth_RTR2_RTR3(t *testing.T) {
	h := newHarness(t)
	c, v := h.fw.pair("a")
	body := func(adv string, ns ...string) string {
		return mustJSON(t, map[string]any{
			"clientId": "c1", "secret": h.fw.secret, "namespaces": ns, "advertiseUrl": adv,
			"headroom": 1, "draining": false, "challenge": c, "challengeValue": v,
		})
	}
	cases := []struct {
		name, token, body string
		status            int
		want              string
	}{
		{"no token", "", body(h.fw.srv.URL, "/counters"), 401, `{"error":"unauthorized"}`},
		{"operator scope only", operatorToken, body(h.fw.srv.URL, "/counters"), 403, `{"error":"forbidden"}`},
		{"namespace not covered", narrowToken, body(h.fw.srv.URL, "/counters"), 403, `{"error":"forbidden: namespace /counters is not covered by the credential's claims"}`},
		// Another loopback address (the key allows 127.0.0.1 only): were the
		// claim not checked, the probe still dials nothing off this machine.
		{"backend host not allowed", workerToken, body("http://127.0.0.2:8000", "/counters"), 403, ""},
		{"bad scheme", workerToken, body("ftp://127.0.0.1:1", "/counters"), 403, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := h.post("/registry/register", tc.token, tc.body)
			if res.status != tc.status || (tc.want != "" && res.body != tc.want) || !strings.HasPrefix(res.body, `{"error":`) {
				t.Fatalf("unexpected reply; got %d %s; want %d %s", res.status, res.body, tc.status, tc.want)
			}
		})
	}
	if h.fw.probes.Load() != 0 {
		t.Fatalf("unexpected probes of refused registrations: %d", h.fw.probes.Load())
	}
}

// A key limited to some envs cannot bind another through the
// per-namespace envs map either (R-TR-3, R-LS-4).
func TestRegisterEnvClaims_RTR3_RLS4(t *testing.T) {
	h := newHarness(t)
	body := func(extra map[string]any) string {
		c, v := h.fw.pair("e")
		b := map[string]any{
			"clientId": "c1", "secret": h.fw.secret, "namespaces": []string{"/counters"}, "advertiseUrl": h.fw.srv.URL,
			"headroom": 1, "draining": false, "challenge": c, "challengeValue": v, "hostname": "app.example",
		}
		maps.Copy(b, extra)
		return mustJSON(t, b)
	}
	cases := []struct {
		name   string
		extra  map[string]any
		status int
		want   string
	}{
		{"env covered", map[string]any{"env": "staging"}, 200, ""},
		{"env not covered", map[string]any{"env": "prod"}, 403, `{"error":"forbidden: env prod is not covered by the credential's claims"}`},
		{"envs not covered", map[string]any{"env": "staging", "envs": map[string]string{"/counters": "prod"}}, 403,
			`{"error":"forbidden: env prod (for /counters) is not covered by the credential's claims"}`},
		{"envs covered", map[string]any{"envs": map[string]string{"/counters": "staging"}}, 200, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := h.post("/registry/register", stagingToken, body(tc.extra))
			if res.status != tc.status || (tc.want != "" && res.body != tc.want) {
				t.Fatalf("unexpected reply; got %d %s; want %d %s", res.status, res.body, tc.status, tc.want)
			}
		})
	}
}

// A hostname binds each namespace to an env, none being one too: a key
// limited to some envs that leaves env out must not join, as a replica, the
// binding of workers registered without an env (R-TR-3, R-LS-4). Without a
// hostname nothing is bound and no env is needed.
func TestRegisterEnvlessBindingUnderEnvClaims_RTR3_RLS4(t *testing.T) {
	h := newHarness(t)
	body := func(clientID string, extra map[string]any) string {
		c, v := h.fw.pair(clientID)
		b := map[string]any{
			"clientId": clientID, "secret": h.fw.secret, "namespaces": []string{"/counters"}, "advertiseUrl": h.fw.srv.URL,
			"headroom": 1, "draining": false, "challenge": c, "challengeValue": v, "hostname": "app.example", "epoch": 1,
		}
		maps.Copy(b, extra)
		for k, x := range b {
			if x == nil {
				delete(b, k)
			}
		}
		return mustJSON(t, b)
	}
	// The deployment key registers the env-less fleet that holds the binding.
	if res := h.post("/registry/register", workerToken, body("prod", nil)); res.status != 200 {
		t.Fatalf("unexpected reply for the env-less fleet; got %d %s; want 200", res.status, res.body)
	}
	const refused = `{"error":"forbidden: an empty env (for /counters) is not covered by the credential's claims"}`
	cases := []struct {
		name   string
		extra  map[string]any
		status int
		want   string
	}{
		{"no env", nil, 403, refused},
		{"envs maps the namespace to no env", map[string]any{"env": "staging", "envs": map[string]string{"/counters": ""}}, 403, refused},
		{"no hostname, no env", map[string]any{"hostname": nil}, 200, ""},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := h.post("/registry/register", stagingToken, body(fmt.Sprintf("staging-%d", i), tc.extra))
			if res.status != tc.status || (tc.want != "" && res.body != tc.want) {
				t.Fatalf("unexpected reply; got %d %s; want %d %s", res.status, res.body, tc.status, tc.want)
			}
		})
	}
}

// The register probe: unreachable defers with 503 + Retry-After (the
// worker backs off and retries), a 4xx or another value refuses (R-REG-1).
func TestRegisterProbeOutcomes_RREG1(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		reg := func() response {
			c, v := h.fw.pair("p")
			return h.post("/registry/register", workerToken, mustJSON(t, map[string]any{
				"clientId": "c1", "secret": h.fw.secret, "namespaces": []string{"/c"},
				"advertiseUrl": h.fw.srv.URL, "headroom": 1, "draining": false, "challenge": c, "challengeValue": v,
			}))
		}
		h.fw.mode.Store("mismatch")
		if res := reg(); res.status != 409 || res.body != `{"error":"challenge value mismatch on the advertise URL"}` {
			t.Fatalf("unexpected reply for a mismatch; got %d %s", res.status, res.body)
		}
		h.fw.mode.Store("404")
		if res := reg(); res.status != 409 || !strings.Contains(res.body, "challenge probe failed") {
			t.Fatalf("unexpected reply for a 404 probe; got %d %s", res.status, res.body)
		}
		h.fw.mode.Store("500")
		if res := reg(); res.status != 503 || string(res.header.Peek("Retry-After")) != "1" {
			t.Fatalf("unexpected reply for a 500 probe; got %d %s", res.status, res.body)
		}
		h.fw.srv.Close()
		res := reg()
		if res.status != 503 || res.body != `{"error":"challenge probe failed: advertise URL unreachable"}` || string(res.header.Peek("Retry-After")) != "1" {
			t.Fatalf("unexpected reply for an unreachable URL; got %d %s", res.status, res.body)
		}
		ws, err := h.ds.Workers(t.Context(), h.clock())
		if err != nil || len(ws) != 0 {
			t.Fatalf("unexpected sessions after refused registrations; got %d, %v; want none", len(ws), err)
		}
	})
}

// Re-registration with prevSessionId and instances: ids another live
// session took come back as duplicates (R-REG-1).
func TestReregisterDuplicates_RREG1(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		a := h.register(map[string]any{"clientId": "a", "instances": map[string][]string{"/counters": {"x", "y"}}})
		b := h.register(map[string]any{"clientId": "b"})
		// a's lease lapses while b keeps beating; then b takes y.
		h.advance(testTTL - time.Second)
		h.post("/registry/heartbeat", workerToken, h.beatBody(b, nil))
		h.advance(time.Second)
		if res := h.post("/registry/release", workerToken, `[{"sessionId":"`+a+`","namespace":"/counters","id":"y"}]`); res.body != `{"released":0}` {
			t.Fatalf("unexpected release by a lapsed session; got %s", res.body)
		}
		if _, err := h.ds.Place(t.Context(), &directory.PlaceRequest{NS: "/counters", ID: "y", Now: h.clock()}); err == nil {
			t.Fatalf("unexpected placement during the cold-start quarantine")
		}
		h.advance(10 * time.Second)
		h.post("/registry/heartbeat", workerToken, h.beatBody(b, nil))
		h.advance(5 * time.Second)
		r, err := h.ds.Place(t.Context(), &directory.PlaceRequest{NS: "/counters", ID: "y", Now: h.clock()})
		if err != nil || r.Owner.SessionID != b {
			t.Fatalf("cannot place y on b: %+v %v", r, err)
		}
		c, v := h.fw.pair("re")
		res := h.post("/registry/register", workerToken, mustJSON(t, map[string]any{
			"clientId": "a", "secret": h.fw.secret, "namespaces": []string{"/counters"}, "advertiseUrl": h.fw.srv.URL,
			"headroom": 1, "draining": false, "challenge": c, "challengeValue": v,
			"prevSessionId": a, "instances": map[string][]string{"/counters": {"x", "y"}},
		}))
		var ack struct {
			SessionID  string           `json:"sessionId"`
			Duplicates []directory.NSID `json:"duplicates"`
		}
		if err := json.Unmarshal([]byte(res.body), &ack); err != nil || res.status != 200 {
			t.Fatalf("unexpected reply; got %d %s", res.status, res.body)
		}
		if len(ack.Duplicates) != 1 || ack.Duplicates[0] != (directory.NSID{NS: "/counters", ID: "y"}) {
			t.Fatalf("unexpected duplicates; got %v; want [/counters y]", ack.Duplicates)
		}
		if !strings.Contains(res.body, `"duplicates":[{"ns":"/counters","id":"y"}]`) {
			t.Fatalf("unexpected duplicates wire shape: %s", res.body)
		}
	})
}

// A register body with a NUL byte in its clientId, a namespace, hostname
// or env is a schema failure: both stores use NUL as their separator (rows "ns\0id",
// binding keys "host\0ns", Redis tombs), and such a name split at it
// answered a wrong duplicate, a 503 for a superseded session's heartbeat
// instead of its 409, and let the sweep free a live binding (R-REG-7).
func TestRegisterRefusesNULBytes_RREG7(t *testing.T) {
	h := newHarness(t)
	cases := []struct {
		field string
		value any
	}{
		{"clientId", "c\x00d"},
		{"namespaces", []string{"/a\x00b"}},
		{"instances", map[string][]string{"/a\x00b": {"x"}}},
		{"hostname", "app\x00example"},
		{"env", "blue\x00green"},
		{"envs", map[string]string{"/counters": "blue\x00green"}},
	}
	for _, tc := range cases {
		c, v := h.fw.pair(tc.field)
		body := map[string]any{
			"clientId": "c1", "secret": h.fw.secret, "namespaces": []string{"/counters"},
			"advertiseUrl": h.fw.srv.URL, "headroom": 1, "draining": false, "challenge": c, "challengeValue": v,
		}
		body[tc.field] = tc.value
		res := h.post("/registry/register", workerToken, mustJSON(t, body))
		if res.status != 400 || res.body != string(bodyRegisterShape) {
			t.Fatalf("unexpected reply for a NUL in %s; got %d %s; want 400 %s", tc.field, res.status, res.body, bodyRegisterShape)
		}
	}
	if n := h.fw.probes.Load(); n != 0 {
		t.Fatalf("unexpected probes; got %d; want 0", n)
	}
}

// A worker serving /registry is told so at register: every request to it
// would reach the registry API instead (R-REG-7).
func TestRegisterRefusesRegistryNamespace_RREG7(t *testing.T) {
	h := newHarness(t)
	c, v := h.fw.pair("reserved")
	body := map[string]any{
		"clientId": "c1", "secret": h.fw.secret, "namespaces": []string{"/counters", "/registry"},
		"advertiseUrl": h.fw.srv.URL, "headroom": 1, "draining": false, "challenge": c, "challengeValue": v,
	}
	res := h.post("/registry/register", workerToken, mustJSON(t, body))
	if want := `{"error":"namespace /registry is reserved: pinboard serves its registry API there"}`; res.status != 400 || res.body != want {
		t.Fatalf("unexpected reply for namespace /registry; got %d %s; want 400 %s", res.status, res.body, want)
	}
	if n := h.fw.probes.Load(); n != 0 {
		t.Fatalf("unexpected probes; got %d; want 0", n)
	}
}

// A worker whose advertise URL does not answer (a firewall that drops
// pinboard's packets, a wrong ADVERTISE_URL) retries register for as long
// as it runs, and each probe waits the whole probe timeout. Like a
// degraded session's heartbeat, only its first attempt may hold a pool
// slot that long: from its next one on, the probe waits off the pool, or
// a fleet deployed with such a URL keeps every healthy worker's heartbeat
// queued until the leases lapse (R-REG-1, R-LS-1). Here the pool has one
// slot, four registers' probes hang for a minute, and a healthy worker's
// heartbeat is still answered.
func TestUnreachableRegisterProbesWaitOffPool_RREG1_RLS1(t *testing.T) {
	h := newHarness(t)
	r := h.registryWith(Options{ProbeTimeout: 200 * time.Millisecond, Workers: 1, MinWorkers: 1, Queue: 64})
	h.r = r
	healthy := h.register(nil)

	stuck := newFakeWorker(t)
	stuck.mode.Store("hang")
	var wg sync.WaitGroup
	t.Cleanup(func() { close(stuck.hang); wg.Wait() })
	body := func(i int) string {
		return mustJSON(t, map[string]any{
			"clientId": "stuck-" + itoa(i), "secret": stuck.secret, "namespaces": []string{"/counters"},
			"advertiseUrl": stuck.srv.URL, "headroom": 1, "draining": false, "challenge": "c", "challengeValue": "v",
		})
	}
	// The first attempt waits for its probe on the pool and is deferred.
	if res := h.post("/registry/register", workerToken, body(0)); res.status != 503 {
		t.Fatalf("unexpected reply to a register whose probe hangs; got %d %s; want %d", res.status, res.body, 503)
	}
	r.prober = NewProber(time.Minute)
	before := stuck.probes.Load()
	for i := range 4 {
		wg.Add(1)
		go func() { defer wg.Done(); h.do(r, "POST", "/registry/register", workerToken, body(i+1)) }()
	}
	for deadline := time.Now().Add(10 * time.Second); stuck.probes.Load()-before < 4; {
		if time.Now().After(deadline) {
			t.Fatalf("unexpected probes started; got %d; want %d: the others wait for the pool", stuck.probes.Load()-before, 4)
		}
		time.Sleep(5 * time.Millisecond)
	}
	h.wantBeatAnswered(r, healthy, 10*time.Second, "the probes of registers that cannot succeed")
}

// A register whose probe waits off the pool (its advertise URL's last
// probe found it unreachable) waits for the pool twice: before its checks
// and, probe done, before admit. MaxQueueWait bounds the two together, as
// it bounds the one wait of a probe made on the pool: each under it,
// together past it, the worker has given up (WorkerTimeout) and admitted
// the register would store a session the worker never learns of — the
// common case at a fleet's deploy, whose first register probes race the
// bind and whose registers queue (R-REG-1, R-LS-1).
func TestStaleAcrossOffPoolProbeNotHandled_RREG1_RLS1(t *testing.T) {
	h := newHarness(t)
	const maxWait, wait = time.Second, 600 * time.Millisecond // each wait under maxWait, both past it
	r := h.registryWith(Options{Workers: 1, MinWorkers: 1, Queue: 16, MaxQueueWait: maxWait})
	h.r = r
	r.unreachable.set(h.fw.srv.URL, true, h.clock()) // its last register's probe raced the bind
	// hold blocks the pool's one worker until the returned func is called.
	hold := func() func() {
		block, started := make(chan struct{}), make(chan struct{})
		if err := r.pool.Submit(func() { close(started); <-block }); err != nil {
			t.Fatal(err)
		}
		<-started
		return func() { close(block) }
	}
	queued := func() {
		for deadline := time.Now().Add(10 * time.Second); r.pool.Waiting() < 1; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the register did not queue for the pool in 10s")
			}
		}
	}
	body := h.lateRegisterBody()
	release := hold()
	got := make(chan response, 1)
	go func() { got <- h.post("/registry/register", workerToken, body) }()
	queued()
	time.Sleep(wait)
	probes := h.fw.probes.Load()
	h.fw.mode.Store("hang") // its probe, off the pool, waits while the pool fills again
	release()
	for deadline := time.Now().Add(10 * time.Second); h.fw.probes.Load() == probes; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the register's probe did not start in 10s")
		}
	}
	release = hold()
	h.fw.mode.Store("ok")
	close(h.fw.hang)
	queued()
	time.Sleep(wait)
	release()
	res := <-got
	if res.status != 503 || res.body != `{"error":"registry busy"}` || string(res.header.Peek("Retry-After")) != "1" {
		t.Fatalf("unexpected reply to a register that waited for the pool past MaxQueueWait in all; got %d %s Retry-After %q; want 503 registry busy, Retry-After 1",
			res.status, res.body, res.header.Peek("Retry-After"))
	}
	ws, err := h.store.Workers(t.Context(), h.clock())
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 0 {
		t.Fatalf("unexpected workers after a stale register; got %d; want 0", len(ws))
	}
}

// unreachableURLs forgets a URL after unreachableFor or a probe that
// reached it, and remembers no more than maxUnreachable URLs of at most
// maxUnreachableURL bytes (R-REG-1).
func TestUnreachableURLsBounds_RREG1(t *testing.T) {
	var u unreachableURLs
	now := time.Unix(1_800_000_000, 0)
	u.set("http://a", true, now)
	if got := u.has("http://a", now.Add(unreachableFor-time.Second)); !got {
		t.Fatalf("unexpected has before expiry; got %v; want %v", got, true)
	}
	if got := u.has("http://a", now.Add(unreachableFor)); got {
		t.Fatalf("unexpected has after expiry; got %v; want %v", got, false)
	}
	u.set("http://a", false, now)
	if got := u.has("http://a", now); got {
		t.Fatalf("unexpected has after a probe reached it; got %v; want %v", got, false)
	}
	long := "http://a/" + strings.Repeat("x", maxUnreachableURL)
	u.set(long, true, now)
	if got := u.has(long, now); got {
		t.Fatalf("unexpected has for a long URL; got %v; want %v", got, false)
	}
	for i := range maxUnreachable + 10 {
		u.set("http://h/"+itoa(i), true, now)
	}
	if got := len(u.m); got != maxUnreachable {
		t.Fatalf("unexpected URLs remembered; got %d; want %d", got, maxUnreachable)
	}
	later := now.Add(unreachableFor)
	u.set("http://new", true, later)
	if got := len(u.m); got != 1 || !u.has("http://new", later) {
		t.Fatalf("unexpected URLs remembered after the others expired; got %d; want %d", got, 1)
	}
}

// A key whose claims list hostnames registers only those (R-TR-3): another
// hostname is refused with the coverage message and never probed.
func TestRegisterHostnameClaims_RTR3(t *testing.T) {
	h := newHarness(t)
	raw := `{"providers":[{"type":"staticToken","id":"p","keys":[
		{"name":"worker","token":{"env":"W"},"scopes":["pinboard:worker"],"claims":{"pinboard":{"namespaces":["*"],"hostnames":["app.example"],"allowedBackendHosts":["127.0.0.1"]}}}
	]}]}`
	pp, err := attest.ParsePassport([]byte(raw), func(k string) (string, bool) { return workerToken, k == "W" })
	if err != nil {
		t.Fatal(err)
	}
	r := h.registry(pp)
	body := func(hostname string) string {
		c, v := h.fw.pair("host-" + hostname)
		return mustJSON(t, map[string]any{
			"clientId": "c-" + hostname, "secret": h.fw.secret, "namespaces": []string{"/counters"}, "advertiseUrl": h.fw.srv.URL + "/" + hostname,
			"headroom": 1, "draining": false, "challenge": c, "challengeValue": v, "hostname": hostname, "env": "blue", "epoch": 1,
		})
	}
	before := h.fw.probes.Load()
	res := h.do(r, "POST", "/registry/register", workerToken, body("other.example"))
	if want := `{"error":"forbidden: hostname other.example is not covered by the credential's claims"}`; res.status != 403 || res.body != want {
		t.Fatalf("unexpected reply for an uncovered hostname; got %d %s; want 403 %s", res.status, res.body, want)
	}
	if h.fw.probes.Load() != before {
		t.Fatalf("unexpected probe of a refused registration")
	}
	if res := h.do(r, "POST", "/registry/register", workerToken, body("app.example")); res.status != 200 {
		t.Fatalf("unexpected reply for a covered hostname; got %d %s; want 200", res.status, res.body)
	}
}

// A fully qualified hostname ("app.example.") binds the name requests
// carry: the proxy drops a Host's trailing dot, so the registry drops the
// hostname's, and a claims pattern written with the dot covers it
// (R-LS-4, R-TR-3).
func TestRegisterHostnameTrailingDot_RLS4_RTR3(t *testing.T) {
	h := newHarness(t)
	raw := `{"providers":[{"type":"staticToken","id":"p","keys":[
		{"name":"worker","token":{"env":"W"},"scopes":["pinboard:worker"],"claims":{"pinboard":{"namespaces":["*"],"hostnames":["APP.example."],"allowedBackendHosts":["127.0.0.1"]}}},
		{"name":"operator","token":{"env":"O"},"scopes":["pinboard:operator"],"claims":{"pinboard":{"namespaces":["*"]}}}
	]}]}`
	tokens := map[string]string{"W": workerToken, "O": operatorToken}
	pp, err := attest.ParsePassport([]byte(raw), func(k string) (string, bool) { v, ok := tokens[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	r := h.registry(pp)
	c, v := h.fw.pair("fqdn")
	body := mustJSON(t, map[string]any{
		"clientId": "c-fqdn", "secret": h.fw.secret, "namespaces": []string{"/counters"}, "advertiseUrl": h.fw.srv.URL,
		"headroom": 1, "draining": false, "challenge": c, "challengeValue": v, "hostname": "app.example.", "env": "blue", "epoch": 1,
	})
	if res := h.do(r, "POST", "/registry/register", workerToken, body); res.status != 200 {
		t.Fatalf("unexpected reply for a fully qualified hostname; got %d %s; want 200", res.status, res.body)
	}
	res := h.do(r, "GET", "/registry/workers", operatorToken, "")
	if !strings.Contains(res.body, `"hostname":"app.example"`) || strings.Contains(res.body, `app.example.`) {
		t.Fatalf("unexpected hostname in the workers listing; got %s; want app.example without its trailing dot", res.body)
	}
}

// A worker that registers draining (its own flag, as a draining process
// re-registering after a lost session does) takes no new placement from
// its registration on, not from its first heartbeat (R-REG-1, R-PL-1):
// the register ack echoes the flag from the body, so only the store can
// show it was kept.
func TestRegisterDrainingNotEligible_RREG1_RPL1(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		if _, err := h.ds.Place(t.Context(), &directory.PlaceRequest{NS: "/warm", ID: "x", Now: h.clock()}); err == nil {
			t.Fatal("unexpected placement on a cold store")
		}
		h.advance(15 * time.Second)
		s := h.register(map[string]any{"draining": true})
		if info, err := h.ds.Session(t.Context(), s, h.clock()); err != nil || !info.Draining {
			t.Fatalf("unexpected session after a draining registration; got %+v, %v; want draining", info, err)
		}
		if _, err := h.ds.Place(t.Context(), &directory.PlaceRequest{NS: "/counters", ID: "new", Now: h.clock()}); !errors.Is(err, directory.ErrNoEligible) {
			t.Fatalf("unexpected placement on a worker that registered draining; got %v; want ErrNoEligible", err)
		}
	})
}

// registerReply posts a register of the fake worker with extra fields and
// returns the reply, whatever it is.
func (h *harness) registerReply(extra map[string]any) response {
	h.t.Helper()
	h.seq++
	c, v := h.fw.pair("r" + itoa(h.seq))
	body := map[string]any{
		"clientId": "client-" + itoa(h.seq), "secret": h.fw.secret,
		"namespaces": []string{"/counters"}, "advertiseUrl": h.fw.srv.URL,
		"headroom": 100, "draining": false, "challenge": c, "challengeValue": v,
	}
	for k, x := range extra {
		body[k] = x
	}
	return h.post("/registry/register", workerToken, mustJSON(h.t, body))
}

// The register ack's draining is the worker's own flag or an operator
// drain on its clientId, and a timed operator drain's drainDeadline
// counts down in it as in the heartbeat ack (R-REG-1, R-REG-6, R-LS-5):
// pinned reads both from the register ack.
func TestRegisterAckDrainingAndDeadline_RREG1_RLS5(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		res := h.registerReply(map[string]any{"clientId": "own-drain", "draining": true})
		if res.status != 200 || !strings.Contains(res.body, `"draining":true`) || strings.Contains(res.body, "drainDeadline") {
			t.Fatalf("unexpected ack to a draining registration; got %d %s; want draining:true without drainDeadline", res.status, res.body)
		}
		h.register(map[string]any{"clientId": "timed"})
		if res := h.post("/registry/drain", operatorToken, `{"clientId":"timed","deadline":60}`); res.status != 200 {
			t.Fatalf("cannot drain; got %d %s", res.status, res.body)
		}
		h.advance(10 * time.Second)
		res = h.registerReply(map[string]any{"clientId": "timed"})
		if res.status != 200 || !strings.Contains(res.body, `"draining":true,"drainDeadline":50`) {
			t.Fatalf("unexpected ack to a registration under a timed drain; got %d %s; want draining:true, drainDeadline:50", res.status, res.body)
		}
	})
}

// A registration lists at most maxInstanceIDs ids in all: that many is a
// registration, one more the schema failure (R-REG-1, R-REG-7).
func TestRegisterInstanceIDsLimit_RREG1_RREG7(t *testing.T) {
	str := func(s string) *string { return &s }
	num, no := 1.0, false
	ns := []string{"/counters"}
	ids := make([]string, maxInstanceIDs+1)
	for i := range ids {
		ids[i] = "i" + itoa(i)
	}
	body := func(n int) *registerBody {
		return &registerBody{
			ClientID: str("c"), Secret: str("s"), Namespaces: &ns, AdvertiseURL: str("http://127.0.0.1:1"),
			Headroom: &num, Draining: &no, Challenge: str("c"), ChallengeValue: str("v"),
			Instances: map[string][]string{"/counters": ids[:n/2], "/tickers": ids[n/2 : n]},
		}
	}
	if body(maxInstanceIDs).validate() == nil {
		t.Fatalf("unexpected schema failure for %d instance ids", maxInstanceIDs)
	}
	if body(maxInstanceIDs+1).validate() != nil {
		t.Fatalf("unexpected registration with %d instance ids; want the schema failure", maxInstanceIDs+1)
	}
}

// A lone "." keeps its dot: it has no name to shorten, and stripped it
// would be no hostname at all — a registration that binds nothing in
// place of the one it asked for (R-LS-4).
func TestTrimFQDNDot_RLS4(t *testing.T) {
	for in, want := range map[string]string{"app.example.": "app.example", "app.example": "app.example", ".": ".", "": "", "a.": "a"} {
		if got := trimFQDNDot(in); got != want {
			t.Errorf("unexpected trimFQDNDot(%q); got %q; want %q", in, got, want)
		}
	}
}
