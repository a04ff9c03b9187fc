package attest

import (
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strings"

	"github.com/pinboard-go/pinboard/internal/ascii"
)

// Claims is the compiled claims.pinboard object of a passport key: what a
// principal may touch (R-TR-3). A missing namespaces or allowedBackendHosts
// list covers nothing, so a key without claims can authenticate but reaches
// no namespace, registers no worker and sees no worker in GET
// /registry/workers. hostnames and envs narrow a key only when present: the
// guide's deployment passport has neither, and a Node passport that works
// with hostname-aware workers must keep working here (docs/PROTOCOL.md).
//
// The zero Claims covers nothing. Claims is immutable once parsed and safe
// for concurrent use.
type Claims struct {
	namespaces []string      // globs without the leading slash
	backends   []hostPattern // allowedBackendHosts
	hostnames  []string      // lower-case globs
	envs       []string      // globs
	// hasHostnames/hasEnvs: the list was given (possibly empty).
	hasHostnames, hasEnvs bool
}

// parseClaims compiles the pinboard part of a key's claims object. path names
// the pinboard object in errors and warnings ("…claims.pinboard").
func parseClaims(obj jsonObject, path string, warn func(string)) (Claims, error) {
	var c Claims
	warnUnknown(obj, path, warn, "namespaces", "allowedBackendHosts", "hostnames", "envs")
	if raw, ok := obj["namespaces"]; ok {
		pats, err := decodeStrings(raw, "namespaces")
		if err != nil {
			return Claims{}, err
		}
		for i, p := range pats {
			n, err := normalizeNamespacePattern(p)
			if err != nil {
				return Claims{}, fmt.Errorf("namespaces[%d]: %w", i, err)
			}
			c.namespaces = append(c.namespaces, n)
		}
	}
	if raw, ok := obj["allowedBackendHosts"]; ok {
		pats, err := decodeStrings(raw, "allowedBackendHosts")
		if err != nil {
			return Claims{}, err
		}
		for i, p := range pats {
			hp, err := parseHostPattern(p)
			if err != nil {
				return Claims{}, fmt.Errorf("allowedBackendHosts[%d]: %w", i, err)
			}
			c.backends = append(c.backends, hp)
		}
	}
	if raw, ok := obj["hostnames"]; ok {
		c.hasHostnames = true
		pats, err := decodeStrings(raw, "hostnames")
		if err != nil {
			return Claims{}, err
		}
		for i, p := range pats {
			if p == "" {
				return Claims{}, fmt.Errorf("hostnames[%d]: empty hostname pattern", i)
			}
			// Registered hostnames lose the trailing dot of a fully
			// qualified name; so do the patterns they are matched against.
			if len(p) > 1 && p[len(p)-1] == '.' {
				p = p[:len(p)-1]
			}
			c.hostnames = append(c.hostnames, ascii.Lower(p))
		}
	}
	if raw, ok := obj["envs"]; ok {
		c.hasEnvs = true
		pats, err := decodeStrings(raw, "envs")
		if err != nil {
			return Claims{}, err
		}
		for i, p := range pats {
			if p == "" {
				return Claims{}, fmt.Errorf("envs[%d]: empty env pattern", i)
			}
			c.envs = append(c.envs, p)
		}
	}
	return c, nil
}

// CoversAll reports whether the claims reach every namespace, hostname
// and env ("*", or no hostnames or envs list): the principal may act where
// none of them is known (a client id with no live session, a placement
// whose owner is gone).
func (c *Claims) CoversAll() bool {
	return slices.Contains(c.namespaces, "*") && (!c.hasHostnames || slices.Contains(c.hostnames, "*")) &&
		(!c.hasEnvs || slices.Contains(c.envs, "*"))
}

// CoversNamespace reports whether the claims reach namespace ns, written with
// or without its leading slash ("/counters" or "counters"). It allocates
// nothing.
func (c *Claims) CoversNamespace(ns string) bool {
	return coversNamespace(c, ns)
}

// coversNamespace is CoversNamespace for the []byte namespaces the data plane
// parses out of request paths.
func coversNamespace[T ~string | ~[]byte](c *Claims, ns T) bool {
	ns = trimNamespace(ns)
	for _, p := range c.namespaces {
		if globMatch(p, ns, false) {
			return true
		}
	}
	return false
}

// CoversHostname reports whether the claims reach a worker's hostname binding
// (the register body's "hostname"), compared case-insensitively. Claims
// without a hostnames list do not restrict hostnames.
func (c *Claims) CoversHostname(hostname string) bool {
	if !c.hasHostnames {
		return true
	}
	for _, p := range c.hostnames {
		if globMatch(p, hostname, true) {
			return true
		}
	}
	return false
}

// CoversEnv reports whether the claims reach a worker env (the register
// body's "env" or one of its "envs"). Claims without an envs list do not
// restrict envs.
func (c *Claims) CoversEnv(env string) bool {
	if !c.hasEnvs {
		return true
	}
	for _, p := range c.envs {
		if globMatch(p, env, false) {
			return true
		}
	}
	return false
}

// CheckBackend returns nil when advertiseURL may be registered under these
// claims, and otherwise says why not (R-TR-3). The URL must be absolute
// http or https with a host and nothing that could smuggle another target:
// no user info, query or fragment. Its host must match allowedBackendHosts;
// a URL without a port is matched on its scheme's default port.
func (c *Claims) CheckBackend(advertiseURL string) error {
	u, err := url.Parse(advertiseURL)
	if err != nil {
		return fmt.Errorf("cannot parse advertise URL %q: %w", advertiseURL, err)
	}
	port := u.Port()
	switch u.Scheme {
	case "http":
		if port == "" {
			port = "80"
		}
	case "https":
		if port == "" {
			port = "443"
		}
	default:
		return fmt.Errorf("advertise URL %q: scheme must be http or https", advertiseURL)
	}
	switch {
	case u.Host == "" || u.Hostname() == "":
		return fmt.Errorf("advertise URL %q has no host", advertiseURL)
	case u.User != nil:
		return fmt.Errorf("advertise URL %q must not carry user info", advertiseURL)
	case u.RawQuery != "" || u.ForceQuery:
		return fmt.Errorf("advertise URL %q must not carry a query", advertiseURL)
	case u.Fragment != "" || strings.Contains(advertiseURL, "#"):
		return fmt.Errorf("advertise URL %q must not carry a fragment", advertiseURL)
	}
	host := strings.TrimSuffix(u.Hostname(), ".")
	addr, aerr := netip.ParseAddr(host)
	isAddr := aerr == nil
	if isAddr && host != u.Hostname() {
		// "10.0.0.1." is no address to the dialer but a name to resolve:
		// matching it as the address would let DNS pick the backend.
		return fmt.Errorf("advertise host %q: an IP address with a trailing dot is a DNS name", u.Host)
	}
	if isAddr {
		addr = addr.Unmap()
	}
	for i := range c.backends {
		if c.backends[i].match(host, addr, isAddr, port) {
			return nil
		}
	}
	return fmt.Errorf("advertise host %q is not in allowedBackendHosts", u.Host)
}
