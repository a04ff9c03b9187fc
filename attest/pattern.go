package attest

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/pinboard-go/pinboard/internal/ascii"
)

// Pattern grammar shared by passport claims and namespace policies (R-TR-3,
// R-TR-4):
//
//   - Namespace patterns: "*" matches every namespace; a pattern containing
//     '*' is a glob where '*' matches any run of characters; anything else
//     matches exactly. Namespaces are written "/counters" on the wire, but
//     operators write "counters" too, so patterns and inputs are compared
//     without their leading slash.
//   - Hostname patterns (claims.pinboard.hostnames): the same globs, compared
//     case-insensitively (RFC 4343).
//   - Env patterns (claims.pinboard.envs): the same globs, case-sensitive.
//   - Backend host patterns (claims.pinboard.allowedBackendHosts): see
//     hostPattern.

// normalizeNamespacePattern returns p without its leading slash, rejecting
// patterns that could never match a namespace.
func normalizeNamespacePattern(p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("empty namespace pattern")
	}
	n := strings.TrimPrefix(p, "/")
	if n == "" {
		return "", fmt.Errorf("namespace pattern %q names no namespace", p)
	}
	// The reference worker requires namespaces to match /[^/\s]+ (pinned
	// hosting/host.py), so a pattern holding '/' or white space is a typo.
	if i := strings.IndexFunc(n, func(r rune) bool { return r == '/' || unicode.IsSpace(r) }); i >= 0 {
		r, _ := utf8.DecodeRuneInString(n[i:])
		return "", fmt.Errorf("namespace pattern %q: a namespace is one path segment and cannot hold %q", p, r)
	}
	return n, nil
}

// trimNamespace strips the one leading slash namespaces carry on the wire.
func trimNamespace[T ~string | ~[]byte](ns T) T {
	if len(ns) > 0 && ns[0] == '/' {
		return ns[1:]
	}
	return ns
}

// globMatch reports whether s matches pattern, where '*' matches any run of
// bytes (including none). With fold, ASCII letters compare case-insensitively;
// pattern must then already be lower case. It allocates nothing and runs in
// O(len(pattern)·len(s)) at worst, using the classic single backtrack point.
func globMatch[T ~string | ~[]byte](pattern string, s T, fold bool) bool {
	p, i := 0, 0
	star, mark := -1, 0
	for i < len(s) {
		if p < len(pattern) {
			pc := pattern[p]
			if pc == '*' {
				star, mark = p, i
				p++
				continue
			}
			c := s[i]
			if fold {
				c = ascii.LowerByte(c)
			}
			if pc == c {
				p++
				i++
				continue
			}
		}
		if star < 0 {
			return false
		}
		p = star + 1
		mark++
		i = mark
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}

// hostKind says how a hostPattern matches.
type hostKind uint8

const (
	hostAny    hostKind = iota // "*" or "*:8000"
	hostName                   // "worker.internal"
	hostSuffix                 // "*.internal": any subdomain, not the apex
	hostAddr                   // "10.0.3.7", "::1"
	hostPrefix                 // "10.0.0.0/8", "::1/128"
)

// hostPattern is one compiled allowedBackendHosts entry. R-TR-3 exists so a
// worker credential cannot register an advertise URL pointing at an
// arbitrary internal host (pinboard would then probe and proxy to it), so the
// grammar is deliberately small and every entry is validated at start-up:
//
//   - any host, any port
//     worker.internal     that hostname (case-insensitive), any port
//     *.internal          any subdomain of internal, not internal itself
//     10.0.3.7, ::1       that IP literal, any port
//     10.0.3.7:8000       that host on port 8000 only (also name:port,
//     [::1]:8000, *:8000, *.internal:8000)
//     10.0.0.0/8          any IP literal inside the prefix, any port
//
// A port-less URL matches ports through its scheme default (80 or 443).
type hostPattern struct {
	kind   hostKind
	name   string // hostName: lower-case name; hostSuffix: "." + lower-case parent
	addr   netip.Addr
	prefix netip.Prefix
	port   string // "" matches every port
}

// parseHostPattern compiles one allowedBackendHosts entry.
func parseHostPattern(s string) (hostPattern, error) {
	if s == "" {
		return hostPattern{}, fmt.Errorf("empty host pattern")
	}
	if strings.Contains(s, "/") {
		pfx, err := netip.ParsePrefix(s)
		if err != nil {
			return hostPattern{}, fmt.Errorf("cannot parse CIDR %q: %w", s, err)
		}
		pfx = netip.PrefixFrom(pfx.Addr().Unmap(), unmappedBits(pfx)).Masked()
		return hostPattern{kind: hostPrefix, prefix: pfx}, nil
	}
	host, port, err := splitPatternHostPort(s)
	if err != nil {
		return hostPattern{}, err
	}
	hp := hostPattern{port: port}
	switch {
	case host == "*":
		hp.kind = hostAny
	case strings.HasPrefix(host, "*."):
		parent := strings.ToLower(host[2:])
		if err := checkHostname(parent); err != nil {
			return hostPattern{}, fmt.Errorf("host pattern %q: %w", s, err)
		}
		hp.kind, hp.name = hostSuffix, "."+parent
	case strings.Contains(host, "*"):
		return hostPattern{}, fmt.Errorf("host pattern %q: '*' is only allowed alone or as the leading label (\"*.internal\")", s)
	default:
		if addr, err := netip.ParseAddr(host); err == nil {
			hp.kind, hp.addr = hostAddr, addr.Unmap()
			break
		}
		name := strings.ToLower(strings.TrimSuffix(host, "."))
		if err := checkHostname(name); err != nil {
			return hostPattern{}, fmt.Errorf("host pattern %q: %w", s, err)
		}
		hp.kind, hp.name = hostName, name
	}
	return hp, nil
}

// unmappedBits keeps "::ffff:10.0.0.0/104" equivalent to "10.0.0.0/8".
func unmappedBits(p netip.Prefix) int {
	if p.Addr().Is4In6() {
		return max(p.Bits()-96, 0)
	}
	return p.Bits()
}

// splitPatternHostPort splits "host", "host:port", "[v6]" and "[v6]:port";
// a bare IPv6 literal ("::1") has no port.
func splitPatternHostPort(s string) (host, port string, err error) {
	switch {
	case strings.HasPrefix(s, "["):
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return "", "", fmt.Errorf("host pattern %q: missing ']'", s)
		}
		rest := s[end+1:]
		host = s[1:end]
		if _, err := netip.ParseAddr(host); err != nil {
			return "", "", fmt.Errorf("host pattern %q: brackets must hold an IPv6 literal: %w", s, err)
		}
		if rest == "" {
			return host, "", nil
		}
		if rest[0] != ':' {
			return "", "", fmt.Errorf("host pattern %q: unexpected %q after ']'", s, rest)
		}
		port = rest[1:]
	case strings.Count(s, ":") == 1:
		i := strings.IndexByte(s, ':')
		host, port = s[:i], s[i+1:]
	default:
		return s, "", nil
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 || port[0] == '+' {
		return "", "", fmt.Errorf("host pattern %q: port must be 1..65535", s)
	}
	return host, port, nil
}

// checkHostname accepts DNS names as operators write them (letters, digits,
// '-', '_', dots between non-empty labels).
func checkHostname(name string) error {
	if name == "" {
		return fmt.Errorf("empty hostname")
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" {
			return fmt.Errorf("hostname %q has an empty label", name)
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("hostname %q contains %q", name, c)
			}
		}
	}
	return nil
}

// match reports whether the URL host (brackets stripped, any case) and its
// effective port satisfy the pattern.
func (hp *hostPattern) match(host string, addr netip.Addr, isAddr bool, port string) bool {
	if hp.port != "" && hp.port != port {
		return false
	}
	switch hp.kind {
	case hostAny:
		return true
	case hostName:
		return !isAddr && ascii.EqualFold(host, hp.name)
	case hostSuffix:
		return !isAddr && len(host) > len(hp.name) && ascii.EqualFold(host[len(host)-len(hp.name):], hp.name)
	case hostAddr:
		return isAddr && addr == hp.addr
	case hostPrefix:
		return isAddr && hp.prefix.Contains(addr)
	}
	return false
}
