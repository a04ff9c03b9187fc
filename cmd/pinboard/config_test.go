package main

import (
	"bytes"
	"cmp"
	"net"
	"net/netip"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/server"
	"github.com/valyala/fasthttp"
)

const goodPassport = `{"providers":[{"type":"staticToken","id":"pinboard","keys":[{"name":"deployment","token":{"env":"PINBOARD_TOKEN"},"scopes":["pinboard:worker","pinboard:operator"],"claims":{"pinboard":{"namespaces":["*"],"allowedBackendHosts":["*"]}}}]}],"namespaces":{"*":{"allow":"anonymous"}}}`

func env(kv map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := kv[k]; return v, ok }
}

func base() map[string]string {
	return map[string]string{
		"PINBOARD_PASSPORT": goodPassport,
		"PINBOARD_TOKEN":    "t0ken",
		"REDIS_URL":         "memory:",
	}
}

// Bad configuration: one line naming the variable, exit code 2, nothing
// started (R-SRV-2, R-SRV-3).
func TestConfigErrors_RSRV2(t *testing.T) {
	cases := []struct {
		name string
		set  map[string]string
		del  []string
		want string
	}{
		{"missing passport", nil, []string{"PINBOARD_PASSPORT"}, "PINBOARD_PASSPORT: is required"},
		{"empty passport", map[string]string{"PINBOARD_PASSPORT": "  "}, nil, "PINBOARD_PASSPORT: is required"},
		{"malformed passport", map[string]string{"PINBOARD_PASSPORT": "{nope"}, nil, "PINBOARD_PASSPORT:"},
		{"unset token.env", nil, []string{"PINBOARD_TOKEN"}, "PINBOARD_TOKEN, which is not set"},
		{"unknown provider", map[string]string{"PINBOARD_PASSPORT": `{"providers":[{"type":"jwks","id":"x","keys":[]}]}`}, nil, "PINBOARD_PASSPORT:"},
		{"missing REDIS_URL", nil, []string{"REDIS_URL"}, "REDIS_URL: is required"},
		{"unknown scheme", map[string]string{"REDIS_URL": "postgres://db"}, nil, `REDIS_URL: unknown scheme "postgres"`},
		{"no scheme", map[string]string{"REDIS_URL": "localhost:6379"}, nil, "REDIS_URL: unknown scheme"},
		{"bad lease", map[string]string{"PINBOARD_LEASE_TTL_MS": "15s"}, nil, "PINBOARD_LEASE_TTL_MS: must be an integer"},
		{"tiny lease", map[string]string{"PINBOARD_LEASE_TTL_MS": "5"}, nil, "PINBOARD_LEASE_TTL_MS:"},
		{"huge lease", map[string]string{"PINBOARD_LEASE_TTL_MS": "2592000001"}, nil, "PINBOARD_LEASE_TTL_MS: must be an integer number of milliseconds from 100 to 2592000000 (30 days)"},
		{"bad balance factor", map[string]string{"PINBOARD_AFFINITY_BALANCE_FACTOR": "0.5"}, nil, "PINBOARD_AFFINITY_BALANCE_FACTOR: must be a number >= 1"},
		{"bad trusted proxies", map[string]string{"PINBOARD_TRUSTED_PROXIES": "10.0.0.0/33"}, nil, "PINBOARD_TRUSTED_PROXIES:"},
		{"bad port", map[string]string{"PORT": "http"}, nil, "PORT: must be a port number"},
		{"bad base path", map[string]string{"PINBOARD_BASE_PATH": "pb"}, nil, `PINBOARD_BASE_PATH: cannot use base path "pb": must be an absolute path like /pinboard`}, // server.CheckBasePath's words
		{"bad log level", map[string]string{"PINBOARD_LOG_LEVEL": "loud"}, nil, "PINBOARD_LOG_LEVEL:"},
		{"bad log format", map[string]string{"PINBOARD_LOG_FORMAT": "xml"}, nil, "PINBOARD_LOG_FORMAT: must be text or json"},
		{"bad metrics addr", map[string]string{"PINBOARD_METRICS_ADDR": "9090"}, nil, "PINBOARD_METRICS_ADDR: must be host:port"},
		{"bad grace", map[string]string{"PINBOARD_SHUTDOWN_GRACE_MS": "-1"}, nil, "PINBOARD_SHUTDOWN_GRACE_MS:"},
		{"bad delay", map[string]string{"PINBOARD_SHUTDOWN_DELAY_MS": "5s"}, nil, "PINBOARD_SHUTDOWN_DELAY_MS:"},
		{"access sample above 1", map[string]string{"PINBOARD_ACCESS_LOG_SAMPLE": "1.5"}, nil, "PINBOARD_ACCESS_LOG_SAMPLE: must be a number from 0 to 1"},
		{"access sample not a number", map[string]string{"PINBOARD_ACCESS_LOG_SAMPLE": "half"}, nil, "PINBOARD_ACCESS_LOG_SAMPLE:"},
		{"registry floor above ceiling", map[string]string{"PINBOARD_REGISTRY_WORKERS": "8", "PINBOARD_REGISTRY_MIN_WORKERS": "9"}, nil, "PINBOARD_REGISTRY_MIN_WORKERS: must be at most PINBOARD_REGISTRY_WORKERS (8), got 9"},
		{"bad stall timeout", map[string]string{"PINBOARD_STALL_TIMEOUT_MS": "1m"}, nil, "PINBOARD_STALL_TIMEOUT_MS: must be an integer"},
		{"registry floor zero", map[string]string{"PINBOARD_REGISTRY_MIN_WORKERS": "0"}, nil, "PINBOARD_REGISTRY_MIN_WORKERS: must be an integer from 1 to 2147483647"},
		// Values that net.Listen refused only after the store was opened
		// (exit 1 and a log line), and one that was silently ignored.
		{"bracketed HOST", map[string]string{"HOST": "[::1]"}, nil, "HOST:"},
		{"HOST with port", map[string]string{"HOST": "127.0.0.1:8080"}, nil, "HOST:"},
		{"HOST with space", map[string]string{"HOST": "local host"}, nil, "HOST:"},
		{"HOST a short dotted number", map[string]string{"HOST": "1.2.3"}, nil, `HOST: is not an IP address (a host name's last label is not all digits), got "1.2.3"`},
		{"HOST an address with a trailing dot", map[string]string{"HOST": "1.2.3.4."}, nil, "HOST: is not an IP address"},
		{"metrics port not a number", map[string]string{"PINBOARD_METRICS_ADDR": "127.0.0.1:metrics"}, nil, `PINBOARD_METRICS_ADDR: port must be 0-65535 or a service name, got "127.0.0.1:metrics"`},
		{"metrics port out of range", map[string]string{"PINBOARD_METRICS_ADDR": "127.0.0.1:99999"}, nil, `PINBOARD_METRICS_ADDR: port must be 0-65535 or a service name, got "127.0.0.1:99999"`},
		{"metrics host not a host", map[string]string{"PINBOARD_METRICS_ADDR": "1.2.3:9090"}, nil, `PINBOARD_METRICS_ADDR: host is not an IP address (a host name's last label is not all digits), got "1.2.3:9090"`},
		{"pprof without admin listener", map[string]string{"PINBOARD_PPROF": "1"}, nil, "PINBOARD_PPROF: needs PINBOARD_METRICS_ADDR"},
		// The admin listener on the public listener's port failed to bind
		// after the public one started: exit 1, restarted for ever.
		{"metrics on the public port", map[string]string{"PORT": "18080", "PINBOARD_METRICS_ADDR": ":18080"}, nil, "PINBOARD_METRICS_ADDR: must not be the public listener's address"},
		// Spelt differently, the same address: the admin listen failed
		// after the public one bound, exit 1 (R-SRV-3).
		{"metrics on the public address by name", map[string]string{"HOST": "127.0.0.1", "PORT": "18080", "PINBOARD_METRICS_ADDR": "localhost:18080"}, nil, "PINBOARD_METRICS_ADDR: must not be the public listener's address"},
		{"public on the metrics address by name", map[string]string{"HOST": "localhost", "PORT": "18080", "PINBOARD_METRICS_ADDR": "127.0.0.1:18080"}, nil, "PINBOARD_METRICS_ADDR: must not be the public listener's address"},
		{"metrics on the public address", map[string]string{"HOST": "127.0.0.1", "PORT": "18080", "PINBOARD_METRICS_ADDR": "127.0.0.1:18080"}, nil, "PINBOARD_METRICS_ADDR: must not be"},
		{"metrics on all interfaces at the public port", map[string]string{"HOST": "127.0.0.1", "PORT": "18080", "PINBOARD_METRICS_ADDR": "0.0.0.0:18080"}, nil, "PINBOARD_METRICS_ADDR: must not be"},
		{"metrics on the public port by name", map[string]string{"HOST": "::1", "PORT": "80", "PINBOARD_METRICS_ADDR": "[::1]:http"}, nil, "PINBOARD_METRICS_ADDR: must not be"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			kv := base()
			for k, v := range tc.set {
				kv[k] = v
			}
			for _, k := range tc.del {
				delete(kv, k)
			}
			kv["PORT"] = cmp.Or(kv["PORT"], "0")
			// loadConfig first: run would serve for ever on a config it
			// accepts.
			if _, err := loadConfig(env(kv)); err == nil {
				t.Fatalf("unexpected acceptance; got nil; want an error containing %q", tc.want)
			}
			var stderr bytes.Buffer
			code := run(nil, env(kv), &stderr)
			out := stderr.String()
			if code != 2 {
				t.Fatalf("unexpected exit code; got %d; want 2 (stderr %q)", code, out)
			}
			if strings.Count(out, "\n") != 1 || !strings.HasPrefix(out, "pinboard: ") || !strings.Contains(out, tc.want) {
				t.Fatalf("unexpected message; got %q; want one line containing %q", out, tc.want)
			}
		})
	}
}

func TestConfigDefaults_RSRV3(t *testing.T) {
	c, err := loadConfig(env(base()))
	if err != nil {
		t.Fatal(err)
	}
	if c.Addr != ":8080" || c.LeaseTTL != 15*time.Second || c.BalanceFactor != 0 || !c.Trusted.Empty() || c.Grace != 25*time.Second || c.Delay != 0 {
		t.Fatalf("unexpected defaults: %+v", c)
	}
	if c.MetricsAddr != "" || c.AccessSample != 0 || c.LogFormat != "text" || c.LogLevel != "info" {
		t.Fatalf("unexpected operations defaults: %+v", c)
	}
	if c.Upstream.StallTimeout != time.Minute {
		t.Fatalf("unexpected stall timeout; got %v; want 1m", c.Upstream.StallTimeout)
	}
	if c, err := loadConfig(env(map[string]string{"PINBOARD_PASSPORT": goodPassport, "PINBOARD_TOKEN": "t", "REDIS_URL": "memory:", "PINBOARD_STALL_TIMEOUT_MS": "0"})); err != nil || c.Upstream.StallTimeout >= 0 {
		t.Fatalf("PINBOARD_STALL_TIMEOUT_MS=0 must turn it off (a negative proxy option); got %v, %v", c, err)
	}
	kv := base()
	kv["PORT"], kv["HOST"], kv["PINBOARD_LEASE_TTL_MS"] = "9000", "127.0.0.1", "3000"
	kv["PINBOARD_TRUSTED_PROXIES"] = "10.0.0.0/8, 127.0.0.1"
	kv["PINBOARD_AFFINITY_BALANCE_FACTOR"] = "1.5"
	c, err = loadConfig(env(kv))
	if err != nil {
		t.Fatal(err)
	}
	if c.Addr != "127.0.0.1:9000" || c.LeaseTTL != 3*time.Second || c.BalanceFactor != 1.5 || c.Trusted.Empty() {
		t.Fatalf("unexpected config: %+v", c)
	}
}

// The integer variables are bounded by what the registry's pool holds: it
// keeps its capacity in an int32, and PINBOARD_REGISTRY_WORKERS=4294967297,
// an operator's "no limit", was accepted and became a pool of one
// (4294967296 one of none: every register and heartbeat waited, then 503),
// silently. Past the bound is a configuration error; the bound itself
// still starts (R-SRV-3).
func TestConfigIntegersWithinPoolBound_RSRV3(t *testing.T) {
	for _, name := range []string{"PINBOARD_REGISTRY_WORKERS", "PINBOARD_REGISTRY_MIN_WORKERS", "PINBOARD_REGISTRY_QUEUE", "PINBOARD_UPSTREAM_MAX_CONNS"} {
		for _, v := range []string{"2147483648", "4294967296", "4294967297", "9223372036854775807"} {
			kv := base()
			kv[name] = v
			want := name + ": must be an integer from 1 to 2147483647, got \"" + v + "\""
			if _, err := loadConfig(env(kv)); err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("unexpected result for %s=%s; got %v; want an error containing %q", name, v, err, want)
			}
		}
		kv := base()
		kv[name] = "2147483647"
		if name == "PINBOARD_REGISTRY_MIN_WORKERS" {
			kv["PINBOARD_REGISTRY_WORKERS"] = "2147483647"
		}
		if _, err := loadConfig(env(kv)); err != nil {
			t.Errorf("unexpected error for %s=2147483647; got %v; want nil", name, err)
		}
	}
}

// Arguments are refused before the configuration is read. The
// environment has no passport: run given it stops by itself whatever it
// does with the arguments (with a valid one it would serve for ever, on
// every interface), and the message tells the two refusals apart.
func TestRunRejectsArguments(t *testing.T) {
	kv := base()
	delete(kv, "PINBOARD_PASSPORT")
	kv["HOST"], kv["PORT"] = "127.0.0.1", "0"
	var stderr bytes.Buffer
	code := run([]string{"--port", "1"}, env(kv), &stderr)
	if out := stderr.String(); code != 2 || !strings.HasPrefix(out, "pinboard: takes no arguments") || strings.Count(out, "\n") != 1 {
		t.Fatalf("unexpected exit %d; got stderr %q; want 2 and one line refusing the arguments", code, out)
	}
}

func TestConfigPprof_RSRV3(t *testing.T) {
	kv := base()
	kv["PINBOARD_PPROF"] = "1"
	kv["PINBOARD_METRICS_ADDR"] = "127.0.0.1:9090"
	c, err := loadConfig(env(kv))
	if err != nil || !c.Pprof {
		t.Fatalf("unexpected config: %+v %v", c, err)
	}
	kv["PINBOARD_PPROF"] = "true"
	if c, err := loadConfig(env(kv)); err != nil || !c.Pprof {
		t.Fatalf("unexpected config for PINBOARD_PPROF=true: %+v %v", c, err)
	}
	kv["PINBOARD_PPROF"] = "yes"
	// The error names every value taken: "0 or 1" left out the true and
	// false it takes too.
	if _, err := loadConfig(env(kv)); err == nil || !strings.Contains(err.Error(), `PINBOARD_PPROF: must be 0, 1, false or true, got "yes"`) {
		t.Fatalf("unexpected error for PINBOARD_PPROF=yes; got %v; want it naming 0, 1, false and true", err)
	}
}

// What net.Listen takes still starts: the checks that refuse a bad HOST or
// PINBOARD_METRICS_ADDR at configuration time (TestConfigErrors_RSRV2) let
// every valid address through (R-SRV-3).
func TestConfigListenAddresses_RSRV3(t *testing.T) {
	for _, host := range []string{"127.0.0.1", "::1", "localhost", "pinboard-0.pinboard.default.svc", "node-1.example.", "10.in-addr.example"} {
		kv := base()
		kv["HOST"] = host
		if _, err := loadConfig(env(kv)); err != nil {
			t.Errorf("unexpected error for HOST=%q; got %v; want nil", host, err)
		}
	}
	// What net.Listen takes keeps working: a service name for the port,
	// the public port on another address, both on a port of the kernel's.
	for _, addr := range []string{"127.0.0.1:9090", ":0", "[::1]:http", "localhost:https", "127.0.0.2:8080"} {
		kv := base()
		kv["HOST"] = "127.0.0.1"
		kv["PINBOARD_METRICS_ADDR"] = addr
		if _, err := loadConfig(env(kv)); err != nil {
			t.Errorf("unexpected error for PINBOARD_METRICS_ADDR=%q; got %v; want nil", addr, err)
		}
	}
	for _, addr := range []string{":0", "127.0.0.1:0"} {
		kv := base()
		kv["PORT"] = "0"
		kv["PINBOARD_METRICS_ADDR"] = addr
		if _, err := loadConfig(env(kv)); err != nil {
			t.Errorf("unexpected error for PINBOARD_METRICS_ADDR=%q; got %v; want nil", addr, err)
		}
	}
}

// An IPv4 proxy written in its IPv4-mapped IPv6 form must be trusted like
// its IPv4 form: peers are unmapped before the check, so a mapped entry
// never matched and its X-Forwarded-For was silently ignored (R-PL-4).
func TestConfigTrustedProxies_MappedIPv4_RPL4(t *testing.T) {
	for _, v := range []string{"::ffff:10.0.0.1", "::ffff:10.0.0.0/104"} {
		kv := base()
		kv["PINBOARD_TRUSTED_PROXIES"] = v
		c, err := loadConfig(env(kv))
		if err != nil {
			t.Fatalf("unexpected error for %q; got %v; want nil", v, err)
		}
		if got := c.Trusted.Trusted(netip.MustParseAddr("10.0.0.1")); !got {
			t.Errorf("unexpected Trusted(10.0.0.1) for PINBOARD_TRUSTED_PROXIES=%q; got %v; want true", v, got)
		}
	}
}

// The base path is matched against the request target as sent, byte for
// byte (server.destination). Clients send a path percent-encoded: httpx,
// which the reference worker registers with, turns /pinbøard into
// /pinb%C3%B8ard, and removes "." and ".." segments; so a base path with
// a byte a client escapes (non-ASCII, a tab, a quote) or a dot segment was
// accepted and then answered every request 404, worker registrations
// included. Such a value is a configuration error; an escaped one works
// (R-SRV-4).
func TestConfigBasePathAsClientsSendIt_RSRV4(t *testing.T) {
	for _, bp := range []string{"/pinbøard", "/pin\tboard", `/pin"board`, "/a/../b", "/a/./b", "/a/..", "/pin%zzboard", "/pin%4"} {
		kv := base()
		kv["PINBOARD_BASE_PATH"] = bp
		if _, err := loadConfig(env(kv)); err == nil || !strings.HasPrefix(err.Error(), "PINBOARD_BASE_PATH: ") {
			t.Errorf("unexpected result for PINBOARD_BASE_PATH=%q; got %v; want a PINBOARD_BASE_PATH error", bp, err)
		}
	}
	for _, bp := range []string{"/pinboard", "/pinboard/", "/", "/a/b.v2", "/pinb%C3%B8ard", "/~ops/pin-board_1", "/a:b@c!$&'()*+,;=", "/..a"} {
		kv := base()
		kv["PINBOARD_BASE_PATH"] = bp
		if _, err := loadConfig(env(kv)); err != nil {
			t.Errorf("unexpected error for PINBOARD_BASE_PATH=%q; got %v; want nil", bp, err)
		}
	}
}

// REDIS_URL's scheme is case-insensitive (RFC 3986 §3.1), as the Node
// pinboard's URL parser takes it: REDIS://… was refused as an unknown
// scheme (R-SRV-3).
func TestConfigStoreSchemeCaseInsensitive_RSRV3(t *testing.T) {
	for u, want := range map[string]string{"REDIS://127.0.0.1:6379": "redis://127.0.0.1:6379", "Memory:": "memory:",
		"Rediss+Cluster://a:1,b:2": "rediss+cluster://a:1,b:2", "redis://U:PW@h:1": "redis://U:PW@h:1"} {
		kv := base()
		kv["REDIS_URL"] = u
		c, err := loadConfig(env(kv))
		if err != nil {
			t.Errorf("unexpected error for REDIS_URL=%q; got %v; want nil", u, err)
		} else if c.RedisURL != want {
			t.Errorf("unexpected store URL for REDIS_URL=%q; got %q; want %q", u, c.RedisURL, want)
		}
	}
}

// A base path's escapes match a request's in either case (RFC 3986
// §6.2.2.1): one configured in lower case (/pinb%c3%b8ard) was compared
// byte for byte with /pinb%C3%B8ard, as clients send it, and answered
// every request 404, worker registrations included (R-SRV-4). Held where
// it is seen: the node PINBOARD_BASE_PATH configures answers a request
// sent with the escapes in upper case (httpx, browsers) and in lower case
// (Go and httpx send a URL's escapes as it spells them), and nothing
// outside the base path.
func TestConfigBasePathEscapesEitherCase_RSRV4(t *testing.T) {
	for bp, sent := range map[string][]string{
		"/pinb%c3%b8ard": {"/pinb%C3%B8ard", "/pinb%c3%b8ard", "/pinb%C3%b8ard"},
		"/pinb%C3%B8ard": {"/pinb%C3%B8ard", "/pinb%c3%b8ard"},
		"/a%2fb/%7Ec":    {"/a%2Fb/%7Ec", "/a%2fb/%7ec"},
		"/fab%20":        {"/fab%20"},
	} {
		kv := base()
		kv["PINBOARD_BASE_PATH"] = bp
		c, err := loadConfig(env(kv))
		if err != nil {
			t.Fatalf("unexpected error for PINBOARD_BASE_PATH=%q; got %v; want nil", bp, err)
		}
		pb, err := server.New(serverOptions(c, directory.NewMemory(c.LeaseTTL, time.Now()), nil, nil))
		if err != nil {
			t.Fatalf("cannot build pinboard for PINBOARD_BASE_PATH=%q: %v", bp, err)
		}
		t.Cleanup(func() { _ = pb.Registry().Close(time.Second) })
		livez := func(path string) int {
			var req fasthttp.Request
			req.SetRequestURI(path + "/livez")
			var ctx fasthttp.RequestCtx
			ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9}, nil)
			pb.Handle(&ctx)
			return ctx.Response.StatusCode()
		}
		for _, p := range sent {
			if got := livez(p); got != fasthttp.StatusOK {
				t.Errorf("unexpected status for %s/livez under PINBOARD_BASE_PATH=%q; got %d; want 200", p, bp, got)
			}
		}
		if got := livez("/pinb%C3%B9ard"); got != fasthttp.StatusNotFound {
			t.Errorf("unexpected status for /pinb%%C3%%B9ard/livez under PINBOARD_BASE_PATH=%q; got %d; want 404", bp, got)
		}
	}
}

// PINBOARD_TRUSTED_PROXIES is comma or white space separated: a list
// written one entry per line (a YAML block scalar in a manifest, a
// mounted file) was refused at start-up, its newline taken as part of an
// address (R-SRV-3, R-PL-4).
func TestConfigTrustedProxiesOnePerLine_RSRV3(t *testing.T) {
	for _, v := range []string{"10.0.0.0/8\n192.168.1.7\n", "10.0.0.0/8,\n192.168.1.7", "10.0.0.0/8\r\n192.168.1.7", "10.0.0.0/8,\v192.168.1.7"} {
		kv := base()
		kv["PINBOARD_TRUSTED_PROXIES"] = v
		c, err := loadConfig(env(kv))
		if err != nil {
			t.Errorf("unexpected error for PINBOARD_TRUSTED_PROXIES=%q; got %v; want nil", v, err)
			continue
		}
		for _, a := range []string{"10.1.2.3", "192.168.1.7"} {
			if !c.Trusted.Trusted(netip.MustParseAddr(a)) {
				t.Errorf("unexpected Trusted(%s) for PINBOARD_TRUSTED_PROXIES=%q; got false; want true", a, v)
			}
		}
		if c.Trusted.Trusted(netip.MustParseAddr("192.168.1.8")) {
			t.Errorf("unexpected Trusted(192.168.1.8) for PINBOARD_TRUSTED_PROXIES=%q; got true; want false", v)
		}
	}
}

// A configuration error is one line however the value was written: a
// passport naming a token variable with a line break in it ("TOK\nEN")
// was printed over two lines, the second without the "pinboard:" prefix
// or the variable's name (R-SRV-2).
func TestConfigErrorOneLineWithControlCharacters_RSRV2(t *testing.T) {
	kv := base()
	kv["PINBOARD_PASSPORT"] = `{"providers":[{"type":"staticToken","id":"p","keys":[{"name":"k","token":{"env":"TOK\nEN\u001b"},"scopes":["pinboard:worker"]}]}]}`
	kv["HOST"], kv["PORT"] = "127.0.0.1", "0"
	// loadConfig first: run would serve for ever on a config it accepts.
	if _, err := loadConfig(env(kv)); err == nil {
		t.Fatal("unexpected acceptance of a passport naming an unset token variable; got nil; want an error")
	}
	var stderr bytes.Buffer
	code := run(nil, env(kv), &stderr)
	out := stderr.String()
	if code != 2 {
		t.Fatalf("unexpected exit code; got %d; want 2 (stderr %q)", code, out)
	}
	if strings.Count(out, "\n") != 1 || !strings.HasPrefix(out, "pinboard: PINBOARD_PASSPORT: ") || strings.ContainsAny(out[:len(out)-1], "\r\n\x1b") || !strings.Contains(out, `TOK\nEN\x1b`) {
		t.Fatalf("unexpected message; got %q; want one line naming PINBOARD_PASSPORT, the name escaped", out)
	}
}

// pinboard --help lists every variable loadConfig reads, and names none it
// does not read (R-SRV-3): the image carries the binary, not the docs.
func TestUsageListsEveryVariable_RSRV3(t *testing.T) {
	read := readVars(t, base())
	delete(read, "PINBOARD_TOKEN") // the passport's token.env, an example in the text
	listed := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^  ([A-Z][A-Z0-9_]+) `).FindAllStringSubmatch(usage, -1) {
		listed[m[1]] = true
	}
	for k := range read {
		if !listed[k] {
			t.Errorf("pinboard reads %s but pinboard --help does not list it", k)
		}
	}
	for k := range listed {
		if !read[k] {
			t.Errorf("pinboard --help lists %s, which pinboard does not read", k)
		}
	}
	for _, args := range [][]string{{"-h"}, {"-help"}, {"--help"}, {"help"}} {
		if !isHelp(args) {
			t.Errorf("unexpected isHelp(%q) false", args)
		}
	}
	for _, args := range [][]string{nil, {"--port", "1"}, {"--help", "x"}, {"-v"}} {
		if isHelp(args) {
			t.Errorf("unexpected isHelp(%q) true", args)
		}
	}
}

// Every default docs/OPERATIONS.md's and docs/PROTOCOL.md's tables give as
// a value (`15000`, `text`) is the one loadConfig applies: setting the
// variable to it changes nothing (R-SRV-3: the Node pinboard's defaults).
func TestOperationsTableDefaults_RSRV3(t *testing.T) {
	var doc []byte
	for _, f := range []string{"../../docs/OPERATIONS.md", "../../docs/PROTOCOL.md"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		doc = append(doc, b...)
	}
	row := regexp.MustCompile("(?m)^\\| `([A-Z][A-Z0-9_]*)` \\| `([^`]*)`")
	def, err := loadConfig(env(base()))
	if err != nil {
		t.Fatal(err)
	}
	norm := func(c *config) config {
		cc := *c
		cc.Passport, cc.Trusted = nil, nil
		if cc.BalanceFactor == 0 {
			cc.BalanceFactor = directory.DefaultBalanceFactor // what 0 means
		}
		return cc
	}
	n := 0
	for _, m := range row.FindAllStringSubmatch(string(doc), -1) {
		kv := base()
		kv[m[1]] = m[2]
		c, err := loadConfig(env(kv))
		if err != nil {
			t.Errorf("the documented default for %s, %q, does not load: %v", m[1], m[2], err)
			continue
		}
		if !reflect.DeepEqual(norm(c), norm(def)) {
			t.Errorf("unexpected documented default for %s; got %q; want what unset gives: %+v, not %+v", m[1], m[2], norm(def), norm(c))
		}
		n++
	}
	if n < 15 {
		t.Fatalf("found only %d documented defaults: has the tables' format changed?", n)
	}
}

// A PINBOARD_* variable pinboard does not read is named in a start-up
// warning, with the variable it most likely meant: PINBOARD_LEASE_TTL=5000
// (for PINBOARD_LEASE_TTL_MS) ran with the default 15 s lease, and
// pinboard_log_level=debug at info, without a word. A warning, not exit 2:
// an environment the Node pinboard starts with must start this one
// (R-SRV-3). The workers' and pinboardctl's PINBOARD_URL and
// PINBOARD_TOKEN, and the passport's token variables, are not warned
// about.
func TestUnreadVariablesWarned_RSRV3(t *testing.T) {
	kv := base()
	kv["PINBOARD_LEASE_TTL"] = "5000"
	kv["pinboard_log_level"] = "debug"
	kv["PINBOARD_TRUSTED_PROXY"] = "10.0.0.1"
	kv["PINBOARD_SOMETHING_ELSE"] = "1"
	kv["PINBOARD_URL"] = "http://pinboard:8080"
	kv["PINBOARDS"] = "x"
	// The passport's token variable, not named PINBOARD_TOKEN.
	kv["PINBOARD_PASSPORT"] = strings.Replace(goodPassport, `"env":"PINBOARD_TOKEN"`, `"env":"PINBOARD_DEPLOY_TOKEN"`, 1)
	kv["PINBOARD_DEPLOY_TOKEN"] = "t0ken"
	delete(kv, "PINBOARD_TOKEN")
	var list []string
	for k, v := range kv {
		list = append(list, k+"="+v)
	}
	was := environ
	environ = func() []string { return list }
	t.Cleanup(func() { environ = was })
	// The admin port already taken: run stops after the public listener
	// opened and the warnings were logged.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	kv["HOST"], kv["PORT"] = "127.0.0.1", "0"
	kv["PINBOARD_METRICS_ADDR"] = ln.Addr().String()
	var stderr bytes.Buffer
	if code := run(nil, env(kv), &stderr); code != 1 {
		t.Fatalf("unexpected exit code; got %d; want 1 (the admin port is taken); stderr %q", code, stderr.String())
	}
	out := stderr.String()
	for _, want := range []string{
		`"PINBOARD_LEASE_TTL is set but pinboard does not read it (did you mean PINBOARD_LEASE_TTL_MS?)"`,
		`"pinboard_log_level is set but pinboard does not read it (did you mean PINBOARD_LOG_LEVEL?)"`,
		`"PINBOARD_TRUSTED_PROXY is set but pinboard does not read it (did you mean PINBOARD_TRUSTED_PROXIES?)"`,
		`"PINBOARD_SOMETHING_ELSE is set but pinboard does not read it"`,
	} {
		if !strings.Contains(out, "msg=environment warning="+want) {
			t.Errorf("missing warning %s; got\n%s", want, out)
		}
	}
	for _, not := range []string{"PINBOARD_URL", "PINBOARD_DEPLOY_TOKEN", "PINBOARDS", "PINBOARD_SOMETHING_ELSE is set but pinboard does not read it (did"} {
		if strings.Contains(out, not) {
			t.Errorf("unexpected warning naming %s; got\n%s", not, out)
		}
	}
}

// The variables Kubernetes sets for each Service of the pod's namespace
// (enableServiceLinks, on by default) are not warned about: the Service
// of deploy/kubernetes is named pinboard, and each pod started with eight
// warnings, one "PINBOARD_PORT is set but pinboard does not read it (did
// you mean PINBOARD_PPROF?)". The same names without the Service's
// PINBOARD_SERVICE_HOST are still someone's typo (R-SRV-3).
func TestKubernetesServiceLinksNotWarned_RSRV3(t *testing.T) {
	links := func(svc, ip string) []string {
		return []string{
			svc + "_SERVICE_HOST=" + ip, svc + "_SERVICE_PORT=80", svc + "_SERVICE_PORT_HTTP=80",
			svc + "_PORT=tcp://" + ip + ":80", svc + "_PORT_80_TCP=tcp://" + ip + ":80",
			svc + "_PORT_80_TCP_PROTO=tcp", svc + "_PORT_80_TCP_PORT=80", svc + "_PORT_80_TCP_ADDR=" + ip,
		}
	}
	read := map[string]bool{"PORT": true, "PINBOARD_PPROF": true, "PINBOARD_REGISTRY_WORKERS": true}
	environ := append(links("PINBOARD", "10.96.0.12"), links("PINBOARD_REGISTRY", "10.96.0.13")...)
	environ = append(environ, "PINBOARD_REGISTRY_WORKERS=32", "REDIS_SERVICE_HOST=10.96.0.14")
	if got := unreadVars(environ, read); len(got) != 0 {
		t.Errorf("unexpected warnings for a Service's variables; got %q; want none", got)
	}
	// Without PINBOARD_SERVICE_HOST no Service set them.
	got := unreadVars(append(links("PINBOARD", "10.96.0.12")[1:], "PINBOARD_SERVICE_PORTS=80"), read)
	if want := 8; len(got) != want || !slices.Contains(got, "PINBOARD_PORT is set but pinboard does not read it (did you mean PINBOARD_PPROF?)") {
		t.Errorf("unexpected warnings without the Service's host variable; got %q; want %d, PINBOARD_PORT's among them", got, want)
	}
}

// Every variable read for the server reaches server.Options: the
// affinity guard and the trusted proxies (R-PL-4), the lease (R-LS-1) and
// the base path among them. Dropped on the way, a variable was read and
// checked, and then did nothing.
func TestServerOptions_RPL4_RLS1(t *testing.T) {
	kv := base()
	kv["PINBOARD_LEASE_TTL_MS"] = "3000"
	kv["PINBOARD_TRUSTED_PROXIES"] = "10.0.0.0/8"
	kv["PINBOARD_AFFINITY_BALANCE_FACTOR"] = "1.5"
	kv["PINBOARD_BASE_PATH"] = "/pb"
	kv["PINBOARD_SHUTDOWN_DELAY_MS"] = "5000"
	c, err := loadConfig(env(kv))
	if err != nil {
		t.Fatal(err)
	}
	store := directory.NewMemory(c.LeaseTTL, time.Now())
	o := serverOptions(c, store, nil, nil)
	if o.Store != store || o.Passport != c.Passport || o.BalanceFactor != 1.5 || o.TrustedProxies != c.Trusted ||
		o.LeaseTTL != 3*time.Second || o.BasePath != "/pb" || o.Upstream != c.Upstream || o.ProbeTimeout != c.ProbeTimeout ||
		o.ReadTimeout != c.ReadTimeout || o.IdleTimeout != c.IdleTimeout || o.HeaderTimeout != c.HeaderTimeout ||
		o.RegistryWorkers != c.RegWorkers || o.RegistryMinWorkers != c.RegMinWorkers || o.RegistryQueue != c.RegQueue ||
		o.AccessLogSample != c.AccessSample || o.Pprof != c.Pprof || o.ShutdownDelay != 5*time.Second {
		t.Fatalf("unexpected server options; got %+v; want those of %+v", o, c)
	}
}
