package registry

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/attest"
	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/internal/testlog"
)

// challengeServer answers GET /_pinned/challenge like a worker: the value
// registered for the challenge, 500 while failing, another value while
// lying.
type challengeServer struct {
	mu      sync.Mutex
	values  map[string]string
	failing bool
	lying   bool
}

func (c *challengeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failing {
		w.WriteHeader(500)
		return
	}
	v := c.values[r.URL.Query().Get("challenge")]
	if c.lying {
		v = "someone-else"
	}
	json.NewEncoder(w).Encode(map[string]string{"value": v})
}

func (c *challengeServer) set(f func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f()
}

// TestOneLogLinePerRegistryEvent: each registry event — register,
// re-register, degraded, recovered, voided (by a heartbeat's probe or by
// another process registering at the URL), drain (worker and operator),
// deregister, superseded — logs exactly one line naming the clientId, and the
// sessionId where there is one.
func TestOneLogLinePerRegistryEvent(t *testing.T) {
	cs := &challengeServer{values: map[string]string{}}
	srv := httptest.NewServer(cs)
	defer srv.Close()
	pp, err := attest.ParsePassport([]byte(`{"providers":[{"type":"staticToken","id":"p","keys":[{"name":"k","token":{"env":"T"},"scopes":["pinboard:worker","pinboard:operator"],"claims":{"pinboard":{"namespaces":["*"],"allowedBackendHosts":["*"]}}}]}]}`),
		func(string) (string, bool) { return "tok", true })
	if err != nil {
		t.Fatal(err)
	}
	var logs testlog.Buffer
	now := time.Now()
	reg, err := New(Options{
		Store:    directory.NewMemory(15*time.Second, now),
		Passport: pp,
		LeaseTTL: 15 * time.Second,
		Logger:   slog.New(slog.NewJSONHandler(&logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close(time.Second)

	n := 0
	call := func(path string, body any) map[string]any {
		t.Helper()
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod("POST")
		ctx.Request.SetRequestURI(path)
		ctx.Request.Header.Set("Authorization", "Bearer tok")
		b, _ := json.Marshal(body)
		ctx.Request.SetBody(b)
		reg.ServeHTTP(&ctx, []byte(path))
		var out map[string]any
		_ = json.Unmarshal(ctx.Response.Body(), &out)
		out["status"] = ctx.Response.StatusCode()
		return out
	}
	challenge := func() (string, string) {
		n++
		c, v := "c"+string(rune('a'+n)), "v"+string(rune('a'+n))
		cs.set(func() { cs.values[c] = v })
		return c, v
	}
	register := func(client, prev string, extra ...any) string {
		t.Helper()
		c, v := challenge()
		body := map[string]any{
			"clientId": client, "secret": "s-" + client, "namespaces": []string{"/counters"},
			"advertiseUrl": srv.URL, "headroom": 8, "draining": false,
			"challenge": c, "challengeValue": v, "prevSessionId": prev,
		}
		for i := 0; i+1 < len(extra); i += 2 {
			body[extra[i].(string)] = extra[i+1]
		}
		out := call("/registry/register", body)
		if out["status"] != 200 {
			t.Fatalf("unexpected register answer %v", out)
		}
		return out["sessionId"].(string)
	}
	beat := func(sid string, draining bool) map[string]any {
		c, v := challenge()
		return call("/registry/heartbeat", map[string]any{"sessionId": sid, "headroom": 8, "draining": draining, "challenge": c, "challengeValue": v})
	}

	s1 := register("client-1", "")
	cs.set(func() { cs.failing = true })
	beat(s1, false) // degraded
	beat(s1, false) // still degraded: no second line
	cs.set(func() { cs.failing = false })
	beat(s1, false) // recovered
	beat(s1, true)  // worker drains
	beat(s1, true)  // still draining: no second line
	beat(s1, false) // worker undrains
	call("/registry/drain", map[string]any{"clientId": "client-1", "deadline": 60})
	call("/registry/undrain", map[string]any{"clientId": "client-1"})
	s2 := register("client-1", s1) // re-register
	cs.set(func() { cs.lying = true })
	if out := beat(s2, false); out["status"] != 409 {
		t.Fatalf("unexpected heartbeat answer while lying; got %v; want 409 voided", out)
	}
	cs.set(func() { cs.lying = false })
	s3 := register("client-3", "")
	call("/registry/deregister", map[string]any{"sessionId": s3})
	// A higher epoch takes {hostname}{ns}: the older session's next
	// heartbeat is its superseded line (R-LS-4).
	blue := register("client-4", "", "hostname", "app.example", "env", "blue", "epoch", 1)
	register("client-5", "", "hostname", "app.example", "env", "green", "epoch", 2)
	if out := beat(blue, false); out["status"] != 409 || out["superseded"] != true {
		t.Fatalf("unexpected heartbeat answer of a superseded session; got %v; want 409 superseded", out)
	}
	// Another process at client-5's advertise URL: client-5's session is
	// void (R-LS-3), one line naming it.
	register("client-6", "")

	counts := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("unexpected log line %q: %v", line, err)
		}
		msg, _ := rec["msg"].(string)
		counts[msg]++
		if rec["clientId"] == nil || rec["clientId"] == "" {
			t.Errorf("unexpected %q line without clientId: %s", msg, line)
		}
		by, _ := rec["by"].(string)
		if by != "operator" && (rec["sessionId"] == nil || rec["sessionId"] == "") {
			t.Errorf("unexpected %q line without sessionId: %s", msg, line)
		}
	}
	for msg, want := range map[string]int{
		"register": 5, "re-register": 1, "degraded": 1, "recovered": 1, "voided": 1,
		"drain": 4, "deregister": 1, "superseded": 1, "voided: advertise URL registered by another process": 1,
	} {
		if counts[msg] != want {
			t.Errorf("unexpected number of %q lines; got %d; want %d\n%s", msg, counts[msg], want, logs.String())
		}
	}
}

// newTextLogHarness is a harness whose registry logs in the text format
// `make run` uses, to logs (read it once the registry's calls returned).
func newTextLogHarness(t *testing.T) (*harness, *testlog.Buffer) {
	t.Helper()
	h := newHarness(t)
	logs := &testlog.Buffer{}
	h.r = h.registryWith(Options{
		ProbeTimeout: time.Second, Workers: 4, Queue: 16,
		Logger: slog.New(slog.NewTextHandler(logs, nil)),
	})
	return h, logs
}

// TestOperatorDrainLogsDeadlineSeconds: the operator drain line's deadline
// reads as seconds in the text format `make run` logs, not as the address
// of the reply's *float64 (`deadline=0xc000…`); undrain logs none.
func TestOperatorDrainLogsDeadlineSeconds_RREG6(t *testing.T) {
	h, logs := newTextLogHarness(t)
	h.register(map[string]any{"clientId": "drain-me"})
	h.post("/registry/drain", operatorToken, `{"clientId":"drain-me","deadline":300}`)
	h.post("/registry/undrain", operatorToken, `{"clientId":"drain-me"}`)

	var drains []string
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if strings.Contains(line, "msg=drain") {
			drains = append(drains, line)
		}
	}
	if len(drains) != 2 || !strings.HasSuffix(drains[0], " deadline=300") || !strings.HasSuffix(drains[1], " deadline=<nil>") {
		t.Fatalf("unexpected drain lines; got %q; want deadline=300, then deadline=<nil>", drains)
	}
}

// The superseded lines name the epoch as the 409 body and the workers
// listing write it (a JavaScript number: 1700000000223456789 reads
// 1700000000223456800), not as the double's exact integer, which no other
// place shows (R-LS-4).
func TestSupersededLogEpochAsInBody_RLS4(t *testing.T) {
	h, logs := newTextLogHarness(t)
	old := h.register(map[string]any{"hostname": "app.example", "env": "blue", "epoch": 1_700_000_000_123_456_789,
		"advertiseUrl": h.fw.srv.URL + "/old"})
	h.register(map[string]any{"hostname": "app.example", "env": "green", "epoch": 1_700_000_000_223_456_789,
		"advertiseUrl": h.fw.srv.URL + "/new"})
	if res := h.post("/registry/heartbeat", workerToken, h.beatBody(old, nil)); res.status != 409 {
		t.Fatalf("unexpected heartbeat answer; got %d %s; want 409", res.status, res.body)
	}
	c, v := h.fw.pair("late")
	late := mustJSON(t, map[string]any{"clientId": "client-late", "secret": h.fw.secret, "namespaces": []string{"/counters"},
		"advertiseUrl": h.fw.srv.URL + "/late", "headroom": 100, "draining": false, "challenge": c, "challengeValue": v,
		"hostname": "app.example", "env": "blue", "epoch": 1_700_000_000_123_456_789})
	if res := h.post("/registry/register", workerToken, late); res.status != 409 {
		t.Fatalf("unexpected answer to a lower epoch; got %d %s; want 409", res.status, res.body)
	}
	var lines []string
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if strings.Contains(line, "superseded") {
			lines = append(lines, line)
		}
	}
	if len(lines) != 2 || !strings.Contains(lines[0], " epoch=1700000000223456800") || !strings.Contains(lines[1], " epoch=1700000000123456800") {
		t.Fatalf("unexpected superseded lines; got %q; want the heartbeat's naming epoch 1700000000223456800, the register's 1700000000123456800", lines)
	}
}
