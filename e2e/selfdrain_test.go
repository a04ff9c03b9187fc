package e2e

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"
)

// waitDraining polls the listing (10 s at most) until the worker with
// clientID shows draining == want.
func waitDraining(ctx context.Context, t *testing.T, pb *Pinboard, clientID string, want bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		w := workerView(ctx, t, pb, clientID)
		if w.Draining == want {
			return
		}
		if time.Now().After(deadline) || !sleepCtx(ctx, 100*time.Millisecond) {
			t.Fatalf("unexpected listing of %s; got %+v; want draining %v within 10s", clientID, w, want)
		}
	}
}

// The worker's own drain flag with the real worker (R-REG-2, R-REG-6): a
// pinned worker that drains itself (PinnedWorker.drain, what
// install_sigterm_drain starts) heartbeats draining: true; pinboard lists
// it draining, places no new id on it, and the ids it releases as its idle
// instances wind down re-place on the other worker. When the worker
// revokes its drain, pinboard clears the flag on its next heartbeat — the
// ack's draining echo must not hold the worker in a drain it left — and
// new ids come back to it. On both stores.
func TestWorkerOwnDrain_RREG2_RREG6(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, storeEnv []string) {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		pb, a, recA := startAB(ctx, t, storeEnv)
		placeAll := func(prefix string, n int, want string) []string {
			t.Helper()
			var ids []string
			for i := range n {
				id := prefix + strconv.Itoa(i)
				if c := increment(ctx, t, pb, "/counters", id); c.Worker != want || c.Count != 1 {
					t.Fatalf("unexpected answer for new id %s; got %+v; want a new activation on %s", id, c, want)
				}
				ids = append(ids, id)
			}
			return ids
		}
		onA := placeAll("before-", 3, "A")

		// A drains itself.
		r, err := do(ctx, http.MethodPost, a.URL+"/_e2e/drain?deadline=30", nil, nil)
		if err != nil || r.Status != http.StatusOK {
			t.Fatalf("cannot start A's own drain: %s (err %v)", r, err)
		}
		waitDraining(ctx, t, pb, recA.ClientID, true)
		placeAll("during-", 4, "B")
		// A's idle instances wind down at once and release their ids,
		// which then re-place on B.
		for _, id := range onA {
			for {
				_, code, err := getPlacement(ctx, pb, "/counters", id)
				if err != nil {
					t.Fatal(err)
				}
				if code == http.StatusNotFound {
					break
				}
				if !sleepCtx(ctx, 100*time.Millisecond) {
					t.Fatalf("%s never released by the draining A", id)
				}
			}
			if c := increment(ctx, t, pb, "/counters", id); c.Worker != "B" || c.Count != 1 {
				t.Fatalf("unexpected answer for %s after A released it; got %+v; want a new activation on B", id, c)
			}
		}

		// A revokes its drain.
		r, err = do(ctx, http.MethodPost, a.URL+"/_e2e/drain", nil, nil)
		if err != nil || r.Status != http.StatusOK {
			t.Fatalf("cannot revoke A's own drain: %s (err %v)", r, err)
		}
		waitDraining(ctx, t, pb, recA.ClientID, false)
		// Two heartbeats later it is still undrained.
		sleepCtx(ctx, 2*defaultHeartbeatInterval+500*time.Millisecond)
		if w := workerView(ctx, t, pb, recA.ClientID); w.Draining {
			t.Fatalf("unexpected listing of A two heartbeats after it revoked its drain; got %+v; want draining false", w)
		}
		placeAll("after-", 3, "A")
	})
}

// startAB starts pinboard with env and two workers, A with far more
// headroom than B (new ids go to A while it takes them), waits for both to
// register and for placements to pass the cold start, and returns them
// with A's record.
func startAB(ctx context.Context, t *testing.T, env []string) (*Pinboard, *Worker, WorkerRecord) {
	t.Helper()
	pb := StartPinboard(t, PinboardOptions{Env: env})
	a := StartWorker(t, pb, WorkerOptions{Name: "A", Headroom: 1000})
	b := StartWorker(t, pb, WorkerOptions{Name: "B", Headroom: 1})
	recA, err := a.WaitRegistered(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.WaitRegistered(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := getWithRetry(ctx, pb.URL+"/counters/warm/whoami"); err != nil {
		t.Fatal(err)
	}
	return pb, a, recA
}
