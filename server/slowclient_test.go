package server

import (
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/proxy"
)

// A client that sends a whole header with a small Content-Length and then
// goes silent is cut after the stall timeout: fasthttp reads the start of
// a body (and the proxy a small one whole) before anything else happens,
// and with no read timeout set (PINBOARD_READ_TIMEOUT_MS, 0 by default)
// that read waited a year — a slowloris past the header timeout, one
// goroutine and descriptor held per silent connection (R-DP-2).
func TestSilentSmallBodyCut_RDP2(t *testing.T) {
	_, public, _, _ := node(t, Options{Upstream: proxy.UpstreamOptions{StallTimeout: time.Second}})
	// Silent within fasthttp's 8 KiB pre-read, within the rest of a body
	// the proxy reads whole (64 KiB), and before an upload streams.
	for _, tc := range []struct{ cl, sent int }{{100, 10}, {32 << 10, 9000}, {1 << 20, 10}} {
		c, err := net.Dial("tcp", strings.TrimPrefix(public, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, "POST /counters/a/x HTTP/1.1\r\nHost: a\r\nContent-Length: "+strconv.Itoa(tc.cl)+"\r\n\r\n"+strings.Repeat("x", tc.sent)); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.Copy(io.Discard, c); err != nil {
			t.Fatalf("unexpected connection state 5s after a silent %d-byte body began (stall timeout 1s); got %v; want closed", tc.cl, err)
		}
	}
}
