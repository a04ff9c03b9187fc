package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/tools/redistest"
)

// A split deployment on one Redis (R-SRV-1: stateless nodes that
// coordinate only through the store): the workers register and heartbeat
// with a registry node R only, clients call a data-plane node D only. D
// never hears from a worker, yet routes to every worker R admitted,
// because the sessions, placements and leases it reads are the ones R
// wrote to Redis.
//
// Both nodes log every request (PINBOARD_ACCESS_LOG_SAMPLE=1) and serve
// metrics, so the test can show the split held: no worker-scope registry
// call ever reached D, and no data-plane request ever reached R.
func TestSplitRegistryAndDataPlaneNodes_RSRV1(t *testing.T) {
	requireSuite(t)
	t.Parallel()
	// Heartbeats every second, the lease unhealthy one second before its
	// end (the harness defaults): four seconds leave a missed heartbeat
	// of slack on a loaded machine, and keep the two lease waits short.
	const ttl = 4 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 80*time.Second)
	defer cancel()

	srv := redistest.StartServer(t)
	regAdmin, regAdminEnv := adminEnv(t)
	dpAdmin, dpAdminEnv := adminEnv(t)
	token := randomHex(24) // one deployment: one passport, one token
	nodeEnv := []string{"REDIS_URL=" + srv.URL(), "PINBOARD_LOG_FORMAT=json", "PINBOARD_ACCESS_LOG_SAMPLE=1"}
	reg := StartPinboard(t, PinboardOptions{LeaseTTL: ttl, Token: token, Env: append(slices.Clip(nodeEnv), regAdminEnv)})
	dp := StartPinboard(t, PinboardOptions{LeaseTTL: ttl, Token: token, Env: append(slices.Clip(nodeEnv), dpAdminEnv)})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("registry node R is %s, data-plane node D is %s", reg.URL, dp.URL)
		}
	})

	// Both workers point at R (PINBOARD_URL): register, heartbeat,
	// release and deregister all go there. Small equal headroom, as the
	// shared fleet's, so ids from 127.0.0.1 spread over both (R-PL-3).
	workers := []*Worker{
		StartWorker(t, reg, WorkerOptions{Name: "w1", Headroom: sharedHeadroom}),
		StartWorker(t, reg, WorkerOptions{Name: "w2", Headroom: sharedHeadroom}),
	}
	for _, w := range workers {
		if _, err := w.WaitRegistered(ctx); err != nil {
			t.Fatal(err)
		}
	}
	byName := map[string]*Worker{}
	for _, w := range workers {
		byName[w.Name] = w
	}

	// 1. Cold start through D (R-CS-1): D's first placement attempt stamps
	// the quarantine in Redis, so R reports it too; D places once it ends.
	first := time.Now()
	r, err := do(ctx, http.MethodGet, dp.URL+"/counters/warmup/value", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != http.StatusServiceUnavailable {
		t.Errorf("unexpected first placement on a fresh Redis; got %s; want 503 (cold-start quarantine, R-CS-1)", r)
	}
	// R read the stamp's absence into its client-side cache at start (its
	// health check); Redis's invalidation reaches it a millisecond or so
	// after D's answer reaches the test, so R is polled, within the
	// quarantine.
	var hr reply
	for {
		var h Health
		h, hr, err = reg.Health(ctx)
		if err != nil {
			t.Fatalf("cannot read R's health: %s %v", hr, err)
		}
		if h.QuarantineMs != nil && *h.QuarantineMs > 0 {
			break
		}
		if time.Since(first) > ttl/2 {
			t.Errorf("unexpected quarantine on R after D's first placement attempt; got %s %v later; want quarantineMs > 0 (the stamp is shared through Redis, R-CS-1, R-REG-5)", hr, time.Since(first).Round(time.Millisecond))
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	wctx, wcancel := context.WithTimeout(ctx, 2*ttl+10*time.Second)
	r, err = getWithRetry(wctx, dp.URL+"/counters/warmup/value")
	wcancel()
	if err != nil || r.Status != http.StatusOK {
		t.Fatalf("cannot warm up through D: %s (err %v)", r, err)
	}

	// 2. Counters through D: sticky ids (R-PL-2), spread over both
	// workers (R-PL-1, R-PL-3), state kept on the owner (R-DP-1).
	ids := make([]string, 16)
	owners := map[string]string{}
	perWorker := map[string]int{}
	for i := range ids {
		ids[i] = "split-" + strconv.Itoa(i)
		w, r, err := whoami(ctx, dp, ids[i])
		if err != nil {
			t.Fatalf("%s through D: %v (%s)", ids[i], err, r)
		}
		if byName[w] == nil {
			t.Fatalf("%s through D: unexpected worker %q: %s", ids[i], w, r)
		}
		owners[ids[i]] = w
		perWorker[w]++
	}
	if len(perWorker) != len(workers) {
		t.Fatalf("unexpected spread of %d new ids through D with equal headroom %d; got %v; want both workers used (R-PL-1, R-PL-3)", len(ids), sharedHeadroom, perWorker)
	}
	t.Logf("%d ids through D: %v", len(ids), perWorker)
	for round := range 3 {
		for _, id := range ids {
			w, r, err := whoami(ctx, dp, id)
			if err != nil || w != owners[id] {
				t.Fatalf("%s: unexpected owner on visit %d through D; got %s (err %v); want %s (R-PL-2)", id, round+2, r, err, owners[id])
			}
		}
	}
	for _, id := range ids {
		// Both nodes read the one placement from Redis (R-PL-1).
		for _, node := range []*Pinboard{reg, dp} {
			p, ok, err := node.Placement(ctx, "/counters", id)
			if err != nil || !ok || p.AdvertiseURL != byName[owners[id]].URL {
				t.Fatalf("%s: unexpected placement on %s; got %+v (found %v, err %v); want %s at %s", id, node.URL, p, ok, err, owners[id], byName[owners[id]].URL)
			}
		}
	}
	// One counter on each worker: increments reach the owner's instance.
	for name := range byName {
		id := ids[slices.IndexFunc(ids, func(id string) bool { return owners[id] == name })]
		checkIncrements(ctx, t, dp, id, name)
	}

	// 3. SSE and a WebSocket echo through D (R-DP-2).
	checkSSE(ctx, t, dp, "split-ticker", byName)
	checkWebSocketEcho(ctx, t, dp, "split-ticker")

	// 4. Both listings name both workers, with the same sessions: D reads
	// what R wrote (R-REG-4).
	regRecs := listing(ctx, t, reg)
	dpRecs := listing(ctx, t, dp)
	for _, w := range workers {
		rr, ok := regRecs[w.URL]
		if !ok {
			t.Errorf("unexpected listing on R; %s at %s missing: %v", w.Name, w.URL, regRecs)
			continue
		}
		dr, ok := dpRecs[w.URL]
		if !ok {
			t.Errorf("unexpected listing on D; %s at %s missing: %v (R-SRV-1: the registry lives in Redis, not in the node it was sent to)", w.Name, w.URL, dpRecs)
			continue
		}
		if rr.ClientID != dr.ClientID || rr.SessionID != dr.SessionID || rr.ClientID == "" || rr.SessionID == "" {
			t.Errorf("%s: unexpected records; R lists %+v, D lists %+v; want one session", w.Name, rr, dr)
		}
	}
	if len(regRecs) != len(workers) || len(dpRecs) != len(workers) {
		t.Errorf("unexpected listing sizes; R %d, D %d; want %d each", len(regRecs), len(dpRecs), len(workers))
	}
	if t.Failed() {
		t.FailNow()
	}

	// 5. SIGKILL the owner of ids[0]. D learns of the death only through
	// the lease R stops renewing in Redis: its ids re-place on the
	// survivor at their next request after the lease (R-LS-2), never
	// before it (R-PL-1), and once re-placed D never forwards them to the
	// dead worker again.
	victim := byName[owners[ids[0]]]
	var survivor *Worker
	for _, w := range workers {
		if w != victim {
			survivor = w
		}
	}
	var victimIDs, survivorIDs []string
	for _, id := range ids {
		if owners[id] == victim.Name {
			victimIDs = append(victimIDs, id)
		} else {
			survivorIDs = append(survivorIDs, id)
		}
	}
	leaseFloor, err := victim.LeaseFloor(ctx) // asks R
	if err != nil {
		t.Fatal(err)
	}
	victim.Kill()
	killed := time.Now()
	t.Logf("killed %s owning %d of %d ids", victim.Name, len(victimIDs), len(ids))

	// The survivor's ids keep working through the lease.
	if w, r, err := whoami(ctx, dp, survivorIDs[0]); err != nil || w != survivor.Name {
		t.Errorf("%s: unexpected answer through D during the dead worker's lease; got %s (err %v); want 200 from %s", survivorIDs[0], r, err, survivor.Name)
	}

	replaced := map[string]time.Time{}
	deadline := killed.Add(ttl + 15*time.Second)
	for {
		for _, id := range victimIDs {
			w, r := answerAfterKill(ctx, t, dp, id, victim.Name)
			switch {
			case w == "" && !replaced[id].IsZero():
				t.Fatalf("%s: D forwarded to the dead owner after the id re-placed on %s: %s (R-LS-2)", id, survivor.Name, r)
			case w == "":
				// The dead owner's lease still runs (R-DP-4).
			case w != survivor.Name:
				t.Fatalf("%s: unexpected owner after the kill; got %s; want %s (the only live worker)", id, r, survivor.Name)
			case replaced[id].IsZero():
				replaced[id] = time.Now()
			}
		}
		if len(replaced) == len(victimIDs) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("unexpected failover through D; %d of %d ids re-placed %v after the kill (lease %v)", len(replaced), len(victimIDs), time.Since(killed).Round(time.Millisecond), ttl)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var earliest, latest time.Time
	for _, at := range replaced {
		if earliest.IsZero() || at.Before(earliest) {
			earliest = at
		}
		if at.After(latest) {
			latest = at
		}
	}
	t.Logf("D re-placed %d ids %v to %v after the kill (lease %v)", len(victimIDs),
		earliest.Sub(killed).Round(time.Millisecond), latest.Sub(killed).Round(time.Millisecond), ttl)
	// Not before the lease R reported just before the kill ran out (one
	// owner at a time, R-PL-1).
	if earliest.Before(leaseFloor) {
		t.Errorf("unexpected early re-placement through D; %v after the kill, %v before the lease R reported ended (R-PL-1)", earliest.Sub(killed).Round(time.Millisecond), leaseFloor.Sub(earliest).Round(time.Millisecond))
	}

	// Converged: every id answers from its owner, D's failures to reach a
	// worker stop growing (nothing goes to the dead one), and both nodes
	// name the survivor.
	upstreamBefore := sumMetric(scrapeMetrics(ctx, t, dpAdmin), "pinboard_proxy_upstream_errors_total{")
	for round := range 3 {
		for _, id := range ids {
			want := owners[id]
			if want == victim.Name {
				want = survivor.Name
			}
			if w, r, err := whoami(ctx, dp, id); err != nil || w != want {
				t.Fatalf("%s: unexpected answer through D after convergence (round %d); got %s (err %v); want 200 from %s", id, round+1, r, err, want)
			}
		}
	}
	if after := sumMetric(scrapeMetrics(ctx, t, dpAdmin), "pinboard_proxy_upstream_errors_total{"); after != upstreamBefore {
		t.Errorf("unexpected upstream errors on D after convergence; got %v more; want none (nothing forwarded to the dead worker)", after-upstreamBefore)
	}
	for _, id := range victimIDs {
		for _, node := range []*Pinboard{reg, dp} {
			p, ok, err := node.Placement(ctx, "/counters", id)
			if err != nil || !ok || p.AdvertiseURL != survivor.URL {
				t.Errorf("%s: unexpected placement on %s after convergence; got %+v (found %v, err %v); want %s", id, node.URL, p, ok, err, survivor.URL)
			}
		}
	}
	// The dead worker leaves both listings (R-LS-2, R-REG-4).
	for _, node := range []*Pinboard{reg, dp} {
		uctx, ucancel := context.WithTimeout(ctx, 10*time.Second)
		if err := waitUnlisted(uctx, node, victim.URL); err != nil {
			t.Errorf("unexpected listing after the kill: %v", err)
		}
		ucancel()
	}

	// The split held for the whole test.
	checkSplit(ctx, t, reg, dp, regAdmin, dpAdmin)
}

// checkIncrements increments /counters/{id} twice through pb and checks
// every answer comes from worker with the count it should have (R-DP-1).
func checkIncrements(ctx context.Context, t *testing.T, pb *Pinboard, id, worker string) {
	t.Helper()
	read := func(method, path string) counterValue {
		t.Helper()
		r, err := do(ctx, method, pb.URL+"/counters/"+id+path, nil, nil)
		if err != nil || r.Status != http.StatusOK {
			t.Fatalf("unexpected answer; got %s (err %v); want 200", r, err)
		}
		var v counterValue
		if err := r.JSON(&v); err != nil {
			t.Fatal(err)
		}
		if v.ID != id || v.Worker != worker {
			t.Fatalf("unexpected counter; got %+v; want id %s on %s", v, id, worker)
		}
		return v
	}
	v0 := read(http.MethodGet, "/value")
	for i := 1; i <= 2; i++ {
		if v := read(http.MethodPost, "/increment"); v.Count != v0.Count+i {
			t.Fatalf("unexpected count after increment %d; got %+v; want %d", i, v, v0.Count+i)
		}
	}
	if v := read(http.MethodGet, "/value"); v.Count != v0.Count+2 {
		t.Fatalf("unexpected value after two increments; got %+v; want count %d", v, v0.Count+2)
	}
}

// checkSSE reads a short event stream from /tickers/{id}/events through
// pb: every event arrives, in order, from the worker the registry names
// as the ticker's owner. No timing is judged (TestSSEStreamsEvents_RDP2
// does that on one node).
func checkSSE(ctx context.Context, t *testing.T, pb *Pinboard, id string, workers map[string]*Worker) {
	t.Helper()
	const count = 3
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	url := fmt.Sprintf("%s/tickers/%s/events?count=%d&interval=0.1", pb.URL, id, count)
	res := openEventStream(ctx, t, url, 250*time.Millisecond)
	defer res.Body.Close()
	type event struct {
		N      int    `json:"n"`
		Worker string `json:"worker"`
	}
	events, _ := readEvents[event](t, res.Body)
	if len(events) != count {
		t.Fatalf("unexpected event count; got %d; want %d", len(events), count)
	}
	p, ok, err := pb.Placement(ctx, "/tickers", id)
	if err != nil || !ok {
		t.Fatalf("cannot read the placement of /tickers/%s: found %v, err %v", id, ok, err)
	}
	for i, ev := range events {
		w := workers[ev.Worker]
		if ev.N != i || w == nil || w.URL != p.AdvertiseURL {
			t.Errorf("unexpected event %d; got %+v; want n=%d from the owner at %s", i, ev, i, p.AdvertiseURL)
		}
	}
}

// checkWebSocketEcho opens /tickers/{id}/ws through pb, echoes a text and
// a binary message, and completes the close handshake (R-DP-2).
func checkWebSocketEcho(ctx context.Context, t *testing.T, pb *Pinboard, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	url := "ws" + strings.TrimPrefix(pb.URL, "http") + "/tickers/" + id + "/ws"
	c := dialWebSocket(ctx, t, url, 250*time.Millisecond)
	echoEach(t, c, []wsMessage{
		{wsOpText, []byte("hello through the data-plane node")},
		{wsOpBinary, []byte{0, 1, 2, 0xff}},
	})
	if code := c.Close(1000, 5*time.Second); code != 1000 {
		t.Errorf("unexpected close handshake; got peer code %d; want 1000 (0: no close frame came back)", code)
	}
}

// listing is pb's GET /registry/workers by advertise URL.
func listing(ctx context.Context, t *testing.T, pb *Pinboard) map[string]WorkerRecord {
	t.Helper()
	recs, r, err := pb.Workers(ctx)
	if err != nil || r.Status != http.StatusOK {
		t.Fatalf("cannot list workers on %s: %s %v", pb.URL, r, err)
	}
	out := map[string]WorkerRecord{}
	for _, rec := range recs {
		out[rec.AdvertiseURL] = rec
	}
	return out
}

// accessLine is one line of pinboard's JSON access log.
type accessLine struct {
	Msg    string `json:"msg"`
	Method string `json:"method"`
	Path   string `json:"path"`
}

// accessLog returns every access log line pb printed so far
// (PINBOARD_LOG_FORMAT=json, PINBOARD_ACCESS_LOG_SAMPLE=1).
func accessLog(pb *Pinboard) []accessLine {
	var out []accessLine
	for _, line := range strings.Split(pb.Output(), "\n") {
		var l accessLine
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "access" {
			out = append(out, l)
		}
	}
	return out
}

// workerScope reports whether path is a registry route only workers call
// (R-TR-2: pinboard:worker).
func workerScope(path string) bool {
	switch path {
	case "/registry/register", "/registry/heartbeat", "/registry/release", "/registry/deregister":
		return true
	}
	return false
}

// sumMetric adds up every sample whose "name{labels}" key starts with
// prefix.
func sumMetric(m map[string]float64, prefix string) float64 {
	var n float64
	for k, v := range m {
		if strings.HasPrefix(k, prefix) {
			n += v
		}
	}
	return n
}

// checkSplit shows, from both nodes' access logs and metrics, that the
// workers talked only to reg and the clients only to dp.
func checkSplit(ctx context.Context, t *testing.T, reg, dp *Pinboard, regAdmin, dpAdmin string) {
	t.Helper()
	var regBeats, regData, dpWorker, dpData int
	for _, l := range accessLog(reg) {
		switch {
		case l.Path == "/registry/heartbeat":
			regBeats++
		case !strings.HasPrefix(l.Path, "/registry/"):
			regData++
		}
	}
	for _, l := range accessLog(dp) {
		switch {
		case workerScope(l.Path):
			dpWorker++
			if dpWorker <= 3 {
				t.Errorf("unexpected worker call on D: %s %s", l.Method, l.Path)
			}
		case strings.HasPrefix(l.Path, "/counters/") || strings.HasPrefix(l.Path, "/tickers/"):
			dpData++
		}
	}
	t.Logf("access logs: R %d heartbeats, %d data-plane requests; D %d worker calls, %d data-plane requests", regBeats, regData, dpWorker, dpData)
	// The positive controls: both logs are on and see their traffic.
	if regBeats == 0 {
		t.Errorf("unexpected access log on R; no /registry/heartbeat line; want the workers' heartbeats (is the access log on?)")
	}
	if dpData == 0 {
		t.Errorf("unexpected access log on D; no data-plane line; want the test's requests (is the access log on?)")
	}
	if dpWorker > 0 {
		t.Errorf("unexpected worker calls on D; got %d; want 0 (the workers know only R)", dpWorker)
	}
	if regData > 0 {
		t.Errorf("unexpected data-plane requests on R; got %d; want 0 (the clients know only D)", regData)
	}

	rm, dm := scrapeMetrics(ctx, t, regAdmin), scrapeMetrics(ctx, t, dpAdmin)
	// The positive controls: each family the checks below want at 0 on
	// one node counts on the other, so a renamed metric fails here
	// rather than passing them unseen.
	if n := rm[`pinboard_registry_heartbeats_total{outcome="ok"}`]; n == 0 {
		t.Errorf("unexpected heartbeats on R; got 0 ok; want the workers' heartbeats")
	}
	if n := sumMetric(rm, "pinboard_registry_probes_total{"); n == 0 {
		t.Errorf("unexpected challenge probes on R; got 0; want the heartbeats' probes")
	}
	if n := sumMetric(dm, "pinboard_proxy_requests_total{"); n == 0 {
		t.Errorf("unexpected data-plane requests on D; got 0 in its metrics; want the test's requests")
	}
	if n := sumMetric(dm, "pinboard_registry_heartbeats_total{") + sumMetric(dm, "pinboard_registry_probes_total{"); n != 0 {
		t.Errorf("unexpected registry work on D; got %v heartbeats and challenge probes; want 0", n)
	}
	if n := sumMetric(rm, "pinboard_proxy_requests_total{"); n != 0 {
		t.Errorf("unexpected data-plane requests on R; got %v in its metrics; want 0", n)
	}
}
