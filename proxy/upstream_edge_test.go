package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/internal/rawio"
)

// The response-header deadline starts when the streamed body is out, not
// when the request header is: a slow upload is not cut by it (R-DP-2).
func TestSlowUploadNotCutByHeaderTimeout_RDP2(t *testing.T) {
	// The upload takes ~1.5 s, longer than the header timeout; the worker
	// answers right after the last byte, well inside it even on a loaded
	// machine.
	rg, w := newRigWorker(t, func(o *Options) { o.Upstream.ResponseHeaderTimeout = time.Second })
	if _, err := rg.store.Place(t.Context(), &directory.PlaceRequest{NS: "/counters", ID: "alice", Now: rg.now()}); err != nil {
		t.Fatal(err)
	}
	w.route("/upload", func(rw http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		fmt.Fprintf(rw, "got %d", n)
	})
	// The proxy arms socket deadlines from its clock: make it real time.
	real := time.Now()
	rg.clock.Store(&real)
	pr, pw := io.Pipe()
	go func() {
		chunk := strings.Repeat("x", 100<<10)
		for i := 0; i < 10; i++ { // 1 MB over ~1.5 s
			if _, err := pw.Write([]byte(chunk)); err != nil {
				return
			}
			time.Sleep(150 * time.Millisecond)
		}
		pw.Close()
	}()
	req, _ := http.NewRequest("POST", rg.url+"/counters/alice/upload", pr)
	req.ContentLength = 10 * 100 << 10
	res, body := rg.do(req)
	if res.StatusCode != 200 {
		t.Fatalf("slow 1 MB upload (worker answers right after the last byte): got %d %s", res.StatusCode, body)
	}
}

// A client that disconnects mid-upload: the worker connection closes at
// once (the worker would wait for the rest of the body for ever) and its
// pool slot is free (R-DP-2).
func TestClientAbortMidUploadFreesWorker_RDP2(t *testing.T) {
	rg, w := newRigWorker(t, nil)
	started := make(chan struct{}, 1)
	ended := make(chan error, 1)
	w.route("/upload", func(rw http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		_, err := io.Copy(io.Discard, r.Body)
		ended <- err
	})
	c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "POST /counters/alice/upload HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", 1<<20)
	c.Write([]byte(strings.Repeat("x", 200<<10)))
	// The client leaves mid-upload once the worker is reading the body (a
	// fixed sleep could end before the request even reached the worker).
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the upload did not reach the worker within 10s")
	}
	time.Sleep(50 * time.Millisecond)
	c.Close()
	select {
	case err := <-ended:
		t.Logf("worker body read ended: %v", err)
		// The worker has seen the request, so its pool exists; get takes
		// the lock the proxy's own lookups take.
		u, err := rg.p.ups.get(w.srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		// Bounded well below the 60 s stall timeout that would free it
		// anyway, and generous for a loaded machine under -race.
		deadline := time.Now().Add(10 * time.Second)
		for u.pool.open() != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("unexpected worker connection still held 10s after the client left")
			}
			time.Sleep(10 * time.Millisecond)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("client gone 10s ago; the worker is still waiting for its body")
	}
}

// A worker that closes its connection mid-upload without answering (it
// crashed, or dropped the request) while the upload waits for the
// client's next bytes — any client slower than pinboard's link to the
// worker — is the worker's failure: 502 "owner unreachable", counted as
// an upstream "read" error, and the client's connection closed (the rest
// of its body is unread: the server closes a connection whose body read
// failed). Before, the handler's stop of the upload
// interrupted its wait for the client, which was taken for the client
// failing: 400 "cannot read the request body", the client blamed for the
// worker's close and no upstream error counted (R-DP-4, R-DP-2).
func TestWorkerClosedMidUploadIs502_RDP4_RDP2(t *testing.T) {
	for _, framing := range []string{"Content-Length: 262144", "Transfer-Encoding: chunked"} {
		t.Run(framing, func(t *testing.T) {
			var m upstreamCounter
			rg := newRig(t, func(o *Options) { o.Metrics = &m })
			rg.warm()
			ln := rawListener(t, func(c net.Conn) {
				defer c.Close()
				br := bufio.NewReader(c)
				if _, err := http.ReadRequest(br); err != nil {
					return
				}
				_, _ = io.ReadFull(br, make([]byte, 64<<10)) // some of the body, then gone
			})
			w := rawWorker("raw", ln)
			rg.serveIDs(t, w, "alice")
			c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			fmt.Fprintf(c, "POST /counters/alice/upload HTTP/1.1\r\nHost: x\r\n%s\r\n\r\n", framing)
			chunked := strings.HasPrefix(framing, "Transfer")
			go func() {
				for i := 0; i < 8; i++ { // 256 KiB, 32 KiB every 20 ms
					b := strings.Repeat("z", 32<<10)
					if chunked {
						b = fmt.Sprintf("%x\r\n%s\r\n", len(b), b)
					}
					if _, err := io.WriteString(c, b); err != nil {
						return
					}
					time.Sleep(20 * time.Millisecond)
				}
				if chunked {
					_, _ = io.WriteString(c, "0\r\n\r\n")
				}
			}()
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			res, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("no answer within 10s after the worker closed mid-upload: %v", err)
			}
			body, _ := io.ReadAll(res.Body)
			if res.StatusCode != 502 || string(body) != `{"error":"owner unreachable"}` || !res.Close {
				t.Fatalf("unexpected answer when the worker closed mid-upload; got %d %s (close %v); want 502 owner unreachable and the connection closed", res.StatusCode, body, res.Close)
			}
			m.mu.Lock()
			kinds := strings.Join(m.kinds, ",")
			m.mu.Unlock()
			if kinds != "read" {
				t.Fatalf("unexpected upstream errors counted; got %q; want one read", kinds)
			}
		})
	}
}

// A worker that answers early (401) while the client's upload idles: the
// answer reaches the client at once, not when the client sends more
// (R-DP-2).
func TestEarlyAnswerDuringIdleUpload_RDP2(t *testing.T) {
	rg, w := newRigWorker(t, nil)
	w.route("/upload", func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Connection", "close")
		rw.WriteHeader(401)
		rw.Write([]byte(`{"detail":"no"}`))
	})
	line, err := rg.rawStatus("POST /counters/alice/upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
	if err != nil {
		t.Fatalf("no answer within 10s although the worker answered 401 at once: %v", err)
	}
	if !strings.HasPrefix(line, "HTTP/1.1 401") {
		t.Fatalf("got %q; want the worker's 401", line)
	}
}

// A worker that takes longer than ResponseHeaderTimeout to answer gives
// 504 "owner timed out" (R-DP-4, docs/PROTOCOL.md).
func TestHeaderTimeoutIs504_RDP4(t *testing.T) {
	rg, w := newRigWorker(t, func(o *Options) { o.Upstream.ResponseHeaderTimeout = 300 * time.Millisecond })
	if _, err := rg.store.Place(t.Context(), &directory.PlaceRequest{NS: "/counters", ID: "alice", Now: rg.now()}); err != nil {
		t.Fatal(err)
	}
	w.route("/slow", func(rw http.ResponseWriter, r *http.Request) { time.Sleep(time.Second) })
	real := time.Now()
	rg.clock.Store(&real)
	res, body := rg.get("/counters/alice/slow", nil)
	if res.StatusCode != 504 {
		t.Fatalf("got %d %s; want 504 owner timed out", res.StatusCode, body)
	}
}

// A worker that accepts a WebSocket handshake and never answers it gives
// 504 "owner timed out" after ResponseHeaderTimeout, as any other request
// does (R-DP-4). Before, the handshake waited a fixed 30 s whatever the
// header timeout, and its timeout was answered 502 "owner unreachable".
func TestWebSocketHandshakeTimeoutIs504_RDP4(t *testing.T) {
	rg, w := newRigWorker(t, func(o *Options) { o.Upstream.ResponseHeaderTimeout = 300 * time.Millisecond })
	rg.serveIDs(t, w, "alice")
	w.route("/ws", stuckHandshake("", 15*time.Second, nil)) // answers nothing
	expectUpgrade504(t, rg, "a handshake never answered")
}

// stuckHandshake is a worker's handler that takes over the connection of
// a handshake, writes answer (it may be nothing, or a part of an answer)
// and then reads until pinboard lets go of the connection or hold has
// passed; with gone set, it sends how long it held the connection there.
func stuckHandshake(answer string, hold time.Duration, gone chan<- time.Duration) http.HandlerFunc {
	return func(rw http.ResponseWriter, r *http.Request) {
		conn, brw, err := rw.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		start := time.Now()
		if answer != "" {
			_, _ = io.WriteString(conn, answer)
		}
		_ = conn.SetDeadline(time.Now().Add(hold))
		_, _ = io.Copy(io.Discard, brw)
		if gone != nil {
			gone <- time.Since(start)
		}
	}
}

// expectUpgrade504 sends an upgrade for alice and expects pinboard's 504
// "owner timed out" within the read deadline (R-DP-4).
func expectUpgrade504(t *testing.T, rg *rig, what string) {
	t.Helper()
	_, br := rg.dialUpgrade("/counters/alice/ws", "")
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("unexpected read error; got %v; want a 504 within 10s", err)
	}
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusGatewayTimeout || string(body) != `{"error":"owner timed out"}` {
		t.Fatalf("unexpected answer to %s; got %d %s; want 504 {\"error\":\"owner timed out\"}", what, res.StatusCode, body)
	}
}

// A worker's refusal of an upgrade reaches the client with the worker's
// header fields and no others, also once the handshake was tried again
// (the session gap, R-TR-5): a 403 without Content-Type gets none
// (R-DP-1). Before, the reset between tries turned the server's
// NoDefaultContentType off for the rest of the response, and the relayed
// 403 went out with "text/plain; charset=utf-8" the worker never sent.
func TestRetriedUpgradeRefusalRelayedAsSent_RDP1_RDP2(t *testing.T) {
	rg, w := newRigWorker(t, nil)
	var tries atomic.Int64
	w.route("/ws", func(rw http.ResponseWriter, r *http.Request) {
		tries.Add(1)
		conn, _, err := rw.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = io.WriteString(conn, "HTTP/1.1 403 Forbidden\r\nContent-Length: 6\r\n\r\ndenied")
	})
	_, br := rg.dialUpgrade("/counters/alice/ws", "")
	res, err := http.ReadResponse(br, nil)
	if err != nil || res.StatusCode != http.StatusForbidden || tries.Load() < 2 {
		t.Fatalf("unexpected answer; got %v, %v after %d tries; want the worker's 403 after more than one", res, err, tries.Load())
	}
	if v, ok := res.Header["Content-Type"]; ok {
		t.Fatalf("unexpected Content-Type on the relayed refusal; got %q; want none, as the worker sent it", v)
	}
}

// After the 10-minute sweep dropped an idle worker's pool, an owner whose
// session lives on gets a fresh pool: connections are reused again.
func TestSweptPoolReusedAgain_RDP1(t *testing.T) {
	rg, w := newRigWorker(t, nil)
	var mu sync.Mutex
	peers := map[string]bool{}
	w.route("/peer", func(rw http.ResponseWriter, r *http.Request) {
		mu.Lock()
		peers[r.RemoteAddr] = true
		mu.Unlock()
	})
	rg.get("/counters/alice/peer", nil)
	rg.p.ups.sweep(rg.now().Add(20*time.Minute), 10*time.Minute)
	// The sweep must have dropped the pool, or the requests below only
	// show an untouched pool reused.
	rg.p.ups.mu.RLock()
	pools := len(rg.p.ups.m)
	rg.p.ups.mu.RUnlock()
	if pools != 0 {
		t.Fatalf("unexpected pools after the sweep; got %d; want the idle worker's dropped", pools)
	}
	mu.Lock()
	clear(peers)
	mu.Unlock()
	for range 5 {
		if res, _ := rg.get("/counters/alice/peer", nil); res.StatusCode != 200 {
			t.Fatal(res.StatusCode)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(peers) != 1 {
		t.Fatalf("unexpected worker connections for 5 sequential requests after a sweep; got %d; want 1 reused", len(peers))
	}
}

// A worker's 101 header over 4 KiB (below maxHandshakeHeader, 16 KiB) is
// relayed (R-DP-2).
func TestLargeWebSocketHandshakeHeader_RDP2(t *testing.T) {
	rg, w := newRigWorker(t, nil)
	w.route("/ws", func(rw http.ResponseWriter, r *http.Request) {
		conn, brw, err := rw.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSet-Cookie: s=" + strings.Repeat("c", 5000) + "\r\n\r\n")
		brw.Flush()
		time.Sleep(500 * time.Millisecond)
	})
	if line := rg.upgrade("/counters/alice/ws"); !strings.HasPrefix(line, "HTTP/1.1 101") {
		t.Fatalf("got %q; want the worker's 101", line)
	}
}

// rawStatus sends raw bytes as a request through the rig on a fresh
// connection and returns the answer's status line, waiting at most 10 s
// (it returns as soon as the line is in).
func (rg *rig) rawStatus(req string) (string, error) {
	rg.t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
	if err != nil {
		rg.t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, req); err != nil {
		return "", err
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// A request that waited for a pooled connection longer than the header
// timeout is still sent, and answered: the header timeout counts from when
// the request goes out (docs/OPERATIONS.md), not from its arrival. Before,
// with the real clock, its read deadline had passed by the time it got the
// connection, and it was answered 504 "owner timed out" without reaching
// the worker (R-DP-3, R-DP-4).
func TestWaitForConnectionNotCountedInHeaderTimeout_RDP3_RDP4(t *testing.T) {
	rg, w, _ := newCapRigWorker(t, func(o *Options) {
		o.Now = nil // the real clock: deadlines are set from its readings
		o.Upstream.ResponseHeaderTimeout = 500 * time.Millisecond
		o.Upstream.MaxConns = 1
		o.Upstream.ConnWait = 10 * time.Second
	})
	// The one connection streams a body for about a second, past the
	// header timeout; its header came at once.
	w.route("/stream", func(rw http.ResponseWriter, r *http.Request) {
		rw.WriteHeader(200)
		for i := 0; i < 10; i++ {
			_, _ = rw.Write([]byte(strings.Repeat("s", 10<<10)))
			rw.(http.Flusher).Flush()
			time.Sleep(100 * time.Millisecond)
		}
	})
	w.route("/fast", func(rw http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(rw, "fast") })
	res, err := http.Get(rg.url + "/counters/alice/stream")
	if err != nil {
		t.Fatal(err)
	}
	streamed := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, res.Body)
		_ = res.Body.Close()
		close(streamed)
	}()
	hits := w.hits.Load()
	start := time.Now()
	got, body := rg.get("/counters/alice/fast", nil)
	waited := time.Since(start)
	<-streamed
	if got.StatusCode != 200 || body != "fast" {
		t.Fatalf("unexpected answer to a request that waited %v for the connection; got %d %s; want 200 fast", waited, got.StatusCode, body)
	}
	if n := w.hits.Load() - hits; n != 1 {
		t.Fatalf("unexpected requests at the worker; got %d; want 1", n)
	}
}

// A WebSocket handshake whose dial to the worker took longer than the
// header timeout (SYN retransmits, a worker's full backlog) still gets
// the worker's 101: its deadline counts from when the connection is up,
// as a pooled request's does. Before, it counted from the request's
// arrival, and with the real clock the handshake was answered 504 before
// the worker had a chance to answer (R-DP-2, R-DP-4).
func TestSlowDialNotCountedInHandshakeTimeout_RDP2_RDP4(t *testing.T) {
	rg, w := newRigWorker(t, func(o *Options) {
		o.Now = nil // the real clock: deadlines are set from its readings
		o.Upstream.ResponseHeaderTimeout = 300 * time.Millisecond
	})
	rg.serveIDs(t, w, "alice")
	w.route("/ws", func(rw http.ResponseWriter, r *http.Request) {
		conn, _, ok := accept101(rw)
		if ok {
			defer conn.Close()
		}
	})
	up, err := rg.p.ups.get(w.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	dial := up.dial
	up.dial = func(addr string) (net.Conn, error) {
		time.Sleep(500 * time.Millisecond)
		return dial(addr)
	}
	if line := rg.upgrade("/counters/alice/ws"); !strings.HasPrefix(line, "HTTP/1.1 101") {
		t.Fatalf("unexpected answer to a handshake whose dial took 500ms, header timeout 300ms; got %q; want 101", line)
	}
}

// slowPlacements is a store whose placements take d: every request goes to
// it (no cached lookup), as a new id's does.
type slowPlacements struct {
	*directory.Memory
	d time.Duration
}

func (s slowPlacements) Lookup([]byte, []byte, time.Time) (directory.Route, bool) {
	return directory.Route{}, false
}

func (s slowPlacements) Place(ctx context.Context, req *directory.PlaceRequest) (directory.Route, error) {
	time.Sleep(s.d)
	return s.Memory.Place(ctx, req)
}

// A request whose placement took longer than the header timeout (a busy
// store) is still sent, and answered: the header timeout counts from when
// the request goes out. Before, with the real clock, its read deadline had
// passed by then, and it was answered 504 "owner timed out" without
// reaching the worker (R-DP-3, R-DP-4).
func TestSlowPlacementNotCountedInHeaderTimeout_RDP3_RDP4(t *testing.T) {
	rg, w, _ := newCapRigWorker(t, func(o *Options) {
		o.Now = nil // the real clock: deadlines are set from its readings
		o.Upstream.ResponseHeaderTimeout = 300 * time.Millisecond
		o.Store = slowPlacements{o.Store.(*directory.Memory), 500 * time.Millisecond}
	})
	// Twice: the second request takes the pooled connection at once (the
	// first dials it, which takes the clock's reading again).
	for i := 0; i < 2; i++ {
		hits := w.hits.Load()
		res, body := rg.get("/counters/alice/x", nil)
		if res.StatusCode != 200 {
			t.Fatalf("unexpected answer to request %d after a slow placement; got %d %s; want 200", i, res.StatusCode, body)
		}
		if n := w.hits.Load() - hits; n != 1 {
			t.Fatalf("unexpected requests at the worker for request %d; got %d; want 1", i, n)
		}
	}
}

// upgradeRequest is a client's WebSocket handshake for path, whole.
func upgradeRequest(path string) string {
	return "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n" +
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
}

// upgrade sends a WebSocket handshake for path through the rig and returns
// the status line of the answer.
func (rg *rig) upgrade(path string) string {
	rg.t.Helper()
	line, _ := rg.rawStatus(upgradeRequest(path))
	return line
}

// dialUpgrade sends the handshake for path, then extra, on a connection of
// its own (10 s deadline, closed at cleanup), and returns the connection
// and a reader at the answer.
func (rg *rig) dialUpgrade(path, extra string) (net.Conn, *bufio.Reader) {
	rg.t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
	if err != nil {
		rg.t.Fatal(err)
	}
	rg.t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(c, upgradeRequest(path)+extra)
	return c, bufio.NewReader(c)
}

// The reference worker refuses an upgrade it cannot attest with a bare
// 403 (WebSocketException before accept). From a session this proxy has
// just started routing to, that is the session gap and the handshake is
// tried again (R-TR-5); from an older session it is the route's own
// refusal and goes to the client at once.
func TestWebSocketSessionGapRetried_RTR5_RDP2(t *testing.T) {
	rg, w := newRigWorker(t, nil)
	var refuse atomic.Int64 // handshakes still to refuse
	w.route("/ws", func(rw http.ResponseWriter, r *http.Request) {
		if refuse.Add(-1) >= 0 {
			rw.WriteHeader(http.StatusForbidden)
			return
		}
		conn, _, ok := accept101(rw)
		if !ok {
			return
		}
		defer conn.Close()
	})

	t.Run("young session, gap closes", func(t *testing.T) {
		refuse.Store(2)
		w.hits.Store(0)
		if line := rg.upgrade("/counters/alice/ws"); !strings.HasPrefix(line, "HTTP/1.1 101") || w.hits.Load() != 3 {
			t.Fatalf("got %q after %d handshakes; want 101 after 3", line, w.hits.Load())
		}
	})
	t.Run("young session, refusing throughout", func(t *testing.T) {
		refuse.Store(100)
		w.hits.Store(0)
		if line := rg.upgrade("/counters/alice/ws"); !strings.HasPrefix(line, "HTTP/1.1 403") || w.hits.Load() != int64(1+len(unattestedWaits)) {
			t.Fatalf("got %q after %d handshakes; want 403 after %d", line, w.hits.Load(), 1+len(unattestedWaits))
		}
	})
	t.Run("older session", func(t *testing.T) {
		rg.advance(youngSession + time.Millisecond) // the lease (10 s) still runs
		refuse.Store(100)
		w.hits.Store(0)
		if line := rg.upgrade("/counters/alice/ws"); !strings.HasPrefix(line, "HTTP/1.1 403") || w.hits.Load() != 1 {
			t.Fatalf("got %q after %d handshakes; want 403 after 1", line, w.hits.Load())
		}
		refuse.Store(0)
		if line := rg.upgrade("/counters/alice/ws"); !strings.HasPrefix(line, "HTTP/1.1 101") {
			t.Fatalf("got %q; want 101", line)
		}
	})
}

// A POST that reached the worker on a reused connection, which the worker
// then dropped without answering, is not sent a second time (R-DP-1).
func TestPostNotReplayedAfterItRan_RDP1(t *testing.T) {
	rg, w := newRigWorker(t, nil)
	var ran atomic.Int64
	w.route("/charge", func(rw http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		ran.Add(1)
		conn, _, _ := rw.(http.Hijacker).Hijack()
		conn.Close()
	})
	rg.get("/counters/alice/value", nil) // warm a pooled connection
	req, _ := http.NewRequest("POST", rg.url+"/counters/alice/charge", strings.NewReader(`{"amount":100}`))
	res, _ := rg.do(req)
	if n := ran.Load(); n != 1 {
		t.Fatalf("POST ran %d times at the worker (client got %d)", n, res.StatusCode)
	}
}

// chargeRoute serves /charge on w, reading the body and answering
// "charged"; the count is of the requests that reached it.
func chargeRoute(w *standin) *atomic.Int64 {
	var n atomic.Int64
	w.route("/charge", func(rw http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		n.Add(1)
		rw.Write([]byte("charged"))
	})
	return &n
}

// A pooled connection the worker closed while idle (a restart, its
// keep-alive timer): a GET on it goes again on a fresh connection, and a
// POST finds it closed before it is used; neither reaches the client as
// an error (R-DP-1).
func TestIdleClosedPooledConnection_RDP1(t *testing.T) {
	rg, w := newRigWorker(t, nil)
	posts := chargeRoute(w)
	// Bodies: small (sent with the wait for the answer, rawio.SendRead),
	// larger than the write buffer but read whole (flushed before its
	// last bytes, which go with the wait), and streamed (an upload).
	bodies := map[string]string{
		"POST":        `{"amount":100}`,
		"POST-whole":  `{"pad":"` + strings.Repeat("x", 40<<10) + `"}`,
		"POST-stream": `{"pad":"` + strings.Repeat("y", 1<<20) + `"}`,
	}
	for _, kind := range []string{"GET", "POST", "GET", "POST", "POST-whole", "POST-stream"} {
		if res, _ := rg.get("/counters/alice/value", nil); res.StatusCode != 200 { // warm a pooled connection
			t.Fatal(res.StatusCode)
		}
		u, err := rg.p.ups.get(w.srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		w.srv.CloseClientConnections()
		waitUntil(t, "the FIN to reach the pooled socket", func() bool { return idleReadable(u.pool) })
		req, _ := http.NewRequest("GET", rg.url+"/counters/alice/value", nil)
		if kind != "GET" {
			req, _ = http.NewRequest("POST", rg.url+"/counters/alice/charge", strings.NewReader(bodies[kind]))
		}
		if res, body := rg.do(req); res.StatusCode != 200 {
			t.Fatalf("unexpected %s reply on a connection the worker closed while idle; got %d %s", kind, res.StatusCode, body)
		}
	}
	if n := posts.Load(); n != 4 {
		t.Fatalf("unexpected POST count at the worker; got %d; want 4", n)
	}
}

// The same behind TLS (an https advertise URL): a peek cannot tell a
// pooled TLS connection the worker closed while idle — its close_notify
// is data to the socket — so its socket's TCP state does (rawio.NotQuiet),
// and a POST goes out on a fresh connection instead of failing with 502
// (R-DP-1).
func TestIdleClosedPooledTLSConnection_RDP1(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	s, up := tlsStandin(t, rg)
	posts := chargeRoute(s)
	rg.serveIDs(t, s, "alice")
	for range 3 {
		if res, body := rg.get("/counters/alice/x", nil); res.StatusCode != 200 { // warm a pooled connection
			t.Fatalf("unexpected reply; got %d %s", res.StatusCode, body)
		}
		s.srv.CloseClientConnections()
		waitUntil(t, "the worker's close to reach the pooled TLS socket", func() bool {
			up.pool.mu.Lock()
			defer up.pool.mu.Unlock()
			return len(up.pool.idle) == 1 && rawio.NotQuiet(up.pool.idle[0].c)
		})
		req, _ := http.NewRequest("POST", rg.url+"/counters/alice/charge", strings.NewReader(`{"amount":100}`))
		if res, body := rg.do(req); res.StatusCode != 200 {
			t.Fatalf("unexpected POST reply on a TLS connection the worker closed while idle; got %d %s", res.StatusCode, body)
		}
	}
	if n := posts.Load(); n != 3 {
		t.Fatalf("unexpected POST count at the worker; got %d; want 3", n)
	}
}

// upgradeBehindResetClient has the worker hold back a 101 for an upgrade
// pipelined behind a plain request, and the client reset its connection
// while the upgrade waits at the worker. Closing answer sends the 101; closed
// gets the worker's next read on the hijacked connection.
func upgradeBehindResetClient(t *testing.T, rg *rig, w *standin) (chan<- struct{}, <-chan error) {
	t.Helper()
	asked, answer, closed := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	w.route("/ws", func(rw http.ResponseWriter, r *http.Request) {
		conn, brw, err := rw.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		close(asked)
		<-answer
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		brw.Flush()
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = brw.ReadByte()
		closed <- err
	})
	c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// One write: both requests reach pinboard's read buffer together, so
	// the first answer is held back for the second.
	_, _ = io.WriteString(c, "GET /counters/alice/x HTTP/1.1\r\nHost: x\r\n\r\n"+
		upgradeRequest("/counters/alice/ws"))
	select {
	case <-asked:
	case <-time.After(10 * time.Second):
		t.Fatal("the upgrade never reached the worker")
	}
	c.(*net.TCPConn).SetLinger(0)
	c.Close()
	time.Sleep(100 * time.Millisecond) // the reset reaches pinboard's socket
	return answer, closed
}

// A 101 whose hijack fasthttp never runs — the client reset its
// connection while a pipelined answer before the upgrade still waited in
// the write buffer, whose flush then fails — must not leave the worker's
// WebSocket open: nothing else would ever close it (R-DP-2).
func TestUpgradeBehindFailedFlushClosesWorker_RDP2(t *testing.T) {
	defer func(d time.Duration) { hijackWait = d }(hijackWait)
	hijackWait = 500 * time.Millisecond
	rg, w := newRigWorker(t, nil)
	answer, closed := upgradeBehindResetClient(t, rg, w)
	close(answer)
	if err := <-closed; !errors.Is(err, io.EOF) {
		t.Fatalf("unexpected worker read after the client's reset; got %v; want %v", err, io.EOF)
	}
}

// The same 101 at shutdown, its hijack not run yet: CloseStreamsContext
// waits for it as for a relay and, at its deadline, closes the worker's
// WebSocket at once instead of hijackWait (30 s) later (R-DP-2).
func TestShutdownAbandonsSkippedUpgrade_RDP2(t *testing.T) {
	rg, w := newRigWorker(t, nil)
	answer, closed := upgradeBehindResetClient(t, rg, w)
	close(answer)
	hj := rg.p.hijacks
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		hj.mu.Lock()
		n := len(hj.pending)
		hj.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the 101's hijack was never pending")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	rg.p.CloseStreamsContext(ctx)
	// Against the deadline itself: a start taken after the context, with
	// 50ms of slack, fails when the machine pauses longer between the two.
	if deadline, _ := ctx.Deadline(); time.Now().Before(deadline) {
		t.Fatalf("unexpected CloseStreams return %v before its deadline; want it to wait for the pending hijack until then", time.Until(deadline))
	}
	if err := <-closed; !errors.Is(err, io.EOF) {
		t.Fatalf("unexpected worker read after shutdown; got %v; want %v", err, io.EOF)
	}
}

// Bytes a client sends right behind its upgrade request, before the 101
// reached it, reach the worker first and in order, then the rest of the
// conversation: the relay reads the client's connection itself, and the
// server's read buffer gives up what it already held (R-DP-2).
func TestWebSocketBytesBefore101Relayed_RDP2(t *testing.T) {
	rg, w := newRigWorker(t, nil)
	w.route("/ws", func(rw http.ResponseWriter, r *http.Request) {
		conn, brw, ok := accept101(rw)
		if !ok {
			return
		}
		defer conn.Close()
		// Echo whatever arrives, byte for byte, until the client leaves.
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 64)
		for {
			n, err := brw.Read(buf)
			if n > 0 {
				_, _ = conn.Write(buf[:n])
			}
			if err != nil {
				return
			}
		}
	})
	c, br := rg.dialUpgrade("/counters/alice/ws", "early-")
	readHead(t, br) // the 101
	_, _ = io.WriteString(c, "late")
	got := make([]byte, len("early-late"))
	if _, err := io.ReadFull(br, got); err != nil || string(got) != "early-late" {
		t.Fatalf("unexpected echo; got %q, %v; want %q", got, err, "early-late")
	}
}

// A WebSocket client that stops reading while the worker keeps sending is
// cut after the stall timeout: the worker's connection closes instead of
// the relay blocking on the client for ever (R-DP-2, R-DP-3).
func TestWebSocketStalledReaderCut_RDP2_RDP3(t *testing.T) {
	rg, w := newRigWorker(t, func(o *Options) { o.Upstream.StallTimeout = 300 * time.Millisecond })
	gone := make(chan struct{})
	w.route("/ws", func(rw http.ResponseWriter, r *http.Request) {
		conn, _, ok := accept101(rw)
		if !ok {
			return
		}
		defer conn.Close()
		// Binary frames of 64 KiB, unmasked (server to client), until the
		// relay closes the connection.
		frame := append([]byte{0x82, 127, 0, 0, 0, 0, 0, 1, 0, 0}, make([]byte, 64<<10)...)
		_ = conn.SetWriteDeadline(time.Now().Add(20 * time.Second))
		for {
			if _, err := conn.Write(frame); err != nil {
				close(gone)
				return
			}
		}
	})
	c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.(*net.TCPConn).SetReadBuffer(4096)
	_, _ = io.WriteString(c, upgradeRequest("/counters/alice/ws"))
	select {
	case <-gone:
	case <-time.After(15 * time.Second):
		t.Fatal("unexpected relay still writing 15s after its client stopped reading")
	}
}

// accept101 is a stand-in worker's side of a WebSocket handshake: it takes
// the connection over and answers 101. The caller closes conn.
func accept101(rw http.ResponseWriter) (conn net.Conn, brw *bufio.ReadWriter, ok bool) {
	conn, brw, err := rw.(http.Hijacker).Hijack()
	if err != nil {
		return nil, nil, false
	}
	brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
	if brw.Flush() != nil {
		conn.Close()
		return nil, nil, false
	}
	return conn, brw, true
}

// A worker that re-registers gets a new session id and learns it only
// from the register ack (R-TR-5): until then it refuses upgrades with a
// bare 403, whichever session they name. An upgrade is retried through
// that gap, not only for a worker's first session: the id may move to the
// new session before the worker holds it (the new session is one this
// proxy has just started routing to), or still be routed to the old one
// the worker already dropped, and then move (R-DP-2).
func TestWebSocketReregistrationGapRetried_RTR5_RDP2(t *testing.T) {
	rg, w := newRigWorker(t, nil)
	w.route("/ws", func(rw http.ResponseWriter, r *http.Request) {
		conn, _, ok := accept101(rw)
		if ok {
			conn.Close()
		}
	})
	// reregister moves alice to a new session of w's client, as the
	// register of a worker that lost its session does, and returns it.
	reregister := func(prev string) string {
		res, err := rg.store.Register(t.Context(), &directory.Registration{
			ClientID: "client-w", Sub: "p:worker", Secret: w.secret, Namespaces: []string{"/counters"},
			AdvertiseURL: w.srv.URL, Headroom: 1, PrevSessionID: prev,
			Instances: map[string][]string{"/counters": {"alice"}},
		}, rg.now())
		if err != nil {
			t.Fatal(err)
		}
		return res.SessionID
	}
	// old makes alice's session an old one for this proxy.
	old := func() string {
		if line := rg.upgrade("/counters/alice/ws"); !strings.HasPrefix(line, "HTTP/1.1 101") {
			t.Fatalf("got %q; want 101", line)
		}
		rg.advance(youngSession + time.Millisecond)
		return w.session.Load().(string)
	}
	// retried expects alice's handshake to get the worker's 101 on its
	// second try, fn run as the worker refuses the first (unattested).
	retried := func(t *testing.T, fn func()) {
		t.Helper()
		w.unattested.Store(&fn)
		w.hits.Store(0)
		if line := rg.upgrade("/counters/alice/ws"); !strings.HasPrefix(line, "HTTP/1.1 101") || w.hits.Load() != 2 {
			t.Fatalf("got %q after %d handshakes; want 101 after 2", line, w.hits.Load())
		}
	}

	t.Run("routed to the new session before the worker has it", func(t *testing.T) {
		prev := old()
		w.session.Store("") // the worker dropped its session and re-registers
		next := reregister(prev)
		retried(t, func() { w.unattested.Store(nil); w.session.Store(next) }) // the ack is read
	})
	t.Run("routed to the old session the worker dropped", func(t *testing.T) {
		prev := old()
		w.session.Store("")
		// The re-registration lands while the refused handshake is on its
		// way back; the worker then holds its new session.
		retried(t, func() { w.unattested.Store(nil); w.session.Store(reregister(prev)) })
	})
	t.Run("old session lapsed", func(t *testing.T) {
		prev := old()
		w.session.Store("")
		// The session's lease lapsed while the handshake was on its way
		// (the worker heard of it and dropped its session); the retry
		// places the id anew, on the worker's new session.
		retried(t, func() {
			w.unattested.Store(nil)
			rg.advance(10 * time.Second)
			res, err := rg.store.Register(t.Context(), &directory.Registration{
				ClientID: "client-w", Sub: "p:worker", Secret: w.secret, Namespaces: []string{"/counters"},
				AdvertiseURL: w.srv.URL, Headroom: 1, PrevSessionID: prev,
			}, rg.now())
			if err != nil {
				t.Error(err)
				return
			}
			w.session.Store(res.SessionID)
		})
	})
	t.Run("old session, the route refuses", func(t *testing.T) {
		old()
		w.route("/ws", func(rw http.ResponseWriter, r *http.Request) { rw.WriteHeader(http.StatusForbidden) })
		w.hits.Store(0)
		if line := rg.upgrade("/counters/alice/ws"); !strings.HasPrefix(line, "HTTP/1.1 403") || w.hits.Load() != 1 {
			t.Fatalf("got %q after %d handshakes; want the route's 403 after 1", line, w.hits.Load())
		}
	})
}

// An upgrade request that carries a body (Content-Length > 0, or chunked)
// is refused with 400 and its connection closed: the bytes after its
// header are its body, which must neither reach the worker as WebSocket
// frames after a 101 nor be read as the client's next request (a smuggled
// request). An empty Content-Length still upgrades (R-DP-2).
func TestUpgradeWithBodyRefused_RDP2(t *testing.T) {
	rg, w := newRigWorker(t, nil)
	var upgrades, smuggled atomic.Int64
	after := make(chan string, 4) // what reached the worker after its 101
	w.route("/ws", func(rw http.ResponseWriter, r *http.Request) {
		upgrades.Add(1)
		conn, brw, ok := accept101(rw)
		if !ok {
			return
		}
		defer conn.Close()
		_ = conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		b, _ := io.ReadAll(brw)
		after <- string(b)
	})
	w.route("/smuggled", func(rw http.ResponseWriter, r *http.Request) { smuggled.Add(1) })
	const handshake = "GET /counters/alice/ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n" +
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
	const next = "GET /counters/alice/smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
	exchange := func(t *testing.T, req string) string {
		t.Helper()
		c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(c)
		return string(got)
	}
	for name, body := range map[string]string{
		"content-length": fmt.Sprintf("Content-Length: %d\r\n\r\n%s", len(next), next),
		"chunked":        fmt.Sprintf("Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(next), next),
	} {
		t.Run(name, func(t *testing.T) {
			upgrades.Store(0)
			got := exchange(t, handshake+body)
			want := "{\"error\":\"a WebSocket upgrade request cannot carry a body\"}"
			if !strings.HasPrefix(got, "HTTP/1.1 400 ") || !strings.HasSuffix(got, want) || strings.Count(got, "HTTP/1.1 ") != 1 {
				t.Fatalf("unexpected answer to an upgrade with a body; got %q; want one 400 ending %s, then the close", got, want)
			}
			if n := upgrades.Load(); n != 0 {
				t.Fatalf("unexpected upgrades at the worker; got %d; want 0", n)
			}
			if n := smuggled.Load(); n != 0 {
				t.Fatalf("unexpected smuggled requests at the worker; got %d; want 0", n)
			}
		})
	}
	t.Run("empty body", func(t *testing.T) {
		upgrades.Store(0)
		if got := exchange(t, handshake+"Content-Length: 0\r\n\r\n"); !strings.HasPrefix(got, "HTTP/1.1 101 ") {
			t.Fatalf("unexpected answer to an upgrade with Content-Length: 0; got %q; want 101", got)
		}
		if b := <-after; b != "" {
			t.Fatalf("unexpected bytes at the worker after its 101; got %q; want none", b)
		}
	})
}

// The worker reads the upgrade pinboard decided on. pinboard takes a
// request for a WebSocket by its first Upgrade line; uvicorn, on h11 and
// on httptools alike, by its last (HttpToolsProtocol._get_upgrade), so
// "Upgrade: websocket" then "Upgrade: h2c" was relayed as a handshake
// that the worker served as a plain GET. One line goes: "websocket"
// (R-DP-2).
func TestUpgradeSentAsOneLine_RDP2(t *testing.T) {
	rg, w := newRigWorker(t, nil)
	seen := make(chan []string, 1)
	w.route("/ws", func(rw http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Values("Upgrade")
		if conn, _, ok := accept101(rw); ok {
			conn.Close()
		}
	})
	line, err := rg.rawStatus("GET /counters/alice/ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: WebSocket\r\nUpgrade: h2c\r\n" +
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
	if err != nil || !strings.HasPrefix(line, "HTTP/1.1 101") {
		t.Fatalf("unexpected answer; got %q (err %v); want the worker's 101", line, err)
	}
	if got := <-seen; len(got) != 1 || got[0] != "websocket" {
		t.Fatalf("unexpected Upgrade lines at the worker; got %q; want [websocket]", got)
	}
}

// Interim answers a worker sends before its answer to an upgrade (103
// Early Hints, RFC 8297; 100 Continue) are read past, as for any request:
// the client gets the 101 and its WebSocket. Before, the first interim
// answer was taken for the final one: the client got a bare 103 and then
// nothing, waiting on its connection for an answer that never came, and
// the worker's 101 was dropped with its connection (R-DP-2).
func TestWebSocketInterimAnswersSkipped_RDP2(t *testing.T) {
	rg, w := newRigWorker(t, nil)
	w.route("/ws", func(rw http.ResponseWriter, r *http.Request) {
		conn, brw, err := rw.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		brw.WriteString("HTTP/1.1 103 Early Hints\r\nLink: </app.js>; rel=preload\r\n\r\n")
		brw.Flush()
		time.Sleep(20 * time.Millisecond) // its own read for pinboard
		brw.WriteString("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		if brw.Flush() != nil {
			return
		}
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 64)
		n, _ := brw.Read(buf)
		_, _ = conn.Write(buf[:n])
	})
	c, br := rg.dialUpgrade("/counters/alice/ws", "")
	if head := readHead(t, br); head[0] != "HTTP/1.1 101 Switching Protocols" {
		t.Fatalf("unexpected answer to an upgrade the worker answered 103, 100, 101; got %q; want the 101", head)
	}
	_, _ = io.WriteString(c, "ping")
	got := make([]byte, 4)
	if _, err := io.ReadFull(br, got); err != nil || string(got) != "ping" {
		t.Fatalf("unexpected echo; got %q, %v; want %q", got, err, "ping")
	}
}

// A WebSocket handshake sent with HEAD (no client should, RFC 6455 §4.1
// asks for GET; a hostile one may) that the worker refuses gets the
// worker's answer at once, its Content-Length kept and no body. Before,
// the refusal's body was read as for a GET: the worker, rightly, sent
// none, and the client waited for the handshake's deadline (30 s) and got
// 502 "owner unreachable" (R-DP-2).
func TestHeadUpgradeRefusalRelayed_RDP2(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	w, _ := rawRequestWorker(t, func(c net.Conn, r *http.Request) bool {
		_, _ = io.WriteString(c, "HTTP/1.1 404 Not Found\r\nContent-Length: 10\r\n\r\n")
		return true
	})
	rg.serveIDs(t, w, "alice")
	start := time.Now()
	c2, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	_ = c2.SetDeadline(time.Now().Add(5 * time.Second))
	_, _ = io.WriteString(c2, strings.Replace(upgradeRequest("/counters/alice/ws"), "GET", "HEAD", 1))
	res, err := http.ReadResponse(bufio.NewReader(c2), &http.Request{Method: http.MethodHead})
	if err != nil {
		t.Fatalf("unexpected read error after %v; got %v; want the worker's 404 at once", time.Since(start), err)
	}
	if res.StatusCode != http.StatusNotFound || res.ContentLength != 10 {
		t.Fatalf("unexpected answer to a HEAD handshake; got %d with Content-Length %d; want 404 with 10", res.StatusCode, res.ContentLength)
	}
}

// Connections to a worker are pooled per worker and reused (R-DP-3):
// sequential requests for different ids on one owner, from different
// client connections, ride one worker connection.
func TestSequentialRequestsShareOneWorkerConnection_RDP3(t *testing.T) {
	rg, w := newRigWorker(t, nil)
	var mu sync.Mutex
	peers := map[string]int{}
	w.route("/peer", func(rw http.ResponseWriter, r *http.Request) {
		mu.Lock()
		peers[r.RemoteAddr]++
		mu.Unlock()
	})
	for i := range 20 {
		req, _ := http.NewRequest("GET", fmt.Sprintf("%s/counters/id%d/peer", rg.url, i), nil)
		req.Close = i%2 == 1 // a new client connection for every other request
		if res, body := rg.do(req); res.StatusCode != 200 {
			t.Fatalf("unexpected reply for id%d; got %d %s", i, res.StatusCode, body)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(peers) != 1 {
		t.Fatalf("unexpected worker connections for 20 sequential requests; got %d (%v); want 1 reused", len(peers), peers)
	}
}

// A worker that answers an upload early — its header and part of a small
// sized body while the client still sends — and then freezes is cut after
// the header timeout, as the body of any answer read whole is (readSized),
// and the client gets an answer (R-DP-3, R-DP-4). Before, a header that
// came before the body was all out armed no deadline at all (the upload
// arms it only when it ends first): the read of the rest waited for as
// long as the worker stayed frozen, the client unanswered, and a client
// that left was never noticed.
func TestEarlyAnswerStalledBodyCut_RDP3_RDP4(t *testing.T) {
	rg := newRig(t, func(o *Options) { o.Upstream.ResponseHeaderTimeout = 500 * time.Millisecond })
	rg.warm()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	answered := make(chan struct{})
	ln := rawListener(t, func(c net.Conn) {
		defer c.Close()
		r, err := http.ReadRequest(bufio.NewReader(c))
		if err != nil {
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
		close(answered)
		_, _ = io.Copy(io.Discard, r.Body)
		<-release // frozen: 7 bytes of the body never come
	})
	rg.serveIDs(t, rawWorker("raw", ln), "alice")
	c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Streamed, not read whole first; the first part is past the 8 KiB
	// the server reads before the handler runs.
	const size, first = 200 << 10, 16 << 10
	if _, err := fmt.Fprintf(c, "POST /counters/alice/up HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n%s", size, strings.Repeat("x", first)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-answered:
	case <-time.After(10 * time.Second):
		t.Fatal("the worker got no request")
	}
	time.Sleep(200 * time.Millisecond) // the header is read before the upload ends
	if _, err := io.WriteString(c, strings.Repeat("x", size-first)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer %v after the upload ended, the worker frozen mid-answer: %v", time.Since(start), err)
	}
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusGatewayTimeout || string(body) != `{"error":"owner timed out"}` {
		t.Fatalf("unexpected answer to an upload whose answer froze; got %d %s; want 504 {\"error\":\"owner timed out\"}", res.StatusCode, body)
	}
}

// A worker that sends its header and then freezes inside a small sized
// body (read whole before anything reaches the client) gets the client a
// 504 "owner timed out" after the header timeout, as a header that late
// does: the worker did not answer in time. Before, 502 "owner
// unreachable", as if it had closed its connection (R-DP-4).
func TestFrozenSmallBodyIs504_RDP4(t *testing.T) {
	rg := newRig(t, func(o *Options) { o.Upstream.ResponseHeaderTimeout = 300 * time.Millisecond })
	rg.warm()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	w, _ := rawRequestWorker(t, func(c net.Conn, r *http.Request) bool {
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
		<-release
		return false
	})
	rg.serveIDs(t, w, "alice")
	res, body := rg.get("/counters/alice/x", nil)
	if res.StatusCode != http.StatusGatewayTimeout || body != `{"error":"owner timed out"}` {
		t.Fatalf("unexpected answer from a worker frozen mid-body; got %d %s; want 504 {\"error\":\"owner timed out\"}", res.StatusCode, body)
	}
}

// A worker's refusal of an upgrade whose body does not come in time — its
// header sent, then the worker froze — is answered as any answer whose
// rest does not come in time: 504 "owner timed out", the kind "timeout"
// (TestFrozenSmallBodyIs504_RDP4 for requests); before, 502 "owner
// unreachable", counted as a read failure, from a worker that was
// reachable and had answered (R-DP-4).
func TestFrozenUpgradeRefusalIs504_RDP4(t *testing.T) {
	rg, w := newRigWorker(t, func(o *Options) { o.Upstream.ResponseHeaderTimeout = 300 * time.Millisecond })
	rg.serveIDs(t, w, "alice")
	// The rest of the body never comes.
	w.route("/ws", stuckHandshake("HTTP/1.1 401 Unauthorized\r\nContent-Length: 10\r\n\r\nden", 15*time.Second, nil))
	expectUpgrade504(t, rg, "a refusal whose body froze")
}

// A GET on a reused connection whose answer the worker began — part of
// its header, or an interim 103 — and then dropped is not sent a second
// time: the worker had it (R-DP-1). A connection the worker closed while
// idle, before any byte, is retried (TestIdleClosedPooledConnection_RDP1).
func TestGetNotReplayedAfterAnswerBegan_RDP1(t *testing.T) {
	for name, begun := range map[string]string{
		"partial header": "HTTP/1.1 200 OK\r\nContent-Ty",
		"interim 103":    "HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n",
	} {
		t.Run(name, func(t *testing.T) {
			rg, w := newRigWorker(t, nil)
			var ran atomic.Int64
			w.route("/peek", func(rw http.ResponseWriter, r *http.Request) {
				ran.Add(1)
				conn, bw, _ := rw.(http.Hijacker).Hijack()
				bw.WriteString(begun)
				bw.Flush()
				conn.Close()
			})
			rg.get("/counters/alice/value", nil) // warm a pooled connection
			res, _ := rg.get("/counters/alice/peek", nil)
			if n := ran.Load(); n != 1 || res.StatusCode != 502 {
				t.Fatalf("unexpected GET replay; ran %d times at the worker, client got %d; want once and 502", n, res.StatusCode)
			}
		})
	}
}

// A client that leaves while the worker has not answered its WebSocket
// handshake frees the worker connection within clientCheckEvery, as a
// request waiting for its response header does
// (TestClientGoneBeforeAnswerFreesWorker_RDP3): counted as 499, not as a
// worker timeout. Before, the handshake waited for its whole deadline
// (30 s, or the header timeout when shorter) and then counted a 504 and
// an upstream "timeout" that no client saw. A client that stays gets the
// worker's 101 however many checks pass before it, also when it comes in
// pieces (R-DP-2, R-DP-3).
func TestClientGoneDuringHandshakeFreesWorker_RDP2_RDP3(t *testing.T) {
	defer func(d time.Duration) { clientCheckEvery = d }(clientCheckEvery)
	clientCheckEvery = 100 * time.Millisecond
	var m recorder
	rg, w := newRigWorker(t, func(o *Options) { o.Metrics = &m })
	rg.serveIDs(t, w, "alice")
	gone := make(chan time.Duration, 1)
	w.route("/silent", stuckHandshake("", 40*time.Second, gone)) // answers nothing
	// A refusal whose body stops half-way.
	w.route("/refused", stuckHandshake("HTTP/1.1 404 Not Found\r\nContent-Length: 10\r\n\r\nnot", 40*time.Second, gone))
	w.route("/late", func(rw http.ResponseWriter, r *http.Request) {
		conn, _, err := rw.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		time.Sleep(350 * time.Millisecond)
		_, _ = io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n")
		time.Sleep(350 * time.Millisecond)
		_, _ = io.WriteString(conn, "Connection: Upgrade\r\n\r\n")
		time.Sleep(200 * time.Millisecond)
	})

	for i, path := range []string{"/counters/alice/silent", "/counters/alice/refused"} {
		c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.WriteString(c, upgradeRequest(path))
		time.Sleep(150 * time.Millisecond)
		_ = c.Close()
		select {
		case d := <-gone:
			if d > 8*time.Second {
				t.Fatalf("unexpected worker connection held %v after the client left %s; want it closed within a few client checks", d, path)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("unexpected worker connection still open 20s after the client left %s", path)
		}
		waitUntil(t, "the request counted", func() bool { return len(m.requestsSeen()) == i+1 })
		if got := m.requestsSeen()[i]; got.status != statusClientClosed || !got.routed {
			t.Fatalf("unexpected request recorded for %s; got %+v; want status 499 under its namespace", path, got)
		}
	}
	m.mu.Lock()
	kinds := append([]string(nil), m.upstream...)
	m.mu.Unlock()
	if len(kinds) != 0 {
		t.Fatalf("unexpected upstream errors for a handshake whose client left; got %q; want none", kinds)
	}

	if line := rg.upgrade("/counters/alice/late"); !strings.HasPrefix(line, "HTTP/1.1 101") {
		t.Fatalf("unexpected answer to a client that stayed through the checks; got %q; want the worker's 101", line)
	}
}
