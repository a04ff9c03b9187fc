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
	c, err := net.Dial("tcp", strings.TrimPrefix(public, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	uploadAnsweredEarly(t, c, bufio.NewReader(c), "")
}

// uploadAnsweredEarly sends a 16 MiB upload on c, which refuseEarly
// answers without reading it, and fails unless the answer arrives and the
// whole body is still taken (a lingering close, not a reset). on names
// the connection in failures.
func uploadAnsweredEarly(t *testing.T, c net.Conn, br *bufio.Reader, on string) {
	t.Helper()
	const size = 16 << 20
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
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("unexpected failure reading the answer%s; got %v", on, err)
	}
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusForbidden || string(body) != `{"detail":"invalid attestation"}` {
		t.Fatalf("unexpected answer%s; got %d %s; want the worker's 403", on, res.StatusCode, body)
	}
	if err := <-wrote; err != nil {
		t.Fatalf("unexpected upload error after the answer%s; got %v; want the rest of the body taken (lingering close)", on, err)
	}
}

// A body relayed off the server and ended by the connection's close (an
// unsized download to an HTTP/1.0 client) ends with a FIN, not a reset,
// also when the client sent bytes after its request that nobody read: the
// close is the body's end, and a reset in its place failed the download
// (the client reads ECONNRESET, not the end of the stream) and may cut
// body bytes still in flight. The relay is done reading by then, so its
// connection lingers like any other (R-DP-2, rawio.Linger).
func TestRelayedDownloadEndNotReset_RDP2(t *testing.T) {
	release := make(chan struct{})
	_, public := workerNode(t, Options{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = io.WriteString(w, "part1")
		w.(http.Flusher).Flush()
		<-release
		_, _ = io.WriteString(w, "part2")
	}))
	c, err := net.Dial("tcp", strings.TrimPrefix(public, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(c, "GET /counters/alice/download HTTP/1.0\r\nHost: pb\r\nConnection: keep-alive\r\n\r\n")
	br := bufio.NewReader(c)
	for {
		l, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("cannot read the response header: %v", err)
		}
		if l == "\r\n" {
			break
		}
	}
	// Bytes the relay never reads: waiting unread when the body ends.
	_, _ = io.WriteString(c, "GET /counters/alice/next HTTP/1.0\r\n\r\n")
	time.Sleep(100 * time.Millisecond)
	close(release)
	body, err := io.ReadAll(br)
	if err != nil || string(body) != "part1part2" {
		t.Fatalf("unexpected end of a close-delimited body; got %q, %v; want %q and the end of the stream", body, err, "part1part2")
	}
}

// A connection handed back to the server after an event stream (resume)
// closes lingering like any other: the relay had turned its lingering off
// for good, and a client still sending a body the server answered
// without reading on that connection got a reset instead of the answer
// and a clean end (R-DP-2, rawio.Linger).
func TestResumedConnectionLingers_RDP2(t *testing.T) {
	_, public := workerNode(t, Options{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/events") {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: 1\n\n")
			return
		}
		refuseEarly(w, r)
	}))
	c, br := streamedOn(t, public)
	time.Sleep(100 * time.Millisecond) // the relay hands the connection back
	uploadAnsweredEarly(t, c, br, " on a resumed connection")
}

// A WebSocket the worker ends — its Close frame, then the end of its
// stream — ends toward the client with that Close frame and a FIN, not a
// reset, while the client is still sending: the client's bytes the worker
// never read wait unread at pinboard when the relay ends, and closed at
// once the kernel answers them with a reset, which fails the client's
// writes and may cut the Close frame still in flight. The relay closes
// the client connection lingering, as the server closes its own (R-DP-2,
// rawio.Linger).
func TestWebSocketEndedByWorkerNotReset_RDP2(t *testing.T) {
	closeNow := make(chan struct{})
	closeFrame := []byte{0x88, 0x02, 0x03, 0xe8} // Close 1000, unmasked
	_, public := workerNode(t, Options{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
			"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n")
		// Reads nothing: the client's frames back up to pinboard.
		<-closeNow
		_, _ = conn.Write(closeFrame)
		_ = conn.(*net.TCPConn).CloseWrite()
		time.Sleep(2 * time.Second)
	}))
	c, err := net.Dial("tcp", strings.TrimPrefix(public, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	_, _ = io.WriteString(c, "GET /counters/alice/ws HTTP/1.1\r\nHost: pb\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, nil)
	if err != nil || res.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("unexpected handshake answer; got %v, %v; want 101", res, err)
	}
	// The client streams masked binary frames, 8 MiB in all, that nobody
	// reads (the worker's receive buffer and pinboard's toward it fill).
	wrote := make(chan error, 1)
	go func() {
		payload := bytes.Repeat([]byte("x"), 60<<10)
		frame := append([]byte{0x82, 0x80 | 127, 0, 0, 0, 0, 0, 0, byte(len(payload) >> 8), byte(len(payload)), 0, 0, 0, 0}, payload...)
		for n := 0; n < 8<<20; n += len(frame) {
			if _, err := c.Write(frame); err != nil {
				wrote <- err
				return
			}
		}
		wrote <- nil
	}()
	time.Sleep(200 * time.Millisecond)
	close(closeNow)
	got, err := io.ReadAll(br)
	if err != nil || !bytes.Equal(got, closeFrame) {
		t.Fatalf("unexpected end of a WebSocket the worker closed; got %x, %v; want its Close frame %x and the end of the stream", got, err, closeFrame)
	}
	if err := <-wrote; err != nil {
		t.Fatalf("unexpected write error after the worker's Close; got %v; want the client's frames taken until it stops (lingering close)", err)
	}
}
