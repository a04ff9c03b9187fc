package proxy

import (
	"net/netip"
	"net/url"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/internal/ascii"
)

func TestParseTarget_RDP1(t *testing.T) {
	cases := []struct {
		uri, base           string
		ns, id, path, query string
		err                 error
	}{
		{uri: "/counters/alice/value", ns: "/counters", id: "alice", path: "/counters/alice/value"},
		{uri: "/counters/alice", ns: "/counters", id: "alice", path: "/counters/alice"},
		{uri: "/counters/alice/", ns: "/counters", id: "alice", path: "/counters/alice/"},
		{uri: "/counters/alice/a/b?x=1&y=%2F", ns: "/counters", id: "alice", path: "/counters/alice/a/b", query: "?x=1&y=%2F"},
		{uri: "/counters/a.b~c-d_e/x", ns: "/counters", id: "a.b~c-d_e", path: "/counters/a.b~c-d_e/x"},
		{uri: "/pb/counters/alice/value", base: "/pb", ns: "/counters", id: "alice", path: "/counters/alice/value"},
		{uri: "/pbx/counters/alice", base: "/pb", err: errOutsideBase},
		{uri: "/counters/alice", base: "/pb", err: errOutsideBase},
		{uri: "/", err: errNotInstance},
		{uri: "/counters", err: errNotInstance},
		{uri: "//alice/x", err: errBadNamespace},
		{uri: "/counters//x", err: errEmptyID},
		{uri: "/counters/al%20ice/x", err: errIDCharset},
		{uri: "/counters/al ice", err: errIDCharset},
		{uri: "/counters/" + strings.Repeat("a", 257), err: errLongID},
		{uri: "/counters/" + strings.Repeat("a", 256), ns: "/counters", id: strings.Repeat("a", 256), path: "/counters/" + strings.Repeat("a", 256)},
		{uri: "/counters/../registry/x", err: errDotSegment},
		{uri: "/counters/./x", err: errDotSegment},
		{uri: "/counters/alice/../../_pinned/stats", err: errDotSegment},
		{uri: "/counters/alice/./x", err: errDotSegment},
		{uri: "/../x/y", err: errDotSegment},
		{uri: "/counters/alice/..x", ns: "/counters", id: "alice", path: "/counters/alice/..x"},
		// Dot segments spelt with escapes: the worker's server decodes the
		// path, and anything normalising after it would climb.
		{uri: "/counters/alice/%2e%2e/%2e%2e/_pinned/stats", err: errDotSegment},
		{uri: "/counters/alice/.%2E/x", err: errDotSegment},
		{uri: "/counters/alice/%2E", err: errDotSegment},
		{uri: "/counters/alice/a%2f..%2f..%2f_pinned", err: errDotSegment},
		{uri: "/counters/alice/a%5C..%5Cb", err: errDotSegment},
		{uri: "/counters/alice/a\\..\\b", err: errDotSegment},
		{uri: "/counters/alice/x?next=/../..", ns: "/counters", id: "alice", path: "/counters/alice/x", query: "?next=/../.."},
		{uri: "/counters/alice/%2e%2e%2e", ns: "/counters", id: "alice", path: "/counters/alice/%2e%2e%2e"},
		{uri: "/counters/alice/a%2fb%2e", ns: "/counters", id: "alice", path: "/counters/alice/a%2fb%2e"},
		{uri: "/counters/alice/%2", ns: "/counters", id: "alice", path: "/counters/alice/%2"},
		// The worker's wake route, however its server decodes to it.
		{uri: "/counters/alice/_wake", err: errWorkerRoute},
		{uri: "/counters/alice/_wake?x=1", err: errWorkerRoute},
		{uri: "/counters/alice/%5Fwake", err: errWorkerRoute},
		{uri: "/counters/alice/%5f%77ak%65", err: errWorkerRoute},
		{uri: "/counters/alice/_wake%0A", err: errWorkerRoute},
		{uri: "/counters/alice/_wake%0a", err: errWorkerRoute},
		{uri: "/c%6Funters/alice/_wake", err: errWorkerRoute},
		{uri: "/counters/alice/_wake/", ns: "/counters", id: "alice", path: "/counters/alice/_wake/"},
		{uri: "/counters/alice/_wake%0A%0A", ns: "/counters", id: "alice", path: "/counters/alice/_wake%0A%0A"},
		{uri: "/counters/alice/_wakes", ns: "/counters", id: "alice", path: "/counters/alice/_wakes"},
		{uri: "/counters/alice/_Wake", ns: "/counters", id: "alice", path: "/counters/alice/_Wake"},
		{uri: "/counters/alice/x/_wake", ns: "/counters", id: "alice", path: "/counters/alice/x/_wake"},
		{uri: "/counters/alice/_wak", ns: "/counters", id: "alice", path: "/counters/alice/_wak"},
		{uri: "/counters/_wake", ns: "/counters", id: "_wake", path: "/counters/_wake"},
		{uri: "/counters/alice/_wake%", ns: "/counters", id: "alice", path: "/counters/alice/_wake%"},
		// No fragment: uvicorn on httptools routes by the path before '#'.
		{uri: "/counters/alice/_wake#x", err: errFragment},
		{uri: "/counters/alice/v?x=1#y", err: errFragment},
		{uri: "/counters/alice#/v", err: errFragment},
		{uri: "http://host/counters/a", err: errPathMalformed},
		{uri: "*", err: errPathMalformed},
	}
	for _, tc := range cases {
		tg, err := ParseTarget([]byte(tc.uri), []byte(tc.base))
		if err != tc.err {
			t.Fatalf("unexpected error for %q; got %v; want %v", tc.uri, err, tc.err)
		}
		if err != nil {
			continue
		}
		if string(tg.NS) != tc.ns || string(tg.ID) != tc.id || string(tg.Path) != tc.path || string(tg.Query) != tc.query {
			t.Fatalf("unexpected target for %q; got ns=%q id=%q path=%q query=%q", tc.uri, tg.NS, tg.ID, tg.Path, tg.Query)
		}
	}
}

func TestParseTargetAllocs(t *testing.T) {
	uri := []byte("/counters/alice/value?x=1")
	if n := testing.AllocsPerRun(1000, func() { _, _ = ParseTarget(uri, nil) }); n != 0 {
		t.Fatalf("unexpected allocations; got %v; want 0", n)
	}
}

func FuzzParseTarget(f *testing.F) {
	for _, s := range []string{"/counters/alice/value", "/a/b/../c", "/x//y", "/%2e%2e/a", "/a/b/.%2e/c", "/a/b/x%2F%2E%2E", "/a/b/%5Fwake%0a"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, uri string) {
		tg, err := ParseTarget([]byte(uri), nil)
		if err != nil {
			return
		}
		if checkID(tg.ID) != nil || len(tg.NS) < 2 || tg.NS[0] != '/' {
			t.Fatalf("accepted an invalid target %q: %+v", uri, tg)
		}
		// Decoded as the worker's server decodes it, with "\\" as a
		// separator too: no dot segment.
		decoded, err := url.PathUnescape(string(tg.Path))
		if err != nil {
			decoded = string(tg.Path)
		}
		for _, seg := range strings.FieldsFunc(decoded, func(r rune) bool { return r == '/' || r == '\\' }) {
			if seg == "." || seg == ".." {
				t.Fatalf("accepted a dot segment in %q", uri)
			}
		}
		// Nor the worker's wake route after the id (Python's "$" admits
		// one final newline).
		rest, err := url.PathUnescape(string(tg.Path[len(tg.NS)+1+len(tg.ID):]))
		if err == nil && strings.TrimSuffix(rest, "\n") == "/_wake" {
			t.Fatalf("accepted the wake route in %q", uri)
		}
	})
}

func TestStripRequestHop_RDP1(t *testing.T) {
	var h fasthttp.RequestHeader
	h.SetMethod("GET")
	h.SetRequestURI("/c/a")
	for k, v := range map[string]string{
		"Connection":            "keep-alive, X-Secret-Hop",
		"X-Secret-Hop":          "1",
		"Keep-Alive":            "timeout=5",
		"Proxy-Connection":      "keep-alive",
		"Proxy-Authorization":   "Basic x",
		"Te":                    "trailers",
		"Trailer":               "X",
		"Upgrade":               "h2c",
		"Expect":                "100-continue",
		"Pinboard-Attestation":  "forged",
		"pinboard-epoch":        "1",
		"Pinboard-Proxy-Secret": "stolen",
		"Pinboard-Anything":     "x",
		"X-Keep":                "yes",
		"Traceparent":           "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
	} {
		h.Set(k, v)
	}
	stripRequestHop(&h, &request{}, hopFound(h.All()), false)
	for _, gone := range []string{"Connection", "X-Secret-Hop", "Keep-Alive", "Proxy-Connection", "Proxy-Authorization", "Te", "Trailer", "Upgrade", "Expect", "Pinboard-Attestation", "Pinboard-Epoch", "Pinboard-Proxy-Secret", "Pinboard-Anything"} {
		if v := h.Peek(gone); len(v) != 0 {
			t.Fatalf("unexpected %s: %q survived stripping", gone, v)
		}
	}
	for _, kept := range []string{"X-Keep", "Traceparent"} {
		if len(h.Peek(kept)) == 0 {
			t.Fatalf("unexpected loss of %s", kept)
		}
	}
}

func TestStripRequestHopKeepsUpgradeForWebSockets(t *testing.T) {
	var h fasthttp.RequestHeader
	h.Set("Connection", "Upgrade")
	h.Set("Upgrade", "websocket")
	stripRequestHop(&h, &request{}, hopFound(h.All()), true)
	if string(h.Peek("Upgrade")) != "websocket" {
		t.Fatalf("unexpected loss of Upgrade")
	}
}

func TestStripRequestHopAllocs(t *testing.T) {
	var h fasthttp.RequestHeader
	h.SetMethod("GET")
	h.SetRequestURI("/c/a")
	h.Set("Accept", "*/*")
	h.Set("User-Agent", "bench")
	rq := &request{}
	if n := testing.AllocsPerRun(1000, func() { stripRequestHop(&h, rq, hopFound(h.All()), false) }); n != 0 {
		t.Fatalf("unexpected allocations; got %v; want 0", n)
	}
}

func TestClientIP_RPL4(t *testing.T) {
	tp, err := ParseTrustedProxies("10.0.0.0/8, 127.0.0.1 ::1")
	if err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddr
	cases := []struct {
		peer, xff, want string
	}{
		{"203.0.113.9", "1.2.3.4", "203.0.113.9"},     // untrusted peer: XFF ignored
		{"127.0.0.1", "1.2.3.4", "1.2.3.4"},           // trusted peer
		{"127.0.0.1", "1.2.3.4, 10.1.1.1", "1.2.3.4"}, // skip trusted hops right to left
		{"127.0.0.1", "9.9.9.9, 1.2.3.4, 10.1.1.1", "1.2.3.4"},
		{"127.0.0.1", "garbage, 10.1.1.1", "10.1.1.1"}, // stop at malformed entries
		{"127.0.0.1", "", "127.0.0.1"},
		{"::1", "[2001:db8::1]:443", "2001:db8::1"},
		{"::ffff:127.0.0.1", "5.6.7.8:1234", "5.6.7.8"},
	}
	for _, tc := range cases {
		if got := tp.ClientIP(a(tc.peer), []byte(tc.xff)); got != a(tc.want) {
			t.Fatalf("unexpected client IP for peer %s xff %q; got %v; want %s", tc.peer, tc.xff, got, tc.want)
		}
	}
	var none *TrustedProxies
	if got := none.ClientIP(a("127.0.0.1"), []byte("1.2.3.4")); got != a("127.0.0.1") {
		t.Fatalf("unexpected client IP without trusted proxies: %v", got)
	}
	if _, err := ParseTrustedProxies("10.0.0.0/33"); err == nil {
		t.Fatalf("unexpected acceptance of a bad CIDR")
	}
	if _, err := ParseTrustedProxies("localhost"); err == nil {
		t.Fatalf("unexpected acceptance of a hostname")
	}
	if _, err := ParseTrustedProxies("10.0.0.1, fe80::1%eth0"); err == nil || !strings.Contains(err.Error(), `"fe80::1%eth0": an IPv6 zone cannot be trusted`) {
		t.Fatalf("unexpected result for a zoned address; got %v; want an error naming the entry and the zone", err)
	}
}

// The client IP for affinity reads every X-Forwarded-For line: a trusted
// proxy that appends its own line after a client's must be believed, not
// the client's line (R-PL-4).
func TestClientIPEveryForwardedLine_RPL4(t *testing.T) {
	tp, err := ParseTrustedProxies("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	req := parseRequest(t, "GET /c/a HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 1.1.1.1\r\nX-Forwarded-For: 6.6.6.6\r\n\r\n")
	xff := forwardedFor(&req.Header, nil)
	if string(xff) != "1.1.1.1, 6.6.6.6" {
		t.Fatalf("unexpected joined list; got %q", xff)
	}
	if got := tp.ClientIP(netip.MustParseAddr("127.0.0.1"), xff); got != netip.MustParseAddr("6.6.6.6") {
		t.Fatalf("unexpected client IP; got %v; want 6.6.6.6, the trusted proxy's own line", got)
	}
}

// Absolute-form targets (RFC 9112 §3.2.2) give their authority and the
// origin-form rest (R-DP-1).
func TestOriginForm_RDP1(t *testing.T) {
	cases := []struct {
		uri, authority, rest string
		ok                   bool
		err                  error
	}{
		{uri: "/counters/alice", ok: false},
		{uri: "*", ok: false},
		{uri: "ftp://h/counters/alice", ok: false},
		{uri: "http:/counters/alice", ok: false},
		{uri: "http://h/counters/alice?x=1", authority: "h", rest: "/counters/alice?x=1", ok: true},
		{uri: "HTTPS://Example.COM:8443/counters/alice", authority: "Example.COM:8443", rest: "/counters/alice", ok: true},
		{uri: "hTtP://[::1]:80/counters/a/b", authority: "[::1]:80", rest: "/counters/a/b", ok: true},
		{uri: "http://h", authority: "h", rest: "", ok: true},
		{uri: "http://h?x=1", authority: "h", rest: "?x=1", ok: true},
		{uri: "http:///counters/alice", ok: true, err: errBadAuthority},
		{uri: "http://user:pw@h/counters/alice", ok: true, err: errBadAuthority},
		{uri: "http://h\x7f/counters/alice", ok: true, err: errBadAuthority},
	}
	for _, tc := range cases {
		a, r, ok, err := OriginForm([]byte(tc.uri))
		if ok != tc.ok || err != tc.err || string(a) != tc.authority || string(r) != tc.rest {
			t.Fatalf("OriginForm(%q) = %q, %q, %v, %v; want %q, %q, %v, %v", tc.uri, a, r, ok, err, tc.authority, tc.rest, tc.ok, tc.err)
		}
	}
}

// appendNamespace decodes a namespace's percent-escapes as the worker's
// server decodes the path (urllib.parse.unquote): valid escapes in either
// case, anything else as it is (R-DP-1).
func TestAppendNamespace_RDP1(t *testing.T) {
	for in, want := range map[string]string{
		"/counters":    "/counters",
		"/caf%C3%A9":   "/café",
		"/caf%c3%a9":   "/café",
		"/a%zz":        "/a%zz",
		"/a%2":         "/a%2",
		"/a%":          "/a%",
		"/%41%4a%4A%z": "/AJJ%z",
	} {
		if got := string(appendNamespace([]byte("x"), []byte(in))); got != "x"+want {
			t.Errorf("unexpected namespace for %q; got %q; want %q", in, got[1:], want)
		}
	}
}

// The host a placement is bound by (R-LS-4): the Host header without its
// port, and without the trailing dot of a fully qualified name, which
// names the same host — app.example. missed app.example's binding.
func TestHostOnly_RLS4(t *testing.T) {
	for in, want := range map[string]string{
		"app.example": "app.example", "app.example:8080": "app.example", "app.example.": "app.example",
		"app.example.:443": "app.example", "[::1]:80": "::1", "[::1]": "::1", "127.0.0.1:80": "127.0.0.1",
		"": "", ".": ".",
	} {
		if got := hostOnly([]byte(in)); got != want {
			t.Errorf("unexpected hostOnly(%q); got %q; want %q", in, got, want)
		}
	}
}

// A base path's escapes match in either case (RFC 3986 section 6.2.2.1),
// the rest byte for byte (R-SRV-4).
func TestHasBasePath_RSRV4(t *testing.T) {
	for _, tc := range []struct {
		path, base string
		want       bool
	}{
		{"/pb%C3%B8/c/x", "/pb%C3%B8", true},
		{"/pb%c3%b8/c/x", "/pb%C3%B8", true},
		{"/pb%C3%b8", "/pb%c3%B8", true},
		{"/PB%C3%B8/c/x", "/pb%C3%B8", false},
		{"/pb%C3%B9/c/x", "/pb%C3%B8", false},
		{"/pb%C3", "/pb%C3%B8", false},
		{"/pbx/c/x", "/pb", true}, // the segment end is the caller's to check
		{"/pa/c/x", "/pb", false},
	} {
		if got := HasBasePath([]byte(tc.path), []byte(tc.base)); got != tc.want {
			t.Errorf("unexpected HasBasePath(%q, %q); got %v; want %v", tc.path, tc.base, got, tc.want)
		}
	}
}

// FuzzParseTargetBasePath_RDP1_RSRV4 checks a target under a base path: HasBasePath
// agrees with a byte comparison in which only the hex digits of the base's
// escapes fold case, and an accepted target is the target the rest of the
// path is without a base (R-DP-1).
func FuzzParseTargetBasePath_RDP1_RSRV4(f *testing.F) {
	f.Add("/pb/counters/alice/value?x=1", "/pb")
	f.Add("/pb%c3%b8/c/a", "/pb%C3%B8")
	f.Add("/pb%zz/c/a", "/pb%zz")
	f.Add("/p%4/c/a", "/p%4")
	f.Add("/pbx/c/a", "/pb")
	f.Fuzz(func(t *testing.T, uri, base string) {
		for i := 0; i < len(base); i++ {
			if base[i] <= ' ' || base[i] >= 0x7f {
				return // an operator's base path is printable
			}
		}
		// Reference: the two bytes after each '%' of base are hex digits
		// on both sides, compared case-insensitively; every other byte
		// is compared as it is.
		want := len(uri) >= len(base)
		for i := 0; want && i < len(base); i++ {
			want = uri[i] == base[i]
			if base[i] != '%' {
				continue
			}
			for j := i + 1; want && j < min(i+3, len(base)); j++ {
				want = ascii.IsHex(uri[j]) && ascii.IsHex(base[j]) && ascii.LowerByte(uri[j]) == ascii.LowerByte(base[j])
			}
			i += 2
		}
		got := HasBasePath([]byte(uri), []byte(base))
		if got != want {
			t.Fatalf("unexpected HasBasePath(%q, %q); got %v; want %v", uri, base, got, want)
		}
		tg, err := ParseTarget([]byte(uri), []byte(base))
		if err != nil {
			return
		}
		if !got {
			t.Fatalf("unexpected acceptance of %q outside %q", uri, base)
		}
		alone, err := ParseTarget([]byte(uri[len(base):]), nil)
		if err != nil || string(alone.NS) != string(tg.NS) || string(alone.ID) != string(tg.ID) ||
			string(alone.Path) != string(tg.Path) || string(alone.Query) != string(tg.Query) {
			t.Fatalf("unexpected target of %q under %q; got %+v; without the base %+v, %v", uri, base, tg, alone, err)
		}
	})
}
