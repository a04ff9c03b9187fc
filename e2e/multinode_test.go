package e2e

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/tools/redistest"
)

// Several pinboard nodes on one Redis agree on exactly one owner per id
// (R-SRV-1, R-PL-1), on a single server and on a 3-master cluster.

func TestMultiNodeOneOwner_RPL1_RSRV1(t *testing.T) {
	requireSuite(t)
	srv := redistest.StartServer(t)
	testMultiNode(t, srv.URL())
}

func TestMultiNodeClusterOneOwner_RPL1_RSRV1(t *testing.T) {
	requireSuite(t)
	c := redistest.StartCluster(t, 3)
	testMultiNode(t, c.URL())
}

func testMultiNode(t *testing.T, redisURL string) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	// Six-second leases: the workers run at full CPU on two cores during
	// the 10,000-id phase, and a starved heartbeat loop must not lose them
	// their sessions.
	const ttl = 6 * time.Second
	f := StartMultiFleet(t, ctx, MultiFleetOptions{
		RedisURL: redisURL, Nodes: 3, Workers: []string{"w1", "w2", "w3"},
		// Small headroom: clients mostly come from 127.0.0.1, so the
		// per-IP rendezvous pick (R-PL-4) would send every id to one
		// worker; each placement spends a unit and the balance guard
		// spreads them.
		Headroom: 20, LeaseTTL: ttl,
		// The 10,000-id phase poses as many clients behind a trusted proxy
		// so rendezvous spreads the ids over the workers (and the Python
		// workers share the two cores evenly).
		NodeEnv: []string{"PINBOARD_TRUSTED_PROXIES=127.0.0.1"},
		// pinned sweeps every live instance after each request: evicting
		// idle ones keeps a request O(recent ids), not O(10,000).
		WorkerEnv: []string{"COUNTERS_IDLE_TIMEOUT=3", "UVICORN_ACCESS_LOG=false"},
	})
	if err := f.WarmUp(ctx); err != nil {
		t.Fatal(err)
	}
	t.Run("ConcurrentFirstRequests", func(t *testing.T) { testConcurrentFirstRequests(t, ctx, f) })
	t.Run("TenThousandIDs", func(t *testing.T) { testManyIDs(t, ctx, f, 10_000) })
	t.Run("KilledOwnerConverges_RLS2", func(t *testing.T) { testKilledOwnerConverges(t, ctx, f, ttl) })
}

// 1,000 concurrent first requests for one id, spread over every node, all
// reach the same worker, and every node's registry names that worker.
func testConcurrentFirstRequests(t *testing.T, ctx context.Context, f *MultiFleet) {
	const n = 1000
	workers := make([]string, n)
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w, r, err := whoami(ctx, f.Nodes[i%len(f.Nodes)], "hot")
			if err != nil {
				errs <- fmt.Errorf("request %d: %w (%s)", i, err, r)
				return
			}
			workers[i] = w
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d concurrent first requests over %d nodes answered in %v", n, len(f.Nodes), time.Since(start).Round(time.Millisecond))
	for i, w := range workers {
		if w != workers[0] {
			t.Fatalf("unexpected second owner; request %d reached %s, request 0 reached %s (R-PL-1)", i, w, workers[0])
		}
	}
	for _, node := range f.Nodes {
		p, ok, err := node.Placement(ctx, "/counters", "hot")
		if err != nil || !ok || f.WorkerByURL(p.AdvertiseURL) != workers[0] {
			t.Fatalf("unexpected placement on %s; got %+v, %v, %v; want %s", node.URL, p, ok, err, workers[0])
		}
	}
}

// 10,000 ids placed concurrently through every node never get two owners:
// right after the worker that served an id answers, every node's registry
// names that worker, and for one id in ten a request through another node
// (its own cache) reaches the same worker. The checks follow the first
// request at once: the workers evict ids idle for 3 s (and release them,
// after which a new owner would be legitimate).
func testManyIDs(t *testing.T, ctx context.Context, f *MultiFleet, n int) {
	var mismatches atomic.Int64
	var mu sync.Mutex
	spread := map[string]int{}
	start := time.Now()
	err := parallel(n, 24, func(i int) error {
		id := "many-" + strconv.Itoa(i)
		client := fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
		w, r, err := whoamiAs(ctx, f.Nodes[i%len(f.Nodes)], id, client)
		if err != nil {
			return fmt.Errorf("%s: %w (%s)", id, err, r)
		}
		mu.Lock()
		spread[w]++
		mu.Unlock()
		for _, node := range f.Nodes {
			p, ok, err := node.Placement(ctx, "/counters", id)
			if err != nil {
				return err
			}
			if !ok || f.WorkerByURL(p.AdvertiseURL) != w {
				mismatches.Add(1)
				t.Errorf("%s: unexpected placement on %s; got %+v (found %v); want %s", id, node.URL, p, ok, w)
			}
		}
		if i%10 == 0 {
			w2, r, err := whoamiAs(ctx, f.Nodes[(i+1)%len(f.Nodes)], id, client)
			if err != nil {
				return fmt.Errorf("%s: %w (%s)", id, err, r)
			}
			if w2 != w {
				mismatches.Add(1)
				t.Errorf("%s: unexpected second owner; served by %s, then by %s through another node", id, w, w2)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if m := mismatches.Load(); m > 0 {
		t.Fatalf("%d disagreements over %d ids", m, n)
	}
	d := time.Since(start)
	t.Logf("%d ids placed through %d nodes and checked on every registry in %v (%.0f ids/s); spread %v",
		n, len(f.Nodes), d.Round(time.Millisecond), float64(n)/d.Seconds(), spread)
}

// After its owner is SIGKILLed, every node keeps the id on the dead owner
// only while the lease runs (answering 502), then converges on one new
// owner; once converged no node forwards to the dead owner again (R-LS-2).
func testKilledOwnerConverges(t *testing.T, ctx context.Context, f *MultiFleet, ttl time.Duration) {
	ids := make([]string, 30)
	owners := map[string]string{}
	for i := range ids {
		ids[i] = "killed-" + strconv.Itoa(i)
		for _, node := range f.Nodes { // every node caches every id
			w, r, err := whoami(ctx, node, ids[i])
			if err != nil {
				t.Fatalf("%s: %v (%s)", ids[i], err, r)
			}
			if prev, ok := owners[ids[i]]; ok && prev != w {
				t.Fatalf("%s: unexpected second owner %s (was %s)", ids[i], w, prev)
			}
			owners[ids[i]] = w
		}
	}
	count := map[string]int{}
	for _, w := range owners {
		count[w]++
	}
	busiest := owners[ids[0]]
	for w, n := range count {
		if n > count[busiest] {
			busiest = w
		}
	}
	victim := f.Worker(busiest)
	var victimIDs []string
	for _, id := range ids {
		if owners[id] == victim.Name {
			victimIDs = append(victimIDs, id)
		}
	}
	leaseFloor, err := victim.LeaseFloor(ctx)
	if err != nil {
		t.Fatal(err)
	}
	victim.Kill()
	killed := time.Now()
	t.Logf("killed %s owning %d of %d ids", victim.Name, len(victimIDs), len(ids))

	converged := make([]time.Time, len(f.Nodes))
	newOwner := map[string]string{}
	deadline := killed.Add(ttl + 10*time.Second)
	for {
		done := true
		for ni, node := range f.Nodes {
			for _, id := range victimIDs {
				w, r := answerAfterKill(ctx, t, node, id, victim.Name)
				switch {
				case w != "":
					if prev, ok := newOwner[id]; ok && prev != w {
						t.Fatalf("%s: unexpected second new owner; %s then %s (R-PL-1)", id, prev, w)
					}
					newOwner[id] = w
				case !converged[ni].IsZero():
					t.Fatalf("%s: node %d forwarded to the dead owner after converging: %s", id, ni, r)
				default:
					done = false
				}
			}
			if done && converged[ni].IsZero() {
				converged[ni] = time.Now()
			}
		}
		if done && !slices.ContainsFunc(converged, time.Time.IsZero) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("unexpected convergence; nodes converged at %v, %v after the kill (lease %v)", converged, time.Since(killed), ttl)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for ni, c := range converged {
		t.Logf("node %d converged %v after the kill (lease %v)", ni, c.Sub(killed).Round(time.Millisecond), ttl)
		// No node may re-place while the lease the registry reported just
		// before the kill can still run (one owner, R-PL-1). Not "one
		// heartbeat before the kill": on a loaded machine the last
		// heartbeat can be late, and the lease end earlier.
		if c.Before(leaseFloor) {
			t.Errorf("node %d: unexpected early re-placement %v after the kill, %v before the lease the registry reported ended", ni, c.Sub(killed), leaseFloor.Sub(c))
		}
	}
	// Afterwards every node keeps answering from the new owners.
	for range 3 {
		for _, node := range f.Nodes {
			for _, id := range victimIDs {
				w, r, err := whoami(ctx, node, id)
				if err != nil || w != newOwner[id] {
					t.Fatalf("%s: unexpected answer after convergence; got %s (err %v); want %s", id, r, err, newOwner[id])
				}
			}
		}
	}
}
