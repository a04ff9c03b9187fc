package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Tests of HTTP/1.0 clients (ApacheBench, health checks, curl -0): their
// requests reach the worker as HTTP/1.1 over the pooled keep-alive
// connections, and their answers are framed as an HTTP/1.0 client reads
// them (docs/PROTOCOL.md §4, "Bodies, streams, WebSockets").

// client10 is a raw client connection to the rig.
type client10 struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dial10(t *testing.T, rg *rig) *client10 {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &client10{t: t, c: c, br: bufio.NewReader(c)}
}

// do sends req and reads its answer whole; method tells a HEAD apart.
func (c *client10) do(req, method string) (*http.Response, string) {
	c.t.Helper()
	if _, err := io.WriteString(c.c, req); err != nil {
		c.t.Fatalf("cannot send %q: %v", req, err)
	}
	_ = c.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	res, err := http.ReadResponse(c.br, &http.Request{Method: method})
	if err != nil {
		c.t.Fatalf("cannot read the answer to %q: %v", req, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		c.t.Fatalf("cannot read the body of the answer to %q: %v", req, err)
	}
	return res, string(b)
}

// closed reports whether pinboard closes the connection (within 5 s)
// without sending anything more.
func (c *client10) closed() bool {
	c.t.Helper()
	_ = c.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := c.br.Read(make([]byte, 1))
	return n == 0 && errors.Is(err, io.EOF)
}

// http10Routes are the stand-in worker's answers the tests ask for.
func http10Routes(w *standin) {
	w.route("/chunked", func(rw http.ResponseWriter, r *http.Request) {
		for _, s := range []string{"one;", "two;", "three"} {
			_, _ = io.WriteString(rw, s)
			rw.(http.Flusher).Flush()
		}
	})
	w.route("/big", func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Length", strconv.Itoa(100<<10))
		_, _ = rw.Write(bytes.Repeat([]byte("b"), 100<<10))
	})
	w.route("/blob", func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Length", "12345")
		if r.Method != "HEAD" {
			_, _ = rw.Write(make([]byte, 12345))
		}
	})
	w.route("/nocontent", func(rw http.ResponseWriter, r *http.Request) {
		rw.WriteHeader(http.StatusNoContent)
	})
	w.route("/notmodified", func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("ETag", `"v1"`)
		rw.WriteHeader(http.StatusNotModified)
	})
}

// checkFraming fails unless res is framed for an HTTP/1.0 client: never
// chunked (RFC 9112 §6.1), its Content-Length when it has one.
func checkFraming(t *testing.T, name string, res *http.Response, wantLen int64) {
	t.Helper()
	if len(res.TransferEncoding) > 0 {
		t.Fatalf("%s: unexpected Transfer-Encoding for an HTTP/1.0 client; got %v; want none", name, res.TransferEncoding)
	}
	if res.ContentLength != wantLen {
		t.Fatalf("%s: unexpected Content-Length; got %d; want %d", name, res.ContentLength, wantLen)
	}
	if res.Proto != "HTTP/1.1" {
		t.Fatalf("%s: unexpected status line version; got %q; want HTTP/1.1 (pinboard's own, as nginx answers)", name, res.Proto)
	}
}

// Several HTTP/1.0 requests, each on a client connection of its own closed
// after its answer (ApacheBench's way), reach the worker as HTTP/1.1 over
// one pooled connection: before, each went as HTTP/1.0, the worker closed
// the connection after answering and every request cost a connect to the
// worker (and a socket in TIME_WAIT) (R-DP-1, R-DP-3).
func TestHTTP10ReusesWorkerConnection_RDP1_RDP3(t *testing.T) {
	rg, _, cl := newCapRigWorker(t, nil)
	for i := 0; i < 5; i++ {
		c := dial10(t, rg)
		res, body := c.do("GET /counters/alice/x HTTP/1.0\r\nHost: pb\r\n\r\n", "GET")
		if res.StatusCode != 200 || decodeSeen(t, body).Method != "GET" {
			t.Fatalf("unexpected answer %d; got %d %q; want 200 and the worker's echo", i, res.StatusCode, body)
		}
		checkFraming(t, "GET", res, int64(len(body)))
		if !c.closed() {
			t.Fatalf("unexpected open client connection after answer %d; want it closed (HTTP/1.0 without keep-alive)", i)
		}
	}
	if n := cl.accepts.Load(); n != 1 {
		t.Fatalf("unexpected worker connections; got %d for 5 HTTP/1.0 requests; want 1", n)
	}
	wire := cl.String()
	if n := strings.Count(wire, "GET /counters/alice/x HTTP/1.1\r\n"); n != 5 || strings.Contains(wire, "HTTP/1.0") {
		t.Fatalf("unexpected request lines to the worker; got %d HTTP/1.1 ones in %q; want 5 and no HTTP/1.0", n, wire)
	}
	if strings.Contains(strings.ToLower(wire), "\r\nconnection:") {
		t.Fatalf("unexpected Connection header to the worker; got %q; want none (keep-alive is HTTP/1.1's default)", wire)
	}
}

// An HTTP/1.0 client gets every kind of answer framed as it reads them,
// and the worker connection is reused after each but HEAD (R-DP-1, R-DP-2): a
// sized body keeps its Content-Length, an unsized (chunked) one arrives
// delimited by the connection's close, HEAD, 204 and 304 carry none, and
// request bodies go up with their Content-Length.
func TestHTTP10ClientAnswers_RDP1_RDP2(t *testing.T) {
	rg, w, cl := newCapRigWorker(t, nil)
	http10Routes(w)
	hello := "hello"
	big := strings.Repeat("u", 100<<10)
	cases := []struct {
		name, req, method string
		status            int
		wantLen           int64 // -1: close-delimited; -2: the body's length
		check             func(body string) bool
	}{
		{"sized", "GET /counters/alice/x HTTP/1.0\r\nHost: pb\r\n\r\n", "GET", 200, -2,
			func(b string) bool { return decodeSeen(t, b).Method == "GET" }},
		{"no Host", "GET /counters/alice/x HTTP/1.0\r\n\r\n", "GET", 200, -2,
			func(b string) bool { return decodeSeen(t, b).URI == "/counters/alice/x" }},
		{"chunked", "GET /counters/alice/chunked HTTP/1.0\r\nHost: pb\r\n\r\n", "GET", 200, -1,
			func(b string) bool { return b == "one;two;three" }},
		{"HEAD", "HEAD /counters/alice/blob HTTP/1.0\r\nHost: pb\r\n\r\n", "HEAD", 200, 12345,
			func(b string) bool { return b == "" }},
		{"204", "GET /counters/alice/nocontent HTTP/1.0\r\nHost: pb\r\n\r\n", "GET", 204, 0,
			func(b string) bool { return b == "" }},
		{"304", "GET /counters/alice/notmodified HTTP/1.0\r\nHost: pb\r\n\r\n", "GET", 304, 0,
			func(b string) bool { return b == "" }},
		{"POST", "POST /counters/alice/x HTTP/1.0\r\nHost: pb\r\nContent-Length: 5\r\n\r\n" + hello, "POST", 200, -2,
			func(b string) bool { s := decodeSeen(t, b); return s.Method == "POST" && s.BodyLen == len(hello) }},
		// Trailer is hop-by-hop: the body must not go up chunked (with
		// trailers), as fasthttp writes an HTTP/1.1 request declaring any.
		{"POST with Trailer", "POST /counters/alice/x HTTP/1.0\r\nHost: pb\r\nTrailer: X-Sum\r\nContent-Length: 5\r\n\r\n" + hello, "POST", 200, -2,
			func(b string) bool {
				s := decodeSeen(t, b)
				return s.BodyLen == len(hello) && s.Header["Trailer"] == nil
			}},
		{"POST streamed", "POST /counters/alice/x HTTP/1.0\r\nHost: pb\r\nContent-Length: " + strconv.Itoa(len(big)) + "\r\n\r\n" + big, "POST", 200, -2,
			func(b string) bool { return decodeSeen(t, b).BodyLen == len(big) }},
		// RFC 9112 §6.3: a request with neither Content-Length nor
		// Transfer-Encoding has no body; fasthttp reads it so, and the
		// bytes after the header are never read (the connection closes).
		{"POST without length", "POST /counters/alice/x HTTP/1.0\r\nHost: pb\r\n\r\n" + hello, "POST", 200, -2,
			func(b string) bool { return decodeSeen(t, b).BodyLen == 0 }},
	}
	for _, tc := range cases {
		c := dial10(t, rg)
		res, body := c.do(tc.req, tc.method)
		if res.StatusCode != tc.status || !tc.check(body) {
			t.Fatalf("%s: unexpected answer; got %d %q; want %d", tc.name, res.StatusCode, body, tc.status)
		}
		want := tc.wantLen
		if want == -2 {
			want = int64(len(body))
		}
		checkFraming(t, tc.name, res, want)
		if !c.closed() {
			t.Fatalf("%s: unexpected open client connection; want it closed (HTTP/1.0 without keep-alive)", tc.name)
		}
	}
	// Two: a HEAD's connection closes after it (the route may still run,
	// TestHeadOfStreamNotPooled_RDP2_RDP3).
	if n := cl.accepts.Load(); n != 2 {
		t.Fatalf("unexpected worker connections; got %d for %d HTTP/1.0 requests (one HEAD); want 2", n, len(cases))
	}
	wire := cl.String()
	host := "\r\nHost: " + strings.TrimPrefix(w.srv.URL, "http://") + "\r\n"
	if !strings.Contains(wire, host) {
		t.Fatalf("unexpected request to the worker without Host; got %q; want the worker's host (%q)", wire, host)
	}
	if strings.Contains(strings.ToLower(wire), "transfer-encoding") {
		t.Fatalf("unexpected chunked request to the worker; got %q; want every HTTP/1.0 body framed by Content-Length", wire)
	}
	if !strings.Contains(wire, "POST /counters/alice/x HTTP/1.1\r\n") || !strings.Contains(wire, "\r\nContent-Length: 0\r\n") {
		t.Fatalf("unexpected request with no body to the worker; got %q; want HTTP/1.1 with Content-Length: 0", wire)
	}
	// Transfer-Encoding on HTTP/1.0 is faulty framing (RFC 9112 §6.1):
	// refused by pinboard's server, nothing reaches the worker.
	hits := w.hits.Load()
	if got := rg.raw("POST /counters/alice/x HTTP/1.0\r\nHost: pb\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 5*time.Second); !strings.HasPrefix(got, "HTTP/1.1 400 ") || w.hits.Load() != hits {
		t.Fatalf("unexpected answer to a chunked HTTP/1.0 request; got %q (worker hits %d, was %d); want 400 and no request to the worker", got, w.hits.Load(), hits)
	}
	// A large answer with a Content-Length streams to the client with it.
	c := dial10(t, rg)
	res, body := c.do("GET /counters/alice/big HTTP/1.0\r\nHost: pb\r\n\r\n", "GET")
	if res.StatusCode != 200 || body != strings.Repeat("b", 100<<10) {
		t.Fatalf("unexpected large answer; got %d and %d bytes; want 200 and %d", res.StatusCode, len(body), 100<<10)
	}
	checkFraming(t, "sized stream", res, 100<<10)
	if !c.closed() {
		t.Fatal("unexpected open client connection after a large answer; want it closed")
	}
}

// An HTTP/1.0 client that asks for keep-alive keeps its connection for
// every sized answer (each says Connection: keep-alive, RFC 9112 §9.3);
// an unsized one ends it, delimited by the close. The client's
// Connection: keep-alive is its own hop's and never reaches the worker,
// and one worker connection carries it all but the HEAD (R-DP-1, R-DP-2).
func TestHTTP10KeepAlive_RDP1_RDP2(t *testing.T) {
	rg, w, cl := newCapRigWorker(t, nil)
	http10Routes(w)
	c := dial10(t, rg)
	reqs := []struct{ req, method string }{
		{"GET /counters/alice/x HTTP/1.0\r\nHost: pb\r\nConnection: keep-alive\r\n\r\n", "GET"},
		{"POST /counters/alice/x HTTP/1.0\r\nHost: pb\r\nConnection: keep-alive\r\nContent-Length: 3\r\n\r\nabc", "POST"},
		{"HEAD /counters/alice/blob HTTP/1.0\r\nHost: pb\r\nConnection: keep-alive\r\n\r\n", "HEAD"},
		{"GET /counters/alice/nocontent HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", "GET"},
		{"GET /counters/alice/x HTTP/1.0\r\nHost: pb\r\nConnection: Keep-Alive\r\n\r\n", "GET"},
	}
	for i, r := range reqs {
		res, body := c.do(r.req, r.method)
		if res.StatusCode/100 != 2 {
			t.Fatalf("unexpected answer %d; got %d %q; want 2xx", i, res.StatusCode, body)
		}
		if res.Close || !strings.EqualFold(res.Header.Get("Connection"), "keep-alive") {
			t.Fatalf("unexpected answer %d to a keep-alive HTTP/1.0 client; got Connection %q; want keep-alive", i, res.Header.Get("Connection"))
		}
		if len(res.TransferEncoding) > 0 || res.ContentLength < 0 {
			t.Fatalf("unexpected framing of answer %d; got Transfer-Encoding %v, Content-Length %d; want a Content-Length", i, res.TransferEncoding, res.ContentLength)
		}
	}
	res, body := c.do("GET /counters/alice/chunked HTTP/1.0\r\nHost: pb\r\nConnection: keep-alive\r\n\r\n", "GET")
	if res.StatusCode != 200 || body != "one;two;three" {
		t.Fatalf("unexpected unsized answer; got %d %q", res.StatusCode, body)
	}
	checkFraming(t, "chunked", res, -1)
	if !res.Close || !c.closed() {
		t.Fatalf("unexpected open connection after an unsized answer; got Connection %q; want close", res.Header.Get("Connection"))
	}
	// Two: a HEAD's connection closes after it (the route may still run,
	// TestHeadOfStreamNotPooled_RDP2_RDP3).
	if n := cl.accepts.Load(); n != 2 {
		t.Fatalf("unexpected worker connections; got %d for %d HTTP/1.0 requests (one HEAD); want 2", n, len(reqs)+1)
	}
	wire := strings.ToLower(cl.String())
	if strings.Contains(wire, "\r\nconnection:") || strings.Contains(wire, "\r\nkeep-alive:") {
		t.Fatalf("unexpected hop-by-hop header to the worker; got %q; want the client's Connection: keep-alive dropped", wire)
	}
	if n := strings.Count(wire, " http/1.1\r\n"); n != len(reqs)+1 {
		t.Fatalf("unexpected request lines to the worker; got %d HTTP/1.1 ones; want %d", n, len(reqs)+1)
	}
}

// An HTTP/1.0 request without Host gets the Host of the worker it goes
// to, on every try: after an in-band refusal moved it to another worker,
// that worker got the refusing worker's host:port, which prepare had set
// on the first try (R-DP-1, R-PL-6).
func TestHostlessRequestRetriedGetsItsWorkersHost_RDP1_RPL6(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	a, b := newStandin(t, "a"), newStandin(t, "b")
	a.route("/host", refuseActivation)
	b.route("/host", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, r.Host) })
	rg.add(a, 1000, "/counters")
	rg.add(b, 1, "/counters")
	got := rg.raw("GET /counters/alice/host HTTP/1.0\r\n\r\n", 10*time.Second)
	want := strings.TrimPrefix(b.srv.URL, "http://")
	if !strings.HasPrefix(got, "HTTP/1.1 200 ") || !strings.HasSuffix(got, "\r\n\r\n"+want) {
		t.Fatalf("unexpected answer from the second worker; got %q; want 200 with its own host %s", got, want)
	}
}
