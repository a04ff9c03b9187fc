package registry

import (
	"encoding/json"
	"sync"
	"testing"
	"time"
)

// probeResults records, besides the heartbeat outcomes, the result of
// every probe a Registry reports: a request answered 503 "registry busy"
// must have been so answered for waiting past its worker's wait, not
// because its probe was cut or failed.
type probeResults struct {
	outcomes
	pmu     sync.Mutex
	results []ProbeResult
}

func (o *probeResults) Probe(_ time.Duration, res ProbeResult) {
	o.pmu.Lock()
	o.results = append(o.results, res)
	o.pmu.Unlock()
}

func (o *probeResults) probes() []ProbeResult {
	o.pmu.Lock()
	defer o.pmu.Unlock()
	return append([]ProbeResult(nil), o.results...)
}

// lateWithin is the late tests' AnswerWithin: how long the worker waits
// for an answer, counted from the request's arrival. The test answers
// A's probe as soon as the pool is full, well inside it; the margin is
// the test goroutine's reaction time, not a timeline.
const lateWithin = 2 * time.Second

// lateOffPoolRegistry is the node attempt A goes through: one pool worker
// (the test holds it), a probe cut only at AnswerWithin, and a queue
// budget (MaxQueueWait) far past anything the test waits. Charged only
// its queue waits, as before, A would then be handled however late; only
// the worker's wait counted from A's arrival — its off-pool probe's own
// time included — can turn it away.
func lateOffPoolRegistry(h *harness, obs Observer) *Registry {
	return h.registryWith(Options{Store: h.ds, ProbeTimeout: time.Minute, MaxQueueWait: time.Minute, AnswerWithin: lateWithin,
		Workers: 1, MinWorkers: 1, Queue: 16, Observer: obs})
}

// holdLateOffPool sends A (send, in the background) to r, whose probe must
// run off the pool, and brings it, each step on an event, to where a late
// request of the kind the tests are about stands: its probe answered OK
// (obs), then A queued for r's pool again behind a task the test holds,
// and its worker's wait (lateWithin from A's arrival) over. It returns
// release, which frees the pool and returns A's answer; before it the
// test sends what the worker sends next, through another node.
func holdLateOffPool(t *testing.T, h *harness, r *Registry, obs *probeResults, send func() response) (release func() response) {
	t.Helper()
	const bound = 20 * time.Second // for each event: generous, never a timeline
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(bound); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("unexpected wait for %s; got nothing after %v; want it", what, bound)
			}
		}
	}
	probes, seen := h.fw.probes.Load(), len(obs.probes())
	h.fw.mode.Store("hang")
	gotA := make(chan response, 1)
	go func() { gotA <- send() }()
	waitUntil("A's probe started", func() bool { return h.fw.probes.Load() > probes })
	// A arrived before its probe started: its worker's wait ends by then.
	waitedOut := time.Now().Add(lateWithin)
	// The pool fills (a heartbeat storm) while A's probe runs off it.
	block, started := make(chan struct{}), make(chan struct{})
	if err := r.pool.Submit(func() { close(started); <-block }); err != nil {
		t.Fatal(err)
	}
	<-started
	t.Cleanup(func() {
		select {
		case <-block:
		default:
			close(block) // a test stopped before release
		}
	})
	h.fw.mode.Store("ok")
	close(h.fw.hang) // A's probe answers OK; A queues for the pool again
	waitUntil("A's probe answered", func() bool { return len(obs.probes()) > seen })
	if got := obs.probes()[seen:]; len(got) != 1 || got[0] != ProbeOK {
		t.Fatalf("unexpected probe results of A; got %v; want [ok] (answered within its worker's wait)", got)
	}
	waitUntil("A queued for the pool", func() bool { return r.pool.Waiting() == 1 })
	// Its worker's wait runs out with A still queued: a bound taken after
	// A arrived, so a late test goroutine only makes A later.
	for time.Now().Before(waitedOut) {
		time.Sleep(time.Until(waitedOut))
	}
	select {
	case res := <-gotA:
		t.Fatalf("unexpected answer to A while the pool was held; got %d %s; want it queued", res.status, res.body)
	default:
	}
	return func() response {
		t.Helper()
		if r.pool.Waiting() != 1 {
			t.Fatalf("unexpected requests queued for the pool; got %d; want 1 (A)", r.pool.Waiting())
		}
		close(block)
		select {
		case res := <-gotA:
			return res
		case <-time.After(bound):
			t.Fatalf("unexpected wait for A's answer; got nothing %v after the pool freed; want it", bound)
			return response{}
		}
	}
}

// A register whose probe runs off the pool (its advertise URL's last probe
// found it unreachable) and then queues for the pool again is stored only
// if the store write starts while its worker still waits: the probe's own
// time counts, not only the queue waits. Before, with the defaults (4 s,
// 4.5 s; probe 2 s), one probed for 1.8 s and queued 3.6 s after was
// stored 5.4 s after it arrived, past the worker's 5 s (WorkerTimeout):
// the worker had retried through another node (new challenge, same
// clientId), and the late attempt dropped the session the worker used
// (R-REG-1; docs/PROTOCOL.md: "only the store write itself sits after
// it"). Here A's worker waits lateWithin, and the queue budget is a
// minute: only the wait counted from A's arrival can turn it away.
func TestLateOffPoolRegisterNotStored_RREG1(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		obs := &probeResults{}
		r := lateOffPoolRegistry(h, obs)
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
		release := holdLateOffPool(t, h, r, obs, func() response { return h.do(r, "POST", "/registry/register", workerToken, bodyA) })
		// The worker gave up on A and retries (new challenge) via another node.
		resB := h.do(r2, "POST", "/registry/register", workerToken, regBody("attempt-b"))
		var ackB struct{ SessionID string }
		if resB.status != 200 || json.Unmarshal([]byte(resB.body), &ackB) != nil || ackB.SessionID == "" {
			t.Fatalf("unexpected reply to retry B; got %d %s; want 200 with a sessionId", resB.status, resB.body)
		}
		resA := release()
		if resA.status != 503 || resA.body != string(bodyBusy) {
			t.Errorf("unexpected reply to attempt A, admitted past its worker's wait; got %d %s; want 503 %s unhandled", resA.status, resA.body, bodyBusy)
		}
		if res := h.do(r2, "POST", "/registry/heartbeat", workerToken, h.beatBody(ackB.SessionID, nil)); res.status != 200 {
			t.Errorf("unexpected reply to a heartbeat of retry B's session (the one the worker uses); got %d %s; want 200", res.status, res.body)
		}
	})
}

// The same for a degraded session's heartbeat: A (draining false) passes
// its off-pool probe and queues past its worker's wait; the worker, timed
// out, marks itself draining and sends B at once (its loop's delay is
// max(0, 3 s − elapsed)), answered 200 through another node. A must not
// land after it: before, it un-drained the session and wrote the older
// headroom (R-REG-2, R-LS-1).
func TestLateOffPoolHeartbeatNotApplied_RREG2_RLS1(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		obs := &probeResults{}
		r := lateOffPoolRegistry(h, obs)
		r2 := h.registryWith(Options{Store: h.ds, ProbeTimeout: 2 * time.Second, Workers: 4, MinWorkers: 4, Queue: 16})
		h.r = r
		session := h.register(nil)
		h.fw.mode.Store("404")
		if res := h.post("/registry/heartbeat", workerToken, h.beatBody(session, nil)); res.status != 200 {
			t.Fatalf("unexpected reply to the degrading heartbeat; got %d %s; want 200", res.status, res.body)
		}
		if info, err := h.ds.Session(t.Context(), session, h.clock()); err != nil || !info.Degraded {
			t.Fatalf("unexpected session after a rejected probe; got %+v, %v; want degraded (A's probe off the pool)", info, err)
		}
		bodyA := h.beatBody(session, nil)
		release := holdLateOffPool(t, h, r, obs, func() response { return h.do(r, "POST", "/registry/heartbeat", workerToken, bodyA) })
		if res := h.do(r2, "POST", "/registry/heartbeat", workerToken, h.beatBody(session, map[string]any{"draining": true})); res.status != 200 || !json.Valid([]byte(res.body)) {
			t.Fatalf("unexpected reply to B; got %d %s; want 200", res.status, res.body)
		}
		resA := release()
		if resA.status != 503 || resA.body != string(bodyBusy) {
			t.Errorf("unexpected reply to A, applied past its worker's wait; got %d %s; want 503 %s unhandled", resA.status, resA.body, bodyBusy)
		}
		if got := obs.last(); got != "stale" {
			t.Errorf("unexpected outcome of A; got %q; want stale", got)
		}
		info, err := h.ds.Session(t.Context(), session, h.clock())
		if err != nil {
			t.Fatal(err)
		}
		if !info.Draining {
			t.Errorf("unexpected session draining %v after the worker's newer heartbeat said draining; want true (the late one, sent before, not applied after it)", info.Draining)
		}
	})
}
