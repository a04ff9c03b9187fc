package e2e

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// In-band refusal with the real worker (R-PL-6): a worker whose lease is
// unhealthy refuses new activations with 503 and `pinned-refusal:
// lease-unhealthy` (pinned.hosting._records._refusal_503). Here worker U's
// lease buffer exceeds the lease, so its lease turns unhealthy the moment
// an ack lands and it refuses every activation. pinboard releases each
// refused placement and retries the id once on H; with H gone, the second
// refusal answers 503 + Retry-After, and the marker never reaches the
// client.
func TestInBandRefusalRealWorker_RPL6(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, storeEnv []string) {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		pb := StartPinboard(t, PinboardOptions{Env: storeEnv})
		unhealthy := StartWorker(t, pb, WorkerOptions{Name: "U", Headroom: 1000, LeaseBuffer: 10 * time.Second})
		healthy := StartWorker(t, pb, WorkerOptions{Name: "H", Headroom: 1})
		for _, w := range []*Worker{unhealthy, healthy} {
			if _, err := w.WaitRegistered(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := getWithRetry(ctx, pb.URL+"/counters/warm/whoami"); err != nil {
			t.Fatal(err)
		}
		// U has far more headroom: power of two choices and the affinity guard
		// both send new ids there first.
		for i := range 20 {
			id := "refused-" + strconv.Itoa(i)
			r, err := do(ctx, http.MethodGet, pb.URL+"/counters/"+id+"/whoami", nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if r.Status != http.StatusOK || !bodyHas(r, `"worker":"H"`) {
				t.Fatalf("unexpected reply for %s; got %s; want H's answer after U's refusal", id, r)
			}
		}
		stopDeregistered(ctx, t, healthy)
		r, err := do(ctx, http.MethodGet, pb.URL+"/counters/nobody-takes-me/whoami", nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if r.Status != http.StatusServiceUnavailable || r.Header.Get("Retry-After") == "" || r.Header.Get("Pinned-Refusal") != "" {
			t.Fatalf("unexpected reply when every worker refuses; got %s (pinned-refusal %q)", r, r.Header.Get("Pinned-Refusal"))
		}
	})
}

func bodyHas(r reply, s string) bool { return strings.Contains(string(r.Body), s) }

// A worker at its max_instances refuses new activations with 503
// "instance capacity reached; retry" and no marker; its headroom (memory)
// does not show it, and zero headroom stays eligible anyway (R-PL-3), so
// it kept winning new ids. pinboard releases each declined placement and
// places the id once more on another worker, as for an in-band refusal
// (R-PL-6): every id answers 200. Before, the 503 was relayed and the row
// stayed on the full worker, so the id answered 503 on every retry. And
// the node ranks the full worker last for new ids for a while after it
// declined (proxy.declineMemory, 3 s): before, every new id went to it
// first and was moved (a placement counted "replaced" each).
func TestFullWorkerDeclinesMove_RPL3_RPL6(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, storeEnv []string) {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		admin, adminAddr := adminEnv(t)
		pb := StartPinboard(t, PinboardOptions{Env: append([]string{adminAddr}, storeEnv...)})
		full := StartWorker(t, pb, WorkerOptions{Name: "F", Headroom: 1000, Env: []string{"MAX_INSTANCES=1"}})
		other := StartWorker(t, pb, WorkerOptions{Name: "H", Headroom: 1})
		for _, w := range []*Worker{full, other} {
			if _, err := w.WaitRegistered(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := getWithRetry(ctx, pb.URL+"/counters/warm/whoami"); err != nil {
			t.Fatal(err)
		}
		// F hosts one instance at most (the warm-up's, or the first id's);
		// every other id ends on H.
		onF := 0
		start := time.Now()
		for i := range 12 {
			id := "declined-" + strconv.Itoa(i)
			r, err := do(ctx, http.MethodGet, pb.URL+"/counters/"+id+"/whoami", nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if r.Status != http.StatusOK {
				t.Fatalf("unexpected reply for %s; got %s; want 200 from a worker with room", id, r)
			}
			if bodyHas(r, `"worker":"F"`) {
				onF++
			}
		}
		if onF > 1 {
			t.Fatalf("unexpected ids served by the full worker; got %d; want at most 1", onF)
		}
		// One decline per 3 s of the loop at most (a slow machine may
		// take longer than one memory for the 12 ids), one more for the
		// warm-up's.
		moved := scrapeMetrics(ctx, t, admin)[`pinboard_placements_total{kind="replaced"}`]
		if most := 2 + float64(time.Since(start)/(3*time.Second)); moved > most {
			t.Fatalf("unexpected placements moved off the full worker; got %v; want at most %v: it keeps winning new ids", moved, most)
		}
	})
}

// The same refusal on a WebSocket upgrade (R-PL-6): the worker's resolve
// dependency raises the refusal before accept, which starlette sends as
// an HTTP denial response (the websocket.http.response extension uvicorn
// offers) — a 503 carrying `pinned-refusal: lease-unhealthy`. pinboard
// re-places the id on H as for any request; with H gone, the client gets
// pinboard's 503 without the marker. On both stores.
func TestInBandRefusalWebSocketRealWorker_RPL6(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, storeEnv []string) {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		pb := StartPinboard(t, PinboardOptions{Env: storeEnv})
		unhealthy := StartWorker(t, pb, WorkerOptions{Name: "U", Headroom: 1000, LeaseBuffer: 10 * time.Second})
		healthy := StartWorker(t, pb, WorkerOptions{Name: "H", Headroom: 1})
		var hClient string
		for _, w := range []*Worker{unhealthy, healthy} {
			rec, err := w.WaitRegistered(ctx)
			if err != nil {
				t.Fatal(err)
			}
			hClient = rec.ClientID
		}
		if _, err := getWithRetry(ctx, pb.URL+"/counters/warm/whoami"); err != nil {
			t.Fatal(err)
		}
		wsBase := "ws" + strings.TrimPrefix(pb.URL, "http")
		for i := range 10 {
			id := "ws-refused-" + strconv.Itoa(i)
			dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
			c, err := wsDial(dctx, wsBase+"/tickers/"+id+"/ws", nil)
			if err != nil {
				dcancel()
				t.Fatalf("cannot open a WebSocket to %s past U's refusal: %v", id, err)
			}
			if err := c.WriteMessage(wsOpText, []byte("ping")); err != nil {
				t.Fatal(err)
			}
			if _, msg, err := c.ReadMessage(); err != nil || string(msg) != "ping" {
				t.Fatalf("unexpected echo on %s; got %q, %v; want ping", id, msg, err)
			}
			c.Close(1000, time.Second)
			dcancel()
			pl, status, err := getPlacement(ctx, pb, "/tickers", id)
			if err != nil {
				t.Fatal(err)
			}
			if status != http.StatusOK || pl.ClientID != hClient {
				t.Fatalf("unexpected owner of %s; got %d %+v; want H (%s) after U's refusal", id, status, pl, hClient)
			}
		}
		stopDeregistered(ctx, t, healthy)
		dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
		defer dcancel()
		_, err := wsDial(dctx, wsBase+"/tickers/ws-nobody/ws", nil)
		var he *wsHandshakeError
		if !errors.As(err, &he) || he.Status != http.StatusServiceUnavailable || he.Header.Get("Retry-After") == "" || he.Header.Get("Pinned-Refusal") != "" {
			t.Fatalf("unexpected answer when every worker refuses the upgrade; got %v (%+v)", err, he)
		}
	})
}

// stopDeregistered stops w with SIGTERM and waits up to 10 s for its
// deregister to leave the registry (R-REG-3).
func stopDeregistered(ctx context.Context, t *testing.T, w *Worker) {
	t.Helper()
	if !w.Stop() {
		t.Fatalf("%s did not stop on SIGTERM", w.Name)
	}
	uctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := w.WaitUnregistered(uctx); err != nil {
		t.Fatal(err)
	}
}
