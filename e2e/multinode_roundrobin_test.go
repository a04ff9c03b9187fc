package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/tools/redistest"
)

// roundRobin stands for a load balancer in front of several pinboard
// nodes: each request, whatever its connection, goes to the next node in
// turn. It keeps every heartbeat exchange: which node answered, when the
// request went in and the answer came back, and both bodies.
type roundRobin struct {
	URL   string
	next  atomic.Uint64
	mu    sync.Mutex
	beats []rrBeat
}

type rrBeat struct {
	node       int
	sent, back time.Time
	status     int
	req, ack   []byte
}

// rrAck is the part of a heartbeat answer these tests read.
type rrAck struct {
	Draining      bool     `json:"draining"`
	DrainDeadline *float64 `json:"drainDeadline"`
	Degraded      bool     `json:"degraded"`
	Messages      []struct {
		MsgID    string   `json:"msgId"`
		Type     string   `json:"type"`
		ID       string   `json:"id"`
		Deadline *float64 `json:"deadline"`
	} `json:"messages"`
}

func (b rrBeat) decode(t *testing.T) (acks []string, a rrAck) {
	t.Helper()
	var req struct {
		Acks []string `json:"acks"`
	}
	if err := json.Unmarshal(b.req, &req); err != nil {
		t.Fatalf("cannot decode a heartbeat request %q: %v", b.req, err)
	}
	if b.status == http.StatusOK {
		if err := json.Unmarshal(b.ack, &a); err != nil {
			t.Fatalf("cannot decode a heartbeat answer %q: %v", b.ack, err)
		}
	}
	return req.Acks, a
}

// startRoundRobinNodes starts three pinboard nodes on one redis-server
// of the test's own and the round-robin balancer in front of them; lb is
// the balancer as workers see it (the nodes' token and lease).
func startRoundRobinNodes(t *testing.T) (nodes []*Pinboard, rr *roundRobin, lb *Pinboard) {
	t.Helper()
	srv := redistest.StartServer(t)
	token := randomHex(24)
	nodes = make([]*Pinboard, 3)
	for i := range nodes {
		nodes[i] = StartPinboard(t, PinboardOptions{Token: token, Env: []string{"REDIS_URL=" + srv.URL()}})
	}
	rr = startRoundRobin(t, nodes)
	return nodes, rr, &Pinboard{URL: rr.URL, Token: token, LeaseTTL: nodes[0].LeaseTTL}
}

func startRoundRobin(t *testing.T, nodes []*Pinboard) *roundRobin {
	t.Helper()
	rr := &roundRobin{}
	proxies := make([]*httputil.ReverseProxy, len(nodes))
	for i, n := range nodes {
		u, err := url.Parse(n.URL)
		if err != nil {
			t.Fatal(err)
		}
		p := httputil.NewSingleHostReverseProxy(u)
		p.Transport = &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 8}
		proxies[i] = p
	}
	rr.URL = serveLocal(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		node := int((rr.next.Add(1) - 1) % uint64(len(nodes)))
		if r.URL.Path != "/registry/heartbeat" {
			proxies[node].ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		rec := &tapWriter{ResponseWriter: w}
		sent := time.Now()
		proxies[node].ServeHTTP(rec, r)
		rr.mu.Lock()
		rr.beats = append(rr.beats, rrBeat{node: node, sent: sent, back: time.Now(), status: rec.status, req: body, ack: rec.buf.Bytes()})
		rr.mu.Unlock()
	}))
	return rr
}

// tapWriter copies what it writes.
type tapWriter struct {
	http.ResponseWriter
	status int
	buf    bytes.Buffer
}

func (w *tapWriter) WriteHeader(code int) { w.status = code; w.ResponseWriter.WriteHeader(code) }
func (w *tapWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	w.buf.Write(p)
	return w.ResponseWriter.Write(p)
}

// since returns the heartbeat exchanges whose request went in after t0:
// a node read each of them after whatever was done before t0.
func (rr *roundRobin) since(t0 time.Time) []rrBeat {
	return rr.beatsWhere(func(b rrBeat) bool { return b.sent.After(t0) })
}

// answeredSince returns the heartbeat exchanges whose answer came back
// after t0: every answer that can carry what was done from t0 on,
// including those to requests that went in before t0 and were still
// being handled (a heartbeat's challenge probe takes milliseconds).
func (rr *roundRobin) answeredSince(t0 time.Time) []rrBeat {
	return rr.beatsWhere(func(b rrBeat) bool { return b.back.After(t0) })
}

func (rr *roundRobin) beatsWhere(keep func(rrBeat) bool) []rrBeat {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	var out []rrBeat
	for _, b := range rr.beats {
		if keep(b) {
			out = append(out, b)
		}
	}
	return out
}

// waitBeats waits (15 s at most) until ok accepts the exchanges sent
// after t0.
func (rr *roundRobin) waitBeats(ctx context.Context, t *testing.T, t0 time.Time, what string, ok func([]rrBeat) bool) []rrBeat {
	t.Helper()
	return rr.waitFor(ctx, t, func() []rrBeat { return rr.since(t0) }, what, ok)
}

// waitFor waits (15 s at most) until ok accepts the exchanges list
// returns.
func (rr *roundRobin) waitFor(ctx context.Context, t *testing.T, list func() []rrBeat, what string, ok func([]rrBeat) bool) []rrBeat {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		bs := list()
		if ok(bs) {
			return bs
		}
		if time.Now().After(deadline) || !sleepCtx(ctx, 50*time.Millisecond) {
			t.Fatalf("no heartbeats %s within 15s; exchanges since: %d", what, len(bs))
		}
	}
}

// listingOf is GET /registry/workers of one node, without the fields that
// move between two reads (the lease left).
func listingOf(ctx context.Context, t *testing.T, pb *Pinboard) []string {
	t.Helper()
	recs, r, err := pb.Workers(ctx)
	if err != nil || r.Status != http.StatusOK {
		t.Fatalf("cannot list workers on %s: %s (err %v)", pb.URL, r, err)
	}
	var out []string
	for _, rec := range recs {
		rec.ExpiresInMs = nil
		b, _ := json.Marshal(rec)
		out = append(out, string(b))
	}
	slices.Sort(out)
	return out
}

// Every call on a different node (R-SRV-1): three pinboard nodes on one
// Redis behind a round-robin balancer that moves every request — the
// workers' register, each heartbeat, their releases and deregister — to
// the next node, while operators and clients call the nodes directly.
// Checks that nothing a node decides lives on that node only:
//   - the workers listing is the same from every node;
//   - wind_down queued through two nodes is delivered in order, in one
//     heartbeat answer each, acked by the next heartbeat (through
//     whichever node the balancer picks; logged), and never delivered
//     again (R-CM-1); the worker's release of
//     the wound-down id frees it for a claim through any node at once;
//   - a timed operator drain set through one node counts down the same
//     in the answers of every node, and its undrain through another ends
//     it in all of them (R-LS-5);
//   - a failed probe on one node's heartbeat keeps new ids off the worker
//     through every node, and a pass on another's clears it (R-LS-3);
//   - a voided session and a deregistered one re-place their ids at the
//     next request through any node.
func TestMultiNodeRoundRobin_RCM1_RLS3_RLS5(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	nodes, rr, lb := startRoundRobinNodes(t)

	// A stands behind a probe front (R-LS-3) and has far more headroom
	// than B: new ids go to A while it is eligible.
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	front := startProbeFront(t, "http://127.0.0.1:"+strconv.Itoa(port))
	a := StartWorker(t, lb, WorkerOptions{Name: "A", Port: port, Headroom: 1000,
		Env: []string{"ADVERTISE_URL=" + front.URL}})
	a.URL = front.URL
	b := StartWorker(t, lb, WorkerOptions{Name: "B", Headroom: 1})
	for _, w := range []*Worker{a, b} {
		if _, err := w.WaitRegistered(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := getWithRetry(ctx, nodes[0].URL+"/counters/warm/whoami"); err != nil {
		t.Fatal(err)
	}
	recA, ok := record(ctx, t, nodes[0], a.URL)
	if !ok {
		t.Fatalf("A is not listed")
	}
	// Heartbeats have gone through every node.
	rr.waitBeats(ctx, t, time.Time{}, "through every node", func(bs []rrBeat) bool {
		seen := map[int]bool{}
		for _, b := range bs {
			seen[b.node] = true
		}
		return len(seen) == len(nodes)
	})

	// The listing: the same from every node once each has read the last
	// change. Redis pushes the invalidations of a node's cached rows, it
	// does not wait for them, and a heartbeat or a placement through
	// another node may land between two nodes' reads: on a loaded machine
	// node 1 read A's headroom at 1000 just after node 0 read the 999 the
	// warm-up placement left. A node that never learns of a change fails.
	for deadline := time.Now().Add(10 * time.Second); ; {
		want, diff := listingOf(ctx, t, nodes[0]), ""
		for i, n := range nodes[1:] {
			if got := listingOf(ctx, t, n); !slices.Equal(got, want) {
				diff = fmt.Sprintf("node %d's %v; node 0's %v", i+1, got, want)
				break
			}
		}
		if diff == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("unexpected listings still different 10s on; got %s", diff)
		}
		sleepCtx(ctx, 100*time.Millisecond)
	}

	// Wind-down (R-CM-1): two ids on A, each wound down through another
	// node.
	for _, id := range []string{"wd-1", "wd-2"} {
		if c := increment(ctx, t, nodes[2], "/counters", id); c.Worker != "A" || c.Count != 1 {
			t.Fatalf("unexpected first answer for %s; got %+v; want a new activation on A", id, c)
		}
	}
	queued := time.Now()
	windDown(ctx, t, nodes[1], "wd-1", "5")
	windDown(ctx, t, nodes[2], "wd-2", "5")
	queuedBack := time.Now()
	var order []string
	delivered := map[string]int{}  // msgId → answers carrying it
	ackedBy := map[string]rrBeat{} // msgId → the exchange whose request acked it
	deliveredBy := map[string]rrBeat{}
	// A heartbeat sent just before the wind-downs were queued may carry
	// them in its answer, and the worker then acks them in its next: look
	// at every answer that came back after they were queued.
	rr.waitFor(ctx, t, func() []rrBeat { return rr.answeredSince(queued) }, "delivering and acking both wind-downs, six exchanges from the ack on", func(bs []rrBeat) bool {
		order, delivered, ackedBy, deliveredBy = nil, map[string]int{}, map[string]rrBeat{}, map[string]rrBeat{}
		after := 0 // exchanges since both were acked
		for _, b := range bs {
			acks, ack := b.decode(t)
			// Both workers' heartbeats pass; only A's carry messages.
			for _, m := range ack.Messages {
				// The deadline counts down from when it was set, on
				// whichever node delivers it (1 ms of rounding).
				lo := 5 - b.back.Sub(queued).Seconds() - 0.001
				hi := 5 - b.sent.Sub(queuedBack).Seconds() + 0.001
				if m.Type != "wind_down" || m.Deadline == nil || *m.Deadline < lo || *m.Deadline > hi {
					t.Fatalf("unexpected message in node %d's answer; got %s; want wind_down with a deadline within [%.3f, %.3f]", b.node, b.ack, lo, hi)
				}
				if delivered[m.MsgID] == 0 {
					order = append(order, m.ID)
					deliveredBy[m.MsgID] = b
				}
				delivered[m.MsgID]++
			}
			for _, id := range acks {
				if _, ok := ackedBy[id]; !ok && delivered[id] > 0 {
					ackedBy[id] = b
				}
			}
			if len(ackedBy) == 2 {
				after++
			}
		}
		return len(ackedBy) == 2 && after >= 6
	})
	if !slices.Equal(order, []string{"wd-1", "wd-2"}) {
		t.Fatalf("unexpected delivery order; got %v; want [wd-1 wd-2]", order)
	}
	for msg, n := range delivered {
		if n != 1 {
			t.Fatalf("unexpected deliveries of message %s; got %d heartbeat answers carrying it; want 1 (acked through node %d, delivered through node %d)", msg, n, ackedBy[msg].node, deliveredBy[msg].node)
		}
		t.Logf("message %s delivered through node %d, acked through node %d", msg, deliveredBy[msg].node, ackedBy[msg].node)
	}
	// The worker releases the idle wound-down ids (through whichever
	// node); a request through every node then finds them free.
	for _, id := range []string{"wd-1", "wd-2"} {
		if err := awaitFreed(ctx, nodes[0], "/counters", id, time.Now().Add(15*time.Second)); err != nil {
			t.Fatalf("the wound-down %s was never released: %v", id, err)
		}
		for i, n := range nodes {
			r, err := do(ctx, http.MethodPost, n.URL+"/counters/"+id+"/increment", nil, nil)
			var c counterReply
			if err != nil || r.Status != http.StatusOK || r.JSON(&c) != nil || c.Count != i+1 {
				t.Fatalf("unexpected answer through node %d for the released %s; got %s (err %v); want 200 with count %d", i, id, r, err, i+1)
			}
		}
	}

	// Timed drain (R-LS-5) through node 1; every node's answers count
	// down to the same deadline.
	const deadline = 8.0
	drainSent := time.Now()
	r, err := do(ctx, http.MethodPost, nodes[1].URL+"/registry/drain", nodes[1].operator(),
		strings.NewReader(`{"clientId":"`+recA.ClientID+`","deadline":8}`))
	drainBack := time.Now()
	if err != nil || r.Status != http.StatusOK {
		t.Fatalf("cannot drain A: %v %s", err, r)
	}
	bs := rr.waitBeats(ctx, t, drainBack, "from every node with A's drain deadline", func(bs []rrBeat) bool {
		seen := map[int]bool{}
		for _, b := range bs {
			if _, ack := b.decode(t); ack.DrainDeadline != nil {
				seen[b.node] = true
			}
		}
		return len(seen) == len(nodes)
	})
	for _, b := range bs {
		_, ack := b.decode(t)
		if ack.DrainDeadline == nil {
			continue // B's
		}
		// The node read its clock between sent and back; the deadline
		// was set between drainSent and drainBack (1 ms of rounding).
		lo := deadline - b.back.Sub(drainSent).Seconds() - 0.001
		hi := deadline - b.sent.Sub(drainBack).Seconds() + 0.001
		if !ack.Draining || *ack.DrainDeadline < lo || *ack.DrainDeadline > hi {
			t.Fatalf("unexpected drain in node %d's answer; got draining %v deadline %v; want true and within [%.3f, %.3f]", b.node, ack.Draining, *ack.DrainDeadline, lo, hi)
		}
	}
	if err := nodes[2].Undrain(ctx, recA.ClientID); err != nil {
		t.Fatalf("cannot undrain A: %v", err)
	}
	// Taken once the undrain is answered: a heartbeat sent while it was
	// on its way may still be answered with the drain.
	undrained := time.Now()
	// Every answer to a heartbeat sent after the undrain says A is not
	// draining, whichever node gave it.
	rr.waitBeats(ctx, t, undrained, "from every node after the undrain", func(bs []rrBeat) bool {
		seen := map[int]bool{}
		for _, b := range bs {
			seen[b.node] = true
		}
		return len(seen) == len(nodes) && len(bs) >= 2*len(nodes)
	})
	for _, b := range rr.since(undrained) {
		if _, ack := b.decode(t); ack.Draining || ack.DrainDeadline != nil {
			t.Fatalf("unexpected drain in node %d's answer after the undrain: %s", b.node, b.ack)
		}
	}
	for i, n := range nodes {
		if rec, ok := record(ctx, t, n, a.URL); !ok || rec.Draining == nil || *rec.Draining {
			t.Fatalf("unexpected listing of A on node %d after the undrain: %+v", i, rec)
		}
	}

	// Degraded (R-LS-3): the first failed probe, whichever node made it,
	// keeps new ids off A through every node.
	failed := time.Now()
	front.set(probeFail)
	var degradedBy int
	rr.waitBeats(ctx, t, failed, "answered degraded", func(bs []rrBeat) bool {
		for _, b := range bs {
			if _, ack := b.decode(t); ack.Degraded {
				degradedBy = b.node
				return true
			}
		}
		return false
	})
	for i, n := range nodes {
		for j := range 2 {
			id := "dg-" + strconv.Itoa(i) + "-" + strconv.Itoa(j)
			if c := increment(ctx, t, n, "/counters", id); c.Worker != "B" || c.Count != 1 {
				t.Fatalf("unexpected owner of new id %s through node %d while A is degraded (by node %d's probe); got %+v; want a new activation on B", id, i, degradedBy, c)
			}
		}
	}
	passed := time.Now()
	front.set(probePass)
	var clearedBy int
	rr.waitBeats(ctx, t, passed, "answered without degraded after the probe passed", func(bs []rrBeat) bool {
		for _, b := range bs {
			// A's answers carry the lease A asked with; B's never
			// say degraded: look for A's first answer not degraded.
			if _, ack := b.decode(t); !ack.Degraded && strings.Contains(string(b.req), recA.SessionID) {
				clearedBy = b.node
				return true
			}
		}
		return false
	})
	t.Logf("degraded through node %d, cleared through node %d", degradedBy, clearedBy)
	for i, n := range nodes {
		id := "ok-" + strconv.Itoa(i)
		if c := increment(ctx, t, n, "/counters", id); c.Worker != "A" || c.Count != 1 {
			t.Fatalf("unexpected owner of new id %s through node %d once A's probe passed (through node %d); got %+v; want a new activation on A", id, i, clearedBy, c)
		}
	}

	// Voided (R-LS-3): one node's probe answered wrongly; the ids A owned
	// re-place on B at their next request through any node.
	voided := time.Now()
	front.set(probeWrong)
	rr.waitBeats(ctx, t, voided, "answered 409", func(bs []rrBeat) bool {
		for _, b := range bs {
			if b.status == http.StatusConflict {
				return true
			}
		}
		return false
	})
	for i, n := range nodes {
		id := "ok-" + strconv.Itoa(i)
		r, err := do(ctx, http.MethodPost, n.URL+"/counters/"+id+"/increment", nil, nil)
		var c counterReply
		if err != nil || r.Status != http.StatusOK || r.JSON(&c) != nil || c.Worker != "B" || c.Count != 1 {
			t.Fatalf("unexpected answer through node %d for %s after A was voided; got %s (err %v); want a new activation on B", i, id, r, err)
		}
	}

	// Deregistered: A registers again, takes new ids, then stops; its
	// deregister goes through one node and the next request for each of
	// its ids, through any node, re-places it on B.
	front.set(probePass)
	again := waitNewSession(ctx, t, nodes[1], a.URL, recA.SessionID, "A, after the probe passed,")
	for i := range nodes {
		id := "dr-" + strconv.Itoa(i)
		if c := increment(ctx, t, nodes[(i+1)%len(nodes)], "/counters", id); c.Worker != "A" || c.Count != 1 {
			t.Fatalf("unexpected owner of new id %s with A registered again (session %s); got %+v; want A", id, again.SessionID, c)
		}
	}
	if !a.Stop() {
		t.Fatalf("A did not stop")
	}
	for i, n := range nodes {
		id := "dr-" + strconv.Itoa(i)
		r, err := do(ctx, http.MethodPost, n.URL+"/counters/"+id+"/increment", nil, nil)
		var c counterReply
		if err != nil || r.Status != http.StatusOK || r.JSON(&c) != nil || c.Worker != "B" || c.Count != 1 {
			t.Fatalf("unexpected answer through node %d for %s after A deregistered; got %s (err %v); want a new activation on B", i, id, r, err)
		}
	}
}

// Epoch displacement across nodes (R-LS-4): blue registers app.test at
// epoch 1 through the round-robin balancer and every node routes its ids
// from its cache; green registers app.test at epoch 2 through another
// node. Blue's next heartbeat, through whichever node, gets 409
// superseded, and then every node routes app.test's ids, cached or new,
// to green only and lists green only.
func TestMultiNodeRoundRobinDisplacement_RLS4(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	nodes, _, lb := startRoundRobinNodes(t)
	// hostGet retries 503 (the cold start, R-CS-1) only while warm.
	warm := true
	hostGet := func(pb *Pinboard, id string) reply {
		t.Helper()
		for {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, pb.URL+"/counters/"+id+"/whoami", nil)
			req.Host = "app.test"
			res, err := httpClient.Do(req)
			if err != nil {
				t.Fatalf("cannot get %s through %s: %v", id, pb.URL, err)
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			r := reply{Status: res.StatusCode, Header: res.Header, Body: body}
			// 503 is the cold start (R-CS-1).
			if !warm || r.Status != http.StatusServiceUnavailable || !sleepCtx(ctx, 200*time.Millisecond) {
				return r
			}
		}
	}
	blue := StartWorker(t, lb, WorkerOptions{Name: "blue", Headroom: 100, Env: []string{"BIND_HOSTNAME=app.test", "BIND_ENV=blue", "BIND_EPOCH=1"}})
	if _, err := blue.WaitRegistered(ctx); err != nil {
		t.Fatal(err)
	}
	for i, n := range nodes {
		for _, id := range []string{"a", "b", "c"} {
			if r := hostGet(n, id); r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"worker":"blue"`) {
				t.Fatalf("unexpected answer for %s through node %d; got %s; want blue", id, i, r)
			}
		}
	}
	green := StartWorker(t, lb, WorkerOptions{Name: "green", Headroom: 100, Env: []string{"BIND_HOSTNAME=app.test", "BIND_ENV=green", "BIND_EPOCH=2"}})
	if _, err := green.WaitRegistered(ctx); err != nil {
		t.Fatal(err)
	}
	uctx, ucancel := context.WithTimeout(ctx, 15*time.Second)
	defer ucancel()
	if err := blue.WaitUnregistered(uctx); err != nil {
		t.Fatal(err)
	}
	warm = false
	for i, n := range nodes {
		for _, id := range []string{"a", "b", "c", "d"} {
			if r := hostGet(n, id); r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"worker":"green"`) {
				t.Fatalf("unexpected answer for %s through node %d after the displacement; got %s; want green", id, i, r)
			}
		}
		recs, r, err := n.Workers(ctx)
		if err != nil || len(recs) != 1 || recs[0].AdvertiseURL != green.URL {
			t.Fatalf("unexpected workers on node %d after the displacement; got %+v (%s, err %v); want green only", i, recs, r, err)
		}
	}
}

// A timed drain's deadline across nodes (R-LS-5): ids on A are cached on
// every node; A is drained through node 1 with a 2 s deadline while its
// heartbeats go round the nodes. Once the deadline has freed A's ids, the
// first request through node 0 re-places each on B, and the next through
// nodes 1 and 2, which had routed it to A from their caches, reach B's
// instance too: no node keeps the force-released row.
func TestMultiNodeRoundRobinDrainDeadline_RLS5(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	nodes, _, lb := startRoundRobinNodes(t)
	a := StartWorker(t, lb, WorkerOptions{Name: "A", Headroom: 1000})
	b := StartWorker(t, lb, WorkerOptions{Name: "B", Headroom: 1})
	for _, w := range []*Worker{a, b} {
		if _, err := w.WaitRegistered(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := getWithRetry(ctx, nodes[0].URL+"/counters/warm/whoami"); err != nil {
		t.Fatal(err)
	}
	recA, ok := record(ctx, t, nodes[0], a.URL)
	if !ok {
		t.Fatalf("A is not listed")
	}
	ids := []string{"dl-0", "dl-1", "dl-2"}
	for _, id := range ids {
		for i, n := range nodes {
			if c := increment(ctx, t, n, "/counters", id); c.Worker != "A" || c.Count != i+1 {
				t.Fatalf("unexpected answer for %s through node %d; got %+v; want A with count %d", id, i, c, i+1)
			}
		}
	}
	sent := time.Now()
	r, err := do(ctx, http.MethodPost, nodes[1].URL+"/registry/drain", nodes[1].operator(),
		strings.NewReader(`{"clientId":"`+recA.ClientID+`","deadline":2}`))
	if err != nil || r.Status != http.StatusOK {
		t.Fatalf("cannot drain A: %v %s", err, r)
	}
	if err := awaitFreed(ctx, nodes[2], "/counters", ids[0], sent.Add(2*time.Second+lb.LeaseTTL)); err != nil {
		t.Fatalf("A's ids were not freed at the drain deadline: %v", err)
	}
	for _, id := range ids {
		for i, n := range nodes {
			r, err := do(ctx, http.MethodPost, n.URL+"/counters/"+id+"/increment", nil, nil)
			var c counterReply
			if err != nil || r.Status != http.StatusOK || r.JSON(&c) != nil || c.Worker != "B" || c.Count != i+1 {
				t.Fatalf("unexpected answer for %s through node %d past A's drain deadline; got %s (err %v); want B with count %d", id, i, r, err, i+1)
			}
		}
	}
}
