package e2e

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Epoch displacement with real pinned workers (R-LS-4): blue registers
// app.test at epoch 1 and takes ids; green registers app.test at epoch 2.
// Blue's next heartbeat gets 409 superseded: it aborts its instances and
// stops registering for good (pinned.pinboard.registration._displaced),
// its ids re-place on green, and a request naming Host app.test only ever
// reaches green.
func TestEpochDisplacement_RLS4(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, storeEnv []string) {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		pb := StartPinboard(t, PinboardOptions{Env: storeEnv})
		blue := StartWorker(t, pb, WorkerOptions{Name: "blue", Headroom: 100, Env: []string{"BIND_HOSTNAME=app.test", "BIND_ENV=blue", "BIND_EPOCH=1"}})
		if _, err := blue.WaitRegistered(ctx); err != nil {
			t.Fatal(err)
		}
		hostGet := func(id string) (reply, error) {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, pb.URL+"/counters/"+id+"/whoami", nil)
			req.Host = "app.test"
			for {
				res, err := httpClient.Do(req)
				if err != nil {
					return reply{}, err
				}
				body, _ := io.ReadAll(res.Body)
				res.Body.Close()
				r := reply{Status: res.StatusCode, Header: res.Header, Body: body}
				if r.Status != http.StatusServiceUnavailable {
					return r, nil
				}
				if !sleepCtx(ctx, 200*time.Millisecond) {
					return r, ctx.Err()
				}
			}
		}
		for _, id := range []string{"a", "b", "c"} {
			r, err := hostGet(id)
			if err != nil || r.Status != 200 || !strings.Contains(string(r.Body), `"worker":"blue"`) {
				t.Fatalf("unexpected reply for %s; got %v %s", id, err, r.Body)
			}
		}
		green := StartWorker(t, pb, WorkerOptions{Name: "green", Headroom: 100, Env: []string{"BIND_HOSTNAME=app.test", "BIND_ENV=green", "BIND_EPOCH=2"}})
		if _, err := green.WaitRegistered(ctx); err != nil {
			t.Fatal(err)
		}
		// Blue learns on its next heartbeat: superseded, and it stops.
		uctx, ucancel := context.WithTimeout(ctx, 10*time.Second)
		defer ucancel()
		if err := blue.WaitUnregistered(uctx); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			r, err := do(ctx, http.MethodGet, blue.URL+"/healthz", nil, nil)
			if err == nil && strings.Contains(string(r.Body), `"superseded":true`) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("unexpected blue state: it never reported superseded (%v %s)\n%s", err, r, blue.Output())
			}
			sleepCtx(ctx, 200*time.Millisecond)
		}
		if !strings.Contains(pb.Output(), "superseded") {
			t.Fatalf("unexpected pinboard log: no superseded event line")
		}
		for _, id := range []string{"a", "b", "c", "d"} {
			r, err := hostGet(id)
			if err != nil || r.Status != 200 || !strings.Contains(string(r.Body), `"worker":"green"`) {
				t.Fatalf("unexpected reply for %s after the displacement; got %v %d %s", id, err, r.Status, r.Body)
			}
		}
		// Blue does not come back: it stopped registering for good.
		sleepCtx(ctx, 2*time.Second)
		recs, _, err := pb.Workers(ctx)
		if err != nil || len(recs) != 1 || recs[0].AdvertiseURL != green.URL {
			t.Fatalf("unexpected workers after the displacement: %+v %v", recs, err)
		}
	})
}
