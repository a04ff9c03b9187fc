package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/attest"
	"github.com/pinboard-go/pinboard/directory"
)

// Every error row of the heartbeat reference (003_d935a1d8ec89be7a.txt),
// status and body byte for byte (R-REG-2).
func TestHeartbeatErrorRows_RREG2(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		session := h.register(nil)
		// The limit is R-REG-7's 1 MiB, not whatever MaxBody says: one byte
		// past it is refused, a body of exactly 1 MiB (a heartbeat padded with
		// white space) is read.
		const limit = 1 << 20
		big := h.beatBody(session, nil)
		atLimit := big + strings.Repeat(" ", limit-len(big))
		big = atLimit + " "
		cases := []struct {
			name   string
			token  string
			body   string
			status int
			want   string
		}{
			{"no credential", "", h.beatBody(session, nil), 401, `{"error":"unauthorized"}`},
			{"unknown token", "nope", h.beatBody(session, nil), 401, `{"error":"unauthorized"}`},
			{"missing scope", operatorToken, h.beatBody(session, nil), 403, `{"error":"forbidden"}`},
			{"other account", otherToken, h.beatBody(session, nil), 403, `{"error":"forbidden"}`},
			{"claims no longer cover", narrowToken, h.beatBody(session, nil), 403, `{"error":"forbidden"}`},
			{"body too large", workerToken, big, 413, `{"error":"body too large"}`},
			{"body at the limit", workerToken, atLimit, 200, `{"expiresInMs":15000,"draining":false}`},
			{"invalid json", workerToken, `{"sessionId":`, 400, `{"error":"invalid json"}`},
			{"schema: missing challenge", workerToken, `{"sessionId":"x","headroom":1,"draining":false,"challengeValue":"v"}`, 400, `{"error":"expected { sessionId, headroom, draining, challenge, challengeValue, acks? }"}`},
			{"schema: headroom string", workerToken, `{"sessionId":"x","headroom":"1","draining":false,"challenge":"c","challengeValue":"v"}`, 400, `{"error":"expected { sessionId, headroom, draining, challenge, challengeValue, acks? }"}`},
			{"schema: draining null", workerToken, `{"sessionId":"x","headroom":1,"draining":null,"challenge":"c","challengeValue":"v"}`, 400, `{"error":"expected { sessionId, headroom, draining, challenge, challengeValue, acks? }"}`},
			{"schema: acks not strings", workerToken, `{"sessionId":"x","headroom":1,"draining":false,"challenge":"c","challengeValue":"v","acks":[1]}`, 400, `{"error":"expected { sessionId, headroom, draining, challenge, challengeValue, acks? }"}`},
			{"schema: key in another case", workerToken, `{"SESSIONID":"x","headroom":1,"draining":false,"challenge":"c","challengeValue":"v"}`, 400, `{"error":"expected { sessionId, headroom, draining, challenge, challengeValue, acks? }"}`},
			{"schema: acks with null", workerToken, `{"sessionId":"x","headroom":1,"draining":false,"challenge":"c","challengeValue":"v","acks":[null]}`, 400, `{"error":"expected { sessionId, headroom, draining, challenge, challengeValue, acks? }"}`},
			{"schema: array", workerToken, `[]`, 400, `{"error":"expected { sessionId, headroom, draining, challenge, challengeValue, acks? }"}`},
			// Each field's row: absent, and of another type (the table's
			// Type column); acks is optional, but when sent it is string[].
			{"schema: missing sessionId", workerToken, `{"headroom":1,"draining":false,"challenge":"c","challengeValue":"v"}`, 400, `{"error":"expected { sessionId, headroom, draining, challenge, challengeValue, acks? }"}`},
			{"schema: missing headroom", workerToken, `{"sessionId":"x","draining":false,"challenge":"c","challengeValue":"v"}`, 400, `{"error":"expected { sessionId, headroom, draining, challenge, challengeValue, acks? }"}`},
			{"schema: missing draining", workerToken, `{"sessionId":"x","headroom":1,"challenge":"c","challengeValue":"v"}`, 400, `{"error":"expected { sessionId, headroom, draining, challenge, challengeValue, acks? }"}`},
			{"schema: missing challengeValue", workerToken, `{"sessionId":"x","headroom":1,"draining":false,"challenge":"c"}`, 400, `{"error":"expected { sessionId, headroom, draining, challenge, challengeValue, acks? }"}`},
			{"schema: sessionId number", workerToken, `{"sessionId":1,"headroom":1,"draining":false,"challenge":"c","challengeValue":"v"}`, 400, `{"error":"expected { sessionId, headroom, draining, challenge, challengeValue, acks? }"}`},
			{"schema: sessionId null", workerToken, `{"sessionId":null,"headroom":1,"draining":false,"challenge":"c","challengeValue":"v"}`, 400, `{"error":"expected { sessionId, headroom, draining, challenge, challengeValue, acks? }"}`},
			{"schema: headroom null", workerToken, `{"sessionId":"x","headroom":null,"draining":false,"challenge":"c","challengeValue":"v"}`, 400, `{"error":"expected { sessionId, headroom, draining, challenge, challengeValue, acks? }"}`},
			{"schema: draining string", workerToken, `{"sessionId":"x","headroom":1,"draining":"false","challenge":"c","challengeValue":"v"}`, 400, `{"error":"expected { sessionId, headroom, draining, challenge, challengeValue, acks? }"}`},
			{"schema: draining number", workerToken, `{"sessionId":"x","headroom":1,"draining":0,"challenge":"c","challengeValue":"v"}`, 400, `{"error":"expected { sessionId, headroom, draining, challenge, challengeValue, acks? }"}`},
			{"schema: challenge number", workerToken, `{"sessionId":"x","headroom":1,"draining":false,"challenge":1,"challengeValue":"v"}`, 400, `{"error":"expected { sessionId, headroom, draining, challenge, challengeValue, acks? }"}`},
			{"schema: challengeValue object", workerToken, `{"sessionId":"x","headroom":1,"draining":false,"challenge":"c","challengeValue":{}}`, 400, `{"error":"expected { sessionId, headroom, draining, challenge, challengeValue, acks? }"}`},
			{"schema: acks string", workerToken, `{"sessionId":"x","headroom":1,"draining":false,"challenge":"c","challengeValue":"v","acks":"0123456789abcdef"}`, 400, `{"error":"expected { sessionId, headroom, draining, challenge, challengeValue, acks? }"}`},
			{"schema: acks object", workerToken, `{"sessionId":"x","headroom":1,"draining":false,"challenge":"c","challengeValue":"v","acks":{}}`, 400, `{"error":"expected { sessionId, headroom, draining, challenge, challengeValue, acks? }"}`},
			{"schema: null", workerToken, `null`, 400, `{"error":"expected { sessionId, headroom, draining, challenge, challengeValue, acks? }"}`},
			{"schema: string", workerToken, `"x"`, 400, `{"error":"expected { sessionId, headroom, draining, challenge, challengeValue, acks? }"}`},
			{"schema: empty object", workerToken, `{}`, 400, `{"error":"expected { sessionId, headroom, draining, challenge, challengeValue, acks? }"}`},
			// challenge and challengeValue are tokens as at register: 1 to 512
			// bytes (an empty challenge probes nothing; a long one would
			// ride in every probe's request line).
			{"schema: empty challenge", workerToken, `{"sessionId":"x","headroom":1,"draining":false,"challenge":"","challengeValue":"v"}`, 400, `{"error":"expected { sessionId, headroom, draining, challenge, challengeValue, acks? }"}`},
			{"schema: empty challengeValue", workerToken, `{"sessionId":"x","headroom":1,"draining":false,"challenge":"c","challengeValue":""}`, 400, `{"error":"expected { sessionId, headroom, draining, challenge, challengeValue, acks? }"}`},
			{"schema: challenge too long", workerToken, `{"sessionId":"x","headroom":1,"draining":false,"challenge":"` + strings.Repeat("c", 513) + `","challengeValue":"v"}`, 400, `{"error":"expected { sessionId, headroom, draining, challenge, challengeValue, acks? }"}`},
			{"schema: challengeValue too long", workerToken, `{"sessionId":"x","headroom":1,"draining":false,"challenge":"c","challengeValue":"` + strings.Repeat("v", 513) + `"}`, 400, `{"error":"expected { sessionId, headroom, draining, challenge, challengeValue, acks? }"}`},
			{"unknown session", workerToken, h.beatBody("no-such-session", nil), 409, `{"error":"unknown session","reregister":true}`},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				res := h.post("/registry/heartbeat", tc.token, tc.body)
				if res.status != tc.status || res.body != tc.want {
					t.Fatalf("unexpected reply; got %d %s; want %d %s", res.status, res.body, tc.status, tc.want)
				}
				if ct := string(res.header.ContentType()); ct != "application/json" {
					t.Fatalf("unexpected Content-Type %q; want application/json", ct)
				}
			})
		}
	})
}

// acks is string[] (003_d935a1d8ec89be7a.txt): an empty string is a
// string, acking nothing; only a non-string element, null included, is
// the schema failure (R-REG-2).
func TestHeartbeatEmptyStringAck_RREG2(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		session := h.register(nil)
		res := h.post("/registry/heartbeat", workerToken, h.beatBody(session, map[string]any{"acks": []string{"", "0123456789abcdef"}}))
		if res.status != 200 || res.body != `{"expiresInMs":15000,"draining":false}` {
			t.Fatalf("unexpected reply; got %d %s; want 200", res.status, res.body)
		}
		// [null] and null alike are no string[]; before, encoding/json
		// read "acks": null as no acks and the heartbeat renewed.
		for _, acks := range []any{[]any{"0123456789abcdef", nil}, nil} {
			res = h.post("/registry/heartbeat", workerToken, h.beatBody(session, map[string]any{"acks": acks}))
			if want := `{"error":"expected { sessionId, headroom, draining, challenge, challengeValue, acks? }"}`; res.status != 400 || res.body != want {
				t.Fatalf("unexpected reply to acks %v; got %d %s; want 400 %s", acks, res.status, res.body, want)
			}
		}
		// Of a key given twice the last counts, as JSON.parse keeps it: a
		// null then a string[] is a string[], and the other way round not.
		for _, tc := range []struct {
			twice  string
			status int
		}{{`"acks":null,"acks":[""]`, 200}, {`"acks":[""],"acks":null`, 400}} {
			body := strings.Replace(h.beatBody(session, map[string]any{"acks": nil}), `"acks":null`, tc.twice, 1)
			if res = h.post("/registry/heartbeat", workerToken, body); res.status != tc.status {
				t.Fatalf("unexpected reply to %s; got %d %s; want %d", tc.twice, res.status, res.body, tc.status)
			}
		}
	})
}

// A frozen worker waking past its lease gets 409 unknown session (R-LS-2).
func TestHeartbeatPastLease_RLS2(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		session := h.register(nil)
		h.advance(testTTL)
		res := h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil))
		if res.status != 409 || res.body != `{"error":"unknown session","reregister":true}` {
			t.Fatalf("unexpected reply; got %d %s", res.status, res.body)
		}
	})
}

// The node-not-serving row: 503 with Retry-After (1 s: a stopping node's
// peers serve the retry) (R-REG-2).
func TestHeartbeatNotServing_RREG2(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		session := h.register(nil)
		h.r.Stop()
		res := h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil))
		if res.status != 503 || res.body != `{"error":"not the serving fleet"}` || string(res.header.Peek("Retry-After")) != "1" {
			t.Fatalf("unexpected reply; got %d %s retry-after=%q", res.status, res.body, res.header.Peek("Retry-After"))
		}
		if ct := string(res.header.ContentType()); ct != "application/json" {
			t.Fatalf("unexpected Content-Type %q; want application/json", ct)
		}
		// Credentials come first, as in the table: a bad token hears 401 and
		// a missing scope 403 from a stopping node too.
		if res := h.post("/registry/heartbeat", "wrong", h.beatBody(session, nil)); res.status != 401 || res.body != `{"error":"unauthorized"}` {
			t.Fatalf("unexpected reply to a bad token; got %d %s; want 401", res.status, res.body)
		}
		if res := h.post("/registry/heartbeat", operatorToken, h.beatBody(session, nil)); res.status != 403 || res.body != `{"error":"forbidden"}` {
			t.Fatalf("unexpected reply without the worker scope; got %d %s; want 403", res.status, res.body)
		}
	})
}

// Bodies carrying names are written like the reference's JSON.stringify:
// "&", "<" and ">" as they are (R-REG-2, byte for byte).
func TestErrorBodiesNotHTMLEscaped_RREG2(t *testing.T) {
	e := &directory.SupersededError{Hostname: "a&b.example", NS: "/c<1>", Env: "blue&green", Epoch: 3}
	want := `{"error":"registration superseded: a&b.example/c<1> now bound to env blue&green at epoch 3","superseded":true}`
	if got := string(supersededBody(e)); got != want {
		t.Fatalf("unexpected body; got %s; want %s", got, want)
	}
	if got := string(errorBody(`forbidden: env "a&b"`)); got != `{"error":"forbidden: env \"a&b\""}` {
		t.Fatalf("unexpected body; got %s", got)
	}
}

// U+2028 and U+2029 are written as they are, as JSON.stringify writes
// them; encoding/json escapes both always. A literal backslash before
// "u2028" stays escaped (R-REG-2, byte for byte).
func TestErrorBodiesLineSeparatorsAsIs_RREG2(t *testing.T) {
	e := &directory.SupersededError{Hostname: "app\u2028.example", NS: "/c\u2029", Env: "blue\u2028green\\u2029", Epoch: 3}
	want := "{\"error\":\"registration superseded: app\u2028.example/c\u2029 now bound to env blue\u2028green\\\\u2029 at epoch 3\",\"superseded\":true}"
	if got := string(supersededBody(e)); got != want {
		t.Fatalf("unexpected body; got %s; want %s", got, want)
	}
}

// Probe answering a different value: voided, records dropped (the
// session and its placements), 409 with reregister; the next heartbeat
// finds the session unknown (R-LS-3).
func TestHeartbeatVoided_RLS3(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		session := h.register(map[string]any{"instances": map[string][]string{"/counters": {"alice"}}})
		if p, err := h.ds.Placement(t.Context(), "/counters", "alice", h.clock()); err != nil || p.SessionID != session {
			t.Fatalf("cannot reclaim alice; got %+v, %v", p, err)
		}
		h.fw.mode.Store("mismatch")
		res := h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil))
		want := `{"error":"registration voided: challenge value mismatch on the advertise URL","reregister":true}`
		if res.status != 409 || res.body != want {
			t.Fatalf("unexpected reply; got %d %s; want 409 %s", res.status, res.body, want)
		}
		if ct := string(res.header.ContentType()); ct != "application/json" {
			t.Fatalf("unexpected Content-Type %q; want application/json", ct)
		}
		h.fw.mode.Store("ok")
		res = h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil))
		if res.status != 409 || res.body != `{"error":"unknown session","reregister":true}` {
			t.Fatalf("unexpected reply after void; got %d %s; want 409 unknown session", res.status, res.body)
		}
		if _, err := h.ds.Session(t.Context(), session, h.clock()); !errors.Is(err, directory.ErrUnknownSession) {
			t.Fatalf("unexpected session after void; got %v; want ErrUnknownSession", err)
		}
		if p, err := h.ds.Placement(t.Context(), "/counters", "alice", h.clock()); err == nil {
			t.Fatalf("unexpected placement left by a voided session; got %+v", p)
		}
	})
}

// Unreachable (a closed listener), non-2xx (404, 500), or no body
// received (no value, not JSON, a body cut short): lease renewed, degraded,
// degraded:true in the ack; the next good probe clears it (R-LS-3) —
// checked after the answers that can turn good again (a closed listener
// stays closed).
func TestHeartbeatDegraded_RLS3(t *testing.T) {
	for _, mode := range []string{"404", "500", "nobody", "notjson", "truncated", "down"} {
		t.Run(mode, func(t *testing.T) {
			forEachStore(t, func(t *testing.T, h *harness) {
				session := h.register(nil)
				if mode == "down" {
					h.fw.srv.Close()
				} else {
					h.fw.mode.Store(mode)
				}
				h.advance(10 * time.Second)
				res := h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil))
				if res.status != 200 || res.body != `{"expiresInMs":15000,"draining":false,"degraded":true}` {
					t.Fatalf("unexpected ack; got %d %s", res.status, res.body)
				}
				// Lease renewed, degradedSince the first failing probe,
				// kept by a second failing one.
				failed := h.clock()
				info, err := h.ds.Session(t.Context(), session, h.clock())
				if err != nil || !info.Degraded || !info.DegradedSince.Equal(failed) || !info.LeaseUntil.Equal(failed.Add(testTTL)) {
					t.Fatalf("unexpected session; got %+v, %v; want degraded since %v, lease until %v", info, err, failed, failed.Add(testTTL))
				}
				h.advance(3 * time.Second)
				res = h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil))
				if res.status != 200 || res.body != `{"expiresInMs":15000,"draining":false,"degraded":true}` {
					t.Fatalf("unexpected second degraded ack; got %d %s", res.status, res.body)
				}
				if info, err := h.ds.Session(t.Context(), session, h.clock()); err != nil || !info.DegradedSince.Equal(failed) {
					t.Fatalf("unexpected session after a second failing probe; got %+v, %v; want degraded since %v", info, err, failed)
				}
				if mode == "down" {
					return
				}
				h.fw.mode.Store("ok")
				res = h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil))
				if res.status != 200 || res.body != `{"expiresInMs":15000,"draining":false}` {
					t.Fatalf("unexpected ack after recovery; got %d %s", res.status, res.body)
				}
				if info, err := h.ds.Session(t.Context(), session, h.clock()); err != nil || info.Degraded || !info.DegradedSince.IsZero() {
					t.Fatalf("unexpected session after recovery; got %+v, %v; want degraded cleared", info, err)
				}
			})
		})
	}
}

// A good heartbeat renews the lease by the TTL and replaces headroom and
// the own drain flag (R-LS-1, R-PL-3).
func TestHeartbeatRenews_RLS1(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		session := h.register(nil)
		h.advance(12 * time.Second)
		res := h.post("/registry/heartbeat", workerToken, h.beatBody(session, map[string]any{"headroom": 7, "draining": true}))
		if res.status != 200 || res.body != `{"expiresInMs":15000,"draining":true}` {
			t.Fatalf("unexpected ack; got %d %s", res.status, res.body)
		}
		info, _ := h.ds.Session(t.Context(), session, h.clock())
		if info.Headroom != 7 || !info.Draining || !info.LeaseUntil.Equal(h.clock().Add(testTTL)) {
			t.Fatalf("unexpected session state; got %+v", info)
		}
	})
}

// Control messages: delivered on every heartbeat until acked, deadline in
// seconds computed at delivery, 0 once passed, null revokes (R-CM-1).
func TestHeartbeatControlMessages_RCM1(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		session := h.register(map[string]any{"instances": map[string][]string{"/counters": {"alice"}}})
		res := h.post("/registry/wind-down", operatorToken, `{"namespace":"/counters","id":"alice","deadline":30}`)
		if res.status != 200 {
			t.Fatalf("cannot wind down; got %d %s", res.status, res.body)
		}
		var wd struct{ MsgID, SessionID string }
		_ = json.Unmarshal([]byte(res.body), &wd)
		if wd.SessionID != session || !msgIDPattern.MatchString(wd.MsgID) {
			t.Fatalf("unexpected wind-down reply %s", res.body)
		}
		h.advance(600 * time.Millisecond)
		res = h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil))
		want := `{"expiresInMs":15000,"draining":false,"messages":[{"msgId":"` + wd.MsgID + `","type":"wind_down","ns":"/counters","id":"alice","deadline":29.4}]}`
		if res.status != 200 || res.body != want {
			t.Fatalf("unexpected ack; got %d %s; want %s", res.status, res.body, want)
		}
		// Unacked: re-delivered on every heartbeat, the deadline recomputed.
		h.advance(10 * time.Second)
		res = h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil))
		if want := strings.Replace(want, `"deadline":29.4`, `"deadline":19.4`, 1); res.status != 200 || res.body != want {
			t.Fatalf("unexpected redelivery; got %d %s; want %s", res.status, res.body, want)
		}
		for range 3 {
			h.advance(10 * time.Second)
			res = h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil))
		}
		if want := strings.Replace(want, `"deadline":29.4`, `"deadline":0`, 1); res.status != 200 || res.body != want {
			t.Fatalf("unexpected redelivery past the deadline; got %d %s; want %s", res.status, res.body, want)
		}
		res = h.post("/registry/wind-down", operatorToken, `{"namespace":"/counters","id":"alice","deadline":null}`)
		var revoke struct{ MsgID string }
		_ = json.Unmarshal([]byte(res.body), &revoke)
		res = h.post("/registry/heartbeat", workerToken, h.beatBody(session, map[string]any{"acks": []string{wd.MsgID}}))
		want = `{"expiresInMs":15000,"draining":false,"messages":[{"msgId":"` + revoke.MsgID + `","type":"wind_down","ns":"/counters","id":"alice","deadline":null}]}`
		if res.body != want {
			t.Fatalf("unexpected ack after acking the first message; got %s; want %s", res.body, want)
		}
		res = h.post("/registry/heartbeat", workerToken, h.beatBody(session, map[string]any{"acks": []string{revoke.MsgID}}))
		if res.body != `{"expiresInMs":15000,"draining":false}` {
			t.Fatalf("unexpected ack after acking everything; got %s", res.body)
		}
	})
}

// msgIDPattern is a control message's msgId: 16 hex characters (R-CM-1).
var msgIDPattern = regexp.MustCompile(`^[0-9a-f]{16}$`)

// Timed operator drain: draining in the ack, drainDeadline counting down,
// 0 once passed; the lease stops at deadline plus one lease (R-LS-5).
func TestHeartbeatTimedDrain_RLS5(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		session := h.register(nil)
		info, _ := h.ds.Session(t.Context(), session, h.clock())
		res := h.post("/registry/drain", operatorToken, `{"clientId":"`+info.ClientID+`","deadline":20}`)
		if res.status != 200 || res.body != `{"clientId":"`+info.ClientID+`","draining":true,"drainDeadline":20}` {
			t.Fatalf("unexpected drain reply; got %d %s", res.status, res.body)
		}
		h.advance(5 * time.Second)
		res = h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil))
		if res.body != `{"expiresInMs":15000,"draining":true,"drainDeadline":15}` {
			t.Fatalf("unexpected ack; got %s", res.body)
		}
		h.advance(10 * time.Second)
		res = h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil))
		// deadline at +20s, lease capped at +35s: 20s left from +15s.
		if res.body != `{"expiresInMs":15000,"draining":true,"drainDeadline":5}` {
			t.Fatalf("unexpected ack; got %s", res.body)
		}
		h.advance(10 * time.Second)
		res = h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil))
		if res.body != `{"expiresInMs":10000,"draining":true,"drainDeadline":0}` {
			t.Fatalf("unexpected ack past the deadline; got %s; want the lease capped at deadline+lease", res.body)
		}
		// At the cap the lease has lapsed: the worker hears the 409 that
		// sends it to register again (R-LS-2).
		h.advance(10 * time.Second)
		res = h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil))
		if res.status != 409 || res.body != `{"error":"unknown session","reregister":true}` {
			t.Fatalf("unexpected reply at the drain deadline plus one lease; got %d %s; want 409 unknown session", res.status, res.body)
		}
	})
}

// An untimed operator drain on the clientId: the ack's draining is true
// whatever the worker's own flag, with no drainDeadline (it is only sent
// under a timed drain); undrain gives the worker's own flag back
// (R-REG-2 response table, R-REG-6).
func TestHeartbeatOperatorDrainInAck_RREG2_RREG6(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		session := h.register(map[string]any{"clientId": "drained"})
		if res := h.post("/registry/drain", operatorToken, `{"clientId":"drained"}`); res.status != 200 {
			t.Fatalf("cannot drain; got %d %s", res.status, res.body)
		}
		res := h.post("/registry/heartbeat", workerToken, h.beatBody(session, map[string]any{"draining": false}))
		if res.status != 200 || res.body != `{"expiresInMs":15000,"draining":true}` {
			t.Fatalf("unexpected ack under an operator drain; got %d %s", res.status, res.body)
		}
		if res := h.post("/registry/undrain", operatorToken, `{"clientId":"drained"}`); res.status != 200 {
			t.Fatalf("cannot undrain; got %d %s", res.status, res.body)
		}
		res = h.post("/registry/heartbeat", workerToken, h.beatBody(session, map[string]any{"draining": false}))
		if res.status != 200 || res.body != `{"expiresInMs":15000,"draining":false}` {
			t.Fatalf("unexpected ack after undrain; got %d %s", res.status, res.body)
		}
		res = h.post("/registry/heartbeat", workerToken, h.beatBody(session, map[string]any{"draining": true}))
		if res.status != 200 || res.body != `{"expiresInMs":15000,"draining":true}` {
			t.Fatalf("unexpected ack with the worker's own drain; got %d %s", res.status, res.body)
		}
	})
}

// Every optional field of the ack at once, in the reference's order:
// expiresInMs, draining, drainDeadline, degraded, messages (R-REG-2,
// R-LS-3, R-LS-5, R-CM-1).
func TestHeartbeatAckAllFields_RREG2(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		session := h.register(map[string]any{"clientId": "all", "instances": map[string][]string{"/counters": {"alice"}}})
		res := h.post("/registry/wind-down", operatorToken, `{"namespace":"/counters","id":"alice","deadline":30}`)
		var wd struct{ MsgID string }
		if res.status != 200 || json.Unmarshal([]byte(res.body), &wd) != nil {
			t.Fatalf("cannot wind down; got %d %s", res.status, res.body)
		}
		if res := h.post("/registry/drain", operatorToken, `{"clientId":"all","deadline":60}`); res.status != 200 {
			t.Fatalf("cannot drain; got %d %s", res.status, res.body)
		}
		h.advance(1500 * time.Millisecond)
		h.fw.mode.Store("500")
		res = h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil))
		want := `{"expiresInMs":15000,"draining":true,"drainDeadline":58.5,"degraded":true,"messages":[{"msgId":"` + wd.MsgID +
			`","type":"wind_down","ns":"/counters","id":"alice","deadline":28.5}]}`
		if res.status != 200 || res.body != want {
			t.Fatalf("unexpected ack; got %d %s; want 200 %s", res.status, res.body, want)
		}
	})
}

// Only the listed msgIds are trimmed: a worker acking a later message but
// not an earlier one (its callback failed there) gets the earlier one
// again, in queue order; an unknown msgId in acks is ignored (R-CM-1).
func TestHeartbeatAcksTrimOnlyListed_RCM1(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		session := h.register(map[string]any{"instances": map[string][]string{"/counters": {"a", "b", "c"}}})
		ids := map[string]string{}
		for _, id := range []string{"a", "b", "c"} {
			res := h.post("/registry/wind-down", operatorToken, `{"namespace":"/counters","id":"`+id+`","deadline":null}`)
			var wd struct{ MsgID string }
			if res.status != 200 || json.Unmarshal([]byte(res.body), &wd) != nil || !msgIDPattern.MatchString(wd.MsgID) {
				t.Fatalf("cannot wind down %s; got %d %s", id, res.status, res.body)
			}
			ids[id] = wd.MsgID
		}
		msg := func(id string) string {
			return `{"msgId":"` + ids[id] + `","type":"wind_down","ns":"/counters","id":"` + id + `","deadline":null}`
		}
		res := h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil))
		if want := `{"expiresInMs":15000,"draining":false,"messages":[` + msg("a") + `,` + msg("b") + `,` + msg("c") + `]}`; res.status != 200 || res.body != want {
			t.Fatalf("unexpected ack; got %d %s; want %s", res.status, res.body, want)
		}
		res = h.post("/registry/heartbeat", workerToken, h.beatBody(session, map[string]any{"acks": []string{ids["b"], "ffffffffffffffff"}}))
		if want := `{"expiresInMs":15000,"draining":false,"messages":[` + msg("a") + `,` + msg("c") + `]}`; res.status != 200 || res.body != want {
			t.Fatalf("unexpected ack after acking b; got %d %s; want %s", res.status, res.body, want)
		}
		res = h.post("/registry/heartbeat", workerToken, h.beatBody(session, map[string]any{"acks": []string{ids["a"], ids["b"], ids["c"]}}))
		if res.status != 200 || res.body != `{"expiresInMs":15000,"draining":false}` {
			t.Fatalf("unexpected ack after acking everything; got %d %s", res.status, res.body)
		}
	})
}

// Degraded (R-LS-3): existing placements keep routing, no new placements
// until a probe passes again; the ack said degraded:true meanwhile.
func TestHeartbeatDegradedKeepsRoutesTakesNoNew_RLS3(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		session := h.register(map[string]any{"instances": map[string][]string{"/counters": {"alice"}}})
		// The first placement attempt starts the cold-start quarantine
		// (R-CS-1); wait it out with the lease kept.
		_, _ = h.ds.Place(t.Context(), &directory.PlaceRequest{NS: "/counters", ID: "warm", Now: h.clock()})
		h.advance(10 * time.Second)
		if res := h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil)); res.status != 200 {
			t.Fatalf("unexpected reply; got %d %s", res.status, res.body)
		}
		h.advance(10 * time.Second)
		h.fw.mode.Store("404")
		if res := h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil)); res.status != 200 || res.body != `{"expiresInMs":15000,"draining":false,"degraded":true}` {
			t.Fatalf("unexpected ack; got %d %s", res.status, res.body)
		}
		r, err := h.ds.Place(t.Context(), &directory.PlaceRequest{NS: "/counters", ID: "alice", Now: h.clock()})
		if err != nil || r.Owner.SessionID != session || r.Placed {
			t.Fatalf("unexpected route of an existing placement on a degraded worker; got %+v, %v; want it kept", r, err)
		}
		if r, err := h.ds.Place(t.Context(), &directory.PlaceRequest{NS: "/counters", ID: "bob", Now: h.clock()}); !errors.Is(err, directory.ErrNoEligible) {
			t.Fatalf("unexpected new placement on a degraded worker; got %+v, %v; want ErrNoEligible", r, err)
		}
		h.fw.mode.Store("ok")
		if res := h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil)); res.status != 200 || res.body != `{"expiresInMs":15000,"draining":false}` {
			t.Fatalf("unexpected ack; got %d %s", res.status, res.body)
		}
		if r, err := h.ds.Place(t.Context(), &directory.PlaceRequest{NS: "/counters", ID: "bob", Now: h.clock()}); err != nil || r.Owner.SessionID != session || !r.Placed {
			t.Fatalf("unexpected placement once the probe passed; got %+v, %v", r, err)
		}
	})
}

func TestHeartbeatProbeCarriesSecret_RREG1(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		session := h.register(nil)
		before := h.fw.probes.Load()
		res := h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil))
		if res.status != 200 || h.fw.probes.Load() != before+1 {
			t.Fatalf("unexpected heartbeat; got %d %s probes=%d", res.status, res.body, h.fw.probes.Load()-before)
		}
		// The fake worker refuses probes without its secret: a degraded ack
		// would show the header went missing.
		if strings.Contains(res.body, "degraded") {
			t.Fatalf("unexpected degraded ack: the probe did not carry pinboard-proxy-secret")
		}
	})
}

// The superseded row (R-LS-4): a higher-epoch registration takes
// {hostname}{ns}; the older session's heartbeat gets the documented 409 and
// its records are gone. A stale registration is refused with the same body.
func TestHeartbeatSuperseded_RLS4(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		old := h.register(map[string]any{"hostname": "app.example", "env": "blue", "epoch": 1,
			"instances": map[string][]string{"/counters": {"alice"}}})
		h.register(map[string]any{"hostname": "app.example", "env": "green", "epoch": 2})
		res := h.post("/registry/heartbeat", workerToken, h.beatBody(old, nil))
		want := `{"error":"registration superseded: app.example/counters now bound to env green at epoch 2","superseded":true}`
		if res.status != 409 || res.body != want {
			t.Fatalf("unexpected reply; got %d %s; want 409 %s", res.status, res.body, want)
		}
		if ct := string(res.header.ContentType()); ct != "application/json" {
			t.Fatalf("unexpected Content-Type %q; want application/json", ct)
		}
		if _, err := h.ds.Placement(t.Context(), "/counters", "alice", h.clock()); err == nil {
			t.Fatalf("unexpected placement left by a superseded session")
		}
		c, v := h.fw.pair("stale")
		res = h.post("/registry/register", workerToken, mustJSON(t, map[string]any{
			"clientId": "stale", "secret": h.fw.secret, "namespaces": []string{"/counters"},
			"advertiseUrl": h.fw.srv.URL, "headroom": 1, "draining": false, "challenge": c, "challengeValue": v,
			"hostname": "app.example", "env": "blue", "epoch": 1,
		}))
		if res.status != 409 || res.body != want {
			t.Fatalf("unexpected reply to a stale registration; got %d %s; want 409 %s", res.status, res.body, want)
		}
	})
}

// A burst of probes to workers sharing one host:port must not fail for
// want of a pooled connection: that would mark healthy workers degraded.
func TestProbeBurstOneHost(t *testing.T) {
	fw := newFakeWorker(t)
	fw.mode.Store("slow")
	p := NewProber(2 * time.Second)
	errs := make(chan error, 200)
	for i := range 200 {
		c, v := fw.pair("burst" + itoa(i))
		go func() {
			res, err := p.Probe(fw.srv.URL, fw.secret, c, v)
			if res != ProbeOK {
				errs <- fmt.Errorf("probe %d: %v %v", i, res, err)
				return
			}
			errs <- nil
		}()
	}
	for range 200 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// A superseded worker keeps its session id: it releases each instance it
// aborts and deregisters at shutdown. Both succeed with nothing to free,
// byte for byte like a lapsed session, instead of 503 "directory
// unavailable" retried until the worker gives up (R-LS-4, R-REG-3).
func TestSupersededReleaseAndDeregister_RLS4_RREG3(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		old := h.register(map[string]any{"hostname": "app.example", "env": "blue", "epoch": 1,
			"instances": map[string][]string{"/counters": {"alice"}}})
		h.register(map[string]any{"hostname": "app.example", "env": "green", "epoch": 2})
		res := h.post("/registry/release", workerToken, `[{"sessionId":"`+old+`","namespace":"/counters","id":"alice","epoch":"1"}]`)
		if res.status != 200 || res.body != `{"released":0}` {
			t.Fatalf("unexpected reply to release; got %d %s; want 200 {\"released\":0}", res.status, res.body)
		}
		res = h.post("/registry/deregister", workerToken, `{"sessionId":"`+old+`"}`)
		if res.status != 200 || res.body != `{"ok":true}` {
			t.Fatalf("unexpected reply to deregister; got %d %s; want 200 {\"ok\":true}", res.status, res.body)
		}
	})
}

// A key naming a field in another case beside the exact one is ignored,
// as the reference reads body.sessionId (R-REG-7): the heartbeat is
// answered for the exact key's session.
func TestHeartbeatCaseVariantKeyIgnored_RREG7(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		s := h.register(nil)
		body := strings.TrimSuffix(h.beatBody(s, nil), "}") + `,"SessionId":"zzz","HEADROOM":"x"}`
		if res := h.post("/registry/heartbeat", workerToken, body); res.status != 200 || res.body != `{"expiresInMs":15000,"draining":false}` {
			t.Fatalf("unexpected reply; got %d %s; want 200 {\"expiresInMs\":15000,\"draining\":false}", res.status, res.body)
		}
	})
}

// Epochs as large as a nanosecond timestamp register (PinnedWorker takes
// any int >= 0), and order bindings as the reference's doubles do
// (R-LS-4).
func TestLargeEpochs_RLS4(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		old := h.register(map[string]any{"hostname": "app.example", "env": "blue", "epoch": 1_700_000_000_000_000_000})
		h.register(map[string]any{"hostname": "app.example", "env": "green", "epoch": 1_700_000_000_100_000_000})
		res := h.post("/registry/heartbeat", workerToken, h.beatBody(old, nil))
		want := `{"error":"registration superseded: app.example/counters now bound to env green at epoch 1700000000100000000","superseded":true}`
		if res.status != 409 || res.body != want {
			t.Fatalf("unexpected reply to the older epoch; got %d %s; want 409 %s", res.status, res.body, want)
		}
	})
}

// The superseded body names the epoch as the reference writes it: a
// JavaScript number in a template string, the shortest decimal that reads
// back as the same double, so a nanosecond timestamp past 2^53 ends in
// zeros (1700000000223456789 is the double 1700000000223456768, written
// 1700000000223456800). Before, the double's exact integer was written,
// which no Node pinboard writes (R-REG-2 byte for byte, R-LS-4).
func TestSupersededBodyEpochAsJavaScriptNumber_RREG2_RLS4(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		old := h.register(map[string]any{"hostname": "app.example", "env": "blue", "epoch": 1_700_000_000_123_456_789})
		h.register(map[string]any{"hostname": "app.example", "env": "green", "epoch": 1_700_000_000_223_456_789})
		res := h.post("/registry/heartbeat", workerToken, h.beatBody(old, nil))
		want := `{"error":"registration superseded: app.example/counters now bound to env green at epoch 1700000000223456800","superseded":true}`
		if res.status != 409 || res.body != want {
			t.Fatalf("unexpected reply; got %d %s; want 409 %s", res.status, res.body, want)
		}
	})
	for epoch, want := range map[int64]string{
		0: "0", 3: "3", 1<<53 - 1: "9007199254740991", 1 << 53: "9007199254740992",
		1 << 60: "1152921504606847000", 1<<63 - 1024: "9223372036854775000",
	} {
		e := &directory.SupersededError{Hostname: "h", NS: "/n", Env: "e", Epoch: epoch}
		if got, w := string(supersededBody(e)), `{"error":"registration superseded: h/n now bound to env e at epoch `+want+`","superseded":true}`; got != w {
			t.Fatalf("unexpected body for epoch %d; got %s; want %s", epoch, got, w)
		}
	}
}

// A degraded session's probe waits off the pool: its last probe failed,
// so this one most likely waits for the whole probe timeout too. Workers
// cut off from pinboard then hold pool slots on their first failing
// heartbeat only, and cannot keep other workers' heartbeats queued until
// their leases lapse (R-LS-1, R-LS-3). Here the pool has one slot, four
// degraded sessions' probes hang for a minute, and a healthy worker's
// heartbeat is still answered.
func TestDegradedProbesWaitOffPool_RLS1_RLS3(t *testing.T) {
	h := newHarness(t)
	r := h.registryWith(Options{ProbeTimeout: time.Minute, Workers: 1, MinWorkers: 1, Queue: 64})
	h.r = r
	healthy := h.register(nil)

	stuck := newFakeWorker(t)
	orig := h.fw
	h.fw = stuck
	var bodies []string
	for i := range 4 {
		s := h.register(map[string]any{"advertiseUrl": fmt.Sprintf("%s/w%d", stuck.srv.URL, i)})
		stuck.mode.Store("404")
		if res := h.post("/registry/heartbeat", workerToken, h.beatBody(s, nil)); res.status != 200 || !strings.Contains(res.body, `"degraded":true`) {
			t.Fatalf("cannot degrade the session; got %d %s", res.status, res.body)
		}
		stuck.mode.Store("ok")
		bodies = append(bodies, h.beatBody(s, nil))
	}
	h.fw = orig
	stuck.mode.Store("hang")
	before := stuck.probes.Load()
	var wg sync.WaitGroup
	t.Cleanup(func() { close(stuck.hang); wg.Wait() })
	for _, b := range bodies {
		wg.Add(1)
		go func() { defer wg.Done(); h.do(r, "POST", "/registry/heartbeat", workerToken, b) }()
	}
	for deadline := time.Now().Add(10 * time.Second); stuck.probes.Load()-before < int64(len(bodies)); {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d degraded sessions' probes started: the others wait for the pool", stuck.probes.Load()-before, len(bodies))
		}
		time.Sleep(5 * time.Millisecond)
	}
	h.wantBeatAnswered(r, healthy, 10*time.Second, "degraded sessions' probes")
}

// A heartbeat is refused once the key's allowedBackendHosts no longer
// cover the session's advertise URL, as it is once its namespaces no
// longer do (R-TR-3): after a passport narrows a key, a session at a host
// the key may no longer register must not be renewed for ever.
func TestHeartbeatBackendNoLongerAllowed_RTR3(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		session := h.register(nil)
		h.wantBeatForbiddenWith(session, `"namespaces":["*"],"allowedBackendHosts":["10.0.0.1"]`)
	})
}

// wantBeatForbiddenWith sends session's heartbeat to a registry whose
// passport gives the worker key (the same account) these claims instead,
// and fails unless it is answered 403 {"error":"forbidden"} byte for byte.
func (h *harness) wantBeatForbiddenWith(session, claims string) {
	h.t.Helper()
	raw := `{"providers":[{"type":"staticToken","id":"p","keys":[
		{"name":"worker","token":{"env":"W"},"scopes":["pinboard:worker"],"claims":{"pinboard":{` + claims + `}}}
	]}]}`
	pp, err := attest.ParsePassport([]byte(raw), func(k string) (string, bool) { return workerToken, k == "W" })
	if err != nil {
		h.t.Fatal(err)
	}
	res := h.do(h.registry(pp), "POST", "/registry/heartbeat", workerToken, h.beatBody(session, nil))
	if res.status != 403 || res.body != `{"error":"forbidden"}` {
		h.t.Fatalf("unexpected reply; got %d %s; want 403 {\"error\":\"forbidden\"}", res.status, res.body)
	}
}

// The 403 row's third case, "the claim no longer covers the
// registration", for the same account (p:worker) whose key was narrowed
// after it registered: its namespaces, hostnames or envs no longer cover
// the session's, and the heartbeat gets 403 {"error":"forbidden"} byte for
// byte (R-REG-2, R-TR-3). The table test's narrow key is another account.
func TestHeartbeatClaimsNoLongerCover_RREG2_RTR3(t *testing.T) {
	cases := []struct{ name, claims string }{
		{"namespaces", `"namespaces":["/other"],"allowedBackendHosts":["127.0.0.1"]`},
		{"hostnames", `"namespaces":["*"],"hostnames":["other.example"],"allowedBackendHosts":["127.0.0.1"]`},
		{"envs", `"namespaces":["*"],"envs":["staging"],"allowedBackendHosts":["127.0.0.1"]`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			forEachStore(t, func(t *testing.T, h *harness) {
				session := h.register(map[string]any{"hostname": "app.example", "env": "blue", "epoch": 1})
				// The unchanged key still renews: only the narrowing refuses.
				if res := h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil)); res.status != 200 {
					t.Fatalf("unexpected reply before narrowing; got %d %s", res.status, res.body)
				}
				h.wantBeatForbiddenWith(session, tc.claims)
			})
		})
	}
}

// A heartbeat from another account is the 403 row and nothing else: no
// probe of the session's advertise URL, and the session left as it was —
// a challengeValue its worker does not answer must not void another
// account's registration (R-REG-2, R-TR-3, R-LS-3). The table test cannot
// tell this apart: the store refuses another account's renewal on its own
// (ErrForbidden), so with the registry's account check gone that row
// still read 403, while the probe had run and a mismatch voided the
// session.
func TestHeartbeatOtherAccountProbesNothing_RREG2_RTR3(t *testing.T) {
	for _, token := range []string{otherToken, narrowToken} {
		t.Run(token, func(t *testing.T) {
			forEachStore(t, func(t *testing.T, h *harness) {
				session := h.register(nil)
				h.fw.mode.Store("mismatch")
				before := h.fw.probes.Load()
				res := h.post("/registry/heartbeat", token, h.beatBody(session, nil))
				if res.status != 403 || res.body != `{"error":"forbidden"}` {
					t.Fatalf("unexpected reply to another account; got %d %s; want 403 {\"error\":\"forbidden\"}", res.status, res.body)
				}
				if n := h.fw.probes.Load() - before; n != 0 {
					t.Fatalf("unexpected probes of the session's worker for another account's heartbeat; got %d; want 0", n)
				}
				h.fw.mode.Store("ok")
				if res := h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil)); res.status != 200 || res.body != `{"expiresInMs":15000,"draining":false}` {
					t.Fatalf("unexpected reply to the owner after another account's heartbeat; got %d %s; want 200, the session untouched", res.status, res.body)
				}
			})
		})
	}
}

// A register or heartbeat that waited for the pool past MaxQueueWait is
// answered 503 "registry busy" and not handled: the worker gives up after
// WorkerTimeout and sends the next one with a new challenge, so handled
// late its probe asked for a challenge the worker no longer answers — a
// healthy session marked degraded until its next heartbeat — or a
// register won while its worker backed off, leaving a session the worker
// never learnt of (R-LS-1, R-REG-1). Neither probes the worker, renews a
// lease or adds a session: the next heartbeat, past the lease, finds the
// session gone.
func TestStaleQueuedRequestsNotHandled_RLS1_RREG1(t *testing.T) {
	h := newHarness(t)
	obs := &outcomes{}
	const maxWait = 100 * time.Millisecond
	r := h.registryWith(Options{Workers: 1, MinWorkers: 1, Queue: 16, MaxQueueWait: maxWait, Observer: obs})
	h.r = r
	session := h.register(nil)
	listed := func() int {
		ws, err := h.store.Workers(t.Context(), h.clock())
		if err != nil {
			t.Fatal(err)
		}
		return len(ws)
	}
	workers, probes := listed(), h.fw.probes.Load()
	h.advance(testTTL - time.Second) // a renewal would push the lease a lease past this

	block, started := make(chan struct{}), make(chan struct{})
	if err := r.pool.Submit(func() { close(started); <-block }); err != nil {
		t.Fatal(err)
	}
	<-started
	regBody := h.lateRegisterBody()
	beatBody := h.beatBody(session, nil)
	got := make(chan response, 2)
	go func() { got <- h.post("/registry/heartbeat", workerToken, beatBody) }()
	go func() { got <- h.post("/registry/register", workerToken, regBody) }()
	for deadline := time.Now().Add(10 * time.Second); r.pool.Waiting() < 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("only %d requests queued after 10s; want 2", r.pool.Waiting())
		}
	}
	time.Sleep(maxWait + 50*time.Millisecond) // both queued before this began
	close(block)
	for range 2 {
		res := <-got
		if res.status != 503 || res.body != `{"error":"registry busy"}` || string(res.header.Peek("Retry-After")) != "1" {
			t.Fatalf("unexpected reply to a request that waited past MaxQueueWait; got %d %s Retry-After %q; want 503 registry busy, Retry-After 1",
				res.status, res.body, res.header.Peek("Retry-After"))
		}
	}
	if n := h.fw.probes.Load() - probes; n != 0 {
		t.Fatalf("unexpected probes of the worker by stale requests; got %d; want 0", n)
	}
	if n := listed(); n != workers {
		t.Fatalf("unexpected workers after a stale register; got %d; want %d", n, workers)
	}
	if obs.last() != "stale" {
		t.Fatalf("unexpected heartbeat outcome; got %q; want stale", obs.last())
	}
	h.advance(2 * time.Second) // past the lease a stale heartbeat would have renewed
	if res := h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil)); res.status != 409 || res.body != string(bodyUnknownSession) {
		t.Fatalf("unexpected heartbeat after the lease lapsed unrenewed; got %d %s; want 409 unknown session", res.status, res.body)
	}
}

// A register or heartbeat whose probe cannot end before its worker stops
// waiting for the answer (AnswerWithin; WorkerTimeout less a margin) is
// answered 503 "registry busy" unhandled at that moment, as one that
// waited for the pool too long: the worker has given up on it and has a
// new challenge, and the old one's probe, answered 404 late, marked a
// healthy session degraded — no new placements — until its next
// heartbeat; a register so probed was refused for a worker that had
// already sent its next one. MaxQueueWait alone (4 s) left a probe up to
// its 2 s timeout on top, past the worker's 5 s (R-LS-2, R-REG-1).
func TestProbeEndsBeforeTheWorkerStopsWaiting_RLS2_RREG1(t *testing.T) {
	h := newHarness(t)
	obs := &outcomes{}
	// The probes' own timeout is far past the test's bound on each
	// answer: a probe not cut at AnswerWithin shows as no answer, with no
	// stopwatch on how soon the cut came.
	const within, bound = time.Second, 20 * time.Second
	r := h.registryWith(Options{ProbeTimeout: time.Minute, Workers: 4, Queue: 16, AnswerWithin: within, Observer: obs})
	h.r = r
	session := h.register(nil)
	degraded := func() bool {
		s, err := h.store.Session(t.Context(), session, h.clock())
		if err != nil {
			t.Fatal(err)
		}
		return s.Degraded
	}
	// The probes' late 404s come when the test ends (before the fake
	// worker's Close waits for its handlers): after every answer below.
	t.Cleanup(func() { close(h.fw.hang) })
	postBounded := func(path, body string) response {
		t.Helper()
		got := make(chan response, 1)
		go func() { got <- h.post(path, workerToken, body) }()
		select {
		case res := <-got:
			return res
		case <-time.After(bound):
			t.Fatalf("no answer to %s %v after it arrived, its probe unanswered; want 503 registry busy at AnswerWithin (%v), the probe cut", path, bound, within)
			return response{}
		}
	}

	h.fw.mode.Store("late404")
	res := postBounded("/registry/heartbeat", h.beatBody(session, nil))
	if res.status != 503 || res.body != `{"error":"registry busy"}` || string(res.header.Peek("Retry-After")) != "1" {
		t.Fatalf("unexpected reply to a heartbeat whose probe outlived its worker's wait; got %d %s Retry-After %q; want 503 registry busy, Retry-After 1",
			res.status, res.body, res.header.Peek("Retry-After"))
	}
	if obs.last() != "stale" {
		t.Fatalf("unexpected heartbeat outcome; got %q; want stale", obs.last())
	}
	if degraded() {
		t.Fatal("unexpected degraded session after a probe cut short on its worker's budget; want it as it was")
	}
	regBody := h.lateRegisterBody()
	if res := postBounded("/registry/register", regBody); res.status != 503 || res.body != `{"error":"registry busy"}` {
		t.Fatalf("unexpected reply to a register whose probe outlived its worker's wait; got %d %s; want 503 registry busy", res.status, res.body)
	}

	h.fw.mode.Store("ok")
	if res := h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil)); res.status != 200 || res.body != `{"expiresInMs":15000,"draining":false}` {
		t.Fatalf("unexpected reply to the next heartbeat; got %d %s; want 200, not degraded", res.status, res.body)
	}
}

// The ack's expiresInMs is the whole lease (R-LS-1: "renews the lease by
// PINBOARD_LEASE_TTL_MS … returned as expiresInMs") on both stores, on a
// clock that reads nanoseconds as time.Now does: the Redis store keeps
// times in microseconds, and a lease of now, cut to the microsecond, plus
// the TTL is less than the TTL from now by the nanoseconds cut — 14999 ms
// when truncated to whole milliseconds.
func TestExpiresInMsWholeLeaseOnNanosecondClock_RLS1(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		h.advance(123_456_789) // 789 ns past the microsecond
		c, v := h.fw.pair("one")
		res := h.post("/registry/register", workerToken, mustJSON(t, map[string]any{
			"clientId": "c1", "secret": h.fw.secret, "namespaces": []string{"/counters"},
			"advertiseUrl": h.fw.srv.URL, "headroom": 1024, "draining": false,
			"challenge": c, "challengeValue": v,
		}))
		var ack struct {
			SessionID   string `json:"sessionId"`
			ExpiresInMs int64  `json:"expiresInMs"`
		}
		if res.status != 200 || json.Unmarshal([]byte(res.body), &ack) != nil || ack.ExpiresInMs != 15000 {
			t.Fatalf("unexpected register ack; got %d %s; want expiresInMs 15000", res.status, res.body)
		}
		h.advance(3*time.Second + 1)
		res = h.post("/registry/heartbeat", workerToken, h.beatBody(ack.SessionID, nil))
		if res.status != 200 || res.body != `{"expiresInMs":15000,"draining":false}` {
			t.Fatalf("unexpected heartbeat ack; got %d %s; want 200 {\"expiresInMs\":15000,\"draining\":false}", res.status, res.body)
		}
	})
}

// Each heartbeat is counted by what it was answered
// (pinboard_registry_heartbeats_total): a good probe "ok", a failed one
// "degraded" (200 all the same), a mismatch "voided" and the session then
// "unknown_session" — an operator tells a fleet going degraded from a
// healthy one by this label alone (R-REG-2, R-LS-3).
func TestHeartbeatOutcomesObserved_RREG2_RLS3(t *testing.T) {
	h := newHarness(t)
	obs := &outcomes{}
	h.r = h.registryWith(Options{ProbeTimeout: time.Second, Workers: 4, Queue: 16, Observer: obs})
	session := h.register(nil)
	for _, step := range []struct {
		mode    string
		status  int
		outcome string
	}{
		{"ok", 200, "ok"},
		{"404", 200, "degraded"},
		{"ok", 200, "ok"},
		{"mismatch", 409, "voided"},
		{"ok", 409, "unknown_session"},
	} {
		h.fw.mode.Store(step.mode)
		res := h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil))
		if res.status != step.status || obs.last() != step.outcome {
			t.Fatalf("unexpected heartbeat with the probe %s; got %d %s, outcome %q; want %d, %q", step.mode, res.status, res.body, obs.last(), step.status, step.outcome)
		}
	}
}

// forbiddenBeatStore is a memory directory whose heartbeats find the
// session belongs to another account: the store's own check, which a
// registry meets when the account changed between its read of the
// session and the renewal.
type forbiddenBeatStore struct{ *directory.Memory }

func (forbiddenBeatStore) Heartbeat(context.Context, *directory.Beat, time.Time) (*directory.BeatResult, error) {
	return nil, directory.ErrForbidden
}

// A renewal the store refuses as another account's session is the
// forbidden row, 403 {"error":"forbidden"}, not a 409 that would send the
// worker to re-register nor a 503 (R-REG-2).
func TestHeartbeatStoreForbidden_RREG2(t *testing.T) {
	h := newHarness(t)
	session := h.register(nil)
	r := h.registryOn(forbiddenBeatStore{h.store}, testPassport(t))
	res := h.do(r, "POST", "/registry/heartbeat", workerToken, h.beatBody(session, nil))
	if res.status != 403 || res.body != `{"error":"forbidden"}` {
		t.Fatalf("unexpected reply to a renewal refused by the store; got %d %s; want 403 forbidden", res.status, res.body)
	}
}

// challenge and challengeValue are tokens of 1 to 512 bytes
// (maxTokenLen): the schema rows refuse 513, and 512 is a heartbeat like
// any other (R-REG-2).
func TestHeartbeatChallengeAtTokenLimit_RREG2(t *testing.T) {
	h := newHarness(t)
	session := h.register(nil)
	c, v := strings.Repeat("c", maxTokenLen), strings.Repeat("v", maxTokenLen)
	h.fw.mu.Lock()
	h.fw.value[c] = v
	h.fw.mu.Unlock()
	body := mustJSON(t, map[string]any{"sessionId": session, "headroom": 1, "draining": false, "challenge": c, "challengeValue": v})
	if res := h.post("/registry/heartbeat", workerToken, body); res.status != 200 || res.body != `{"expiresInMs":15000,"draining":false}` {
		t.Fatalf("unexpected reply to a heartbeat with %d-character challenge tokens; got %d %s; want 200", maxTokenLen, res.status, res.body)
	}
}

// Durations on the wire are never negative: expiresInMs is 0 for a lease
// already over, and deadlines are "0 once passed" (R-LS-1, R-CM-1,
// R-LS-5).
func TestWireDurationsNeverNegative_RLS1_RCM1(t *testing.T) {
	if got := ms(-time.Millisecond); got != 0 {
		t.Errorf("unexpected ms of a past instant; got %d; want 0", got)
	}
	if got := ms(1500 * time.Microsecond); got != 1 {
		t.Errorf("unexpected ms(1.5ms); got %d; want 1", got)
	}
	if got := seconds(-time.Second); got != 0 {
		t.Errorf("unexpected seconds of a past deadline; got %v; want 0", got)
	}
	if got := seconds(29400 * time.Millisecond); got != 29.4 {
		t.Errorf("unexpected seconds(29.4s); got %v; want 29.4", got)
	}
}
