package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/attest"
	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/proxy"
)

// Request desync (HTTP request smuggling), client → pinboard → worker.
// Every request pinboard accepts must reach the worker framed one way
// only — exactly one of Content-Length or Transfer-Encoding: chunked, no
// other framing field, CRLF lines, nothing a worker could read otherwise —
// so that the worker parses the request and body pinboard meant and no
// more. An ambiguous request is answered 400 {"error": …}, its connection
// closed, and nothing of it (nor of what the client sent behind it)
// reaches the worker (RFC 9112 §6.1, §6.3; R-DP-1, R-DP-4).

// desyncProbe follows every case on its client connection: a smuggled
// request, were pinboard to read the case's body as one, and an innocent
// pipelined one otherwise; either way it may reach the worker only when
// the case was forwarded whole and the connection kept.
const desyncProbe = "GET /counters/a/probe HTTP/1.1\r\nHost: pb\r\n\r\n"

const desyncHead = "POST /counters/a/x HTTP/1.1\r\nHost: pb\r\n"

// A desyncCase is one request on a fresh client connection (the probe
// behind it unless noProbe), then the client's half-close. status lists
// the answers the client must get in order; every 400 must be JSON and
// close the connection. fwd lists what the worker must get, request by
// request, as "<target> <body>", "<target> <incomplete>" for one cut
// mid-body (its connection must then be closed).
type desyncCase struct {
	name    string
	req     string
	noProbe bool
	status  []int
	fwd     []string
}

const (
	fwdX     = "/counters/a/x hello"
	fwdProbe = "/counters/a/probe "
	fwdCut   = "/counters/a/x <incomplete>"
)

var (
	refused   = []int{400}
	answered2 = []int{200, 200}
)

func chunked(body string) string { return "Transfer-Encoding: chunked\r\n\r\n" + body }

var desyncCases = []desyncCase{
	// Content-Length and Transfer-Encoding together, both orders; the
	// second has the classic smuggled request as its "body".
	{name: "cl_then_te", req: desyncHead + "Content-Length: 5\r\n" + chunked("5\r\nhello\r\n0\r\n\r\n"), status: refused},
	{name: "te_then_cl", req: desyncHead + "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n5\r\nhello\r\n0\r\n\r\n", status: refused},
	{name: "cl_te_smuggle", req: desyncHead + "Content-Length: 4\r\n" + chunked("0\r\n\r\n"), status: refused},
	// Content-Length values.
	{name: "two_cl_different", req: desyncHead + "Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!", status: refused},
	{name: "two_cl_equal", req: desyncHead + "Content-Length: 5\r\nContent-Length: 5\r\n\r\nhello", status: refused},
	{name: "cl_list", req: desyncHead + "Content-Length: 5, 5\r\n\r\nhello", status: refused},
	{name: "cl_plus", req: desyncHead + "Content-Length: +5\r\n\r\nhello", status: refused},
	{name: "cl_negative", req: desyncHead + "Content-Length: -1\r\n\r\nhello", status: refused},
	{name: "cl_hex", req: desyncHead + "Content-Length: 0x5\r\n\r\nhello", status: refused},
	{name: "cl_empty", req: desyncHead + "Content-Length: \r\n\r\nhello", status: refused},
	{name: "cl_overflow", req: desyncHead + "Content-Length: 99999999999999999999999\r\n\r\nhello", status: refused},
	// The largest int64: fasthttp reads the start of the body before the
	// handler, meets the client's end and refuses.
	{name: "cl_max_int64", req: desyncHead + "Content-Length: 9223372036854775807\r\n\r\nhello", noProbe: true, status: refused},
	{name: "cl_leading_zeros", req: desyncHead + "Content-Length: 005\r\n\r\nhello", status: answered2, fwd: []string{fwdX, fwdProbe}},
	{name: "cl_trailing_space", req: desyncHead + "Content-Length: 5 \r\n\r\nhello", status: answered2, fwd: []string{fwdX, fwdProbe}},
	// Transfer-Encoding values: only chunked, alone, once (any case).
	{name: "te_chunked_identity", req: desyncHead + "Transfer-Encoding: chunked, identity\r\n\r\n5\r\nhello\r\n0\r\n\r\n", status: refused},
	{name: "te_identity_chunked", req: desyncHead + "Transfer-Encoding: identity, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", status: refused},
	{name: "te_gzip_chunked", req: desyncHead + "Transfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", status: refused},
	{name: "te_gzip", req: desyncHead + "Transfer-Encoding: gzip\r\n\r\nhello", status: refused},
	{name: "te_xchunked", req: desyncHead + "Transfer-Encoding: xchunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", status: refused},
	{name: "te_empty", req: desyncHead + "Transfer-Encoding: \r\n\r\nhello", status: refused},
	{name: "te_vtab_value", req: desyncHead + "Transfer-Encoding: chunked\x0b\r\n\r\n5\r\nhello\r\n0\r\n\r\n", status: refused},
	// identity is no coding (RFC 9112 §6.1: chunked not final, 400):
	// ignored, the body was the next request (the probe, smuggled).
	{name: "te_identity", req: desyncHead + "Transfer-Encoding: identity\r\n\r\n", status: refused},
	{name: "te_identity_cl", req: desyncHead + "Transfer-Encoding: identity\r\nContent-Length: 5\r\n\r\nhello", status: refused},
	{name: "te_capital_chunked", req: desyncHead + "Transfer-Encoding: Chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", status: answered2, fwd: []string{fwdX, fwdProbe}},
	{name: "te_tab_before_value", req: desyncHead + "Transfer-Encoding:\tchunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", status: answered2, fwd: []string{fwdX, fwdProbe}},
	{name: "two_te_lines", req: desyncHead + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", status: refused},
	{name: "two_te_identity_chunked", req: desyncHead + "Transfer-Encoding: identity\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", status: refused},
	// Field names.
	{name: "te_space_before_colon", req: desyncHead + "Transfer-Encoding : chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", status: refused},
	{name: "cl_space_before_colon", req: desyncHead + "Content-Length : 5\r\n\r\nhello", status: refused},
	{name: "te_vtab_in_name", req: desyncHead + "Transfer-Encoding\x0b: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", status: refused},
	{name: "cl_vtab_in_name", req: desyncHead + "Content-Length\x0b: 5\r\n\r\nhello", status: refused},
	// Not a framing field to anyone: forwarded as an ordinary field (h11
	// takes the underscore as a token character), the request has no
	// body, and the chunk bytes are the client's next request, which
	// pinboard cannot parse.
	{name: "te_underscore_name", req: desyncHead + "Transfer_Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", noProbe: true,
		status: []int{200, 400}, fwd: []string{"/counters/a/x "}},
	// obs-fold (RFC 9112 §5.2): in a framing field, or first, refused; in
	// another field unfolded to one line with a space.
	{name: "te_obs_fold", req: desyncHead + "Transfer-Encoding: identity\r\n chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", status: refused},
	// A framing value folded onto the next line, the first one empty:
	// fasthttp unfolds it and frames by it; an edge that does not sees no
	// body, and the chunks would be its next request. Refused, as nginx
	// refuses it.
	{name: "te_fold_empty_first_line", req: desyncHead + "Transfer-Encoding:\r\n chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", status: refused},
	{name: "te_fold_tab", req: desyncHead + "Transfer-Encoding:\r\n\tchunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", status: refused},
	{name: "te_fold_two_lines", req: desyncHead + "Transfer-Encoding:\r\n \r\n chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", status: refused},
	{name: "cl_fold_empty_first_line", req: desyncHead + "Content-Length:\r\n 5\r\n\r\nhello", status: refused},
	{name: "cl_fold_zero_smuggles", req: desyncHead + "Content-Length:\r\n 0\r\n\r\n", status: refused},
	{name: "obs_fold_first_line", req: "POST /counters/a/x HTTP/1.1\r\n Transfer-Encoding: chunked\r\nHost: pb\r\nContent-Length: 5\r\n\r\nhello", status: refused},
	{name: "obs_fold_hides_te", req: desyncHead + "X-A: a\r\n Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\nhello", status: answered2, fwd: []string{fwdX, fwdProbe}},
	// Line ends: a bare LF ends a line (RFC 9112 §2.2 allows it) and the
	// worker gets CRLF; a bare CR anywhere is refused.
	{name: "bare_lf_request", req: "POST /counters/a/x HTTP/1.1\nHost: pb\nContent-Length: 5\n\nhello", status: answered2, fwd: []string{fwdX, fwdProbe}},
	{name: "bare_lf_header", req: desyncHead + "X-A: a\nContent-Length: 5\r\n\r\nhello", status: answered2, fwd: []string{fwdX, fwdProbe}},
	{name: "bare_lf_cl_te", req: desyncHead + "X-A: a\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\nhello", status: refused},
	{name: "cr_in_value", req: desyncHead + "X-A: a\rTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\nhello", status: refused},
	{name: "cr_in_te_value", req: desyncHead + "Transfer-Encoding: chunked\r\r\nContent-Length: 5\r\n\r\nhello", status: refused},
	{name: "nul_in_value", req: desyncHead + "X-A: a\x00b\r\nContent-Length: 5\r\n\r\nhello", status: refused},
	// Chunk sizes: the body streams, so the header is out before a bad
	// chunk is read; the worker's connection is then closed on a request
	// it never got whole.
	{name: "chunk_extension", req: desyncHead + chunked("5;a=b\r\nhello\r\n0\r\n\r\n"), status: answered2, fwd: []string{fwdX, fwdProbe}},
	{name: "chunk_size_space", req: desyncHead + chunked("5 \r\nhello\r\n0\r\n\r\n"), status: answered2, fwd: []string{fwdX, fwdProbe}},
	{name: "chunk_0x", req: desyncHead + chunked("0x5\r\nhello\r\n0\r\n\r\n"), status: refused, fwd: []string{fwdCut}},
	{name: "chunk_overflow", req: desyncHead + chunked("10000000000000005\r\nhello\r\n0\r\n\r\n"), status: refused, fwd: []string{fwdCut}},
	{name: "chunk_negative", req: desyncHead + chunked("-5\r\nhello\r\n0\r\n\r\n"), status: refused, fwd: []string{fwdCut}},
	{name: "chunk_bare_lf", req: desyncHead + chunked("5\nhello\n0\n\n"), status: refused, fwd: []string{fwdCut}},
	{name: "chunk_bare_cr", req: desyncHead + chunked("5\r\nhello\r0\r\n\r\n"), status: refused, fwd: []string{fwdCut}},
	{name: "chunk_extension_lf", req: desyncHead + chunked("5;a=\"b\nc\"\r\nhello\r\n0\r\n\r\n"), status: refused, fwd: []string{fwdCut}},
	// Trailers: never forwarded; framing fields in them refused.
	{name: "trailer_plain", req: desyncHead + chunked("5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n"), status: answered2, fwd: []string{fwdX, fwdProbe}},
	{name: "trailer_cl", req: desyncHead + chunked("5\r\nhello\r\n0\r\nContent-Length: 50\r\n\r\n"), status: refused, fwd: []string{fwdCut}},
	{name: "trailer_te", req: desyncHead + chunked("5\r\nhello\r\n0\r\nTransfer-Encoding: chunked\r\n\r\n"), status: refused, fwd: []string{fwdCut}},
	// HTTP/1.0 has no chunked coding (RFC 9112 §6.1).
	{name: "http10_te", req: "POST /counters/a/x HTTP/1.0\r\nHost: pb\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", status: refused},
	{name: "http10_te_cl", req: "POST /counters/a/x HTTP/1.0\r\nHost: pb\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\nhello", status: refused},
	// The node's own paths take no body through an ambiguous framing
	// either: the probe behind it would be the smuggled request.
	{name: "livez_te_identity", req: "GET /livez HTTP/1.1\r\nHost: pb\r\nTransfer-Encoding: identity\r\n\r\n", status: refused},
	{name: "connect_te_identity", req: "CONNECT pb:443 HTTP/1.1\r\nHost: pb:443\r\nTransfer-Encoding: identity\r\n\r\n", status: refused},
	{name: "outside_path_te_identity", req: "GET /x HTTP/1.1\r\nHost: pb\r\nTransfer-Encoding: identity\r\n\r\n", status: refused},
	{name: "registry_cl_te", req: "POST /registry/heartbeat HTTP/1.1\r\nHost: pb\r\nContent-Length: 3\r\n" + chunked("0\r\n\r\n"), status: refused},
	// An absolute-form target goes in origin form: httptools' parse_url
	// drops its scheme and authority, h11 keeps them in the path.
	{name: "target_absolute_form", req: "POST http://pb/counters/a/x HTTP/1.1\r\nHost: pb\r\nContent-Length: 5\r\n\r\nhello", status: answered2, fwd: []string{fwdX, fwdProbe}},
	// A GET may carry a chunked body: it goes as it came.
	{name: "get_chunked", req: "GET /counters/a/x HTTP/1.1\r\nHost: pb\r\n" + chunked("5\r\nhello\r\n0\r\n\r\n"), status: answered2, fwd: []string{"/counters/a/x hello", fwdProbe}},
}

func TestRequestDesyncMatrix_RDP1_RDP4(t *testing.T) {
	w, addr := desyncNode(t)
	got := make([][]wireConn, len(desyncCases))
	for i, tc := range desyncCases {
		t.Run(tc.name, func(t *testing.T) {
			req := tc.req
			if !tc.noProbe {
				req += desyncProbe
			}
			answers := desyncExchange(t, addr, req)
			got[i] = w.settle()
			checkAnswers(t, answers, tc.status)
			var fwd []string
			for _, c := range got[i] {
				reqs, err := parseForwarded(c.b)
				if err != nil {
					t.Errorf("unexpected framing of the bytes the worker got: %v\n%q", err, c.b)
				}
				if n := len(reqs); n > 0 && strings.HasSuffix(reqs[n-1], "<incomplete>") && !c.closed {
					t.Errorf("unexpected worker connection left open after a request cut short\n%q", c.b)
				}
				fwd = append(fwd, reqs...)
			}
			if !equalStrings(fwd, tc.fwd) {
				t.Errorf("unexpected requests at the worker; got %q; want %q\nbytes: %v", fwd, tc.fwd, got[i])
			}
		})
	}
	t.Run("h11", func(t *testing.T) { checkWorkerParser(t, got, "h11", h11Script) })
	t.Run("httptools", func(t *testing.T) { checkWorkerParser(t, got, "httptools", httptoolsScript) })
}

// checkWorkerParser feeds what the worker got to one of uvicorn's HTTP
// parsers, its Python module named by parser, and requires it to read
// the same requests pinboard meant: h11, what plain `pip install uvicorn`
// runs (pinned's own dependencies), and httptools (llhttp), what
// uvicorn[standard] runs by default. It runs when PINBOARD_REF_PYTHON
// names a Python with the module (one process for every case, bounded at
// 30 s); tools/e2e/requirements.txt installs both.
func checkWorkerParser(t *testing.T, got [][]wireConn, parser, script string) {
	py := os.Getenv("PINBOARD_REF_PYTHON")
	if py == "" {
		t.Skip("PINBOARD_REF_PYTHON not set")
	}
	if err := exec.Command(py, "-c", "import "+parser).Run(); err != nil {
		t.Skipf("PINBOARD_REF_PYTHON=%s cannot import %s: %v", py, parser, err)
	}
	var in [][]string
	for _, conns := range got {
		var cs []string
		for _, c := range conns {
			cs = append(cs, base64.StdEncoding.EncodeToString(c.b))
		}
		in = append(in, cs)
	}
	stdin, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "-c", script)
	cmd.Stdin = bytes.NewReader(stdin)
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		t.Fatalf("cannot run %s: %v", parser, err)
	}
	var res [][]string
	if err := json.Unmarshal(out, &res); err != nil || len(res) != len(desyncCases) {
		t.Fatalf("unexpected %s output %q: %v", parser, out, err)
	}
	for i, tc := range desyncCases {
		if !equalStrings(res[i], tc.fwd) {
			t.Errorf("%s: unexpected requests read by %s; got %q; want %q", tc.name, parser, res[i], tc.fwd)
		}
	}
}

// h11Script reads, per case, each worker connection's bytes as uvicorn's
// h11 server connection would (answering each request before the next),
// and prints what it read in parseForwarded's notation.
const h11Script = `
import base64, json, sys, h11
out = []
for conns in json.load(sys.stdin):
    reqs = []
    for raw in conns or []:
        conn = h11.Connection(h11.SERVER)
        conn.receive_data(base64.b64decode(raw))
        target, body = None, b""
        try:
            while True:
                ev = conn.next_event()
                if ev is h11.NEED_DATA:
                    if target is not None:
                        reqs.append(target + " <incomplete>")
                    elif conn.trailing_data[0]:
                        reqs.append("<leftover %r>" % conn.trailing_data[0])
                    break
                if isinstance(ev, h11.Request):
                    target, body = ev.target.decode(), b""
                elif isinstance(ev, h11.Data):
                    body += ev.data
                elif isinstance(ev, h11.EndOfMessage):
                    reqs.append(target + " " + body.decode("latin-1"))
                    target = None
                    conn.send(h11.Response(status_code=200, headers=[("content-length", "0")]))
                    conn.send(h11.EndOfMessage())
                    conn.start_next_cycle()
        except h11.RemoteProtocolError as e:
            reqs.append("<error %s>" % e)
    out.append(reqs)
json.dump(out, sys.stdout)
`

// httptoolsScript is h11Script for uvicorn's HttpToolsProtocol: an
// httptools.HttpRequestParser with the leniency uvicorn sets, each
// request's target read as uvicorn builds scope["path"] and
// scope["query_string"] from it (httptools.parse_url: a '#' ends the path,
// an absolute form loses its scheme and authority).
const httptoolsScript = `
import base64, json, sys, httptools

class Reader:
    def __init__(self, reqs):
        self.reqs, self.target, self.url, self.body = reqs, None, b"", b""
    def on_message_begin(self):
        self.target, self.url, self.body = None, b"", b""
    def on_url(self, url):
        self.url += url
    def on_headers_complete(self):
        u = httptools.parse_url(self.url)
        self.target = u.path.decode("latin-1") + ("?" + u.query.decode("latin-1") if u.query else "")
    def on_body(self, body):
        self.body += body
    def on_message_complete(self):
        self.reqs.append(self.target + " " + self.body.decode("latin-1"))
        self.target, self.url = None, b""

out = []
for conns in json.load(sys.stdin):
    reqs = []
    for raw in conns or []:
        r = Reader(reqs)
        p = httptools.HttpRequestParser(r)
        try:
            p.set_dangerous_leniencies(lenient_data_after_close=True)
        except AttributeError:
            pass
        try:
            p.feed_data(base64.b64decode(raw))
        except httptools.HttpParserUpgrade:
            reqs.append("<upgrade>")
            continue
        except httptools.HttpParserError as e:
            reqs.append("<error %s>" % e)
            continue
        if r.target is not None:
            reqs.append(r.target + " <incomplete>")
        elif r.url:
            reqs.append("<leftover %r>" % r.url)
    out.append(reqs)
json.dump(out, sys.stdout)
`

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

type desyncAnswer struct {
	status int
	ctype  string
	body   string
	close  bool
}

// desyncExchange writes req on a fresh connection, half-closes it and
// reads every answer until pinboard closes (5 s at most).
func desyncExchange(t *testing.T, addr, req string) []desyncAnswer {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	_ = c.(*net.TCPConn).CloseWrite()
	br := bufio.NewReader(c)
	var answers []desyncAnswer
	for {
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Errorf("unexpected error reading answers after %d: %v", len(answers), err)
			}
			return answers
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		answers = append(answers, desyncAnswer{res.StatusCode, res.Header.Get("Content-Type"), string(b), res.Close})
	}
}

// checkAnswers requires the statuses in order; a 400 must be JSON with an
// error and close the connection.
func checkAnswers(t *testing.T, answers []desyncAnswer, want []int) {
	t.Helper()
	var got []int
	for _, a := range answers {
		got = append(got, a.status)
		if a.status != 400 {
			continue
		}
		var e struct{ Error string }
		if a.ctype != "application/json" || json.Unmarshal([]byte(a.body), &e) != nil || e.Error == "" {
			t.Errorf("unexpected 400 body; got %q (%s); want a JSON error", a.body, a.ctype)
		}
		if !a.close {
			t.Errorf("unexpected 400 without Connection: close")
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("unexpected answers; got %v; want %v (%+v)", got, want, answers)
	}
}

// parseForwarded reads the bytes of one worker connection strictly, as a
// sequence of requests (RFC 9112, no leniency): CRLF line ends, no obs-fold,
// no CTL in a field, token names, exactly one of Content-Length (digits)
// or Transfer-Encoding: chunked (bare hex sizes, no extension, no
// trailer), nothing left over. A request cut short ends the list as
// "<target> <incomplete>".
func parseForwarded(b []byte) ([]string, error) {
	var reqs []string
	for len(b) > 0 {
		end := bytes.Index(b, []byte("\r\n\r\n"))
		if end < 0 {
			return reqs, fmt.Errorf("a request header cut short: %q", b)
		}
		lines := strings.Split(string(b[:end]), "\r\n")
		b = b[end+4:]
		parts := strings.Split(lines[0], " ")
		if len(parts) != 3 || parts[2] != "HTTP/1.1" {
			return reqs, fmt.Errorf("bad request line %q", lines[0])
		}
		target := parts[1]
		cl, te := -1, false
		for _, l := range lines[1:] {
			name, value, ok := strings.Cut(l, ":")
			if !ok || name == "" || strings.ContainsFunc(name, func(r rune) bool { return r <= ' ' || r >= 0x7f || strings.ContainsRune("\"(),/:;<=>?@[\\]{}", r) }) {
				return reqs, fmt.Errorf("bad field line %q", l)
			}
			if strings.ContainsFunc(value, func(r rune) bool { return (r < ' ' && r != '\t') || r == 0x7f }) {
				return reqs, fmt.Errorf("control character in %q", l)
			}
			value = strings.Trim(value, " \t")
			switch strings.ToLower(name) {
			case "content-length":
				n, err := strconv.Atoi(value)
				if cl >= 0 || err != nil || n < 0 || value != strconv.Itoa(n) {
					return reqs, fmt.Errorf("bad or second Content-Length %q", l)
				}
				cl = n
			case "transfer-encoding":
				if te || value != "chunked" {
					return reqs, fmt.Errorf("bad or second Transfer-Encoding %q", l)
				}
				te = true
			}
		}
		if te && cl >= 0 {
			return reqs, errors.New("both Content-Length and Transfer-Encoding")
		}
		var body []byte
		complete := true
		switch {
		case te:
			var err error
			body, b, complete, err = readChunked(b)
			if err != nil {
				return reqs, err
			}
		case cl >= 0:
			complete = len(b) >= cl
			n := min(cl, len(b))
			body, b = b[:n], b[n:]
		}
		if !complete {
			return append(reqs, target+" <incomplete>"), nil
		}
		reqs = append(reqs, target+" "+string(body))
	}
	return reqs, nil
}

// readChunked decodes a strict chunked body from b and returns the rest.
func readChunked(b []byte) (body, rest []byte, complete bool, err error) {
	for {
		i := bytes.Index(b, []byte("\r\n"))
		if i < 0 {
			return body, nil, false, nil
		}
		size, err := strconv.ParseUint(string(b[:i]), 16, 40)
		if err != nil || strings.ContainsAny(string(b[:i]), "+-xX") {
			return body, nil, false, fmt.Errorf("bad chunk size %q", b[:i])
		}
		b = b[i+2:]
		if size == 0 {
			if len(b) < 2 {
				return body, nil, false, nil
			}
			if string(b[:2]) != "\r\n" {
				return body, nil, false, fmt.Errorf("trailer or junk after the last chunk: %q", b)
			}
			return body, b[2:], true, nil
		}
		if uint64(len(b)) < size+2 {
			return body, nil, false, nil
		}
		if string(b[size:size+2]) != "\r\n" {
			return body, nil, false, fmt.Errorf("chunk of %d not followed by CRLF: %q", size, b)
		}
		body, b = append(body, b[:size]...), b[size+2:]
	}
}

// desyncWorker stands in for a worker on 127.0.0.1: it records the bytes
// of every connection and answers each request it can read 200.
type desyncWorker struct {
	mu    sync.Mutex
	conns []*wireRec
}

type wireRec struct {
	b      bytes.Buffer
	taken  int
	closed bool // the peer closed (or the read failed)
	seen   bool // closed was reported
}

// wireConn is what one connection brought since the last settle.
type wireConn struct {
	b      []byte
	closed bool
}

func (c wireConn) String() string { return fmt.Sprintf("%q (closed %v)", c.b, c.closed) }

// acceptEach runs each on its own goroutine for every connection ln
// accepts, until ln closes.
func acceptEach(ln net.Listener, each func(c net.Conn)) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go each(c)
	}
}

// acceptRecorded is acceptEach keeping a record of each connection: a
// new one, appended to *recs under mu, goes to handle with it.
func acceptRecorded[R any](ln net.Listener, mu *sync.Mutex, recs *[]*R, handle func(net.Conn, *R)) {
	acceptEach(ln, func(c net.Conn) {
		rec := new(R)
		mu.Lock()
		*recs = append(*recs, rec)
		mu.Unlock()
		handle(c, rec)
	})
}

func (w *desyncWorker) serve(ln net.Listener) { acceptRecorded(ln, &w.mu, &w.conns, w.conn) }

func (w *desyncWorker) conn(c net.Conn, rec *wireRec) {
	defer c.Close()
	r := &recReader{c: c, w: w, rec: rec}
	br := bufio.NewReader(r)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			// Keep recording until the peer closes.
			_, _ = io.Copy(io.Discard, br)
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
			return
		}
	}
}

type recReader struct {
	c   net.Conn
	w   *desyncWorker
	rec *wireRec
}

func (r *recReader) Read(p []byte) (int, error) {
	_ = r.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := r.c.Read(p)
	r.w.mu.Lock()
	r.rec.b.Write(p[:n])
	if err != nil {
		r.rec.closed = true
	}
	r.w.mu.Unlock()
	return n, err
}

// settle waits until nothing new has come for 100 ms (3 s at most) and
// returns what each connection brought since the last settle.
func (w *desyncWorker) settle() []wireConn {
	last, quiet := -1, 0
	for deadline := time.Now().Add(3 * time.Second); quiet < 10 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		w.mu.Lock()
		n := 0
		for _, r := range w.conns {
			n += r.b.Len()
			if r.closed {
				n++
			}
		}
		w.mu.Unlock()
		if n == last {
			quiet++
		} else {
			last, quiet = n, 0
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []wireConn
	for _, r := range w.conns {
		if r.b.Len() > r.taken || (r.closed && !r.seen && r.taken > 0) {
			out = append(out, wireConn{b: bytes.Clone(r.b.Bytes()[r.taken:]), closed: r.closed})
		}
		r.taken = r.b.Len()
		r.seen = r.closed
	}
	return out
}

// desyncNode is a node on the memory store, past its cold-start
// quarantine, with a desyncWorker serving /counters; it returns the worker
// and the node's host:port.
func desyncNode(t *testing.T) (*desyncWorker, string) {
	t.Helper()
	w := &desyncWorker{}
	return w, rawWorkerNode(t, w.serve, proxy.UpstreamOptions{IdleTimeout: time.Minute})
}

// rawWorkerNode starts a worker, serve, on a listener of its own on
// 127.0.0.1, closed when the test ends, and a node in front of it
// (nodeFor); it returns the node's public host:port.
func rawWorkerNode(t *testing.T, serve func(net.Listener), up proxy.UpstreamOptions) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go serve(ln)
	_, addr := nodeFor(t, ln.Addr().String(), up)
	return addr
}

// nodeFor is a node on the memory store, past its cold-start quarantine
// (which began and ended two leases ago; the worker's lease runs from now
// on the real clock), with the worker at workerAddr serving /counters; it
// returns the node and its public host:port.
func nodeFor(t *testing.T, workerAddr string, up proxy.UpstreamOptions) (*Pinboard, string) {
	t.Helper()
	pp, err := attest.ParsePassport([]byte(`{"providers":[{"type":"staticToken","id":"p","keys":[{"name":"k","token":{"env":"T"},"scopes":["pinboard:operator"],"claims":{"pinboard":{"namespaces":["*"]}}}]}],"namespaces":{"*":{"allow":"anonymous"}}}`),
		func(string) (string, bool) { return "tok", true })
	if err != nil {
		t.Fatal(err)
	}
	lease := time.Minute
	born := time.Now().Add(-2 * lease)
	store := directory.NewMemory(lease, born)
	_, _ = store.Place(t.Context(), &directory.PlaceRequest{NS: "/warm", ID: "x", Now: born})
	if _, err := store.Register(t.Context(), &directory.Registration{
		ClientID: "w", Sub: "p:w", Secret: "s", Namespaces: []string{"/counters"}, AdvertiseURL: "http://" + workerAddr, Headroom: 1,
	}, time.Now()); err != nil {
		t.Fatal(err)
	}
	pb, err := New(Options{Store: store, Passport: pp, Upstream: up})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveUntilStopped(t, pb, ln, time.Second)
	return pb, ln.Addr().String()
}
