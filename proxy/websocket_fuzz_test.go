package proxy

import (
	"bufio"
	"bytes"
	"testing"

	"github.com/valyala/fasthttp"
)

// FuzzReadRawHeader_RDP2 reads a worker's handshake answer through a small
// buffer, so lines longer than it arrive in pieces, and checks
// readRawHeader against scanHeader, which reads the same block from one
// slice: the same end, the bytes kept as sent, never more than the cap.
// readHandshakeAnswer must not panic on what follows, and a 101 it
// accepts is one a client may get verbatim (R-DP-2).
func FuzzReadRawHeader_RDP2(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nFRAME",
		"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 101 OK\r\nUpgrade: websocket\r\n\r\n",
		"HTTP/1.1 101 OK\nUpgrade: websocket\n\n", "HTTP/1.1 101 OK\r\nX: a\r\n b\r\n\r\n", "HTTP/1.1 000 OK\r\n\r\n",
		"HTTP/1.1 101 OK\r\nX: " + string(bytes.Repeat([]byte("y"), 30)) + "\r\n\r\n", "\r\nHTTP/1.1 200 OK\r\n\r\n",
		"HTTP/1.1 101 OK\r\nX: 0123456789ab\r\n\r\n", "HTTP/1.1 400 Bad\r\nTransfer-Encoding: chunked\r\nContent-Length: 1\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		raw, err := readRawHeader(bufio.NewReaderSize(bytes.NewReader(in), 16))
		if err == nil {
			if len(raw) > maxHandshakeHeader || !bytes.HasPrefix(in, raw) {
				t.Fatalf("unexpected header %q from %q", raw, in)
			}
			// scanHeader skips empty lines first; readRawHeader does not.
			if len(in) > 0 && in[0] != '\r' && in[0] != '\n' {
				if end, _ := scanHeader(in); end != len(raw) {
					t.Fatalf("unexpected header end for %q; readRawHeader %d; scanHeader %d", in, len(raw), end)
				}
			}
		} else if end, _ := scanHeader(in); end > 0 && end <= maxHandshakeHeader && in[0] != '\r' && in[0] != '\n' {
			t.Fatalf("unexpected error for %q, whose header ends at %d: %v", in, end, err)
		}
		var rh fasthttp.ResponseHeader
		raw, err = readHandshakeAnswer(bufio.NewReaderSize(bytes.NewReader(in), 16), &rh)
		if err == nil && rh.StatusCode() == fasthttp.StatusSwitchingProtocols && !verbatimSafe(raw) {
			t.Fatalf("unexpected 101 %q accepted for relay", raw)
		}
	})
}
