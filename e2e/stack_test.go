package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The drop-in claim on the other HTTP stack uvicorn runs. `pip install
// uvicorn[standard]` — what many fleets run — brings httptools (llhttp)
// and uvloop, and uvicorn then prefers them to h11 and asyncio's loop,
// which every other test here runs (WorkerOptions.Stack). The two parse
// requests differently: httptools routes by httptools.parse_url's path,
// which ends at a '#' and drops an absolute form's scheme and authority.
// Two workers on httptools + uvloop behind one pinboard: the core flows
// and the refusals that keep a client off the worker's own routes.
func TestUvicornStandardStack_RDP1_RDP2_RTR5_RPL2(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	f := StartWarmFleet(t, ctx, FleetOptions{
		Workers:  []string{"s1", "s2"},
		Headroom: sharedHeadroom,
		Stack:    stackStandard,
		// A state store mounts each host's POST <ns>/<id>/_wake and the
		// /guarded host whose authorize refuses every request.
		WorkerEnv: []string{"STATE_STORE=memory"},
	})
	pb := f.Pinboard

	// The workers run what they were told to: httptools routes
	// /healthz#x to /healthz, h11 reads the '#' into the path (404).
	t.Run("stack", func(t *testing.T) {
		for _, w := range f.Workers {
			if status, body := rawRequest(t, w.URL, http.MethodGet, "/healthz#x"); status != http.StatusOK {
				t.Fatalf("%s: unexpected answer to GET /healthz#x; got %d %s; want 200 (httptools ends the path at '#')", w.Name, status, body)
			}
		}
	})

	// /counters/{id}/value reaches the Counter, and new ids from one
	// client spread over both workers (R-DP-1, R-PL-1).
	owners := map[string]string{}
	t.Run("routing", func(t *testing.T) {
		for i := 0; i < 24 && len(slices.Compact(slices.Sorted(maps.Values(owners)))) < 2; i++ {
			id := "std-" + strconv.Itoa(i)
			r, err := getWithRetry(ctx, pb.URL+"/counters/"+id+"/value")
			if err != nil || r.Status != http.StatusOK {
				t.Fatalf("unexpected answer; got %s (err %v); want 200", r, err)
			}
			var v counterValue
			if err := r.JSON(&v); err != nil {
				t.Fatal(err)
			}
			if v.ID != id || (v.Worker != "s1" && v.Worker != "s2") {
				t.Fatalf("unexpected counter; got %+v; want id %s on s1 or s2", v, id)
			}
			owners[id] = v.Worker
		}
		if got := slices.Compact(slices.Sorted(maps.Values(owners))); len(got) != 2 {
			t.Errorf("unexpected owners of %d new ids; got %q; want both workers", len(owners), got)
		}
	})

	// An id stays on its worker, its state with it (R-PL-2).
	t.Run("sticky", func(t *testing.T) {
		for id, want := range owners {
			for range 3 {
				got, r, err := whoami(ctx, pb, id)
				if err != nil {
					t.Fatal(err)
				}
				if got != want {
					t.Fatalf("unexpected owner of %s; got %s; want %s: %s", id, got, want, r)
				}
			}
		}
		r, err := do(ctx, http.MethodPost, pb.URL+"/counters/std-0/increment", nil, nil)
		var v counterValue
		if err != nil || r.Status != http.StatusOK || r.JSON(&v) != nil || v.Count != 1 || v.Worker != owners["std-0"] {
			t.Fatalf("unexpected increment; got %s (err %v); want count 1 on %s", r, err, owners["std-0"])
		}
	})

	// A 204 or 304 announcing a body that httptools writes after the
	// header, whenever the app sends it: the next request to the worker
	// gets its own answer, not those bytes (before, pinboard pooled the
	// connection and the late bytes answered it; R-DP-1, R-DP-3).
	t.Run("late body", func(t *testing.T) {
		for _, status := range []int{http.StatusNoContent, http.StatusNotModified} {
			r, err := do(ctx, http.MethodGet, pb.URL+"/counters/std-0/late-body?status="+strconv.Itoa(status), nil, nil)
			if err != nil || r.Status != status {
				t.Fatalf("unexpected answer to late-body %d; got %v %s", status, err, r)
			}
			r, err = do(ctx, http.MethodGet, pb.URL+"/counters/std-0/value", nil, nil)
			var v counterValue
			if err != nil || r.Status != http.StatusOK || r.JSON(&v) != nil || v.ID != "std-0" {
				t.Fatalf("unexpected answer to the request after a late-body %d; got %v %s; want std-0's value", status, err, r)
			}
		}
	})

	// A direct call to a worker's instance route is refused (R-TR-5).
	t.Run("direct", func(t *testing.T) {
		for _, w := range f.Workers {
			checkDirectRefused(ctx, t, w, "/counters/std-0/value", nil)
			checkDirectUpgradeRefused(ctx, t, w, "/tickers/t1/ws")
		}
	})

	// Server-Sent Events arrive as they are produced (R-DP-2).
	t.Run("sse", func(t *testing.T) {
		const count, interval = 4, 0.2
		res := openEventStream(ctx, t, fmt.Sprintf("%s/tickers/std-t/events?count=%d&interval=%v", pb.URL, count, interval), 500*time.Millisecond)
		defer res.Body.Close()
		type event struct {
			N int     `json:"n"`
			T float64 `json:"t"`
		}
		events, arrived := readEvents[event](t, res.Body)
		if len(events) != count {
			t.Fatalf("unexpected event count; got %d; want %d", len(events), count)
		}
		for i, ev := range events {
			if ev.N != i {
				t.Errorf("unexpected event order; got n=%d at position %d", ev.N, i)
			}
		}
		last := time.Unix(0, int64(events[count-1].T*float64(time.Second)))
		if !arrived[0].Before(last) {
			t.Errorf("unexpected buffering; the first event arrived at %v, after the last was emitted at %v", arrived[0].Format(time.StampMicro), last.Format(time.StampMicro))
		}
	})

	// A WebSocket echoes through pinboard and closes cleanly (R-DP-2).
	t.Run("websocket", func(t *testing.T) {
		c := dialWebSocket(ctx, t, "ws"+strings.TrimPrefix(pb.URL, "http")+"/tickers/std-t/ws", 500*time.Millisecond)
		big := make([]byte, 70000)
		for i := range big {
			big[i] = byte(i)
		}
		echoEach(t, c, []wsMessage{
			{wsOpText, []byte("hello")},
			{wsOpBinary, big},
			{wsOpText, []byte("bye")},
		})
		if code := c.Close(1000, 5*time.Second); code != 1000 {
			t.Errorf("unexpected close handshake; got peer code %d; want 1000", code)
		}
		// A second Upgrade line: pinboard reads the first, uvicorn the
		// last, so pinboard sends the worker the one it read.
		c, err := wsDial(ctx, "ws"+strings.TrimPrefix(pb.URL, "http")+"/tickers/std-t/ws", http.Header{"Upgrade": {"h2c"}})
		if err != nil {
			t.Fatalf("unexpected answer to a handshake with a second Upgrade line; got %v; want 101", err)
		}
		echoEach(t, c, []wsMessage{{wsOpText, []byte("two lines")}})
		c.Close(1000, 5*time.Second)
	})

	// A 64 MiB body goes up and comes back intact, both directions at
	// once (R-DP-2).
	t.Run("body", func(t *testing.T) {
		checkBigEcho(ctx, t, pb.URL+"/counters/std-0/echo", 3)
	})

	// A chunked upload of unknown length reaches the worker whole: the
	// proxy forwards it chunked, which llhttp decodes (R-DP-2).
	t.Run("chunked", func(t *testing.T) {
		const size = 16 << 20
		body, digest := generatedBody(4, size)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, pb.URL+"/counters/std-0/sha256", io.NopCloser(body))
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = -1
		res, err := httpClient.Do(req)
		if err != nil {
			t.Fatalf("POST sha256: %v (sent %d of %d bytes)", err, body.n.Load(), size)
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		var got struct {
			Size   int64  `json:"size"`
			SHA256 string `json:"sha256"`
		}
		if err != nil || res.StatusCode != http.StatusOK || json.Unmarshal(b, &got) != nil {
			t.Fatalf("unexpected answer; got %d %s (err %v); want 200 and a digest", res.StatusCode, b, err)
		}
		if got.Size != size || got.SHA256 != digest() {
			t.Errorf("unexpected upload at the worker; got %d bytes sha256 %s; want %d bytes sha256 %s", got.Size, got.SHA256, size, digest())
		}
	})

	// The worker's wake route is refused, in any spelling and in
	// absolute form (whose authority httptools drops), and a '#' (where
	// httptools ends the path) too: nothing reaches the guarded instance,
	// which never activates (R-DP-1).
	t.Run("refusals", func(t *testing.T) {
		if r, err := getWithRetry(ctx, pb.URL+"/guarded/alice/value"); err != nil || r.Status != http.StatusForbidden {
			t.Fatalf("unexpected answer to GET /guarded/alice/value; got %v %s; want 403 from authorize", err, r)
		}
		for _, tc := range []struct {
			target string
			status int
		}{
			{"/guarded/alice/_wake", http.StatusNotFound},
			{"/guarded/alice/%5Fwake", http.StatusNotFound},
			{"/guarded/alice/_wake%0A", http.StatusNotFound},
			{"http://e2e/guarded/alice/_wake", http.StatusNotFound},
			{"/guarded/alice/_wake#x", http.StatusBadRequest},
			{"/guarded/alice/_wake#", http.StatusBadRequest},
			{"/guarded/alice/_wake?x=1#y", http.StatusBadRequest},
			{"/counters/std-0/value#/../../_pinned/stats", http.StatusBadRequest},
		} {
			status, body := rawRequest(t, pb.URL, http.MethodPost, tc.target)
			var e errorBody
			if status != tc.status || json.Unmarshal([]byte(body), &e) != nil || e.Error == "" {
				t.Errorf("unexpected answer to POST %s; got %d %s; want pinboard's %d", tc.target, status, body, tc.status)
			}
		}
		for _, w := range f.Workers {
			r, err := do(ctx, http.MethodGet, w.URL+"/_e2e/activations", nil, nil)
			var got struct {
				IDs []string `json:"ids"`
			}
			if err != nil || r.Status != http.StatusOK || r.JSON(&got) != nil {
				t.Fatalf("cannot read %s's activations: %v %s", w.Name, err, r)
			}
			if len(got.IDs) != 0 {
				t.Errorf("unexpected activations on %s; got %q; want none", w.Name, got.IDs)
			}
		}
	})
}
