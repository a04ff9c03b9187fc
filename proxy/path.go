package proxy

import (
	"bytes"
	"errors"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/internal/ascii"
)

var (
	errNotInstance   = errors.New("not an instance path")
	errBadNamespace  = errors.New("namespace must be a single non-empty path segment")
	errEmptyID       = directory.ErrEmptyID
	errLongID        = directory.ErrLongID
	errIDCharset     = directory.ErrIDCharset
	errDotSegment    = errors.New("path must not contain . or .. segments")
	errWorkerRoute   = errors.New("path is the worker's own wake route")
	errOutsideBase   = errors.New("path is outside the base path")
	errPathMalformed = errors.New("request target must be an absolute path")
	errBadAuthority  = errors.New("absolute-form request target needs a host and no userinfo")
	errFragment      = errors.New("request target must not contain a fragment")
)

// OriginForm splits an absolute-form request target
// ("http://host:port/counters/alice?x=1", RFC 9112 §3.2.2) into its
// authority and the origin-form rest ("/counters/alice?x=1"; "/" when the
// target has no path). A server must accept the form, and edges configured
// as forward proxies send it. ok is false when uri is not absolute-form
// (http or https, any case), so the caller reports it as it reports any
// malformed target. Userinfo is refused: http URIs may not carry it
// (RFC 9110 §4.2.4). It does not allocate; the results alias uri.
func OriginForm(uri []byte) (authority, rest []byte, ok bool, err error) {
	var n int
	switch {
	case hasPrefixFold(uri, "http://"):
		n = len("http://")
	case hasPrefixFold(uri, "https://"):
		n = len("https://")
	default:
		return nil, nil, false, nil
	}
	end := n
	for end < len(uri) && uri[end] != '/' && uri[end] != '?' && uri[end] != '#' {
		end++
	}
	authority, rest = uri[n:end], uri[end:]
	if len(authority) == 0 {
		return nil, nil, true, errBadAuthority
	}
	for _, c := range authority {
		if c == '@' || c <= ' ' || c == 0x7f {
			return nil, nil, true, errBadAuthority
		}
	}
	return authority, rest, true, nil
}

// ToOriginForm rewrites an absolute-form request target to its origin
// form in place, the target's authority replacing Host (RFC 9112 §3.2.2);
// a target without a path becomes "/". The node's router and the data
// plane both call it first, and only the first call has work to do: an
// origin-form target costs one byte compare. Any other target is left
// for ParseTarget to refuse; a malformed absolute form is an error.
func ToOriginForm(req *fasthttp.Request) error {
	uri := req.Header.RequestURI()
	if len(uri) == 0 || uri[0] == '/' {
		return nil
	}
	authority, rest, ok, err := OriginForm(uri)
	if !ok || err != nil {
		return err
	}
	req.Header.SetHostBytes(authority)
	if len(rest) == 0 || rest[0] != '/' {
		rest = append([]byte{'/'}, rest...)
	}
	// Request's setter, not the header's: it also drops a URI parsed
	// from the absolute form.
	req.SetRequestURIBytes(rest)
	return nil
}

// Target is a parsed data-plane request target. Every slice aliases the
// request URI and lives only as long as the request (fasthttp reuses it).
type Target struct {
	// NS is the namespace with its leading slash: "/counters".
	NS []byte
	// ID is the instance id: "alice".
	ID []byte
	// Path is everything from the namespace on, without the query:
	// "/counters/alice/value". It is what the worker sees after its
	// advertise URL's own path.
	Path []byte
	// Query is the raw query including its '?', or empty.
	Query []byte
}

// ParseTarget splits a raw request URI ("/counters/alice/value?x=1") under
// basePath into namespace, id and rest (R-DP-1). It reads raw bytes — no
// normalisation, no percent-decoding — so routing and forwarding see the
// same path. It does not allocate.
//
// Ids follow the reference worker's rule (pinned.pinboard.wire:
// invalid_id_reason): 1..256 characters of [A-Za-z0-9._~-]. "." and ".."
// segments are refused anywhere after the namespace: a worker framework or
// a hop in between that resolves them would otherwise reach routes outside
// the instance (the challenge and stats routes, another id). The worker's
// wake route after the id is refused too (wakeRoute).
//
// A '#' anywhere is refused: a request target has no fragment (RFC 9112
// §3.2.1, neither a path nor a query holds '#'), and the worker's server
// may read one anyway. uvicorn on httptools (uvicorn[standard]) routes by
// httptools.parse_url's path, which ends at the '#':
// "/counters/alice/_wake#x" reached the wake route, its query cut short,
// while every check here saw another path.
func ParseTarget(uri, basePath []byte) (Target, error) {
	var t Target
	if bytes.IndexByte(uri, '#') >= 0 {
		return t, errFragment
	}
	path := uri
	for i, c := range uri {
		if c == '?' {
			path, t.Query = uri[:i], uri[i:]
			break
		}
	}
	if len(path) == 0 || path[0] != '/' {
		return t, errPathMalformed
	}
	if len(basePath) > 0 {
		if !HasBasePath(path, basePath) {
			return t, errOutsideBase
		}
		path = path[len(basePath):]
		if len(path) == 0 || path[0] != '/' {
			return t, errOutsideBase
		}
	}
	t.Path = path
	// namespace: "/seg"
	nsEnd := 1
	for nsEnd < len(path) && path[nsEnd] != '/' {
		nsEnd++
	}
	if nsEnd == len(path) {
		return t, errNotInstance
	}
	if nsEnd == 1 {
		return t, errBadNamespace
	}
	for _, c := range path[1:nsEnd] {
		if c <= ' ' || c == 0x7f {
			return t, errBadNamespace
		}
	}
	t.NS = path[:nsEnd]
	idStart := nsEnd + 1
	idEnd := idStart
	for idEnd < len(path) && path[idEnd] != '/' {
		idEnd++
	}
	t.ID = path[idStart:idEnd]
	if err := checkID(t.ID); err != nil {
		return t, err
	}
	if string(t.NS) == "/." || string(t.NS) == "/.." {
		return t, errDotSegment
	}
	// Nothing may climb out of the instance: the namespace and the rest
	// are checked (the id's charset has no escapes or separators).
	if climbs(path) {
		return t, errDotSegment
	}
	if wakeRoute(path[idEnd:]) {
		return t, errWorkerRoute
	}
	return t, nil
}

// workerNamespace is where the worker serves its own routes
// (pinned.pinboard.worker: PinnedWorker's /_pinned/challenge and
// /_pinned/stats). A worker can register it (PinnedHost takes any
// "/segment"), and its routes come first: forwarded with pinboard's
// attestation, which the stats route takes in place of the proxy secret,
// GET /_pinned/stats told a client every instance id of the worker. The
// data plane answers the namespace, decoded, 404.
const workerNamespace = "/_pinned"

// wakeSuffix is the worker's wake route after an instance's id
// (pinned.hosting.host: PinnedHost._mount_wake).
const wakeSuffix = "/_wake"

// wakeRoute reports whether rest, the path after the id, reaches the
// worker's POST <ns>/<id>/_wake as its server decodes it (uvicorn's
// scope["path"]): "/_wake" with any byte percent-escaped, and with one
// "\n" after it, which Starlette's route regex admits (Python's "$"
// matches before a final newline). The route is the Node pinboard's
// durable-resurrection sweeper's: it activates the instance without the
// route's authorize, which otherwise runs before a cold instance's
// lifespan, so a client that reached it with pinboard's attestation could
// activate any id its worker would refuse it. Fast path: the first byte
// after "/" that is neither '_' nor '%' answers.
func wakeRoute(rest []byte) bool {
	n := 0 // bytes of wakeSuffix matched, one more for the newline
	for i := 0; i < len(rest); i++ {
		c := rest[i]
		if c == '%' && i+2 < len(rest) && ascii.IsHex(rest[i+1]) && ascii.IsHex(rest[i+2]) {
			c = unhex(rest[i+1])<<4 | unhex(rest[i+2])
			i += 2
		}
		switch {
		case n < len(wakeSuffix) && c == wakeSuffix[n]:
			n++
		case n == len(wakeSuffix) && c == '\n':
			n++
		default:
			return false
		}
	}
	return n >= len(wakeSuffix)
}

// climbs reports whether path holds a dot segment ("." or ".."), also
// spelt with percent-escapes: a worker's server decodes the path before
// routing (uvicorn's scope["path"]), so "%2e%2e", ".%2E" and segments cut
// by "%2f", "%5c" or "\" are dot segments to anything that normalises
// after it — a proxy or router in front of the worker — and could reach
// the worker's own routes (/_pinned/…) with pinboard's attestation.
func climbs(path []byte) bool {
	dots, other := 0, false
	for i := 0; i <= len(path); {
		sep := i == len(path)
		step := 1
		if !sep {
			switch c := path[i]; {
			case c == '/' || c == '\\':
				sep = true
			case c == '%' && i+2 < len(path) && (path[i+1] == '2' && (path[i+2]|0x20) == 'f' || path[i+1] == '5' && (path[i+2]|0x20) == 'c'):
				sep, step = true, 3
			case c == '%' && i+2 < len(path) && path[i+1] == '2' && (path[i+2]|0x20) == 'e':
				dots, step = dots+1, 3
			case c == '.':
				dots++
			default:
				other = true
			}
		}
		if sep {
			if !other && (dots == 1 || dots == 2) {
				return true
			}
			dots, other = 0, false
		}
		i += step
	}
	return false
}

// checkID is directory.CheckID, a dot id answered as the dot segment it
// is in a path.
func checkID(id []byte) error {
	if err := directory.CheckID(id); err != directory.ErrDotID {
		return err
	}
	return errDotSegment
}

// appendNamespace appends the namespace ns, as the request spelt it, to
// dst with its percent-escapes decoded: the worker's server decodes the
// path before routing (uvicorn's scope["path"], urllib.parse.unquote), so
// "/caf%C3%A9" — how an HTTP client sends it — reaches the host of the
// namespace registered as "/café", and is resolved as that namespace
// here; raw, it was 404 unknown namespace. An escape that is not two hex
// digits stays as it is, as unquote leaves it. The path forwarded is the
// raw one, and an id has no escapes (checkID). Fast path: no '%'.
func appendNamespace(dst, ns []byte) []byte {
	if bytes.IndexByte(ns, '%') < 0 {
		return append(dst, ns...)
	}
	for i := 0; i < len(ns); i++ {
		if c := ns[i]; c == '%' && i+2 < len(ns) && ascii.IsHex(ns[i+1]) && ascii.IsHex(ns[i+2]) {
			dst = append(dst, unhex(ns[i+1])<<4|unhex(ns[i+2]))
			i += 2
			continue
		}
		dst = append(dst, ns[i])
	}
	return dst
}

func unhex(c byte) byte {
	if c <= '9' {
		return c - '0'
	}
	return (c | 0x20) - 'a' + 10
}

// HasBasePath reports whether path starts with base byte for byte but for
// the hex digits of a percent-escape, which compare case-insensitively
// (RFC 3986 section 6.2.2.1): httpx and Go's net/http send the escapes of a
// base path as PINBOARD_URL spells them, and a /pb%c3%b8 worker met the
// /pb%C3%B8 node's 404 on every call. HasBasePath allocates nothing.
func HasBasePath(path, base []byte) bool {
	if len(path) < len(base) {
		return false
	}
	esc := 0 // hex digits of an escape still to compare
	for i, b := range base {
		a := path[i]
		if esc > 0 {
			esc--
			if a|0x20 != b|0x20 || !ascii.IsHex(a) {
				return false
			}
			continue
		}
		if a != b {
			return false
		}
		if b == '%' {
			esc = 2
		}
	}
	return true
}
