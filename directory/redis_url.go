package directory

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"

	"github.com/redis/rueidis"
)

// ErrInvalidURL wraps every REDIS_URL parsing error: a configuration
// mistake, not an outage.
var ErrInvalidURL = errors.New("invalid redis url")

// ParseRedisURL turns REDIS_URL into rueidis options. The forms:
//
//	redis://[user[:password]@]host[:port][/db]
//	rediss://…                                     the same over TLS
//	redis+cluster://[user[:password]@]host:port[,host:port…]
//	redis+sentinel://[user[:password]@]host:port[,host:port…]/mastername[?db=N]
//
// rediss+cluster:// and rediss+sentinel:// use TLS. The port defaults to
// 6379 (26379 for sentinels). Query parameters: db (not for clusters),
// client_name, skip_verify (TLS only; for tests), sentinel_username and
// sentinel_password. Anything else is an error, so typos fail at start-up.
// Errors never repeat the password.
func ParseRedisURL(raw string) (rueidis.ClientOption, error) {
	var o rueidis.ClientOption
	bad := func(format string, args ...any) (rueidis.ClientOption, error) {
		// %q: the URL may hold a line break or other control bytes, and
		// the message must stay one line (R-SRV-2: main prints it as one).
		return o, fmt.Errorf("%w %q: %s", ErrInvalidURL, redactURL(raw), fmt.Sprintf(format, args...))
	}
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return bad("missing scheme")
	}
	var useTLS, cluster, sentinel bool
	switch scheme {
	case "redis":
	case "rediss":
		useTLS = true
	case "redis+cluster":
		cluster = true
	case "rediss+cluster":
		cluster, useTLS = true, true
	case "redis+sentinel":
		sentinel = true
	case "rediss+sentinel":
		sentinel, useTLS = true, true
	default:
		return bad("unknown scheme %q", scheme)
	}
	// A "/", "?" or "#" in a password pasted as it is ends the authority
	// early: the password's tail would be read as a path or query and its
	// head as a host, and both echoed in errors. An "@" past the authority
	// is refused instead (names and parameters never need one unencoded).
	if atPastHost(rest) {
		return bad("an @ follows the host: percent-encode /, ?, # and @ in the user name, password and parameters (%%2F, %%3F, %%23, %%40)")
	}
	// Any other "#" starts a fragment, which net/url drops with all that
	// follows: a sentinel_password holding one would be cut short without
	// a word, and fail authentication at run time instead of here.
	if strings.IndexByte(rest, '#') >= 0 {
		return bad("a # starts a fragment: percent-encode it in names, passwords and parameters (%%23)")
	}
	// Split userinfo@hosts/path?query by hand: net/url rejects host lists.
	rest, query, _ := strings.Cut(rest, "?")
	authority, path, _ := strings.Cut(rest, "/")
	userinfo, hosts := "", authority
	if i := strings.LastIndexByte(authority, '@'); i >= 0 {
		userinfo, hosts = authority[:i], authority[i+1:]
	}
	u, err := url.Parse("redis://" + userinfo + "@placeholder/" + path + "?" + query)
	if err != nil {
		return bad("cannot parse credentials, path or query")
	}
	if userinfo != "" {
		o.Username = u.User.Username()
		o.Password, _ = u.User.Password()
	}
	defPort := "6379"
	if sentinel {
		defPort = "26379"
	}
	for _, h := range strings.Split(hosts, ",") {
		addr, err := hostPort(h, defPort)
		if err != nil {
			return bad("%v", err)
		}
		o.InitAddress = append(o.InitAddress, addr)
	}
	if !cluster && !sentinel && len(o.InitAddress) > 1 {
		return bad("several hosts need redis+cluster:// or redis+sentinel://")
	}
	path = strings.Trim(u.Path, "/")
	switch {
	case sentinel:
		if path == "" || strings.Contains(path, "/") {
			return bad("redis+sentinel:// needs one master name as its path")
		}
		o.Sentinel.MasterSet = path
	case cluster:
		if path != "" {
			return bad("a cluster has no database number")
		}
	case path != "":
		db, err := strconv.Atoi(path)
		if err != nil || db < 0 {
			return bad("database %q is not a number", path)
		}
		o.SelectDB = db
	}
	// A literal "+" would be read as a space (form encoding): a
	// sentinel_password holding one failed authentication at run time.
	// Say so instead of guessing which was meant.
	if strings.IndexByte(query, '+') >= 0 {
		return bad("a + in the query reads as a space: percent-encode it (%%2B, a space %%20)")
	}
	// url.URL.Query drops the pairs it cannot decode (a bad %-escape, a
	// ";") without a word: "?db=2;" opened database 0 and a
	// sentinel_password holding "%" was sent empty. The error is not
	// repeated: it quotes the pair, which may be the password.
	params, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return bad("cannot decode the query: percent-encode %%, ; and + in parameters (%%25, %%3B, %%2B)")
	}
	insecure := false // skip_verify
	for k, vs := range params {
		v := vs[len(vs)-1]
		switch k {
		case "db":
			db, err := strconv.Atoi(v)
			if err != nil || db < 0 || cluster {
				return bad("db=%q is not allowed here", v)
			}
			o.SelectDB = db
		case "client_name":
			// Redis refuses other bytes in CLIENT SETNAME, which would
			// fail every connection: an outage at start-up (exit 1)
			// instead of a configuration error.
			if strings.IndexFunc(v, func(c rune) bool { return c < '!' || c > '~' }) >= 0 {
				return bad("client_name may hold only printable ASCII without spaces")
			}
			o.ClientName = v
		case "skip_verify":
			if !useTLS {
				return bad("skip_verify needs rediss")
			}
			// A value read as "off" by mistake would verify a
			// certificate the operator asked not to; say so instead.
			var ok bool
			if insecure, ok = skipVerify(v); !ok {
				return bad("skip_verify takes true, 1, false or 0")
			}
		case "sentinel_username":
			o.Sentinel.Username = v
		case "sentinel_password":
			o.Sentinel.Password = v
		default:
			return bad("unknown parameter %q", k)
		}
	}
	if useTLS {
		// No ServerName: the TLS dialer verifies each connection against
		// the host it dials. A cluster's other nodes and the master a
		// sentinel names are dialled too, and naming the URL's first
		// host failed every one with a certificate of its own.
		o.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		o.TLSConfig.InsecureSkipVerify = insecure
		if sentinel {
			o.Sentinel.TLSConfig = o.TLSConfig.Clone()
		}
	}
	return o, nil
}

func hostPort(h, defPort string) (string, error) {
	if h == "" {
		return "", errors.New("empty host")
	}
	host, port, err := net.SplitHostPort(h)
	if err != nil {
		// No port: a bare host or a bracketed IPv6 address.
		host, port = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]"), defPort
		if strings.ContainsAny(host, "[]/ ") {
			return "", fmt.Errorf("bad host %q", h)
		}
	}
	if host == "" {
		return "", fmt.Errorf("bad host %q", h)
	}
	// Brackets enclose an IPv6 address, both of them or neither: "[::1"
	// and "[h]" were dialled as if written right. A host with colons is
	// an IPv6 address too, or a mistake such as a port typed twice
	// ("h:6379:6380"), which would be dialled as the host "[h:6379:6380]"
	// and fail as an outage.
	open := strings.HasPrefix(h, "[")
	if open != strings.Contains(h, "]") {
		return "", fmt.Errorf("bad host %q", h)
	}
	if open || strings.IndexByte(host, ':') >= 0 {
		if ip, err := netip.ParseAddr(host); err != nil || !ip.Is6() {
			return "", fmt.Errorf("bad host %q", h)
		}
	}
	if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
		return "", fmt.Errorf("bad port in %q", h)
	}
	return net.JoinHostPort(host, port), nil
}

// atPastHost reports whether an "@" follows the authority of rest (a URL
// past its "scheme://"): a password holding "/", "?" or "#" pasted as it
// is, which ends the authority early.
func atPastHost(rest string) bool {
	end := strings.IndexAny(rest, "/?#")
	return end >= 0 && strings.IndexByte(rest[end:], '@') >= 0
}

// redactURL hides the password of a Redis URL for messages and logs: the
// userinfo's, everything up to the last "@" when one follows the host (a
// password holding "/", "?" or "#"), and the sentinel_password parameter.
func redactURL(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return "(unparseable url)"
	}
	if atPastHost(rest) {
		return scheme + "://xxxxx@" + redactQuery(rest[strings.LastIndexByte(rest, '@')+1:])
	}
	authority, tail := rest, ""
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		authority, tail = rest[:i], rest[i:]
	}
	tail = redactQuery(tail)
	i := strings.LastIndexByte(authority, '@')
	if i < 0 {
		return scheme + "://" + authority + tail
	}
	user, _, hasPass := strings.Cut(authority[:i], ":")
	if hasPass {
		user += ":xxxxx"
	}
	return scheme + "://" + user + "@" + authority[i+1:] + tail
}

// redactQuery hides the values of sentinel_password parameters in s, a
// URL's path and query.
func redactQuery(s string) string {
	path, query, ok := strings.Cut(s, "?")
	if !ok {
		return s
	}
	params := strings.Split(query, "&")
	for i, p := range params {
		// A ";" is refused as a separator (ParseRedisURL), but the
		// message that says so must not show what follows it either.
		parts := strings.Split(p, ";")
		for j, part := range parts {
			k, _, ok := strings.Cut(part, "=")
			// The key as ParseRedisURL reads it: "sentinel%5Fpassword"
			// sets the sentinel password too.
			if dk, err := url.QueryUnescape(k); err == nil {
				k = dk
			}
			if ok && strings.EqualFold(k, "sentinel_password") {
				parts[j] = part[:strings.IndexByte(part, '=')] + "=xxxxx"
			}
		}
		params[i] = strings.Join(parts, ";")
	}
	return path + "?" + strings.Join(params, "&")
}

// skipVerify reads skip_verify's value: empty (the bare parameter), true
// or 1 turn verification off, false or 0 leave it on; ok is false for
// anything else.
func skipVerify(v string) (skip, ok bool) {
	switch v {
	case "", "1", "true":
		return true, true
	case "0", "false":
		return false, true
	}
	return false, false
}
