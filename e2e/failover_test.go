package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// placeIDs places /counters/{prefix}0..n-1 and returns each id's owner.
func placeIDs(ctx context.Context, t *testing.T, pb *Pinboard, prefix string, n int) (ids []string, owners map[string]string) {
	t.Helper()
	owners = map[string]string{}
	for i := range n {
		id := prefix + strconv.Itoa(i)
		w, _, err := whoami(ctx, pb, id)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		owners[id] = w
	}
	return ids, owners
}

// answerAfterKill asks node once, after the worker named victim was
// SIGKILLed, which worker serves /counters/{id}: a live worker's name, or
// "" while the dead owner's lease still runs (502 for the unreachable
// owner, 503 while nothing can place; R-DP-4). An answer from victim, or
// any other, fails the test.
func answerAfterKill(ctx context.Context, t *testing.T, node *Pinboard, id, victim string) (string, reply) {
	t.Helper()
	w, r, err := answerOf(ctx, node, id)
	switch {
	case err != nil:
		t.Fatalf("%s: cannot ask %s after the kill: %v (%s)", id, node.URL, err, r)
	case r.Status == http.StatusOK && w == victim:
		t.Fatalf("%s: unexpected answer from the killed worker: %s", id, r)
	case r.Status != http.StatusOK && r.Status != http.StatusBadGateway && r.Status != http.StatusServiceUnavailable:
		t.Fatalf("%s: unexpected answer after the kill: %s", id, r)
	}
	return w, r
}

// A worker stopped with SIGTERM releases its placements and deregisters on
// its way out: the ids it owned re-place on the other worker at the very next
// request, while the other worker keeps its own. On both stores.
func TestGracefulStopReleasesIDs_RREG3(t *testing.T) {
	t.Parallel()
	forEachStore(t, testGracefulStopReleasesIDs)
}

func testGracefulStopReleasesIDs(t *testing.T, storeEnv []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	f := StartWarmFleet(t, ctx, FleetOptions{PinboardEnv: storeEnv, Workers: []string{"w1", "w2"}, Headroom: sharedHeadroom})
	pb := f.Pinboard

	ids, owners := placeIDs(ctx, t, pb, "graceful-", 12)
	victim := f.Worker(owners[ids[0]])
	survivor := f.Other(victim.Name)
	t.Logf("owners before the stop: %v; stopping %s", owners, victim.Name)

	if !victim.Stop() {
		t.Errorf("unexpected stop; %s did not exit within %v of SIGTERM", victim.Name, stopTimeout)
	}
	uctx, ucancel := context.WithTimeout(ctx, time.Second)
	defer ucancel()
	if err := victim.WaitUnregistered(uctx); err != nil {
		t.Errorf("unexpected registry after a clean shutdown (deregister, R-REG-3): %v", err)
	}

	for _, id := range ids {
		w, r, err := answerOf(ctx, pb, id)
		if err != nil || r.Status != http.StatusOK || w != survivor.Name {
			t.Errorf("%s (was on %s): unexpected first request after the stop; got %s (err %v); want 200 from %s", id, owners[id], r, err, survivor.Name)
		}
	}
}

// A SIGKILLed worker cannot release anything: until its lease lapses the
// proxy answers 502 {"error":…} fast for the ids it owned (the owner is
// unreachable, R-DP-3, R-DP-4); after the lease they re-place on the other
// worker (R-LS-2). Ids on the survivor keep working throughout. On both
// stores. "Fast" is told from a wait for the dial timeout or for a pooled
// connection by making those a minute each, so the bound below is a
// generous one on any machine, not a latency judged against 2 s defaults.
func TestKilledWorkerReplacedAfterLease_RLS2_RDP4(t *testing.T) {
	t.Parallel()
	forEachStore(t, testKilledWorkerReplacedAfterLease)
}

func testKilledWorkerReplacedAfterLease(t *testing.T, storeEnv []string) {
	const ttl = 3 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const slowWait = time.Minute
	env := append(slices.Clip(storeEnv),
		"PINBOARD_UPSTREAM_DIAL_TIMEOUT_MS="+strconv.Itoa(int(slowWait.Milliseconds())),
		"PINBOARD_UPSTREAM_CONN_WAIT_MS="+strconv.Itoa(int(slowWait.Milliseconds())))
	f := StartWarmFleet(t, ctx, FleetOptions{PinboardEnv: env, Workers: []string{"w1", "w2"}, Headroom: sharedHeadroom, LeaseTTL: ttl})
	pb := f.Pinboard

	ids, owners := placeIDs(ctx, t, pb, "killed-", 12)
	victim := f.Worker(owners[ids[0]])
	survivor := f.Other(victim.Name)
	var survivorID string
	for _, id := range ids {
		if owners[id] == survivor.Name {
			survivorID = id
			break
		}
	}
	t.Logf("owners before the kill: %v; killing %s", owners, victim.Name)

	leaseFloor, err := victim.LeaseFloor(ctx)
	if err != nil {
		t.Fatal(err)
	}
	victim.Kill()
	killed := time.Now()

	// Before the lease lapses: 502 JSON, fast.
	r, err := do(ctx, http.MethodGet, pb.URL+"/counters/"+ids[0]+"/whoami", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var eb errorBody
	if r.Status != http.StatusBadGateway || r.JSON(&eb) != nil || eb.Error == "" {
		t.Errorf("unexpected answer for an id on the dead worker; got %s; want 502 {\"error\":…} (R-DP-4)", r)
	}
	if r.Elapsed > slowWait/4 {
		t.Errorf("unexpected wait for an id on the dead worker; got %v; want well under the %v dial timeout and connection wait (R-DP-3: a dead worker fails fast)", r.Elapsed, slowWait)
	}
	if survivorID != "" {
		w, r, err := whoami(ctx, pb, survivorID)
		if err != nil || w != survivor.Name {
			t.Errorf("unexpected answer for %s on the survivor during the lease; got %s (err %v); want 200 from %s", survivorID, r, err, survivor.Name)
		}
	}

	// Poll until the id re-places; every answer before that is 502.
	deadline := killed.Add(ttl + 5*time.Second)
	var replaced time.Time
	for time.Now().Before(deadline) {
		w, r, err := answerOf(ctx, pb, ids[0])
		if err != nil {
			t.Fatalf("%v (%s)", err, r)
		}
		if r.Status == http.StatusOK {
			replaced = time.Now()
			if w != survivor.Name {
				t.Errorf("unexpected re-placement; got %s; want 200 from %s", r, survivor.Name)
			}
			break
		}
		if r.Status != http.StatusBadGateway {
			t.Errorf("unexpected answer %v after the kill, before re-placement; got %s; want 502", time.Since(killed).Round(time.Millisecond), r)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if replaced.IsZero() {
		t.Fatalf("unexpected failover; %s still not re-placed %v after the kill (lease %v)", ids[0], time.Since(killed).Round(time.Millisecond), ttl)
	}
	// The lease the registry reported just before the kill must run out
	// first. (Not "one heartbeat before the kill": on a loaded machine the
	// worker's last heartbeat can be late, and its lease end earlier.)
	if replaced.Before(leaseFloor) {
		t.Errorf("unexpected early re-placement; %v after the kill, %v before the lease the registry reported ended (one owner at a time, R-PL-1)", replaced.Sub(killed).Round(time.Millisecond), leaseFloor.Sub(replaced).Round(time.Millisecond))
	}
	t.Logf("re-placed %v after the kill", replaced.Sub(killed).Round(time.Millisecond))

	// Every id re-places or stays on the survivor.
	for _, id := range ids {
		w, r, err := whoami(ctx, pb, id)
		if err != nil || w != survivor.Name {
			t.Errorf("%s (was on %s): unexpected owner after the lease; got %s (err %v); want %s", id, owners[id], r, err, survivor.Name)
		}
	}
	uctx, ucancel := context.WithTimeout(ctx, 5*time.Second)
	defer ucancel()
	if err := victim.WaitUnregistered(uctx); err != nil {
		t.Errorf("unexpected registry after the lease lapsed (R-LS-2): %v", err)
	}
}

// A worker SIGKILLed and started again on the same port (a container
// restarted in its pod, a systemd restart) registers under a new clientId
// while its predecessor's session still looks live. The registration's
// probe, answered at that URL with the new secret, voids the predecessor
// (R-LS-3): its ids re-place at their next request — on the new process —
// instead of reaching the new process signed with the old secret, which
// refused them 403 invalid attestation until the lease lapsed. The lease
// here is long enough that waiting it out would show. On both stores.
func TestWorkerRestartedInPlace_RLS3(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, storeEnv []string) {
		const ttl = 15 * time.Second
		ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
		defer cancel()
		f := StartWarmFleet(t, ctx, FleetOptions{Workers: []string{"first"}, Headroom: sharedHeadroom, LeaseTTL: ttl, PinboardEnv: storeEnv})
		pb, first := f.Pinboard, f.Worker("first")
		ids, owners := placeIDs(ctx, t, pb, "restarted-", 4)
		for _, id := range ids {
			if owners[id] != first.Name {
				t.Fatalf("unexpected owner of %s; got %s; want %s (the only worker)", id, owners[id], first.Name)
			}
		}
		leaseFloor, err := first.LeaseFloor(ctx)
		if err != nil {
			t.Fatal(err)
		}
		first.Kill()
		killed := time.Now()
		second := StartWorker(t, pb, WorkerOptions{Name: "second", Headroom: sharedHeadroom, Port: first.Port})
		if _, err := second.WaitRegistered(ctx); err != nil {
			t.Fatal(err)
		}
		for _, id := range ids {
			if w, r, err := whoami(ctx, pb, id); err != nil || w != second.Name {
				t.Fatalf("unexpected answer for %s %v after its worker was restarted in place (lease %v); got %s (%v); want 200 from %s", id, time.Since(killed).Round(time.Millisecond), ttl, r, err, second.Name)
			}
		}
		if time.Now().After(leaseFloor) {
			t.Fatalf("unexpected test timing: the ids were served %v after the kill, past the dead worker's lease (%v); the restart came too late to tell", time.Since(killed).Round(time.Millisecond), ttl)
		}
		if !strings.Contains(pb.Output(), "voided: advertise URL registered by another process") {
			t.Errorf("unexpected pinboard log without the voided line:\n%s", pb.Output())
		}
	})
}

// An event stream from a worker frozen (SIGSTOP) while its client waits
// for the next event ends once the store ends the frozen worker's session
// (a lease after its lease ran out): cleanly, as EventSource expects of a
// stream to reconnect. Reconnecting reaches the id's new owner. Before,
// the stream stayed open as long as the worker stayed frozen — its kernel
// still holds the connection, and an event stream idles by design — while
// the id served from the other worker (R-LS-2, R-DP-2). On both stores.
func TestFrozenWorkerEventStreamEnds_RLS2_RDP2(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, storeEnv []string) {
		const ttl = 3 * time.Second
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		f := StartWarmFleet(t, ctx, FleetOptions{PinboardEnv: storeEnv, Workers: []string{"w1", "w2"}, Headroom: sharedHeadroom, LeaseTTL: ttl})
		pb := f.Pinboard
		type event struct {
			N      int    `json:"n"`
			Worker string `json:"worker"`
		}
		url := pb.URL + "/tickers/frozen-stream/events?count=100000&interval=0.2"
		res := openEventStream(ctx, t, url, 500*time.Millisecond)
		defer res.Body.Close()
		br := bufio.NewReader(res.Body)
		first := readEvent[event](t, br)
		victim := f.Worker(first.Worker)
		survivor := f.Other(victim.Name)

		victim.proc.signal(syscall.SIGSTOP)
		defer victim.proc.signal(syscall.SIGCONT)
		frozen := time.Now()
		// A request to the id while its owner is frozen and its lease
		// still runs: the worker's kernel takes it, no answer comes.
		type answer struct {
			status int
			body   string
			err    error
		}
		awaited := make(chan answer, 1)
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, pb.URL+"/tickers/frozen-stream/events?count=1", nil)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				awaited <- answer{err: err}
				return
			}
			defer res.Body.Close()
			b, err := io.ReadAll(res.Body)
			awaited <- answer{res.StatusCode, string(b), err}
		}()
		sleepCtx(ctx, 500*time.Millisecond) // a heartbeat sent just before has landed
		floor, err := victim.LeaseFloor(ctx)
		if err != nil {
			t.Fatal(err)
		}
		type end struct {
			at  time.Time
			err error
		}
		ended := make(chan end, 1)
		go func() {
			for {
				if _, err := br.ReadString('\n'); err != nil {
					if errors.Is(err, io.EOF) {
						err = nil
					}
					ended <- end{time.Now(), err}
					return
				}
			}
		}()
		var e end
		select {
		case e = <-ended:
		case <-time.After(2*ttl + 20*time.Second):
			t.Fatalf("the frozen worker's event stream still open %v after the freeze (lease %v)", time.Since(frozen).Round(time.Millisecond), ttl)
		}
		if e.err != nil {
			t.Fatalf("unexpected end of the frozen worker's event stream; got %v; want a clean end", e.err)
		}
		if e.at.Before(floor) {
			t.Fatalf("unexpected end of the event stream %v before the frozen worker's lease ended; want the session ended first", floor.Sub(e.at).Round(time.Millisecond))
		}
		t.Logf("event stream ended %v after the freeze (lease ran out %v after it)", e.at.Sub(frozen).Round(time.Millisecond), floor.Sub(frozen).Round(time.Millisecond))
		// The request awaiting the frozen worker's answer is answered once
		// its session ended, not after the 5 min header timeout.
		select {
		case a := <-awaited:
			if a.err != nil || a.status != http.StatusBadGateway || a.body != `{"error":"owner session ended"}` {
				t.Fatalf("unexpected answer to the request the frozen worker held; got %d %q, %v; want 502 %q", a.status, a.body, a.err, `{"error":"owner session ended"}`)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("the request the frozen worker held still waiting %v after the freeze (lease %v)", time.Since(frozen).Round(time.Millisecond), ttl)
		}

		again := openEventStream(ctx, t, url, 500*time.Millisecond)
		defer again.Body.Close()
		if ev := readEvent[event](t, bufio.NewReader(again.Body)); ev.Worker != survivor.Name {
			t.Fatalf("unexpected worker after reconnecting; got %s; want %s", ev.Worker, survivor.Name)
		}
	})
}

// readEvent reads the next event's data from br and decodes it.
func readEvent[E any](t *testing.T, br *bufio.Reader) E {
	t.Helper()
	for {
		line, err := br.ReadString('\n')
		if data, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), "data: "); ok {
			var ev E
			if err := json.Unmarshal([]byte(data), &ev); err != nil {
				t.Fatalf("cannot decode event %q: %v", data, err)
			}
			return ev
		}
		if err != nil {
			t.Fatalf("cannot read an event: %v", err)
		}
	}
}
