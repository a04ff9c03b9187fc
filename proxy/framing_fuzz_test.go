package proxy

import (
	"bufio"
	"bytes"
	"testing"

	"github.com/valyala/fasthttp"
)

// FuzzReadFramedHeader_RDP1 reads a worker's answer header as the proxy does
// and checks that an accepted one is framed one way: a body fasthttp
// will read as chunked comes from an HTTP/1.1 answer in which scanHeader
// saw the Transfer-Encoding line and no Content-Length line, so the
// framing check looked at the lines fasthttp used; and its status is a
// real one (RFC 9112 §6.3, RFC 9110 §15; R-DP-1).
func FuzzReadFramedHeader_RDP1(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nX-A: a\r\n Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding : chunked\r\nContent-Length: 5\r\n\r\n", "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
		"HTTP/1.1 000 OK\r\n\r\n", "\r\nHTTP/1.1 200\r\nX-A: a\nContent-Length: 5\r\n\r\n", "HTTP/1.1 200 OK\r\nTransfer-Encoding: identity, chunked\r\n\r\n",
		"HTTP/1.1 204 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 0\r\n\r\n", "HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Encoding: br\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		var rh fasthttp.ResponseHeader
		br := bufio.NewReaderSize(bytes.NewReader(in), 256)
		block, _, _ := peekResponseHeader(br)
		block = bytes.Clone(block)
		if _, err := readFramedHeader(&rh, br); err != nil {
			return
		}
		_, fields := scanHeader(block)
		if s := rh.StatusCode(); s < 100 || s > 599 {
			t.Fatalf("unexpected status %d accepted from %q", s, in)
		}
		if rh.ContentLength() == -1 && (!fields.te || fields.cl || !rh.IsHTTP11()) {
			t.Fatalf("unexpected chunked framing accepted from %q (scanHeader %+v)", in, fields)
		}
	})
}
