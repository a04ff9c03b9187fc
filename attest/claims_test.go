package attest

import (
	"net/netip"
	"net/url"
	"strings"
	"testing"
)

// claimsOf compiles a claims.pinboard object for tests.
func claimsOf(t testing.TB, pinboard string) Claims {
	t.Helper()
	obj, err := decodeObject([]byte(pinboard))
	if err != nil {
		t.Fatalf("bad test claims %s: %v", pinboard, err)
	}
	c, err := parseClaims(obj, "claims.pinboard", func(w string) { t.Fatalf("unexpected warning %q", w) })
	if err != nil {
		t.Fatalf("bad test claims %s: %v", pinboard, err)
	}
	return c
}

func TestClaims_CoversNamespace_RTR3(t *testing.T) {
	c := claimsOf(t, `{"namespaces":["counters","/chat-*"]}`)
	for ns, want := range map[string]bool{
		"/counters": true, "counters": true, "/chat-eu": true, "chat-": true,
		"/countersx": false, "/chat": false, "/Counters": false, "": false,
	} {
		if got := c.CoversNamespace(ns); got != want {
			t.Errorf("unexpected CoversNamespace(%q); got %v; want %v", ns, got, want)
		}
	}
	var none Claims
	if none.CoversNamespace("/counters") || none.CheckBackend("http://a") == nil {
		t.Fatalf("the zero Claims must cover no namespace and no backend")
	}
	// hostnames and envs narrow a key only when listed.
	if !none.CoversHostname("a") || !none.CoversEnv("prod") {
		t.Fatalf("claims without hostnames/envs lists must not restrict them")
	}
	empty := claimsOf(t, `{"hostnames":[],"envs":[]}`)
	if empty.CoversHostname("a") || empty.CoversEnv("prod") {
		t.Fatalf("empty hostnames/envs lists must cover nothing")
	}
}

func TestClaims_CoversHostnameAndEnv_RTR3(t *testing.T) {
	c := claimsOf(t, `{"hostnames":["*.Example.com","app.test"],"envs":["prod","stage-*"]}`)
	for h, want := range map[string]bool{
		"a.example.com": true, "A.B.EXAMPLE.COM": true, "example.com": false, "APP.test": true, "app.test.evil": false,
	} {
		if got := c.CoversHostname(h); got != want {
			t.Errorf("unexpected CoversHostname(%q); got %v; want %v", h, got, want)
		}
	}
	// Patterns fold ASCII case only, like the names they match (R-LS-4).
	u := claimsOf(t, `{"hostnames":["ÅPP.example"]}`)
	for h, want := range map[string]bool{"ÅPP.example": true, "Åpp.EXAMPLE": true, "åpp.example": false} {
		if got := u.CoversHostname(h); got != want {
			t.Errorf("unexpected CoversHostname(%q) under ÅPP.example; got %v; want %v", h, got, want)
		}
	}
	for e, want := range map[string]bool{"prod": true, "Prod": false, "stage-2": true, "stage": false, "": false} {
		if got := c.CoversEnv(e); got != want {
			t.Errorf("unexpected CoversEnv(%q); got %v; want %v", e, got, want)
		}
	}
}

func TestClaims_CheckBackend_RTR3(t *testing.T) {
	c := claimsOf(t, `{"allowedBackendHosts":[
		"worker.internal", "*.pods.local", "10.0.3.7", "10.0.4.9:8000", "192.168.0.0/16",
		"::1", "[fd00::5]:9000", "fd00:1::/32", "api.test:443", "*:7777"]}`)
	cases := []struct {
		url  string
		want string // "" = allowed; otherwise a substring of the error
	}{
		{"http://worker.internal:8000", ""},
		{"https://WORKER.Internal/base/", ""},
		{"http://worker.internal.:8000", ""},
		{"http://evil-worker.internal:8000", `advertise host "evil-worker.internal:8000" is not in allowedBackendHosts`},
		{"http://a.pods.local", ""},
		{"http://a.b.pods.local:1", ""},
		{"http://pods.local", `advertise host "pods.local" is not in allowedBackendHosts`},
		{"http://10.0.3.7:8000", ""},
		{"http://10.0.3.7", ""},
		{"http://10.0.3.7.:8000", "an IP address with a trailing dot is a DNS name"},
		{"http://10.0.3.8:8000", "is not in allowedBackendHosts"},
		{"http://10.0.4.9:8000", ""},
		{"http://10.0.4.9:8001", `advertise host "10.0.4.9:8001" is not in allowedBackendHosts`},
		{"http://10.0.4.9", "is not in allowedBackendHosts"},
		{"http://192.168.44.2:8000", ""},
		{"http://[::ffff:192.168.1.1]:8000", ""},
		{"http://192.169.0.1:8000", "is not in allowedBackendHosts"},
		{"http://[::1]:8000", ""},
		{"http://[0:0::1]:8000", ""},
		{"http://[fd00::5]:9000", ""},
		{"http://[fd00::5]:9001", "is not in allowedBackendHosts"},
		{"http://[fd00:1:2::3]:80", ""},
		{"https://api.test", ""},
		{"http://api.test", `advertise host "api.test" is not in allowedBackendHosts`},
		{"http://anything.example:7777", ""},
		{"http://10.9.9.9:8000", `advertise host "10.9.9.9:8000" is not in allowedBackendHosts`},
		{"ftp://worker.internal", "scheme must be http or https"},
		{"worker.internal:8000", "scheme must be http or https"},
		{"/relative", "scheme must be http or https"},
		{"http:///path", "has no host"},
		{"http://user:pw@worker.internal", "must not carry user info"},
		{"http://worker.internal/?x=1", "must not carry a query"},
		{"http://worker.internal/?", "must not carry a query"},
		{"http://worker.internal/#frag", "must not carry a fragment"},
		{"http://worker.internal/#", "must not carry a fragment"},
		{"http://wor ker.internal", "cannot parse advertise URL"},
		// Spellings that reach another address than they seem to, or
		// that only some resolvers read as an address.
		{"http://worker.internal:8000@127.0.0.1/", "must not carry user info"},
		{"http://10.0.3.7%2f@127.0.0.1/", "must not carry user info"},
		{"http://worker.internal:8000\\@127.0.0.1/", "cannot parse advertise URL"},
		{"http://127.0.0.1#.pods.local/", "must not carry a fragment"},
		{"http://127.0.0.1%23.pods.local/", "cannot parse advertise URL"},
		{"http://%31%30.0.3.7/", "cannot parse advertise URL"},
		{"http://3232235521/", "is not in allowedBackendHosts"},    // 192.168.0.1 to inet_aton
		{"http://0xc0.0xa8.0.1/", "is not in allowedBackendHosts"}, // the same
		{"http://0300.0250.0.1/", "is not in allowedBackendHosts"}, // the same, octal
		{"http://192.168.1/", "is not in allowedBackendHosts"},
		{"http://[::1%25lo]:8000/", "is not in allowedBackendHosts"},
		{"http://[fd00::5%25eth0]:9000/", "is not in allowedBackendHosts"},
		{"http://[10.0.3.7]/", "cannot parse advertise URL"},
		{"http://worker.internal:80,127.0.0.1/", "cannot parse advertise URL"},
	}
	for _, tc := range cases {
		err := c.CheckBackend(tc.url)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("unexpected error for %q: %v", tc.url, err)
		case tc.want != "" && err == nil:
			t.Errorf("unexpected success for %q; want error containing %q", tc.url, tc.want)
		case tc.want != "" && !strings.Contains(err.Error(), tc.want):
			t.Errorf("unexpected error for %q; got %v; want it to contain %q", tc.url, err, tc.want)
		}
	}
	any := claimsOf(t, `{"allowedBackendHosts":["*"]}`)
	if err := any.CheckBackend("http://169.254.169.254"); err != nil {
		t.Fatalf("\"*\" must allow any host; got %v", err)
	}
	if err := any.CheckBackend("gopher://x"); err == nil {
		t.Fatalf("\"*\" must still require http or https")
	}
}

func TestCoversNamespace_ZeroAlloc_RTR3(t *testing.T) {
	c := claimsOf(t, `{"namespaces":["a","b","chat-*"]}`)
	ns := []byte("/chat-eu")
	if n := testing.AllocsPerRun(100, func() {
		if !coversNamespace(&c, ns) || !c.CoversNamespace("/chat-us") {
			t.Fatal("unexpected miss")
		}
	}); n != 0 {
		t.Fatalf("unexpected allocations; got %v; want 0", n)
	}
}

// Host names match case-insensitively in ASCII only (RFC 4343): Unicode
// folding would let "\u212a" (KELVIN SIGN) stand for "k" and "\u017f" (LONG
// S) for "s", registering a host that is not the one the claim names.
func TestClaims_CheckBackend_ASCIIFoldOnly_RTR3(t *testing.T) {
	c := claimsOf(t, `{"allowedBackendHosts":["worker.internal","svc.local","*.svc.local"]}`)
	for _, u := range []string{
		"http://wor\u212aer.internal:8000",
		"http://\u017fvc.local:8000",
		"http://a.\u017fvc.local:8000",
	} {
		if err := c.CheckBackend(u); err == nil {
			t.Errorf("unexpected acceptance of %q; got nil; want an allowedBackendHosts error", u)
		}
	}
	for _, u := range []string{"http://WORKER.internal:8000", "http://a.SVC.Local"} {
		if err := c.CheckBackend(u); err != nil {
			t.Errorf("unexpected error for %q; got %v; want nil", u, err)
		}
	}
}

// CoversAll: every namespace, hostname and env — what an operator needs to
// act where none is known (R-TR-3).
func TestClaims_CoversAll_RTR3(t *testing.T) {
	for raw, want := range map[string]bool{
		`{"namespaces":["*"]}`:                                   true,
		`{"namespaces":["*"],"hostnames":["*"],"envs":["*"]}`:    true,
		`{"namespaces":["/counters"]}`:                           false,
		`{"namespaces":["*"],"envs":["staging"]}`:                false,
		`{"namespaces":["*"],"hostnames":["app.example"]}`:       false,
		`{"namespaces":["*"],"hostnames":["*"],"envs":["prod"]}`: false,
	} {
		c := claimsOf(t, raw)
		if got := c.CoversAll(); got != want {
			t.Errorf("unexpected CoversAll for %s; got %v; want %v", raw, got, want)
		}
	}
}

// A hostname pattern written as a fully qualified name ("app.example.")
// is the name without its dot, as registrations and requests carry it
// (R-TR-3, R-LS-4).
func TestClaims_HostnamePatternTrailingDot_RTR3(t *testing.T) {
	c := claimsOf(t, `{"hostnames":["app.example.","*.fleet.test."]}`)
	for h, want := range map[string]bool{"app.example": true, "a.fleet.test": true, "app.example.evil": false} {
		if got := c.CoversHostname(h); got != want {
			t.Errorf("unexpected CoversHostname(%q); got %v; want %v", h, got, want)
		}
	}
}

// An empty hostname or env pattern is refused when the passport is
// parsed: it would match only the empty name, never what was meant.
func TestClaims_EmptyPatternsRefused_RTR3(t *testing.T) {
	for _, raw := range []string{`{"envs":["prod",""]}`, `{"hostnames":[""]}`} {
		obj, err := decodeObject([]byte(raw))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := parseClaims(obj, "claims.pinboard", func(string) {}); err == nil || !strings.Contains(err.Error(), "empty") {
			t.Errorf("unexpected parse of %s; got %v; want an empty-pattern error", raw, err)
		}
	}
}

// A CIDR written in its IPv4-mapped IPv6 form covers the IPv4 addresses
// it maps (hosts are compared unmapped); "*.internal" covers
// subdomains, not a host that is only the dot and the parent (R-TR-3).
func TestClaims_CheckBackendMappedCIDRAndBareSuffix_RTR3(t *testing.T) {
	c := claimsOf(t, `{"allowedBackendHosts":["::ffff:10.0.0.0/104","*.internal"]}`)
	for u, ok := range map[string]bool{
		"http://10.1.2.3:8000":        true,
		"http://[::ffff:10.9.9.9]:80": true,
		"http://11.0.0.1:8000":        false,
		"http://a.internal":           true,
		"http://.internal":            false,
	} {
		if err := c.CheckBackend(u); (err == nil) != ok {
			t.Errorf("unexpected CheckBackend(%q); got %v; want allowed %v", u, err, ok)
		}
	}
}

// FuzzCheckBackend_RTR3 checks what an accepted advertise URL makes pinboard
// dial (net/url's host and port, as the proxy dials it) against the
// allowedBackendHosts entries read independently: a URL is accepted only
// when its dial target fits one of them (R-TR-3).
func FuzzCheckBackend_RTR3(f *testing.F) {
	for _, s := range []string{
		"http://worker.internal:8000", "https://WORKER.Internal/base/", "http://a.pods.local", "http://pods.local",
		"http://10.0.4.9:8000", "http://[::ffff:192.168.1.1]/", "http://[fd00::5]:9000", "http://x:7777", "http://10.0.3.7.",
		"http://[fe80::1%25eth0]:80", "http://api.test", "http://worker.internal:08000", "http://a.pods.local.:80",
	} {
		f.Add(s)
	}
	c := claimsOf(f, `{"allowedBackendHosts":[
		"worker.internal", "*.pods.local", "10.0.3.7", "10.0.4.9:8000", "192.168.0.0/16",
		"::1", "[fd00::5]:9000", "fd00:1::/32", "api.test:443", "*:7777"]}`)
	f.Fuzz(func(t *testing.T, advertiseURL string) {
		if c.CheckBackend(advertiseURL) != nil {
			return
		}
		u, err := url.Parse(advertiseURL)
		if err != nil {
			t.Fatalf("unexpected acceptance of %q, which net/url refuses: %v", advertiseURL, err)
		}
		host, port := strings.ToLower(u.Hostname()), u.Port()
		if port == "" {
			port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
		}
		name := strings.TrimSuffix(host, ".")
		addr, aerr := netip.ParseAddr(host)
		addr = addr.Unmap()
		ok := port == "7777" ||
			aerr != nil && (name == "worker.internal" || strings.HasSuffix(name, ".pods.local") && len(name) > len(".pods.local") ||
				name == "api.test" && port == "443") ||
			aerr == nil && (addr == netip.MustParseAddr("10.0.3.7") || addr == netip.MustParseAddr("10.0.4.9") && port == "8000" ||
				netip.MustParsePrefix("192.168.0.0/16").Contains(addr) || addr == netip.MustParseAddr("::1") ||
				addr == netip.MustParseAddr("fd00::5") && port == "9000" || netip.MustParsePrefix("fd00:1::/32").Contains(addr))
		if !ok {
			t.Fatalf("unexpected acceptance of %q: dials %s port %s", advertiseURL, host, port)
		}
	})
}
