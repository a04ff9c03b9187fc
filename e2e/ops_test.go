package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Operating pinboard (issue 6): metrics on the admin listener, health
// endpoints, W3C trace context pass-through, graceful shutdown.

// adminEnv returns a free 127.0.0.1 address for PINBOARD_METRICS_ADDR and
// the environment entry naming it.
func adminEnv(t *testing.T) (string, string) {
	t.Helper()
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	return "http://" + addr, "PINBOARD_METRICS_ADDR=" + addr
}

// scrapeMetrics reads the admin listener's /metrics into "name{labels}" →
// value.
func scrapeMetrics(ctx context.Context, t *testing.T, admin string) map[string]float64 {
	t.Helper()
	r, err := do(ctx, http.MethodGet, admin+"/metrics", nil, nil)
	if err != nil || r.Status != http.StatusOK {
		t.Fatalf("cannot scrape: %s %v", r, err)
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Errorf("unexpected metrics Content-Type; got %q", ct)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(r.Body), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("unexpected metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// resolved is how many data-plane requests pinboard has resolved (the
// directory lookups counter, hits and misses).
func resolved(ctx context.Context, t *testing.T, admin string) float64 {
	t.Helper()
	m := scrapeMetrics(ctx, t, admin)
	return m[`pinboard_directory_lookups_total{result="hit"}`] + m[`pinboard_directory_lookups_total{result="miss"}`]
}

// waitInFlight waits (10 s at most) until pinboard has resolved a request
// more than before: one sent from another goroutine is then in pinboard's
// hands, on its way to the worker. A fixed sleep could end, on a loaded
// machine, before pinboard had even read it.
func waitInFlight(ctx context.Context, t *testing.T, admin string, before float64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); resolved(ctx, t, admin) <= before; {
		if time.Now().After(deadline) {
			t.Fatalf("the request did not reach pinboard within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestMetricsScrape scripts traffic and checks what the scrape counts: the
// counters move by exactly what the script did.
func TestMetricsScrape(t *testing.T) {
	requireSuite(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	admin, env := adminEnv(t)
	f := StartWarmFleet(t, ctx, FleetOptions{Workers: []string{"w1"}, Headroom: 8, PinboardEnv: []string{env}})
	pb := f.Pinboard

	// The public port does not serve metrics.
	if r, err := do(ctx, http.MethodGet, pb.URL+"/metrics", nil, nil); err != nil || r.Status != http.StatusNotFound {
		t.Errorf("unexpected public /metrics; got %s %v; want 404", r, err)
	}
	for _, p := range []string{"/livez", "/readyz"} {
		for _, base := range []string{admin, pb.URL} {
			if r, err := do(ctx, http.MethodGet, base+p, nil, nil); err != nil || r.Status != http.StatusOK {
				t.Errorf("unexpected %s; got %s %v; want 200", base+p, r, err)
			}
		}
	}

	before := scrapeMetrics(ctx, t, admin)
	get := func(path string, status int) {
		t.Helper()
		r, err := do(ctx, http.MethodGet, pb.URL+path, nil, nil)
		if err != nil || r.Status != status {
			t.Fatalf("unexpected answer; got %s %v; want %d", r, err, status)
		}
	}
	for i := 0; i < 5; i++ {
		get("/counters/m1/value", http.StatusOK) // 1 placement, then 4 cache hits
	}
	if r, err := do(ctx, http.MethodPost, pb.URL+"/counters/m1/increment", nil, nil); err != nil || r.Status != http.StatusOK {
		t.Fatalf("unexpected answer; got %s %v", r, err)
	}
	get("/nosuch/x/value", http.StatusNotFound)       // unknown namespace: a miss, never routed
	get("/nosuch/y/value", http.StatusNotFound)       // same
	get("/counters/b@d/value", http.StatusBadRequest) // bad id: never resolved
	after := scrapeMetrics(ctx, t, admin)

	delta := func(series string) float64 { return after[series] - before[series] }
	for series, want := range map[string]float64{
		`pinboard_proxy_requests_total{namespace="/counters",code="2xx"}`: 6,
		`pinboard_proxy_requests_total{namespace="none",code="4xx"}`:      3,
		`pinboard_proxy_requests_total{namespace="/counters",code="5xx"}`: 0,
		`pinboard_proxy_request_duration_seconds_count`:                   9,
		`pinboard_directory_lookups_total{result="hit"}`:                  5,
		`pinboard_directory_lookups_total{result="miss"}`:                 3,
		`pinboard_placements_total{kind="new"}`:                           1,
		`pinboard_placements_total{kind="replaced"}`:                      0,
		`pinboard_proxy_upstream_errors_total{kind="dial"}`:               0,
	} {
		if got := delta(series); got != want {
			t.Errorf("unexpected change of %s; got %v; want %v", series, got, want)
		}
	}
	for series, want := range map[string]float64{
		`pinboard_workers{state="healthy"}`:      1,
		`pinboard_workers{state="degraded"}`:     0,
		`pinboard_workers{state="draining"}`:     0,
		`pinboard_workers{state="expired"}`:      0,
		`pinboard_directory_up`:                  1,
		`pinboard_cold_start_quarantine_seconds`: 0,
		`pinboard_proxy_open_streams`:            0,
		`pinboard_proxy_open_websockets`:         0,
		`pinboard_registry_queue_depth`:          0,
	} {
		if got, ok := after[series]; !ok || got != want {
			t.Errorf("unexpected %s; got %v (present %v); want %v", series, got, ok, want)
		}
	}
	for _, series := range []string{
		`pinboard_registry_heartbeats_total{outcome="ok"}`,
		`pinboard_registry_probes_total{result="ok"}`,
		`pinboard_registry_heartbeat_duration_seconds_count`,
		`pinboard_registry_probe_duration_seconds_count`,
	} {
		if after[series] < 1 {
			t.Errorf("unexpected %s; got %v; want at least 1", series, after[series])
		}
	}

	// Streamed uploads (past the 64 KiB read whole) keep their worker
	// connection, the real worker answering each once it has the body:
	// no connection opened past the pooled one (R-DP-1, R-DP-2).
	get("/counters/m1/value", http.StatusOK) // a connection in the pool
	before = scrapeMetrics(ctx, t, admin)
	upload := bytes.Repeat([]byte("u"), 200<<10)
	for i := range 4 {
		r, err := do(ctx, http.MethodPost, pb.URL+"/counters/m1/sha256", http.Header{"Content-Type": {"application/octet-stream"}}, bytes.NewReader(upload))
		if err != nil || r.Status != http.StatusOK {
			t.Fatalf("upload %d: unexpected answer; got %s %v; want 200", i, r, err)
		}
	}
	after = scrapeMetrics(ctx, t, admin)
	if got := delta(`pinboard_proxy_upstream_connections_total`); got != 0 {
		t.Errorf("unexpected worker connections opened by 4 streamed uploads; got %v; want 0 (the pooled one reused)", got)
	}

	// Ids never become labels.
	r, _ := do(ctx, http.MethodGet, admin+"/metrics", nil, nil)
	for _, id := range []string{"m1", "b@d", "/nosuch"} {
		if strings.Contains(string(r.Body), id) {
			t.Errorf("unexpected %q in the exposition", id)
		}
	}
}

// TestTraceContextForwarded: W3C traceparent and tracestate reach the
// worker untouched (pinboard does not take part in the trace).
func TestTraceContextForwarded(t *testing.T) {
	f := sharedFleet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	const ts = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
	seen, r, err := headersSeen(ctx, f.Pinboard, "trace1", http.Header{"Traceparent": {tp}, "Tracestate": {ts}})
	if err != nil {
		t.Fatalf("%v (%s)", err, r)
	}
	if got := seen["traceparent"]; len(got) != 1 || got[0] != tp {
		t.Errorf("unexpected traceparent at the worker; got %q; want %q", got, tp)
	}
	if got := seen["tracestate"]; len(got) != 1 || got[0] != ts {
		t.Errorf("unexpected tracestate at the worker; got %q; want %q", got, ts)
	}
}

// openEvents opens an SSE stream through pinboard and reads its first
// event.
func openEvents(ctx context.Context, t *testing.T, url string) (*http.Response, *bufio.Reader) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := httpClient.Do(req)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("cannot open %s: %v %v", url, res, err)
	}
	br := bufio.NewReader(res.Body)
	line, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("unexpected first event line %q: %v", line, err)
	}
	return res, br
}

// TestGracefulShutdown: with an SSE stream and a WebSocket open and a slow
// request in flight, SIGTERM lets the slow request finish, then ends the
// stream cleanly and says "going away" on the WebSocket, and pinboard
// exits 0 inside the grace period. Readiness fails from the signal on.
func TestGracefulShutdown(t *testing.T) {
	requireSuite(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const grace = 15 * time.Second
	const slow = 2 * time.Second
	admin, env := adminEnv(t)
	f := StartWarmFleet(t, ctx, FleetOptions{Workers: []string{"w1"}, Headroom: 8,
		PinboardEnv: []string{env, "PINBOARD_SHUTDOWN_GRACE_MS=" + strconv.FormatInt(grace.Milliseconds(), 10)}})
	pb := f.Pinboard
	base := pb.URL
	// Place the ids first, so the slow request goes straight to the worker.
	for _, p := range []string{"/counters/slow1/value", "/tickers/sse1/events?count=1", "/tickers/ws1/events?count=1"} {
		if r, err := getWithRetry(ctx, base+p); err != nil || r.Status != http.StatusOK {
			t.Fatalf("cannot place %s: %s %v", p, r, err)
		}
	}

	res, events := openEvents(ctx, t, base+"/tickers/sse1/events?count=100000&interval=0.2")
	defer res.Body.Close()
	ws, err := wsDial(ctx, "ws://"+strings.TrimPrefix(base, "http://")+"/tickers/ws1/ws", nil)
	if err != nil {
		t.Fatalf("cannot open the WebSocket: %v", err)
	}
	defer ws.conn.Close()
	if err := ws.WriteMessage(wsOpText, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	if op, msg, err := ws.ReadMessage(); err != nil || op != wsOpText || string(msg) != "hello" {
		t.Fatalf("unexpected echo; got %x %q %v", op, msg, err)
	}

	before := resolved(ctx, t, admin)
	slowDone := make(chan reply, 1)
	go func() {
		r, err := do(ctx, http.MethodGet, fmt.Sprintf("%s/counters/slow1/slow?seconds=%v", base, slow.Seconds()), nil, nil)
		if err != nil {
			r.Body = []byte(err.Error())
		}
		slowDone <- r
	}()
	waitInFlight(ctx, t, admin, before) // the slow request is on its way to the worker

	sigterm := time.Now()
	pb.proc.signal(syscall.SIGTERM)

	// Readiness fails at once on the admin listener, which stays up.
	deadline := time.Now().Add(2 * time.Second)
	for {
		r, err := do(ctx, http.MethodGet, admin+"/readyz", nil, nil)
		if err == nil && r.Status == http.StatusServiceUnavailable && strings.Contains(string(r.Body), "shuttingDown") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("unexpected readiness after SIGTERM; got %s %v; want 503 shuttingDown", r, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// New connections are refused. Readiness turns first and the listener
	// closes right after, from another goroutine: on a loaded machine a
	// dial can land in between, so allow the close a moment.
	for deadline := time.Now().Add(2 * time.Second); ; {
		c, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), time.Second)
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Errorf("unexpected accepted connection %v after SIGTERM", time.Since(sigterm).Round(time.Millisecond))
			break
		}
		time.Sleep(20 * time.Millisecond)
	}

	// The slow request finishes.
	r := <-slowDone
	if r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"slept"`) {
		t.Fatalf("unexpected slow request; got %s; want 200 from the worker", r)
	}
	finished := time.Since(sigterm)

	// The event stream ends cleanly, with whole events only.
	readErr := make(chan error, 1)
	go func() {
		for {
			line, err := events.ReadString('\n')
			if err != nil {
				if line != "" {
					err = fmt.Errorf("partial line %q: %w", line, err)
				}
				readErr <- err
				return
			}
			if line != "\n" && !strings.HasPrefix(line, "data: {") {
				readErr <- fmt.Errorf("unexpected event line %q", line)
				return
			}
		}
	}()
	select {
	case err := <-readErr:
		if !errors.Is(err, io.EOF) {
			t.Errorf("unexpected end of the event stream; got %v; want a clean EOF", err)
		}
	case <-time.After(grace):
		t.Fatalf("unexpected event stream still open %v after SIGTERM", time.Since(sigterm))
	}

	// The WebSocket gets Close 1001 going away; we answer it.
	ws.conn.SetDeadline(time.Now().Add(5 * time.Second))
	for {
		op, msg, err := ws.ReadMessage()
		if err != nil {
			t.Fatalf("unexpected WebSocket end without a close frame: %v", err)
		}
		if op != wsOpClose {
			continue // a late echo
		}
		if len(msg) < 2 || binary.BigEndian.Uint16(msg) != 1001 || string(msg[2:]) != "going away" {
			t.Fatalf("unexpected close frame; got %q; want 1001 going away", msg)
		}
		break
	}
	ws.WriteMessage(wsOpClose, binary.BigEndian.AppendUint16(nil, 1001))

	// Pinboard exits 0 inside the grace period.
	if !pb.proc.wait(grace) {
		t.Fatalf("unexpected pinboard still running %v after SIGTERM", time.Since(sigterm))
	}
	exited := time.Since(sigterm)
	if code := pb.proc.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("unexpected exit code; got %d; want 0\n%s", code, pb.Output())
	}
	if exited >= grace {
		t.Errorf("unexpected exit %v after SIGTERM; want within the grace period %v", exited, grace)
	}
	if !strings.Contains(pb.Output(), "shutdown: closing streams") {
		t.Errorf("unexpected log without the shutdown line:\n%s", pb.Output())
	}
	t.Logf("slow request done %v after SIGTERM, exit after %v (grace %v)", finished, exited, grace)
}

// TestSecondSignalExitsAtOnce: a second SIGTERM or SIGINT during the grace
// period exits at once, status 1.
func TestSecondSignalExitsAtOnce(t *testing.T) {
	requireSuite(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	admin, env := adminEnv(t)
	f := StartWarmFleet(t, ctx, FleetOptions{Workers: []string{"w1"}, Headroom: 8,
		PinboardEnv: []string{env, "PINBOARD_SHUTDOWN_GRACE_MS=60000"}})
	pb := f.Pinboard
	if r, err := getWithRetry(ctx, pb.URL+"/counters/slow2/value"); err != nil || r.Status != http.StatusOK {
		t.Fatalf("cannot place: %s %v", r, err)
	}
	before := resolved(ctx, t, admin)
	go do(ctx, http.MethodGet, pb.URL+"/counters/slow2/slow?seconds=30", nil, nil)
	waitInFlight(ctx, t, admin, before)
	pb.proc.signal(syscall.SIGTERM)
	if pb.proc.wait(500 * time.Millisecond) {
		t.Fatalf("unexpected exit while a request is in flight (grace 60s)")
	}
	second := time.Now()
	pb.proc.signal(syscall.SIGINT)
	if !pb.proc.wait(5 * time.Second) {
		t.Fatalf("unexpected pinboard still running after the second signal")
	}
	if code := pb.proc.cmd.ProcessState.ExitCode(); code != 1 {
		t.Errorf("unexpected exit code; got %d; want 1", code)
	}
	t.Logf("exited %v after the second signal", time.Since(second))
}

// TestMetricsOpenStreamsAndDialErrors_RDP2_RDP3: the scrape counts what is
// open and what failed — one Server-Sent Events stream and one WebSocket
// relayed show as 1 in their gauges while open and 0 once closed; a
// request for an id whose worker was SIGKILLed answers 502 and counts one
// upstream error and one 5xx; each id placed counts one new placement.
func TestMetricsOpenStreamsAndDialErrors_RDP2_RDP3(t *testing.T) {
	requireSuite(t)
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	admin, env := adminEnv(t)
	f := StartWarmFleet(t, ctx, FleetOptions{Workers: []string{"w1"}, Headroom: 8, PinboardEnv: []string{env}})
	pb := f.Pinboard
	before := scrapeMetrics(ctx, t, admin)

	if r, err := getWithRetry(ctx, pb.URL+"/tickers/ms1/events?count=1"); err != nil || r.Status != http.StatusOK {
		t.Fatalf("cannot place /tickers/ms1: %s %v", r, err)
	}
	res, _ := openEvents(ctx, t, pb.URL+"/tickers/ms1/events?count=100000&interval=0.2")
	ws, err := wsDial(ctx, "ws://"+strings.TrimPrefix(pb.URL, "http://")+"/tickers/mw1/ws", nil)
	if err != nil {
		res.Body.Close()
		t.Fatalf("cannot open the WebSocket: %v", err)
	}
	if err := ws.WriteMessage(wsOpText, []byte("hi")); err != nil {
		t.Fatal(err)
	}
	if _, msg, err := ws.ReadMessage(); err != nil || string(msg) != "hi" {
		t.Fatalf("unexpected echo %q: %v", msg, err)
	}
	open := scrapeMetrics(ctx, t, admin)
	for _, series := range []string{`pinboard_proxy_open_streams`, `pinboard_proxy_open_websockets`} {
		if got := open[series]; got != 1 {
			t.Errorf("unexpected %s with one open; got %v; want 1", series, got)
		}
	}
	res.Body.Close()
	ws.Close(1000, 5*time.Second)
	for deadline := time.Now().Add(5 * time.Second); ; {
		m := scrapeMetrics(ctx, t, admin)
		if m[`pinboard_proxy_open_streams`] == 0 && m[`pinboard_proxy_open_websockets`] == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("unexpected gauges 5s after the stream and the WebSocket closed; got streams %v, websockets %v; want 0",
				m[`pinboard_proxy_open_streams`], m[`pinboard_proxy_open_websockets`])
		}
		time.Sleep(50 * time.Millisecond)
	}

	if r, err := getWithRetry(ctx, pb.URL+"/counters/md1/value"); err != nil || r.Status != http.StatusOK {
		t.Fatalf("cannot place /counters/md1: %s %v", r, err)
	}
	mid := scrapeMetrics(ctx, t, admin)
	f.Worker("w1").Kill()
	r, err := do(ctx, http.MethodGet, pb.URL+"/counters/md1/value", nil, nil)
	if err != nil || r.Status != http.StatusBadGateway {
		t.Fatalf("unexpected answer for an id on a killed worker; got %s %v; want 502", r, err)
	}
	after := scrapeMetrics(ctx, t, admin)
	upstream := 0.0
	kinds := map[string]float64{}
	for series, v := range after {
		if strings.HasPrefix(series, "pinboard_proxy_upstream_errors_total{") && v != mid[series] {
			upstream += v - mid[series]
			kinds[series] = v - mid[series]
		}
	}
	// dial, or read/write when a pooled connection is found dead first.
	if upstream != 1 {
		t.Errorf("unexpected change of pinboard_proxy_upstream_errors_total over the 502; got %v (%v); want 1", upstream, kinds)
	}
	t.Logf("the 502 counted as %v", kinds)
	if d := after[`pinboard_proxy_requests_total{namespace="/counters",code="5xx"}`] - mid[`pinboard_proxy_requests_total{namespace="/counters",code="5xx"}`]; d != 1 {
		t.Errorf("unexpected change of 5xx /counters requests over the 502; got %v; want 1", d)
	}
	if d := after[`pinboard_placements_total{kind="new"}`] - before[`pinboard_placements_total{kind="new"}`]; d != 3 {
		t.Errorf("unexpected change of new placements; got %v; want 3 (ms1, mw1, md1)", d)
	}
}

// TestWorkerKilledMidStream_RDP2_RDP3: a worker SIGKILLed while it holds
// an event stream and a WebSocket ends both at once for their clients —
// the event stream truncated (no last chunk: a client can tell it from a
// clean end), the WebSocket's connection closed — and the gauges of open
// streams and WebSockets come back to 0: nothing of either is held for a
// worker that is gone.
func TestWorkerKilledMidStream_RDP2_RDP3(t *testing.T) {
	requireSuite(t)
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	admin, env := adminEnv(t)
	f := StartWarmFleet(t, ctx, FleetOptions{Workers: []string{"w1"}, Headroom: 8, PinboardEnv: []string{env}})
	pb := f.Pinboard
	if r, err := getWithRetry(ctx, pb.URL+"/tickers/k1/events?count=1"); err != nil || r.Status != http.StatusOK {
		t.Fatalf("cannot place /tickers/k1: %s %v", r, err)
	}
	res, br := openEvents(ctx, t, pb.URL+"/tickers/k1/events?count=100000&interval=0.2")
	defer res.Body.Close()
	ws, err := wsDial(ctx, "ws://"+strings.TrimPrefix(pb.URL, "http://")+"/tickers/k2/ws", nil)
	if err != nil {
		t.Fatalf("cannot open the WebSocket: %v", err)
	}
	if err := ws.WriteMessage(wsOpText, []byte("hi")); err != nil {
		t.Fatal(err)
	}
	if _, msg, err := ws.ReadMessage(); err != nil || string(msg) != "hi" {
		t.Fatalf("unexpected echo %q: %v", msg, err)
	}

	f.Worker("w1").Kill()
	killed := time.Now()
	sseEnd := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, br)
		sseEnd <- err
	}()
	wsEnd := make(chan error, 1)
	go func() {
		_, _, err := ws.ReadMessage()
		wsEnd <- err
	}()
	for name, end := range map[string]chan error{"event stream": sseEnd, "WebSocket": wsEnd} {
		select {
		case err := <-end:
			if err == nil {
				t.Errorf("unexpected clean end of the %s of a killed worker; want an error (truncated)", name)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("unexpected %s still open 5s after its worker was killed", name)
		}
	}
	t.Logf("both ended %v after the kill", time.Since(killed).Round(time.Millisecond))
	for deadline := time.Now().Add(5 * time.Second); ; {
		m := scrapeMetrics(ctx, t, admin)
		if m[`pinboard_proxy_open_streams`] == 0 && m[`pinboard_proxy_open_event_streams`] == 0 && m[`pinboard_proxy_open_websockets`] == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("unexpected gauges 5s after the worker was killed; got streams %v, event streams %v, websockets %v; want 0",
				m[`pinboard_proxy_open_streams`], m[`pinboard_proxy_open_event_streams`], m[`pinboard_proxy_open_websockets`])
		}
		time.Sleep(50 * time.Millisecond)
	}
}
