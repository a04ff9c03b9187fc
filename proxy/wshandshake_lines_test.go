package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A worker's 101 (or refusal) whose header has a line of exactly 4095 or
// 4096 bytes before its CRLF, or a multiple of 4 KiB (a long Set-Cookie),
// is relayed like the 5,000-byte one of
// TestLargeWebSocketHandshakeHeader_RDP2: before, readRawHeader took the
// "\n" or "\r\n" left after bufio's ErrBufferFull for the blank line that
// ends the header, and the client got 502 (R-DP-2, R-DP-4).
func TestWebSocketHandshakeLineAtBufferSize_RDP2(t *testing.T) {
	for _, total := range []int{4094, 4095, 4096, 4097, 8191, 8192} {
		t.Run(fmt.Sprint(total), func(t *testing.T) {
			rg, w := newRigWorker(t, nil)
			prefix := "Set-Cookie: s="
			line := prefix + strings.Repeat("c", total-len(prefix))
			w.route("/ws", func(rw http.ResponseWriter, r *http.Request) {
				conn, brw, err := rw.(http.Hijacker).Hijack()
				if err != nil {
					return
				}
				defer conn.Close()
				brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" + line + "\r\nX-After: 1\r\n\r\n")
				brw.Flush()
				time.Sleep(500 * time.Millisecond)
			})
			c, br := rg.dialUpgrade("/counters/alice/ws", "")
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			status, err := br.ReadString('\n')
			if !strings.HasPrefix(status, "HTTP/1.1 101") {
				t.Fatalf("unexpected answer for a %d-byte header line; got %q (%v); want the worker's 101", total, status, err)
			}
			var hdr bytes.Buffer
			tp := bufio.NewReader(io.LimitReader(br, 64<<10))
			for {
				l, err := tp.ReadString('\n')
				hdr.WriteString(l)
				if err != nil || l == "\r\n" {
					break
				}
			}
			if !strings.Contains(hdr.String(), "X-After: 1\r\n") {
				t.Fatalf("unexpected 101 header; X-After missing")
			}
		})
	}
}

// The same for a refusal: a 403 whose header has a 4096-byte line is
// relayed as the worker's 403, not 502 (R-DP-2, R-DP-4).
func TestWebSocketRefusalLineAtBufferSize_RDP2_RDP4(t *testing.T) {
	rg, w := newRigWorker(t, nil)
	line := "X-Long: " + strings.Repeat("c", 4096-len("X-Long: "))
	w.route("/ws", func(rw http.ResponseWriter, r *http.Request) {
		conn, brw, err := rw.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		brw.WriteString("HTTP/1.1 403 Forbidden\r\n" + line + "\r\nContent-Length: 2\r\n\r\nno")
		brw.Flush()
		time.Sleep(500 * time.Millisecond)
	})
	if got := rg.upgrade("/counters/alice/ws"); !strings.HasPrefix(got, "HTTP/1.1 403") {
		t.Fatalf("unexpected answer; got %q; want the worker's 403", got)
	}
}
