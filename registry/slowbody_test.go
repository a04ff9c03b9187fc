package registry

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// A registry body that trickles in — sent by a slow link, or by a client
// that sends its header and a few bytes and then one byte per stall
// timeout — is read off the registry pool: read on the pool, it held a
// slot for as long as it kept moving (up to 1 MiB at one byte a minute),
// and as many such requests as the pool has workers kept every other
// worker's heartbeat queued until their leases lapsed (R-LS-1, R-REG-7).
func TestSlowBodyReadOffPool_RLS1_RREG7(t *testing.T) {
	h := newHarness(t)
	r := h.registryWith(Options{ProbeTimeout: time.Second, Workers: 1, MinWorkers: 1, Queue: 64})
	h.r = r
	healthy := h.register(nil)

	addr, read := countingServer(t, r)

	// Each slow request sends its header and the start of its body, then
	// nothing more until the test ends.
	sent := 0
	for _, path := range []string{"/registry/release", "/registry/heartbeat"} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		start := "[" + strings.Repeat(" ", 64<<10)
		n, err := c.Write([]byte("POST " + path + " HTTP/1.1\r\nHost: pinboard\r\nAuthorization: Bearer " + workerToken +
			"\r\nContent-Type: application/json\r\nContent-Length: 200000\r\n\r\n" + start))
		if err != nil {
			t.Fatal(err)
		}
		sent += n
	}
	// The slow requests reached the registry: everything they sent was
	// read, the start of each body past the server's own buffer by the
	// registry. A fixed pause let the healthy heartbeat go first on a
	// loaded machine, and pass without anything to wait behind.
	for deadline := time.Now().Add(10 * time.Second); read.Load() < int64(sent); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("unexpected bytes of the slow requests read after 10s; got %d; want %d (each in the registry, its body read off the pool)", read.Load(), sent)
		}
	}
	h.wantBeatAnswered(r, healthy, 3*time.Second, "a body that trickles in")
}

// Through a server that streams request bodies, the 1 MiB limit
// (R-REG-7) is exact whichever way the body is framed: a heartbeat padded
// to exactly 1 MiB is read, one byte more is 413 — with Content-Length
// and chunked alike (a chunked body cut at the limit was read as the
// first MiB, padding and all) (R-REG-2 error rows).
func TestBodyLimitExactOverTheWire_RREG7_RREG2(t *testing.T) {
	h := newHarness(t)
	session := h.register(nil)
	addr := streamingServer(t, h.r)
	url := "http://" + addr + "/registry/heartbeat"
	for _, tc := range []struct {
		size    int
		chunked bool
		status  int
		want    string
	}{
		{MaxBody, false, 200, `{"expiresInMs":15000,"draining":false}`},
		{MaxBody, true, 200, `{"expiresInMs":15000,"draining":false}`},
		{MaxBody + 1, false, 413, `{"error":"body too large"}`},
		{MaxBody + 1, true, 413, `{"error":"body too large"}`},
	} {
		body := h.beatBody(session, nil)
		body += strings.Repeat(" ", tc.size-len(body))
		var rd io.Reader = strings.NewReader(body)
		if tc.chunked {
			rd = io.MultiReader(rd) // no length known: sent chunked
		}
		req, err := http.NewRequest("POST", url, rd)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+workerToken)
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("cannot post a %d-byte body (chunked %v): %v", tc.size, tc.chunked, err)
		}
		got, _ := io.ReadAll(res.Body)
		_ = res.Body.Close()
		if res.StatusCode != tc.status || string(got) != tc.want {
			t.Fatalf("unexpected reply to a %d-byte body (chunked %v); got %d %s; want %d %s", tc.size, tc.chunked, res.StatusCode, got, tc.status, tc.want)
		}
	}
}

// A body past the 1 MiB limit (R-REG-7) whose sender writes all of it
// before reading the answer — as most HTTP clients do — gets its 413: the
// node reads and discards what is left of a body up to another MiB past
// the limit before it answers and closes, so the close is a FIN behind
// the answer. Closed with the body unread, the socket sent a reset that
// overtook the 413, and the client saw "connection reset by peer" on its
// write instead of the answer (R-REG-2 error rows).
func TestOversizeBodyAnsweredNotReset_RREG7_RREG2(t *testing.T) {
	h := newHarness(t)
	session := h.register(nil)
	addr := streamingServer(t, h.r)
	for _, chunked := range []bool{false, true} {
		body := h.beatBody(session, nil)
		body += strings.Repeat(" ", MaxBody+1-len(body))
		c := dialBody(t, addr)
		head := heartbeatHead(chunked, len(body))
		rest := body
		if chunked {
			rest = fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(body), body)
		}
		// The head and a first piece past the limit's reach of fasthttp's
		// own discard, then a pause in which a node that answers at once
		// has answered and closed, then the rest.
		cut := 300 << 10
		if _, err := c.Write([]byte(head + rest[:cut])); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		if _, err := c.Write([]byte(rest[cut:])); err != nil {
			t.Fatalf("chunked %v: the node closed before the body was sent: %v", chunked, err)
		}
		got, err := io.ReadAll(c)
		_ = c.Close()
		if err != nil {
			t.Fatalf("chunked %v: the answer was lost: %v (read %q)", chunked, err, got)
		}
		if !strings.HasPrefix(string(got), "HTTP/1.1 413 ") || !strings.HasSuffix(string(got), `{"error":"body too large"}`) ||
			!strings.Contains(string(got), "Connection: close") {
			t.Fatalf("chunked %v: unexpected answer %q", chunked, got)
		}
	}
}

// A body more than overDrain past the limit is still cut: the node reads
// at most MaxBody + overDrain of it, and its own buffers, before it closes
// the connection, however much the client goes on sending; and one whose
// Content-Length is past that reach is not read at all (R-REG-7). The
// client may see the 413 or a reset: this test counts what the node read.
func TestOversizeBodyPastDrainCut_RREG7(t *testing.T) {
	h := newHarness(t)
	session := h.register(nil)
	const slack = 256 << 10 // the head, the server's read buffer
	for _, chunked := range []bool{false, true} {
		addr, read := countingServer(t, h.r)
		c := dialBody(t, addr)
		head := heartbeatHead(chunked, 64<<20)
		body := h.beatBody(session, nil) + strings.Repeat(" ", 64<<10)
		piece := []byte(body[:64<<10])
		if chunked {
			piece = fmt.Appendf(nil, "%x\r\n%s\r\n", len(piece), piece)
		}
		if _, err := c.Write([]byte(head)); err != nil {
			t.Fatal(err)
		}
		sent := make(chan int64, 1)
		go func() {
			var n int64
			for n < 32<<20 {
				m, err := c.Write(piece)
				n += int64(m)
				if err != nil {
					break
				}
			}
			sent <- n
		}()
		_, _ = io.ReadAll(c) // the 413 and the close, or a reset
		n := <-sent
		_ = c.Close()
		got := read.Load()
		if got > MaxBody+overDrain+slack {
			t.Fatalf("chunked %v: unexpected bytes read by the node; got %d (client sent %d); want at most %d", chunked, got, n, MaxBody+overDrain+slack)
		}
		if chunked && got < MaxBody+overDrain {
			t.Fatalf("chunked %v: unexpected bytes read by the node; got %d; want the limit and the drain, %d", chunked, got, MaxBody+overDrain)
		}
		if !chunked && got > slack {
			t.Fatalf("chunked %v: unexpected bytes read by the node; got %d; want at most %d: a Content-Length past the drain's reach is not read", chunked, got, slack)
		}
		if n >= 32<<20 {
			t.Fatalf("chunked %v: the client sent all of its %d bytes; want the node to cut the connection first", chunked, n)
		}
	}
}

// dialBody dials addr with a 10 s deadline for the whole exchange.
func dialBody(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

// heartbeatHead is the head of a heartbeat request whose body is chunked,
// or of length n.
func heartbeatHead(chunked bool, n int) string {
	head := "POST /registry/heartbeat HTTP/1.1\r\nHost: pinboard\r\nAuthorization: Bearer " + workerToken +
		"\r\nContent-Type: application/json\r\n"
	if chunked {
		return head + "Transfer-Encoding: chunked\r\n\r\n"
	}
	return head + "Content-Length: " + strconv.Itoa(n) + "\r\n\r\n"
}

// streamingServer serves r on a loopback listener through a fasthttp
// server that streams request bodies, as the node's does, and returns its
// address.
func streamingServer(t *testing.T, r *Registry) string {
	addr, _ := countingServer(t, r)
	return addr
}

// countingServer is streamingServer that also counts the bytes the server
// read from its connections.
func countingServer(t *testing.T, r *Registry) (string, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	read := new(atomic.Int64)
	srv := &fasthttp.Server{
		Handler:           func(ctx *fasthttp.RequestCtx) { r.ServeHTTP(ctx, ctx.Path()) },
		StreamRequestBody: true,
	}
	go func() { _ = srv.Serve(countingListener{ln, read}) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return ln.Addr().String(), read
}

type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countingConn{c, l.n}, nil
}

type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}
