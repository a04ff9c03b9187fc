package server

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/proxy"
)

// A keep-alive connection idle longer than the stall timeout still gets
// the answers fasthttp writes itself (a header too large: 431), not a
// close: the write deadline a previous response left on the connection
// has passed by then, and those answers never pass through Handle, which
// renews it (R-DP-2).
func TestStaleWriteDeadlineAfterIdle_RDP2(t *testing.T) {
	stall := 300 * time.Millisecond
	_, public, _, _ := node(t, Options{Upstream: proxy.UpstreamOptions{StallTimeout: stall}})
	c, err := net.Dial("tcp", strings.TrimPrefix(public, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(c, "GET /livez HTTP/1.1\r\nHost: a\r\n\r\n")
	var res fasthttp.Response
	if err := res.Read(br); err != nil || res.StatusCode() != 200 {
		t.Fatalf("unexpected first answer; got %d, %v; want 200", res.StatusCode(), err)
	}
	// Idle past the deadline the first answer left (a read that waits).
	_ = c.SetReadDeadline(time.Now().Add(3 * stall))
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("unexpected bytes on an idle connection")
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(c, "GET /livez HTTP/1.1\r\nHost: a\r\nX-Big: "+strings.Repeat("x", 64<<10)+"\r\n\r\n")
	res.Reset()
	if err := res.Read(br); err != nil || res.StatusCode() != fasthttp.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("unexpected answer to a header too large after idling; got %d, %v; want %d", res.StatusCode(), err, fasthttp.StatusRequestHeaderFieldsTooLarge)
	}
}

// A chunked download that idles past the stall timeout before the worker
// ends it still gets its last chunk: the end of a stream is a write like
// any other, and the deadline the last data left has passed by then
// (R-DP-2).
func TestIdleStreamEndOutlivesWriteDeadline_RDP2(t *testing.T) {
	_, public := workerNode(t, Options{Upstream: proxy.UpstreamOptions{StallTimeout: 300 * time.Millisecond}},
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/octet-stream")
			_, _ = io.WriteString(w, "part")
			w.(http.Flusher).Flush()
			time.Sleep(time.Second) // idle past the stall timeout, then end
		}))
	res, err := http.Get(public + "/counters/alice/download")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil || string(b) != "part" {
		t.Fatalf("unexpected body of a stream that ended after idling; got %q, %v; want %q", b, err, "part")
	}
}
