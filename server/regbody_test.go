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

	"github.com/pinboard-go/pinboard/proxy"
)

// A registry request body that keeps moving over a slow link is read
// whole, however long it takes, as an upload to a worker is: its read
// deadline was the stall timeout from the end of the header, never
// renewed, and a body taking longer was cut and answered 400 "invalid
// json" (R-REG-7, R-DP-2).
func TestRegistryBodyMovingSlowly_RREG7(t *testing.T) {
	_, public := workerNode(t, Options{Upstream: proxy.UpstreamOptions{StallTimeout: time.Second}},
		http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	body := `{"clientId":"w"` + strings.Repeat(" ", 30000) + `}`
	c, err := net.Dial("tcp", strings.TrimPrefix(public, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(15 * time.Second))
	fmt.Fprintf(c, "POST /registry/drain HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer tok\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body))
	// 3 KB every 300 ms: 3 s in all, three times the stall timeout.
	for i := 0; i < len(body); i += 3000 {
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
		t.Fatalf("unexpected answer to a registry body sent over 3s (stall timeout 1s); got %d %s; want 200", res.StatusCode, b)
	}
}
