package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// collector reads a response body in the background.
type collector struct {
	mu  sync.Mutex
	buf []byte
	err error
}

func (c *collector) run(r io.Reader) {
	b := make([]byte, 64<<10)
	for {
		n, err := r.Read(b)
		c.mu.Lock()
		c.buf = append(c.buf, b[:n]...)
		if err != nil {
			c.err = err
		}
		c.mu.Unlock()
		if err != nil {
			return
		}
	}
}

func (c *collector) waitFor(want string, d time.Duration) (string, bool) {
	for end := time.Now().Add(d); ; time.Sleep(time.Millisecond) {
		c.mu.Lock()
		got, err := string(c.buf), c.err
		c.mu.Unlock()
		if got == want {
			return got, true
		}
		if time.Now().After(end) || (err != nil && len(got) >= len(want)) {
			return got, false
		}
	}
}

type sseStep struct {
	wire string // what the worker writes
	data string // what the client must then have, in total, of the body
}

// runSteps: the worker answers hdr, then writes each step's wire bytes,
// waiting for the client to have each step's data (or 5 s) before the next.
func runSteps(t *testing.T, proto, hdr string, steps []sseStep, extraReq string) {
	t.Helper()
	rg := newRig(t, nil)
	rg.warm()
	next := make(chan struct{})
	w, _ := rawRequestWorker(t, func(c net.Conn, r *http.Request) bool {
		_, _ = io.WriteString(c, hdr)
		for i, s := range steps {
			if i > 0 {
				select {
				case <-next:
				case <-time.After(5 * time.Second):
				}
			}
			if _, err := io.WriteString(c, s.wire); err != nil {
				return false
			}
		}
		return false
	})
	rg.serveIDs(t, w, "alice")
	c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(c, "GET /counters/alice/sse %s\r\nHost: pb\r\n%s\r\n", proto, extraReq)
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	col := &collector{}
	go col.run(res.Body)
	for i, s := range steps {
		if got, ok := col.waitFor(s.data, 2*time.Second); !ok {
			t.Fatalf("step %d: unexpected body before the worker's next write; got %q (len %d); want %q (len %d)", i, trunc(got), len(got), trunc(s.data), len(s.data))
		}
		if i < len(steps)-1 {
			next <- struct{}{}
		}
	}
}

func trunc(s string) string {
	if len(s) > 80 {
		return s[:40] + "..." + s[len(s)-40:]
	}
	return s
}

func chunkOf(s string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(s), s) }

// Events reach the client as they come, byte for byte, whatever the
// worker's framing (chunked, sized, ended by its close) and the client's
// version: an event end split across reads (CRLF, LF LF, CR only), an
// event larger than the buffer, a 100 KB line, several events in one
// write, a comment, UTF-8 split across reads, a NUL byte. Each step waits
// for the client to have it before the worker writes the next (R-DP-2).
func TestEventStreamDeliveredAsWritten_RDP2(t *testing.T) {
	big := "data: " + strings.Repeat("y", 10000) + "\n\n"
	long := "data: " + strings.Repeat("z", 100000) + "\n\n"
	events := [][]string{
		{"data: a\r\n\r", "\n"},        // CRLF split
		{"data: b\n", "\n"},            // LF + LF across reads
		{"data: c\r\r", "data: d\r\r"}, // CR only
		{big, "data: e\n\n"},           // larger than the buffer
		{"data: 1\n\ndata: 2\n\ndata: 3\n\n", ":ping\n\n", "data: 4\n\n"},
		{"data: \xc3", "\xa9\n\n", "data: \x00nul\n\n"},
		{long, "data: f\n\n"},
	}
	for pi, proto := range []string{"HTTP/1.1", "HTTP/1.0"} {
		for ei, evs := range events {
			for _, framing := range []string{"chunked", "sized", "close"} {
				name := fmt.Sprintf("%d/%d/%s", pi, ei, framing)
				t.Run(name, func(t *testing.T) {
					var steps []sseStep
					total, acc := 0, ""
					for _, e := range evs {
						total += len(e)
					}
					var hdr string
					switch framing {
					case "chunked":
						hdr = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
					case "sized":
						hdr = fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n", total)
					case "close":
						hdr = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
					}
					for _, e := range evs {
						acc += e
						wire := e
						if framing == "chunked" {
							wire = chunkOf(e)
						}
						steps = append(steps, sseStep{wire, acc})
					}
					runSteps(t, proto, hdr, steps, "")
				})
			}
		}
	}
}

// The worker's chunk framing split from its data: the event is complete
// at pinboard but its chunk's CRLF is not. The event goes out at once;
// before, it waited for the CRLF, so for the worker's next write (a
// server that writes the CRLF apart, held back by Nagle) (R-DP-2).
func TestEventStreamChunkCRLFLateNotWaitedFor_RDP2(t *testing.T) {
	hdr := "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
	ev := "data: x\n\n"
	steps := []sseStep{
		{fmt.Sprintf("%x\r\n%s", len(ev), ev), ev},
		{"\r\n" + chunkOf("data: y\n\n"), ev + "data: y\n\n"},
	}
	runSteps(t, "HTTP/1.1", hdr, steps, "")
}
