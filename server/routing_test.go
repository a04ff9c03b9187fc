package server

import (
	"context"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/attest"
	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/proxy"
)

func testPinboard(t *testing.T, base string) (*Pinboard, *directory.Memory) {
	t.Helper()
	return testPinboardWith(t, base, nil)
}

// testPinboardWith is testPinboard with its Options changed by opts, if
// not nil.
func testPinboardWith(t *testing.T, base string, opts func(*Options)) (*Pinboard, *directory.Memory) {
	t.Helper()
	pp, err := attest.ParsePassport([]byte(`{"providers":[{"type":"staticToken","id":"p","keys":[{"name":"op","token":{"env":"T"},"scopes":["pinboard:operator"],"claims":{"pinboard":{"namespaces":["*"]}}}]}],"namespaces":{"*":{"allow":"anonymous"}}}`),
		func(k string) (string, bool) { return "tok", k == "T" })
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	store := directory.NewMemory(time.Second, now)
	o := Options{Store: store, Passport: pp, BasePath: base, LeaseTTL: time.Second, Now: func() time.Time { return now }}
	if opts != nil {
		opts(&o)
	}
	pb, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pb.registry.Close(time.Second) })
	return pb, store
}

func call(pb *Pinboard, method, uri, token string) (int, string) {
	var req fasthttp.Request
	req.Header.SetMethod(method)
	req.SetRequestURI(uri)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	var ctx fasthttp.RequestCtx
	ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9}, nil)
	pb.Handle(&ctx)
	return ctx.Response.StatusCode(), string(ctx.Response.Body())
}

// One listener serves the registry, the operator API and the data plane
// (R-SRV-1), under the base path when one is set (R-SRV-4).
func TestRouting_RSRV1_RSRV4(t *testing.T) {
	for _, base := range []string{"", "/pb"} {
		pb, _ := testPinboard(t, base)
		cases := []struct {
			uri    string
			status int
			body   string
		}{
			{base + "/registry/health", 200, `{"ok":true,"store":"memory","quarantineMs":0,"leaseTtlMs":1000,"workers":0}`},
			{base + "/registry/nope", 404, `{"error":"not found"}`},
			{base + "/livez", 200, `{"ok":true}`},
			{base + "/readyz", 200, `{"ok":true,"quarantineMs":0}`},
			{base + "/counters/alice/value", 503, ""},
			{base + "/counters", 404, `{"error":"not found"}`},
		}
		for _, tc := range cases {
			status, body := call(pb, "GET", tc.uri, "tok")
			if status != tc.status || (tc.body != "" && body != tc.body) {
				t.Fatalf("unexpected reply for %s (base %q); got %d %s; want %d %s", tc.uri, base, status, body, tc.status, tc.body)
			}
		}
		if base != "" {
			// Outside the base path nothing answers but the 404, the
			// registry and the probes included.
			for _, uri := range []string{"/registry/health", "/registry/workers", "/livez", "/readyz", "/pbx/registry/health", base} {
				if status, body := call(pb, "GET", uri, "tok"); status != 404 || body != `{"error":"not found"}` {
					t.Fatalf("unexpected reply for %s outside the base path %s; got %d %s; want 404", uri, base, status, body)
				}
			}
		}
		// The first placement attempt started the quarantine: /readyz says so.
		if status, body := call(pb, "GET", base+"/readyz", ""); status != 503 || !strings.Contains(body, `"quarantineMs":1000`) {
			t.Fatalf("unexpected readiness during the quarantine; got %d %s", status, body)
		}
	}
}

func TestNewValidatesOptions(t *testing.T) {
	if _, err := New(Options{}); err == nil {
		t.Fatalf("unexpected success without a store")
	}
	pb, store := testPinboard(t, "")
	_ = pb
	if _, err := New(Options{Store: store}); err == nil {
		t.Fatalf("unexpected success without a passport")
	}
}

// Serve stops on context cancellation and a stopped node answers the
// registry with 503 "not the serving fleet" (R-REG-2).
func TestServeAndShutdown(t *testing.T) {
	pb, _ := testPinboard(t, "")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- pb.Serve(ctx, ln, 2*time.Second) }()
	status, body, err := fasthttp.Get(nil, "http://"+ln.Addr().String()+"/livez")
	if err != nil || status != 200 || string(body) != `{"ok":true}` {
		t.Fatalf("unexpected livez; got %d %s %v", status, body, err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("unexpected shutdown error: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("unexpected hang in shutdown")
	}
	if status, body := call(pb, "GET", "/registry/health", "tok"); status != 503 || body != `{"error":"not the serving fleet"}` {
		t.Fatalf("unexpected registry reply after shutdown; got %d %s", status, body)
	}
}

// downStore is a store that does not answer.
type downStore struct{ directory.Store }

func (downStore) Quarantine(context.Context, time.Time) (time.Duration, error) {
	return 0, context.DeadlineExceeded
}

// Readiness checks can be left out, as kube-apiserver's ?exclude=: the
// store and the quarantine are shared by every node, and a Service that
// is the only way to the fleet must not lose every node to them at once
// (R-CS-1; docs/OPERATIONS.md). Shutdown is never left out.
func TestReadinessExclusions_RCS1(t *testing.T) {
	pb, _ := testPinboard(t, "")
	call(pb, "GET", "/counters/alice/value", "") // stamps the quarantine
	cases := []struct {
		uri    string
		status int
		body   string
	}{
		{"/readyz", 503, `{"ok":false,"quarantineMs":1000}`},
		{"/readyz?exclude=quarantine", 200, `{"ok":true,"quarantineMs":1000}`},
		{"/readyz?exclude=store", 503, `{"ok":false,"quarantineMs":1000}`},
		{"/readyz?exclude=store&exclude=quarantine", 200, `{"ok":true}`},
		{"/readyz?exclude=redis", 400, `{"error":"unknown readiness check \"redis\": exclude store or quarantine","ok":false}`},
	}
	for _, tc := range cases {
		if status, body := call(pb, "GET", tc.uri, ""); status != tc.status || body != tc.body {
			t.Fatalf("unexpected reply for %s; got %d %s; want %d %s", tc.uri, status, body, tc.status, tc.body)
		}
	}

	down, _ := testPinboard(t, "")
	down.store = downStore{down.store}
	for uri, want := range map[string]string{
		"/readyz":                    `503 {"ok":false,"error":"directory unavailable"}`,
		"/readyz?exclude=quarantine": `503 {"ok":false,"error":"directory unavailable"}`,
		"/readyz?exclude=store":      `200 {"ok":true,"error":"directory unavailable"}`,
	} {
		if status, body := call(down, "GET", uri, ""); itoa(status)+" "+body != want {
			t.Fatalf("unexpected reply for %s with the store down; got %d %s; want %s", uri, status, body, want)
		}
	}

	pb.stopping.Store(true)
	if status, body := call(pb, "GET", "/readyz?exclude=store&exclude=quarantine", ""); status != 503 || body != `{"ok":false,"shuttingDown":true}` {
		t.Fatalf("unexpected readiness while stopping; got %d %s", status, body)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// Readiness's 503s carry Retry-After like every other 503 of pinboard's
// (docs/PROTOCOL.md, conventions): the rest of the quarantine rounded up
// to seconds, 1 for a store that does not answer and for a shutdown
// (R-CS-1, R-DP-4). They had none.
func TestReadinessRetryAfter_RCS1_RDP4(t *testing.T) {
	retryAfter := func(pb *Pinboard, uri string) (int, string) {
		var req fasthttp.Request
		req.SetRequestURI(uri)
		var ctx fasthttp.RequestCtx
		ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9}, nil)
		pb.Handle(&ctx)
		return ctx.Response.StatusCode(), string(ctx.Response.Header.Peek("Retry-After"))
	}
	pb, _ := testPinboard(t, "")
	if status, ra := retryAfter(pb, "/readyz"); status != 200 || ra != "" {
		t.Fatalf("unexpected readiness before the quarantine; got %d Retry-After %q; want 200 without", status, ra)
	}
	call(pb, "GET", "/counters/alice/value", "") // stamps the 1 s quarantine
	if status, ra := retryAfter(pb, "/readyz"); status != 503 || ra != "1" {
		t.Fatalf("unexpected readiness in the quarantine; got %d Retry-After %q; want 503 and 1", status, ra)
	}
	down, _ := testPinboard(t, "")
	down.store = downStore{down.store}
	if status, ra := retryAfter(down, "/readyz"); status != 503 || ra != "1" {
		t.Fatalf("unexpected readiness with the store down; got %d Retry-After %q; want 503 and 1", status, ra)
	}
	pb.stopping.Store(true)
	if status, ra := retryAfter(pb, "/readyz?exclude=store&exclude=quarantine"); status != 503 || ra != "1" {
		t.Fatalf("unexpected readiness while stopping; got %d Retry-After %q; want 503 and 1", status, ra)
	}
}

// An absolute-form request target (RFC 9112 §3.2.2: a server must accept
// it; edges configured as forward proxies send it) routes like its
// origin form: the data plane took it, but /registry/*, /livez and
// /readyz went to the data plane as namespaces and answered 404 or 503.
func TestRoutingAbsoluteForm_RSRV1(t *testing.T) {
	for _, base := range []string{"", "/pb"} {
		pb, _ := testPinboard(t, base)
		for _, tc := range []struct {
			uri    string
			status int
			body   string
		}{
			{"http://pinboard.internal" + base + "/livez", 200, `{"ok":true}`},
			{"HTTP://pinboard.internal:8080" + base + "/readyz?exclude=store", 200, `{"ok":true,"quarantineMs":0}`},
			{"http://pinboard.internal" + base + "/registry/health", 200, `{"ok":true,"store":"memory","quarantineMs":0,"leaseTtlMs":1000,"workers":0}`},
		} {
			if status, body := call(pb, "GET", tc.uri, "tok"); status != tc.status || body != tc.body {
				t.Fatalf("unexpected reply for %s (base %q); got %d %s; want %d %s", tc.uri, base, status, body, tc.status, tc.body)
			}
		}
	}
}

// /livez and /readyz are GET or HEAD (docs/OPERATIONS.md, "Health
// endpoints"). The admin listener answered other methods 405 with no
// body; the public one answered them 200 as if they were probes. Both
// now answer 405 with Allow and a JSON error (R-DP-4's error shape).
func TestHealthMethods_RSRV1(t *testing.T) {
	pb, _ := testPinboard(t, "")
	for _, h := range []struct {
		name   string
		handle func(*fasthttp.RequestCtx)
	}{{"public", pb.Handle}, {"admin", pb.HandleAdmin}} {
		for _, path := range []string{"/livez", "/readyz"} {
			for _, m := range []string{"GET", "HEAD"} {
				ctx := probeCtx(m, path)
				h.handle(ctx)
				if ctx.Response.StatusCode() != 200 {
					t.Errorf("unexpected %s %s on the %s listener; got %d; want 200", m, path, h.name, ctx.Response.StatusCode())
				}
			}
			for _, m := range []string{"POST", "PUT", "DELETE"} {
				ctx := probeCtx(m, path)
				h.handle(ctx)
				status, allow, body := ctx.Response.StatusCode(), string(ctx.Response.Header.Peek("Allow")), string(ctx.Response.Body())
				if status != 405 || allow != "GET, HEAD" || body != `{"error":"method not allowed"}` {
					t.Errorf("unexpected %s %s on the %s listener; got %d Allow %q %s; want 405 Allow \"GET, HEAD\" {\"error\":\"method not allowed\"}", m, path, h.name, status, allow, body)
				}
			}
		}
	}
}

func probeCtx(method, uri string) *fasthttp.RequestCtx {
	var req fasthttp.Request
	req.Header.SetMethod(method)
	req.SetRequestURI(uri)
	ctx := &fasthttp.RequestCtx{}
	ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9}, nil)
	return ctx
}

// The library API's affinity key callback (R-SRV-4, the counterpart of
// servePinboard's affinity.key) reaches the data plane: ExampleNew shows
// it but has no output, so it is compiled and never run.
func TestAffinityKeyOption_RSRV4(t *testing.T) {
	pb, store := testPinboard(t, "/pb")
	var keys []string
	pb2, err := New(Options{Store: store, Passport: pb.opts.Passport, BasePath: "/pb", LeaseTTL: time.Second,
		AffinityKey: func(ctx *fasthttp.RequestCtx) (string, bool) {
			keys = append(keys, string(ctx.Request.Header.Peek("X-Thread-Id")))
			return "", false
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pb2.registry.Close(time.Second) })
	var req fasthttp.Request
	req.SetRequestURI("/pb/counters/alice/value")
	req.Header.Set("X-Thread-Id", "thread-7")
	var ctx fasthttp.RequestCtx
	ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9}, nil)
	pb2.Handle(&ctx)
	if len(keys) != 1 || keys[0] != "thread-7" {
		t.Fatalf("unexpected affinity key calls; got %q; want one for the request with X-Thread-Id thread-7", keys)
	}
}

// The affinity key callback's contract (Options.AffinityKey, R-SRV-4):
// called concurrently, once for each request that places a new id, and
// never for a request whose id the node resolves. Run with -race.
func TestAffinityKeyCalledPerPlacement_RSRV4(t *testing.T) {
	var calls atomic.Int64
	pb, store, now := placing(t, Options{AffinityKey: func(ctx *fasthttp.RequestCtx) (string, bool) {
		calls.Add(1)
		k := ctx.Request.Header.Peek("X-Thread-Id")
		return string(k), len(k) > 0
	}})
	const n = 8
	handle := func(id string) int {
		var req fasthttp.Request
		req.SetRequestURI("/c/" + id + "/v")
		req.Header.Set("X-Thread-Id", "thread-"+id)
		var ctx fasthttp.RequestCtx
		ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9}, nil)
		pb.Handle(&ctx)
		return ctx.Response.StatusCode()
	}
	codes := make(chan int, 2*n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { codes <- handle("id" + strconv.Itoa(i)) })
	}
	wg.Wait()
	if got := calls.Load(); got != n {
		t.Fatalf("unexpected affinity key calls for %d new ids; got %d; want %d", n, got, n)
	}
	for i := range n {
		wg.Go(func() { codes <- handle("id" + strconv.Itoa(i)) })
	}
	wg.Wait()
	close(codes)
	for code := range codes {
		if code != fasthttp.StatusOK {
			t.Fatalf("unexpected status; got %d; want 200", code)
		}
	}
	if got := calls.Load(); got != n {
		t.Fatalf("unexpected affinity key calls after requests to placed ids; got %d; want %d (none for a placed id)", got, n)
	}
	if p, err := store.Placement(context.Background(), "/c", "id0", now); err != nil || p == nil {
		t.Fatalf("unexpected placement of id0; got %v, %v; want a placement", p, err)
	}
}

// New starts the registry's pool; Shutdown releases it on a node never
// served (New's doc), so a program that builds a Pinboard and gives up
// before serving leaks nothing.
func TestShutdownWithoutServeReleases_RSRV4(t *testing.T) {
	pp, err := attest.ParsePassport([]byte(`{"providers":[{"type":"staticToken","id":"p","keys":[{"name":"op","token":{"env":"T"},"scopes":["pinboard:operator"]}]}]}`),
		func(k string) (string, bool) { return "tok", k == "T" })
	if err != nil {
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()
	pb, err := New(Options{Store: directory.NewMemory(time.Second, time.Now()), Passport: pp})
	if err != nil {
		t.Fatal(err)
	}
	if err := pb.Shutdown(0, nil); err != nil {
		t.Fatalf("unexpected Shutdown error on a node never served; got %v; want nil", err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			t.Fatalf("unexpected goroutines after Shutdown; got %d; want at most %d as before New", runtime.NumGoroutine(), before)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// placing builds a pinboard with o on a warm memory store where workers
// a and b, each at headroom 100, serve /c from a stand-in that answers
// 200 to everything, and returns it with the store and its clock.
func placing(t *testing.T, o Options) (*Pinboard, *directory.Memory, time.Time) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	worker := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) { ctx.SetStatusCode(fasthttp.StatusOK) }}
	go func() { _ = worker.Serve(ln) }()
	t.Cleanup(func() { _ = worker.Shutdown() })
	pb, _ := testPinboard(t, "")
	now := time.Unix(1_800_000_000, 0)
	store := directory.NewMemory(time.Second, now)
	if _, err := store.Place(context.Background(), &directory.PlaceRequest{NS: "/c", ID: "warm", Now: now}); err == nil {
		t.Fatal("unexpected placement on a cold store")
	}
	now = now.Add(time.Second)
	for _, name := range []string{"a", "b"} {
		if _, err := store.Register(context.Background(), &directory.Registration{ClientID: name, Sub: "s", Secret: "k", Namespaces: []string{"/c"},
			AdvertiseURL: "http://" + ln.Addr().String() + "/" + name, Headroom: 100}, now); err != nil {
			t.Fatal(err)
		}
	}
	o.Store, o.Passport, o.LeaseTTL, o.Now = store, pb.opts.Passport, time.Second, func() time.Time { return now }
	pb2, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pb2.registry.Close(time.Second) })
	return pb2, store, now
}

// placedOn sends a request for /c/{id} from 127.0.0.1 with the header
// hdr (name, value; none when empty) and returns the client id that owns
// id after it.
func placedOn(t *testing.T, pb *Pinboard, store *directory.Memory, now time.Time, id string, hdr ...string) string {
	t.Helper()
	var req fasthttp.Request
	req.SetRequestURI("/c/" + id + "/v")
	if len(hdr) == 2 {
		req.Header.Set(hdr[0], hdr[1])
	}
	var ctx fasthttp.RequestCtx
	ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9}, nil)
	pb.Handle(&ctx)
	if code := ctx.Response.StatusCode(); code != fasthttp.StatusOK {
		t.Fatalf("unexpected answer for /c/%s; got %d %s; want 200", id, code, ctx.Response.Body())
	}
	p, err := store.Placement(context.Background(), "/c", id, now)
	if err != nil {
		t.Fatal(err)
	}
	return p.ClientID
}

// The balance factor option (PINBOARD_AFFINITY_BALANCE_FACTOR, R-PL-4)
// reaches the data plane's placement policy. Two workers at headroom 100,
// every request with one affinity key: at factor 1 the preferred worker,
// at 99 after its first id, is below the other's 100 and the second id
// goes there; at the default (2) it would keep ids down to 50.
func TestBalanceFactorOption_RPL4(t *testing.T) {
	pb, store, now := placing(t, Options{BalanceFactor: 1,
		AffinityKey: func(*fasthttp.RequestCtx) (string, bool) { return "203.0.113.7", true }})
	if a, b := placedOn(t, pb, store, now, "x"), placedOn(t, pb, store, now, "y"); a == b {
		t.Fatalf("unexpected owners of two ids with one affinity key at balance factor 1; got %s for both; want a and b", a)
	}
}

// The trusted proxies option (PINBOARD_TRUSTED_PROXIES, R-PL-4) reaches
// the data plane: behind a trusted peer, the X-Forwarded-For client picks
// the worker, so two clients whose rendezvous prefers different workers
// get their ids placed there, not both where the peer's address would.
func TestTrustedProxiesOption_RPL4(t *testing.T) {
	trusted, err := proxy.ParseTrustedProxies("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	pb, store, now := placing(t, Options{TrustedProxies: trusted})
	// Two client addresses the rendezvous sends to different workers.
	ws, _ := store.Workers(context.Background(), now)
	cands := []directory.Candidate{{SessionID: ws[0].SessionID, ClientID: ws[0].ClientID, Headroom: 100}, {SessionID: ws[1].SessionID, ClientID: ws[1].ClientID, Headroom: 100}}
	slices.SortFunc(cands, func(x, y directory.Candidate) int { return strings.Compare(x.SessionID, y.SessionID) })
	want := map[string]string{} // client id -> client address
	for i := 1; len(want) < 2 && i < 256; i++ {
		ip := "198.51.100." + itoa(i)
		pick := (&directory.HeadroomPolicy{}).Rank(nil, cands, &directory.PickInput{Key: ip, HasKey: true})[0]
		if _, ok := want[cands[pick].ClientID]; !ok {
			want[cands[pick].ClientID] = ip
		}
	}
	for client, ip := range want {
		if got := placedOn(t, pb, store, now, "for-"+ip, "X-Forwarded-For", ip); got != client {
			t.Fatalf("unexpected owner of an id requested for %s through a trusted proxy; got %s; want %s", ip, got, client)
		}
	}
}
