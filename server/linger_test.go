package server

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// refuseEarly is a worker that answers 403 without reading the request
// body, as the reference worker does for a bad attestation.
var refuseEarly = http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
	rw.Header().Set("Connection", "close")
	rw.WriteHeader(http.StatusForbidden)
	_, _ = rw.Write([]byte(`{"detail":"invalid attestation"}`))
})

// A client still sending its body when pinboard answers and closes the
// connection gets the answer and a clean end (FIN), not a reset: closed
// with unread input, a socket sends RST, the client's next write fails,
// and a reset may cut answer bytes still in flight — nginx's lingering
// close, for the same reason (R-DP-2, rawio.Linger).
func TestEarlyAnswerToUploadNotReset_RDP2(t *testing.T) {
	_, public := workerNode(t, Options{}, refuseEarly)
	const size = 16 << 20
	c, err := net.Dial("tcp", strings.TrimPrefix(public, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprintf(c, "POST /counters/alice/upload HTTP/1.1\r\nHost: pb\r\nContent-Length: %d\r\n\r\n", size)
	wrote := make(chan error, 1)
	go func() {
		chunk := bytes.Repeat([]byte("x"), 64<<10)
		for n := 0; n < size; n += len(chunk) {
			if _, err := c.Write(chunk); err != nil {
				wrote <- err
				return
			}
		}
		wrote <- nil
	}()
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("unexpected failure reading the answer; got %v", err)
	}
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusForbidden || string(body) != `{"detail":"invalid attestation"}` {
		t.Fatalf("unexpected answer; got %d %s; want the worker's 403", res.StatusCode, body)
	}
	if err := <-wrote; err != nil {
		t.Fatalf("unexpected upload error after the answer; got %v; want the rest of the body taken (lingering close)", err)
	}
}
