package server

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/proxy"
)

// Response desync (response splitting), worker → pinboard → client. What
// pinboard writes to a client is one well-framed HTTP/1.1 response per
// request — exactly one of Content-Length or Transfer-Encoding: chunked, or
// a body ended by the close under Connection: close — with the body
// pinboard read. A worker connection goes back to the pool only when its
// answer was framed one way only and read exactly to its end: bytes of one
// answer are never read as the answer to another client's request. An
// ambiguous or unreadable answer is 502 {"error": …} and its connection is
// closed (RFC 9112 §6.1, §6.3; RFC 9110 §5.5; R-DP-1, R-DP-3, R-DP-4).

// respSmuggled is a complete answer hidden in a hostile one: read as the
// answer to the next request on the connection, it would be served to
// another client.
const respSmuggled = "HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nSMUGGLED"

// After a script, the stand-in worker reads the connection's next request
// (respKeep; with a header cut short, the connection stays silent) or
// closes it (respClose).
type respAfter uint8

const (
	respKeep respAfter = iota
	respClose
)

// A respCase is a worker's answer to request A, byte for byte. Client A
// must get status with body (a JSON error with that message for 5xx;
// truncated: the header, then a body the connection cuts short); then
// client B, on a connection of its own, must get B's own answer, on A's
// worker connection when reuse, else on a fresh one, A's closed.
type respCase struct {
	name      string
	head      bool // request A is a HEAD
	ws        bool // request A is a WebSocket upgrade
	script    string
	after     respAfter
	status    int
	body      string
	truncated bool
	reuse     bool
	// late is written on A's connection when the next request comes on
	// it, before that request's answer: a body the worker sends after
	// its header (uvicorn writes a 204's or 304's body whenever the app
	// sends it), which no check of the idle connection can see coming.
	late string
}

const (
	ok5      = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
	chunked5 = "5\r\nhello\r\n0\r\n\r\n"
	sseHead  = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
	sseEvent = "data: x\n\n"
	sseBody  = "9\r\n" + sseEvent + "\r\n0\r\n\r\n"
)

// clte is an answer framed by both Content-Length and chunked, the first
// line first: read as chunked, its body is empty and the smuggled answer
// follows; read by its length, the body runs to the end of the smuggled
// answer and a second one follows. Either way the rest would answer the
// next request.
func clte(first, second string) string {
	body := "0\r\n\r\n" + respSmuggled
	fields := map[string]string{"cl": "Content-Length: " + strconv.Itoa(len(body)) + "\r\n", "te": "Transfer-Encoding: chunked\r\n"}
	return "HTTP/1.1 200 OK\r\n" + fields[first] + fields[second] + "\r\n" + body + respSmuggled
}

var respCases = []respCase{
	// Reference answers.
	{name: "sized", script: ok5, status: 200, body: "hello", reuse: true},
	{name: "chunked", script: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked5, status: 200, body: "hello", reuse: true},
	{name: "until_close", script: "HTTP/1.1 200 OK\r\n\r\nhello", after: respClose, status: 200, body: "hello"},
	// Content-Length and Transfer-Encoding together, both orders (RFC 9112
	// §6.3: ought to be handled as an error; nginx answers 502).
	{name: "cl_then_te", script: clte("cl", "te"), status: 502},
	{name: "te_then_cl", script: clte("te", "cl"), status: 502},
	{name: "cl_te_no_rest", script: "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", status: 502},
	// Content-Length values (§6.3 item 5: invalid, 502 and close).
	{name: "two_cl_equal", script: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello", status: 502},
	{name: "two_cl_different", script: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 13\r\n\r\nhello" + respSmuggled, status: 502},
	{name: "cl_list", script: "HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello", status: 502},
	// A framing value folded onto the next line (obs-fold; nginx: 502),
	// and a field name with a space in it, which fasthttp lets through
	// and a client's parser refuses (RFC 9110 §5.1).
	{name: "te_fold_empty_first_line", script: "HTTP/1.1 200 OK\r\nTransfer-Encoding:\r\n chunked\r\n\r\n" + chunked5, status: 502},
	{name: "cl_fold_empty_first_line", script: "HTTP/1.1 200 OK\r\nContent-Length:\r\n 5\r\n\r\nhello", status: 502},
	{name: "name_with_space", script: "HTTP/1.1 200 OK\r\nX A: 1\r\nContent-Length: 5\r\n\r\nhello", status: 502},
	{name: "cl_plus", script: "HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello", status: 502},
	{name: "cl_negative", script: "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\nhello", status: 502},
	{name: "cl_hex", script: "HTTP/1.1 200 OK\r\nContent-Length: 0x5\r\n\r\nhello", status: 502},
	{name: "cl_empty", script: "HTTP/1.1 200 OK\r\nContent-Length: \r\n\r\nhello", status: 502},
	{name: "cl_overflow", script: "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\nhello", status: 502},
	// Transfer-Encoding values: chunked alone, or 502.
	{name: "te_identity", script: "HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\nContent-Length: 5\r\n\r\nhello" + respSmuggled, status: 502},
	{name: "te_gzip_chunked", script: "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n" + chunked5, status: 502},
	{name: "te_chunked_gzip", script: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n" + chunked5, status: 502},
	{name: "te_chunked_any_case", script: "HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n" + chunked5, status: 200, body: "hello", reuse: true},
	{name: "two_te_lines", script: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked5, status: 502},
	// HTTP/1.0 has no chunked coding: its framing is faulty, with or
	// without a Content-Length (§6.1).
	{name: "http10_te", script: "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked5, status: 502},
	{name: "http10_te_cl", script: "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n" + chunked5, status: 502},
	{name: "http10_keep_alive", script: "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 5\r\n\r\nhello", status: 200, body: "hello", reuse: true},
	// Line ends: a bare LF ends a field line (§2.2 allows it); a header
	// block must end with CRLF CRLF, or fasthttp waits for one until the
	// header timeout (5 min by default) and the client with it. A bare
	// CR, a NUL or an LF inside a value is invalid (RFC 9110 §5.5).
	{name: "bare_lf_line", script: "HTTP/1.1 200 OK\r\nX-A: a\nContent-Length: 5\r\n\r\nhello", status: 200, body: "hello", reuse: true},
	{name: "bare_lf_block", script: "HTTP/1.1 200 OK\nX-A: a\nContent-Length: 5\n\nhello", status: 502},
	{name: "bare_lf_end", script: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\nhello", status: 502},
	{name: "cr_in_value", script: "HTTP/1.1 200 OK\r\nX-A: a\rContent-Length: 13\r\nContent-Length: 5\r\n\r\nhello", status: 502},
	{name: "nul_in_value", script: "HTTP/1.1 200 OK\r\nX-A: a\x00b\r\nContent-Length: 5\r\n\r\nhello", status: 502},
	// obs-fold (§5.2): unfolded into the field before it, so a folded
	// line is no framing field; a folded framing value is refused.
	{name: "obs_fold", script: "HTTP/1.1 200 OK\r\nX-A: a\r\n b\r\nContent-Length: 5\r\n\r\nhello", status: 200, body: "hello", reuse: true},
	{name: "obs_fold_hides_te", script: "HTTP/1.1 200 OK\r\nX-A: a\r\n Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\nhello", status: 200, body: "hello", reuse: true},
	{name: "obs_fold_in_cl", script: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n 5\r\n\r\nhello", status: 502},
	{name: "obs_fold_in_te", script: "HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\n chunked\r\n\r\n" + chunked5, status: 502},
	{name: "space_before_colon", script: "HTTP/1.1 200 OK\r\nContent-Length : 13\r\nContent-Length: 5\r\n\r\nhello" + respSmuggled, status: 502},
	// Chunks: the header is out before a chunk is read (a stream may send
	// its first event hours later), so a bad chunk cuts the client's body
	// short and closes both connections.
	{name: "chunk_extension", script: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;a=b\r\nhello\r\n0;c\r\n\r\n", status: 200, body: "hello", reuse: true},
	{name: "chunk_0x", script: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n", status: 200, truncated: true},
	{name: "chunk_overflow", script: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000005\r\nhello\r\n0\r\n\r\n", status: 200, truncated: true},
	{name: "chunk_negative", script: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n0\r\n\r\n", status: 200, truncated: true},
	{name: "chunk_longer_than_size", script: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello!\r\n0\r\n\r\n", status: 200, truncated: true},
	// A chunk not ended by CRLF fails the read that returned its bytes;
	// fasthttp writes bytes returned with an error and reads on, so the
	// error must stand for every later read: "XX" taken for the CRLF, the
	// rest parsed as a last chunk and ended the body cleanly.
	{name: "chunk_bad_crlf_then_last", script: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n", status: 200, truncated: true},
	// A worker that closes inside the chunk framing — before a chunk's
	// CRLF, inside the trailer section — cut the body short: its end was
	// never sent, so the client's body must not end cleanly either.
	{name: "chunk_cut_before_crlf", script: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello", after: respClose, status: 200, truncated: true},
	{name: "chunk_cut_in_trailers", script: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n", after: respClose, status: 200, truncated: true},
	// Trailers are dropped (RFC 9112 §7.1.2), framing names included: the
	// chunked framing already ended the body.
	{name: "trailer", script: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n", status: 200, body: "hello", reuse: true},
	// A two-byte line is no empty line: "X\n" was taken as the end of the
	// trailers, and the real end, arriving later, met the next request on
	// the pooled connection.
	{name: "trailer_two_bytes", script: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX\n\r\n", status: 200, body: "hello", reuse: true},
	{name: "trailer_cl", script: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nContent-Length: 13\r\n\r\n", status: 200, body: "hello", reuse: true},
	// More than was framed: the client gets what was framed, the
	// connection is not reused.
	{name: "cl_extra", script: ok5 + respSmuggled, status: 200, body: "hello"},
	{name: "cl_extra_streamed", script: "HTTP/1.1 200 OK\r\nContent-Length: 70000\r\n\r\n" + strings.Repeat("x", 70000) + respSmuggled, status: 200, body: strings.Repeat("x", 70000)},
	{name: "chunked_extra", script: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked5 + respSmuggled, status: 200, body: "hello"},
	// Bodiless answers (§6.3 items 1, 2).
	{name: "204_body", script: "HTTP/1.1 204 No Content\r\n\r\n" + respSmuggled, status: 204},
	// A 204 or 304 that announces a body (Content-Length above 0, or
	// chunked) may yet send it: its connection is not reused.
	{name: "204_cl", script: "HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n", status: 204},
	{name: "204_cl_0", script: "HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n", status: 204, reuse: true},
	{name: "204_plain", script: "HTTP/1.1 204 No Content\r\n\r\n", status: 204, reuse: true},
	{name: "304_plain", script: "HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\n\r\n", status: 304, reuse: true},
	{name: "204_cl_late_body", script: "HTTP/1.1 204 No Content\r\nContent-Length: 46\r\n\r\n", late: respSmuggled, status: 204},
	{name: "304_cl_late_body", script: "HTTP/1.1 304 Not Modified\r\nContent-Length: 46\r\n\r\n", late: respSmuggled, status: 304},
	{name: "204_chunked_late_body", script: "HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n", late: "2e\r\n" + respSmuggled + "\r\n0\r\n\r\n", status: 204},
	{name: "204_cl_body", script: "HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nhello", status: 204},
	{name: "304_body", script: "HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\nhello", status: 304},
	{name: "304_chunked", script: "HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked5, status: 304},
	{name: "head_body", head: true, script: ok5, status: 200},
	// Interim answers are read past; a 101 nobody asked for is not HTTP.
	{name: "interim", script: "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\n" + ok5, status: 200, body: "hello", reuse: true},
	{name: "interim_with_cl", script: "HTTP/1.1 100 Continue\r\nContent-Length: 5\r\n\r\n" + ok5, status: 200, body: "hello", reuse: true},
	{name: "unasked_101", script: "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n" + respSmuggled, status: 502},
	// Status lines (RFC 9110 §15: three digits, 100 to 599).
	{name: "no_reason", script: "HTTP/1.1 200\r\nContent-Length: 5\r\n\r\nhello", status: 200, body: "hello", reuse: true},
	{name: "status_000", script: "HTTP/1.1 000 OK\r\nContent-Length: 0\r\n\r\n" + respSmuggled, status: 502},
	{name: "status_099", script: "HTTP/1.1 099 OK\r\nContent-Length: 0\r\n\r\n" + respSmuggled, status: 502},
	{name: "status_600", script: "HTTP/1.1 600 OK\r\nContent-Length: 0\r\n\r\n" + respSmuggled, status: 502},
	{name: "status_999", script: "HTTP/1.1 999 OK\r\nContent-Length: 0\r\n\r\n" + respSmuggled, status: 502},
	{name: "status_1000", script: "HTTP/1.1 1000 OK\r\nContent-Length: 5\r\n\r\nhello", status: 502},
	{name: "not_http", script: "HTTX/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", status: 502},
	// Headers that never end, or end too late.
	{name: "header_too_large", script: "HTTP/1.1 200 OK\r\nX-A: " + strings.Repeat("a", 20<<10) + "\r\nContent-Length: 5\r\n\r\nhello", status: 502},
	{name: "header_never_ends", script: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n", status: 504},
	{name: "header_cut", script: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n", after: respClose, status: 502},
	{name: "body_cut", script: "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello", after: respClose, status: 502},
	// Event streams take their own relay (off the HTTP server).
	{name: "sse", script: sseHead + "Transfer-Encoding: chunked\r\n\r\n" + sseBody, status: 200, body: sseEvent, reuse: true},
	{name: "sse_cl_te", script: sseHead + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n" + sseBody, status: 502},
	{name: "sse_http10_te", script: "HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n" + sseBody, status: 502},
	{name: "sse_extra", script: sseHead + "Transfer-Encoding: chunked\r\n\r\n" + sseBody + respSmuggled, status: 200, body: sseEvent},
	{name: "sse_bad_chunk", script: sseHead + "Transfer-Encoding: chunked\r\n\r\n9\r\n" + sseEvent + "\r\n-1\r\n\r\n", status: 200, truncated: true},
	{name: "sse_cut_before_crlf", script: sseHead + "Transfer-Encoding: chunked\r\n\r\n9\r\n" + sseEvent, after: respClose, status: 200, truncated: true},
	{name: "sse_cut_in_trailers", script: sseHead + "Transfer-Encoding: chunked\r\n\r\n" + "9\r\n" + sseEvent + "\r\n0\r\n", after: respClose, status: 200, truncated: true},
	// WebSocket handshakes go on a connection of their own, never pooled;
	// an answer other than 101 is relayed as a response, by the same rules.
	// A 101 goes byte for byte: one with a bare LF or a folded line would
	// go out as no sender may write it (RFC 9112 §2.2, §5.2).
	{name: "ws_101", ws: true, script: "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", status: 101},
	{name: "ws_101_bare_lf", ws: true, script: "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\nConnection: Upgrade\r\n\r\n", status: 502},
	{name: "ws_101_obs_fold", ws: true, script: "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nX-A: a\r\n b\r\nConnection: Upgrade\r\n\r\n", status: 502},
	{name: "ws_101_cl_te", ws: true, script: "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", status: 502},
	{name: "ws_403", ws: true, script: "HTTP/1.1 403 Forbidden\r\nContent-Length: 5\r\n\r\nhello" + respSmuggled, status: 403, body: "hello"},
	{name: "ws_403_cl_te", ws: true, script: "HTTP/1.1 403 Forbidden\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked5, status: 502},
	{name: "ws_403_http10_te", ws: true, script: "HTTP/1.0 403 Forbidden\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked5, after: respClose, status: 502},
	{name: "ws_status_600", ws: true, script: "HTTP/1.1 600 OK\r\n\r\n", status: 502},
	{name: "ws_status_000", ws: true, script: "HTTP/1.1 000 OK\r\n\r\nHTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", status: 502},
}

func TestResponseDesyncMatrix_RDP1_RDP3_RDP4(t *testing.T) {
	for _, tc := range respCases {
		t.Run(tc.name, func(t *testing.T) {
			w, addr := respNode(t, tc)
			a := respExchange(t, addr, "/counters/a/A", tc.head, tc.ws)
			checkRespA(t, tc, a)
			b := respExchange(t, addr, "/counters/a/B", false, false)
			if b.err != nil || b.status != 200 || b.body != "for B" {
				t.Errorf("unexpected answer to B; got %d %q (%v); want 200 \"for B\"", b.status, b.body, b.err)
			}
			w.check(t, tc.reuse)
		})
	}
}

// checkRespA checks what client A got: the status, and the body, or a
// JSON error with pinboard's message for a 5xx.
func checkRespA(t *testing.T, tc respCase, a respAnswer) {
	t.Helper()
	if a.status != tc.status {
		t.Errorf("unexpected status for A; got %d (%q, %v); want %d", a.status, a.body, a.err, tc.status)
		return
	}
	switch {
	case tc.truncated:
		if a.err == nil {
			t.Errorf("unexpected complete body for A; got %q; want it cut short", a.body)
		}
	case a.err != nil:
		t.Errorf("unexpected answer to A: %v", a.err)
	case tc.status >= 500:
		var e struct{ Error string }
		want := map[int]string{502: "invalid answer from owner", 504: "owner timed out"}[tc.status]
		if tc.after == respClose && (tc.name == "header_cut" || tc.name == "body_cut") {
			want = "owner unreachable" // the worker closed: nothing it said was refused
		}
		if a.ctype != "application/json" || json.Unmarshal([]byte(a.body), &e) != nil || e.Error != want {
			t.Errorf("unexpected error body for A; got %q (%s); want {\"error\":%q}", a.body, a.ctype, want)
		}
	case a.body != tc.body:
		t.Errorf("unexpected body for A; got %q; want %q", a.body, tc.body)
	}
}

type respAnswer struct {
	status int
	ctype  string
	body   string
	err    error // the answer was not one well-framed response
}

// respExchange sends one request on a fresh connection and reads the
// answer strictly (readStrict); a kept-alive connection must then stay
// silent: a byte more would be a second answer to one request.
func respExchange(t *testing.T, addr, path string, head, ws bool) respAnswer {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	method := "GET"
	if head {
		method = "HEAD"
	}
	upgrade := ""
	if ws {
		upgrade = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
	}
	if _, err := fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: pb\r\n%s\r\n", method, path, upgrade); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	a, closing := readStrict(br, head)
	if a.err == nil && !closing {
		_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if n, _ := br.Read(make([]byte, 1)); n > 0 {
			a.err = errors.New("bytes after the answer")
		}
	}
	return a
}

// readStrict reads one response as RFC 9112 frames it, with no leniency:
// a status line of HTTP/1.1 and three digits, CRLF lines, no obs-fold, no
// CTL in a value, exactly one framing (one Content-Length of digits, or
// Transfer-Encoding: chunked alone with bare hex chunk sizes, or neither
// and Connection: close, the body ending with the connection), none for
// HEAD, 1xx, 204, 304 beyond a Content-Length. It reports whether the
// connection closes after it.
func readStrict(br *bufio.Reader, head bool) (a respAnswer, closing bool) {
	line := func() (string, error) {
		l, err := br.ReadString('\n')
		if err != nil {
			return "", fmt.Errorf("line cut short %q: %w", l, err)
		}
		if !strings.HasSuffix(l, "\r\n") || strings.ContainsAny(l[:len(l)-2], "\r\n") {
			return "", fmt.Errorf("line not ended by CRLF: %q", l)
		}
		return l[:len(l)-2], nil
	}
	status, err := line()
	if err != nil {
		return respAnswer{err: err}, true
	}
	if len(status) < 12 || status[:9] != "HTTP/1.1 " || (len(status) > 12 && status[12] != ' ') {
		return respAnswer{err: fmt.Errorf("bad status line %q", status)}, true
	}
	a.status, err = strconv.Atoi(status[9:12])
	if err != nil || a.status < 100 || a.status > 599 {
		return respAnswer{err: fmt.Errorf("bad status line %q", status)}, true
	}
	cl, te := -1, false
	for {
		l, err := line()
		if err != nil {
			a.err = err
			return a, true
		}
		if l == "" {
			break
		}
		name, value, ok := strings.Cut(l, ":")
		if !ok || name == "" || strings.ContainsAny(name, " \t") {
			a.err = fmt.Errorf("bad field line %q", l)
			return a, true
		}
		if strings.ContainsFunc(value, func(r rune) bool { return (r < ' ' && r != '\t') || r == 0x7f }) {
			a.err = fmt.Errorf("control character in %q", l)
			return a, true
		}
		value = strings.Trim(value, " \t")
		switch strings.ToLower(name) {
		case "content-length":
			n, err := strconv.Atoi(value)
			if cl >= 0 || err != nil || n < 0 || value != strconv.Itoa(n) {
				a.err = fmt.Errorf("bad or second Content-Length %q", l)
				return a, true
			}
			cl = n
		case "transfer-encoding":
			if te || value != "chunked" {
				a.err = fmt.Errorf("bad or second Transfer-Encoding %q", l)
				return a, true
			}
			te = true
		case "connection":
			closing = closing || strings.EqualFold(value, "close")
		case "content-type":
			a.ctype = value
		}
	}
	if te && cl >= 0 {
		a.err = errors.New("both Content-Length and Transfer-Encoding")
		return a, true
	}
	if head || a.status < 200 || a.status == 204 || a.status == 304 {
		if !head && (te || (cl >= 0 && a.status != 304)) {
			a.err = fmt.Errorf("framing on a bodiless %d", a.status)
		}
		return a, closing
	}
	var body []byte
	switch {
	case te:
		for {
			size, err := line()
			if err != nil {
				a.err = err
				break
			}
			n, err := strconv.ParseUint(size, 16, 40)
			if err != nil || strings.ContainsAny(size, "+-xX") {
				a.err = fmt.Errorf("bad chunk size %q", size)
				break
			}
			if n == 0 {
				if l, err := line(); err != nil || l != "" {
					a.err = fmt.Errorf("trailer or junk after the last chunk: %q %v", l, err)
				}
				break
			}
			chunk := make([]byte, n+2)
			if _, err := io.ReadFull(br, chunk); err != nil || string(chunk[n:]) != "\r\n" {
				a.err = fmt.Errorf("chunk cut short or not ended by CRLF: %q %v", chunk, err)
				break
			}
			body = append(body, chunk[:n]...)
		}
	case cl >= 0:
		body = make([]byte, cl)
		n, err := io.ReadFull(br, body)
		body = body[:n]
		if err != nil {
			a.err = fmt.Errorf("body cut short: %w", err)
		}
	case !closing:
		a.err = errors.New("neither Content-Length nor chunked, and no Connection: close")
	default:
		body, err = io.ReadAll(br)
		if err != nil {
			a.err = err
		}
	}
	a.body = string(body)
	return a, closing || a.err != nil
}

// respWorker answers request A on any connection with its case's script
// and any other request with "for B", and records which connection
// carried each request and which ones pinboard closed.
type respWorker struct {
	tc    respCase
	mu    sync.Mutex
	conns []*respConn
}

type respConn struct {
	paths  []string
	closed bool
}

func respNode(t *testing.T, tc respCase) (*respWorker, string) {
	t.Helper()
	w := &respWorker{tc: tc}
	return w, rawWorkerNode(t, w.serve, proxy.UpstreamOptions{IdleTimeout: time.Minute, ResponseHeaderTimeout: time.Second})
}

func (w *respWorker) serve(ln net.Listener) { acceptRecorded(ln, &w.mu, &w.conns, w.conn) }

func (w *respWorker) conn(c net.Conn, rc *respConn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		r, err := http.ReadRequest(br)
		if err != nil {
			w.mu.Lock()
			rc.closed = !errors.Is(err, os.ErrDeadlineExceeded)
			w.mu.Unlock()
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.mu.Lock()
		rc.paths = append(rc.paths, r.URL.Path)
		w.mu.Unlock()
		if !strings.HasSuffix(r.URL.Path, "/A") {
			var late string
			if len(rc.paths) > 1 {
				late = w.tc.late
			}
			if _, err := io.WriteString(c, late+"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfor B"); err != nil {
				return
			}
			continue
		}
		if _, err := io.WriteString(c, w.tc.script); err != nil {
			return
		}
		if w.tc.after == respClose {
			w.mu.Lock()
			rc.closed = true
			w.mu.Unlock()
			return
		}
	}
}

// check requires B on A's worker connection when reuse is set, and
// otherwise on another one, with A's closed by pinboard (within 3 s).
func (w *respWorker) check(t *testing.T, reuse bool) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		w.mu.Lock()
		var a, b *respConn
		for _, c := range w.conns {
			for _, p := range c.paths {
				if strings.HasSuffix(p, "/A") {
					a = c
				} else {
					b = c
				}
			}
		}
		aClosed := a != nil && a.closed
		var got []string
		for _, c := range w.conns {
			got = append(got, fmt.Sprintf("%v closed=%v", c.paths, c.closed))
		}
		w.mu.Unlock()
		switch {
		case a == nil || b == nil:
			t.Errorf("unexpected requests at the worker; got %v; want A and B", got)
			return
		case reuse && a != b:
			t.Errorf("unexpected fresh connection for B after a clean answer; got %v", got)
			return
		case reuse:
			return
		case a == b:
			t.Errorf("unexpected reuse of A's worker connection for B; got %v", got)
			return
		case aClosed:
			return
		case time.Now().After(deadline):
			t.Errorf("unexpected worker connection of A still open 3s after; got %v", got)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
