package server

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// An answer pinboard gives without reading the request's chunked body —
// a refusal of the data plane (unknown namespace, invalid id, a path
// outside it), of the registry (no credential, an unknown route, a method
// the route does not take) or of a health probe (a POST) — says
// Connection: close: the body is left unread, and fasthttp discards at
// most 256 KiB of it after the answer, then closes the connection. A
// chunked body has no length to decide that by before the answer is
// written (fasthttp does so for a Content-Length alone), so the answer
// went out as keep-alive and the connection was closed under the client's
// next request, pipelined or sent after it (RFC 9112 section 9.6; the
// registry's 413 had the same fault, TestRegistryBodyTooLargeClosesConnection_RREG7).
// Either the answer says close, or the request behind it is answered.
func TestAnswerLeavingChunkedBodyUnreadSaysClose_RDP4_RREG7(t *testing.T) {
	_, addr := desyncNode(t)
	chunk := strings.Repeat("x", 64<<10)
	for _, tc := range []struct {
		name, head string
		status     int
	}{
		{"unknown namespace", "POST /nope/a/x HTTP/1.1\r\nHost: pb\r\n", 404},
		{"invalid id", "POST /counters/a%00/x HTTP/1.1\r\nHost: pb\r\n", 400},
		{"dot segment", "POST /counters/a/%2e%2e/x HTTP/1.1\r\nHost: pb\r\n", 400},
		{"outside the data plane", "POST /x HTTP/1.1\r\nHost: pb\r\n", 404},
		{"registry without a credential", "POST /registry/heartbeat HTTP/1.1\r\nHost: pb\r\n", 401},
		{"registry route unknown", "POST /registry/nothing HTTP/1.1\r\nHost: pb\r\n", 404},
		{"registry method not taken", "PUT /registry/workers HTTP/1.1\r\nHost: pb\r\nAuthorization: Bearer tok\r\n", 405},
		{"probe", "POST /livez HTTP/1.1\r\nHost: pb\r\n", 405},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			go func() {
				// 512 KiB of chunks, then a request of its own: the write
				// fails once pinboard closes, which is not this test's to see.
				w := bufio.NewWriter(c)
				io.WriteString(w, tc.head+"Transfer-Encoding: chunked\r\n\r\n")
				for range 8 {
					fmt.Fprintf(w, "%x\r\n%s\r\n", len(chunk), chunk)
				}
				io.WriteString(w, "0\r\n\r\n"+desyncProbe)
				_ = w.Flush()
			}()
			br := bufio.NewReader(c)
			res, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("unexpected error reading the answer; got %v; want %d", err, tc.status)
			}
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode != tc.status {
				t.Fatalf("unexpected status; got %d; want %d", res.StatusCode, tc.status)
			}
			if res.Close {
				return // said so: the client sends nothing more on it
			}
			next, err := http.ReadResponse(br, nil)
			if err != nil {
				if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isReset(err) {
					t.Fatalf("unexpected close under the next request after an answer without Connection: close (%v)", err)
				}
				t.Fatalf("unexpected error reading the answer to the next request: %v", err)
			}
			next.Body.Close()
			if next.StatusCode != http.StatusOK {
				t.Fatalf("unexpected answer to the next request; got %d; want 200", next.StatusCode)
			}
		})
	}
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op)
}
