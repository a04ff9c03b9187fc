package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// placement is GET /registry/placement.
type placement struct {
	SessionID string `json:"sessionId"`
	ClientID  string `json:"clientId"`
	Epoch     string `json:"epoch"`
	Live      bool   `json:"live"`
}

func getPlacement(ctx context.Context, pb *Pinboard, ns, id string) (placement, int, error) {
	r, err := do(ctx, http.MethodGet, pb.URL+"/registry/placement?namespace="+ns+"&id="+id, pb.operator(), nil)
	if err != nil {
		return placement{}, 0, err
	}
	var p placement
	if r.Status == http.StatusOK {
		err = r.JSON(&p)
	}
	return p, r.Status, err
}

// awaitFreed waits until ns/id has no placement (404) or deadline has
// passed; then it reports the placement it last read.
func awaitFreed(ctx context.Context, pb *Pinboard, ns, id string, deadline time.Time) error {
	for {
		p, status, err := getPlacement(ctx, pb, ns, id)
		if err == nil && status == http.StatusNotFound {
			return nil
		}
		if time.Now().After(deadline) || !sleepCtx(ctx, 200*time.Millisecond) {
			return fmt.Errorf("still placed; last %d %+v, %v", status, p, err)
		}
	}
}

type counterReply struct {
	ID     string `json:"id"`
	Count  int    `json:"count"`
	Worker string `json:"worker"`
}

func increment(ctx context.Context, t *testing.T, pb *Pinboard, ns, id string) counterReply {
	t.Helper()
	r, err := doWithRetry(ctx, http.MethodPost, pb.URL+ns+"/"+id+"/increment", nil)
	if err != nil || r.Status != http.StatusOK {
		t.Fatalf("cannot increment %s/%s: %v %s", ns, id, err, r)
	}
	var c counterReply
	if err := r.JSON(&c); err != nil {
		t.Fatal(err)
	}
	return c
}

// Retained idle placements (guide: release_placement_on_idle=False): an
// evicted idle instance keeps its placement until the session ends, and
// after its worker dies the row re-places as a dead-owner row on the next
// request (R-PL-2, R-LS-2).
func TestRetainedIdlePlacements_RPL2(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, storeEnv []string) {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		f := StartWarmFleet(t, ctx, FleetOptions{PinboardEnv: storeEnv, Workers: []string{"w1", "w2"}, Headroom: sharedHeadroom})
		pb := f.Pinboard
		first := increment(ctx, t, pb, "/retained", "keep")
		if c := increment(ctx, t, pb, "/retained", "keep"); c.Count != 2 || c.Worker != first.Worker {
			t.Fatalf("unexpected second increment %+v", c)
		}
		before, _, err := getPlacement(ctx, pb, "/retained", "keep")
		if err != nil {
			t.Fatal(err)
		}
		// Idle eviction (1s) on the worker: the instance goes, the row stays.
		sleepCtx(ctx, 2500*time.Millisecond)
		after, status, err := getPlacement(ctx, pb, "/retained", "keep")
		if err != nil || status != http.StatusOK || after.SessionID != before.SessionID || after.Epoch != before.Epoch || !after.Live {
			t.Fatalf("unexpected placement after idle eviction; got %d %+v (before %+v)", status, after, before)
		}
		if c := increment(ctx, t, pb, "/retained", "keep"); c.Count != 1 || c.Worker != first.Worker {
			t.Fatalf("unexpected reply after idle eviction; got %+v; want a fresh activation on %s", c, first.Worker)
		}
		// The owner dies: past its lease the row re-places on the next request.
		owner := f.Worker(first.Worker)
		owner.Kill()
		sleepCtx(ctx, pb.LeaseTTL+500*time.Millisecond)
		if c := increment(ctx, t, pb, "/retained", "keep"); c.Worker == first.Worker || c.Count != 1 {
			t.Fatalf("unexpected reply after the owner died; got %+v; want a new activation elsewhere", c)
		}
		moved, _, _ := getPlacement(ctx, pb, "/retained", "keep")
		e0, _ := strconv.ParseUint(before.Epoch, 10, 64)
		e1, _ := strconv.ParseUint(moved.Epoch, 10, 64)
		if moved.SessionID == before.SessionID || e1 <= e0 {
			t.Fatalf("unexpected placement after re-placement; got %+v (before %+v)", moved, before)
		}
	})
}

// An operator winds one id down (R-CM-1): the owner receives the wind_down
// on its next heartbeat, acks it, evicts the instance and releases the
// placement; the next request activates it afresh.
func TestWindDownOneID_RCM1(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, storeEnv []string) {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		f := StartWarmFleet(t, ctx, FleetOptions{PinboardEnv: storeEnv, Workers: []string{"w1"}, Headroom: sharedHeadroom})
		pb := f.Pinboard
		increment(ctx, t, pb, "/counters", "wind")
		if c := increment(ctx, t, pb, "/counters", "wind"); c.Count != 2 {
			t.Fatalf("unexpected count %d", c.Count)
		}
		windDown(ctx, t, pb, "wind", "5")
		if err := awaitFreed(ctx, pb, "/counters", "wind", time.Now().Add(15*time.Second)); err != nil {
			t.Fatalf("unexpected placement: the wound-down id was never released: %v\n%s", err, f.Logs(nil))
		}
		if c := increment(ctx, t, pb, "/counters", "wind"); c.Count != 1 {
			t.Fatalf("unexpected count after the wind-down; got %d; want a fresh activation", c.Count)
		}
	})
}

// A timed operator drain (R-REG-6, R-LS-5): drainDeadline counts down in
// the listing, the lease stops advancing past the deadline plus one lease,
// and at the deadline the drained worker's placements are released and
// re-place elsewhere.
func TestTimedOperatorDrain_RLS5(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, storeEnv []string) {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		f := StartWarmFleet(t, ctx, FleetOptions{PinboardEnv: storeEnv, Workers: []string{"A", "B"}, Headroom: sharedHeadroom})
		pb := f.Pinboard
		var onA []string
		for i := 0; i < 40 && len(onA) < 3; i++ {
			id := "timed-" + strconv.Itoa(i)
			if c := increment(ctx, t, pb, "/counters", id); c.Worker == "A" {
				onA = append(onA, id)
			}
		}
		if len(onA) == 0 {
			t.Fatalf("no id landed on A")
		}
		clientA := f.Records["A"].ClientID
		sent := time.Now()
		r, err := do(ctx, http.MethodPost, pb.URL+"/registry/drain", pb.operator(), strings.NewReader(`{"clientId":"`+clientA+`","deadline":2}`))
		if err != nil || r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"drainDeadline":2`) {
			t.Fatalf("cannot drain A: %v %s", err, r)
		}
		// Half a second in, the listing has counted down (1.5 s of slack
		// for the listing's round trip on a loaded machine).
		sleepCtx(ctx, 500*time.Millisecond)
		w := workerView(ctx, t, pb, clientA)
		if !w.Draining || w.DrainDeadline == nil || *w.DrainDeadline >= 2 || *w.DrainDeadline <= 0 {
			t.Fatalf("unexpected listing during the timed drain: %+v", w)
		}
		if w.ExpiresInMs > 2000+float64(pb.LeaseTTL.Milliseconds()) {
			t.Fatalf("unexpected lease past the drain deadline plus one lease: %vms", w.ExpiresInMs)
		}
		// The first sweep past the deadline (one runs every lease/8)
		// releases A's placements. Poll for it rather than assume it ran
		// within a fixed 0.7 s, but give up a second before the lease cap
		// (deadline plus one lease, counted from before the drain was
		// sent) would move the ids anyway: a missed release still fails.
		sleepCtx(ctx, time.Until(sent.Add(2*time.Second)))
		giveUp := sent.Add(2*time.Second + pb.LeaseTTL - time.Second)
		for {
			c := increment(ctx, t, pb, "/counters", onA[0])
			if c.Worker == "B" {
				if c.Count != 1 {
					t.Fatalf("unexpected owner of %s past the drain deadline; got %+v; want a new activation on B", onA[0], c)
				}
				break
			}
			if time.Now().After(giveUp) {
				t.Fatalf("unexpected owner of %s %v after the drain (deadline 2s); got %+v; want a new activation on B", onA[0], time.Since(sent).Round(time.Millisecond), c)
			}
			sleepCtx(ctx, 50*time.Millisecond)
		}
		for _, id := range onA[1:] {
			if c := increment(ctx, t, pb, "/counters", id); c.Worker != "B" || c.Count != 1 {
				t.Fatalf("unexpected owner of %s past the drain deadline; got %+v; want a new activation on B", id, c)
			}
		}
	})
}

type workerJSON struct {
	ClientID      string   `json:"clientId"`
	Draining      bool     `json:"draining"`
	DrainDeadline *float64 `json:"drainDeadline"`
	ExpiresInMs   float64  `json:"expiresInMs"`
	Placements    int      `json:"placements"`
}

func workerView(ctx context.Context, t *testing.T, pb *Pinboard, clientID string) workerJSON {
	t.Helper()
	r, err := do(ctx, http.MethodGet, pb.URL+"/registry/workers", pb.operator(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Workers []workerJSON `json:"workers"`
	}
	if err := json.Unmarshal(r.Body, &body); err != nil {
		t.Fatal(err)
	}
	for _, w := range body.Workers {
		if w.ClientID == clientID {
			return w
		}
	}
	t.Fatalf("worker %s not listed: %s", clientID, r)
	return workerJSON{}
}

// A worker that lost its session keeps its instances and re-registers
// listing them (R-REG-1); when one of them later idles out, the worker
// releases it with its new session id and the epoch the instance was
// activated at (pinned RegistrationClient.release). That release must free
// the row (R-REG-3): the reclaimed row keeps its epoch.
func TestReclaimedInstanceReleasedOnIdle_RREG1_RREG3(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, storeEnv []string) {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		pb := StartPinboard(t, PinboardOptions{Env: storeEnv})
		w := StartWorker(t, pb, WorkerOptions{Name: "w", Env: []string{"COUNTERS_IDLE_TIMEOUT=9"}})
		first, err := w.WaitRegistered(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := getWithRetry(ctx, pb.URL+"/counters/kept/value"); err != nil {
			t.Fatal(err)
		}
		before, _, err := getPlacement(ctx, pb, "/counters", "kept")
		if err != nil || before.SessionID != first.SessionID {
			t.Fatalf("unexpected placement; got %+v, %v; want session %s", before, err, first.SessionID)
		}
		// Frozen past its lease: the next heartbeat is answered 409
		// reregister, and the worker registers again listing "kept".
		w.proc.signal(syscall.SIGSTOP)
		sleepCtx(ctx, pb.LeaseTTL+time.Second)
		w.proc.signal(syscall.SIGCONT)
		var after placement
		for {
			after, _, err = getPlacement(ctx, pb, "/counters", "kept")
			if err == nil && after.SessionID != "" && after.SessionID != first.SessionID {
				break
			}
			if !sleepCtx(ctx, 100*time.Millisecond) {
				t.Fatalf("kept never moved to the worker's new session; last %+v, %v", after, err)
			}
		}
		if after.Epoch != before.Epoch {
			t.Fatalf("unexpected epoch of the reclaimed row; got %s; want %s, the instance's", after.Epoch, before.Epoch)
		}
		// The instance idles out (9 s, swept every 5 s) and is released.
		if err := awaitFreed(ctx, pb, "/counters", "kept", time.Now().Add(25*time.Second)); err != nil {
			t.Fatalf("the idle instance's release never freed its row: %v", err)
		}
	})
}

// windDown posts POST /registry/wind-down; deadline "null" revokes.
func windDown(ctx context.Context, t *testing.T, pb *Pinboard, id, deadline string) {
	t.Helper()
	r, err := do(ctx, http.MethodPost, pb.URL+"/registry/wind-down", pb.operator(),
		strings.NewReader(`{"namespace":"/counters","id":"`+id+`","deadline":`+deadline+`}`))
	if err != nil || r.Status != http.StatusOK {
		t.Fatalf("cannot wind down %s (deadline %s): %v %s", id, deadline, err, r)
	}
}

// A wind-down's deadline and its revoke with the real worker (R-CM-1):
// two ids each busy with a slow request get a wind_down with a 2 s
// deadline; one is revoked (deadline null) right after. The worker aborts
// the other's request once its deadline has passed — not before: the ack
// tells it the seconds left at delivery — and its placement is freed; the revoked one's
// request completes, and its instance and placement stay (pinboard's sweep
// must not free it at the revoked deadline either). On both stores.
func TestWindDownDeadlineAndRevoke_RCM1(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, storeEnv []string) {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		f := StartWarmFleet(t, ctx, FleetOptions{PinboardEnv: storeEnv, Workers: []string{"w1"}, Headroom: sharedHeadroom})
		pb := f.Pinboard
		increment(ctx, t, pb, "/counters", "aborted")
		increment(ctx, t, pb, "/counters", "revoked")
		keptBefore, _, err := getPlacement(ctx, pb, "/counters", "revoked")
		if err != nil {
			t.Fatal(err)
		}
		const slow = 8 * time.Second
		type done struct {
			r     reply
			err   error
			after time.Duration
		}
		start := time.Now()
		results := map[string]chan done{}
		for _, id := range []string{"aborted", "revoked"} {
			ch := make(chan done, 1)
			results[id] = ch
			go func() {
				r, err := do(ctx, http.MethodGet, fmt.Sprintf("%s/counters/%s/slow?seconds=%v", pb.URL, id, slow.Seconds()), nil, nil)
				ch <- done{r, err, time.Since(start)}
			}()
		}
		sleepCtx(ctx, 500*time.Millisecond) // both requests at the worker
		posted := time.Now()
		windDown(ctx, t, pb, "aborted", "2")
		windDown(ctx, t, pb, "revoked", "2")
		windDown(ctx, t, pb, "revoked", "null")

		a := <-results["aborted"]
		abortedAt := start.Add(a.after)
		if a.err == nil && a.r.Status == http.StatusOK {
			t.Fatalf("unexpected answer for the wound-down id's request; got %s after %v; want it aborted at the 2s deadline", a.r, a.after.Round(time.Millisecond))
		}
		if d := abortedAt.Sub(posted); d < 1900*time.Millisecond || d > slow-time.Second {
			t.Fatalf("unexpected abort %v after the wind-down was posted; want from the 2s deadline on, well before the request's own %v", d.Round(time.Millisecond), slow)
		}
		if err := awaitFreed(ctx, pb, "/counters", "aborted", posted.Add(10*time.Second)); err != nil {
			t.Fatalf("the wound-down id's placement was never freed: %v", err)
		}
		k := <-results["revoked"]
		if k.err != nil || k.r.Status != http.StatusOK || !strings.Contains(string(k.r.Body), `"slept"`) {
			t.Fatalf("unexpected answer for the revoked id's request; got %s (err %v); want 200 after %v", k.r, k.err, slow)
		}
		keptAfter, code, err := getPlacement(ctx, pb, "/counters", "revoked")
		if err != nil || code != http.StatusOK || keptAfter.SessionID != keptBefore.SessionID || keptAfter.Epoch != keptBefore.Epoch {
			t.Fatalf("unexpected placement of the revoked id past its revoked deadline; got %d %+v (err %v); want %+v", code, keptAfter, err, keptBefore)
		}
		if c := increment(ctx, t, pb, "/counters", "revoked"); c.Count != 2 {
			t.Fatalf("unexpected count of the revoked id; got %+v; want 2 (the same live instance)", c)
		}
		if c := increment(ctx, t, pb, "/counters", "aborted"); c.Count != 1 {
			t.Fatalf("unexpected count of the wound-down id; got %+v; want 1 (a fresh activation)", c)
		}
	})
}

// Re-registration with the real worker (R-REG-1, R-LS-2): a worker frozen
// past its lease wakes to 409 reregister and registers again with
// prevSessionId and its live instances. An id re-placed on the other
// worker meanwhile comes back as a duplicate — it stays where it is, the
// woken worker's stale instance never serves it again — while an id nobody
// asked for during the freeze is reclaimed with its live instance. On both
// stores.
func TestReregisterDuplicatesAndReclaims_RREG1(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, storeEnv []string) {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		// A request that still reaches the frozen A gets 504 in 2 s, not
		// the 5 minutes of the default header timeout.
		pb, a, first := startAB(ctx, t, append(storeEnv, "PINBOARD_UPSTREAM_HEADER_TIMEOUT_MS=2000"))
		for _, id := range []string{"dup", "reclaim"} {
			increment(ctx, t, pb, "/counters", id)
			if c := increment(ctx, t, pb, "/counters", id); c.Worker != "A" || c.Count != 2 {
				t.Fatalf("unexpected answer for %s; got %+v; want A's instance at count 2", id, c)
			}
		}
		a.proc.signal(syscall.SIGSTOP)
		stopped := true
		defer func() {
			if stopped {
				a.proc.signal(syscall.SIGCONT)
			}
		}()
		// The lease as it stands once A is frozen: a heartbeat A sent just
		// before has had time to land. Read before the signal, a renewal
		// after the read sent the first request past the floor to the
		// frozen A, which held it until the deadline (one run under -race).
		sleepCtx(ctx, 500*time.Millisecond)
		floor, err := a.LeaseFloor(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// Past A's lease, "dup" re-places on B at its next request.
		sleepCtx(ctx, time.Until(floor))
		for {
			r, err := do(ctx, http.MethodPost, pb.URL+"/counters/dup/increment", nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if r.Status == http.StatusOK {
				var c counterReply
				if err := r.JSON(&c); err != nil || c.Worker != "B" || c.Count != 1 {
					t.Fatalf("unexpected answer for dup past A's lease; got %s; want a new activation on B", r)
				}
				break
			}
			if r.Status != http.StatusBadGateway && r.Status != http.StatusServiceUnavailable && r.Status != http.StatusGatewayTimeout {
				t.Fatalf("unexpected answer for dup while A is frozen; got %s", r)
			}
			if time.Since(floor) > 10*time.Second || !sleepCtx(ctx, 100*time.Millisecond) {
				t.Fatalf("dup never re-placed on B after A's lease; last %s", r)
			}
		}
		a.proc.signal(syscall.SIGCONT)
		stopped = false
		again := waitNewSession(ctx, t, pb, a.URL, first.SessionID, "A, after it woke,")
		wantLog := "prevSessionId=" + first.SessionID + " duplicates=1"
		if !strings.Contains(pb.Output(), wantLog) {
			t.Errorf("unexpected register log; want a line with %q", wantLog)
		}
		// "dup" stays on B; "reclaim" is A's again, with its live instance.
		if p, code, err := getPlacement(ctx, pb, "/counters", "dup"); err != nil || code != http.StatusOK || p.ClientID == first.ClientID {
			t.Fatalf("unexpected placement of dup after A re-registered; got %d %+v (err %v); want B's", code, p, err)
		}
		if c := increment(ctx, t, pb, "/counters", "dup"); c.Worker != "B" || c.Count != 2 {
			t.Fatalf("unexpected answer for dup after A re-registered; got %+v; want B's instance at count 2", c)
		}
		if p, code, err := getPlacement(ctx, pb, "/counters", "reclaim"); err != nil || code != http.StatusOK || p.SessionID != again.SessionID {
			t.Fatalf("unexpected placement of reclaim after A re-registered; got %d %+v (err %v); want A's new session %s", code, p, err, again.SessionID)
		}
		if c := increment(ctx, t, pb, "/counters", "reclaim"); c.Worker != "A" || c.Count != 3 {
			t.Fatalf("unexpected answer for reclaim after A re-registered; got %+v; want A's live instance at count 3", c)
		}
	})
}
