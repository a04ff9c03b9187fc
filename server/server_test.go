package server

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/attest"
	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/internal/testlog"
	"github.com/pinboard-go/pinboard/metrics"
)

// node starts a Pinboard on 127.0.0.1 with an admin listener; it returns
// the public and admin base URLs and a function that shuts it down.
func node(t *testing.T, o Options) (*Pinboard, string, string, func() error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return nodeOn(t, o, ln)
}

// nodeOn is node serving its public listener on ln.
func nodeOn(t *testing.T, o Options, ln net.Listener) (*Pinboard, string, string, func() error) {
	t.Helper()
	pp, err := attest.ParsePassport([]byte(`{"providers":[{"type":"staticToken","id":"p","keys":[{"name":"k","token":{"env":"T"},"scopes":["pinboard:operator"],"claims":{"pinboard":{"namespaces":["*"]}}}]}],"namespaces":{"*":{"allow":"anonymous"}}}`),
		func(string) (string, bool) { return "tok", true })
	if err != nil {
		t.Fatal(err)
	}
	// The store's lease is the cold-start quarantine's length: the default
	// one, so that TestAdminEndpoints still sees the quarantine on its
	// next request however slow the machine (1 s was not always enough).
	o.Store = directory.NewMemory(DefaultLeaseTTL, time.Now())
	o.Passport = pp
	pb, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	aln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go pb.ServeAdmin(aln)
	stop := serveUntilStopped(t, pb, ln, time.Second)
	return pb, "http://" + ln.Addr().String(), "http://" + aln.Addr().String(), stop
}

// serveUntilStopped runs pb.Serve on ln with the given grace until stop,
// which cancels it, waits for Serve to return and hands back its error;
// stop runs once however often it is called, and at cleanup if the test
// did not call it.
func serveUntilStopped(t *testing.T, pb *Pinboard, ln net.Listener, grace time.Duration) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- pb.Serve(ctx, ln, grace) }()
	var once sync.Once
	var serveErr error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case serveErr = <-done:
			case <-time.After(10 * time.Second):
				t.Errorf("unexpected Serve still running 10s after cancel")
			}
		})
		return serveErr
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func TestAdminEndpoints(t *testing.T) {
	m := metrics.New(metrics.Options{Version: "test"})
	pb, public, admin, stop := node(t, Options{Metrics: m})
	for _, base := range []string{public, admin} {
		if code, body := get(t, base+"/livez"); code != 200 || body != `{"ok":true}` {
			t.Errorf("unexpected %s/livez; got %d %s", base, code, body)
		}
		if code, body := get(t, base+"/readyz"); code != 200 || body != `{"ok":true,"quarantineMs":0}` {
			t.Errorf("unexpected %s/readyz; got %d %s", base, code, body)
		}
	}
	// A placement attempt stamps the cold-start quarantine: not ready.
	get(t, public+"/counters/a/value")
	if code, body := get(t, admin+"/readyz"); code != 503 || !strings.Contains(body, "quarantineMs") {
		t.Errorf("unexpected /readyz in quarantine; got %d %s; want 503", code, body)
	}
	code, body := get(t, admin+"/metrics")
	if code != 200 || !strings.Contains(body, `pinboard_proxy_requests_total{namespace="none",code="5xx"} 1`) ||
		!strings.Contains(body, `pinboard_build_info{version="test"`) || !strings.Contains(body, "pinboard_directory_up 1") ||
		!strings.Contains(body, "\npinboard_proxy_open_event_streams 0\n") {
		t.Errorf("unexpected /metrics; got %d\n%s", code, body)
	}
	if code, _ := get(t, public+"/metrics"); code != 404 {
		t.Errorf("unexpected public /metrics; got %d; want 404", code)
	}
	if code, _ := get(t, admin+"/nothing"); code != 404 {
		t.Errorf("unexpected admin /nothing; got %d; want 404", code)
	}
	if code, _ := get(t, admin+"/debug/pprof/"); code != 404 {
		t.Errorf("unexpected pprof without Options.Pprof; got %d; want 404", code)
	}

	// Readiness fails as soon as shutdown begins; the admin listener
	// closes last.
	pb.stopping.Store(true)
	if code, body := get(t, admin+"/readyz"); code != 503 || body != `{"ok":false,"shuttingDown":true}` {
		t.Errorf("unexpected /readyz while stopping; got %d %s", code, body)
	}
	if err := stop(); err != nil {
		t.Fatalf("unexpected shutdown error: %v", err)
	}
	if _, err := http.Get(admin + "/livez"); err == nil {
		t.Errorf("unexpected admin listener still answering after shutdown")
	}
}

func TestAdminPprof(t *testing.T) {
	_, _, admin, _ := node(t, Options{Pprof: true})
	if code, body := get(t, admin+"/debug/pprof/"); code != 200 || !strings.Contains(body, "goroutine") {
		t.Fatalf("unexpected /debug/pprof/; got %d", code)
	}
}

func TestAccessLogSampling(t *testing.T) {
	var logs testlog.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	_, public, _, _ := node(t, Options{Logger: log, AccessLogSample: 1})
	get(t, public+"/counters/a/value?secret=x")
	if s := logs.String(); !strings.Contains(s, "msg=access") || !strings.Contains(s, "path=/counters/a/value ") || strings.Contains(s, "secret") {
		t.Errorf("unexpected access log:\n%s", s)
	}

	// A request refused on its header in place of a 100 Continue (fasthttp
	// runs no handler for it) is logged too: before, the metrics counted
	// it and the access log at sample 1 did not.
	before := strings.Count(logs.String(), "msg=access")
	c, err := net.Dial("tcp", strings.TrimPrefix(public, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	_, _ = io.WriteString(c, "POST /nons HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
	if res, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || res.StatusCode != 404 {
		t.Fatalf("unexpected answer to a request for an unknown namespace with Expect; got %v, %v; want 404", res, err)
	}
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		s := logs.String()
		if strings.Count(s, "msg=access") == before+1 && strings.Contains(s, "path=/nons ") && strings.Contains(s, "status=404") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("unexpected access log after a request refused in place of its 100 Continue; want one more line for it:\n%s", s)
		}
	}

	var quiet testlog.Buffer
	_, public, _, _ = node(t, Options{Logger: slog.New(slog.NewTextHandler(&quiet, nil))})
	get(t, public+"/counters/a/value")
	if strings.Contains(quiet.String(), "msg=access") {
		t.Errorf("unexpected access log with sampling off:\n%s", quiet.String())
	}
	if _, err := New(Options{Store: directory.NewMemory(time.Second, time.Now()), Passport: &attest.Passport{}, AccessLogSample: 2}); err == nil {
		t.Errorf("unexpected New without error for AccessLogSample 2")
	}
}

// A request body that stops arriving is cut after the stall timeout even
// when ReadTimeout is off (its default): fasthttp reads up to 8 KiB of it
// before any handler runs, and the data plane's own stall deadlines start
// only then (R-DP-2).
func TestStalledBodyCutBeforeHandler_RDP2(t *testing.T) {
	o := Options{}
	o.Upstream.StallTimeout = 300 * time.Millisecond
	_, public, _, _ := node(t, o)
	c, err := net.Dial("tcp", strings.TrimPrefix(public, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "POST /counters/alice/x HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_ = c.SetReadDeadline(start.Add(10 * time.Second))
	if _, err := io.ReadAll(c); err != nil {
		t.Fatalf("unexpected connection still open %v after its body went silent; got %v; want it answered and closed after the 300ms stall timeout", time.Since(start), err)
	}
}

// A request fasthttp cannot read — a target neither /… nor
// http(s)://host/… (docs/PROTOCOL.md §5), a header too large — is
// answered by serverError, never by Handle; it answered fasthttp's
// text/plain "Error when parsing request" where every other error is
// JSON {"error": …} (R-DP-4).
func TestUnreadableRequestErrorsAreJSON_RDP4(t *testing.T) {
	_, public, _, _ := node(t, Options{})
	for _, tc := range []struct {
		req    string
		status int
	}{
		{"GET * HTTP/1.1\r\nHost: a\r\n\r\n", 400},
		{"GET counters/alice/value HTTP/1.1\r\nHost: a\r\n\r\n", 400},
		{"GET /livez HTTP/1.1\r\nHost: a\r\nX-Big: " + strings.Repeat("x", 64<<10) + "\r\n\r\n", 431},
	} {
		c, err := net.Dial("tcp", strings.TrimPrefix(public, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		_, _ = io.WriteString(c, tc.req)
		var res fasthttp.Response
		err = res.Read(bufio.NewReader(c))
		c.Close()
		var body struct{ Error string }
		jerr := json.Unmarshal(res.Body(), &body)
		if err != nil || res.StatusCode() != tc.status || string(res.Header.ContentType()) != "application/json" || jerr != nil || body.Error == "" {
			t.Errorf("unexpected answer to %.40q; got %d %q %s (%v); want %d application/json {\"error\":…}", tc.req, res.StatusCode(), res.Header.ContentType(), res.Body(), err, tc.status)
		}
	}
}

// The access log's path is the path: for an absolute-form target
// (RFC 9112 §3.2.2, sent by clients set up for a forward proxy) it is the
// origin form the router served, and one the router refuses for its
// userinfo ("http://user:password@host/…") is logged without scheme and
// authority — a userinfo is a credential, and the access log promises
// none ("never the query, which may carry secrets").
func TestAccessLogAbsoluteFormPath(t *testing.T) {
	var logs testlog.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	_, public, _, _ := node(t, Options{Logger: log, AccessLogSample: 1})
	addr := strings.TrimPrefix(public, "http://")
	for _, target := range []string{"http://" + addr + "/counters/a/value?x=1", "http://user:hunter2@" + addr + "/counters/b/value"} {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, "GET "+target+" HTTP/1.1\r\nHost: "+addr+"\r\nConnection: close\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, c)
		c.Close()
	}
	s := logs.String()
	if !strings.Contains(s, "path=/counters/a/value ") || !strings.Contains(s, "path=/counters/b/value ") || strings.Contains(s, "hunter2") || strings.Contains(s, "path=http") {
		t.Errorf("unexpected access log for absolute-form targets:\n%s", s)
	}
}

// A request fasthttp cannot read is logged at debug level (fasthttp's
// "error when serving connection"), and fasthttp's error quoted the header
// it had read: a client's Authorization and Cookie lines went into
// pinboard's log whenever PINBOARD_LOG_LEVEL=debug, on the public
// listener and on the admin listener alike (R-TR-1).
func TestUnreadableRequestCredentialsNotLogged_RTR1(t *testing.T) {
	var logs testlog.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	_, public, admin, _ := node(t, Options{Logger: log})
	const secret = "Bearer hunter2-token\r\nCookie: session=hunter2-cookie"
	reqs := []string{
		"GET /counters/a/value HTTP/1.1\r\nHost: a\r\nAuthorization: " + secret + "\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
		"GET /counters/a/value HTTP/1.1\r\nHost: a\r\nAuthorization: " + secret + "\r\nTransfer-Encoding: gzip\r\n\r\n",
		"GET /livez HTTP/1.1\r\nHost: a\r\nAuthorization: " + secret + "\r\n\x00: y\r\n\r\n",
	}
	for _, base := range []string{public, admin} {
		for _, req := range reqs {
			c, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			_, _ = io.WriteString(c, req)
			_, _ = io.Copy(io.Discard, c)
			c.Close()
		}
	}
	// fasthttp logs each error as the connection ends, after the answer.
	want := 2 * len(reqs)
	for deadline := time.Now().Add(5 * time.Second); strings.Count(logs.String(), "error when serving connection") < want && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	s := logs.String()
	if n := strings.Count(s, "error when serving connection"); n < want {
		t.Fatalf("unexpected number of logged read errors; got %d; want %d:\n%s", n, want, s)
	}
	if strings.Contains(s, "hunter2") {
		t.Errorf("unexpected credential in the log; got\n%s\nwant no Authorization or Cookie value", s)
	}
}

// The node's metrics count a Server-Sent Event stream in
// pinboard_proxy_open_event_streams (and pinboard_proxy_open_streams)
// while it is relayed, and drop back once it ended (R-DP-2).
func TestOpenEventStreamsGauge_RDP2(t *testing.T) {
	m := metrics.New(metrics.Options{Version: "test"})
	release := make(chan struct{})
	_, public := workerNode(t, Options{Metrics: m}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: 0\n\n")
		w.(http.Flusher).Flush()
		<-release
	}))
	gauges := func() string {
		s := string(m.AppendPrometheus(t.Context(), nil))
		var b strings.Builder
		for _, name := range []string{"pinboard_proxy_open_event_streams", "pinboard_proxy_open_streams"} {
			for line := range strings.Lines(s) {
				if strings.HasPrefix(line, name+" ") {
					b.WriteString(line)
				}
			}
		}
		return b.String()
	}
	res, err := http.Get(public + "/counters/alice/events")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if line, err := bufio.NewReader(res.Body).ReadString('\n'); err != nil || line != "data: 0\n" {
		t.Fatalf("unexpected first event; got %q, %v; want %q", line, err, "data: 0\n")
	}
	want := "pinboard_proxy_open_event_streams 1\npinboard_proxy_open_streams 1\n"
	if got := gauges(); got != want {
		t.Fatalf("unexpected gauges while an event stream is relayed; got %q; want %q", got, want)
	}
	close(release)
	_, _ = io.Copy(io.Discard, res.Body)
	want = "pinboard_proxy_open_event_streams 0\npinboard_proxy_open_streams 0\n"
	deadline := time.Now().Add(5 * time.Second)
	for got := gauges(); got != want; got = gauges() {
		if time.Now().After(deadline) {
			t.Fatalf("unexpected gauges after the event stream ended; got %q; want %q", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A client connection whose event stream ended cleanly goes back to the
// server for its next request (proxy.Options.Resume): while it waits for
// that request, idle, it is a client connection on the public listener
// like any other keep-alive one, and pinboard_http_open_connections
// counts it (R-DP-2).
func TestOpenConnectionsCountsResumedConnection_RDP2(t *testing.T) {
	m := metrics.New(metrics.Options{Version: "test"})
	_, public := workerNode(t, Options{Metrics: m}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: 0\n\n")
	}))
	gauge := func() string {
		for line := range strings.Lines(string(m.AppendPrometheus(t.Context(), nil))) {
			if strings.HasPrefix(line, "pinboard_http_open_connections ") {
				return line
			}
		}
		return ""
	}
	c, err := net.Dial("tcp", strings.TrimPrefix(public, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, "GET /counters/alice/events HTTP/1.1\r\nHost: x\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, res.Body); err != nil || res.Close {
		t.Fatalf("unexpected end of the event stream; got %v, close %v; want a clean end on a kept connection", err, res.Close)
	}
	want := "pinboard_http_open_connections 1\n"
	deadline := time.Now().Add(2 * time.Second)
	for got := gauge(); got != want; got = gauge() {
		if time.Now().After(deadline) {
			t.Fatalf("unexpected gauge with the client's connection idle after its event stream; got %q; want %q", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Its next request is served on it, and it is still counted once.
	_, _ = io.WriteString(c, "GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
	if res, err := http.ReadResponse(br, nil); err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("unexpected answer on the resumed connection; got %v, %v; want 200", res, err)
	}
	time.Sleep(50 * time.Millisecond)
	if got := gauge(); got != want {
		t.Fatalf("unexpected gauge once the resumed connection served a request; got %q; want %q", got, want)
	}
}

// The library takes the lease from the store, which grants it: left out,
// Options.LeaseTTL is the store's; set to another, New refuses. Before, a
// registration got the store's 1 s lease while /registry/health said
// 60000 (R-SRV-4, R-LS-1). A base path no request could match (not as
// clients send it) is refused as PINBOARD_BASE_PATH is.
func TestLibraryOptionsMatchWhatRuns_RSRV4_RLS1(t *testing.T) {
	pb, _ := testPinboardWith(t, "", func(o *Options) { o.LeaseTTL = 0 })
	if _, body := call(pb, "GET", "/registry/health", "tok"); !strings.Contains(body, `"leaseTtlMs":1000`) {
		t.Errorf("unexpected health with LeaseTTL left out; got %s; want the store's 1000 ms", body)
	}
	pp := &attest.Passport{}
	if _, err := New(Options{Store: directory.NewMemory(time.Second, time.Now()), Passport: pp, LeaseTTL: time.Minute}); err == nil || !strings.Contains(err.Error(), "differs from the store's lease TTL 1s") {
		t.Errorf("unexpected New with LeaseTTL 1m over a 1s store; got %v; want the mismatch refused", err)
	}
	for _, bp := range []string{"/pinbøard", "/a/../b", "/p b", "pb"} {
		if _, err := New(Options{Store: directory.NewMemory(time.Second, time.Now()), Passport: pp, BasePath: bp}); err == nil {
			t.Errorf("unexpected New with BasePath %q, which no request can match; want it refused", bp)
		}
	}
}
