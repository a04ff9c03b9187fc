package server

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/proxy"
)

// Mixed traffic, a third of it abusive, leaves nothing behind: every
// stream, WebSocket, upload and download ends (complete, cut by the client
// mid-way, or reset), the proxy's gauges come back to zero, no goroutine
// of the proxy outlives its connection, and once the pooled worker
// connections idle out the process holds no more descriptors than before
// the traffic. Each kind that should succeed is checked to succeed.
// Bad input loses nothing: what a client breaks is its own connection's
// (R-DP-1, R-DP-2, R-DP-3).
//
// The worker is a net/http stand-in on 127.0.0.1; the operations are
// bounded in number, not time, and every connection has a deadline.
func TestMixedAbuseLeavesNothingBehind_RDP1_RDP2_RDP3(t *testing.T) {
	if _, err := os.ReadDir("/proc/self/fd"); err != nil {
		t.Skip("needs /proc/self/fd to count descriptors")
	}
	// No collection during the test: a leaked connection that became
	// unreachable would be closed by its finalizer and hide the leak.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	pb, addr := abuseNode(t)
	fdsBefore := openFDs(t)

	const clients, each = 12, 30
	var mu sync.Mutex
	var failures []string
	var ran [abuseKinds]atomic.Int64
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				kind := (c*each + i) % abuseKinds
				ran[kind].Add(1)
				if err := abuse(addr, kind, c*each+i); err != nil {
					mu.Lock()
					failures = append(failures, fmt.Sprintf("kind %d: %v", kind, err))
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	for _, f := range failures[:min(len(failures), 10)] {
		t.Errorf("unexpected failure of a well-formed exchange: %s", f)
	}
	if len(failures) > 10 {
		t.Errorf("... %d failures in all", len(failures))
	}

	p := pb.Proxy()
	gauges := func() string {
		return fmt.Sprintf("open streams %d, websockets %d, relayed event streams %d, relayed downloads %d",
			p.OpenStreams(), p.OpenWebSockets(), p.RelayedEventStreams(), p.RelayedDownloads())
	}
	var left string
	deadline := time.Now().Add(15 * time.Second)
	for {
		left = ""
		if p.OpenStreams() != 0 || p.OpenWebSockets() != 0 || p.RelayedEventStreams() != 0 || p.RelayedDownloads() != 0 {
			left = gauges()
		} else if g := proxyGoroutines(); g != "" {
			left = "proxy goroutines still running:\n" + g
		} else if n := openFDs(t); n > fdsBefore {
			left = fmt.Sprintf("%d descriptors open; %d before the traffic", n, fdsBefore)
		}
		if left == "" || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if left != "" {
		counts := make([]int64, abuseKinds)
		for k := range counts {
			counts[k] = ran[k].Load()
		}
		t.Fatalf("unexpected leftovers 15s after the traffic (operations per kind %v): %s", counts, left)
	}
}

// abuseKinds is the number of kinds abuse knows.
const abuseKinds = 12

// abuse runs one client exchange of the given kind against addr; n varies
// the id and the sizes. Kinds that a client breaks on purpose return nil
// whatever happens; the others return what went wrong.
func abuse(addr string, kind, n int) error {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	id := "id" + strconv.Itoa(n%40)
	reset := func() { _ = c.(*net.TCPConn).SetLinger(0) }
	switch kind {
	case 0: // keep-alive requests on one connection
		for i := range 4 {
			fmt.Fprintf(c, "GET /counters/%s%d/json HTTP/1.1\r\nHost: pb\r\n\r\n", id, i)
			if err := expect(br, 200, `{"ok":true}`); err != nil {
				return err
			}
		}
	case 1: // an event stream to its end, then the connection's next request
		fmt.Fprintf(c, "GET /counters/%s/sse HTTP/1.1\r\nHost: pb\r\n\r\n", id)
		if err := expect(br, 200, "data: 0\n\ndata: 1\n\ndata: 2\n\n"); err != nil {
			return err
		}
		fmt.Fprintf(c, "GET /counters/%s/json HTTP/1.1\r\nHost: pb\r\n\r\n", id)
		return expect(br, 200, `{"ok":true}`)
	case 2: // an event stream left after its first event, reset half the time
		fmt.Fprintf(c, "GET /counters/%s/sse HTTP/1.1\r\nHost: pb\r\n\r\n", id)
		_, _ = br.ReadString('\n')
		if n%2 == 0 {
			reset()
		}
	case 3: // a WebSocket echo, then a close or a reset
		fmt.Fprintf(c, "GET /counters/%s/ws HTTP/1.1\r\nHost: pb\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
			"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", id)
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			return fmt.Errorf("cannot read the handshake's answer: %w", err)
		}
		if res.StatusCode != http.StatusSwitchingProtocols {
			return fmt.Errorf("unexpected handshake answer; got %d; want 101", res.StatusCode)
		}
		msg := bytes.Repeat([]byte{byte(n)}, 32)
		for range 3 {
			_, _ = c.Write(msg)
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(br, got); err != nil || !bytes.Equal(got, msg) {
				return fmt.Errorf("unexpected echo; got %q, %v", got, err)
			}
		}
		if n%2 == 0 {
			reset()
		}
	case 4: // a WebSocket handshake left before its answer
		fmt.Fprintf(c, "GET /counters/%s/ws HTTP/1.1\r\nHost: pb\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
			"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", id)
		reset()
	case 5: // a streamed upload, whole
		size := 128<<10 + n
		fmt.Fprintf(c, "POST /counters/%s/upload HTTP/1.1\r\nHost: pb\r\nContent-Length: %d\r\n\r\n", id, size)
		if _, err := c.Write(abuseBytes[:size]); err != nil {
			return err
		}
		return expect(br, 200, strconv.Itoa(size))
	case 6: // a streamed upload cut half-way, reset half the time
		fmt.Fprintf(c, "POST /counters/%s/upload HTTP/1.1\r\nHost: pb\r\nContent-Length: %d\r\n\r\n", id, 1<<20)
		_, _ = c.Write(abuseBytes[:256<<10])
		if n%2 == 0 {
			reset()
		}
	case 7: // a chunked upload whole, then one cut mid-chunk
		fmt.Fprintf(c, "POST /counters/%s/upload HTTP/1.1\r\nHost: pb\r\nTransfer-Encoding: chunked\r\n\r\n"+
			"4\r\nabcd\r\n3\r\nefg\r\n0\r\n\r\n", id)
		if err := expect(br, 200, "7"); err != nil {
			return err
		}
		fmt.Fprintf(c, "POST /counters/%s/upload HTTP/1.1\r\nHost: pb\r\nTransfer-Encoding: chunked\r\n\r\n"+
			"10000\r\n%s", id, strings.Repeat("v", 30000))
	case 8: // a download, whole
		size := 1<<20 + n
		fmt.Fprintf(c, "GET /counters/%s/download?size=%d HTTP/1.1\r\nHost: pb\r\n\r\n", id, size)
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			return fmt.Errorf("cannot read the download's header: %w", err)
		}
		got, err := io.Copy(io.Discard, res.Body)
		if res.StatusCode != 200 || err != nil || got != int64(size) {
			return fmt.Errorf("unexpected download; got %d, %d bytes, %v; want 200, %d bytes", res.StatusCode, got, err, size)
		}
	case 9: // a download left after its first bytes, reset half the time
		fmt.Fprintf(c, "GET /counters/%s/download?size=%d HTTP/1.1\r\nHost: pb\r\n\r\n", id, 8<<20)
		_, _ = br.Peek(4096)
		if n%2 == 0 {
			reset()
		}
	case 10: // pipelined requests in one write
		var b strings.Builder
		for i := range 5 {
			fmt.Fprintf(&b, "GET /counters/%s%d/json HTTP/1.1\r\nHost: pb\r\n\r\n", id, i)
		}
		_, _ = io.WriteString(c, b.String())
		for range 5 {
			if err := expect(br, 200, `{"ok":true}`); err != nil {
				return err
			}
		}
	case 11: // malformed: smuggling framing, a cut request line, an oversized header
		switch n % 3 {
		case 0:
			fmt.Fprintf(c, "POST /counters/%s/upload HTTP/1.1\r\nHost: pb\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"+
				"GET /counters/%s/json HTTP/1.1\r\nHost: pb\r\n\r\n", id, id)
		case 1:
			_, _ = io.WriteString(c, "GET /counters/")
		case 2:
			_, _ = io.WriteString(c, "GET /counters/"+id+"/json HTTP/1.1\r\nHost: pb\r\nX-Big: "+strings.Repeat("b", 40<<10)+"\r\n\r\n")
		}
		_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		_, _ = io.Copy(io.Discard, br)
	}
	return nil
}

// abuseBytes are the bytes uploads send (read only).
var abuseBytes = bytes.Repeat([]byte("u"), 256<<10)

// expect reads one response from br and checks its status and body.
func expect(br *bufio.Reader, status int, body string) error {
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		return fmt.Errorf("cannot read a response: %w", err)
	}
	b, err := io.ReadAll(res.Body)
	if res.StatusCode != status || err != nil || string(b) != body {
		return fmt.Errorf("unexpected response; got %d %q, %v; want %d %q", res.StatusCode, b, err, status, body)
	}
	return nil
}

// abuseNode is a node on the memory store, past its cold-start quarantine,
// with one stand-in worker serving /counters and idle worker connections
// closed after 100 ms; it returns the node and its public host:port.
func abuseNode(t *testing.T) (*Pinboard, string) {
	t.Helper()
	ws := httptest.NewServer(abuseWorker())
	t.Cleanup(ws.Close)
	return nodeFor(t, strings.TrimPrefix(ws.URL, "http://"), proxy.UpstreamOptions{IdleTimeout: 100 * time.Millisecond})
}

// abuseWorker serves /counters/{id}/{json,sse,ws,upload,download}.
func abuseWorker() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch path.Base(r.URL.Path) {
		case "json":
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"ok":true}`)
		case "sse":
			w.Header().Set("Content-Type", "text/event-stream")
			for i := range 3 {
				if _, err := fmt.Fprintf(w, "data: %d\n\n", i); err != nil {
					return
				}
				w.(http.Flusher).Flush()
				time.Sleep(5 * time.Millisecond)
			}
		case "ws":
			conn, rw, err := w.(http.Hijacker).Hijack()
			if err != nil {
				return
			}
			defer conn.Close()
			_, _ = io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
				"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n")
			_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
			_, _ = io.Copy(conn, rw.Reader) // echo until the proxy closes
		case "upload":
			n, err := io.Copy(io.Discard, r.Body)
			if err != nil {
				return
			}
			_, _ = io.WriteString(w, strconv.FormatInt(n, 10))
		case "download":
			size, _ := strconv.Atoi(r.URL.Query().Get("size"))
			w.Header().Set("Content-Length", strconv.Itoa(size))
			chunk := bytes.Repeat([]byte("d"), 32<<10)
			for size > 0 {
				m := min(size, len(chunk))
				if _, err := w.Write(chunk[:m]); err != nil {
					return
				}
				size -= m
			}
		default:
			http.NotFound(w, r)
		}
	})
}

// openFDs counts the process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// proxyGoroutines returns the stacks of goroutines running proxy code
// other than its sweeper (Proxy.Run), or "" when there are none.
func proxyGoroutines() string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "pinboard/proxy.") && !strings.Contains(g, "proxy.(*Proxy).Run(") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}
