package proxy

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A worker behind TLS (an https advertise URL) that sends bytes after the
// answer it framed — a whole smuggled answer, in TLS records of their own
// — must not have them read as the answer to the next request on its
// pooled connection, another client's (R-DP-1, R-DP-3). A plain socket's
// pooled connection is peeked at before its next request (rawio.NotQuiet)
// and a worker's extra bytes found there retire it; a TLS connection
// cannot be peeked at (a session ticket is data to the socket too), and a
// TLS read stops at the end of a record: the smuggled answer, sent in a
// record behind the framed one, waited in the TLS layer or the socket and
// answered the next request (the response matrix, server/respdesync_test.go,
// runs on plain sockets). Each part below is one write, one record.
func TestTLSWorkerExtraRecordNeverAnswersNextRequest_RDP1_RDP3(t *testing.T) {
	const smuggled = "HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nSMUGGLED"
	for _, tc := range []struct {
		name, method string
		parts        []string
		status       int
		body         string
	}{
		{"sized", "GET", []string{"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", smuggled}, 200, "hello"},
		{"header and body apart", "GET", []string{"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", "hello", smuggled}, 200, "hello"},
		{"chunked", "GET", []string{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", "5\r\nhello\r\n", "0\r\n\r\n", smuggled}, 200, "hello"},
		{"trailer", "GET", []string{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n", "X-T: 1\r\n\r\n", smuggled}, 200, "hello"},
		{"interim", "GET", []string{"HTTP/1.1 100 Continue\r\n\r\n", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", smuggled}, 200, "hello"},
		{"204 with a body", "GET", []string{"HTTP/1.1 204 No Content\r\n\r\n", smuggled}, 204, ""},
		{"304 with a body", "GET", []string{"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n", "hello"}, 304, ""},
		{"streamed", "GET", []string{"HTTP/1.1 200 OK\r\nContent-Length: 70000\r\n\r\n", strings.Repeat("x", 70000), smuggled}, 200, strings.Repeat("x", 70000)},
		{"event stream", "GET", []string{"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n", "9\r\ndata: x\n\n\r\n", "0\r\n\r\n", smuggled}, 200, "data: x\n\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rg := newRig(t, nil)
			rg.warm()
			s, _ := tlsStandin(t, rg)
			written := make(chan struct{})
			s.route("/b", func(rw http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(rw, "for B") })
			s.route("/a", func(rw http.ResponseWriter, r *http.Request) {
				conn, brw, err := rw.(http.Hijacker).Hijack()
				if err != nil {
					return
				}
				defer conn.Close()
				for _, p := range tc.parts {
					_, _ = brw.WriteString(p)
					_ = brw.Flush()
				}
				close(written)
				// Whatever comes next on this connection is answered as B's.
				for {
					req, err := http.ReadRequest(brw.Reader)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					_, _ = brw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfor B")
					if brw.Flush() != nil {
						return
					}
				}
			})
			rg.serveIDs(t, s, "alice")
			req, _ := http.NewRequest(tc.method, rg.url+"/counters/alice/a", nil)
			if res, body := rg.do(req); res.StatusCode != tc.status || body != tc.body {
				t.Fatalf("unexpected answer to A; got %d %.40q; want %d %.40q", res.StatusCode, body, tc.status, tc.body)
			}
			// The extra records are out (on loopback: in pinboard's socket
			// or read already) before B's request: no race with them.
			select {
			case <-written:
			case <-time.After(10 * time.Second):
				t.Fatal("the worker never sent its records after A's answer")
			}
			for range 3 {
				if res, body := rg.get("/counters/alice/b", nil); res.StatusCode != 200 || body != "for B" {
					t.Fatalf("unexpected answer to B after A's worker sent records more; got %d %q; want 200 \"for B\"", res.StatusCode, body)
				}
			}
		})
	}
}
