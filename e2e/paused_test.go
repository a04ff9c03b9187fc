package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/tools/redistest"
)

// Redis paused (SIGSTOP) under two nodes: it closes nothing and answers
// nothing, as a frozen VM or a silent partition. Ids the nodes have cached
// keep routing to their owners all along; once a node has found Redis
// silent (its connection's keep-alive, then a revalidation, time out:
// about 2.5 staleness budgets), a new placement, a registry call and
// /readyz each answer 503 with Retry-After at once, where every one of
// them waited for its whole timeout — a new placement 5–6 s — for as long
// as the pause lasted; and when Redis resumes, everything comes back
// without a restart (R-DP-4).
func TestMultiNodeRedisPaused_RDP4(t *testing.T) {
	requireSuite(t)
	srv := redistest.StartServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	// The staleness budget is 3 s (a quarter lease, at most 3 s): found
	// silent within about 7.5 s. The known leases outlive that: at least
	// three quarters of a lease less a heartbeat (redis_sessions.go).
	const ttl = 24 * time.Second
	f := StartMultiFleet(t, ctx, MultiFleetOptions{RedisURL: srv.URL(), Nodes: 2, Workers: []string{"w1", "w2"},
		Headroom: 4, LeaseTTL: ttl})
	if err := f.WarmUp(ctx); err != nil {
		t.Fatal(err)
	}
	owners := map[string]string{}
	for i := range 6 {
		id := "pause-" + strconv.Itoa(i)
		for _, node := range f.Nodes {
			w, r, err := whoami(ctx, node, id)
			if err != nil {
				t.Fatalf("%s: %v (%s)", id, err, r)
			}
			owners[id] = w
		}
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	paused := true
	defer func() {
		if paused {
			_ = srv.Resume()
		}
	}()
	pausedAt := time.Now()
	// fast: for each node, whether its last new placement, registry call
	// and readiness check all answered 503 with Retry-After within 1 s.
	fast := make([]bool, len(f.Nodes))
	for n := 0; ; n++ {
		for ni, node := range f.Nodes {
			for id, want := range owners {
				w, r, err := answerOf(ctx, node, id)
				if err != nil || w != want {
					t.Fatalf("%s: unexpected answer through node %d %v into the pause; got %s (err %v); want 200 from %s",
						id, ni, time.Since(pausedAt).Round(time.Millisecond), r, err, want)
				}
			}
			var slowest time.Duration
			for _, c := range []struct{ what, url string }{
				{"new placement", fmt.Sprintf("%s/counters/pause-new-%d-%d/whoami", node.URL, ni, n)},
				{"registry call", node.URL + "/registry/workers"},
				{"readiness", node.URL + "/readyz"},
			} {
				var h http.Header
				if c.what == "registry call" {
					h = node.operator()
				}
				r, err := do(ctx, http.MethodGet, c.url, h, nil)
				if err != nil || r.Status != http.StatusServiceUnavailable || r.Header.Get("Retry-After") == "" {
					t.Fatalf("unexpected %s through node %d %v into the pause; got %s (err %v); want 503 with Retry-After",
						c.what, ni, time.Since(pausedAt).Round(time.Millisecond), r, err)
				}
				slowest = max(slowest, r.Elapsed)
			}
			fast[ni] = slowest < time.Second
		}
		if fast[0] && fast[1] {
			t.Logf("every node answers 503 at once %v into the pause", time.Since(pausedAt).Round(time.Millisecond))
			break
		}
		if time.Since(pausedAt) > 15*time.Second {
			t.Fatalf("unexpected waits %v into the pause: placements, registry calls or readiness still wait for redis on some node (%v); want 503 at once",
				time.Since(pausedAt).Round(time.Millisecond), fast)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	paused = false
	resumed := time.Now()
	rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
	defer rcancel()
	for ni, node := range f.Nodes {
		if w, r, err := whoami(rctx, node, fmt.Sprintf("pause-after-%d", ni)); err != nil || w == "" {
			t.Fatalf("unexpected placement after redis resumed; got %s (err %v); want 200", r, err)
		}
		for id, want := range owners {
			if w, r, err := whoami(rctx, node, id); err != nil || w != want {
				t.Fatalf("%s: unexpected owner after the pause; got %s (err %v); want %s", id, r, err, want)
			}
		}
		if r, err := doWithRetry(rctx, http.MethodGet, node.URL+"/readyz", nil); err != nil || r.Status != http.StatusOK {
			t.Fatalf("unexpected readiness after redis resumed; got %s (err %v); want 200", r, err)
		}
	}
	t.Logf("placements resumed %v after redis did", time.Since(resumed).Round(time.Millisecond))
	for _, w := range f.Workers {
		if w.proc.exited() {
			t.Errorf("worker %s exited during the pause", w.Name)
		}
	}
}
