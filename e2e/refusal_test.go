package e2e

import (
	"context"
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
		if !healthy.Stop() {
			t.Fatalf("H did not stop on SIGTERM")
		}
		uctx, ucancel := context.WithTimeout(ctx, 10*time.Second)
		defer ucancel()
		if err := healthy.WaitUnregistered(uctx); err != nil {
			t.Fatal(err)
		}
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
