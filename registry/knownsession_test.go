package registry

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/attest"
	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/internal/testlog"
	"github.com/pinboard-go/pinboard/tools/redistest"
)

// opCounter counts a store's round trips by operation.
type opCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *opCounter) StoreCommand(op string, _ time.Duration, _ error) {
	c.mu.Lock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[op]++
	c.mu.Unlock()
}

func (c *opCounter) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n
	c.n = nil
	return n
}

// twoNodes is a harness whose registry (node A, h.r, logging to logsA)
// and a second registry (node B, logging to logsB) each run on a Redis
// directory of their own over one redis-server and prefix: two pinboard
// nodes sharing one directory. opsA counts node A's round trips.
type twoNodes struct {
	h            *harness
	b            *Registry
	opsA         *opCounter
	logsA, logsB *testlog.Buffer
}

func newTwoNodes(t *testing.T) *twoNodes {
	t.Helper()
	srv := redistest.StartServer(t)
	h := &harness{t: t, now: time.Unix(1_800_000_000, 0), fw: newFakeWorker(t)}
	n := &twoNodes{h: h, opsA: &opCounter{}, logsA: &testlog.Buffer{}, logsB: &testlog.Buffer{}}
	open := func(obs directory.CommandObserver) directory.Store {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s, err := directory.OpenRedis(ctx, srv.URL(), directory.RedisOptions{LeaseTTL: testTTL, Prefix: "two", Observer: obs})
		if err != nil {
			t.Fatalf("cannot open the redis directory: %v", err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	node := func(s directory.Store, logs *testlog.Buffer) *Registry {
		r, err := New(Options{
			Store: s, Passport: testPassport(t), LeaseTTL: testTTL, Now: h.clock,
			ProbeTimeout: time.Second, Workers: 4, Queue: 16,
			Logger: slog.New(slog.NewTextHandler(logs, nil)),
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close(time.Second) })
		return r
	}
	h.ds = open(n.opsA)
	h.r = node(h.ds, n.logsA)
	n.b = node(open(nil), n.logsB)
	return n
}

// supersedeOnB registers, through node B, a worker at epoch 2 that takes
// the binding of app.example/counters for env green from an epoch-1
// registration (R-LS-4).
func (n *twoNodes) supersedeOnB(t *testing.T) {
	t.Helper()
	h := n.h
	c, v := h.fw.pair("green")
	res := h.do(n.b, "POST", "/registry/register", workerToken, mustJSON(t, map[string]any{
		"clientId": "green", "secret": h.fw.secret, "namespaces": []string{"/counters"},
		"advertiseUrl": h.fw.srv.URL + "/green", "headroom": 1, "draining": false, "challenge": c, "challengeValue": v,
		"hostname": "app.example", "env": "green", "epoch": 2,
	}))
	if res.status != 200 {
		t.Fatalf("cannot register through node B; got %d %s", res.status, res.body)
	}
}

// A heartbeat of a session the node saw live costs one round trip to
// Redis, the heartbeat script: the session read before the probe is
// answered from what the node knows (directory.KnownSessions), and the
// answer is the same, byte for byte (R-REG-2).
func TestKnownSessionHeartbeatOneRoundTrip_RREG2(t *testing.T) {
	n := newTwoNodes(t)
	h := n.h
	session := h.register(nil)
	want := `{"expiresInMs":15000,"draining":false}`
	if res := h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil)); res.status != 200 || res.body != want {
		t.Fatalf("unexpected reply; got %d %s; want 200 %s", res.status, res.body, want)
	}
	n.opsA.take()
	for range 3 {
		h.advance(time.Second)
		if res := h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil)); res.status != 200 || res.body != want {
			t.Fatalf("unexpected reply; got %d %s; want 200 %s", res.status, res.body, want)
		}
	}
	if got := n.opsA.take(); got["heartbeat"] != 3 || len(got) != 1 {
		t.Fatalf("unexpected round trips for three heartbeats of a known session; got %v; want map[heartbeat:3]", got)
	}
	// A session heartbeating through another node is read there once.
	if res := h.do(n.b, "POST", "/registry/heartbeat", workerToken, h.beatBody(session, nil)); res.status != 200 || res.body != want {
		t.Fatalf("unexpected reply from node B; got %d %s; want 200 %s", res.status, res.body, want)
	}
}

// A session the node knew, ended through another node, is answered as it
// ended — 409 unknown session, or 409 superseded, byte for byte — even
// when the probe now reaches another process (R-LS-3: only a live session
// is voided), and a lease the node knew that has passed is not trusted
// (R-LS-2).
func TestKnownSessionEndedElsewhere_RREG2_RLS2_RLS3_RLS4(t *testing.T) {
	unknown := `{"error":"unknown session","reregister":true}`
	for _, mode := range []string{"ok", "mismatch", "500"} {
		t.Run("deregistered/"+mode, func(t *testing.T) {
			n := newTwoNodes(t)
			h := n.h
			session := h.register(nil)
			if res := h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil)); res.status != 200 {
				t.Fatalf("unexpected reply; got %d %s", res.status, res.body)
			}
			if res := h.do(n.b, "POST", "/registry/deregister", workerToken, `{"sessionId":"`+session+`"}`); res.status != 200 {
				t.Fatalf("cannot deregister through node B; got %d %s", res.status, res.body)
			}
			h.fw.mode.Store(mode)
			if res := h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil)); res.status != 409 || res.body != unknown {
				t.Fatalf("unexpected reply; got %d %s; want 409 %s", res.status, res.body, unknown)
			}
			if s := n.logsA.String(); strings.Contains(s, "msg=voided") || strings.Contains(s, "msg=degraded") {
				t.Fatalf("unexpected log of a session that had ended:\n%s", s)
			}
		})
		t.Run("lapsed/"+mode, func(t *testing.T) {
			n := newTwoNodes(t)
			h := n.h
			session := h.register(nil)
			if res := h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil)); res.status != 200 {
				t.Fatalf("unexpected reply; got %d %s", res.status, res.body)
			}
			h.advance(testTTL)
			h.fw.mode.Store(mode)
			probes := h.fw.probes.Load()
			if res := h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil)); res.status != 409 || res.body != unknown {
				t.Fatalf("unexpected reply; got %d %s; want 409 %s", res.status, res.body, unknown)
			}
			if got := h.fw.probes.Load() - probes; got != 0 {
				t.Fatalf("unexpected probes of a lapsed session; got %d; want 0", got)
			}
		})
	}
	t.Run("superseded", func(t *testing.T) {
		n := newTwoNodes(t)
		h := n.h
		old := h.register(map[string]any{"hostname": "app.example", "env": "blue", "epoch": 1})
		if res := h.post("/registry/heartbeat", workerToken, h.beatBody(old, nil)); res.status != 200 {
			t.Fatalf("unexpected reply; got %d %s", res.status, res.body)
		}
		n.supersedeOnB(t)
		want := `{"error":"registration superseded: app.example/counters now bound to env green at epoch 2","superseded":true}`
		h.fw.mode.Store("mismatch")
		if res := h.post("/registry/heartbeat", workerToken, h.beatBody(old, nil)); res.status != 409 || res.body != want {
			t.Fatalf("unexpected reply; got %d %s; want 409 %s", res.status, res.body, want)
		}
	})
	t.Run("live/mismatch", func(t *testing.T) {
		n := newTwoNodes(t)
		h := n.h
		session := h.register(nil)
		if res := h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil)); res.status != 200 {
			t.Fatalf("unexpected reply; got %d %s", res.status, res.body)
		}
		h.fw.mode.Store("mismatch")
		want := `{"error":"registration voided: challenge value mismatch on the advertise URL","reregister":true}`
		if res := h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil)); res.status != 409 || res.body != want {
			t.Fatalf("unexpected reply; got %d %s; want 409 %s", res.status, res.body, want)
		}
		if _, err := h.ds.Session(t.Context(), session, h.clock()); err == nil {
			t.Fatalf("unexpected session left after its registration was voided")
		}
	})
}

// Degraded, recovered and drain lines are logged once per change, by the
// node whose heartbeat made it, when a worker's heartbeats go through
// two nodes in turn: each node's view of the session is older than the
// last heartbeat through the other (R-LS-3).
func TestTransitionsLoggedOnceAcrossNodes_RLS3(t *testing.T) {
	n := newTwoNodes(t)
	h := n.h
	session := h.register(nil)
	beat := func(r *Registry, extra map[string]any) {
		t.Helper()
		h.advance(time.Second)
		if res := h.do(r, "POST", "/registry/heartbeat", workerToken, h.beatBody(session, extra)); res.status != 200 {
			t.Fatalf("unexpected reply; got %d %s", res.status, res.body)
		}
	}
	beat(h.r, nil)
	beat(n.b, nil)
	h.fw.mode.Store("500")
	beat(h.r, nil) // degraded, logged by A
	beat(n.b, nil) // still degraded: B logs nothing
	beat(h.r, nil)
	h.fw.mode.Store("ok")
	beat(n.b, nil) // recovered, logged by B
	beat(h.r, nil)
	beat(h.r, map[string]any{"draining": true}) // drain, logged by A
	beat(n.b, map[string]any{"draining": true})
	count := func(logs *testlog.Buffer, msg string) int { return strings.Count(logs.String(), "msg="+msg+" ") }
	for _, c := range []struct {
		msg  string
		a, b int
	}{{"degraded", 1, 0}, {"recovered", 0, 1}, {"drain", 1, 0}} {
		if a, b := count(n.logsA, c.msg), count(n.logsB, c.msg); a != c.a || b != c.b {
			t.Fatalf("unexpected %q lines; got %d on A and %d on B; want %d and %d\nA:\n%s\nB:\n%s", c.msg, a, b, c.a, c.b, n.logsA, n.logsB)
		}
	}
}

// A session the node knew, ended through another node, is answered as it
// ended — 409 unknown session, or 409 superseded, byte for byte — to a
// credential the registration check refuses too (another account, or the
// same key narrowed since): the 409 rows come before the 403 as when the
// session was read before the check (R-REG-2, R-TR-3).
func TestKnownSessionEndedElsewhereForbiddenCredential_RREG2_RTR3(t *testing.T) {
	unknown := `{"error":"unknown session","reregister":true}`
	superseded := `{"error":"registration superseded: app.example/counters now bound to env green at epoch 2","superseded":true}`
	narrowed := func(t *testing.T, h *harness) *Registry {
		raw := `{"providers":[{"type":"staticToken","id":"p","keys":[
			{"name":"worker","token":{"env":"W"},"scopes":["pinboard:worker"],"claims":{"pinboard":{"namespaces":["/other"],"allowedBackendHosts":["127.0.0.1"]}}}
		]}]}`
		pp, err := attest.ParsePassport([]byte(raw), func(k string) (string, bool) { return workerToken, k == "W" })
		if err != nil {
			t.Fatal(err)
		}
		return h.registry(pp) // node A's store: what it knows is kept
	}
	for _, end := range []string{"deregistered", "superseded"} {
		for _, cred := range []string{"other account", "narrowed"} {
			t.Run(end+"/"+cred, func(t *testing.T) {
				n := newTwoNodes(t)
				h := n.h
				session := h.register(map[string]any{"hostname": "app.example", "env": "blue", "epoch": 1})
				if res := h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil)); res.status != 200 {
					t.Fatalf("unexpected reply; got %d %s", res.status, res.body)
				}
				want := unknown
				if end == "deregistered" {
					if res := h.do(n.b, "POST", "/registry/deregister", workerToken, `{"sessionId":"`+session+`"}`); res.status != 200 {
						t.Fatalf("cannot deregister through node B; got %d %s", res.status, res.body)
					}
				} else {
					want = superseded
					n.supersedeOnB(t)
				}
				r, token := h.r, otherToken
				if cred == "narrowed" {
					r, token = narrowed(t, h), workerToken
				}
				if res := h.do(r, "POST", "/registry/heartbeat", token, h.beatBody(session, nil)); res.status != 409 || res.body != want {
					t.Fatalf("unexpected reply; got %d %s; want 409 %s", res.status, res.body, want)
				}
			})
		}
	}
}
