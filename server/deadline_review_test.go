package server

import (
	"bufio"
	"io"
	"net"
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
