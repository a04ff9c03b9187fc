package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
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
