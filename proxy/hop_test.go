package proxy

import (
	"bufio"
	"iter"
	"strconv"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// referenceStripRequestHop is the straightforward form stripRequestHop
// replaced (one deletion per hop-by-hop name, always): the single-pass
// version must leave every header exactly as this one does.
func referenceStripRequestHop(h *fasthttp.RequestHeader, keepUpgrade bool) {
	referenceConnectionNamed(h.All(), h.Del)
	h.Del(fasthttp.HeaderConnection)
	for _, name := range []string{"Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"} {
		if keepUpgrade && name == "Upgrade" {
			continue
		}
		h.Del(name)
	}
	h.Del(fasthttp.HeaderExpect)
	for _, n := range reservedNames(h) {
		h.Del(n)
	}
}

func referenceStripResponseHop(h *fasthttp.ResponseHeader) {
	referenceConnectionNamed(h.All(), h.Del)
	h.Del(fasthttp.HeaderConnection)
	for _, name := range []string{"Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"} {
		h.Del(name)
	}
}

// referenceConnectionNamed deletes what every Connection header names.
func referenceConnectionNamed(all iter.Seq2[[]byte, []byte], del func(string)) {
	var named []string
	for k, v := range all {
		if strings.EqualFold(string(k), "Connection") {
			named = appendConnectionNamed(named, v)
		}
	}
	for _, n := range named {
		del(n)
	}
}

var hopRequests = []string{
	"GET /a/b/c HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n",
	"GET /a/b/c HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n\r\n",
	"GET /a/b/c HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
	"GET /a/b/c HTTP/1.1\r\nHost: x\r\nConnection: X-Secret, close\r\nX-Secret: 1\r\nX-Other: 2\r\n\r\n",
	"GET /a/b/c HTTP/1.1\r\nHost: x\r\nconnection: upgrade\r\nupgrade: websocket\r\nSec-WebSocket-Key: k\r\n\r\n",
	"GET /a/b/c HTTP/1.1\r\nHost: x\r\nTE: trailers\r\nProxy-Connection: keep-alive\r\nProxy-Authorization: Basic eA==\r\nProxy-Authenticate: x\r\n\r\n",
	"POST /a/b/c HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 0\r\n\r\n",
	"POST /a/b/c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n0\r\nX-Sum: 1\r\n\r\n",
	"GET /a/b/c HTTP/1.1\r\nHost: x\r\nPinboard-Attestation: forged\r\npinboard-epoch: 9\r\nPINBOARD-SESSION: s\r\nPinboardX: keep\r\n\r\n",
	"GET /a/b/c HTTP/1.1\r\nHost: x\r\nCookie: a=1; b=2\r\nUser-Agent: t\r\nContent-Type: text/plain\r\n\r\n",
	"GET /a/b/c HTTP/1.1\r\nHost: x\r\nConnection: Keep-Alive, Pinboard-Epoch, TE\r\nTE: x\r\nPinboard-Epoch: 1\r\n\r\n",
	// Only the second Connection line names a header (hopNamed).
	"GET /a/b/c HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\nX-Hop: 1\r\nConnection: ,X-Hop ,\r\nX-Keep: 2\r\n\r\n",
	// Names that frame or route the message are not stripped.
	"GET /a/b/c HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, Host, Content-Length\r\nX-Keep: 2\r\n\r\n",
}

func parseRequest(t *testing.T, raw string) *fasthttp.Request {
	t.Helper()
	var req fasthttp.Request
	if err := req.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		t.Fatalf("cannot parse %q: %v", raw, err)
	}
	return &req
}

// TestStripRequestHopMatchesReference: the single pass removes exactly
// what one deletion per name removes (RFC 9110 §7.6.1, R-TR-5).
func TestStripRequestHopMatchesReference(t *testing.T) {
	for _, raw := range hopRequests {
		for _, keepUpgrade := range []bool{false, true} {
			got, want := parseRequest(t, raw), parseRequest(t, raw)
			got.Header.ResetConnectionClose()
			want.Header.ResetConnectionClose()
			stripRequestHop(&got.Header, &request{}, hopFound(got.Header.All()), keepUpgrade)
			referenceStripRequestHop(&want.Header, keepUpgrade)
			if g, w := got.Header.String(), want.Header.String(); g != w {
				t.Fatalf("unexpected header for %q (keepUpgrade %v); got\n%s\nwant\n%s", raw, keepUpgrade, g, w)
			}
			for _, h := range []string{"Keep-Alive", "Te", "Expect", "Pinboard-Attestation", "Pinboard-Epoch", "Pinboard-Session", "X-Secret", "Proxy-Authorization"} {
				if len(got.Header.Peek(h)) != 0 {
					t.Fatalf("unexpected %s left in %q", h, got.Header.String())
				}
			}
		}
	}
}

func TestStripResponseHopMatchesReference(t *testing.T) {
	for _, raw := range []string{
		"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n",
		"HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Hop\r\nKeep-Alive: timeout=5\r\nX-Hop: 1\r\nContent-Length: 2\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\nUpgrade: h2c\r\n\r\n",
		"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
		"HTTP/1.1 200 OK\r\nProxy-Authenticate: Basic\r\nSet-Cookie: a=1\r\nExpect: x\r\nPinboard-Epoch: 3\r\nContent-Length: 0\r\n\r\n",
	} {
		var got, want fasthttp.ResponseHeader
		for _, h := range []*fasthttp.ResponseHeader{&got, &want} {
			if err := h.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
				t.Fatalf("cannot parse %q: %v", raw, err)
			}
			h.ResetConnectionClose()
		}
		stripResponseHop(&got)
		referenceStripResponseHop(&want)
		if g, w := got.String(), want.String(); g != w {
			t.Fatalf("unexpected response header for %q; got\n%s\nwant\n%s", raw, g, w)
		}
	}
}

func TestHopBit(t *testing.T) {
	for name, want := range map[string]uint16{
		"te": hopTE, "TE": hopTE, "Expect": hopExpect, "trailer": hopTrailer, "UPGRADE": hopUpgrade,
		"Connection": hopConnection, "keep-alive": hopKeepAlive, "Proxy-Connection": hopProxyConnection,
		"Transfer-Encoding": hopTransferEncoding, "Proxy-Authenticate": hopProxyAuthenticate,
		"Proxy-Authorization": hopProxyAuthorization, "Pinboard-Attestation": hopReserved, "pinboard-x": hopReserved,
		"Host": 0, "Tea": 0, "Upgrades": 0, "Pinboard": 0, "X-Forwarded-For": 0,
	} {
		if got := hopBit([]byte(name)); got != want {
			t.Fatalf("unexpected hopBit(%q); got %b; want %b", name, got, want)
		}
	}
}

func BenchmarkStripRequestHop(b *testing.B) {
	var req fasthttp.Request
	raw := "GET /bench/alice/json HTTP/1.1\r\nHost: pinboard.test\r\nUser-Agent: bench\r\nAccept: application/json\r\nAccept-Encoding: gzip\r\nX-Request-Id: 123\r\n\r\n"
	if err := req.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		stripRequestHop(&req.Header, &request{}, hopFound(req.Header.All()), false)
	}
}

func BenchmarkStripRequestHopReference(b *testing.B) {
	var req fasthttp.Request
	raw := "GET /bench/alice/json HTTP/1.1\r\nHost: pinboard.test\r\nUser-Agent: bench\r\nAccept: application/json\r\nAccept-Encoding: gzip\r\nX-Request-Id: 123\r\n\r\n"
	if err := req.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		referenceStripRequestHop(&req.Header, false)
	}
}

// BenchmarkStripResponseHop: a worker's answer losing its Connection:
// keep-alive and Keep-Alive lines (Node, Apache, an nginx sidecar), with
// no field on several lines (the fast path, 0 allocs) and with Link and
// Cache-Control sent twice (stripResponseHopInOrder, the slow path).
func BenchmarkStripResponseHop(b *testing.B) {
	const head = "HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\nContent-Type: text/html\r\n" +
		"Vary: Accept-Encoding\r\nX-Request-Id: 123\r\n"
	for name, extra := range map[string]string{
		"no_repeat": "Link: </a.css>; rel=preload\r\nCache-Control: no-store\r\n",
		"repeat":    "Link: </a.css>; rel=preload\r\nCache-Control: no-store\r\nLink: </b.js>; rel=preload\r\nCache-Control: private\r\n",
	} {
		b.Run(name, func(b *testing.B) {
			raw := head + extra + "Content-Length: 2\r\n\r\n"
			var h fasthttp.ResponseHeader
			sr := strings.NewReader(raw)
			br := bufio.NewReader(sr)
			b.ReportAllocs()
			for b.Loop() {
				sr.Reset(raw)
				br.Reset(sr)
				if err := h.Read(br); err != nil {
					b.Fatal(err)
				}
				stripResponseHop(&h)
				h.Reset()
			}
		})
	}
}

// A Connection header listing the same name thousands of times, or names
// the request does not carry, costs one deletion per header it does carry:
// each deletion scans the whole header, and a 12 KiB request naming "a"
// 2,600 times beside 1,300 other lines took some 50 ms of CPU to strip —
// a few such requests a second from one client kept a core busy and
// slowed every other tenant's requests (R-DP-1).
func TestConnectionNamesDeletedOnce_RDP1(t *testing.T) {
	var b strings.Builder
	b.WriteString("GET /counters/alice/x HTTP/1.1\r\nHost: a\r\nConnection: keep-alive")
	for range 500 {
		b.WriteString(",a,X-Hop")
	}
	for i := range 500 {
		b.WriteString(",absent-" + strconv.Itoa(i))
	}
	b.WriteString("\r\nX-Hop: 1\r\nx-hop: 2\r\nX-Keep: 1\r\n\r\n")
	var req fasthttp.Request
	if err := req.Read(bufio.NewReaderSize(strings.NewReader(b.String()), 16<<10)); err != nil {
		t.Fatal(err)
	}
	h := &req.Header
	var dels []string
	if err := checkStripBound(h, hopFound(h.All())); err != nil {
		t.Fatal(err)
	}
	stripHop(hopFound(h.All()), 0, recordingHeader{h, &dels})
	if len(dels) != 2 || !strings.EqualFold(dels[0], "X-Hop") || dels[1] != fasthttp.HeaderConnection {
		t.Fatalf("unexpected deletions; got %d, first %q; want [X-Hop Connection]", len(dels), dels[:min(len(dels), 4)])
	}
	if len(h.Peek("X-Hop")) != 0 || len(h.Peek("Connection")) != 0 || string(h.Peek("X-Keep")) != "1" {
		t.Fatalf("unexpected header after stripping; got %q", h.String())
	}
}

// recordingHeader is a request header that records what stripHop deletes.
type recordingHeader struct {
	*fasthttp.RequestHeader
	dels *[]string
}

func (h recordingHeader) Del(n string) {
	*h.dels = append(*h.dels, n)
	h.RequestHeader.Del(n)
}
