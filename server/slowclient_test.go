package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/attest"
	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/proxy"
)

// A client that sends a whole header with a small Content-Length and then
// goes silent is cut after the stall timeout: fasthttp reads the start of
// a body (and the proxy a small one whole) before anything else happens,
// and with no read timeout set (PINBOARD_READ_TIMEOUT_MS, 0 by default)
// that read waited a year — a slowloris past the header timeout, one
// goroutine and descriptor held per silent connection (R-DP-2).
func TestSilentSmallBodyCut_RDP2(t *testing.T) {
	_, public, _, _ := node(t, Options{Upstream: proxy.UpstreamOptions{StallTimeout: time.Second}})
	// Silent within fasthttp's 8 KiB pre-read, within the rest of a body
	// the proxy reads whole (64 KiB), and before an upload streams.
	for _, tc := range []struct{ cl, sent int }{{100, 10}, {32 << 10, 9000}, {1 << 20, 10}} {
		c, err := net.Dial("tcp", strings.TrimPrefix(public, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, "POST /counters/a/x HTTP/1.1\r\nHost: a\r\nContent-Length: "+strconv.Itoa(tc.cl)+"\r\n\r\n"+strings.Repeat("x", tc.sent)); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.Copy(io.Discard, c); err != nil {
			t.Fatalf("unexpected connection state 5s after a silent %d-byte body began (stall timeout 1s); got %v; want closed", tc.cl, err)
		}
	}
}

// A client that sends requests and never reads the answers is cut after
// the stall timeout once pinboard cannot write to it: a response read
// whole (not streamed) had no write deadline at all, and the connection's
// goroutine and descriptor were held for ever (R-DP-2).
func TestClientNotReadingCut_RDP2(t *testing.T) {
	// Small socket buffers at both ends (the connections a listener
	// accepts inherit its sizes), so that pinboard's answers fill them
	// after a few hundred requests. With the kernel's autotuned ones the
	// client queued some 4 MB of requests within 20 ms and pinboard
	// answered for seconds before a write could block: the 6 s below
	// timed the machine's speed (under -race on a loaded 2-CPU machine it
	// ran out), not the cut.
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		return smallBuffers(rc)
	}}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pb, public, _, _ := nodeOn(t, Options{Upstream: proxy.UpstreamOptions{StallTimeout: time.Second}}, ln)
	c, err := net.Dial("tcp", strings.TrimPrefix(public, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err == nil {
		err = smallBuffers(rc)
	}
	if err != nil {
		t.Fatalf("cannot set the client's socket buffers: %v", err)
	}
	// Pipelined requests whose answers fill both sockets' buffers; the
	// writes stop once pinboard stops reading, or fail once it closes.
	go func() {
		req := []byte(strings.Repeat("GET /livez HTTP/1.1\r\nHost: a\r\n\r\n", 1000))
		for range 1000 {
			if _, err := c.Write(req); err != nil {
				return
			}
		}
	}()
	for deadline := time.Now().Add(10 * time.Second); pb.srv.GetOpenConnectionsCount() == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the connection never opened")
		}
		time.Sleep(5 * time.Millisecond)
	}
	for deadline := time.Now().Add(6 * time.Second); pb.srv.GetOpenConnectionsCount() != 0; {
		if time.Now().After(deadline) {
			t.Fatalf("unexpected open connections 6s after a client stopped reading (stall timeout 1s); got %d; want 0", pb.srv.GetOpenConnectionsCount())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// smallBuffers sets a socket's send and receive buffers to 4 KiB (Linux
// doubles it), which also turns their autotuning off.
func smallBuffers(rc syscall.RawConn) error {
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for _, opt := range []int{syscall.SO_SNDBUF, syscall.SO_RCVBUF} {
			if err := syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, opt, 4096); err != nil {
				serr = err
			}
		}
	}); err != nil {
		return err
	}
	return serr
}

// workerNode starts a node on 127.0.0.1 whose /counters is served by
// worker, the id alice placed on it and the cold-start quarantine over.
// The node's clock stands still past the quarantine; deadlines are real.
func workerNode(t *testing.T, o Options, worker http.Handler) (*Pinboard, string) {
	t.Helper()
	pb, public, _ := workerNodeStop(t, o, time.Second, worker)
	return pb, public
}

// workerNodeStop is workerNode that also returns the node's stop: a
// graceful shutdown with the given grace, returning Serve's result (or
// failing the test after 10s).
func workerNodeStop(t *testing.T, o Options, grace time.Duration, worker http.Handler) (*Pinboard, string, func() error) {
	t.Helper()
	ws := httptest.NewServer(worker)
	t.Cleanup(ws.Close)
	pp, err := attest.ParsePassport([]byte(`{"providers":[{"type":"staticToken","id":"p","keys":[{"name":"k","token":{"env":"T"},"scopes":["pinboard:operator"],"claims":{"pinboard":{"namespaces":["*"]}}}]}],"namespaces":{"*":{"allow":"anonymous"}}}`),
		func(string) (string, bool) { return "tok", true })
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	store := directory.NewMemory(time.Minute, now)
	var q *directory.QuarantineError
	if _, err := store.Place(t.Context(), &directory.PlaceRequest{NS: "/warm", ID: "x", Now: now}); errors.As(err, &q) {
		now = now.Add(q.Remaining)
	}
	if _, err := store.Register(t.Context(), &directory.Registration{
		ClientID: "w", Sub: "p:w", Secret: "s", Namespaces: []string{"/counters"}, AdvertiseURL: ws.URL, Headroom: 1,
	}, now); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Place(t.Context(), &directory.PlaceRequest{NS: "/counters", ID: "alice", Now: now}); err != nil {
		t.Fatal(err)
	}
	if o.Passport == nil {
		o.Passport = pp
	}
	o.Store, o.Now = store, func() time.Time { return now }
	pb, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stop := serveUntilStopped(t, pb, ln, grace)
	return pb, "http://" + ln.Addr().String(), stop
}

// The write deadline that cuts a client not reading does not cut an
// event stream that idles longer than it: each event renews it (R-DP-2).
func TestIdleEventStreamOutlivesWriteDeadline_RDP2(t *testing.T) {
	_, public := workerNode(t, Options{Upstream: proxy.UpstreamOptions{StallTimeout: 500 * time.Millisecond}},
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			for i := range 3 {
				if i > 0 {
					time.Sleep(time.Second) // idle past the stall timeout
				}
				fmt.Fprintf(w, "data: %d\n\n", i)
				w.(http.Flusher).Flush()
			}
		}))
	res, err := http.Get(public + "/counters/alice/events")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if want := "data: 0\n\ndata: 1\n\ndata: 2\n\n"; err != nil || string(b) != want {
		t.Fatalf("unexpected event stream; got %q, %v; want %q", b, err, want)
	}
}

// A keep-alive connection idle longer than the stall timeout still takes
// a request with Expect: 100-continue: fasthttp writes the 100 before it
// sets the response's write deadline, so the last response's deadline
// must not be left on the connection (R-DP-2).
func TestExpectContinueAfterIdle_RDP2(t *testing.T) {
	_, public := workerNode(t, Options{Upstream: proxy.UpstreamOptions{StallTimeout: 300 * time.Millisecond}},
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.Copy(w, r.Body) }))
	c, err := net.Dial("tcp", strings.TrimPrefix(public, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	for i, req := range []string{
		"POST /counters/alice/x HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nhi",
		"POST /counters/alice/x HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n",
	} {
		if i > 0 {
			time.Sleep(time.Second) // idle past the stall timeout
		}
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		if i > 0 {
			line, err := br.ReadString('\n')
			if err != nil || !strings.HasPrefix(line, "HTTP/1.1 100") {
				t.Fatalf("unexpected interim answer after an idle wait; got %q, %v; want 100 Continue", line, err)
			}
			_, _ = br.ReadString('\n')
			_, _ = io.WriteString(c, "ho")
		}
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("unexpected answer to request %d; got %v; want 200", i, err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Fatalf("unexpected status of request %d; got %d; want 200", i, res.StatusCode)
		}
	}
}

// A request with Expect: 100-continue that pinboard refuses on its header
// alone — no credential for an authenticated namespace, a path that is no
// instance, two Authorization lines, more pinboard-* names than it strips
// or fields sent on several lines than it puts back in order — gets the refusal in place of the
// 100: the client does not send a body (up to the gigabyte it announced)
// only to have it dropped, and the connection closes after the refusal,
// the body never read. An admitted one gets its 100 and is forwarded
// (R-TR-4, R-DP-1, RFC 9110 §10.1.1).
func TestExpectContinueRefusedBeforeBody_RTR4_RDP1(t *testing.T) {
	manyRepeated := func(n int) string {
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, "X-R-%d: a\r\nX-R-%d: b\r\n", i, i)
		}
		return b.String()
	}
	manyReserved := func(n int) string {
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, "Pinboard-X-%d: 1\r\n", i)
		}
		return b.String()
	}
	pp, err := attest.ParsePassport([]byte(`{"providers":[{"type":"staticToken","id":"p","keys":[`+
		`{"name":"c","token":{"env":"C"},"scopes":[],"claims":{"pinboard":{"namespaces":["/counters"]}}}]}],`+
		`"namespaces":{"/counters":{"allow":"authenticated"}}}`), func(string) (string, bool) { return "tok", true })
	if err != nil {
		t.Fatal(err)
	}
	var hits atomic.Int64
	_, public := workerNode(t, Options{Passport: pp}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		n, _ := io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "%d", n)
	}))
	for _, c := range []struct {
		name, target, auth string
		status             int
		body               string
	}{
		{"no credential", "/counters/alice/x", "", 401, `{"error":"unauthorized"}`},
		{"wrong credential", "/counters/alice/x", "Authorization: Bearer nope\r\n", 401, `{"error":"unauthorized"}`},
		{"not an instance", "/counters", "Authorization: Bearer tok\r\n", 404, `{"error":"not found"}`},
		{"two Authorization lines", "/counters/alice/x", "Authorization: Bearer tok\r\nAuthorization: Bearer tok\r\n", 400, `{"error":"more than one Authorization header"}`},
		{"too many pinboard-* headers", "/counters/alice/x", "Authorization: Bearer tok\r\n" + strings.Repeat("Pinboard-X: 1\r\n", 2) + manyReserved(33), 400, `{"error":"too many Connection-named or pinboard-* headers"}`},
		{"too many repeated fields", "/counters/alice/x", "Authorization: Bearer tok\r\n" + manyRepeated(33), 400, `{"error":"too many header fields sent on several lines"}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", strings.TrimPrefix(public, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
			_, _ = io.WriteString(conn, "POST "+c.target+" HTTP/1.1\r\nHost: a\r\n"+c.auth+"Content-Length: 1073741824\r\nExpect: 100-continue\r\n\r\n")
			br := bufio.NewReader(conn)
			res, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("no answer to the header; got %v", err)
			}
			body, _ := io.ReadAll(res.Body)
			if res.StatusCode != c.status || string(body) != c.body {
				t.Fatalf("unexpected answer before the body; got %d %s; want %d %s", res.StatusCode, body, c.status, c.body)
			}
			if c.status == 401 && res.Header.Get("WWW-Authenticate") != "Bearer" {
				t.Fatalf("unexpected challenge of a 401 before the body; got %q; want Bearer (RFC 9110 §15.5.2)", res.Header.Get("WWW-Authenticate"))
			}
			if !res.Close {
				t.Fatalf("the connection stays open after a refusal whose body was never read")
			}
			if _, err := br.ReadByte(); err != io.EOF {
				t.Fatalf("unexpected read after the refusal; got %v; want the end of the stream", err)
			}
		})
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("refused requests reached the worker %d times", n)
	}
	conn, err := net.Dial("tcp", strings.TrimPrefix(public, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(conn, "POST /counters/alice/x HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer tok\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
	br := bufio.NewReader(conn)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 100") {
		t.Fatalf("unexpected interim answer to an admitted request; got %q, %v; want 100 Continue", line, err)
	}
	_, _ = br.ReadString('\n')
	_, _ = io.WriteString(conn, "hi")
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != 200 || string(body) != "2" {
		t.Fatalf("unexpected answer to an admitted request; got %d %s; want 200 2", res.StatusCode, body)
	}
}

// A client that stops reading an event stream whose events are small is
// cut after the stall timeout, and the worker's connection with it
// (R-DP-2, R-DP-3). The events fit in pinboard's socket send buffer
// (autotuned up to megabytes), so no write of pinboard's blocked
// for the relay's write deadline to see: the stream and its worker
// connection stayed open until that buffer filled (megabytes: hours at a
// few events a second) — or, for a client gone without a FIN, until the
// kernel gave up retransmitting (tcp_retries2, some 15 minutes). The
// client's socket now carries TCP_USER_TIMEOUT at the stall timeout.
func TestEventStreamClientNotReadingCut_RDP2_RDP3(t *testing.T) {
	ended := make(chan time.Time, 1)
	_, public := workerNode(t, Options{Upstream: proxy.UpstreamOptions{StallTimeout: 500 * time.Millisecond}},
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer func() { ended <- time.Now() }()
			w.Header().Set("Content-Type", "text/event-stream")
			// 2.5 kB/s: a few seconds fill the client's 8 KiB receive
			// buffer, not pinboard's send buffer.
			for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
				if _, err := io.WriteString(w, "data: 0123456789abcdef\n\n"); err != nil {
					return
				}
				w.(http.Flusher).Flush()
				select {
				case <-r.Context().Done():
					return
				case <-time.After(10 * time.Millisecond):
				}
			}
		}))
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error { return smallBuffers(rc) }}
	c, err := d.Dial("tcp", strings.TrimPrefix(public, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	if _, err := io.WriteString(c, "GET /counters/alice/events HTTP/1.1\r\nHost: a\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	// The client reads nothing from here on.
	select {
	case at := <-ended:
		if d := at.Sub(start); d > 10*time.Second {
			t.Fatalf("unexpected event stream time to a client not reading (stall timeout 500ms); got %v; want < 10s", d)
		}
	case <-time.After(12 * time.Second):
		t.Fatal("unexpected event stream still open 12s after its client stopped reading (stall timeout 500ms); want it cut, its worker connection closed")
	}
}
