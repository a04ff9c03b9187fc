package registry

import (
	"encoding/json"
	"strings"
	"testing"
)

// fuzzEndpoints are the POST endpoints FuzzRegistryBodies_RREG7 sends bodies to,
// with the token allowed to call each.
var fuzzEndpoints = []struct{ path, token string }{
	{"/registry/heartbeat", workerToken},
	{"/registry/release", workerToken},
	{"/registry/deregister", workerToken},
	{"/registry/drain", operatorToken},
	{"/registry/undrain", operatorToken},
	{"/registry/wind-down", operatorToken},
	{"/registry/placement?", operatorToken}, // GET; the body is the query
}

// FuzzRegistryBodies_RREG7 posts a body to the worker and operator endpoints (to
// GET /registry/placement, it is the query) of a registry with one live session ("$SID" in a body stands for its id,
// "$CH"/"$CV" for a challenge pair its worker answers). Every reply is a
// JSON object; a refusal is a 4xx with a non-empty one-line "error"; a 400
// changes nothing in the store; a drain or wind-down deadline outside
// 0..604800 is refused; nothing answers 5xx (the store is in memory).
func FuzzRegistryBodies_RREG7(f *testing.F) {
	seeds := []struct {
		ep   uint8
		body string
	}{
		{0, `{"sessionId":"$SID","headroom":50,"draining":false,"challenge":"$CH","challengeValue":"$CV"}`},
		{0, `{"sessionId":"$SID","headroom":50,"draining":true,"challenge":"$CH","challengeValue":"$CV","acks":["0123456789abcdef"]}`},
		{0, `{"sessionId":"$SID","headroom":50,"draining":false,"challenge":"$CH","challengeValue":"$CV","acks":[null]}`},
		{0, `{"sessionId":"$SID","headroom":50,"draining":false,"challenge":"$CH","challengeValue":"$CV","SessionId":"zzz","HEADROOM":"x"}`},
		{1, `[{"sessionId":"$SID","namespace":"/counters","id":"x","epoch":"1"},{"sessionId":"$SID","namespace":"/counters","id":"y","epoch":"1"}]`},
		{1, `{"sessionId":"$SID","namespace":"/counters","id":"y"}`},
		{1, `[{"namespace":"/c","id":"z"}]`},
		{1, `[{"sessionId":"s","namespace":"/c","id":"z","epoch":7}]`},
		{1, `null`},
		{1, `"x"`},
		{2, `{"sessionId":"$SID"}`},
		{2, `{}`},
		{3, `{"clientId":"fuzz-client","deadline":30}`},
		{3, `{"clientId":"fuzz-client","deadline":-1}`},
		{3, `{"clientId":"fuzz-client","deadline":604801}`},
		{3, `{"clientId":"gone"}`},
		{4, `{"clientId":"fuzz-client"}`},
		{5, `{"namespace":"/counters","id":"x","deadline":30}`},
		{5, `{"namespace":"/counters","id":"x","deadline":null}`},
		{5, `{"namespace":"/counters","id":"x","deadline":"soon"}`},
		{5, `{"namespace":"/counters","id":"x","deadline":1e400}`},
		{5, `{"id":"alice","deadline":1}`},
		{6, `namespace=/counters&id=x`},
		{6, `namespace=/counters&id=bob`},
		{6, `namespace=/counters`},
		{6, `namespace=%2Fcounters&id=%00&id=x`},
	}
	for _, s := range seeds {
		f.Add(s.ep, s.body)
	}
	h := newHarness(f)
	ch, cv := h.fw.pair("fuzz")
	sid := ""
	f.Fuzz(func(t *testing.T, ep uint8, body string) {
		h.t = t
		if _, err := h.store.Session(t.Context(), sid, h.clock()); sid == "" || err != nil {
			sid = h.register(map[string]any{"clientId": "fuzz-client", "instances": map[string][]string{"/counters": {"x", "y", "z"}}})
		}
		e := fuzzEndpoints[int(ep)%len(fuzzEndpoints)]
		body = strings.NewReplacer("$SID", sid, "$CH", ch, "$CV", cv).Replace(body)
		before := h.snapshot()
		var res response
		if strings.HasSuffix(e.path, "?") {
			res = h.get(e.path+body, e.token)
		} else {
			res = h.post(e.path, e.token, body)
		}
		var reply map[string]any
		if err := json.Unmarshal([]byte(res.body), &reply); err != nil || reply == nil {
			t.Fatalf("unexpected reply to %s %q; got %d %q; want a JSON object", e.path, body, res.status, res.body)
		}
		switch {
		case res.status == 200:
			if d, ok := reply["drainDeadline"].(float64); ok && (d < 0 || d > maxDeadline) {
				t.Fatalf("unexpected drain deadline for %q; got %v", body, d)
			}
		case res.status >= 400 && res.status < 500:
			msg, _ := reply["error"].(string)
			if msg == "" || strings.ContainsAny(msg, "\r\n") {
				t.Fatalf("unexpected error reply to %s %q; got %d %q; want a one-line error", e.path, body, res.status, res.body)
			}
			if res.status == 400 {
				if after := h.snapshot(); after != before {
					t.Fatalf("unexpected change after a 400 to %s %q; got %s; want %s", e.path, body, after, before)
				}
			}
		default:
			t.Fatalf("unexpected reply to %s %q; got %d %s", e.path, body, res.status, res.body)
		}
	})
}

// snapshot renders the store's live sessions and the fuzz session's
// placements, to compare before and after a refused request.
func (h *harness) snapshot() string {
	ws, err := h.store.Workers(h.t.Context(), h.clock())
	if err != nil {
		h.t.Fatalf("cannot list workers: %v", err)
	}
	var b strings.Builder
	_ = json.NewEncoder(&b).Encode(ws)
	for _, id := range []string{"x", "y", "z"} {
		p, err := h.store.Placement(h.t.Context(), "/counters", id, h.clock())
		if err == nil {
			_ = json.NewEncoder(&b).Encode(p)
		}
	}
	return b.String()
}
