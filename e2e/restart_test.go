package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/tools/redistest"
)

// Restarting pinboard itself under a live fleet: what an operator does on
// every deploy of a single memory: node.

// restartInPlace starts pinboard again on old's port, token, lease and
// extra environment, as a supervisor restarting it does: no wait between
// the old process's end and the new one's bind (SO_REUSEADDR: the old
// connections in TIME_WAIT do not hold the port).
func restartInPlace(t *testing.T, old *Pinboard, env []string) *Pinboard {
	t.Helper()
	bin, err := pinboardBinary()
	if err != nil {
		t.Fatal(err)
	}
	port := strings.TrimPrefix(old.URL, "http://127.0.0.1:")
	penv := append(scrubbedEnv(),
		"PORT="+port,
		"HOST=127.0.0.1",
		"PINBOARD_TOKEN="+old.Token,
		"PINBOARD_PASSPORT="+passportJSON(),
		"REDIS_URL=memory:",
		"PINBOARD_LEASE_TTL_MS="+strconv.FormatInt(old.LeaseTTL.Milliseconds(), 10),
	)
	penv = append(penv, env...)
	p, err := startProc("pinboard(:"+port+", restarted)", runDir, penv, []string{bin})
	if err != nil {
		t.Fatal(err)
	}
	pb := &Pinboard{URL: old.URL, Token: old.Token, LeaseTTL: old.LeaseTTL, proc: p}
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("--- %s output ---\n%s", p.name, p.out)
		}
	})
	err = waitUp(p, startTimeout, func(ctx context.Context) error {
		r, err := do(ctx, http.MethodGet, pb.URL+"/livez", nil, nil)
		if err != nil {
			return err
		}
		if r.Status != http.StatusOK {
			return fmt.Errorf("GET /livez: %s", r)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("unexpected restart on the same port; got %v; want it up (R-SRV-1)\n%s", err, p.out)
	}
	return pb
}

// owners asks each id who serves it (retrying 503s: the cold-start
// quarantine) and returns worker names by id.
func owners(ctx context.Context, t *testing.T, pb *Pinboard, ids []string) map[string]string {
	t.Helper()
	got := map[string]string{}
	for _, id := range ids {
		w, r, err := whoamiAs(ctx, pb, id, "127.0.0.1")
		if err != nil {
			t.Fatalf("cannot ask who serves %s: %v %s", id, err, r)
		}
		got[id] = w
	}
	return got
}

// TestPinboardRestartedInPlace_RCS1_RPL1: a memory: pinboard with two
// live workers holding ids and a request in flight gets SIGTERM, restarts
// on the same port at once, then is SIGKILLed and restarted at once again.
// Each time: the request in flight finishes, readiness fails from the
// signal while liveness answers until exit, the exit is 0 and the log
// says why; the workers re-register with their instances (the restarted
// node answers their heartbeats 409 unknown session), and every id keeps
// its owner and its state — the cold-start quarantine (R-CS-1) holds the
// placements the new node cannot know yet until the owners re-claimed
// them, so no id gets a second owner (R-PL-1).
func TestPinboardRestartedInPlace_RCS1_RPL1(t *testing.T) {
	requireSuite(t)
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	const grace = 10 * time.Second
	admin, aenv := adminEnv(t)
	env := []string{aenv, "PINBOARD_TRUSTED_PROXIES=127.0.0.1", "PINBOARD_SHUTDOWN_GRACE_MS=" + strconv.FormatInt(grace.Milliseconds(), 10)}
	f := StartWarmFleet(t, ctx, FleetOptions{Workers: []string{"w1", "w2"}, Headroom: 8, PinboardEnv: env})
	pb := f.Pinboard

	var ids []string
	for i := range 8 {
		ids = append(ids, "restart-"+strconv.Itoa(i))
	}
	// Spread the ids over both workers: each on its own client IP.
	before := map[string]string{}
	for i, id := range ids {
		w, r, err := whoamiAs(ctx, pb, id, "10.0.0."+strconv.Itoa(i+1))
		if err != nil {
			t.Fatalf("cannot place %s: %v %s", id, err, r)
		}
		before[id] = w
		if r, err := do(ctx, http.MethodPost, pb.URL+"/counters/"+id+"/increment", nil, nil); err != nil || r.Status != http.StatusOK {
			t.Fatalf("cannot increment %s: %s %v", id, r, err)
		}
	}
	t.Logf("owners before: %v", before)

	checkSame := func(stage string, pb *Pinboard) {
		t.Helper()
		rctx, rcancel := context.WithTimeout(ctx, 3*pb.LeaseTTL+10*time.Second)
		defer rcancel()
		after := owners(rctx, t, pb, ids)
		for _, id := range ids {
			if after[id] != before[id] {
				t.Errorf("unexpected owner of %s %s; got %s; want %s, its owner before (R-PL-1, R-CS-1)", id, stage, after[id], before[id])
			}
			r, err := do(rctx, http.MethodGet, pb.URL+"/counters/"+id+"/value", nil, nil)
			if err != nil || r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"count":1`) {
				t.Errorf("unexpected value of %s %s; got %s %v; want the instance's state kept, count 1", id, stage, r, err)
			}
		}
		recs, r, err := pb.Workers(rctx)
		if err != nil || len(recs) != 2 {
			t.Errorf("unexpected workers %s; got %s %v; want both re-registered", stage, r, err)
		}
	}

	// 1. SIGTERM with a request in flight.
	mark := resolved(ctx, t, admin)
	slowDone := make(chan reply, 1)
	go func() {
		r, err := do(ctx, http.MethodGet, pb.URL+"/counters/"+ids[0]+"/slow?seconds=2", nil, nil)
		if err != nil {
			r.Body = []byte(err.Error())
		}
		slowDone <- r
	}()
	waitInFlight(ctx, t, admin, mark)
	pb.proc.signal(syscall.SIGTERM)
	sawNotReady := false
	for !pb.proc.exited() {
		ready, rerr := do(ctx, http.MethodGet, admin+"/readyz", nil, nil)
		live, lerr := do(ctx, http.MethodGet, admin+"/livez", nil, nil)
		if pb.proc.exited() {
			break // the answers may be from a process on its way out
		}
		if rerr == nil && ready.Status == http.StatusServiceUnavailable && strings.Contains(string(ready.Body), `"shuttingDown":true`) {
			sawNotReady = true
		} else if rerr == nil && sawNotReady {
			// Before the first 503 the signal may not have arrived yet.
			t.Errorf("unexpected readiness during the grace after it failed; got %s; want 503 shuttingDown", ready)
		}
		if lerr == nil && live.Status != http.StatusOK {
			t.Errorf("unexpected liveness during the grace; got %s; want 200 until exit", live)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !sawNotReady {
		t.Errorf("unexpected readiness: never saw 503 shuttingDown between SIGTERM and exit")
	}
	if r := <-slowDone; r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"slept"`) {
		t.Errorf("unexpected request in flight at SIGTERM; got %s; want 200 from the worker", r)
	}
	if code := pb.proc.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("unexpected exit code after SIGTERM; got %d; want 0", code)
	}
	for _, line := range []string{"shutting down", "signal=terminated", "pinboard stopped"} {
		if !strings.Contains(pb.Output(), line) {
			t.Errorf("unexpected log without %q:\n%s", line, pb.Output())
		}
	}

	pb2 := restartInPlace(t, pb, env)
	checkSame("after a SIGTERM restart", pb2)

	// 2. SIGKILL and an immediate restart on the same port: connections
	// to the old process's clients and workers are in TIME_WAIT.
	pb2.proc.kill()
	pb3 := restartInPlace(t, pb2, env)
	checkSame("after a SIGKILL restart", pb3)
	for _, w := range f.Workers {
		if w.proc.exited() {
			t.Errorf("unexpected worker %s exited across the restarts:\n%s", w.Name, w.Output())
		}
	}
}

// TestNodeRestartedInPlaceOnRedis_RSRV1_RPL1: one of two nodes on one
// Redis is SIGKILLed and restarted on the same port at once, then gets
// SIGTERM with a request in flight and is restarted at once again. The directory
// is in Redis, so the workers keep their sessions (no 409, no
// re-registration, even for the worker heartbeating through that node),
// the fleet stays warm (no cold-start quarantine: R-CS-1 is for a wiped
// store, not a restarted node) and every id keeps its owner through
// either node (R-SRV-1, R-PL-1).
func TestNodeRestartedInPlaceOnRedis_RSRV1_RPL1(t *testing.T) {
	requireSuite(t)
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	srv := redistest.StartServer(t)
	// The lease outlasts the restarted node's outage (the request in
	// flight, then a start): the worker heartbeating only through it —
	// as the harness points it, where a real fleet goes through a load
	// balancer to the other node — keeps its lease.
	const ttl = 6 * time.Second
	nodeEnv := []string{"PINBOARD_SHUTDOWN_GRACE_MS=10000"}
	f := StartMultiFleet(t, ctx, MultiFleetOptions{RedisURL: srv.URL(), Nodes: 2, Workers: []string{"w1", "w2"},
		Headroom: 8, LeaseTTL: ttl, NodeEnv: nodeEnv})
	if err := f.WarmUp(ctx); err != nil {
		t.Fatal(err)
	}
	sessions := map[string]string{}
	recs, r, err := f.Nodes[0].Workers(ctx)
	if err != nil || len(recs) != 2 {
		t.Fatalf("cannot list workers: %s %v", r, err)
	}
	for _, rec := range recs {
		sessions[rec.AdvertiseURL] = rec.SessionID
	}
	var ids []string
	before := map[string]string{}
	for i := range 8 {
		id := "redis-restart-" + strconv.Itoa(i)
		ids = append(ids, id)
		w, r, err := whoami(ctx, f.Nodes[i%2], id)
		if err != nil {
			t.Fatalf("cannot place %s: %v %s", id, err, r)
		}
		before[id] = w
	}
	t.Logf("owners before: %v", before)

	check := func(stage string, nodes ...*Pinboard) {
		t.Helper()
		for _, node := range nodes {
			h, r, err := node.Health(ctx)
			if err != nil || h.QuarantineMs == nil || *h.QuarantineMs != 0 {
				t.Errorf("unexpected health of %s %s; got %s %v; want quarantineMs 0 (R-CS-1)", node.URL, stage, r, err)
			}
			for _, id := range ids {
				r, err := do(ctx, http.MethodGet, node.URL+"/counters/"+id+"/whoami", nil, nil)
				if err != nil || r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"worker":"`+before[id]+`"`) {
					t.Errorf("unexpected answer for %s through %s %s; got %s %v; want 200 from %s (R-PL-1)", id, node.URL, stage, r, err, before[id])
				}
			}
			recs, r, err := node.Workers(ctx)
			if err != nil || len(recs) != 2 {
				t.Errorf("unexpected workers through %s %s; got %s %v; want both", node.URL, stage, r, err)
			}
			for _, rec := range recs {
				if sessions[rec.AdvertiseURL] != rec.SessionID {
					t.Errorf("unexpected session of %s %s; got %s; want %s kept (no re-registration)", rec.AdvertiseURL, stage, rec.SessionID, sessions[rec.AdvertiseURL])
				}
			}
		}
	}

	// SIGKILL node 1 and restart it at once on the same port, now with an
	// admin listener to see the request below reach it.
	admin, aenv := adminEnv(t)
	env := append([]string{"REDIS_URL=" + srv.URL(), aenv}, nodeEnv...)
	f.Nodes[1].proc.kill()
	n1 := restartInPlace(t, f.Nodes[1], env)
	check("after node 1's SIGKILL restart", f.Nodes[0], n1)

	// SIGTERM with a request in flight through node 1, and a restart.
	mark := resolved(ctx, t, admin)
	slowDone := make(chan reply, 1)
	go func() {
		r, err := do(ctx, http.MethodGet, n1.URL+"/counters/"+ids[1]+"/slow?seconds=1", nil, nil)
		if err != nil {
			r.Body = []byte(err.Error())
		}
		slowDone <- r
	}()
	waitInFlight(ctx, t, admin, mark)
	n1.proc.signal(syscall.SIGTERM)
	if r := <-slowDone; r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"slept"`) {
		t.Errorf("unexpected request in flight at SIGTERM; got %s; want 200 from the worker", r)
	}
	if !n1.proc.wait(15 * time.Second) {
		t.Fatalf("unexpected node still running after SIGTERM")
	}
	if code := n1.proc.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("unexpected exit code after SIGTERM; got %d; want 0", code)
	}
	n1 = restartInPlace(t, n1, env)
	check("after node 1's SIGTERM restart", f.Nodes[0], n1)
	for _, w := range f.Workers {
		if strings.Contains(w.Output(), "session unknown") {
			t.Errorf("unexpected worker %s told its session is unknown across a node's restart:\n%s", w.Name, w.Output())
		}
	}
}
