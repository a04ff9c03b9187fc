package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// A field sent on several lines reaches the worker with its lines in the
// order the client sent them (RFC 9110 §5.3: "A proxy MUST NOT change the
// order of these field line values when forwarding a message"), whatever
// pinboard removes around them. fasthttp deletes a header by moving the
// last line into its place, so removing a browser's leading
// "Connection: keep-alive" (or a consumed Authorization, a pinboard-*
// header) swapped the last lines of a repeated field: the worker read
// tracestate, Via or a trusted proxy's Forwarded lines last first
// (R-DP-1).
func TestFieldOrderKept_RDP1(t *testing.T) {
	// The passport that consumes a client's "Bearer tok-A" (R-TR-4).
	raw := `{"providers":[{"type":"staticToken","id":"p","keys":[
		{"name":"a","token":{"env":"A"},"scopes":["pinboard:worker"],"claims":{"pinboard":{"namespaces":["*"],"allowedBackendHosts":["*"]}}}
	]}],"namespaces":{"*":{"allow":"authenticated"}}}`
	pp := tokPassport(t, raw)
	for name, lead := range map[string]string{
		"connection":    "Connection: keep-alive\r\n",
		"keep_alive":    "Keep-Alive: timeout=5\r\n",
		"reserved":      "Pinboard-Attestation: forged\r\n",
		"te":            "TE: trailers\r\n",
		"named":         "Connection: X-Hop\r\nX-Hop: 1\r\n",
		"forwarded":     "X-Forwarded-For: 10.0.0.1\r\nX-Forwarded-For: 10.0.0.2\r\n",
		"proto_twice":   "X-Forwarded-Proto: https\r\nX-Forwarded-Proto: http\r\n",
		"rfc_forwarded": "Forwarded: for=10.0.0.1\r\n",
		"real_ip":       "X-Real-IP: 10.0.0.1\r\n",
		"underscore":    "X_Real_IP: 10.0.0.1\r\n",
		"credential":    "Authorization: Bearer tok-A\r\n",
		"nothing_taken": "",
	} {
		t.Run(name, func(t *testing.T) {
			var opts func(*Options)
			if name == "credential" {
				opts = func(o *Options) { o.Passport = pp }
			}
			rg, cl := newCapRig(t, opts)
			req := "GET /counters/alice/x HTTP/1.1\r\nHost: a\r\n" + lead +
				"Tracestate: a=1\r\nVia: 1.1 p1\r\nX-Y: 1\r\nTracestate: b=2\r\nX-Folded: f1\r\n f2\r\nVia: 1.1 p2\r\nX-Folded: f3\r\nTracestate: c=3\r\n\r\n"
			if got := rg.raw(req, 10*time.Second); !strings.HasPrefix(got, "HTTP/1.1 200 ") {
				t.Fatalf("unexpected answer; got %q; want 200", got)
			}
			wire := cl.String()
			for field, want := range map[string][]string{
				"Tracestate": {"a=1", "b=2", "c=3"},
				"Via":        {"1.1 p1", "1.1 p2"},
				"X-Folded":   {"f1 f2", "f3"},
				"X-Y":        {"1"},
			} {
				if got := headerValues(t, wire, field); strings.Join(got, "|") != strings.Join(want, "|") {
					t.Errorf("unexpected %s lines at the worker; got %q; want %q\n%q", field, got, want, wire)
				}
			}
		})
	}
}

// The order is put back without an allocation once the request's scratch
// space is warm, when the header has no repeated field as when it has.
func TestKeepFieldOrderAllocatesNothing_RDP1(t *testing.T) {
	skipUnderRace(t)
	for name, raw := range map[string]string{
		"no_repeat": "GET /counters/alice/x HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\nAccept: */*\r\nX-Y: 1\r\n\r\n",
		"repeat":    "GET /counters/alice/x HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\nVia: a\r\nX-Y: 1\r\nVia: b\r\n\r\n",
	} {
		t.Run(name, func(t *testing.T) {
			var req fasthttp.Request
			if err := req.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
				t.Fatal(err)
			}
			rq := &request{}
			stripRequestHop(&req.Header, rq, hopFound(req.Header.All()), false)
			once := func() {
				rq.order.edited = true // as after the deletion above
				keepFieldOrder(&req.Header, rq)
			}
			once()
			if n := testing.AllocsPerRun(200, once); n != 0 {
				t.Fatalf("unexpected allocations; got %v; want 0", n)
			}
			if got := req.Header.PeekAll("Via"); name == "repeat" && (len(got) != 2 || string(got[0]) != "a" || string(got[1]) != "b") {
				t.Fatalf("unexpected Via lines; got %q; want [a b]", got)
			}
		})
	}
}

// A request with more repeated fields than maxStripped is refused, as
// one naming too many headers to strip is: each field put back in order
// after an edit costs a pass over the header. The refusal comes with the
// header's other checks, before the id is resolved: a new id is left
// unplaced. Exactly maxStripped of them go through, in order.
func TestTooManyRepeatedFieldsRefused_RDP1(t *testing.T) {
	repeated := func(n int) string {
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, "X-R-%d: a\r\nX-R-%d: b\r\n", i, i)
		}
		return b.String()
	}
	rg, cl := newCapRig(t, nil)
	rg.warm() // serveIDs moved the clock back: new ids may be placed
	for _, id := range []string{"alice", "bob"} {
		got := rg.raw("GET /counters/"+id+"/x HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\n"+repeated(maxStripped+1)+"\r\n", 10*time.Second)
		if !strings.HasPrefix(got, "HTTP/1.1 400 ") || !strings.Contains(got, `{"error":"too many header fields sent on several lines"}`) {
			t.Fatalf("unexpected answer for %s; got %q; want 400 too many header fields sent on several lines", id, got)
		}
	}
	if wire := cl.String(); wire != "" {
		t.Fatalf("unexpected request at the worker: %q", wire)
	}
	if _, ok := rg.store.Lookup([]byte("/counters"), []byte("bob"), rg.now()); ok {
		t.Fatalf("unexpected placement of bob, whose only request was refused")
	}
	got := rg.raw("GET /counters/carol/x HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\n"+repeated(maxStripped)+"\r\n", 10*time.Second)
	if !strings.HasPrefix(got, "HTTP/1.1 200 ") {
		t.Fatalf("unexpected answer with %d repeated fields; got %q; want 200", maxStripped, got)
	}
	if v := headerValues(t, cl.String(), "X-R-7"); len(v) != 2 || v[0] != "a" || v[1] != "b" {
		t.Fatalf("unexpected X-R-7 lines at the worker; got %q; want [a b]", v)
	}
}

// TestRepeatsAgreesWithFindRuns_RDP1: findRuns skips its sort when
// repeats finds no name on several lines; repeats must never say so of a
// header in which the sort (sortRuns) finds a run, or a repeated field's
// order would go unrepaired (R-DP-1). Cookie lines are no run; past
// repeatsScan lines repeats defers to the sort.
func TestRepeatsAgreesWithFindRuns_RDP1(t *testing.T) {
	many := func(n int, dup bool) string {
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, "X-F%d: v\r\n", i)
		}
		if dup {
			b.WriteString("X-F0: w\r\n")
		}
		return b.String()
	}
	for name, tc := range map[string]struct {
		lines string
		want  bool
	}{
		"browser":          {"User-Agent: m\r\nAccept: */*\r\nAccept-Language: en\r\nTraceparent: 00\r\n", false},
		"repeated":         {"Tracestate: a=1\r\nVia: p1\r\nTracestate: b=2\r\n", true},
		"case_folded":      {"tracestate: a=1\r\nTRACESTATE: b=2\r\n", true},
		"same_length":      {"X-Aa: 1\r\nX-Bb: 2\r\nX-Cc: 3\r\n", false},
		"cookies_only":     {"Cookie: a=1\r\nCookie: b=2\r\n", false},
		"cookies_and_via":  {"Cookie: a=1\r\nVia: p1\r\nCookie: b=2\r\nVia: p2\r\n", true},
		"user_agent_twice": {"User-Agent: a\r\nUser-Agent: b\r\n", false}, // fasthttp keeps one User-Agent
		"last_repeats":     {many(repeatsScan-3, true), true},
		"long_distinct":    {many(repeatsScan+5, false), true}, // deferred: sortRuns finds none
		"long_repeated":    {many(repeatsScan+5, true), true},
	} {
		t.Run(name, func(t *testing.T) {
			var req fasthttp.Request
			raw := "GET /counters/alice/x HTTP/1.1\r\nHost: a\r\n" + tc.lines + "\r\n"
			if err := req.Header.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
				t.Fatal(err)
			}
			var fo fieldOrder
			fo.sortRuns(&req.Header)
			got := repeats(&req.Header)
			if got != tc.want || (!got && len(fo.runs) > 0) {
				t.Fatalf("unexpected answer; got repeats %v with %d runs; want %v", got, len(fo.runs), tc.want)
			}
		})
	}
}

// BenchmarkBrowserHeaderEdits: what a browser's request costs pinboard's
// header edits — its Connection: keep-alive deleted, then the order of
// repeated fields checked (keepFieldOrder), with none repeated and with
// two repeated fields (tracestate, Accept-Language), one line moved.
func BenchmarkBrowserHeaderEdits(b *testing.B) {
	const base = "GET /counters/alice/x HTTP/1.1\r\nHost: pinboard.test\r\nConnection: keep-alive\r\n" +
		"User-Agent: Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36\r\nAccept: text/html,application/xhtml+xml\r\n" +
		"Accept-Encoding: gzip, deflate, br\r\nSec-Fetch-Mode: navigate\r\nSec-Fetch-Site: none\r\n" +
		"Upgrade-Insecure-Requests: 1\r\nCache-Control: max-age=0\r\nTraceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n"
	for name, extra := range map[string]string{
		"no_repeat": "Accept-Language: en\r\nTracestate: a=1\r\n",
		"repeat":    "Accept-Language: en\r\nTracestate: a=1\r\nAccept-Language: fr\r\nTracestate: b=2\r\n",
	} {
		for _, edits := range []int{0, 1, 2} {
			b.Run(fmt.Sprintf("%s/edits=%v", name, edits), func(b *testing.B) {
				raw := base + extra + "\r\n"
				var req fasthttp.Request
				rq := &request{}
				sr := strings.NewReader(raw)
				br := bufio.NewReader(sr)
				b.ReportAllocs()
				for b.Loop() {
					sr.Reset(raw)
					br.Reset(sr)
					if err := req.Header.Read(br); err != nil {
						b.Fatal(err)
					}
					if edits > 0 {
						stripRequestHop(&req.Header, rq, hopFound(req.Header.All()), false)
					}
					if edits > 1 {
						keepFieldOrder(&req.Header, rq)
					}
					req.Header.Reset()
				}
			})
		}
	}
}

// A trusted proxy's X-Forwarded-For lines are joined in the order it sent
// them, and its last X-Forwarded-Proto and -Host lines are the ones kept,
// whatever pinboard deleted first: the lines are read before a deletion
// moves the header's last line into the gap. Before, a browser's
// Connection: keep-alive deleted ahead of them sent the last For line to
// the front of the list (the client IP a worker's proxy-headers
// middleware reads from it moved), and an earlier Proto line was kept as
// the last (R-DP-1, R-PL-4).
func TestTrustedForwardedReadInClientOrder_RDP1_RPL4(t *testing.T) {
	tails := map[string]string{ // each field's last line last in the header
		"for":   "X-Forwarded-Host: last\r\nX-Forwarded-Proto: https\r\nX-Forwarded-For: 3.3.3.3\r\n",
		"proto": "X-Forwarded-For: 3.3.3.3\r\nX-Forwarded-Host: last\r\nX-Forwarded-Proto: https\r\n",
		"host":  "X-Forwarded-Proto: https\r\nX-Forwarded-For: 3.3.3.3\r\nX-Forwarded-Host: last\r\n",
	}
	for name, lead := range map[string]string{
		"connection": "Connection: keep-alive\r\n",
		"reserved":   "Pinboard-Epoch: 9\r\n",
		"credential": "Authorization: Bearer " + clientToken + "\r\n",
	} {
		for tail, lines := range tails {
			t.Run(name+"/"+tail, func(t *testing.T) {
				rg, cl := newCapRig(t, func(o *Options) {
					tp, err := ParseTrustedProxies("127.0.0.1")
					if err != nil {
						t.Fatal(err)
					}
					o.TrustedProxies = tp
				})
				req := "GET /counters/alice/x HTTP/1.1\r\nHost: a\r\n" + lead +
					"X-Forwarded-For: 1.1.1.1\r\nX-Forwarded-Proto: http\r\nX-Forwarded-Host: first\r\nX-Forwarded-For: 2.2.2.2\r\nX-Y: 1\r\n" +
					lines + "\r\n"
				if got := rg.raw(req, 10*time.Second); !strings.HasPrefix(got, "HTTP/1.1 200 ") {
					t.Fatalf("unexpected answer; got %q; want 200", got)
				}
				wire := cl.String()
				for field, want := range map[string]string{
					"X-Forwarded-For":   "1.1.1.1, 2.2.2.2, 3.3.3.3, 127.0.0.1",
					"X-Forwarded-Proto": "https",
					"X-Forwarded-Host":  "last",
				} {
					if got := headerValues(t, wire, field); strings.Join(got, "|") != want {
						t.Errorf("unexpected %s at the worker; got %q; want %q\n%q", field, got, want, wire)
					}
				}
			})
		}
	}
}

// A worker's answer reaches the client with the lines of each field sent
// more than once in the order the worker sent them (RFC 9110 §5.3), also
// when pinboard removes hop-by-hop lines from it: the same move of the
// header's last line into a deleted one's place sent a worker's Link
// preloads, WWW-Authenticate challenges or Cache-Control lines last
// first. A worker whose server (Node, Apache) or sidecar (nginx) answers
// with Connection: keep-alive had every such answer reordered (R-DP-1).
func TestResponseFieldOrderKept_RDP1(t *testing.T) {
	for name, lead := range map[string]string{
		"connection":    "Connection: keep-alive\r\n",
		"keep_alive":    "Keep-Alive: timeout=5\r\n",
		"named":         "Connection: X-Hop\r\nX-Hop: 1\r\n",
		"trailer":       "Trailer: X-Sum\r\n",
		"nothing_taken": "",
	} {
		t.Run(name, func(t *testing.T) {
			rg := newRig(t, nil)
			rg.warm()
			w, _ := rawRequestWorker(t, func(c net.Conn, r *http.Request) bool {
				_, _ = io.WriteString(c, "HTTP/1.1 401 Unauthorized\r\n"+lead+
					"Link: </a.css>; rel=preload\r\nWww-Authenticate: Negotiate\r\nX-Y: 1\r\nLink: </b.js>; rel=preload\r\n"+
					"Cache-Control: no-store\r\nSet-Cookie: a=1\r\nWww-Authenticate: Basic realm=\"w\"\r\nSet-Cookie: b=2\r\n"+
					"Link: </c.png>; rel=preload\r\nCache-Control: private\r\nContent-Length: 2\r\n\r\nno")
				return true
			})
			rg.serveIDs(t, w, "alice")
			wire := rg.raw("GET /counters/alice/x HTTP/1.1\r\nHost: a\r\n\r\n", 10*time.Second)
			res, err := http.ReadResponse(bufio.NewReader(strings.NewReader(wire)), nil)
			if err != nil || res.StatusCode != http.StatusUnauthorized {
				t.Fatalf("unexpected answer; got %q (%v); want the worker's 401", wire, err)
			}
			for field, want := range map[string][]string{
				"Link":             {"</a.css>; rel=preload", "</b.js>; rel=preload", "</c.png>; rel=preload"},
				"Www-Authenticate": {"Negotiate", `Basic realm="w"`},
				"Cache-Control":    {"no-store", "private"},
				"Set-Cookie":       {"a=1", "b=2"},
				"X-Y":              {"1"},
			} {
				if got := res.Header.Values(field); strings.Join(got, "|") != strings.Join(want, "|") {
					t.Errorf("unexpected %s lines at the client; got %q; want %q\n%q", field, got, want, wire)
				}
			}
			for _, hop := range []string{"Keep-Alive", "X-Hop", "Trailer"} {
				if v := res.Header.Values(hop); len(v) != 0 {
					t.Errorf("unexpected hop-by-hop %s at the client; got %q", hop, v)
				}
			}
		})
	}
}

// Removing a worker's Connection: keep-alive from an answer with no field
// on several lines costs no allocation (the slow path is for answers that
// have one).
func TestStripResponseHopAllocatesNothing_RDP1(t *testing.T) {
	skipUnderRace(t)
	const raw = "HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\nContent-Type: application/json\r\n" +
		"Set-Cookie: a=1\r\nSet-Cookie: b=2\r\nCache-Control: no-store\r\nVary: Accept\r\nContent-Length: 2\r\n\r\n"
	var h fasthttp.ResponseHeader
	sr := strings.NewReader(raw)
	br := bufio.NewReader(sr)
	allocs := testing.AllocsPerRun(100, func() {
		sr.Reset(raw)
		br.Reset(sr)
		if err := h.Read(br); err != nil {
			t.Fatal(err)
		}
		stripResponseHop(&h)
		h.Reset()
	})
	if allocs != 0 {
		t.Fatalf("unexpected allocations; got %v; want 0", allocs)
	}
}

// A hop-by-hop field sent on several lines is removed whole, and the
// order repair does not put it back, in a request as in an answer: the
// request's repair reads the client's raw lines (AllInOrder), which still
// hold it, and the answer's copies its lines before stripHop deletes it;
// each rewrites only the repeated fields still there once stripping is
// done (keepFieldOrder, stripResponseHopInOrder). The repeated field
// around them keeps its order (R-DP-1).
func TestRepeatedHopFieldStaysRemoved_RDP1(t *testing.T) {
	const lines = "Connection: X-Hop\r\nX-Hop: 1\r\nVia: a\r\nX-Hop: 2\r\nKeep-Alive: x\r\nKeep-Alive: y\r\nVia: b\r\nX-Y: 1\r\nVia: c\r\n"
	check := func(side string, peekAll func(string) [][]byte) {
		t.Helper()
		for _, hop := range []string{"Connection", "X-Hop", "Keep-Alive"} {
			if got := peekAll(hop); len(got) != 0 {
				t.Errorf("unexpected %s lines in the %s; got %q; want none", hop, side, got)
			}
		}
		if got := peekAll("Via"); len(got) != 3 || string(got[0]) != "a" || string(got[1]) != "b" || string(got[2]) != "c" {
			t.Errorf("unexpected Via lines in the %s; got %q; want [a b c]", side, got)
		}
	}

	var req fasthttp.Request
	if err := req.Header.Read(bufio.NewReader(strings.NewReader("GET /counters/alice/x HTTP/1.1\r\nHost: a\r\n" + lines + "\r\n"))); err != nil {
		t.Fatal(err)
	}
	rq := &request{}
	stripRequestHop(&req.Header, rq, hopFound(req.Header.All()), false)
	keepFieldOrder(&req.Header, rq)
	check("request", req.Header.PeekAll)

	var res fasthttp.ResponseHeader
	if err := res.Read(bufio.NewReader(strings.NewReader("HTTP/1.1 200 OK\r\n" + lines + "Content-Length: 0\r\n\r\n"))); err != nil {
		t.Fatal(err)
	}
	res.ResetConnectionClose()
	stripResponseHop(&res)
	check("answer", res.PeekAll)
}
