package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http/httputil"
	"testing"
)

// FuzzChunkedBody_RDP2 decodes a worker's chunked body through upstreamBody
// with a small buffer (size lines, CRLFs and trailers split across
// reads) and compares it with net/http's chunked reader: a body read to
// its end must be one net/http reads to the same bytes, so pinboard never
// takes a framing the strict reader refuses (R-DP-2). The trailer section
// stays within the cap.
func FuzzChunkedBody_RDP2(f *testing.F) {
	for _, s := range []string{
		"5\r\nhello\r\n0\r\n\r\n", "5;ext=1\r\nhello\r\n0\r\nX-T: 1\r\n\r\n", "5 \r\nhello\r\n0\r\n\r\n",
		"A\r\n0123456789\r\n0\r\n\n", "5\nhello\r\n0\r\n\r\n", "5\r\nhellox\r\n0\r\n\r\n", "fffffffffffffff\r\n",
		"0000000000000005\r\nhello\r\n0\r\n\r\n", "5\r\nhello\r\n0\r\nX: " + string(bytes.Repeat([]byte("y"), 80)) + "\r\n\r\n",
		"1\r\na\r\n1\r\nb\r\n0\r\n\r\nNEXT", "5\rX\nhello\r\n0\r\n\r\n", "5 junk\r\nhello\r\n0\r\n\r\n", "5 ; a=b\r\nhello\r\n0\r\n\r\n", "5\r\r\nhello\r\n0\r\n\r\n",
	} {
		f.Add([]byte(s), uint8(7))
	}
	f.Fuzz(func(t *testing.T, in []byte, readSize uint8) {
		const bufSize = 64
		b := &upstreamBody{
			pool: &connPool{bufSize: bufSize}, pc: &pconn{br: bufio.NewReaderSize(bytes.NewReader(in), 16)},
			tracker: newStreams(), mode: bodyChunked,
		}
		var got []byte
		p := make([]byte, int(readSize)%32+1)
		var err error
		for i := 0; ; i++ {
			var n int
			n, err = b.Read(p)
			if n > len(p) {
				t.Fatalf("unexpected count %d for a buffer of %d", n, len(p))
			}
			got = append(got, p[:n]...)
			if err != nil || i > len(in)+2 {
				break
			}
		}
		if err != io.EOF {
			if err == nil {
				t.Fatalf("unexpected endless body from %q", in)
			}
			return
		}
		if !b.done {
			t.Fatalf("unexpected EOF before the body's end from %q", in)
		}
		if bytes.Contains(in, []byte(" ;")) || bytes.Contains(in, []byte("\t;")) {
			return // BWS before an extension: RFC 9112 §7.1.1 allows it, net/http does not
		}
		want, werr := io.ReadAll(httputil.NewChunkedReader(bytes.NewReader(in)))
		if werr != nil || !bytes.Equal(got, want) {
			t.Fatalf("unexpected acceptance of %q; got %q; net/http %q, %v", in, got, want, werr)
		}
		if errors.Is(werr, io.ErrUnexpectedEOF) {
			t.Fatalf("unexpected acceptance of a cut body %q", in)
		}
	})
}
