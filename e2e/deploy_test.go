package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// observation is one answer of POST /counters/{id}/increment.
type observation struct {
	worker string
	count  int
}

// deployClient hits n ids round robin with POST /increment until stopped,
// retrying documented 503s (R-DP-4), and records who served each id.
type deployClient struct {
	pb       *Pinboard
	ids      []string
	mu       sync.Mutex
	seen     map[string][]observation
	retried  atomic.Int64
	failures []string
	requests atomic.Int64
}

func (c *deployClient) run(ctx context.Context) {
	for ctx.Err() == nil {
		for _, id := range c.ids {
			if ctx.Err() != nil {
				return
			}
			c.hit(ctx, id)
		}
	}
}

func (c *deployClient) hit(ctx context.Context, id string) {
	url := c.pb.URL + "/counters/" + id + "/increment"
	for attempt := 0; ; attempt++ {
		r, err := do(ctx, http.MethodPost, url, nil, nil)
		if ctx.Err() != nil {
			return
		}
		c.requests.Add(1)
		if err != nil {
			c.fail(fmt.Sprintf("%s: %v", url, err))
			return
		}
		if r.Status == http.StatusServiceUnavailable && r.Header.Get("Retry-After") != "" && attempt < 40 {
			c.retried.Add(1)
			wait, _ := retryAfter(r.Header)
			sleepCtx(ctx, min(max(wait/4, 50*time.Millisecond), 250*time.Millisecond))
			continue
		}
		if r.Status != http.StatusOK {
			c.fail(r.String())
			return
		}
		var body struct {
			ID     string `json:"id"`
			Count  int    `json:"count"`
			Worker string `json:"worker"`
		}
		if err := r.JSON(&body); err != nil || body.ID != id {
			c.fail(fmt.Sprintf("bad answer %s", r))
			return
		}
		c.mu.Lock()
		c.seen[id] = append(c.seen[id], observation{body.Worker, body.Count})
		c.mu.Unlock()
		return
	}
}

func (c *deployClient) fail(s string) {
	c.mu.Lock()
	c.failures = append(c.failures, s)
	c.mu.Unlock()
}

// check asserts that each id was served by exactly one instance at a time:
// on one worker its count goes up by one per request (a single live
// instance took every request), and once an id moved it never came back.
func (c *deployClient) check(t *testing.T) (moves int) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, obs := range c.seen {
		done := map[string]bool{}
		for i, o := range obs {
			if i == 0 || o.worker != obs[i-1].worker {
				if done[o.worker] {
					t.Fatalf("unexpected return of %s to %s: %v", id, o.worker, obs)
				}
				if i > 0 {
					done[obs[i-1].worker] = true
					moves++
				}
				if o.count != 1 {
					t.Fatalf("unexpected count %d for a new activation of %s on %s (a second live instance?): %v", o.count, id, o.worker, obs)
				}
				continue
			}
			if o.count != obs[i-1].count+1 {
				t.Fatalf("unexpected count sequence for %s on %s: %v (two instances served it)", id, o.worker, obs)
			}
		}
	}
	return moves
}

// A rolling deploy with real pinned workers (R-REG-6, R-LS-5, R-PL-1,
// R-PL-2): operator-drain A, start A', wait until A holds nothing, stop A.
// A client hitting 200 ids throughout sees nothing but documented, retried
// 503s, and every id is served by exactly one worker at every moment.
func TestRollingDeploy_RREG6(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, storeEnv []string) {
		ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
		defer cancel()
		// Small headroom spreads one client IP's ids over both workers
		// (the balance-factor guard, R-PL-4).
		const headroom = 40
		f := StartWarmFleet(t, ctx, FleetOptions{PinboardEnv: storeEnv, Workers: []string{"A", "B"}, Headroom: headroom})
		pb := f.Pinboard
		c := &deployClient{pb: pb, seen: map[string][]observation{}}
		for i := range 200 {
			c.ids = append(c.ids, "deploy-"+strconv.Itoa(i))
		}
		// One pass places everything before the deploy starts.
		for _, id := range c.ids {
			c.hit(ctx, id)
		}
		onA := 0
		for _, obs := range c.seen {
			if obs[0].worker == "A" {
				onA++
			}
		}
		if onA < 20 {
			t.Fatalf("unexpected placement: only %d of 200 ids on A; the deploy would prove little", onA)
		}
		loadCtx, stopLoad := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); c.run(loadCtx) }()

		// 1. Operator drain of A: no new placements on A; its idle instances
		// wind down and release (the worker applies the drain echo).
		r, err := do(ctx, http.MethodPost, pb.URL+"/registry/drain", pb.operator(), strings.NewReader(`{"clientId":"`+f.Records["A"].ClientID+`"}`))
		if err != nil || r.Status != http.StatusOK {
			t.Fatalf("cannot drain A: %v %s", err, r)
		}
		// 2. Start A'.
		a2 := StartWorker(t, pb, WorkerOptions{Name: "A2", Headroom: headroom})
		if _, err := a2.WaitRegistered(ctx); err != nil {
			t.Fatal(err)
		}
		// 3. Wait until A holds no placement.
		deadline := time.Now().Add(60 * time.Second)
		for {
			n, err := placementsOf(ctx, pb, f.Records["A"].ClientID)
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("unexpected placements left on the drained worker A: %d", n)
			}
			sleepCtx(ctx, 200*time.Millisecond)
		}
		// 4. Stop A: nothing routes there any more.
		if !f.Worker("A").Stop() {
			t.Errorf("unexpected stop of A: it did not exit on SIGTERM")
		}
		// Keep the load on a little after the stop.
		sleepCtx(ctx, 2*time.Second)
		stopLoad()
		wg.Wait()

		if len(c.failures) > 0 {
			t.Fatalf("unexpected errors during the deploy (%d of %d requests): %v", len(c.failures), c.requests.Load(), c.failures[:min(5, len(c.failures))])
		}
		moves := c.check(t)
		if moves < onA {
			t.Fatalf("unexpected moves; got %d; want every one of A's %d ids moved", moves, onA)
		}
		for id, obs := range c.seen {
			if last := obs[len(obs)-1].worker; last == "A" {
				t.Fatalf("unexpected owner of %s after the deploy: A", id)
			}
		}
		t.Logf("deploy: %d requests, %d retried 503s, %d ids moved off A", c.requests.Load(), c.retried.Load(), moves)
	})
}

// placementsOf reads a client's placement count from GET /registry/workers.
func placementsOf(ctx context.Context, pb *Pinboard, clientID string) (int, error) {
	r, err := do(ctx, http.MethodGet, pb.URL+"/registry/workers", pb.operator(), nil)
	if err != nil {
		return 0, err
	}
	var body struct {
		Workers []struct {
			ClientID   string `json:"clientId"`
			Placements int    `json:"placements"`
		} `json:"workers"`
	}
	if err := r.JSON(&body); err != nil {
		return 0, err
	}
	for _, w := range body.Workers {
		if w.ClientID == clientID {
			return w.Placements, nil
		}
	}
	return 0, nil
}
