package proxy

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/internal/rawio"
)

// Tests of what a hostile or broken client or worker sends on the wire:
// raw bytes in, the bytes the other side sees checked.

// capLn records every byte the stand-in worker reads, and counts the
// connections it accepts.
type capLn struct {
	net.Listener
	mu      sync.Mutex
	buf     bytes.Buffer
	accepts atomic.Int64
}

type capConn struct {
	net.Conn
	ln *capLn
}

func (c *capConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.ln.mu.Lock()
	c.ln.buf.Write(p[:n])
	c.ln.mu.Unlock()
	return n, err
}

func (l *capLn) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.accepts.Add(1)
	return &capConn{Conn: c, ln: l}, nil
}

func (l *capLn) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.buf.String() }

// newCapRig is a rig with one stand-in worker for /counters, alice placed
// on it, and the bytes it receives recorded.
func newCapRig(t *testing.T, opts func(*Options)) (*rig, *capLn) {
	rg, _, cl := newCapRigWorker(t, opts)
	return rg, cl
}

// newCapRigWorker is newCapRig that also returns the worker, to add routes.
func newCapRigWorker(t *testing.T, opts func(*Options)) (*rig, *standin, *capLn) {
	t.Helper()
	rg := newRig(t, opts)
	rg.warm()
	s := &standin{name: "w", secret: "secret-w", routes: map[string]http.HandlerFunc{}}
	s.session.Store("")
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	cl := &capLn{Listener: s.srv.Listener}
	s.srv.Listener = cl
	s.srv.Start()
	t.Cleanup(s.srv.Close)
	rg.serveIDs(t, s, "alice")
	return rg, s, cl
}

// serveIDs adds s as the only worker for /counters, places ids on it, and
// moves the rig's clock to real time (deadlines are real).
func (rg *rig) serveIDs(t *testing.T, s *standin, ids ...string) {
	t.Helper()
	rg.add(s, 1, "/counters")
	for _, id := range ids {
		if _, err := rg.store.Place(t.Context(), &directory.PlaceRequest{NS: "/counters", ID: id, Now: rg.now()}); err != nil {
			t.Fatal(err)
		}
	}
	real := time.Now()
	rg.clock.Store(&real)
}

// rawWorker is a stand-in whose advertise URL is ln, served by the test.
func rawWorker(name string, ln net.Listener) *standin {
	s := &standin{name: name, secret: "secret-" + name, srv: &httptest.Server{URL: "http://" + ln.Addr().String()}}
	s.session.Store("")
	return s
}

// rawRequestWorker is a worker the test answers byte for byte, on a
// listener of its own on 127.0.0.1 (closed at cleanup): each connection's
// requests are read in turn, their bodies dropped, and answer writes each
// response itself and reports whether to read the connection's next
// request. It returns the worker (rawWorker) and its listener.
func rawRequestWorker(t *testing.T, answer func(c net.Conn, r *http.Request) bool) (*standin, net.Listener) {
	t.Helper()
	return rawRequests(t, true, answer)
}

// rawRequests is rawRequestWorker, each body dropped before answer runs
// (drainFirst) or after it.
func rawRequests(t *testing.T, drainFirst bool, answer func(c net.Conn, r *http.Request) bool) (*standin, net.Listener) {
	t.Helper()
	ln := rawListener(t, func(c net.Conn) {
		defer c.Close()
		br := bufio.NewReader(c)
		for {
			r, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			if drainFirst {
				_, _ = io.Copy(io.Discard, r.Body)
			}
			if !answer(c, r) {
				return
			}
			if !drainFirst {
				_, _ = io.Copy(io.Discard, r.Body)
			}
		}
	})
	return rawWorker("raw", ln), ln
}

// rawListener listens on 127.0.0.1 (closed at cleanup) and runs serve on
// each connection it accepts, in a goroutine of its own, until it closes.
func rawListener(t *testing.T, serve func(c net.Conn)) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serve(c)
		}
	}()
	return ln
}

// answerPath answers r with "for <its path>", sized, and reads on.
func answerPath(c net.Conn, r *http.Request) bool {
	body := "for " + r.URL.Path
	_, _ = fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	return true
}

// raw sends req on a fresh connection and returns the bytes of the first
// response, read whole (or what came of it within d). It returns as soon
// as that response is in, not when d runs out: a kept-alive connection
// stays open, and the worker has read the request by the time its answer
// is here, however slow the machine.
func (rg *rig) raw(req string, d time.Duration) string {
	rg.t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
	if err != nil {
		rg.t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, req)
	_ = c.SetReadDeadline(time.Now().Add(d))
	var got bytes.Buffer
	if res, err := http.ReadResponse(bufio.NewReader(io.TeeReader(c, &got)), nil); err == nil {
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
	}
	return got.String()
}

// headerValues returns every value of name in the request the worker got.
func headerValues(t *testing.T, wire, name string) []string {
	t.Helper()
	req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(wire)))
	if err != nil {
		t.Fatalf("the worker got no request: %v\n%q", err, wire)
	}
	return req.Header.Values(name)
}

// A worker's answer whose Connection header names Content-Length keeps its
// length: the body is read whole, and the next clients on the pooled
// connection get their own answers — not the rest of this one, shifted by
// one (R-DP-1, R-DP-3).
func TestConnectionCannotUnframeResponse_RDP1_RDP3(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	inner := "HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nINJECTED"
	var n int
	var mu sync.Mutex
	w, _ := rawRequestWorker(t, func(c net.Conn, r *http.Request) bool {
		mu.Lock()
		n++
		first := n == 1
		mu.Unlock()
		if first {
			_, _ = fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nConnection: Content-Length\r\nContent-Length: %d\r\n\r\n%s", len(inner), inner)
			return true
		}
		return answerPath(c, r)
	})
	rg.serveIDs(t, w, "alice", "bob", "carol")
	for _, id := range []string{"alice", "bob", "carol"} {
		want := "for /counters/" + id + "/x"
		if id == "alice" {
			want = inner
		}
		if _, body := rg.get("/counters/"+id+"/x", nil); body != want {
			t.Fatalf("unexpected body for %s; got %q; want %q", id, body, want)
		}
	}
}

// Headers named by any Connection header are hop-by-hop, not only those
// the first one names (R-DP-1, RFC 9110 §7.6.1).
func TestEveryConnectionHeaderStripped_RDP1(t *testing.T) {
	rg, cl := newCapRig(t, nil)
	rg.raw("GET /counters/alice/x HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\nConnection: X-Secret\r\nX-Secret: s\r\n\r\n", 10*time.Second)
	if got := headerValues(t, cl.String(), "X-Secret"); len(got) != 0 {
		t.Fatalf("X-Secret, named by the second Connection header, reached the worker: %q", got)
	}
}

// A Connection header naming Cookie makes the client's cookies hop-by-hop
// too, although pinboard keeps Cookie lines apart while it edits the
// header (saveCookies): none reaches the worker, for a request or a
// WebSocket handshake (R-DP-1, RFC 9110 §7.6.1).
func TestConnectionNamedCookieStripped_RDP1(t *testing.T) {
	for _, c := range []struct{ name, extra string }{
		{"request", ""},
		{"websocket", "Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rg, cl := newCapRig(t, nil)
			conn := "Connection: cookie\r\n"
			if c.extra != "" {
				conn = "Connection: Upgrade, Cookie\r\n"
			}
			rg.raw("GET /counters/alice/x HTTP/1.1\r\nHost: a\r\n"+conn+c.extra+"Cookie: a=1\r\nCookie: b=2\r\n\r\n", 10*time.Second)
			wire := cl.String()
			if !strings.Contains(wire, "/counters/alice/x") {
				t.Fatalf("the request did not reach the worker: %q", wire)
			}
			if got := headerValues(t, wire, "Cookie"); len(got) != 0 {
				t.Fatalf("cookies named by Connection reached the worker: %q", got)
			}
		})
	}
}

// An untrusted client cannot add its own X-Forwarded-* lines beside
// pinboard's (uvicorn joins every For line and takes the last Proto), nor
// pass Forwarded or X-Real-IP; a trusted proxy's lines are kept, the For
// lines joined in order (R-PL-4).
func TestForwardedHeadersOneCopy_RPL4(t *testing.T) {
	forged := "GET /counters/alice/x HTTP/1.1\r\nHost: a\r\n" +
		"X-Forwarded-For: 1.1.1.1\r\nX-Forwarded-For: 6.6.6.6\r\n" +
		"X-Forwarded-Proto: http\r\nX-Forwarded-Proto: https\r\n" +
		"X-Forwarded-Host: a\r\nX-Forwarded-Host: evil\r\n" +
		"Forwarded: for=6.6.6.6\r\nX-Real-IP: 6.6.6.6\r\n\r\n"
	t.Run("untrusted", func(t *testing.T) {
		rg, cl := newCapRig(t, nil)
		rg.raw(forged, 10*time.Second)
		wire := cl.String()
		for name, want := range map[string][]string{
			"X-Forwarded-For": {"127.0.0.1"}, "X-Forwarded-Proto": {"http"}, "X-Forwarded-Host": {"a"},
			"Forwarded": nil, "X-Real-IP": nil,
		} {
			if got := headerValues(t, wire, name); strings.Join(got, "|") != strings.Join(want, "|") {
				t.Errorf("unexpected %s at the worker; got %q; want %q", name, got, want)
			}
		}
	})
	t.Run("trusted", func(t *testing.T) {
		rg, cl := newCapRig(t, func(o *Options) {
			tp, err := ParseTrustedProxies("127.0.0.1")
			if err != nil {
				t.Fatal(err)
			}
			o.TrustedProxies = tp
		})
		rg.raw(forged, 10*time.Second)
		wire := cl.String()
		for name, want := range map[string][]string{
			"X-Forwarded-For": {"1.1.1.1, 6.6.6.6, 127.0.0.1"}, "X-Forwarded-Proto": {"https"}, "X-Forwarded-Host": {"evil"},
			"Forwarded": {"for=6.6.6.6"}, "X-Real-IP": {"6.6.6.6"},
		} {
			if got := headerValues(t, wire, name); strings.Join(got, "|") != strings.Join(want, "|") {
				t.Errorf("unexpected %s at the worker; got %q; want %q", name, got, want)
			}
		}
	})
}

// A header named like a forwarding or reserved one with underscores for
// hyphens (X_Forwarded_For, Pinboard_Attestation) is not that header to
// HTTP, but CGI-style environments (WSGI, and frameworks mounting WSGI
// apps) map both spellings to one name (HTTP_X_FORWARDED_FOR): a client
// could pass its own value under pinboard's. They are removed from every
// request, a trusted proxy's too: no proxy spells them so (nginx drops
// underscored names by default) (R-PL-4, R-TR-5).
func TestUnderscoreAliasesRemoved_RPL4_RTR5(t *testing.T) {
	forged := "GET /counters/alice/x HTTP/1.1\r\nHost: a\r\n" +
		"X_Forwarded_For: 6.6.6.6\r\nx_forwarded_proto: https\r\nX_Forwarded-Host: evil\r\n" +
		"X_Real_IP: 6.6.6.6\r\nPinboard_Attestation: forged\r\npinboard_epoch: 9\r\n" +
		"My_Header: kept\r\n\r\n"
	for _, trusted := range []bool{false, true} {
		rg, cl := newCapRig(t, func(o *Options) {
			if trusted {
				tp, err := ParseTrustedProxies("127.0.0.1")
				if err != nil {
					t.Fatal(err)
				}
				o.TrustedProxies = tp
			}
		})
		rg.raw(forged, 10*time.Second)
		wire := strings.ToLower(cl.String())
		for _, name := range []string{"x_forwarded_for:", "x_forwarded_proto:", "x_forwarded-host:", "x_real_ip:", "pinboard_attestation:", "pinboard_epoch:"} {
			if strings.Contains(wire, "\n"+name) {
				t.Errorf("trusted %v: unexpected %s at the worker; got\n%s", trusted, name, wire)
			}
		}
		if !strings.Contains(wire, "\nmy_header: kept\r\n") {
			t.Errorf("trusted %v: unexpected loss of My_Header; got\n%s", trusted, wire)
		}
	}
}

// stallRig is a capture rig whose worker has two pooled connections at
// most, a one-second stall timeout, and a long wait for a free connection:
// a request that finds both held waits until a stalled body lets one go.
func stallRig(t *testing.T) (*rig, *standin) {
	rg, w, _ := newCapRigWorker(t, func(o *Options) {
		o.Upstream.MaxConns = 2
		o.Upstream.ConnWait = 10 * time.Second
		o.Upstream.StallTimeout = time.Second
	})
	return rg, w
}

// waitHits waits until n requests reached the worker w: the requests a
// test holds have their worker connections (a fixed sleep may not be long
// enough on a loaded machine, and the test would then check nothing).
func waitHits(t *testing.T, w *standin, n int64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); w.hits.Load() < n; {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d requests reached the worker after 10s", w.hits.Load(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// holdConns opens n client connections that each send req and then go
// silent; they close with the test.
func holdConns(t *testing.T, rg *rig, n int, req string, rcvbuf int) {
	t.Helper()
	for range n {
		c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if rcvbuf > 0 {
			_ = c.(*net.TCPConn).SetReadBuffer(rcvbuf)
		}
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
	}
}

// A client whose upload goes silent is cut after the stall timeout and
// its worker connection freed: idle uploads cannot hold every connection
// to a worker (R-DP-2, R-DP-3).
func TestStalledUploadFreesWorkerConnection_RDP2_RDP3(t *testing.T) {
	rg, w := stallRig(t)
	// Chunked, so the handler runs at once and the upload streams; one
	// byte, then silence.
	holdConns(t, rg, 2, "POST /counters/alice/up HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n", 0)
	waitHits(t, w, 2) // both uploads hold their connection
	if res, body := rg.get("/counters/alice/x", nil); res.StatusCode != 200 {
		t.Fatalf("unexpected answer behind two stalled uploads; got %d %s; want 200 once they are cut", res.StatusCode, body)
	}
}

// A client that stops reading a streamed response is cut after the stall
// timeout and its worker connection freed (R-DP-2, R-DP-3).
func TestStalledReaderFreesWorkerConnection_RDP2_RDP3(t *testing.T) {
	rg, w, _ := newCapRigWorker(t, func(o *Options) {
		o.Upstream.MaxConns = 2
		o.Upstream.ConnWait = 10 * time.Second
		o.Upstream.StallTimeout = time.Second
	})
	big := strings.Repeat("x", 16<<20) // more than the sockets buffer
	w.route("/big", func(rw http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(rw, big) })
	holdConns(t, rg, 2, "GET /counters/alice/big HTTP/1.1\r\nHost: x\r\n\r\n", 4096)
	waitHits(t, w, 2)
	if res, body := rg.get("/counters/alice/x", nil); res.StatusCode != 200 {
		t.Fatalf("unexpected answer behind two clients that stopped reading; got %d %s; want 200 once they are cut", res.StatusCode, body)
	}
}

// A worker that froze mid-upload (its socket open, nothing read) gets the
// request answered after the stall timeout instead of holding it for
// ever; with a small body the response-header timeout does it (R-DP-3).
func TestFrozenWorkerUploadAnswered_RDP3(t *testing.T) {
	rg := newRig(t, func(o *Options) {
		o.Upstream.ResponseHeaderTimeout = time.Second
		o.Upstream.StallTimeout = time.Second
	})
	rg.warm()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // frozen: never read, never answered
			mu.Unlock()
		}
	}()
	rg.serveIDs(t, rawWorker("frozen", ln), "alice")
	// Raw: the answer comes while the client still sends, and Go's client
	// would report its write's reset instead of the answer.
	c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const size = 32 << 20
	if _, err := fmt.Fprintf(c, "POST /counters/alice/up HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n", size); err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = c.Write(make([]byte, size)) }()
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("a 32 MiB upload to a frozen worker got no answer: %v", err)
	}
	res.Body.Close()
	if res.StatusCode < 500 {
		t.Fatalf("unexpected status for an upload to a frozen worker; got %d; want 5xx", res.StatusCode)
	}
}

// lazyDeadline sets a deadline only once it has drifted by more than its
// slack, min(1s, d/10): the header deadline, the stall deadlines (R-DP-3).
func TestLazyDeadline_RDP3(t *testing.T) {
	var l lazyDeadline
	t0 := time.Unix(1_800_000_000, 0)
	if at, ok := l.due(t0, time.Minute); !ok || !at.Equal(t0.Add(time.Minute)) {
		t.Fatalf("unexpected first deadline; got %v %v", at, ok)
	}
	if _, ok := l.due(t0.Add(900*time.Millisecond), time.Minute); ok {
		t.Fatal("renewed within the 1 s slack")
	}
	if at, ok := l.due(t0.Add(1100*time.Millisecond), time.Minute); !ok || !at.Equal(t0.Add(61100*time.Millisecond)) {
		t.Fatalf("not renewed past the slack; got %v %v", at, ok)
	}
	// A short deadline has a tenth of it as slack.
	var s lazyDeadline
	s.due(t0, time.Second)
	if _, ok := s.due(t0.Add(50*time.Millisecond), time.Second); ok {
		t.Fatal("renewed within a tenth of a 1 s deadline")
	}
	if _, ok := s.due(t0.Add(150*time.Millisecond), time.Second); !ok {
		t.Fatal("not renewed past a tenth of a 1 s deadline")
	}
}

// An absolute-form target is routed like its origin form, with the
// target's authority as Host (RFC 9112 §3.2.2); one without a path is
// not an instance, one with userinfo or no host is refused (R-DP-1).
func TestAbsoluteFormTarget_RDP1(t *testing.T) {
	rg, cl := newCapRig(t, nil)
	got := rg.raw("GET HTTP://Pinboard.Example:8080/counters/alice/x?q=1 HTTP/1.1\r\nHost: other\r\nConnection: close\r\n\r\n", 10*time.Second)
	if !strings.HasPrefix(got, "HTTP/1.1 200") {
		t.Fatalf("absolute-form request: got %q; want the worker's 200", got)
	}
	req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(cl.String())))
	if err != nil {
		t.Fatalf("the worker got no request: %v", err)
	}
	if req.RequestURI != "/counters/alice/x?q=1" || req.Host != "Pinboard.Example:8080" {
		t.Fatalf("the worker got target %q, Host %q; want the origin form and the target's authority", req.RequestURI, req.Host)
	}
	for target, want := range map[string]string{
		"http://h":                        "HTTP/1.1 404",
		"http://h?x=1":                    "HTTP/1.1 404",
		"http://u@h/counters/alice/x":     "HTTP/1.1 400",
		"http:///counters/alice/x":        "HTTP/1.1 400",
		"http://h/nowhere":                "HTTP/1.1 404",
		"http://h/counters/alice/../_x/y": "HTTP/1.1 400",
		"ftp://h/counters/alice/x":        "HTTP/1.1 400",
	} {
		got := rg.raw("GET "+target+" HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", 10*time.Second)
		if !strings.HasPrefix(got, want) {
			t.Fatalf("GET %s: got %q; want %s", target, got, want)
		}
	}
}

// idleStreamUntilGone is a worker's event stream that sends one event
// and idles: gone closes when pinboard closes the connection, stop ends
// it otherwise.
func idleStreamUntilGone(gone, stop chan struct{}) http.HandlerFunc {
	return func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(rw, "data: 0\n\n")
		rw.(http.Flusher).Flush()
		select {
		case <-r.Context().Done(): // pinboard closed the connection
			close(gone)
		case <-stop:
		}
	}
}

// A client that goes away from an event stream between events frees the
// worker's connection (and the stream) without waiting for the next
// event, which may be hours away: a client opening streams and resetting
// them would otherwise take a worker's whole pool while holding no
// socket itself (R-DP-2, R-DP-3).
func TestClientGoneFromIdleStreamFreesWorker_RDP2_RDP3(t *testing.T) {
	defer func(d time.Duration) { clientCheckEvery = d }(clientCheckEvery)
	clientCheckEvery = 200 * time.Millisecond
	for name, leave := range map[string]func(c *net.TCPConn){
		"reset": func(c *net.TCPConn) { c.SetLinger(0); c.Close() },
		"close": func(c *net.TCPConn) { c.Close() },
	} {
		t.Run(name, func(t *testing.T) {
			rg, w, _ := newCapRigWorker(t, nil)
			gone, stop := make(chan struct{}), make(chan struct{})
			t.Cleanup(func() { close(stop) }) // before the worker's Close waits for it
			w.route("/events", idleStreamUntilGone(gone, stop))
			c := openFirstEvent(t, rg.url)
			defer c.Close()
			leave(c.(*net.TCPConn))
			select {
			case <-gone:
			case <-time.After(5 * time.Second):
				t.Fatalf("unexpected worker connection still open 5s after the client left; got %d open streams; want 0", rg.p.OpenStreams())
			}
			for deadline := time.Now().Add(5 * time.Second); rg.p.OpenStreams() != 0; {
				if time.Now().After(deadline) {
					t.Fatalf("unexpected open streams after the client left; got %d; want 0", rg.p.OpenStreams())
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
}

// A worker answering 101 to a request that asked for no upgrade has left
// HTTP on that connection (RFC 9110 §15.2.2): the client gets 502 and the
// connection is never used again — pooled, it would carry the next
// client's request, and its answer would be whatever the worker sent
// after the switch (R-DP-1, R-DP-3).
func TestUnaskedSwitchingProtocols_RDP1_RDP3(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	reused := make(chan string, 1)
	var switched sync.Map // the connections answered 101
	w, _ := rawRequestWorker(t, func(c net.Conn, r *http.Request) bool {
		if _, ok := switched.Load(c); ok {
			reused <- r.URL.Path
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecret")
			return true
		}
		if strings.Contains(r.URL.Path, "alice") {
			_, _ = io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\n\r\n")
			switched.Store(c, true)
			return true
		}
		return answerPath(c, r)
	})
	rg.serveIDs(t, w, "alice", "bob")
	if res, body := rg.get("/counters/alice/x", nil); res.StatusCode != http.StatusBadGateway {
		t.Fatalf("unexpected answer to a 101 nobody asked for; got %d %q; want 502", res.StatusCode, body)
	}
	if _, body := rg.get("/counters/bob/x", nil); body != "for /counters/bob/x" {
		t.Fatalf("unexpected body for bob; got %q; want %q", body, "for /counters/bob/x")
	}
	select {
	case path := <-reused:
		t.Fatalf("unexpected request on the connection switched by 101; got %v; want none", path)
	default:
	}
}

// A client whose small body (read whole before the worker is called) goes
// silent is answered 400 after the stall timeout, like a streamed upload,
// instead of holding its connection and a body buffer for as long as the
// server's body timeout (a year by default). Past the 8 KiB fasthttp reads
// before the handler runs (server.Options covers those) (R-DP-2).
func TestStalledSmallBodyCut_RDP2(t *testing.T) {
	rg, w, _ := newCapRigWorker(t, func(o *Options) { o.Upstream.StallTimeout = 300 * time.Millisecond })
	start := time.Now()
	line, err := rg.rawStatus("POST /counters/alice/up HTTP/1.1\r\nHost: a\r\nContent-Length: 20480\r\n\r\n" + strings.Repeat("x", 10240))
	if err != nil || !strings.HasPrefix(line, "HTTP/1.1 400") {
		t.Fatalf("unexpected answer to a small body gone silent, after %v; got %q, %v; want 400", time.Since(start), line, err)
	}
	if n := w.hits.Load(); n != 0 {
		t.Fatalf("unexpected requests at the worker; got %d; want 0", n)
	}
}

// A small body (read whole before the worker is called) that took longer
// than the stall timeout to arrive, each piece within it, is forwarded:
// the deadlines toward the worker count from when the body is in hand, not
// from when its header came. Before, a new connection's write deadline was
// set from the header's arrival, already past, and a slow client's upload
// (a phone on a poor link) was answered 504 without reaching the worker
// (R-DP-2, R-DP-4).
func TestSlowSmallBodyForwarded_RDP2_RDP4(t *testing.T) {
	stall := 300 * time.Millisecond
	rg, w, _ := newCapRigWorker(t, func(o *Options) {
		o.Now = nil // the real clock: deadlines are set from its readings
		o.Upstream.StallTimeout = stall
	})
	c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	const size, pieces = 20480, 8
	if _, err := fmt.Fprintf(c, "POST /counters/alice/up HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n", size); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < pieces; i++ { // 8 x 100 ms: each within the stall timeout, all past it
		if _, err := c.Write(bytes.Repeat([]byte("x"), size/pieces)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(stall / 3)
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("cannot read the answer to a slow small body: %v", err)
	}
	b, _ := io.ReadAll(res.Body)
	_ = res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("unexpected status for a small body slower than the stall timeout; got %d %s; want 200", res.StatusCode, b)
	}
	if got := decodeSeen(t, string(b)).BodyLen; got != size {
		t.Fatalf("unexpected body length at the worker; got %d; want %d", got, size)
	}
	if n := w.hits.Load(); n != 1 {
		t.Fatalf("unexpected requests at the worker; got %d; want 1", n)
	}
}

// A worker that answers a streamed upload early (a 401, a 413) and closes
// with the body unread resets the connection; its answer arrives just
// before the reset, and is relayed. Before, the upload's failed write
// closed the worker connection under the handler's read of that answer,
// and the client got 502 "owner unreachable" about one time in twelve
// (R-DP-2, R-DP-4).
func TestEarlyAnswerBeforeWorkerResetRelayed_RDP2_RDP4(t *testing.T) {
	// Past the socket buffers: the upload is writing when the reset comes.
	earlyAnswerBeforeReset(t, 8<<20, true)
}

// The same for a small body, sent whole with its header: a worker that
// answers before reading it (a 401, an in-band refusal raised before the
// route reads its body) and closes resets the connection under pinboard's
// write, and its answer, already in, is relayed. Before, the failed write
// was answered 502 "owner unreachable" without a look at what the worker
// said, about one time in five (R-DP-2, R-DP-4).
func TestEarlyAnswerToSmallBodyBeforeResetRelayed_RDP2_RDP4(t *testing.T) {
	// Read whole, then sent with the header in one write.
	earlyAnswerBeforeReset(t, 60<<10, false)
}

// earlyAnswerBeforeReset sends 100 requests with a body of size (written
// by a goroutine when streamed, else before the answer is read) to a
// worker that answers 401 at once and closes with the body unread, and
// fails unless every client gets that 401.
func earlyAnswerBeforeReset(t *testing.T, size int, streamed bool) {
	t.Helper()
	rg := newRig(t, nil)
	rg.warm()
	w, _ := rawRequests(t, false, func(c net.Conn, r *http.Request) bool {
		_, _ = io.WriteString(c, "HTTP/1.1 401 Unauthorized\r\nConnection: close\r\nContent-Length: 2\r\n\r\nno")
		return false // closed with the body unread: a reset
	})
	rg.serveIDs(t, w, "alice")
	body := make([]byte, size)
	for i := 0; i < 100; i++ {
		c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := fmt.Fprintf(c, "POST /counters/alice/up HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n", size); err != nil {
			t.Fatal(err)
		}
		if streamed {
			go func() { _, _ = c.Write(body) }() // ends at the first failed write, at the latest when c closes
		} else if _, err := c.Write(body); err != nil {
			t.Fatal(err)
		}
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			c.Close()
			t.Fatalf("cannot read the answer to request %d: %v", i, err)
		}
		b, _ := io.ReadAll(res.Body)
		c.Close()
		if res.StatusCode != http.StatusUnauthorized {
			t.Fatalf("unexpected answer to request %d; got %d %s; want the worker's 401", i, res.StatusCode, b)
		}
	}
}

// Bytes a worker sends on a connection while it sits idle in the pool
// (the late tail of an answer, an unsolicited 408) belong to no request:
// the connection is closed, as nginx closes an idle upstream connection
// that turns readable, and the next request does not get them as its
// answer (R-DP-1, R-DP-3).
func TestUnsolicitedBytesOnIdleConnection_RDP1_RDP3(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	sent := make(chan struct{})
	w, ln := rawRequestWorker(t, func(c net.Conn, r *http.Request) bool {
		answerPath(c, r)
		if strings.Contains(r.URL.Path, "alice") {
			// Once alice's answer is read and its connection pooled:
			// the test waits for the pool to hold it.
			for deadline := time.Now().Add(10 * time.Second); ; {
				if u, err := rg.p.ups.get("http://" + c.LocalAddr().String()); err == nil && idleConns(u.pool) == 1 {
					break
				}
				if time.Now().After(deadline) {
					return false
				}
				time.Sleep(time.Millisecond)
			}
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\nalice-secret")
			close(sent)
		}
		return true
	})
	rg.serveIDs(t, w, "alice", "bob", "carol")
	if _, body := rg.get("/counters/alice/x", nil); body != "for /counters/alice/x" {
		t.Fatalf("unexpected body for alice; got %q; want %q", body, "for /counters/alice/x")
	}
	select {
	case <-sent:
	case <-time.After(10 * time.Second):
		t.Fatal("the worker sent nothing on the idle connection within 10s")
	}
	// The bytes reach the pooled socket.
	u, err := rg.p.ups.get("http://" + ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); !idleReadable(u.pool); {
		if time.Now().After(deadline) {
			t.Fatal("the worker's bytes did not reach the pooled connection within 10s")
		}
		time.Sleep(time.Millisecond)
	}
	for _, id := range []string{"bob", "carol"} {
		want := "for /counters/" + id + "/x"
		if _, body := rg.get("/counters/"+id+"/x", nil); body != want {
			t.Fatalf("unexpected body for %s; got %q; want %q", id, body, want)
		}
	}
}

// openFirstEvent asks url for alice's event stream on a raw TCP connection
// and reads until the first event ("data: 0") has come; the caller closes it.
func openFirstEvent(t *testing.T, url string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(c, "GET /counters/alice/events HTTP/1.1\r\nHost: a\r\n\r\n")
	br := bufio.NewReader(c)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			_ = c.Close()
			t.Fatalf("the first event never came: %v", err)
		}
		if line == "data: 0\n" {
			return c
		}
	}
}

func idleConns(p *connPool) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle)
}

// idleReadable reports whether the pool's one idle connection has bytes
// (or a close) waiting.
func idleReadable(p *connPool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle) == 1 && rawio.Readable(p.idle[0].c)
}

// tlsStandin is a stand-in worker behind TLS (an https advertise URL):
// the proxy dials it with TLS as for any such worker, trusting the test
// server's certificate. It returns the worker and its upstream.
func tlsStandin(t *testing.T, rg *rig) (*standin, *upstream) {
	t.Helper()
	s := &standin{name: "w", secret: "secret-w", routes: map[string]http.HandlerFunc{}}
	s.session.Store("")
	s.srv = httptest.NewTLSServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	roots := x509.NewCertPool()
	roots.AddCert(s.srv.Certificate())
	up, err := rg.p.ups.get(s.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	up.pool.dial = func(addr string) (net.Conn, error) {
		return tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, ServerName: "example.com"})
	}
	return s, up
}

// A client that goes away from an idle event stream frees the worker's
// connection also when that connection has no raw access (a worker behind
// https: a *tls.Conn), whose relay cannot wait without a read: the
// client check must still run every clientCheckEvery (R-DP-2, R-DP-3).
func TestClientGoneFromIdleTLSStreamFreesWorker_RDP2_RDP3(t *testing.T) {
	// Restored after the rig's cleanup has ended the relay.
	t.Cleanup(func(d time.Duration) func() { return func() { clientCheckEvery = d } }(clientCheckEvery))
	clientCheckEvery = 200 * time.Millisecond
	rg := newRig(t, nil)
	rg.warm()
	s, _ := tlsStandin(t, rg)
	gone, stop := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(stop) })
	s.route("/events", idleStreamUntilGone(gone, stop))
	rg.serveIDs(t, s, "alice")
	c := openFirstEvent(t, rg.url)
	defer c.Close()
	if rg.p.RelayedEventStreams() != 1 {
		t.Fatalf("unexpected relayed event streams; got %d; want 1", rg.p.RelayedEventStreams())
	}
	_ = c.Close()
	select {
	case <-gone:
	case <-time.After(5 * time.Second):
		t.Fatalf("unexpected worker connection still open 5s after the client left; got %d open streams; want 0", rg.p.OpenStreams())
	}
}

// A CONNECT is never forwarded: a 2xx answer to it turns the worker's
// connection into a tunnel (RFC 9110 §9.3.6; h11 switches protocols on
// it), whose bytes would otherwise go back to the pool and answer the
// next client's request. The worker here is such a tunnel: past its 200,
// whatever it reads gets the same canned bytes back (R-DP-1, R-DP-3).
func TestConnectNotTunnelled_RDP1_RDP3(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	tunnel := "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\ntunnel"
	var connects atomic.Int64
	w, _ := rawRequestWorker(t, func(c net.Conn, r *http.Request) bool {
		if r.Method == http.MethodConnect {
			connects.Add(1)
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
			buf := make([]byte, 4096)
			for {
				if _, err := c.Read(buf); err != nil {
					return false
				}
				_, _ = io.WriteString(c, tunnel)
			}
		}
		return answerPath(c, r)
	})
	rg.serveIDs(t, w, "alice", "bob")
	// Tunnel bytes right behind the request are no request of their own.
	got := rg.raw("CONNECT /counters/alice/x HTTP/1.1\r\nHost: a\r\n\r\nGET /counters/bob/x HTTP/1.1\r\nHost: a\r\n\r\n", 10*time.Second)
	if !strings.HasPrefix(got, "HTTP/1.1 501 ") || !strings.Contains(got, "\r\nConnection: close\r\n") || strings.Count(got, "HTTP/1.1 ") != 1 || connects.Load() != 0 {
		t.Fatalf("unexpected answer to CONNECT; got %q (%d reached the worker); want 501 from pinboard, the connection closed, none forwarded", got, connects.Load())
	}
	if _, body := rg.get("/counters/bob/x", nil); body != "for /counters/bob/x" {
		t.Fatalf("unexpected body for bob; got %q; want %q", body, "for /counters/bob/x")
	}
}

// A TRACE is never forwarded: the worker, or anything between it and
// pinboard, answers it by echoing the request it received (RFC 9110
// §9.3.8), and that request carries pinboard's attestation — a token the
// worker accepts on every route, of every namespace it serves, for a
// minute (it names no instance). Echoed, a client admitted to one
// namespace, anonymously even, held a credential that reaches the
// worker's other namespaces and /_pinned/stats directly, past their
// policies; RFC 9110 §9.3.8 forbids sending credentials in a TRACE. So
// is TRACK, IIS's echo, and either in another case: a server that reads
// methods case-insensitively echoes those too (R-TR-5).
func TestTraceNotForwarded_RTR5(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	var echoed atomic.Int64
	w, _ := rawRequestWorker(t, func(c net.Conn, r *http.Request) bool {
		if r.URL.Path != "/counters/alice/x" {
			return answerPath(c, r)
		}
		echoed.Add(1)
		var b strings.Builder
		_ = r.Header.Write(&b)
		_, _ = fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: message/http\r\nContent-Length: %d\r\n\r\n%s", b.Len(), b.String())
		return true
	})
	rg.serveIDs(t, w, "alice")
	for _, method := range []string{"TRACE", "trace", "TRACK"} {
		got := rg.raw(method+" /counters/alice/x HTTP/1.1\r\nHost: a\r\n\r\n", 10*time.Second)
		if !strings.HasPrefix(got, "HTTP/1.1 501 ") || strings.Contains(strings.ToLower(got), "pinboard-attestation") || echoed.Load() != 0 {
			t.Fatalf("unexpected answer to %s; got %q (%d reached the worker); want 501 from pinboard, none forwarded", method, got, echoed.Load())
		}
	}
	if _, body := rg.get("/counters/alice/y", nil); body != "for /counters/alice/y" {
		t.Fatalf("unexpected body after the refused TRACE; got %q; want %q", body, "for /counters/alice/y")
	}
}

// A HEAD answered without a Content-Length (chunked: the GET body would
// stream) leaves the worker still running the route: uvicorn runs the
// app for HEAD, drops what it sends, and reads the connection's next
// request only once it ends — an event stream never does. That
// connection does not go back to the pool, or the next client's request
// would wait on it until the header timeout. The worker here answers
// HEAD /sse that way and reads nothing more on the connection (R-DP-2,
// R-DP-3). The same for a HEAD answered with a Content-Length, large or
// small: the route produces the whole body (a download) before uvicorn
// reads on, and how long that takes is the route's, not the size's — a
// StreamingResponse of 100 bytes from a slow generator (3 s) held the
// next client's request on the real uvicorn for those 3 s.
func TestHeadOfStreamNotPooled_RDP2_RDP3(t *testing.T) {
	rg := newRig(t, func(o *Options) { o.Upstream.ResponseHeaderTimeout = 2 * time.Second })
	rg.warm()
	w, _ := rawRequestWorker(t, func(c net.Conn, r *http.Request) bool {
		if r.Method == http.MethodHead && strings.HasSuffix(r.URL.Path, "/sse") {
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
			_, _ = io.Copy(io.Discard, c) // the stream runs until pinboard goes
			return false
		}
		if r.Method == http.MethodHead && strings.HasSuffix(r.URL.Path, "/big") {
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 1073741824\r\n\r\n")
			_, _ = io.Copy(io.Discard, c) // a 1 GiB body generated and dropped
			return false
		}
		if r.Method == http.MethodHead && strings.HasSuffix(r.URL.Path, "/slow") {
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
			_, _ = io.Copy(io.Discard, c) // 100 bytes from a generator that takes its time
			return false
		}
		return answerPath(c, r)
	})
	rg.serveIDs(t, w, "alice", "bob")
	for _, path := range []string{"/counters/alice/sse", "/counters/alice/big", "/counters/alice/slow"} {
		req, _ := http.NewRequest(http.MethodHead, rg.url+path, nil)
		if res, _ := rg.do(req); res.StatusCode != http.StatusOK {
			t.Fatalf("unexpected status for HEAD %s; got %d; want 200", path, res.StatusCode)
		}
		if _, body := rg.get("/counters/bob/x", nil); body != "for /counters/bob/x" {
			t.Fatalf("unexpected body for bob after HEAD %s; got %q; want %q", path, body, "for /counters/bob/x")
		}
	}
}

// The client's Cookie lines reach the worker byte for byte (R-DP-1).
// fasthttp parses them into its cookie list as soon as the header is
// iterated (RequestHeader.All, which the hop-by-hop and forwarding passes
// use) and from then on writes that list instead: several lines became
// one and quoted values lost their quotes (a="x \"y\"" → a=x \"y\", which
// Starlette's parser then reads differently). On a placed id, on a new
// placement, and on a WebSocket handshake.
func TestCookiesForwardedVerbatim_RDP1(t *testing.T) {
	rg, w := newRigWorker(t, nil)
	got := make(chan []string, 1)
	record := func(rw http.ResponseWriter, r *http.Request) {
		got <- r.Header.Values("Cookie")
		if r.Header.Get("Upgrade") != "" {
			if conn, _, ok := accept101(rw); ok {
				conn.Close()
			}
		}
	}
	w.route("/value", record)
	w.route("/ws", record)
	lines := []string{`a="x \"y\""; b=2`, `c=3;d`, `e= "f g" `}
	want := []string{`a="x \"y\""; b=2`, `c=3;d`, `e= "f g"`}
	for _, path := range []string{"/counters/new/value", "/counters/new/value", "/counters/sock/ws"} {
		req := "GET " + path + " HTTP/1.1\r\nHost: x\r\n"
		if strings.HasSuffix(path, "/ws") {
			req += "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
		}
		for _, l := range lines {
			req += "Cookie: " + l + "\r\n"
		}
		if status, err := rg.rawStatus(req + "\r\n"); err != nil || !strings.Contains(status, " 200 ") && !strings.Contains(status, " 101 ") {
			t.Fatalf("unexpected answer for %s; got %q, %v", path, status, err)
		}
		if c := <-got; strings.Join(c, "\n") != strings.Join(want, "\n") {
			t.Fatalf("unexpected cookies at the worker for %s; got %q; want %q", path, c, want)
		}
	}
}

// A request with Expect: 100-continue keeps its Cookie lines byte for
// byte too. The server asks Proxy.Expect before the 100, whose checks
// iterate the header: fasthttp parsed the Cookie lines into its list
// there, and the handler's own pass found them merged into one line,
// their quotes dropped (R-DP-1).
func TestExpectContinueCookiesForwardedVerbatim_RDP1(t *testing.T) {
	rg, cl := newCapRig(t, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{
		Handler: rg.p.ServeHTTP, StreamRequestBody: true, DisablePreParseMultipartForm: true,
		NoDefaultServerHeader: true, NoDefaultDate: true, NoDefaultContentType: true,
		ExpectHandler: func(ctx *fasthttp.RequestCtx) int { // as the node's server asks (server.New)
			if !rg.p.Expect(ctx) {
				return ctx.Response.StatusCode()
			}
			return fasthttp.StatusContinue
		},
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	rg.url = "http://" + ln.Addr().String()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(c, "POST /counters/alice/x HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 2\r\n"+
		"Cookie: a=\"x \\\"y\\\"\"; b=2\r\nCookie: c=3\r\n\r\n")
	br := bufio.NewReader(c)
	if res, err := http.ReadResponse(br, nil); err != nil || res.StatusCode != http.StatusContinue {
		t.Fatalf("unexpected interim answer; got %v, %v; want 100", res, err)
	}
	_, _ = io.WriteString(c, "hi")
	res, err := http.ReadResponse(br, nil)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("unexpected answer; got %v, %v; want 200", res, err)
	}
	res.Body.Close()
	want := []string{`a="x \"y\""; b=2`, `c=3`}
	if got := headerValues(t, cl.String(), "Cookie"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("unexpected cookies at the worker; got %q; want %q", got, want)
	}
}

// A worker's Set-Cookie lines reach the client as the worker sent them:
// each line whole, two for one name (different paths) both kept, quoted
// values and attributes untouched (R-DP-1).
func TestSetCookiesRelayedVerbatim_RDP1(t *testing.T) {
	rg, w := newRigWorker(t, nil)
	lines := []string{`a="x \"y\""; Path=/; HttpOnly`, `a=2; Path=/sub; Max-Age=0`, `b=; Expires=Thu, 01 Jan 1970 00:00:00 GMT; SameSite=Lax`}
	w.route("/value", func(rw http.ResponseWriter, r *http.Request) {
		for _, l := range lines {
			rw.Header().Add("Set-Cookie", l)
		}
		_, _ = io.WriteString(rw, "ok")
	})
	res, body := rg.get("/counters/alice/value", nil)
	if got := res.Header.Values("Set-Cookie"); res.StatusCode != 200 || body != "ok" || strings.Join(got, "\n") != strings.Join(lines, "\n") {
		t.Fatalf("unexpected Set-Cookie lines; got %d %q; want %q", res.StatusCode, got, lines)
	}
}

// A worker answering in HTTP/1.0 (a server other than uvicorn, which
// always answers HTTP/1.1) is answered for by pinboard in its own
// version (RFC 9110 §6.2: an intermediary sends its own HTTP-version):
// the client read "HTTP/1.0" with the chunked framing pinboard gives an
// unsized body, which an HTTP/1.1 client must take as faulty (RFC 9112
// §6.1) — Go's client read the chunk framing as the body and waited for
// a close that never came — and a sized answer told it to close a
// connection pinboard kept. The worker's connection is not reused
// (HTTP/1.0 without keep-alive) and the next client gets its own answer
// (R-DP-1, R-DP-3).
func TestWorkerHTTP10AnswerRelayedAsHTTP11_RDP1_RDP3(t *testing.T) {
	for _, answer := range []string{
		"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nhello",
		"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello",
	} {
		rg := newRig(t, nil)
		rg.warm()
		w, _ := rawRequestWorker(t, func(c net.Conn, r *http.Request) bool {
			if strings.HasSuffix(r.URL.Path, "/old") {
				_, _ = io.WriteString(c, answer)
				return false
			}
			if strings.HasSuffix(r.URL.Path, "/oldws") {
				_, _ = io.WriteString(c, "HTTP/1.0 404 Not Found\r\nContent-Length: 2\r\n\r\nno")
				return false
			}
			return answerPath(c, r)
		})
		rg.serveIDs(t, w, "alice", "bob")
		res, body := rawExchange(t, rg.url, "GET /counters/alice/old HTTP/1.1\r\nHost: a\r\n\r\n")
		if res.Proto != "HTTP/1.1" || body != "hello" || res.Close {
			t.Fatalf("unexpected answer for a worker's %q; got %s, body %q, close %v; want HTTP/1.1, body %q, kept alive", answer, res.Proto, body, res.Close, "hello")
		}
		if _, body := rg.get("/counters/bob/x", nil); body != "for /counters/bob/x" {
			t.Fatalf("unexpected body for bob; got %q; want %q", body, "for /counters/bob/x")
		}
		// A WebSocket handshake the worker refuses in HTTP/1.0 too.
		if line := rg.upgrade("/counters/alice/oldws"); line != "HTTP/1.1 404 Not Found" {
			t.Fatalf("unexpected answer to an upgrade refused in HTTP/1.0; got %q; want %q", line, "HTTP/1.1 404 Not Found")
		}
	}
}

// upstreamCounter is a Metrics that records upstream error kinds.
type upstreamCounter struct {
	nopMetrics
	mu    sync.Mutex
	kinds []string
}

func (c *upstreamCounter) UpstreamError(kind string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.kinds = append(c.kinds, kind)
}

// A worker answer refused for what it says (framing.go) is told apart from
// a worker that went away: 502 "invalid answer from owner" and kind
// "invalid", so an operator looks at the worker's HTTP server rather than
// at whether it runs; a connection closed mid-header stays "owner
// unreachable", kind "read" (R-DP-4).
func TestInvalidAnswerToldApart_RDP4(t *testing.T) {
	for _, tc := range []struct {
		name, answer, msg, kind string
	}{
		{"status 000", "HTTP/1.1 000 OK\r\nContent-Length: 0\r\n\r\n", "invalid answer from owner", "invalid"},
		{"CL beside chunked", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "invalid answer from owner", "invalid"},
		{"not HTTP", "SSH-2.0-OpenSSH_9.2\r\n\r\n", "invalid answer from owner", "invalid"},
		{"closed mid-header", "HTTP/1.1 200 OK\r\nContent-Le", "owner unreachable", "read"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var m upstreamCounter
			rg := newRig(t, func(o *Options) { o.Metrics = &m })
			rg.warm()
			w, _ := rawRequestWorker(t, func(c net.Conn, r *http.Request) bool {
				_, _ = io.WriteString(c, tc.answer)
				return false
			})
			rg.serveIDs(t, w, "alice")
			res, body := rg.get("/counters/alice/x", nil)
			if want := `{"error":"` + tc.msg + `"}`; res.StatusCode != http.StatusBadGateway || body != want {
				t.Errorf("unexpected answer; got %d %s; want 502 %s", res.StatusCode, body, want)
			}
			m.mu.Lock()
			defer m.mu.Unlock()
			if len(m.kinds) != 1 || m.kinds[0] != tc.kind {
				t.Errorf("unexpected upstream error kinds; got %q; want [%s]", m.kinds, tc.kind)
			}
		})
	}
}

// TestContentEncodingLinesKept_RDP1: a worker's answer with its codings
// on several Content-Encoding lines (a list field: RFC 9110 §5.3, §8.4)
// reaches the client with every coding, in order. fasthttp keeps one
// Content-Encoding and each line replaced the one before: a body gzipped,
// then brotli-compressed, went out as "br" alone, and the client decoded
// gzip bytes as the content.
func TestContentEncodingLinesKept_RDP1(t *testing.T) {
	rg, w := newRigWorker(t, nil)
	w.route("/value", func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Add("Content-Encoding", "gzip")
		rw.Header().Add("Content-Encoding", "br")
		_, _ = io.WriteString(rw, "ok")
	})
	res, body := rg.get("/counters/alice/value", nil)
	var got []string
	for _, v := range res.Header.Values("Content-Encoding") {
		for c := range strings.SplitSeq(v, ",") {
			got = append(got, strings.TrimSpace(c))
		}
	}
	if want := []string{"gzip", "br"}; res.StatusCode != 200 || body != "ok" || strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("unexpected content codings; got %d %q; want %q", res.StatusCode, got, want)
	}
}

// A client that leaves while the worker has not answered yet (a long-poll
// route) frees its worker connection within clientCheckEvery: the worker
// sees the close and its route is cancelled. Before, the connection and
// the route were held until the worker answered or the header timeout
// (5 minutes by default) passed, so a client could hold a worker's whole
// pool without holding a socket. A client still there is not cut by the
// checks, also when the header arrives in pieces across them, or a small
// body long after its header (R-DP-3).
func TestClientGoneBeforeAnswerFreesWorker_RDP3(t *testing.T) {
	defer func(d time.Duration) { clientCheckEvery = d }(clientCheckEvery)
	clientCheckEvery = 100 * time.Millisecond
	rg, w, _ := newCapRigWorker(t, nil)
	gone := make(chan bool, 1)
	w.route("/poll", cancelledRoute(gone))
	w.route("/late", func(rw http.ResponseWriter, r *http.Request) {
		// Several checks pass before the header, then the header comes in
		// two pieces with more checks between them.
		time.Sleep(350 * time.Millisecond)
		conn, brw, err := rw.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_ = brw.Flush()
		_, _ = io.WriteString(conn, "HTTP/1.1 200 OK\r\nX-Part: 1\r\n")
		time.Sleep(350 * time.Millisecond)
		_, _ = io.WriteString(conn, "Content-Length: 4\r\nConnection: close\r\n\r\nlate")
	})
	w.route("/slowbody", func(rw http.ResponseWriter, r *http.Request) {
		// A small sized body that comes well after its header: the read
		// has the header timeout, not only the time to the next check.
		rw.Header().Set("Content-Length", "9")
		rw.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(rw, "slow")
		rw.(http.Flusher).Flush()
		time.Sleep(450 * time.Millisecond)
		_, _ = io.WriteString(rw, " body")
	})

	sendAndLeave(t, rg, "GET /counters/alice/poll HTTP/1.1\r\nHost: x\r\n\r\n", 150*time.Millisecond, gone)
	up, err := rg.p.ups.get(w.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the worker connection closed", func() bool { return up.pool.open() == 0 })

	if got := rg.raw("GET /counters/alice/late HTTP/1.1\r\nHost: x\r\n\r\n", 10*time.Second); !strings.HasPrefix(got, "HTTP/1.1 200 ") || !strings.HasSuffix(got, "\r\n\r\nlate") {
		t.Fatalf("unexpected answer to a client that stayed; got %q; want 200 with body late", got)
	}
	for range 2 { // a fresh worker connection, then the pooled one
		if res, body := rg.get("/counters/alice/slowbody", nil); res.StatusCode != 200 || body != "slow body" {
			t.Fatalf("unexpected answer with a slow small body; got %d %q; want 200 \"slow body\"", res.StatusCode, body)
		}
	}
}

// cancelledRoute is a worker's route that reads its request's body, then
// sends on gone whether the request was cancelled (the worker connection
// closed, as its client left) within 8 s.
func cancelledRoute(gone chan<- bool) http.HandlerFunc {
	return func(rw http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
			gone <- true
		case <-time.After(8 * time.Second):
			gone <- false
		}
	}
}

// sendAndLeave sends raw to rg on a connection of its own, closes it after
// linger and fails the test unless the worker's route then reports its
// request cancelled on gone (cancelledRoute).
func sendAndLeave(t *testing.T, rg *rig, raw string, linger time.Duration, gone <-chan bool) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(c, raw)
	time.Sleep(linger)
	_ = c.Close()
	if !<-gone {
		t.Fatal("unexpected wait: the worker's route was not cancelled within 8 s of its client leaving")
	}
}

// A worker behind an https advertise URL whose connection opens but whose
// TLS handshake never answers (a stopped process: the kernel still
// accepts into its backlog) fails the request as a dead worker does,
// within the dial timeout: 502 "owner unreachable". Before, the handshake
// had no deadline: the request, and the pool slot it held, waited for as
// long as the worker stayed silent (R-DP-3, R-DP-4).
func TestSilentTLSWorkerFailsFast_RDP3_RDP4(t *testing.T) {
	rg := newRig(t, func(o *Options) { o.Upstream.DialTimeout = 300 * time.Millisecond })
	rg.warm()
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	ln := rawListener(t, func(c net.Conn) {
		defer c.Close()
		<-stop // accepted, never answered
	})
	w := &standin{name: "tls", secret: "secret-tls", srv: &httptest.Server{URL: "https://" + ln.Addr().String()}}
	w.session.Store("")
	rg.serveIDs(t, w, "alice")
	for _, req := range []string{
		"GET /counters/alice/x HTTP/1.1\r\nHost: x\r\n\r\n",
		upgradeRequest("/counters/alice/ws"),
	} {
		start := time.Now()
		got := rg.raw(req, 5*time.Second)
		if !strings.HasPrefix(got, "HTTP/1.1 502 ") || !strings.HasSuffix(got, `{"error":"owner unreachable"}`) {
			t.Fatalf("unexpected answer after %v with a silent TLS worker; got %q; want 502 owner unreachable within the dial timeout", time.Since(start), got)
		}
	}
}

// The same once a streamed upload is out: a client that sent its whole
// body and left frees its worker connection within clientCheckEvery,
// instead of holding it for the header timeout; one that stays gets its
// answer (R-DP-2, R-DP-3).
func TestClientGoneAfterUploadFreesWorker_RDP2_RDP3(t *testing.T) {
	defer func(d time.Duration) { clientCheckEvery = d }(clientCheckEvery)
	clientCheckEvery = 100 * time.Millisecond
	rg, w, _ := newCapRigWorker(t, nil)
	gone := make(chan bool, 1)
	w.route("/poll", cancelledRoute(gone))
	w.route("/late", func(rw http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		time.Sleep(450 * time.Millisecond)
		_, _ = io.WriteString(rw, "late")
	})
	body := strings.Repeat("u", 100<<10) // past the 64 KiB read whole
	sendAndLeave(t, rg, fmt.Sprintf("POST /counters/alice/poll HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body), 300*time.Millisecond, gone)
	res, err := http.Post(rg.url+"/counters/alice/late", "text/plain", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || string(got) != "late" {
		t.Fatalf("unexpected answer to a client that stayed; got %d %q; want 200 late", res.StatusCode, got)
	}
}

// A request read whole (a body of at most 64 KiB) that the worker does not
// take — a frozen worker whose socket buffers are full — is cut after the
// stall timeout, as a streamed upload is: 504 "owner timed out". Before,
// its write had no deadline (the header timeout bounds reads), and the
// request and its pool slot waited for as long as the worker stayed
// frozen. The socket buffers are made small here; on a real network a
// closed receive window does the same (R-DP-3, R-DP-4).
func TestFrozenWorkerSmallBodyCut_RDP3_RDP4(t *testing.T) {
	rg := newRig(t, func(o *Options) { o.Upstream.StallTimeout = 500 * time.Millisecond })
	rg.warm()
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	// A small receive buffer from the start (set on the listener, so the
	// window the worker advertises is small too).
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 1024) })
	}}
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				<-stop // never reads
			}()
		}
	}()
	w := rawWorker("frozen", ln)
	rg.serveIDs(t, w, "alice")
	up, err := rg.p.ups.get(w.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	up.pool.dial = func(addr string) (net.Conn, error) {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			_ = c.(*net.TCPConn).SetWriteBuffer(1024)
		}
		return c, err
	}
	body := strings.Repeat("b", 60<<10)
	start := time.Now()
	got := rg.raw(fmt.Sprintf("POST /counters/alice/x HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body), 5*time.Second)
	if !strings.HasPrefix(got, "HTTP/1.1 504 ") || !strings.HasSuffix(got, `{"error":"owner timed out"}`) {
		t.Fatalf("unexpected answer after %v from a worker that takes no request; got %q; want 504 owner timed out after the stall timeout", time.Since(start), got)
	}
}

// A request that would have more than maxStripped distinct headers deleted
// — named by its Connection header, or pinboard-* names — is refused 400
// before anything reaches the worker: each deletion scans the whole header,
// and a 16 KiB request carrying a thousand of either cost milliseconds of
// CPU to strip, some 40 times what reading it did, so that one client
// keeping a few connections busy with them slowed every other tenant's
// requests. Clients name a handful at most (R-DP-1, R-TR-5). The refusal
// comes with the header's other checks, before the id is resolved: a
// refused request for a new id leaves no placement behind (R-PL-1).
func TestTooManyStrippedHeadersRefused_RDP1_RTR5(t *testing.T) {
	var list []string
	named, reserved := "", ""
	for i := range maxStripped + 1 {
		list = append(list, fmt.Sprintf("X-Hop-%d", i))
		named += list[i] + ": 1\r\n"
		reserved += fmt.Sprintf("Pinboard-X-%d: 1\r\n", i)
	}
	named = "Connection: keep-alive, " + strings.Join(list, ", ") + "\r\n" + named
	for name, extra := range map[string]string{"connection": named, "reserved": reserved} {
		t.Run(name, func(t *testing.T) {
			rg, cl := newCapRig(t, nil)
			rg.warm() // serveIDs moved the clock back: new ids may be placed
			for _, id := range []string{"alice", "bob"} {
				got := rg.raw("GET /counters/"+id+"/x HTTP/1.1\r\nHost: a\r\n"+extra+"\r\n", 10*time.Second)
				if !strings.HasPrefix(got, "HTTP/1.1 400 ") || !strings.Contains(got, `{"error":"too many Connection-named or pinboard-* headers"}`) {
					t.Fatalf("unexpected answer for %s; got %q; want 400 too many Connection-named or pinboard-* headers", id, got)
				}
			}
			if wire := cl.String(); wire != "" {
				t.Fatalf("unexpected request at the worker: %q", wire)
			}
			if _, ok := rg.store.Lookup([]byte("/counters"), []byte("bob"), rg.now()); ok {
				t.Fatalf("unexpected placement of bob, whose only request was refused")
			}
			if got := rg.raw("GET /counters/carol/x HTTP/1.1\r\nHost: a\r\n\r\n", 10*time.Second); !strings.HasPrefix(got, "HTTP/1.1 200 ") {
				t.Fatalf("unexpected answer for a new id without the headers; got %q; want 200", got)
			}
		})
	}
	t.Run("within", func(t *testing.T) {
		rg, cl := newCapRig(t, nil)
		extra := "Connection: X-A, X-B\r\nX-A: 1\r\nX-B: 2\r\nPinboard-Attestation: forged\r\nPinboard-Epoch: 1\r\n"
		if got := rg.raw("GET /counters/alice/x HTTP/1.1\r\nHost: a\r\n"+extra+"\r\n", 10*time.Second); !strings.HasPrefix(got, "HTTP/1.1 200 ") {
			t.Fatalf("unexpected answer; got %q; want 200", got)
		}
		if got := headerValues(t, cl.String(), "X-A"); len(got) != 0 {
			t.Fatalf("unexpected X-A at the worker: %q", got)
		}
	})
}

// A field name holding a space is refused 400 "malformed request" and the
// connection closed, as the server refuses a name holding any other byte a
// token cannot (RFC 9110 §5.1): fasthttp's parser lets a space through,
// and the worker's HTTP parser refused the forwarded request instead
// (R-DP-1).
func TestFieldNameWithSpaceRefused_RDP1(t *testing.T) {
	rg, cl := newCapRig(t, nil)
	got := rg.raw("GET /counters/alice/x HTTP/1.1\r\nHost: a\r\nX Forwarded-For: 1.2.3.4\r\n\r\n", 10*time.Second)
	if !strings.HasPrefix(got, "HTTP/1.1 400 ") || !strings.HasSuffix(got, `{"error":"malformed request"}`) {
		t.Fatalf("unexpected answer; got %q; want 400 malformed request", got)
	}
	if !strings.Contains(strings.ToLower(got), "connection: close") {
		t.Fatalf("unexpected answer without Connection: close; got %q", got)
	}
	if wire := cl.String(); wire != "" {
		t.Fatalf("unexpected request at the worker: %q", wire)
	}
}

// Escaped line breaks never become line breaks on the way to the worker:
// the rest of the path and the query are forwarded as sent, still
// escaped, so no field can be injected into the worker's request; an id
// holding one is no id (the worker's charset) and is refused before any
// worker is asked (R-DP-1).
func TestEscapedLineBreaksStayEscaped_RDP1(t *testing.T) {
	for _, tc := range []struct {
		target string
		line   string // the worker's request line; "" = nothing forwarded
	}{
		{"/counters/alice/x%0d%0aInjected:%201", "GET /counters/alice/x%0d%0aInjected:%201 HTTP/1.1"},
		{"/counters/alice/x%0AInjected:%201", "GET /counters/alice/x%0AInjected:%201 HTTP/1.1"},
		{"/counters/alice/x?q=%0d%0aInjected:%201", "GET /counters/alice/x?q=%0d%0aInjected:%201 HTTP/1.1"},
		{"/counters/alice%0d%0aInjected:%201/x", ""},
	} {
		rg, cl := newCapRig(t, nil)
		rg.raw("GET "+tc.target+" HTTP/1.1\r\nHost: a\r\n\r\n", 10*time.Second)
		wire := cl.String()
		line, _, _ := strings.Cut(wire, "\r\n")
		if line != tc.line || strings.Contains(strings.ToLower(wire), "\ninjected") {
			t.Errorf("unexpected request at the worker for %q; got\n%s\nwant request line %q and no Injected field", tc.target, wire, tc.line)
		}
	}
}

// A request in an HTTP version whose major is not 1 is answered 505 and
// its connection closed, nothing forwarded: fasthttp reads "HTTP/2.0" as
// HTTP/1.0, and the worker got it relabelled HTTP/1.1 (RFC 9110 §2.5,
// §15.6.6; nginx answers 505 too) (R-DP-1).
func TestOtherMajorVersionRefused_RDP1(t *testing.T) {
	for _, proto := range []string{"HTTP/2.0", "HTTP/9.9", "HTTP/0.9"} {
		rg, cl := newCapRig(t, nil)
		got := rg.raw("GET /counters/alice/x "+proto+"\r\nHost: a\r\n\r\n", 10*time.Second)
		if !strings.HasPrefix(got, "HTTP/1.1 505 ") || !strings.HasSuffix(got, `{"error":"HTTP version not supported"}`) {
			t.Errorf("unexpected answer to %s; got %q; want 505 HTTP version not supported", proto, got)
		}
		if !strings.Contains(strings.ToLower(got), "connection: close") {
			t.Errorf("unexpected answer to %s without Connection: close; got %q", proto, got)
		}
		if wire := cl.String(); wire != "" {
			t.Errorf("unexpected request at the worker for %s: %q", proto, wire)
		}
	}
}
