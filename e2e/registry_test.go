package e2e

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"
)

// Both workers register with their own identity and every namespace they
// host, and the operator listing shows their state.
func TestRegistryListsWorkers_RREG1_RREG4(t *testing.T) {
	f := sharedFleet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()

	recs, r, err := f.Pinboard.Workers(ctx)
	if err != nil || r.Status != http.StatusOK {
		t.Fatalf("unexpected registry answer; got %s (err %v); want 200 {\"workers\":[…]}", r, err)
	}
	seenClient := map[string]string{}
	seenSession := map[string]string{}
	for _, w := range f.Workers {
		i := slices.IndexFunc(recs, func(rec WorkerRecord) bool { return rec.AdvertiseURL == w.URL })
		if i < 0 {
			t.Errorf("unexpected registry listing; got %s; want an entry with advertiseUrl %q", r.Body, w.URL)
			continue
		}
		rec := recs[i]
		if rec.ClientID == "" {
			t.Errorf("%s: unexpected clientId; got empty; want the worker's client id", w.Name)
		} else if other, dup := seenClient[rec.ClientID]; dup {
			t.Errorf("%s: unexpected clientId; got %q, the same as %s; want one per process", w.Name, rec.ClientID, other)
		}
		seenClient[rec.ClientID] = w.Name
		if rec.SessionID != "" {
			if other, dup := seenSession[rec.SessionID]; dup {
				t.Errorf("%s: unexpected sessionId; got %q, the same as %s", w.Name, rec.SessionID, other)
			}
			seenSession[rec.SessionID] = w.Name
		}
		for _, ns := range []string{"/counters", "/tickers"} {
			if !slices.Contains(rec.Namespaces, ns) {
				t.Errorf("%s: unexpected namespaces; got %q; want them to include %q", w.Name, rec.Namespaces, ns)
			}
		}
		if rec.Headroom == nil {
			t.Errorf("%s: unexpected record; got no headroom; want it (R-REG-4): %s", w.Name, r.Body)
		}
		if rec.Draining == nil || *rec.Draining {
			t.Errorf("%s: unexpected draining; got %v; want false (R-REG-4): %s", w.Name, rec.Draining, r.Body)
		}
		if rec.Degraded == nil || *rec.Degraded {
			t.Errorf("%s: unexpected degraded; got %v; want false (R-REG-4): %s", w.Name, rec.Degraded, r.Body)
		}
		ttl := float64(f.Pinboard.LeaseTTL.Milliseconds())
		if rec.ExpiresInMs == nil || *rec.ExpiresInMs <= 0 || *rec.ExpiresInMs > ttl {
			t.Errorf("%s: unexpected expiresInMs; got %v; want in (0, %v] (R-LS-1): %s", w.Name, rec.ExpiresInMs, ttl, r.Body)
		}
	}
}

// The registry reads need the operator credential (R-TR-2); errors are JSON.
func TestRegistryRequiresCredential_RTR2(t *testing.T) {
	f := sharedFleet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()

	for _, c := range []struct {
		name   string
		header http.Header
	}{
		{"no credential", nil},
		{"wrong token", http.Header{"Authorization": {"Bearer not-the-token"}}},
	} {
		for _, path := range []string{"/registry/workers", "/registry/health"} {
			r, err := do(ctx, http.MethodGet, f.Pinboard.URL+path, c.header, nil)
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			if path == "/registry/health" && r.Status == http.StatusOK {
				// The guide does not say health is private; only the
				// listing must be (R-TR-3).
				continue
			}
			var body errorBody
			if r.Status != http.StatusUnauthorized || r.JSON(&body) != nil || body.Error != "unauthorized" {
				t.Errorf("%s: unexpected answer; got %s; want 401 {\"error\":\"unauthorized\"}", c.name, r)
			}
		}
	}
}

// After a fresh memory: boot, quarantineMs is 0 until the first placement
// attempt; that attempt answers 503 with Retry-After and starts one lease
// TTL of refusals; placement works after it.
func TestColdStartQuarantine_RCS1_RREG5(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	f := StartFleet(t, ctx, FleetOptions{Workers: []string{"solo"}, Headroom: sharedHeadroom})
	pb := f.Pinboard

	h, r, err := pb.Health(ctx)
	if err != nil || r.Status != http.StatusOK {
		t.Fatalf("unexpected health answer; got %s (err %v); want 200", r, err)
	}
	if h.QuarantineMs == nil || *h.QuarantineMs != 0 {
		t.Errorf("unexpected quarantineMs before the first placement; got %v; want 0 (R-REG-5): %s", h.QuarantineMs, r.Body)
	}

	url := pb.URL + "/counters/cold/value"
	// The quarantine starts when pinboard gets the first attempt: not
	// before it was sent, however long its answer takes to come back.
	sent := time.Now()
	first, err := do(ctx, http.MethodGet, url, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var body errorBody
	if first.Status != http.StatusServiceUnavailable || first.JSON(&body) != nil || body.Error == "" {
		t.Errorf("unexpected first placement after boot; got %s; want 503 {\"error\":…} (R-CS-1)", first)
	}
	if _, ok := retryAfter(first.Header); first.Status == http.StatusServiceUnavailable && !ok {
		t.Errorf("unexpected Retry-After; got %q; want delta-seconds (R-CS-1, R-REG-7)", first.Header.Get("Retry-After"))
	}

	h, r, err = pb.Health(ctx)
	if err != nil || r.Status != http.StatusOK {
		t.Fatalf("unexpected health answer; got %s (err %v); want 200", r, err)
	}
	ttl := float64(pb.LeaseTTL.Milliseconds())
	if h.QuarantineMs == nil || *h.QuarantineMs <= 0 || *h.QuarantineMs > ttl {
		t.Errorf("unexpected quarantineMs after the first placement attempt; got %v; want in (0, %v] (R-CS-1): %s", h.QuarantineMs, ttl, r.Body)
	}

	rctx, rcancel := context.WithTimeout(ctx, pb.LeaseTTL+5*time.Second)
	defer rcancel()
	ok, err := getWithRetry(rctx, url)
	if err != nil || ok.Status != http.StatusOK {
		t.Fatalf("unexpected placement after the quarantine; got %s (err %v); want 200", ok, err)
	}
	if waited := time.Since(sent); waited < pb.LeaseTTL-10*time.Millisecond { // slack: stores keep milliseconds
		t.Errorf("unexpected quarantine length; placement worked %v after the first attempt; want about one lease TTL (%v)", waited, pb.LeaseTTL)
	}

	h, r, err = pb.Health(ctx)
	if err != nil || r.Status != http.StatusOK {
		t.Fatalf("unexpected health answer; got %s (err %v); want 200", r, err)
	}
	if h.QuarantineMs == nil || *h.QuarantineMs != 0 {
		t.Errorf("unexpected quarantineMs after the quarantine; got %v; want 0: %s", h.QuarantineMs, r.Body)
	}
}

// A worker app whose middleware puts a long header on every answer (a
// security-headers middleware's Content-Security-Policy), the challenge
// probe's answer included, registers, stays eligible through its
// heartbeats' probes and serves through pinboard, which relays the header
// (R-REG-1, R-LS-3). The probe read at most 4 KiB of header: such a
// worker's every register was deferred, 503 "advertise URL unreachable",
// for as long as it ran.
func TestWorkerWithLargeResponseHeaderRegisters_RREG1_RLS3(t *testing.T) {
	pb := StartPinboard(t, PinboardOptions{})
	w := StartWorker(t, pb, WorkerOptions{Name: "w1", Env: []string{"RESPONSE_HEADER_BYTES=8000"}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	if _, err := w.WaitRegistered(ctx); err != nil {
		t.Fatalf("unexpected registration; got %v; want the worker listed (R-REG-1)\n--- pinboard ---\n%s", err, pb.Output())
	}
	// The first request starts the cold-start quarantine (one lease, three
	// heartbeats here): the answer comes after heartbeats whose probes
	// passed, or a degraded worker would take no new id (R-LS-3).
	r, err := getWithRetry(ctx, pb.URL+"/counters/big-header/value")
	if err != nil || r.Status != http.StatusOK {
		t.Fatalf("unexpected answer; got %s (err %v); want 200 from the worker", r, err)
	}
	if csp := r.Header.Get("Content-Security-Policy"); len(csp) < 7000 {
		t.Fatalf("unexpected Content-Security-Policy; got %d bytes; want the worker's ~8000", len(csp))
	}
	recs, lr, err := pb.Workers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(recs, func(rec WorkerRecord) bool { return rec.AdvertiseURL == w.URL })
	if i < 0 || recs[i].Degraded == nil || *recs[i].Degraded {
		t.Fatalf("unexpected listing; got %s; want the worker, not degraded (R-LS-3)", lr)
	}
}
