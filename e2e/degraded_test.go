package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// probeMode is what a probeFront does with pinboard's challenge probe.
type probeMode int32

const (
	probePass  probeMode = iota // forwarded to the worker
	probeFail                   // answered 503: unreachable/non-2xx → degraded
	probeWrong                  // answered 200 with another value → voided
)

// probeFront is a reverse proxy on 127.0.0.1 standing at a worker's
// advertise URL: every request goes through to the real worker, except
// GET /_pinned/challenge, which the test can fail or answer wrongly. It lets
// a real pinned worker keep heartbeating while pinboard's probe of it fails
// (R-LS-3).
type probeFront struct {
	URL    string
	mode   atomic.Int32
	probes atomic.Int64 // challenge probes seen
}

func startProbeFront(t *testing.T, target string) *probeFront {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.Transport = &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 16}
	f := &probeFront{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/_pinned/challenge") {
			f.probes.Add(1)
			switch probeMode(f.mode.Load()) {
			case probeFail:
				http.Error(w, "probe refused by the test", http.StatusServiceUnavailable)
				return
			case probeWrong:
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, `{"value":"not-the-challenge-value"}`)
				return
			}
		}
		rp.ServeHTTP(w, r)
	})
	f.URL = serveLocal(t, h)
	return f
}

func (f *probeFront) set(m probeMode) { f.mode.Store(int32(m)) }

// serveLocal serves h on a free 127.0.0.1 port until the test ends and
// returns its base URL.
func serveLocal(t *testing.T, h http.Handler) string {
	t.Helper()
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if srv.Shutdown(ctx) != nil {
			srv.Close()
		}
	})
	return "http://" + ln.Addr().String()
}

// heartbeatTap stands between one worker and pinboard and keeps the
// answers pinboard gave that worker's heartbeats, as they went over the
// wire.
type heartbeatTap struct {
	URL  string
	mu   sync.Mutex
	acks []tappedAck
}

type tappedAck struct {
	at     time.Time
	status int
	body   string
}

func startHeartbeatTap(t *testing.T, pinboardURL string) *heartbeatTap {
	t.Helper()
	u, err := url.Parse(pinboardURL)
	if err != nil {
		t.Fatal(err)
	}
	tap := &heartbeatTap{}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.Transport = &http.Transport{Proxy: nil}
	rp.ModifyResponse = func(res *http.Response) error {
		if res.Request.URL.Path != "/registry/heartbeat" {
			return nil
		}
		b, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil {
			return err
		}
		res.Body = io.NopCloser(bytes.NewReader(b))
		tap.mu.Lock()
		tap.acks = append(tap.acks, tappedAck{time.Now(), res.StatusCode, string(b)})
		tap.mu.Unlock()
		return nil
	}
	tap.URL = serveLocal(t, rp)
	return tap
}

// since returns the heartbeat answers tapped after t0.
func (tap *heartbeatTap) since(t0 time.Time) []tappedAck {
	tap.mu.Lock()
	defer tap.mu.Unlock()
	var out []tappedAck
	for _, a := range tap.acks {
		if a.at.After(t0) {
			out = append(out, a)
		}
	}
	return out
}

// waitAck waits (10 s at most) for a heartbeat answer after t0 that ok
// accepts, and returns it.
func (tap *heartbeatTap) waitAck(ctx context.Context, t *testing.T, t0 time.Time, what string, ok func(tappedAck) bool) tappedAck {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, a := range tap.since(t0) {
			if ok(a) {
				return a
			}
		}
		if time.Now().After(deadline) || !sleepCtx(ctx, 50*time.Millisecond) {
			t.Fatalf("no heartbeat answer %s within 10s; answers since: %+v", what, tap.since(t0))
		}
	}
}

// record returns the listing's record of the worker at advertise URL u,
// and whether it is listed.
func record(ctx context.Context, t *testing.T, pb *Pinboard, u string) (WorkerRecord, bool) {
	t.Helper()
	recs, r, err := pb.Workers(ctx)
	if err != nil || r.Status != http.StatusOK {
		t.Fatalf("cannot list workers: %s (err %v)", r, err)
	}
	for _, rec := range recs {
		if rec.AdvertiseURL == u {
			return rec, true
		}
	}
	return WorkerRecord{}, false
}

// waitNewSession waits for the worker at advertise URL u to be listed
// under a session other than old, and returns its record; who names the
// worker in the failure.
func waitNewSession(ctx context.Context, t *testing.T, pb *Pinboard, u, old, who string) WorkerRecord {
	t.Helper()
	for {
		if rec, ok := record(ctx, t, pb, u); ok && rec.SessionID != old {
			return rec
		}
		if !sleepCtx(ctx, 100*time.Millisecond) {
			t.Fatalf("%s never registered again", who)
		}
	}
}

// A real pinned worker whose heartbeats keep coming while pinboard's
// challenge probe of its advertise URL fails is degraded (R-LS-3): its
// acks carry "degraded":true, the listing says degraded, the ids it owns
// keep routing to it, and new ids go elsewhere even though it has by far
// the most headroom. The next good probe clears it, and new ids come back
// to it. A probe answered with another value voids the session (R-LS-3):
// the heartbeat gets 409 with reregister, its records are dropped, and its
// ids re-place on the other worker at their next request. On both stores.
func TestDegradedAndVoidedProbe_RLS3(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, storeEnv []string) {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		pb := StartPinboard(t, PinboardOptions{Env: storeEnv})
		port, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		front := startProbeFront(t, "http://127.0.0.1:"+strconv.Itoa(port))
		tap := startHeartbeatTap(t, pb.URL)
		// D has far more headroom than H: new ids go to D while it is
		// eligible (the affinity guard, R-PL-4, gives up on H at once).
		d := StartWorker(t, pb, WorkerOptions{Name: "D", Port: port, Headroom: 1000,
			Env: []string{"ADVERTISE_URL=" + front.URL, "PINBOARD_URL=" + tap.URL}})
		d.URL = front.URL // registered (and routed) through the front
		h := StartWorker(t, pb, WorkerOptions{Name: "H", Headroom: 1})
		for _, w := range []*Worker{d, h} {
			if _, err := w.WaitRegistered(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := getWithRetry(ctx, pb.URL+"/counters/warm/whoami"); err != nil {
			t.Fatal(err)
		}
		placeOn := func(prefix string, n int) map[string]int {
			t.Helper()
			on := map[string]int{}
			for i := range n {
				c := increment(ctx, t, pb, "/counters", prefix+strconv.Itoa(i))
				if c.Count != 1 {
					t.Fatalf("unexpected count for new id %s%d; got %+v; want 1", prefix, i, c)
				}
				on[c.Worker]++
			}
			return on
		}
		if on := placeOn("healthy-", 4); on["D"] != 4 {
			t.Fatalf("unexpected owners of new ids while D is healthy; got %v; want all 4 on D (headroom 1000 against 1)", on)
		}

		// 1. The probe fails: degraded.
		failed := time.Now()
		front.set(probeFail)
		firstDegraded := tap.waitAck(ctx, t, failed, `200 with "degraded":true`, func(a tappedAck) bool {
			return a.status == http.StatusOK && strings.Contains(a.body, `"degraded":true`)
		})
		rec, ok := record(ctx, t, pb, d.URL)
		if !ok || rec.Degraded == nil || !*rec.Degraded {
			t.Fatalf("unexpected listing of D after a failed probe; got %v (listed %v); want degraded true", rec, ok)
		}
		if rec.ExpiresInMs == nil || *rec.ExpiresInMs <= 0 {
			t.Fatalf("unexpected lease of a degraded D; got %v; want renewed (R-LS-3)", rec)
		}
		// Existing placements keep routing to D.
		for i := range 4 {
			id := "healthy-" + strconv.Itoa(i)
			if c := increment(ctx, t, pb, "/counters", id); c.Worker != "D" || c.Count != 2 {
				t.Fatalf("unexpected answer for %s on a degraded D; got %+v; want D's instance, count 2", id, c)
			}
		}
		// No new placements on D.
		if on := placeOn("degraded-", 6); on["D"] != 0 {
			t.Fatalf("unexpected new ids on a degraded worker; got %v; want all on H", on)
		}
		// Still degraded: every heartbeat since failed its probe, and
		// every answer said so.
		for _, a := range tap.since(firstDegraded.at) {
			if a.status != http.StatusOK || !strings.Contains(a.body, `"degraded":true`) {
				t.Fatalf("unexpected heartbeat answer while the probe fails; got %d %s; want 200 with degraded true", a.status, a.body)
			}
		}

		// 2. The probe passes again: degraded cleared by the next heartbeat.
		cleared := time.Now()
		front.set(probePass)
		tap.waitAck(ctx, t, cleared, "200 without degraded", func(a tappedAck) bool {
			return a.status == http.StatusOK && !strings.Contains(a.body, `"degraded"`)
		})
		if rec, ok := record(ctx, t, pb, d.URL); !ok || rec.Degraded == nil || *rec.Degraded {
			t.Fatalf("unexpected listing of D after a good probe; got %v (listed %v); want degraded false", rec, ok)
		}
		if on := placeOn("recovered-", 4); on["D"] != 4 {
			t.Fatalf("unexpected owners of new ids once D's probe passed again; got %v; want all 4 on D", on)
		}
		if !strings.Contains(pb.Output(), "degraded") {
			t.Errorf("unexpected pinboard log without a degraded line")
		}

		// 3. The probe answers another value: voided.
		before, _ := record(ctx, t, pb, d.URL)
		voided := time.Now()
		front.set(probeWrong)
		a := tap.waitAck(ctx, t, voided, "409 with reregister", func(a tappedAck) bool {
			return a.status != http.StatusOK
		})
		// The reference's voided row, byte for byte as it went over the
		// wire from the binary (R-REG-2).
		const voidedBody = `{"error":"registration voided: challenge value mismatch on the advertise URL","reregister":true}`
		if a.status != http.StatusConflict || a.body != voidedBody {
			t.Fatalf("unexpected heartbeat answer after a probe answered another value; got %d %s; want 409 %s", a.status, a.body, voidedBody)
		}
		// D's records are dropped (its re-registration, probed the same
		// way, cannot succeed while the front answers wrongly).
		if rec, ok := record(ctx, t, pb, d.URL); ok && rec.SessionID == before.SessionID {
			t.Fatalf("unexpected listing of a voided session: %v", rec)
		}
		for i := range 4 {
			id := "recovered-" + strconv.Itoa(i)
			if c := increment(ctx, t, pb, "/counters", id); c.Worker != "H" || c.Count != 1 {
				t.Fatalf("unexpected answer for %s after D was voided; got %+v; want a new activation on H", id, c)
			}
		}
		// Once the probe passes, D registers again under a new session.
		front.set(probePass)
		again := waitNewSession(ctx, t, pb, d.URL, before.SessionID, "D, after the probe passed,")
		if again.Degraded == nil || *again.Degraded {
			t.Fatalf("unexpected listing of D registered again; got %v; want degraded false", again)
		}
		if !strings.Contains(pb.Output(), "voided") {
			t.Errorf("unexpected pinboard log without a voided line")
		}
		if front.probes.Load() == 0 {
			t.Fatalf("BUG: the front saw no challenge probe")
		}
	})
}

// String shows the record's values rather than its pointers.
func (w WorkerRecord) String() string {
	b, err := json.Marshal(w)
	if err != nil {
		return err.Error()
	}
	return string(b)
}
