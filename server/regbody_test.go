package server

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/attest"
	"github.com/pinboard-go/pinboard/proxy"
)

// A registry request body that keeps moving over a slow link is read
// whole, however long it takes, as an upload to a worker is: its read
// deadline was the stall timeout from the end of the header, never
// renewed, and a body taking longer was cut and answered 400 "invalid
// json" (R-REG-7, R-DP-2). With a read timeout set (PINBOARD_READ_TIMEOUT_MS)
// the body has that long in all, and its answer is written under the stall
// timeout from the body's end: it was dropped, its write deadline counted
// from the request's start.
func TestRegistryBodyMovingSlowly_RREG7(t *testing.T) {
	for _, read := range []time.Duration{0, 10 * time.Second} {
		t.Run(fmt.Sprint("read timeout ", read), func(t *testing.T) {
			registryBodyMovingSlowly(t, Options{ReadTimeout: read, Upstream: proxy.UpstreamOptions{StallTimeout: time.Second}})
		})
	}
}

func registryBodyMovingSlowly(t *testing.T, o Options) {
	_, public := workerNode(t, o, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	body := `{"clientId":"w"` + strings.Repeat(" ", 30000) + `}`
	c, err := net.Dial("tcp", strings.TrimPrefix(public, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(15 * time.Second))
	// The body's first 8 KiB with the header: the server reads them
	// without renewing a deadline, so they must be in within the stall
	// timeout of the header (docs/OPERATIONS.md, PINBOARD_READ_TIMEOUT_MS),
	// which trickled in at 3 KB every 300 ms left 0.4 s of slack on a
	// loaded machine. Then 3 KB every 300 ms: 2.1 s more, twice the stall
	// timeout.
	const first = 9000
	fmt.Fprintf(c, "POST /registry/drain HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer tok\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body[:first])
	for i := first; i < len(body); i += 3000 {
		if _, err := io.WriteString(c, body[i:min(i+3000, len(body))]); err != nil {
			t.Fatalf("unexpected error sending a body that keeps moving; got %v; want nil", err)
		}
		time.Sleep(300 * time.Millisecond)
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("unexpected answer to a registry body sent over 2s (stall timeout 1s); got %d %s; want 200", res.StatusCode, b)
	}
}

// A worker that takes longer than the stall timeout to answer (within the
// response header timeout) has its answer relayed, and one that takes
// longer than the header timeout its 504: the write deadline the server
// keeps counts from when the answer is written, not from the request's
// arrival (R-DP-2, R-DP-4).
func TestSlowAnswerOutlivesStallTimeout_RDP2_RDP4(t *testing.T) {
	for _, tc := range []struct {
		body, want string
		status     int
		header     time.Duration
	}{
		{body: "ok", want: "ok", status: http.StatusOK},
		{body: strings.Repeat("x", 200<<10), want: strings.Repeat("x", 200<<10), status: http.StatusOK},
		{body: "late", want: `{"error":"owner timed out"}`, status: http.StatusGatewayTimeout, header: 1500 * time.Millisecond},
	} {
		body := tc.body
		_, public := workerNode(t, Options{Upstream: proxy.UpstreamOptions{StallTimeout: time.Second, ResponseHeaderTimeout: tc.header}},
			http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				time.Sleep(2 * time.Second)
				_, _ = io.WriteString(w, body)
			}))
		c, err := net.Dial("tcp", strings.TrimPrefix(public, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprint(c, "GET /counters/alice/v HTTP/1.1\r\nHost: a\r\n\r\n")
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			c.Close()
			t.Fatalf("unexpected answer from a worker answering after 2s (stall timeout 1s, header timeout %v); got %v; want %d", tc.header, err, tc.status)
		}
		b, _ := io.ReadAll(res.Body)
		c.Close()
		if res.StatusCode != tc.status || string(b) != tc.want {
			t.Fatalf("unexpected answer from a worker answering after 2s (stall timeout 1s, header timeout %v); got %d, %d bytes; want %d, %d bytes", tc.header, res.StatusCode, len(b), tc.status, len(tc.want))
		}
	}
}

// A registry body past 1 MiB is answered 413 {"error":"body too large"}
// (the heartbeat reference's 413 row, R-REG-7) with Connection: close,
// framed by Content-Length or chunked: the rest of the body is left
// unread, and the connection is closed after the answer. A chunked
// body's 413 went out without Connection: close, and when more of it was
// left than fasthttp discards (256 KiB) the server closed the connection
// all the same: a client's next request on it met the close (RFC 9112
// section 9.6).
func TestRegistryBodyTooLargeClosesConnection_RREG7(t *testing.T) {
	pp, err := attest.ParsePassport([]byte(`{"providers":[{"type":"staticToken","id":"p","keys":[{"name":"w","token":{"env":"T"},"scopes":["pinboard:worker"],"claims":{"pinboard":{"namespaces":["*"],"allowedBackendHosts":["*"]}}}]}],"namespaces":{"*":{"allow":"anonymous"}}}`),
		func(string) (string, bool) { return "tok", true })
	if err != nil {
		t.Fatal(err)
	}
	_, public := workerNode(t, Options{Passport: pp}, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	chunk := strings.Repeat(" ", 64<<10)
	for _, tc := range []struct {
		name string
		send func(w io.Writer)
	}{
		{"content-length", func(w io.Writer) {
			fmt.Fprintf(w, "Content-Length: %d\r\n\r\n", 2<<20)
			for range 32 {
				io.WriteString(w, chunk)
			}
		}},
		{"chunked, a little past the limit", func(w io.Writer) {
			io.WriteString(w, "Transfer-Encoding: chunked\r\n\r\n")
			for range 16 {
				fmt.Fprintf(w, "%x\r\n%s\r\n", len(chunk), chunk)
			}
			io.WriteString(w, "1\r\n \r\n0\r\n\r\n")
		}},
		{"chunked, far past the limit", func(w io.Writer) {
			io.WriteString(w, "Transfer-Encoding: chunked\r\n\r\n")
			for range 48 {
				fmt.Fprintf(w, "%x\r\n%s\r\n", len(chunk), chunk)
			}
			io.WriteString(w, "0\r\n\r\n")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", strings.TrimPrefix(public, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			go func() {
				w := bufio.NewWriter(c)
				io.WriteString(w, "POST /registry/heartbeat HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer tok\r\nContent-Type: application/json\r\n")
				tc.send(w)
				_ = w.Flush()
			}()
			res, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("unexpected error reading the answer to a body past 1 MiB; got %v; want 413", err)
			}
			b, _ := io.ReadAll(res.Body)
			if res.StatusCode != http.StatusRequestEntityTooLarge || string(b) != `{"error":"body too large"}` || !res.Close {
				t.Fatalf("unexpected answer to a body past 1 MiB; got %d %s (Connection: close %v); want 413 {\"error\":\"body too large\"} with Connection: close", res.StatusCode, b, res.Close)
			}
		})
	}
}
