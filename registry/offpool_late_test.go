package registry

import (
	"encoding/json"
	"testing"
	"time"
)

// A register whose probe runs off the pool (its advertise URL's last probe
// found it unreachable) and then queues for the pool again is stored only
// if the store write starts while its worker still waits: the probe's own
// time counts, not only the queue waits. Before, with the defaults (4 s,
// 4.5 s; probe 2 s), one probed for 1.8 s and queued 3.6 s after was
// stored 5.4 s after it arrived, past the worker's 5 s (WorkerTimeout):
// the worker had retried through another node (new challenge, same
// clientId), and the late attempt dropped the session the worker used
// (R-REG-1; docs/PROTOCOL.md: "only the store write itself sits after
// it").
func TestLateOffPoolRegisterNotStored_RREG1(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		r := h.registryWith(Options{Store: h.ds, ProbeTimeout: 2 * time.Second, Workers: 1, MinWorkers: 1, Queue: 16})
		r2 := h.registryWith(Options{Store: h.ds, ProbeTimeout: 2 * time.Second, Workers: 4, MinWorkers: 4, Queue: 16}) // another node
		r.unreachable.set(h.fw.srv.URL, true, h.clock())                                                                // a previous attempt raced the bind
		regBody := func(n string) string {
			c, v := h.fw.pair(n)
			return mustJSON(t, map[string]any{
				"clientId": "proc", "secret": h.fw.secret, "namespaces": []string{"/counters"},
				"advertiseUrl": h.fw.srv.URL, "headroom": 1, "draining": false, "challenge": c, "challengeValue": v,
			})
		}
		bodyA := regBody("attempt-a")
		h.fw.mode.Store("hang") // attempt A's probe (off the pool) is slow: 1.8 s
		start := time.Now()
		gotA := make(chan response, 1)
		go func() { gotA <- h.do(r, "POST", "/registry/register", workerToken, bodyA) }()
		for deadline := time.Now().Add(5 * time.Second); h.fw.probes.Load() == 0; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("attempt A's probe did not start")
			}
		}
		// The pool fills (a heartbeat storm) while A's probe runs.
		block, started := make(chan struct{}), make(chan struct{})
		if err := r.pool.Submit(func() { close(started); <-block }); err != nil {
			t.Fatal(err)
		}
		<-started
		time.Sleep(time.Until(start.Add(1800 * time.Millisecond)))
		h.fw.mode.Store("ok")
		close(h.fw.hang) // probe answered OK at 1.8 s; A now queues for the pool again
		time.Sleep(time.Until(start.Add(WorkerTimeout + 100*time.Millisecond)))
		// The worker gave up on A at 5 s and retries (new challenge) via another node.
		resB := h.do(r2, "POST", "/registry/register", workerToken, regBody("attempt-b"))
		if resB.status != 200 {
			t.Fatalf("retry B: got %d %s", resB.status, resB.body)
		}
		var ackB struct{ SessionID string }
		_ = json.Unmarshal([]byte(resB.body), &ackB)
		time.Sleep(time.Until(start.Add(5400 * time.Millisecond)))
		close(block)
		resA := <-gotA
		took := time.Since(start)
		t.Logf("attempt A answered %d %s after %v", resA.status, resA.body, took.Round(time.Millisecond))
		if resA.status == 200 && took > WorkerTimeout {
			t.Errorf("attempt A admitted %v after it arrived, past the worker's %v timeout; want 503 registry busy unhandled", took.Round(time.Millisecond), WorkerTimeout)
		}
		if res := h.do(r2, "POST", "/registry/heartbeat", workerToken, h.beatBody(ackB.SessionID, nil)); res.status != 200 {
			t.Errorf("heartbeat of retry B's session (the one the worker uses): got %d %s; want 200", res.status, res.body)
		}
	})
}

// The same for a degraded session's heartbeat: A (draining false) passes
// its off-pool probe at 1.8 s and queues 3.6 s; the worker, timed out at
// 5 s, marks itself draining and sends B at once (its loop's delay is
// max(0, 3 s − elapsed)), answered 200 through another node. A must not
// land after it: before, it un-drained the session and wrote the older
// headroom (R-REG-2, R-LS-1).
func TestLateOffPoolHeartbeatNotApplied_RREG2_RLS1(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		r := h.registryWith(Options{Store: h.ds, ProbeTimeout: 2 * time.Second, Workers: 1, MinWorkers: 1, Queue: 16})
		r2 := h.registryWith(Options{Store: h.ds, ProbeTimeout: 2 * time.Second, Workers: 4, MinWorkers: 4, Queue: 16})
		h.r = r
		session := h.register(nil)
		h.fw.mode.Store("404")
		if res := h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil)); res.status != 200 {
			t.Fatalf("cannot degrade: %d %s", res.status, res.body)
		}
		h.fw.mode.Store("hang")
		probes := h.fw.probes.Load()
		bodyA := h.beatBody(session, nil)
		start := time.Now()
		gotA := make(chan response, 1)
		go func() { gotA <- h.do(r, "POST", "/registry/heartbeat", workerToken, bodyA) }()
		for deadline := time.Now().Add(5 * time.Second); h.fw.probes.Load() == probes; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("A's probe did not start")
			}
		}
		block, started := make(chan struct{}), make(chan struct{})
		if err := r.pool.Submit(func() { close(started); <-block }); err != nil {
			t.Fatal(err)
		}
		<-started
		time.Sleep(time.Until(start.Add(1800 * time.Millisecond)))
		h.fw.mode.Store("ok")
		close(h.fw.hang)
		time.Sleep(time.Until(start.Add(WorkerTimeout + 100*time.Millisecond)))
		if res := h.do(r2, "POST", "/registry/heartbeat", workerToken, h.beatBody(session, map[string]any{"draining": true})); res.status != 200 || !json.Valid([]byte(res.body)) {
			t.Fatalf("B: got %d %s", res.status, res.body)
		}
		time.Sleep(time.Until(start.Add(5400 * time.Millisecond)))
		close(block)
		resA := <-gotA
		t.Logf("A answered %d %s after %v", resA.status, resA.body, time.Since(start).Round(time.Millisecond))
		info, err := h.ds.Session(t.Context(), session, h.clock())
		if err != nil {
			t.Fatal(err)
		}
		if !info.Draining {
			t.Errorf("session not draining after the worker's newer heartbeat said draining: the late one (sent before) was applied after it")
		}
	})
}
