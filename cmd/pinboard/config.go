package main

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pinboard-go/pinboard/attest"
	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/proxy"
	"github.com/pinboard-go/pinboard/server"
)

// config is everything the environment configures. Environment parsing
// lives only here (house style): packages take Options structs.
type config struct {
	Addr          string
	Passport      *attest.Passport
	RedisURL      string
	LeaseTTL      time.Duration
	BalanceFactor float64
	Trusted       *proxy.TrustedProxies
	BasePath      string
	ProbeTimeout  time.Duration
	RegWorkers    int
	RegMinWorkers int // 0: registry's default
	RegQueue      int
	Upstream      proxy.UpstreamOptions
	ReadTimeout   time.Duration
	IdleTimeout   time.Duration
	HeaderTimeout time.Duration
	Grace         time.Duration
	Delay         time.Duration // PINBOARD_SHUTDOWN_DELAY_MS
	LogLevel      string
	LogFormat     string
	MetricsAddr   string
	Pprof         bool
	AccessSample  float64
}

// configError names the variable at fault; main prints it on one line and
// exits 2.
type configError struct {
	Var string
	Err error
}

func (e *configError) Error() string { return e.Var + ": " + oneLine(e.Err.Error()) }

// oneLine escapes the control characters of msg ("\n" for a line feed):
// main prints a configuration error as one line, and a message may
// repeat a value as it was written — a passport's token.env name holding
// a line break split it in two.
func oneLine(msg string) string {
	if strings.IndexFunc(msg, isControl) < 0 {
		return msg
	}
	var b strings.Builder
	for _, r := range msg {
		if isControl(r) {
			b.WriteString(strings.Trim(strconv.QuoteRune(r), "'"))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

func bad(name, format string, args ...any) error {
	return &configError{Var: name, Err: fmt.Errorf(format, args...)}
}

// loadConfig reads the Node pinboard's variables with the same meaning and
// defaults (R-SRV-2, R-SRV-3), plus this binary's tuning knobs (all
// optional, documented in docs/OPERATIONS.md).
func loadConfig(lookup func(string) (string, bool)) (*config, error) {
	get := func(name string) string {
		v, _ := lookup(name)
		return strings.TrimSpace(v)
	}
	c := &config{}

	port := get("PORT")
	if port == "" {
		port = "8080"
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return nil, bad("PORT", "must be a port number, got %q", port)
	}
	host := get("HOST")
	if err := checkListenHost(host); err != nil {
		return nil, bad("HOST", "%v, got %q", err, host)
	}
	c.Addr = net.JoinHostPort(host, port)

	raw, ok := lookup("PINBOARD_PASSPORT")
	if !ok || strings.TrimSpace(raw) == "" {
		return nil, bad("PINBOARD_PASSPORT", "is required (a JSON passport; see README.md)")
	}
	pp, err := attest.ParsePassport([]byte(raw), lookup)
	if err != nil {
		return nil, &configError{Var: "PINBOARD_PASSPORT", Err: err}
	}
	c.Passport = pp

	c.RedisURL = get("REDIS_URL")
	if c.RedisURL == "" {
		return nil, bad("REDIS_URL", "is required: redis://host:6379, rediss://…, redis+cluster://…, redis+sentinel://… or memory:")
	}
	c.RedisURL = lowerScheme(c.RedisURL)
	if err := checkStoreURL(c.RedisURL); err != nil {
		return nil, &configError{Var: "REDIS_URL", Err: err}
	}

	if c.LeaseTTL, err = durationMs(get, "PINBOARD_LEASE_TTL_MS", 15000, 100); err != nil {
		return nil, err
	}
	c.BalanceFactor = 0
	if v := get("PINBOARD_AFFINITY_BALANCE_FACTOR"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 1 || math.IsInf(f, 0) || math.IsNaN(f) {
			return nil, bad("PINBOARD_AFFINITY_BALANCE_FACTOR", "must be a number >= 1, got %q", v)
		}
		c.BalanceFactor = f
	}
	// Any white space separates entries: a list written one per line (a
	// YAML block scalar, a Secret file) held "\n10.0.0.0/8", refused as
	// a malformed address.
	trusted := strings.Join(strings.Fields(get("PINBOARD_TRUSTED_PROXIES")), " ")
	if c.Trusted, err = proxy.ParseTrustedProxies(trusted); err != nil {
		return nil, &configError{Var: "PINBOARD_TRUSTED_PROXIES", Err: err}
	}
	c.BasePath = get("PINBOARD_BASE_PATH")
	if err := server.CheckBasePath(c.BasePath); err != nil {
		return nil, &configError{Var: "PINBOARD_BASE_PATH", Err: err} // the library's rule, checked before anything starts
	}
	if c.ProbeTimeout, err = durationMs(get, "PINBOARD_PROBE_TIMEOUT_MS", 2000, 10); err != nil {
		return nil, err
	}
	if c.RegWorkers, err = intVar(get, "PINBOARD_REGISTRY_WORKERS", 64, 1); err != nil {
		return nil, err
	}
	if c.RegMinWorkers, err = intVar(get, "PINBOARD_REGISTRY_MIN_WORKERS", 0, 1); err != nil {
		return nil, err
	}
	if c.RegMinWorkers > c.RegWorkers {
		return nil, bad("PINBOARD_REGISTRY_MIN_WORKERS", "must be at most PINBOARD_REGISTRY_WORKERS (%d), got %d", c.RegWorkers, c.RegMinWorkers)
	}
	if c.RegQueue, err = intVar(get, "PINBOARD_REGISTRY_QUEUE", 4096, 1); err != nil {
		return nil, err
	}
	if c.Upstream.MaxConns, err = intVar(get, "PINBOARD_UPSTREAM_MAX_CONNS", 1024, 1); err != nil {
		return nil, err
	}
	if c.Upstream.IdleTimeout, err = durationMs(get, "PINBOARD_UPSTREAM_IDLE_MS", 2000, 1); err != nil {
		return nil, err
	}
	if c.Upstream.DialTimeout, err = durationMs(get, "PINBOARD_UPSTREAM_DIAL_TIMEOUT_MS", 2000, 1); err != nil {
		return nil, err
	}
	if c.Upstream.ResponseHeaderTimeout, err = durationMs(get, "PINBOARD_UPSTREAM_HEADER_TIMEOUT_MS", 300000, 1); err != nil {
		return nil, err
	}
	if c.Upstream.ConnWait, err = durationMs(get, "PINBOARD_UPSTREAM_CONN_WAIT_MS", 2000, 1); err != nil {
		return nil, err
	}
	if c.Upstream.StallTimeout, err = durationMs(get, "PINBOARD_STALL_TIMEOUT_MS", 60000, 0); err != nil {
		return nil, err
	}
	if c.Upstream.StallTimeout == 0 {
		c.Upstream.StallTimeout = -1 // 0 turns it off; the proxy's 0 means its default
	}
	if c.ReadTimeout, err = durationMs(get, "PINBOARD_READ_TIMEOUT_MS", 0, 0); err != nil {
		return nil, err
	}
	if c.IdleTimeout, err = durationMs(get, "PINBOARD_IDLE_TIMEOUT_MS", 75000, 1); err != nil {
		return nil, err
	}
	if c.HeaderTimeout, err = durationMs(get, "PINBOARD_HEADER_TIMEOUT_MS", 30000, 1); err != nil {
		return nil, err
	}
	if c.Grace, err = durationMs(get, "PINBOARD_SHUTDOWN_GRACE_MS", 25000, 0); err != nil {
		return nil, err
	}
	if c.Delay, err = durationMs(get, "PINBOARD_SHUTDOWN_DELAY_MS", 0, 0); err != nil {
		return nil, err
	}
	c.LogLevel = strings.ToLower(get("PINBOARD_LOG_LEVEL"))
	switch c.LogLevel {
	case "":
		c.LogLevel = "info"
	case "debug", "info", "warn", "error":
	default:
		return nil, bad("PINBOARD_LOG_LEVEL", "must be debug, info, warn or error, got %q", c.LogLevel)
	}
	c.LogFormat = strings.ToLower(get("PINBOARD_LOG_FORMAT"))
	switch c.LogFormat {
	case "":
		c.LogFormat = "text"
	case "text", "json":
	default:
		return nil, bad("PINBOARD_LOG_FORMAT", "must be text or json, got %q", c.LogFormat)
	}
	switch v := get("PINBOARD_PPROF"); v {
	case "", "0", "false":
	case "1", "true":
		c.Pprof = true
	default:
		return nil, bad("PINBOARD_PPROF", "must be 0, 1, false or true, got %q", v)
	}
	c.MetricsAddr = get("PINBOARD_METRICS_ADDR")
	if c.MetricsAddr != "" {
		h, p, err := net.SplitHostPort(c.MetricsAddr)
		// The port must be 0..65535 or a service name, and the host what
		// HOST accepts, or net.Listen would refuse it only after the store
		// was opened.
		if err != nil {
			return nil, bad("PINBOARD_METRICS_ADDR", "must be host:port, got %q", c.MetricsAddr)
		}
		mport, perr := net.LookupPort("tcp", p)
		if perr != nil {
			return nil, bad("PINBOARD_METRICS_ADDR", "port must be 0-65535 or a service name, got %q", c.MetricsAddr)
		}
		if herr := checkListenHost(h); herr != nil {
			return nil, bad("PINBOARD_METRICS_ADDR", "host %v, got %q", herr, c.MetricsAddr)
		}
		// The public listener binds first: on its port the admin one
		// could only fail after it, exit 1, restarted for ever.
		if pport, _ := strconv.Atoi(port); mport != 0 && mport == pport && sameListenHost(h, host) {
			return nil, bad("PINBOARD_METRICS_ADDR", "must not be the public listener's address %s (HOST, PORT), got %q", c.Addr, c.MetricsAddr)
		}
	}
	// pprof is served on the admin listener only: without it the setting
	// would do nothing, silently.
	if c.Pprof && c.MetricsAddr == "" {
		return nil, bad("PINBOARD_PPROF", "needs PINBOARD_METRICS_ADDR (profiles are served on the admin listener only)")
	}
	if v := get("PINBOARD_ACCESS_LOG_SAMPLE"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || f > 1 || math.IsNaN(f) {
			return nil, bad("PINBOARD_ACCESS_LOG_SAMPLE", "must be a number from 0 to 1, got %q", v)
		}
		c.AccessSample = f
	}
	return c, nil
}

// checkListenHost accepts what net.Listen takes as the host part of an
// address: empty (all interfaces), an IP literal without brackets ("::1")
// or a DNS name. A bracketed or host:port value would only fail at listen
// time, after the store was opened.
func checkListenHost(h string) error {
	if h == "" {
		return nil
	}
	if _, err := netip.ParseAddr(h); err == nil {
		return nil
	}
	numeric := true
	for _, label := range strings.Split(strings.TrimSuffix(h, "."), ".") {
		if label == "" {
			return fmt.Errorf("must be an IP address (no brackets) or a host name")
		}
		numeric = numeric && strings.Trim(label, "0123456789") == ""
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("must be an IP address (no brackets) or a host name")
			}
		}
	}
	if numeric {
		// "1.2.3", "1.2.3.4.": no address, and no name a resolver
		// answers (a top-level label is never all digits); refused here
		// rather than by the listen, after the store was opened.
		return fmt.Errorf("is not an IP address (a host name's last label is not all digits)")
	}
	return nil
}

// sameListenHost reports whether listeners on hosts a and b, as checked
// by checkListenHost, would clash on one port: the same host, either one
// all interfaces, or a name and an address that bind alike (localhost
// and 127.0.0.1). A name that does not resolve clashes with nothing here;
// its listen reports it.
func sameListenHost(a, b string) bool {
	all := func(h string) bool {
		ip, err := netip.ParseAddr(h)
		return h == "" || err == nil && ip.IsUnspecified()
	}
	if all(a) || all(b) || strings.EqualFold(a, b) {
		return true
	}
	ia, oka := bindAddr(a)
	ib, okb := bindAddr(b)
	return oka && okb && (ia == ib || ia.IsUnspecified() || ib.IsUnspecified())
}

// bindAddr is the address net.Listen binds for host h: h itself when it
// is one, else the first IPv4 address of those the resolver answers
// within a second (/etc/hosts for localhost), or the first address when
// there is none — as net.Listen picks. A name resolving to 127.0.0.1 and
// ::1 binds 127.0.0.1, so an admin listener on [::1] does not clash.
func bindAddr(h string) (netip.Addr, bool) {
	if ip, err := netip.ParseAddr(h); err == nil {
		return ip.Unmap(), true
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	ips, _ := net.DefaultResolver.LookupNetIP(ctx, "ip", h)
	if len(ips) == 0 {
		return netip.Addr{}, false
	}
	for _, ip := range ips {
		if ip.Unmap().Is4() {
			return ip.Unmap(), true
		}
	}
	return ips[0], true
}

// checkStoreURL accepts the store schemes; anything else is a start-up
// error rather than a surprise at the first request.
func checkStoreURL(u string) error {
	if u == "memory:" || u == "memory://" {
		return nil
	}
	scheme, _, ok := strings.Cut(u, "://")
	if !ok {
		// Not a URL, so nothing marks where a password ends but its
		// "@": what comes before the last one is left out, as
		// directory.ParseRedisURL leaves a URL's password out ("default:
		// pw@host:6379", a scheme forgotten, went to the log whole).
		if i := strings.LastIndexByte(u, '@'); i >= 0 {
			u = "xxxxx" + u[i:]
		}
		return fmt.Errorf("unknown scheme in %q: use memory: or redis://, rediss://, redis+cluster://, redis+sentinel://", u)
	}
	switch scheme {
	case "redis", "rediss", "redis+cluster", "rediss+cluster", "redis+sentinel", "rediss+sentinel":
		_, err := directory.ParseRedisURL(u)
		return err
	}
	return fmt.Errorf("unknown scheme %q: use memory: or redis://, rediss://, redis+cluster://, redis+sentinel://", scheme)
}

func durationMs(get func(string) string, name string, def, min int64) (time.Duration, error) {
	v := get(name)
	if v == "" {
		return time.Duration(def) * time.Millisecond, nil
	}
	const max = 30 * 24 * 3600 * 1000 // 30 days: any timeout past it is a typo
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < min || n > max {
		return 0, bad(name, "must be an integer number of milliseconds from %d to %d (30 days), got %q", min, max, v)
	}
	return time.Duration(n) * time.Millisecond, nil
}

// maxIntVar bounds every integer variable: the registry's pool (ants)
// holds its capacity in an int32, so PINBOARD_REGISTRY_WORKERS=4294967297
// ("no limit") became a pool of one and 4294967296 one of none, every
// register and heartbeat queued until it was answered 503, silently.
const maxIntVar = math.MaxInt32

func intVar(get func(string) string, name string, def, min int) (int, error) {
	v := get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < min || n > maxIntVar {
		return 0, bad(name, "must be an integer from %d to %d, got %q", min, maxIntVar, v)
	}
	return n, nil
}

// lowerScheme writes a URL's scheme in lower case: schemes are
// case-insensitive (RFC 3986 §3.1), and a Node pinboard's REDIS_URL of
// REDIS://host or Memory: is taken by its URL parser.
func lowerScheme(u string) string {
	i := strings.IndexByte(u, ':')
	if i <= 0 || strings.IndexFunc(u[:i], func(r rune) bool {
		return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '+' || r == '-' || r == '.')
	}) >= 0 {
		return u // no scheme: checkStoreURL says so
	}
	return strings.ToLower(u[:i]) + u[i:]
}

// environ lists the process's environment as KEY=value; a variable for
// tests.
var environ = os.Environ

// notPinboards are PINBOARD_* variables that belong to the programs
// beside pinboard — workers and pinboardctl read PINBOARD_URL and
// PINBOARD_TOKEN — and commonly share its environment.
var notPinboards = map[string]bool{"PINBOARD_URL": true, "PINBOARD_TOKEN": true}

// unreadVars returns a warning for each PINBOARD_* variable of environ
// (any case) that pinboard did not read (read: the names loadConfig
// looked up, the passport's token.env names included) and no Kubernetes
// Service set (serviceLink), naming the variable it most likely meant.
// PINBOARD_LEASE_TTL=5000 for PINBOARD_LEASE_TTL_MS ran with the default
// 15 s lease without a word. A warning, not a configuration error: an
// environment the Node pinboard starts with must start this one too
// (R-SRV-3, drop-in).
func unreadVars(environ []string, read map[string]bool) []string {
	services := map[string]bool{}
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if svc, ok := strings.CutSuffix(name, "_SERVICE_HOST"); ok {
			services[svc] = true
		}
	}
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		const prefix = "PINBOARD_"
		if len(name) <= len(prefix) || !strings.EqualFold(name[:len(prefix)], prefix) || read[name] || notPinboards[name] || serviceLink(name, services) {
			continue
		}
		w := name + " is set but pinboard does not read it"
		if near := nearestVar(name, read); near != "" {
			w += " (did you mean " + near + "?)"
		}
		out = append(out, w)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// serviceLink reports whether name is one of the variables Kubernetes
// sets in every container for each Service of its namespace
// (enableServiceLinks, on by default): for a Service named X,
// X_SERVICE_HOST, X_SERVICE_PORT[_<port name>], X_PORT and
// X_PORT_<port>_<PROTO>[_PROTO|_PORT|_ADDR], X in upper case with "_" for
// "-". services holds the X of each X_SERVICE_HOST in the environment. A
// Service named pinboard (deploy/kubernetes's, and pinboard-registry
// beside it: docs/OPERATIONS.md) gave every pod eight PINBOARD_*
// variables pinboard does not read, each warned about at every start,
// PINBOARD_PORT with "did you mean PINBOARD_PPROF?".
func serviceLink(name string, services map[string]bool) bool {
	for svc := range services {
		rest, ok := strings.CutPrefix(name, svc+"_")
		if !ok {
			continue
		}
		if rest == "SERVICE_HOST" || rest == "SERVICE_PORT" || strings.HasPrefix(rest, "SERVICE_PORT_") ||
			rest == "PORT" || strings.HasPrefix(rest, "PORT_") {
			return true
		}
	}
	return false
}

// nearestVar returns the name in read closest to name — the same in
// another case, or with _MS added or dropped, or at most three edits
// away — or "" when none is.
func nearestVar(name string, read map[string]bool) string {
	up := strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
	best, bestD := "", 4
	for k := range read {
		d := editDistance(up, k)
		if strings.TrimSuffix(up, "_MS") == strings.TrimSuffix(k, "_MS") {
			d = 0
		}
		if d < bestD || d == bestD && k < best {
			best, bestD = k, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
