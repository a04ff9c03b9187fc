package e2e

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// HTTP/1.1 as real clients speak it, through pinboard to the real worker
// (uvicorn): an upload that waits for 100 Continue, requests pipelined on
// one connection (sized, chunked with a trailer, bodiless), and a request
// target with escapes, a matrix parameter and a query forwarded byte for
// byte (R-DP-1, R-DP-2). The proxy's own tests check each against Go
// stand-ins; this checks them against the worker's HTTP stack.
func TestHTTP11ClientsThroughPinboard_RDP1_RDP2(t *testing.T) {
	f := sharedFleet(t)
	dial := func(t *testing.T) (net.Conn, *bufio.Reader) {
		t.Helper()
		c, err := net.DialTimeout("tcp", strings.TrimPrefix(f.Pinboard.URL, "http://"), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		return c, bufio.NewReader(c)
	}
	type digest struct {
		Size   int    `json:"size"`
		SHA256 string `json:"sha256"`
	}
	read := func(t *testing.T, br *bufio.Reader, method string, v any) {
		t.Helper()
		res, err := http.ReadResponse(br, &http.Request{Method: method})
		if err != nil {
			t.Fatalf("cannot read the answer: %v", err)
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		if err != nil || res.StatusCode != http.StatusOK {
			t.Fatalf("unexpected answer; got %d %s, %v; want 200", res.StatusCode, b, err)
		}
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("cannot decode %s: %v", b, err)
		}
	}
	body := make([]byte, 200<<10)
	for i := range body {
		body[i] = byte(i % 251)
	}
	sum := sha256.Sum256(body)
	want := digest{len(body), hex.EncodeToString(sum[:])}

	t.Run("expect 100-continue", func(t *testing.T) {
		c, br := dial(t)
		fmt.Fprintf(c, "POST /counters/h11-expect/sha256 HTTP/1.1\r\nHost: e2e\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n", len(body))
		// The client sends nothing more until it is told to go on.
		line, err := br.ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "HTTP/1.1 100 ") {
			t.Fatalf("unexpected interim answer; got %q, %v; want 100 Continue", line, err)
		}
		if blank, err := br.ReadString('\n'); err != nil || blank != "\r\n" {
			t.Fatalf("unexpected end of the 100; got %q, %v", blank, err)
		}
		_, _ = c.Write(body)
		var got digest
		read(t, br, "POST", &got)
		if got != want {
			t.Fatalf("unexpected upload at the worker; got %+v; want %+v", got, want)
		}
	})

	t.Run("pipelined", func(t *testing.T) {
		c, br := dial(t)
		var req strings.Builder
		req.WriteString("GET /counters/h11-pipe/whoami HTTP/1.1\r\nHost: e2e\r\n\r\n")
		fmt.Fprintf(&req, "POST /counters/h11-pipe/sha256 HTTP/1.1\r\nHost: e2e\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		fmt.Fprintf(&req, "POST /counters/h11-pipe/sha256 HTTP/1.1\r\nHost: e2e\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\nX-Sum: 1\r\n\r\n", len(body), body)
		req.WriteString("GET /counters/h11-pipe/whoami HTTP/1.1\r\nHost: e2e\r\n\r\n")
		go func() { _, _ = io.WriteString(c, req.String()) }()
		var who struct {
			ID string `json:"id"`
		}
		read(t, br, "GET", &who)
		for i := 0; i < 2; i++ {
			var got digest
			read(t, br, "POST", &got)
			if got != want {
				t.Fatalf("unexpected pipelined upload %d at the worker; got %+v; want %+v", i, got, want)
			}
		}
		read(t, br, "GET", &who)
		if who.ID != "h11-pipe" {
			t.Fatalf("unexpected last pipelined answer; got id %q; want h11-pipe", who.ID)
		}
	})

	t.Run("target byte for byte", func(t *testing.T) {
		c, br := dial(t)
		const path = "/counters/h11-target/target/a%2Fb/caf%C3%A9/%00/x;v=1/%25"
		const query = "q=%20&r=a%2Fb&s=../x&t=%2e%2e&u"
		fmt.Fprintf(c, "GET %s?%s HTTP/1.1\r\nHost: e2e\r\n\r\n", path, query)
		var got struct {
			ID      string `json:"id"`
			RawPath string `json:"rawPath"`
			Query   string `json:"query"`
		}
		read(t, br, "GET", &got)
		if got.ID != "h11-target" || got.RawPath != path || got.Query != query {
			t.Fatalf("unexpected target at the worker; got %+v; want id h11-target, %s ? %s", got, path, query)
		}
	})
}
