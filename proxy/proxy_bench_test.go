package proxy

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/attest"
	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/internal/raceflag"
	"github.com/pinboard-go/pinboard/metrics"
)

// hotPath is the steady state the data plane is tuned for (issue 5): a
// placed id, a warm pooled connection to its worker, a small JSON answer.
type hotPath struct {
	p     *Proxy
	store *directory.Memory
	sess  string
	now   time.Time
	req   fasthttp.Request
	ctx   fasthttp.RequestCtx
}

// standInWorker serves a small JSON answer on 127.0.0.1, the way a worker
// answers /{ns}/{id}/json; it returns the advertise URL.
func standInWorker(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	body := []byte(`{"ns":"/bench","id":"alice","worker":0}`)
	srv := &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			if len(ctx.Request.Header.Peek(attest.HeaderName)) == 0 {
				ctx.SetStatusCode(fasthttp.StatusForbidden)
				return
			}
			ctx.Response.Header.SetContentType("application/json")
			ctx.Response.SetBodyRaw(body)
		},
		NoDefaultServerHeader: true,
		NoDefaultDate:         true,
	}
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(func() { _ = srv.Shutdown() })
	return "http://" + ln.Addr().String() + "/w/0/"
}

// benchPassport admits anonymous requests to every namespace, as the
// benchmarks' clients send no credential.
func benchPassport(tb testing.TB) *attest.Passport {
	tb.Helper()
	pp, err := attest.ParsePassport([]byte(`{"providers":[{"type":"staticToken","id":"pinboard","keys":[{"name":"dev",`+
		`"token":{"env":"PINBOARD_TOKEN"},"scopes":["pinboard:worker"],"claims":{"pinboard":{"namespaces":["*"],"allowedBackendHosts":["*"]}}}]}],`+
		`"namespaces":{"*":{"allow":"anonymous"}}}`), func(string) (string, bool) { return "dev-token", true })
	if err != nil {
		tb.Fatal(err)
	}
	return pp
}

func newHotPath(tb testing.TB) *hotPath { return newHotPathWith(tb, nil) }

// newHotPathWith is newHotPath with m recording the data plane's metrics
// (nil: none).
func newHotPathWith(tb testing.TB, m Metrics) *hotPath {
	tb.Helper()
	return newHotPathFor(tb, m, "/bench", "alice")
}

// newHotPathFor is newHotPathWith for the request GET {ns}/{id}/json.
func newHotPathFor(tb testing.TB, m Metrics, ns, id string) *hotPath {
	tb.Helper()
	now := time.Unix(1_800_000_000, 0)
	store := directory.NewMemory(time.Hour, now)
	reg, err := store.Register(context.Background(), &directory.Registration{
		ClientID: "c", Sub: "dev", Secret: "4f1c2b9e8d7a6c5b4f1c2b9e8d7a6c5b", Namespaces: []string{ns},
		AdvertiseURL: standInWorker(tb), Headroom: 100,
		Instances: map[string][]string{ns: {id}},
	}, now)
	if err != nil {
		tb.Fatal(err)
	}
	h := &hotPath{store: store, sess: reg.SessionID, now: now}
	h.p = New(Options{Store: store, Passport: benchPassport(tb), Now: func() time.Time { return h.now }, Metrics: m})
	h.req.Header.SetMethod(fasthttp.MethodGet)
	h.req.SetRequestURI(ns + "/" + id + "/json")
	h.req.Header.SetHost("pinboard.test")
	h.req.Header.Set("Accept", "application/json")
	h.req.Header.Set("User-Agent", "pinbench")
	h.ctx.Init(&h.req, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}, nil)
	h.once(tb) // dial the worker, mint the attestation, warm every buffer
	return h
}

// once sends the request through the proxy as the server would: a fresh
// copy of the client's request, the response left on ctx.
func (h *hotPath) once(tb testing.TB) {
	h.req.CopyTo(&h.ctx.Request)
	h.ctx.Response.Reset()
	h.p.ServeHTTP(&h.ctx)
	if s := h.ctx.Response.StatusCode(); s != fasthttp.StatusOK {
		tb.Fatalf("unexpected status through the proxy; got %d; want 200 (%s)", s, h.ctx.Response.Body())
	}
}

// BenchmarkHotPath: parse → resolve → attest → forward over a warm pooled
// connection → read the worker's answer, per request.
func BenchmarkHotPath(b *testing.B) {
	h := newHotPath(b)
	b.ReportAllocs()
	for b.Loop() {
		h.once(b)
	}
}

// TestHotPathAllocatesNothing guards the steady state: 0 allocations per
// proxied request (house style §3).
func TestHotPathAllocatesNothing(t *testing.T) {
	skipUnderRace(t)
	h := newHotPath(t)
	wantNoAllocs(t, "proxied request", func() { h.once(t) })
}

// TestHotPathLongNamesAllocateNothing_RDP1: the longest id (256
// characters) under a long namespace — namespaces have no bound of their
// own — is parsed, resolved and forwarded without an allocation too.
func TestHotPathLongNamesAllocateNothing_RDP1(t *testing.T) {
	skipUnderRace(t)
	for _, n := range []int{64, 1024} {
		h := newHotPathFor(t, nil, "/"+strings.Repeat("n", n-1), strings.Repeat("i", directory.MaxIDLen))
		wantNoAllocs(t, fmt.Sprintf("proxied request with a namespace of %d bytes", n), func() { h.once(t) })
	}
}

// TestHotPathWithMetricsAllocatesNothing: recording the request's metrics
// (status class by namespace, latency, directory lookup) keeps the steady
// state at 0 allocations (issue 6: recording a metric must not allocate on
// the hot path).
func TestHotPathWithMetricsAllocatesNothing(t *testing.T) {
	skipUnderRace(t)
	m := metrics.New(metrics.Options{})
	h := newHotPathWith(t, m)
	wantNoAllocs(t, "proxied request with metrics", func() { h.once(t) })
	exp := string(m.AppendPrometheus(t.Context(), nil))
	if !strings.Contains(exp, `pinboard_proxy_requests_total{namespace="/bench",code="2xx"} 1002`) {
		t.Fatalf("unexpected exposition: the requests were not recorded\n%s", exp)
	}
}

// TestHotPathWithCookiesAllocatesNothing_RDP1: a browser's request carries
// cookies, which the proxy keeps as sent and puts back after the header
// passes (saveCookies): still 0 allocations per request (R-DP-1).
func TestHotPathWithCookiesAllocatesNothing_RDP1(t *testing.T) {
	skipUnderRace(t)
	h := newHotPath(t)
	raw := "GET /bench/alice/json HTTP/1.1\r\nHost: pinboard.test\r\nAccept: application/json\r\nUser-Agent: pinbench\r\n" +
		"Cookie: session=\"abc==\"; theme=dark\r\nCookie: ab=1\r\n\r\n"
	h.req.Reset()
	if err := h.req.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		t.Fatal(err)
	}
	h.once(t)
	wantNoAllocs(t, "proxied request with cookies", func() { h.once(t) })
}

// asBrowser turns h's request into one a browser or a load balancer
// sends — Connection: keep-alive, a repeated field — and warms the path.
func (h *hotPath) asBrowser(tb testing.TB) {
	raw := "GET /bench/alice/json HTTP/1.1\r\nHost: pinboard.test\r\nConnection: keep-alive\r\nTracestate: a=1\r\n" +
		"Accept: application/json\r\nUser-Agent: pinbench\r\nTracestate: b=2\r\n\r\n"
	h.req.Reset()
	if err := h.req.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		tb.Fatal(err)
	}
	h.once(tb)
}

// wantNoAllocs fails t unless f allocates nothing per call, what naming
// one call in the failure.
func wantNoAllocs(t *testing.T, what string, f func()) {
	t.Helper()
	if n := testing.AllocsPerRun(1000, f); n != 0 {
		t.Fatalf("unexpected allocations per %s; got %v; want 0", what, n)
	}
}

// skipUnderRace skips an allocation count: the race detector's sync.Pool
// drops items on purpose, so counts under it are meaningless.
func skipUnderRace(t *testing.T) {
	t.Helper()
	if raceflag.Enabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
}

// BenchmarkHotPathBrowser is BenchmarkHotPath for a browser's request
// (asBrowser): the Connection line deleted, the repeated field's order
// checked and put back.
func BenchmarkHotPathBrowser(b *testing.B) {
	h := newHotPath(b)
	h.asBrowser(b)
	b.ReportAllocs()
	for b.Loop() {
		h.once(b)
	}
}

// TestHotPathBrowserRequestAllocatesNothing_RDP1: a browser's or load
// balancer's request carries Connection: keep-alive, deleted before it is
// forwarded, and may repeat a field (tracestate) whose lines the deletion
// moves and keepFieldOrder puts back: still 0 allocations per request.
// Before, the Connection line alone cost three (R-DP-1).
func TestHotPathBrowserRequestAllocatesNothing_RDP1(t *testing.T) {
	skipUnderRace(t)
	h := newHotPath(t)
	h.asBrowser(t)
	wantNoAllocs(t, "proxied browser request", func() { h.once(t) })
}

// TestHotPathWithCredentialAllocatesNothing_RTR4: a request presenting a
// passport credential — checked, consumed (one Authorization line only),
// its account signed into the attestation — is still 0 allocations per
// request (R-TR-4).
func TestHotPathWithCredentialAllocatesNothing_RTR4(t *testing.T) {
	skipUnderRace(t)
	h := newHotPath(t)
	h.req.Header.Set("Authorization", "Bearer dev-token")
	h.once(t)
	wantNoAllocs(t, "proxied request with a credential", func() { h.once(t) })
}

// asHTTP10 turns h's request into one an HTTP/1.0 client sends (ab's,
// without keep-alive), parsed as the server parses it, and warms the path.
func (h *hotPath) asHTTP10(tb testing.TB) {
	tb.Helper()
	raw := "GET /bench/alice/json HTTP/1.0\r\nHost: pinboard.test\r\nAccept: application/json\r\nUser-Agent: pinbench\r\n\r\n"
	h.req.Reset()
	if err := h.req.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		tb.Fatal(err)
	}
	h.once(tb)
}

// workerConns returns the connections open to the stand-in worker.
func (h *hotPath) workerConns() int {
	h.p.ups.mu.RLock()
	defer h.p.ups.mu.RUnlock()
	n := 0
	for _, u := range h.p.ups.m {
		n += u.pool.open()
	}
	return n
}

// BenchmarkHotPathHTTP10 is BenchmarkHotPath for an HTTP/1.0 client: its
// request goes to the worker as HTTP/1.1 over the same warm pooled
// connection (before, the worker closed the connection after each
// answer and every request dialled it anew).
func BenchmarkHotPathHTTP10(b *testing.B) {
	h := newHotPath(b)
	h.asHTTP10(b)
	b.ReportAllocs()
	for b.Loop() {
		h.once(b)
	}
}

// TestHotPathHTTP10AllocatesNothing: an HTTP/1.0 client's request costs
// no allocation either, nor a connection to the worker (R-DP-1, R-DP-3).
func TestHotPathHTTP10AllocatesNothing(t *testing.T) {
	skipUnderRace(t)
	h := newHotPath(t)
	h.asHTTP10(t)
	wantNoAllocs(t, "proxied HTTP/1.0 request", func() { h.once(t) })
	if !h.ctx.Response.ConnectionClose() || h.ctx.Request.Header.IsHTTP11() {
		t.Fatalf("unexpected answer to an HTTP/1.0 client; got close=%v, request HTTP/1.1=%v; want the connection closed and the client's version kept",
			h.ctx.Response.ConnectionClose(), h.ctx.Request.Header.IsHTTP11())
	}
	if n := h.workerConns(); n != 1 {
		t.Fatalf("unexpected worker connections; got %d; want 1", n)
	}
}

// BenchmarkHotPathServer measures the whole node's data path: a fasthttp
// server running the proxy, keep-alive clients, the stand-in worker — all
// in this process, so ns/op is CPU spent on both sides of the proxy too.
func BenchmarkHotPathServer(b *testing.B) {
	h := newHotPath(b)
	srv := &fasthttp.Server{
		Handler:               h.p.ServeHTTP,
		NoDefaultServerHeader: true,
		NoDefaultDate:         true,
		NoDefaultContentType:  true,
		StreamRequestBody:     true,
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Shutdown()
	raw := []byte("GET /bench/alice/json HTTP/1.1\r\nHost: pinboard.test\r\nUser-Agent: pinbench\r\n\r\n")
	b.ReportAllocs()
	b.SetParallelism(4)
	b.RunParallel(func(pb *testing.PB) {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Error(err)
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		var resp fasthttp.Response
		for pb.Next() {
			if _, err := c.Write(raw); err != nil {
				b.Error(err)
				return
			}
			if err := resp.Read(br); err != nil || resp.StatusCode() != 200 {
				b.Errorf("unexpected response: %v %d", err, resp.StatusCode())
				return
			}
		}
	})
}

// BenchmarkColdPath: every request is a new id, placed on the worker
// before it is forwarded (R-PL-1).
func BenchmarkColdPath(b *testing.B) {
	next := newColdPath(b)
	b.ReportAllocs()
	for b.Loop() {
		next()
	}
}

// newColdPath is a hot path whose store's cold-start quarantine has
// passed; next proxies a request for an id never seen before.
func newColdPath(tb testing.TB) (next func()) {
	h := newHotPath(tb)
	// The first placement attempt starts the cold-start quarantine
	// (R-CS-1): let it pass, renewing the worker's lease.
	ctx := context.Background()
	_, _ = h.store.Place(ctx, &directory.PlaceRequest{NS: "/bench", ID: "first", Now: h.now})
	h.now = h.now.Add(time.Hour / 2)
	if _, err := h.store.Heartbeat(ctx, &directory.Beat{SessionID: h.sess, Sub: "dev", Headroom: 100}, h.now); err != nil {
		tb.Fatal(err)
	}
	h.now = h.now.Add(time.Hour / 2)
	uri := []byte("/bench/c")
	var n [20]byte
	i := 0
	return func() {
		i++
		uri = append(append(uri[:len("/bench/c")], strconv.AppendInt(n[:0], int64(i), 10)...), "/json"...)
		h.req.SetRequestURIBytes(uri)
		h.once(tb)
	}
}

// TestColdPathAllocations_RPL1: a new id's placement on the memory store
// allocates what the placement keeps (its key; the row is held by value)
// and the strings the store is handed (namespace, id, host, the client IP
// for affinity) — no scratch for the policy or the request (R-PL-1).
// Garbage per placement sets how often a node placing ids at thousands a
// second collects, and objects kept how long each collection marks
// (docs/bench/HISTORY.md: cold placements' open-loop tail); BenchmarkColdPath
// counted 11 allocations and 1.2 KB before, one of them its own.
func TestColdPathAllocations_RPL1(t *testing.T) {
	skipUnderRace(t)
	next := newColdPath(t)
	next()
	if n := testing.AllocsPerRun(1000, next); n > 5 {
		t.Fatalf("unexpected allocations per cold placement; got %v; want at most 5", n)
	}
}
