package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Tests that one hostile or broken peer cannot hold pinboard's resources
// (a worker connection, a goroutine, a stream) without bound.

// A worker that ends a chunked body with a trailer section that never
// ends — trailer lines, forever, as fast as pinboard reads them — is cut
// once the trailers pass the response header cap (BufferSize), as an
// endless response header is; so is a chunk-size line whose extension
// never ends, past the stream buffer (4 KiB). The client sees the body
// truncated (no last chunk) and the worker connection is closed, not
// pooled. Before,
// pinboard read and dropped trailer lines for as long as the worker sent
// them: nothing went to the client, so neither the stall timeout nor the
// client check ever fired, and a client that left held the worker
// connection (and the stream's goroutine) for ever (R-DP-2, R-DP-3).
func TestEndlessTrailersCut_RDP2_RDP3(t *testing.T) {
	const trailers, extension = "0\r\n", "5;"
	for _, tc := range []struct{ name, ctype, req, start, line string }{
		{"download", "application/octet-stream", "GET /counters/alice/x HTTP/1.1\r\nHost: x\r\n\r\n", trailers, "X-T: " + strings.Repeat("a", 64) + "\r\n"},
		{"event stream", "text/event-stream", "GET /counters/alice/x HTTP/1.1\r\nHost: x\r\n\r\n", trailers, "X-T: " + strings.Repeat("a", 64) + "\r\n"},
		{"http10 download", "application/octet-stream", "GET /counters/alice/x HTTP/1.0\r\nHost: x\r\n\r\n", trailers, "X-T: " + strings.Repeat("a", 64) + "\r\n"},
		{"download extension", "application/octet-stream", "GET /counters/alice/x HTTP/1.1\r\nHost: x\r\n\r\n", extension, strings.Repeat("a", 64)},
		{"event stream extension", "text/event-stream", "GET /counters/alice/x HTTP/1.1\r\nHost: x\r\n\r\n", extension, strings.Repeat("a", 64)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rg := newRig(t, func(o *Options) { o.Upstream.BufferSize = 4 << 10 })
			rg.warm()
			cut := make(chan struct{})
			w, _ := rawRequestWorker(t, func(c net.Conn, r *http.Request) bool {
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: "+tc.ctype+"\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"+tc.start)
				_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
				for {
					if _, err := io.WriteString(c, tc.line); err != nil {
						close(cut)
						return false
					}
				}
			})
			rg.serveIDs(t, w, "alice")
			c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_, _ = io.WriteString(c, tc.req)
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			got, _ := io.ReadAll(bufio.NewReader(c))
			if !strings.Contains(string(got), "hello") {
				t.Fatalf("unexpected answer; got %q; want the body's start", got)
			}
			if strings.Contains(string(got), "0\r\n\r\n") {
				t.Fatalf("unexpected clean end of a body whose trailers never ended; got %q", got)
			}
			select {
			case <-cut:
			case <-time.After(5 * time.Second):
				t.Fatalf("unexpected worker connection still read 5s into endless trailers; got %d open streams; want 0", rg.p.OpenStreams())
			}
		})
	}
}

// A worker that stops reading its WebSocket while the client floods it
// is cut after the stall timeout, as a client that stops reading is
// (TestWebSocketStalledReaderCut_RDP2_RDP3): both connections close and
// the relay ends, holding no buffer beyond its one copy buffer meanwhile
// (R-DP-2, R-DP-3).
func TestWebSocketStalledWorkerCut_RDP2_RDP3(t *testing.T) {
	rg, w := newRigWorker(t, func(o *Options) { o.Upstream.StallTimeout = 300 * time.Millisecond })
	gone := make(chan struct{})
	w.route("/ws", func(rw http.ResponseWriter, r *http.Request) {
		conn, _, ok := accept101(rw)
		if !ok {
			return
		}
		defer conn.Close()
		// Reads nothing until pinboard gives up on it: then the read
		// finds the close (after what the kernel buffered).
		time.Sleep(2 * time.Second)
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, _ = io.Copy(io.Discard, conn)
		close(gone)
	})
	c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, upgradeRequest("/counters/alice/ws"))
	br := bufio.NewReader(c)
	if line, _ := br.ReadString('\n'); !strings.HasPrefix(line, "HTTP/1.1 101") {
		t.Fatalf("unexpected answer; got %q; want 101", line)
	}
	// Masked binary frames of 64 KiB (client to server) until the relay
	// closes the connection.
	frame := append([]byte{0x82, 0xff, 0, 0, 0, 0, 0, 1, 0, 0, 1, 2, 3, 4}, make([]byte, 64<<10)...)
	_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	for {
		if _, err := c.Write(frame); err != nil {
			break
		}
	}
	if d := time.Since(start); d > 8*time.Second {
		t.Fatalf("unexpected client still writing %v after its worker stopped reading", d)
	}
	select {
	case <-gone:
	case <-time.After(10 * time.Second):
		t.Fatal("unexpected worker connection still open 10s after the relay stalled")
	}
	for deadline := time.Now().Add(5 * time.Second); rg.p.OpenWebSockets() != 0; {
		if time.Now().After(deadline) {
			t.Fatalf("unexpected open WebSockets; got %d; want 0", rg.p.OpenWebSockets())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A client that sends a byte more after its request (the start of a
// pipelined request, or junk) and then leaves is noticed as gone like one
// that sent nothing more (TestClientGoneFromIdleStreamFreesWorker_RDP2_RDP3,
// TestClientGoneBeforeAnswerFreesWorker_RDP3): the check on the client
// looks at the socket's state, not only at the first byte waiting. Before,
// the byte waiting unread read as "still there" at every check: an idle
// event stream held its worker connection until the worker's next events
// (hours, on a quiet stream), a long poll until the header timeout (R-DP-2,
// R-DP-3).
func TestClientGoneWithBytesUnreadFreesWorker_RDP2_RDP3(t *testing.T) {
	defer func(d time.Duration) { clientCheckEvery = d }(clientCheckEvery)
	clientCheckEvery = 100 * time.Millisecond
	leaves := map[string]func(c *net.TCPConn){
		"reset": func(c *net.TCPConn) { c.SetLinger(0); c.Close() },
		"close": func(c *net.TCPConn) { c.Close() },
	}
	for name, leave := range leaves {
		t.Run("event stream "+name, func(t *testing.T) {
			rg, w, _ := newCapRigWorker(t, nil)
			gone, stop := make(chan struct{}), make(chan struct{})
			t.Cleanup(func() { close(stop) })
			w.route("/events", idleStreamUntilGone(gone, stop))
			c := openFirstEvent(t, rg.url)
			defer c.Close()
			_, _ = io.WriteString(c, "G")
			time.Sleep(50 * time.Millisecond) // the byte is in before the close
			leave(c.(*net.TCPConn))
			select {
			case <-gone:
			case <-time.After(5 * time.Second):
				t.Fatalf("unexpected worker connection still open 5s after the client left; got %d open streams; want 0", rg.p.OpenStreams())
			}
		})
		t.Run("long poll "+name, func(t *testing.T) {
			rg, w, _ := newCapRigWorker(t, nil)
			gone, stop := make(chan struct{}), make(chan struct{})
			t.Cleanup(func() { close(stop) })
			w.route("/poll", func(rw http.ResponseWriter, r *http.Request) {
				select {
				case <-r.Context().Done():
					close(gone)
				case <-stop:
				}
			})
			c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_, _ = io.WriteString(c, "GET /counters/alice/poll HTTP/1.1\r\nHost: a\r\n\r\n")
			time.Sleep(200 * time.Millisecond) // the request is with the worker
			_, _ = io.WriteString(c, "G")
			time.Sleep(50 * time.Millisecond)
			leave(c.(*net.TCPConn))
			select {
			case <-gone:
			case <-time.After(5 * time.Second):
				t.Fatal("unexpected worker connection still open 5s after the client left")
			}
		})
	}
}

// A worker that stops reading its WebSocket while the client sends small
// messages is cut after the stall timeout (R-DP-2, R-DP-3), like one that
// stops under a flood (TestWebSocketStalledWorkerCut_RDP2_RDP3). Small
// messages fit in pinboard's socket send buffer long after the worker's
// receive window shut, so no write of the relay's ever blocked for its
// write deadline to see: the relay stayed open until that buffer filled
// (megabytes: hours of small messages) — or, toward a worker host gone
// without a FIN, until the kernel gave up retransmitting (some 15
// minutes).
// Worker connections now carry TCP_USER_TIMEOUT at the stall timeout.
func TestWebSocketWorkerNotReadingSmallMessagesCut_RDP2_RDP3(t *testing.T) {
	rg := newRig(t, func(o *Options) { o.Upstream.StallTimeout = 500 * time.Millisecond })
	rg.warm()
	// Accepted connections inherit the listener's small buffers: the
	// worker's receive window shuts after a few KiB.
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	defer close(done)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		// The upgrade request, then the 101, then nothing is read.
		if _, err := http.ReadRequest(bufio.NewReaderSize(c, 16)); err != nil {
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		<-done
	}()
	rg.serveIDs(t, rawWorker("raw", ln), "alice")
	c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, upgradeRequest("/counters/alice/ws"))
	if line, _ := bufio.NewReader(c).ReadString('\n'); !strings.HasPrefix(line, "HTTP/1.1 101") {
		t.Fatalf("unexpected answer; got %q; want 101", line)
	}
	// Masked text frames of 20 bytes, 2 kB/s: the worker's window shuts
	// within seconds, pinboard's send buffer stays far from full.
	frame := append([]byte{0x81, 0x80 | 20, 1, 2, 3, 4}, make([]byte, 20)...)
	start := time.Now()
	for rg.p.OpenWebSockets() != 0 {
		if d := time.Since(start); d > 10*time.Second {
			t.Fatalf("unexpected WebSocket still relayed %v after its worker stopped reading (stall timeout 500ms); got %d open; want 0", d, rg.p.OpenWebSockets())
		}
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		if _, err := c.Write(frame); err != nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	waitUntil(t, "the relay to end", func() bool { return rg.p.OpenWebSockets() == 0 })
}
