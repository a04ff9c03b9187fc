package registry

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"
)

// pinned 0.16.0 requires httpx>=0.27, not 0.28: before 0.28 httpx's json=
// was json.dumps(body) with Python's defaults, so a worker running httpx
// 0.27 sends every registry body with ", " and ": " separators and every
// character past ASCII as a \u escape (a surrogate pair past the BMP).
// The whole cycle a worker drives — register (namespaces and instances),
// heartbeat with acks, release, deregister — is read as the compact form
// httpx 0.28 sends (R-REG-1, R-REG-2, R-REG-3).
func TestWorkerCycleInHTTPX027Encoding_RREG1_RREG2_RREG3(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		const cafe, smile = "/caf\u00e9", "/\U0001F600"
		c, v := h.fw.pair("httpx027")
		// json.dumps({...}) as httpx 0.27 calls it: ensure_ascii=True,
		// separators (", ", ": ").
		body := fmt.Sprintf(`{"clientId": "c027", "secret": %q, "namespaces": ["/caf\u00e9", "/\ud83d\ude00"], `+
			`"advertiseUrl": %q, "headroom": 1024, "draining": false, "challenge": %q, "challengeValue": %q, `+
			`"instances": {"/caf\u00e9": ["alice", "bob"]}}`, h.fw.secret, h.fw.srv.URL, c, v)
		res := h.post("/registry/register", workerToken, body)
		if res.status != 200 {
			t.Fatalf("unexpected register reply; got %d %s", res.status, res.body)
		}
		var ack struct {
			SessionID   string `json:"sessionId"`
			ExpiresInMs int64  `json:"expiresInMs"`
		}
		if err := json.Unmarshal([]byte(res.body), &ack); err != nil || ack.SessionID == "" || ack.ExpiresInMs != testTTL.Milliseconds() {
			t.Fatalf("unexpected register ack; got %s", res.body)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		p, err := h.ds.Placement(ctx, cafe, "alice", h.clock())
		if err != nil || p.SessionID != ack.SessionID {
			t.Fatalf("unexpected placement of %s/alice; got %+v, %v; want session %s", cafe, p, err, ack.SessionID)
		}
		info, err := h.ds.Session(ctx, ack.SessionID, h.clock())
		if err != nil || len(info.Namespaces) != 2 || info.Namespaces[0] != cafe || info.Namespaces[1] != smile {
			t.Fatalf("unexpected session namespaces; got %+v, %v; want [%s %s]", info, err, cafe, smile)
		}
		hc, hv := h.fw.pair("httpx027-beat")
		res = h.post("/registry/heartbeat", workerToken, fmt.Sprintf(
			`{"sessionId": %q, "headroom": 1000, "draining": false, "challenge": %q, "challengeValue": %q, "acks": ["0f1e2d3c4b5a6978"]}`,
			ack.SessionID, hc, hv))
		if want := fmt.Sprintf(`{"expiresInMs":%d,"draining":false}`, testTTL.Milliseconds()); res.status != 200 || res.body != want {
			t.Fatalf("unexpected heartbeat reply; got %d %s; want 200 %s", res.status, res.body, want)
		}
		res = h.post("/registry/release", workerToken, fmt.Sprintf(
			`[{"sessionId": %q, "namespace": "/caf\u00e9", "id": "alice", "epoch": %q}]`,
			ack.SessionID, strconv.FormatUint(p.Epoch, 10)))
		if res.status != 200 || res.body != `{"released":1}` {
			t.Fatalf("unexpected release reply; got %d %s; want 200 {\"released\":1}", res.status, res.body)
		}
		res = h.post("/registry/deregister", workerToken, fmt.Sprintf(`{"sessionId": %q}`, ack.SessionID))
		if res.status != 200 {
			t.Fatalf("unexpected deregister reply; got %d %s", res.status, res.body)
		}
		if _, err := h.ds.Placement(ctx, cafe, "bob", h.clock()); err == nil {
			t.Fatalf("unexpected placement of %s/bob after the deregister", cafe)
		}
	})
}
