package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// eventWorker is a stand-in worker whose /events route sends one event
// per value received on next and ends the stream when next is closed; it
// reports on gone when a write failed (its client left).
func eventWorker(t *testing.T, rg *rig) (next chan string, gone chan struct{}) {
	t.Helper()
	w := newStandin(t, "w")
	quit := testEnded(t)
	next, gone = make(chan string), make(chan struct{}, 1)
	w.route("/events", func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "text/event-stream")
		rw.WriteHeader(200)
		rw.(http.Flusher).Flush()
		for {
			ev, ok := nextEvent(next, quit)
			if !ok {
				return
			}
			_, err := fmt.Fprintf(rw, "data: %s\n\n", ev)
			rw.(http.Flusher).Flush()
			if err != nil {
				gone <- struct{}{}
				return
			}
		}
	})
	rg.add(w, 1, "/t")
	return next, gone
}

// testEnded returns a channel closed when t ends, before the cleanups
// registered earlier run: a stand-in handler still streaming when a test
// failed returns then, and the stand-in's Close, which waits for it, does
// not hang the package until go test's timeout.
func testEnded(t *testing.T) <-chan struct{} {
	quit := make(chan struct{})
	t.Cleanup(func() { close(quit) })
	return quit
}

// nextEvent receives the next event a test sends; false when the test
// ended the stream (closed next) or ended itself.
func nextEvent(next <-chan string, quit <-chan struct{}) (string, bool) {
	select {
	case ev, ok := <-next:
		return ev, ok
	case <-quit:
		return "", false
	}
}

// streamConn is a raw client connection reading one chunked response at a
// time.
type streamConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialStream(t *testing.T, rg *rig) *streamConn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &streamConn{t: t, c: c, br: bufio.NewReader(c)}
}

func (s *streamConn) line() string {
	s.t.Helper()
	_ = s.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	l, err := s.br.ReadString('\n')
	if err != nil {
		s.t.Fatalf("cannot read a line: %v (got %q)", err, l)
	}
	return strings.TrimRight(l, "\r\n")
}

// header reads a response header and returns its status line and fields
// (lower-case names).
func (s *streamConn) header() (string, map[string]string) {
	s.t.Helper()
	status := s.line()
	h := map[string]string{}
	for l := s.line(); l != ""; l = s.line() {
		k, v, _ := strings.Cut(l, ":")
		h[strings.ToLower(k)] = strings.TrimSpace(v)
	}
	return status, h
}

// chunk reads one chunk and returns its data ("" for the last chunk,
// whose empty trailer section it reads too).
func (s *streamConn) chunk() string {
	s.t.Helper()
	n, err := strconv.ParseInt(s.line(), 16, 64)
	if err != nil {
		s.t.Fatalf("cannot parse a chunk size: %v", err)
	}
	buf := make([]byte, n+2)
	if _, err := io.ReadFull(s.br, buf); err != nil {
		s.t.Fatalf("cannot read a chunk of %d bytes: %v", n, err)
	}
	if string(buf[n:]) != "\r\n" {
		s.t.Fatalf("unexpected chunk end %q", buf[n:])
	}
	return string(buf[:n])
}

// eof reports whether the server closed the connection (within 10s).
func (s *streamConn) eof() bool {
	_ = s.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := s.br.ReadByte()
	return err == io.EOF
}

// sendUntilGone has the worker send ev until its write fails (within
// 20s): the relay closed its connection after what happened to its client.
func sendUntilGone(t *testing.T, next chan<- string, gone <-chan struct{}, ev, what string) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case next <- ev:
		case <-gone:
			return
		case <-deadline:
			t.Fatalf("unexpected worker stream still open 20s after %s", what)
		}
	}
}

func waitEventRelays(t *testing.T, p *Proxy, n int64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); p.RelayedEventStreams() != n; {
		if time.Now().After(deadline) {
			t.Fatalf("unexpected relayed event streams; got %d; want %d", p.RelayedEventStreams(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// An event stream is relayed off the server, each event as one chunk the
// moment the worker sends it, and when the worker ends it the client's
// connection serves the next request: keep-alive as on any response
// (R-DP-2).
func TestEventStreamRelayedKeepsConnection_RDP2(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	next, _ := eventWorker(t, rg)
	s := dialStream(t, rg)
	fmt.Fprint(s.c, "GET /t/x/events HTTP/1.1\r\nHost: pb\r\nAccept: text/event-stream\r\n\r\n")
	status, h := s.header()
	if status != "HTTP/1.1 200 OK" || h["content-type"] != "text/event-stream" || h["transfer-encoding"] != "chunked" || h["connection"] != "" {
		t.Fatalf("unexpected response header; got %q %v; want 200, text/event-stream, chunked, no Connection", status, h)
	}
	waitEventRelays(t, rg.p, 1)
	for i := 0; i < 3; i++ {
		ev := fmt.Sprint("event-", i)
		next <- ev
		if got := s.chunk(); got != "data: "+ev+"\n\n" {
			t.Fatalf("unexpected chunk; got %q; want event %d", got, i)
		}
	}
	endStreamThenReuse(t, rg, s, next)
	if rg.p.OpenStreams() != 0 {
		t.Fatalf("unexpected open streams after the stream ended; got %d; want 0", rg.p.OpenStreams())
	}
}

// Without a server to resume on, and when the client asked for it, a
// relayed stream says Connection: close and closes the connection at its
// end (R-DP-2).
func TestEventStreamConnectionClose_RDP2(t *testing.T) {
	for name, c := range map[string]struct {
		opts func(*Options)
		req  string
	}{
		"no resume":         {func(o *Options) { o.Resume = nil }, ""},
		"client asked":      {nil, "Connection: close\r\n"},
		"pipelined request": {nil, "\r\nGET /t/x/value HTTP/1.1\r\nHost: pb"},
	} {
		t.Run(name, func(t *testing.T) {
			rg := newRig(t, c.opts)
			rg.warm()
			next, _ := eventWorker(t, rg)
			s := dialStream(t, rg)
			fmt.Fprintf(s.c, "GET /t/x/events HTTP/1.1\r\nHost: pb\r\n%s\r\n", c.req)
			if _, h := s.header(); h["connection"] != "close" || h["transfer-encoding"] != "chunked" {
				t.Fatalf("unexpected response header; got %v; want Connection: close, chunked", h)
			}
			next <- "only"
			if got := s.chunk(); got != "data: only\n\n" {
				t.Fatalf("unexpected chunk; got %q", got)
			}
			close(next)
			if got := s.chunk(); got != "" {
				t.Fatalf("unexpected chunk; got %q; want the last chunk", got)
			}
			if !s.eof() {
				t.Fatal("unexpected open connection after a Connection: close stream ended")
			}
			waitEventRelays(t, rg.p, 0)
		})
	}
}

// A client that leaves mid-stream frees the worker: the next event's
// write fails and the relay closes the worker connection (R-DP-2).
func TestEventStreamClientGone_RDP2(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	next, gone := eventWorker(t, rg)
	s := dialStream(t, rg)
	fmt.Fprint(s.c, "GET /t/x/events HTTP/1.1\r\nHost: pb\r\n\r\n")
	s.header()
	next <- "one"
	s.chunk()
	_ = s.c.Close()
	sendUntilGone(t, next, gone, "more", "its client left")
	waitEventRelays(t, rg.p, 0)
	if rg.p.OpenStreams() != 0 {
		t.Fatalf("unexpected open streams after the client left; got %d; want 0", rg.p.OpenStreams())
	}
}

// A client that stops reading a relayed stream is cut after the stall
// timeout, and its worker connection freed (R-DP-2, R-DP-3).
func TestEventStreamStalledReader_RDP2_RDP3(t *testing.T) {
	rg := newRig(t, func(o *Options) { o.Upstream.StallTimeout = 300 * time.Millisecond })
	rg.warm()
	next, gone := eventWorker(t, rg)
	s := dialStream(t, rg)
	_ = s.c.(*net.TCPConn).SetReadBuffer(4096)
	fmt.Fprint(s.c, "GET /t/x/events HTTP/1.1\r\nHost: pb\r\n\r\n")
	sendUntilGone(t, next, gone, strings.Repeat("x", 64<<10), "its client stopped reading")
	waitEventRelays(t, rg.p, 0)
}

// Shutdown ends a relayed event stream cleanly between events (the last
// chunk, then the connection closes) and waits for it (R-DP-2).
func TestEventStreamShutdown_RDP2(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	next, _ := eventWorker(t, rg)
	defer close(next)
	s := dialStream(t, rg)
	fmt.Fprint(s.c, "GET /t/x/events HTTP/1.1\r\nHost: pb\r\n\r\n")
	s.header()
	next <- "one"
	s.chunk()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rg.p.CloseStreamsContext(ctx)
	if n := rg.p.RelayedEventStreams(); n != 0 {
		t.Fatalf("unexpected relays left when CloseStreams returned; got %d; want 0", n)
	}
	if got := s.chunk(); got != "" {
		t.Fatalf("unexpected chunk at shutdown; got %q; want the last chunk", got)
	}
	if !s.eof() {
		t.Fatal("unexpected open connection after shutdown ended the stream")
	}
}

func TestAppendChunk_RDP2(t *testing.T) {
	for _, n := range []int{1, 9, 15, 16, 255, 256, 4095, 4096} {
		buf := make([]byte, eventBufSize)
		for i := range n {
			buf[chunkRoom+i] = 'e'
		}
		want := fmt.Sprintf("%x\r\n%s\r\n", n, strings.Repeat("e", n))
		if got := string(appendChunk(buf, n)); got != want {
			t.Errorf("unexpected chunk of %d bytes; got %q; want %q", n, got[:min(len(got), 20)], want[:min(len(want), 20)])
		}
	}
}

// slowStream is a worker route that waits for answer before its header
// (asked closes once the request arrived), then sends its content type and
// first, and idles until pinboard closes the connection (closed gets it)
// or the test ends.
type slowStream struct {
	asked, answer chan struct{}
	closed        chan error
}

func newSlowStream(t *testing.T, w *standin, suffix, contentType, first string) *slowStream {
	t.Helper()
	ss := &slowStream{asked: make(chan struct{}), answer: make(chan struct{}), closed: make(chan error, 1)}
	stop := make(chan struct{}) // lets the worker's cleanup finish when a test fails
	t.Cleanup(func() { close(stop) })
	w.route(suffix, func(rw http.ResponseWriter, r *http.Request) {
		close(ss.asked)
		<-ss.answer
		if contentType != "" {
			rw.Header().Set("Content-Type", contentType)
		}
		rw.WriteHeader(200)
		_, _ = io.WriteString(rw, first)
		rw.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
			ss.closed <- r.Context().Err()
		case <-stop:
		}
	})
	return ss
}

// waitAsked waits until the request reached the worker.
func (ss *slowStream) waitAsked(t *testing.T) {
	t.Helper()
	select {
	case <-ss.asked:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream request never reached the worker")
	}
}

// waitClosed waits until pinboard closed the worker's connection.
func (ss *slowStream) waitClosed(t *testing.T, p *Proxy) {
	t.Helper()
	select {
	case <-ss.closed:
	case <-time.After(10 * time.Second):
		t.Fatalf("unexpected worker stream still open 10s after its client reset; got open streams %d, relays %d; want 0, 0",
			p.OpenStreams(), p.RelayedEventStreams())
	}
}

// An event stream whose hijack fasthttp never runs — the client reset its
// connection while a pipelined answer before the stream still waited in
// the write buffer, whose flush then fails — must still let go of its
// worker connection and of its relay count: nothing else ends it, and
// shutdown would wait for it (R-DP-2).
func TestEventStreamBehindFailedFlushFreesWorker_RDP2(t *testing.T) {
	defer func(d time.Duration) { hijackWait = d }(hijackWait)
	hijackWait = 500 * time.Millisecond
	rg, w := newRigWorker(t, nil)
	ss := newSlowStream(t, w, "/events", "text/event-stream", "")
	c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// One write: both requests reach pinboard's read buffer together, so
	// the first answer is held back for the second.
	_, _ = io.WriteString(c, "GET /counters/alice/x HTTP/1.1\r\nHost: x\r\n\r\n"+
		"GET /counters/alice/events HTTP/1.1\r\nHost: x\r\n\r\n")
	ss.waitAsked(t)
	_ = c.(*net.TCPConn).SetLinger(0)
	_ = c.Close() // on loopback the reset is at pinboard's socket on return
	close(ss.answer)
	ss.waitClosed(t, rg.p)
	waitEventRelays(t, rg.p, 0)
}

// The same for an unsized body to an HTTP/1.0 client, relayed until close
// on the hijacked connection: a hijack fasthttp never runs must not keep
// the worker's connection and the stream open for good (R-DP-2).
func TestUntilCloseBehindFailedFlushFreesWorker_RDP2(t *testing.T) {
	defer func(d time.Duration) { hijackWait = d }(hijackWait)
	hijackWait = 500 * time.Millisecond
	rg, w := newRigWorker(t, nil)
	ss := newSlowStream(t, w, "/stream", "", "first")
	c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, "GET /counters/alice/x HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n\r\n"+
		"GET /counters/alice/stream HTTP/1.0\r\nHost: x\r\n\r\n")
	ss.waitAsked(t)
	_ = c.(*net.TCPConn).SetLinger(0)
	_ = c.Close()
	close(ss.answer)
	ss.waitClosed(t, rg.p)
}

// An event stream whose header arrives after shutdown ended the streams
// (a worker slow to answer) is ended as well, not relayed on untracked
// once the server has gone: a WebSocket whose 101 comes late is told
// goodbye the same way (R-DP-2).
func TestEventStreamAfterShutdownEnded_RDP2(t *testing.T) {
	rg, w := newRigWorker(t, nil)
	ss := newSlowStream(t, w, "/events", "text/event-stream", "")
	s := dialStream(t, rg)
	fmt.Fprint(s.c, "GET /counters/alice/events HTTP/1.1\r\nHost: pb\r\n\r\n")
	ss.waitAsked(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rg.p.CloseStreamsContext(ctx)
	close(ss.answer)
	s.header()
	if got := s.chunk(); got != "" {
		t.Fatalf("unexpected chunk of a stream begun after shutdown; got %q; want the last chunk", got)
	}
	if !s.eof() {
		t.Fatal("unexpected open connection after shutdown ended the stream")
	}
	waitEventRelays(t, rg.p, 0)
}

// relayGoroutines counts the goroutines inside a relay off the server:
// a stream's (relayStream) or a WebSocket's (hijacks.run).
func relayGoroutines() int {
	return goroutinesIn("proxy.(*Proxy).relayStream", "proxy.(*hijacks).run")
}

// goroutinesIn counts the goroutines whose stacks name any of funcs.
func goroutinesIn(funcs ...string) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		for _, f := range funcs {
			if strings.Contains(g, f) {
				n++
				break
			}
		}
	}
	return n
}

// waitRelayGoroutinesGone waits up to 2 s for every relay goroutine to
// return. A relay's count ends (relayEnd) as the last thing it does, so
// its goroutine may still be on its way out of relayStream when
// CloseStreamsContext returns: checking at once failed now and then.
func waitRelayGoroutinesGone(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(time.Millisecond) {
		g := relayGoroutines()
		if g == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("unexpected relay goroutines 2s after CloseStreams returned; got %d; want 0", g)
		}
	}
}

// waitDownloads waits until p relays n bodies to HTTP/1.0 clients.
func waitDownloads(t *testing.T, p *Proxy, n int64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); p.RelayedDownloads() != n; {
		if time.Now().After(deadline) {
			t.Fatalf("unexpected relayed downloads; got %d; want %d", p.RelayedDownloads(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// An unsized body to an HTTP/1.0 client is relayed off the server like an
// event stream, and tracked like one: shutdown sees it (the server no
// longer counts its connection), ends it, and when CloseStreamsContext
// returns neither its relay nor its worker connection is left (R-DP-2).
// Its client connection ends in a reset: the download was cut, and a
// clean close would end a close-delimited body as if whole
// (TestHTTP10CutBodyEndsInReset_RDP2).
func TestUntilCloseRelayTrackedAtShutdown_RDP2(t *testing.T) {
	rg, w := newRigWorker(t, nil)
	ss := newSlowStream(t, w, "/stream", "", "first")
	close(ss.answer)
	s := dialStream(t, rg)
	fmt.Fprint(s.c, "GET /counters/alice/stream HTTP/1.0\r\nHost: pb\r\n\r\n")
	if status, h := s.header(); !strings.HasSuffix(status, " 200 OK") || h["connection"] != "close" || h["transfer-encoding"] != "" {
		t.Fatalf("unexpected header for an HTTP/1.0 client; got %q %v; want 200, Connection: close, no framing", status, h)
	}
	first := make([]byte, len("first"))
	if _, err := io.ReadFull(s.br, first); err != nil || string(first) != "first" {
		t.Fatalf("unexpected body start; got %q, %v; want %q", first, err, "first")
	}
	waitDownloads(t, rg.p, 1)
	if n := rg.p.RelayedEventStreams(); n != 0 {
		t.Fatalf("unexpected relayed event streams; got %d; want 0 (a download)", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rg.p.CloseStreamsContext(ctx)
	if d, o := rg.p.RelayedDownloads(), rg.p.OpenStreams(); d != 0 || o != 0 {
		t.Fatalf("unexpected relay left when CloseStreams returned; got %d downloads, %d streams; want 0, 0", d, o)
	}
	waitRelayGoroutinesGone(t)
	ss.waitClosed(t, rg.p)
	_ = s.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := s.br.ReadByte(); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("unexpected end of the client connection after shutdown cut the download; got %v; want a reset", err)
	}
}

// A relay whose client stopped reading is blocked in its write when
// shutdown ends the streams: at the deadline its client connection is
// closed, and the relay lets go of its worker connection before
// CloseStreamsContext returns, for an event stream as for a body to an
// HTTP/1.0 client (R-DP-2).
func TestShutdownCutsRelayBlockedOnClient_RDP2(t *testing.T) {
	for _, tc := range []struct{ name, proto, ctype string }{
		{"event stream", "HTTP/1.1", "text/event-stream"},
		{"HTTP/1.0 download", "HTTP/1.0", "application/octet-stream"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rg, w := newRigWorker(t, nil)
			gone := make(chan struct{})
			w.route("/big", func(rw http.ResponseWriter, r *http.Request) {
				defer close(gone)
				rw.Header().Set("Content-Type", tc.ctype)
				chunk := []byte("data: " + strings.Repeat("x", 32<<10) + "\n\n")
				for {
					if _, err := rw.Write(chunk); err != nil {
						return
					}
					rw.(http.Flusher).Flush()
				}
			})
			c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.(*net.TCPConn).SetReadBuffer(4096)
			fmt.Fprintf(c, "GET /counters/alice/big %s\r\nHost: pb\r\n\r\n", tc.proto)
			for deadline := time.Now().Add(10 * time.Second); rg.p.RelayedEventStreams()+rg.p.RelayedDownloads() != 1; {
				if time.Now().After(deadline) {
					t.Fatal("the stream was never relayed")
				}
				time.Sleep(5 * time.Millisecond)
			}
			time.Sleep(200 * time.Millisecond) // the sockets fill: the relay blocks in a write
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			rg.p.CloseStreamsContext(ctx)
			if r, o := rg.p.RelayedEventStreams()+rg.p.RelayedDownloads(), rg.p.OpenStreams(); r != 0 || o != 0 {
				t.Fatalf("unexpected relay left when CloseStreams returned; got %d relays, %d streams; want 0, 0", r, o)
			}
			waitRelayGoroutinesGone(t)
			select {
			case <-gone:
			case <-time.After(5 * time.Second):
				t.Fatal("unexpected worker connection still open 5s after shutdown cut its relay")
			}
		})
	}
}

// A relay whose hijack fasthttp has not run when shutdown cuts it (the
// client reset its connection while answers to requests it pipelined
// before the stream were being written) lets go of its worker connection
// at once, not hijackWait (30 s) later: nothing of it outlives
// CloseStreamsContext (R-DP-2).
func TestShutdownAbandonsSkippedHijack_RDP2(t *testing.T) {
	for _, tc := range []struct{ name, proto, ctype string }{
		{"event stream", "HTTP/1.1", "text/event-stream"},
		{"HTTP/1.0 download", "HTTP/1.0", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rg, w := newRigWorker(t, nil)
			ss := newSlowStream(t, w, "/stream", tc.ctype, "")
			c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_, _ = fmt.Fprintf(c, "GET /counters/alice/x %[1]s\r\nHost: x\r\nConnection: keep-alive\r\n\r\n"+
				"GET /counters/alice/stream %[1]s\r\nHost: x\r\n\r\n", tc.proto)
			ss.waitAsked(t)
			_ = c.(*net.TCPConn).SetLinger(0)
			_ = c.Close()
			close(ss.answer)
			for deadline := time.Now().Add(10 * time.Second); rg.p.RelayedEventStreams()+rg.p.RelayedDownloads() != 1; {
				if time.Now().After(deadline) {
					t.Fatal("the stream was never relayed")
				}
				time.Sleep(5 * time.Millisecond)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			rg.p.CloseStreamsContext(ctx)
			if r, o := rg.p.RelayedEventStreams()+rg.p.RelayedDownloads(), rg.p.OpenStreams(); r != 0 || o != 0 {
				t.Fatalf("unexpected relay left when CloseStreams returned; got %d relays, %d streams; want 0, 0", r, o)
			}
			ss.waitClosed(t, rg.p)
		})
	}
}

// An HTTP/1.0 client's upload that the worker answers while it is still
// going up, with an unsized body (an echo): the close-delimited relay runs
// inside the hijack handler, where the upload still reads the request, is
// tracked as a download meanwhile, and both directions complete (R-DP-2).
func TestHTTP10UploadEchoedUntilClose_RDP2(t *testing.T) {
	rg, w := newRigWorker(t, nil)
	w.route("/echo", echoFullDuplex)
	const size = 4 << 20 // over SmallBody: streamed, and answered before it is all up
	c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprintf(c, "POST /counters/alice/echo HTTP/1.0\r\nHost: pb\r\nContent-Length: %d\r\n\r\n", size)
	sent := make(chan error, 1)
	go func() {
		chunk := []byte(strings.Repeat("u", 64<<10))
		for n := 0; n < size; n += len(chunk) {
			if n == size/2 {
				// Half-way: the answer has begun, relayed as a download.
				for deadline := time.Now().Add(10 * time.Second); rg.p.RelayedDownloads() != 1; time.Sleep(5 * time.Millisecond) {
					if time.Now().After(deadline) {
						sent <- fmt.Errorf("unexpected relayed downloads mid-upload; got %d; want 1", rg.p.RelayedDownloads())
						return
					}
				}
			}
			if _, err := c.Write(chunk); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	br := bufio.NewReader(c)
	readHead(t, br)
	n, err := io.Copy(io.Discard, br) // the body ends with the connection
	if err != nil || n != size {
		t.Fatalf("unexpected echo; got %d bytes, %v; want %d then the close", n, err, size)
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	waitDownloads(t, rg.p, 0)
}

// TestEventStreamSplitWritesRelayed_RDP2: events the worker writes in
// pieces — a chunk's size line, its data and its end in separate writes,
// some a moment apart, others back to back — all reach the client, in
// order, and the stream ends with the last chunk. The relay waits with
// rawio.AwaitEdge and fills with one read that never waits (carryReader.fill): a
// wake for bytes an earlier read already took must wait again, and a
// piece that arrives between a read and the next wait must not be lost.
func TestEventStreamSplitWritesRelayed_RDP2(t *testing.T) {
	rg, w := newRigWorker(t, nil)
	const events = 200
	var want strings.Builder
	for i := range events {
		fmt.Fprintf(&want, "data: %d\n\n", i)
	}
	w.route("/burst", func(rw http.ResponseWriter, r *http.Request) {
		c, brw, err := rw.(http.Hijacker).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close()
		_ = brw.Flush()
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		for i := range events {
			ev := fmt.Sprintf("data: %d\n\n", i)
			chunk := fmt.Sprintf("%x\r\n%s\r\n", len(ev), ev)
			cut1, cut2 := 1+i%3, len(chunk)-1-i%2
			for j, piece := range []string{chunk[:cut1], chunk[cut1:cut2], chunk[cut2:]} {
				if _, err := io.WriteString(c, piece); err != nil {
					return
				}
				if (i+j)%4 == 0 {
					time.Sleep(200 * time.Microsecond)
				}
			}
		}
		_, _ = io.WriteString(c, "0\r\n\r\n")
	})
	s := dialStream(t, rg)
	fmt.Fprint(s.c, "GET /counters/alice/burst HTTP/1.1\r\nHost: pb\r\n\r\n")
	if status, _ := s.header(); status != "HTTP/1.1 200 OK" {
		t.Fatalf("unexpected status; got %q", status)
	}
	var got strings.Builder
	for got.Len() < want.Len() {
		c := s.chunk()
		if c == "" {
			break
		}
		got.WriteString(c)
	}
	if got.String() != want.String() {
		t.Fatalf("unexpected events relayed; got %d bytes; want %d, every event in order", got.Len(), want.Len())
	}
	if last := s.chunk(); last != "" {
		t.Fatalf("unexpected bytes after the events; got %q; want the last chunk", last)
	}
}

// An event stream the worker frames with Content-Length is flushed per
// event like an unsized one (R-DP-2; Go's ReverseProxy flushes every
// text/event-stream at once too): each event reaches the client as it
// comes, the body whole and in order, to HTTP/1.1 and HTTP/1.0 clients.
// Before, a sized stream was held until it ended: up to 64 KiB read whole
// before the header went out, longer ones written through the server's
// buffer, which fasthttp flushes per read only for unsized bodies.
func TestSizedEventStreamFlushedPerEvent_RDP2(t *testing.T) {
	const first = "data: one\n\n"
	for _, size := range []int{1 << 10, 200 << 10} {
		for _, proto := range []string{"HTTP/1.1", "HTTP/1.0"} {
			t.Run(proto+"/"+strconv.Itoa(size), func(t *testing.T) {
				rg, w := newRigWorker(t, nil)
				rg.serveIDs(t, w, "alice")
				more := make(chan struct{})
				w.route("/sized", func(rw http.ResponseWriter, r *http.Request) {
					c, _, err := rw.(http.Hijacker).Hijack()
					if err != nil {
						return
					}
					defer c.Close()
					_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: "+
						strconv.Itoa(size)+"\r\n\r\n"+first)
					select {
					case <-more:
					case <-time.After(5 * time.Second):
					}
					_, _ = io.WriteString(c, ":"+strings.Repeat("x", size-len(first)-2)+"\n")
					_, _ = io.Copy(io.Discard, c) // until pinboard lets go
				})
				s := dialStream(t, rg)
				// The worker sends the rest only once the first event is
				// here, or after 5 s.
				_ = s.c.SetDeadline(time.Now().Add(3 * time.Second))
				fmt.Fprint(s.c, "GET /counters/alice/sized "+proto+"\r\nHost: pb\r\n\r\n")
				res, err := http.ReadResponse(s.br, nil)
				if err != nil {
					t.Fatalf("unexpected error reading the header; got %v; want it while the stream goes on", err)
				}
				got := make([]byte, len(first))
				if _, err := io.ReadFull(res.Body, got); err != nil || string(got) != first {
					t.Fatalf("unexpected first event while the stream goes on; got %q, %v; want %q", got, err, first)
				}
				close(more)
				_ = s.c.SetReadDeadline(time.Now().Add(10 * time.Second))
				rest, err := io.ReadAll(res.Body)
				if err != nil || len(first)+len(rest) != size {
					t.Fatalf("unexpected body; got %d bytes, %v; want %d", len(first)+len(rest), err, size)
				}
			})
		}
	}
}

// An event stream the worker sizes 0 (an empty text/event-stream answer)
// is whole once its header is in: the relay ends it at once, for an
// HTTP/1.1 client (a last chunk) and an HTTP/1.0 one (the close), and the
// worker connection goes back to the pool. The relay used to wait for
// body bytes that were never to come, so the client hung and the worker
// connection stayed held until the client left (R-DP-2, R-DP-3).
func TestEmptySizedEventStreamEnds_RDP2_RDP3(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	w, ln := rawRequestWorker(t, func(c net.Conn, r *http.Request) bool {
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 0\r\n\r\n")
		return true
	})
	rg.serveIDs(t, w, "alice")
	u, err := rg.p.ups.get("http://" + ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	for _, proto := range []string{"HTTP/1.1", "HTTP/1.0"} {
		res, body := rawExchange(t, rg.url, "GET /counters/alice/events "+proto+"\r\nHost: x\r\nConnection: close\r\n\r\n")
		if res.StatusCode != 200 || body != "" {
			t.Fatalf("unexpected answer to an %s client; got %d %q; want 200 and no body", proto, res.StatusCode, body)
		}
		// Waited for after each exchange: the HTTP/1.1 client has its
		// last chunk before the relay lets go of the worker connection,
		// and a next request sent at once finds none idle and dials a
		// second one (the wait for exactly one then never ended).
		waitUntil(t, "the worker connection back in the pool", func() bool { return idleConns(u.pool) == 1 })
	}
}

// An unsized body relayed to an HTTP/1.0 client is delimited by the
// connection's close (relayUntilClose), so the close is all the client
// has to tell a whole body from a cut one (RFC 9112 §8: a close-delimited
// response is complete "unless an error was indicated by the underlying
// connection"). A body the worker cut short — its chunked framing ended
// without the last chunk, or its connection reset — ends in a reset, not in the clean close of a complete body: before, the client
// got the first bytes and a clean end, and took a partial download for a
// whole one; an HTTP/1.1 client of the same answer sees it cut, by the
// missing last chunk (R-DP-2). A body the worker ends ends with a clean
// close as before.
func TestHTTP10CutBodyEndsInReset_RDP2(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	w, _ := rawRequestWorker(t, func(c net.Conn, r *http.Request) bool {
		switch {
		case strings.HasSuffix(r.URL.Path, "/chunked-cut"):
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
		case strings.HasSuffix(r.URL.Path, "/until-close-reset"):
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\n\r\nhello")
			time.Sleep(50 * time.Millisecond)
			_ = c.(*net.TCPConn).SetLinger(0) // the worker's own close says it failed
			return false
		case strings.HasSuffix(r.URL.Path, "/chunked-whole"):
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
			return true
		}
		time.Sleep(50 * time.Millisecond) // the bytes reach the client first
		return false
	})
	rg.serveIDs(t, w, "alice")
	for _, tc := range []struct {
		path string
		cut  bool
	}{{"/counters/alice/chunked-cut", true}, {"/counters/alice/until-close-reset", true}, {"/counters/alice/chunked-whole", false}} {
		c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(c, "GET %s HTTP/1.0\r\nHost: pb\r\n\r\n", tc.path)
		got, err := io.ReadAll(c)
		c.Close()
		if !strings.HasPrefix(string(got), "HTTP/1.1 200 OK\r\n") || !strings.Contains(string(got), "\r\n\r\nhello") {
			t.Fatalf("unexpected answer to GET %s; got %q; want 200 and the body's first bytes", tc.path, got)
		}
		if reset := errors.Is(err, syscall.ECONNRESET); reset != tc.cut {
			t.Errorf("unexpected end of the close-delimited body of GET %s; got %q, %v; want a reset %v", tc.path, got, err, tc.cut)
		}
	}
}

// An event stream answering a request whose body went up whole (a POST,
// the shape of a chat completion) is relayed off the server like one
// answering a GET, and the connection serves the next request after it
// (R-DP-2): a small body arriving apart from its header, and a large one
// (past 64 KiB, streamed up) the worker read whole before answering —
// before, a streamed upload kept the stream on the server's path for its
// whole life, at about twice the memory of a relayed one.
func TestEventStreamAfterUploadRelayed_RDP2(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		apart      bool
	}{
		{"small", `{"q":"x"}`, true},
		{"large", strings.Repeat("b", 200<<10), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rg := newRig(t, nil)
			rg.warm()
			w := newStandin(t, "w")
			quit := testEnded(t)
			next := make(chan string)
			w.route("/ask", func(rw http.ResponseWriter, r *http.Request) {
				if b, err := io.ReadAll(r.Body); err != nil || string(b) != tc.body {
					rw.WriteHeader(400)
					return
				}
				rw.Header().Set("Content-Type", "text/event-stream")
				rw.WriteHeader(200)
				rw.(http.Flusher).Flush()
				for {
					ev, ok := nextEvent(next, quit)
					if !ok {
						return
					}
					fmt.Fprintf(rw, "data: %s\n\n", ev)
					rw.(http.Flusher).Flush()
				}
			})
			rg.add(w, 1, "/t")
			s := dialStream(t, rg)
			fmt.Fprintf(s.c, "POST /t/x/ask HTTP/1.1\r\nHost: pb\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(tc.body))
			if tc.apart {
				time.Sleep(50 * time.Millisecond) // the body apart from the header: the server streams it
			}
			fmt.Fprint(s.c, tc.body)
			if status, h := s.header(); status != "HTTP/1.1 200 OK" || h["transfer-encoding"] != "chunked" {
				t.Fatalf("unexpected response header; got %q %v; want 200, chunked", status, h)
			}
			waitEventRelays(t, rg.p, 1)
			next <- "one"
			if got := s.chunk(); got != "data: one\n\n" {
				t.Fatalf("unexpected chunk; got %q; want the event", got)
			}
			endStreamThenReuse(t, rg, s, next)
		})
	}
}

// endStreamThenReuse has the worker end the stream s relays (closing
// next): the client gets the last chunk, the relay ends, and the next
// request on the client's connection is answered.
func endStreamThenReuse(t *testing.T, rg *rig, s *streamConn, next chan<- string) {
	t.Helper()
	close(next)
	if got := s.chunk(); got != "" {
		t.Fatalf("unexpected chunk after the worker ended the stream; got %q; want the last chunk", got)
	}
	waitEventRelays(t, rg.p, 0)
	fmt.Fprint(s.c, "GET /t/x/value HTTP/1.1\r\nHost: pb\r\n\r\n")
	var res fasthttp.Response
	_ = s.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if err := res.Read(s.br); err != nil || res.StatusCode() != 200 {
		t.Fatalf("unexpected answer to the next request on the connection; got %d, %v; want 200", res.StatusCode(), err)
	}
}
