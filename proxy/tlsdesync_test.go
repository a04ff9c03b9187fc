package proxy

import (
	"io"
	"net/http"
	"testing"
	"time"
)

// A worker behind TLS (an https advertise URL) that sends bytes after the
// answer it framed — a whole smuggled answer, in a TLS record of its own —
// must not have them read as the answer to the next request on its
// pooled connection, another client's (R-DP-1, R-DP-3). A plain socket's
// pooled connection is peeked at before its next request (rawio.NotQuiet)
// and a worker's extra bytes found there retire it; a TLS connection
// cannot be peeked at, and its read buffer stops at the end of a record:
// the smuggled answer, sent in the record behind the framed one, waited
// decrypted-to-be in the TLS layer and answered the next request.
func TestTLSWorkerExtraRecordNeverAnswersNextRequest_RDP1_RDP3(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	s, _ := tlsStandin(t, rg)
	written := make(chan struct{})
	forB := func(rw http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(rw, "for B") }
	s.route("/b", forB)
	s.route("/a", func(rw http.ResponseWriter, r *http.Request) {
		conn, brw, err := rw.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		// Two writes: two TLS records, the framed answer and one more.
		_, _ = brw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
		_ = brw.Flush()
		_, _ = brw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nSMUGGLED")
		_ = brw.Flush()
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
	if res, body := rg.get("/counters/alice/a", nil); res.StatusCode != 200 || body != "hello" {
		t.Fatalf("unexpected answer to A; got %d %q; want 200 \"hello\"", res.StatusCode, body)
	}
	// The extra record has been sent (on loopback: it is in pinboard's
	// socket) before B's request: no race with its arrival.
	select {
	case <-written:
	case <-time.After(10 * time.Second):
		t.Fatal("the worker never sent its record after A's answer")
	}
	for range 3 {
		if res, body := rg.get("/counters/alice/b", nil); res.StatusCode != 200 || body != "for B" {
			t.Fatalf("unexpected answer to B after A's worker sent a record more; got %d %q; want 200 \"for B\"", res.StatusCode, body)
		}
	}
}
