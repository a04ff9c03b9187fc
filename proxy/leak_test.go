package proxy

import (
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
)

// TestExchangeEndsLeaveNothing_RDP2_RDP3: whichever way a proxied exchange
// ends — the client or the worker closing or resetting mid-stream,
// mid-upload, mid-WebSocket, a header timeout, a shutdown — every
// goroutine the proxy started for it returns and its worker connection is
// closed or pooled exactly once: once idle connections are closed, the
// pool's open count is back to 0.
func TestExchangeEndsLeaveNothing_RDP2_RDP3(t *testing.T) {
	defer func(d time.Duration) { clientCheckEvery = d }(clientCheckEvery)
	clientCheckEvery = 100 * time.Millisecond
	type tc struct {
		name   string
		worker func(c net.Conn, r *http.Request) bool // the worker's answer
		client func(t *testing.T, c net.Conn)
		req    string
		stop   bool
	}
	idleSSE := func(c net.Conn, r *http.Request) bool {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n")
		io.Copy(io.Discard, c)
		return false
	}
	readAWhile := func(t *testing.T, c net.Conn) {
		c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		io.Copy(io.Discard, c)
	}
	cases := []tc{
		{"sse worker closes mid-stream", func(c net.Conn, r *http.Request) bool {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n")
			time.Sleep(100 * time.Millisecond)
			return false
		}, func(t *testing.T, c net.Conn) { io.Copy(io.Discard, c) }, "GET /counters/alice/x HTTP/1.1\r\nHost: x\r\n\r\n", false},
		{"sse worker resets mid-stream", func(c net.Conn, r *http.Request) bool {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n")
			time.Sleep(100 * time.Millisecond)
			c.(*net.TCPConn).SetLinger(0)
			return false
		}, func(t *testing.T, c net.Conn) { io.Copy(io.Discard, c) }, "GET /counters/alice/x HTTP/1.1\r\nHost: x\r\n\r\n", false},
		{"sse worker ends cleanly", func(c net.Conn, r *http.Request) bool {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n0\r\n\r\n")
			return true
		}, func(t *testing.T, c net.Conn) {
			c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			io.Copy(io.Discard, c)
		}, "GET /counters/alice/x HTTP/1.1\r\nHost: x\r\n\r\n", false},
		{"sse client closes", func(c net.Conn, r *http.Request) bool {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n")
			io.Copy(io.Discard, c)
			return false
		}, func(t *testing.T, c net.Conn) { time.Sleep(100 * time.Millisecond) }, "GET /counters/alice/x HTTP/1.1\r\nHost: x\r\n\r\n", false},
		{"download client closes", func(c net.Conn, r *http.Request) bool {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
			for {
				if _, err := io.WriteString(c, "400\r\n"+strings.Repeat("x", 1024)+"\r\n"); err != nil {
					return false
				}
			}
		}, func(t *testing.T, c net.Conn) { time.Sleep(100 * time.Millisecond) }, "GET /counters/alice/x HTTP/1.1\r\nHost: x\r\n\r\n", false},
		{"download idle client closes", func(c net.Conn, r *http.Request) bool {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\nabc")
			io.Copy(io.Discard, c)
			return false
		}, func(t *testing.T, c net.Conn) { time.Sleep(100 * time.Millisecond) }, "GET /counters/alice/x HTTP/1.1\r\nHost: x\r\n\r\n", false},
		{"download worker resets", func(c net.Conn, r *http.Request) bool {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\nabc")
			time.Sleep(100 * time.Millisecond)
			c.(*net.TCPConn).SetLinger(0)
			return false
		}, func(t *testing.T, c net.Conn) { io.Copy(io.Discard, c) }, "GET /counters/alice/x HTTP/1.1\r\nHost: x\r\n\r\n", false},
		{"http10 download client closes", func(c net.Conn, r *http.Request) bool {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
			io.Copy(io.Discard, c)
			return false
		}, func(t *testing.T, c net.Conn) { time.Sleep(100 * time.Millisecond) }, "GET /counters/alice/x HTTP/1.0\r\nHost: x\r\n\r\n", false},
		{"http10 download worker closes", func(c net.Conn, r *http.Request) bool {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
			time.Sleep(100 * time.Millisecond)
			return false
		}, func(t *testing.T, c net.Conn) { io.Copy(io.Discard, c) }, "GET /counters/alice/x HTTP/1.0\r\nHost: x\r\n\r\n", false},
		{"upload worker answers early keep-alive", func(c net.Conn, r *http.Request) bool {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			return true
		}, func(t *testing.T, c net.Conn) { io.WriteString(c, "abc"); time.Sleep(200 * time.Millisecond) }, "POST /counters/alice/x HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n", false},
		{"upload client closes mid-body", func(c net.Conn, r *http.Request) bool {
			return false
		}, func(t *testing.T, c net.Conn) {
			io.WriteString(c, strings.Repeat("a", 50000))
			time.Sleep(100 * time.Millisecond)
		}, "POST /counters/alice/x HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n", false},
		{"upload stream answer client closes", func(c net.Conn, r *http.Request) bool {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
			time.Sleep(time.Second)
			return false
		}, func(t *testing.T, c net.Conn) {
			io.WriteString(c, strings.Repeat("a", 50000))
			time.Sleep(100 * time.Millisecond)
		}, "POST /counters/alice/x HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n", false},
		{"head of a stream", func(c net.Conn, r *http.Request) bool {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
			time.Sleep(300 * time.Millisecond)
			return false
		}, func(t *testing.T, c net.Conn) {
			c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			io.Copy(io.Discard, c)
		}, "HEAD /counters/alice/x HTTP/1.1\r\nHost: x\r\n\r\n", false},
		{"header timeout", func(c net.Conn, r *http.Request) bool {
			time.Sleep(600 * time.Millisecond)
			return false
		}, func(t *testing.T, c net.Conn) {
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			io.Copy(io.Discard, c)
		}, "GET /counters/alice/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", false},
		{"ws client closes", func(c net.Conn, r *http.Request) bool {
			io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
			io.Copy(io.Discard, c)
			return false
		}, func(t *testing.T, c net.Conn) { time.Sleep(200 * time.Millisecond) }, "GET /counters/alice/ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", false},
		{"ws worker closes", func(c net.Conn, r *http.Request) bool {
			io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
			time.Sleep(100 * time.Millisecond)
			return false
		}, func(t *testing.T, c net.Conn) { io.Copy(io.Discard, c) }, "GET /counters/alice/ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", false},
		{"shutdown sse idle", idleSSE, readAWhile, "GET /counters/alice/x HTTP/1.1\r\nHost: x\r\n\r\n", true},
		{"shutdown download idle", func(c net.Conn, r *http.Request) bool {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\nabc")
			io.Copy(io.Discard, c)
			return false
		}, readAWhile, "GET /counters/alice/x HTTP/1.1\r\nHost: x\r\n\r\n", true},
		{"shutdown http10 download idle", idleSSE, readAWhile, "GET /counters/alice/x HTTP/1.0\r\nHost: x\r\n\r\n", true},
		{"shutdown upload streaming answer", func(c net.Conn, r *http.Request) bool {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
			io.Copy(io.Discard, c)
			return false
		}, func(t *testing.T, c net.Conn) { io.WriteString(c, strings.Repeat("a", 50000)); readAWhile(t, c) }, "POST /counters/alice/x HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n", true},
		{"shutdown http10 upload streaming answer", func(c net.Conn, r *http.Request) bool {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
			io.Copy(io.Discard, c)
			return false
		}, func(t *testing.T, c net.Conn) { io.WriteString(c, strings.Repeat("a", 50000)); readAWhile(t, c) }, "POST /counters/alice/x HTTP/1.0\r\nHost: x\r\nContent-Length: 100000\r\n\r\n", true},
		{"shutdown ws idle", func(c net.Conn, r *http.Request) bool {
			io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
			io.Copy(io.Discard, c)
			return false
		}, readAWhile, "GET /counters/alice/ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", true},
	}
	for _, k := range cases {
		t.Run(k.name, func(t *testing.T) {
			rg := newRig(t, func(o *Options) { o.Upstream.ResponseHeaderTimeout = 300 * time.Millisecond })
			rg.warm()
			w, _ := rawRequestWorkerNoDrain(t, k.worker)
			rg.add(w, 1, "/counters")
			// Placed, then the real clock: the proxy's deadlines (the
			// header timeout) are taken on the rig's clock.
			if _, err := rg.store.Place(t.Context(), &directory.PlaceRequest{NS: "/counters", ID: "alice", Now: rg.now()}); err != nil {
				t.Fatal(err)
			}
			real := time.Now()
			rg.clock.Store(&real)
			base := proxyGoroutines()
			c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			io.WriteString(c, k.req)
			k.client(t, c)
			if k.stop {
				done := make(chan struct{})
				go func() {
					c.SetReadDeadline(time.Now().Add(5 * time.Second))
					io.Copy(io.Discard, c)
					close(done)
				}()
				start := time.Now()
				rg.p.CloseStreams()
				if d := time.Since(start); d > 2500*time.Millisecond {
					t.Errorf("unexpected CloseStreams time; got %v; want <= 2.5s", d)
				}
				select {
				case <-done:
				case <-time.After(5 * time.Second):
					t.Errorf("unexpected client connection open 5s after shutdown")
				}
			}
			c.Close()
			u, err := rg.p.ups.get(w.srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			// Whatever is left of the exchange ends, and idle worker
			// connections close: none may stay open, and no goroutine of
			// the proxy may be left (a connection let go of twice blocks
			// one in discard, on a token that is not there).
			waitUntil(t, "the exchange to end", func() bool {
				return rg.p.OpenStreams() == 0 && rg.p.OpenWebSockets() == 0 && rg.p.RelayedEventStreams() == 0 && rg.p.RelayedDownloads() == 0
			})
			rg.p.CloseStreams()
			deadline := time.Now().Add(10 * time.Second)
			for u.pool.open() != 0 || proxyGoroutines() > base {
				if time.Now().After(deadline) {
					open, g := u.pool.open(), proxyGoroutines()
					// A goroutine blocked in discard waits for a token
					// that is not there: give it some, so that the rig's
					// shutdown does not wait for it for ever.
					for range cap(u.pool.tokens) {
						select {
						case u.pool.tokens <- struct{}{}:
						default:
						}
					}
					buf := make([]byte, 1<<20)
					t.Fatalf("unexpected worker connections and proxy goroutines left; got %d, %d; want 0, %d\n%s",
						open, g, base, buf[:runtime.Stack(buf, true)])
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
}

// rawRequestWorkerNoDrain is rawRequestWorker, except the answer runs
// before the request body is read (answer drains it if it wants).
func rawRequestWorkerNoDrain(t *testing.T, answer func(c net.Conn, r *http.Request) bool) (*standin, net.Listener) {
	t.Helper()
	return rawRequests(t, false, answer)
}

// proxyGoroutines counts the goroutines in this package's code: relays,
// uploads, lingering closes, and the server's inside the handler.
func proxyGoroutines() int {
	return goroutinesIn("pinboard/proxy.(*", "proxy.startUpload", "rawio.(*Linger)")
}
