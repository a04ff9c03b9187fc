package proxy

import (
	"bufio"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// The framings fasthttp lets through are told apart from the raw header;
// the matrix through a whole node is server.TestRequestDesyncMatrix_RDP1_RDP4.
func TestAmbiguousFraming_RDP1(t *testing.T) {
	for head, want := range map[string]bool{
		"Content-Length: 5\r\n":                                       false,
		"Transfer-Encoding: chunked\r\n":                              false,
		"transfer-encoding: Chunked\r\n":                              false,
		"X-Transfer-Encoding: identity\r\nX-A: Content-Length: 5\r\n": false,
		"":                                false,
		"Transfer-Encoding: identity\r\n": true,
		"TRANSFER-ENCODING: identity\r\nContent-Length: 5\r\n":        true,
		"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n":         true,
		"Transfer-Encoding: chunked\r\ncontent-length: 5\r\n":         true,
		"X-A: a\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n": true,
		// obs-fold: a framing field's value on the next line is refused;
		// another field's fold is unfolded and passes.
		"Transfer-Encoding:\r\n chunked\r\n":    true,
		"Transfer-Encoding:\r\n\tchunked\r\n":   true,
		"Content-Length:\r\n 5\r\n":             true,
		"X-A: a\r\n b\r\nContent-Length: 5\r\n": false,
		"Content-Length: 5\r\nX-A: a\r\n b\r\n": false,
	} {
		h := parseHeader(t, "POST /a/b HTTP/1.1\r\nHost: x\r\n"+head+"\r\n")
		if got := framingRefusal(h) != ""; got != want {
			t.Errorf("unexpected verdict for %q; got %v; want %v", head, got, want)
		}
	}
}

func TestAmbiguousFramingAllocatesNothing_RDP1(t *testing.T) {
	skipUnderRace(t)
	h := parseHeader(t, "GET /a/b HTTP/1.1\r\nHost: x\r\nAccept: */*\r\nUser-Agent: t\r\nCookie: a=1\r\n\r\n")
	if n := testing.AllocsPerRun(1000, func() { _ = framingRefusal(h) }); n != 0 {
		t.Fatalf("unexpected allocations; got %v; want 0", n)
	}
}

func parseHeader(t *testing.T, s string) *fasthttp.RequestHeader {
	t.Helper()
	var h fasthttp.RequestHeader
	if err := h.Read(bufio.NewReader(strings.NewReader(s))); err != nil {
		t.Fatalf("cannot parse %q: %v", s, err)
	}
	return &h
}

// Worker answers fasthttp parses but pinboard must not relay or pool;
// the matrix through a whole node is server.TestResponseDesyncMatrix_RDP1_RDP3_RDP4.
func TestResponseFraming_RDP1_RDP3(t *testing.T) {
	for resp, want := range map[string]error{
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n":                                nil,
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n":                       nil,
		"\r\nHTTP/1.1 200\r\nX-A: a\nContent-Length: 5\r\n\r\n":                       nil,
		"HTTP/1.1 200 OK\r\nX-A: a\r\n Transfer-Encoding: chunked\r\n\r\n":            nil,
		"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\n":                                nil,
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n":  errResponseFraming,
		"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n":  errResponseFraming,
		"HTTP/1.1 200 OK\r\nTransfer-Encoding : chunked\r\nContent-Length: 5\r\n\r\n": errResponseFraming,
		"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n":                       errResponseFraming,
		"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n":  errResponseFraming,
		"HTTP/1.1 000 OK\r\nContent-Length: 0\r\n\r\n":                                errResponseStatus,
		"HTTP/1.1  099 OK\r\nContent-Length: 0\r\n\r\n":                               errResponseStatus,
		"HTTP/1.1 600 OK\r\nContent-Length: 0\r\n\r\n":                                errResponseStatus,
		"HTTP/1.1 599 OK\r\nContent-Length: 0\r\n\r\n":                                nil,
		"HTTP/1.1 200 OK\nContent-Length: 5\n\n":                                      errResponseLineEnd,
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\n":                                  errResponseLineEnd,
		"HTTP/1.1 200 OK\r\nContent-Length: 5\n\r\n":                                  errResponseLineEnd,
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n" + strings.Repeat("X: y\r\n", 1000): errHeaderTooLarge,
		"HTTP/1.1 200 OK\r\nTransfer-Encoding:\r\n chunked\r\n\r\n":                   errResponseFraming,
		"HTTP/1.1 200 OK\r\nContent-Length:\r\n 5\r\n\r\n":                            errResponseFraming,
		"HTTP/1.1 200 OK\r\nX-A: a\r\n b\r\nContent-Length: 5\r\n\r\n":                nil,
		"HTTP/1.1 200 OK\r\nX A: 1\r\nContent-Length: 5\r\n\r\n":                      errResponseFieldName,
	} {
		var rh fasthttp.ResponseHeader
		br := bufio.NewReaderSize(strings.NewReader(resp+"hello"), 4096)
		if _, err := readFramedHeader(&rh, br); err != want {
			t.Errorf("unexpected verdict for %q; got %v; want %v", resp, err, want)
		}
	}
}

func TestResponseFramingAllocatesNothing_RDP1(t *testing.T) {
	skipUnderRace(t)
	const resp = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 5\r\n\r\nhello"
	var rh fasthttp.ResponseHeader
	sr := strings.NewReader(resp)
	br := bufio.NewReaderSize(sr, 4096)
	if n := testing.AllocsPerRun(1000, func() {
		sr.Reset(resp)
		br.Reset(sr)
		if _, err := readFramedHeader(&rh, br); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("unexpected allocations; got %v; want 0", n)
	}
}

// One Content-Encoding line, the usual case of a compressed answer, is
// read without an allocation (joinContentEncodings' fast path).
func TestOneContentEncodingAllocatesNothing_RDP1(t *testing.T) {
	resp := "HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 5\r\n\r\nhello"
	var rh fasthttp.ResponseHeader
	sr := strings.NewReader(resp)
	br := bufio.NewReaderSize(sr, 4096)
	allocs := testing.AllocsPerRun(100, func() {
		sr.Reset(resp)
		br.Reset(sr)
		rh.Reset()
		if _, err := readFramedHeader(&rh, br); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 || string(rh.ContentEncoding()) != "gzip" {
		t.Fatalf("unexpected read of one Content-Encoding line; got %v allocations, %q; want 0, gzip", allocs, rh.ContentEncoding())
	}
}

// The hop-by-hop names readFramedHeader returns are the ones relay would
// find itself after its own changes to the header (the Connection: close
// flag cleared, its own version): relay strips by them without walking
// the header a second time (R-DP-1).
func TestFramedHeaderHopMatchesRelays_RDP1(t *testing.T) {
	for _, resp := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nConnection: close, X-Foo\r\nX-Foo: 1\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nProxy-Connection: x\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTrailer: X\r\nUpgrade: h2c\r\nTransfer-Encoding: chunked\r\nPinboard-X: 1\r\n\r\n",
	} {
		var rh fasthttp.ResponseHeader
		hop, err := readFramedHeader(&rh, bufio.NewReader(strings.NewReader(resp)))
		if err != nil {
			t.Fatalf("cannot read %q: %v", resp, err)
		}
		rh.ResetConnectionClose()
		ownVersion(&rh)
		if want := hopFound(rh.All()); hop != want {
			t.Errorf("unexpected hop-by-hop names for %q; got %b; want %b", resp, hop, want)
		}
	}
}
