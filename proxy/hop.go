package proxy

import (
	"bytes"
	"errors"
	"iter"
	"slices"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/internal/ascii"
)

// Hop-by-hop headers (RFC 9110 §7.6.1) belong to one connection and are
// never forwarded: Connection and the headers it names, Keep-Alive,
// Proxy-Connection, Proxy-Authenticate, Proxy-Authorization, TE, Trailer,
// Transfer-Encoding and Upgrade. fasthttp already owns Transfer-Encoding
// and Content-Length framing; Connection: close is a flag it keeps apart.

// reservedPrefix marks pinboard's own wire headers (pinned.pinboard.wire):
// attestation, proxy secret, epoch and the cluster-call identity. A client
// must never be able to send them to a worker (R-TR-5).
var reservedPrefix = []byte("pinboard-")

// Bits of hopBit: which hop-by-hop (or reserved) headers a message has.
const (
	hopKeepAlive uint16 = 1 << iota
	hopProxyConnection
	hopProxyAuthenticate
	hopProxyAuthorization
	hopTE
	hopTrailer
	hopTransferEncoding
	hopUpgrade
	hopExpect
	hopConnection
	hopReserved
	// hopNamed: a Connection line names a header (a token other than
	// close, keep-alive, upgrade and the framing and routing names
	// appendConnectionNamed skips). Only then is the header searched for
	// the names: "Connection: keep-alive", which most browsers and load
	// balancers send, costs the deletion of the line alone.
	hopNamed
	// hopBadName: a name holds a space, which fasthttp's parser lets
	// through (it refuses every other byte a token cannot hold).
	hopBadName
)

// hopBitNames are the names of the bits above, in bit order (up to
// hopExpect; Connection and reserved headers take their own path).
var hopBitNames = [...]string{
	"Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade", fasthttp.HeaderExpect,
}

// hopBit classifies one header name.
func hopBit(k []byte) uint16 {
	switch len(k) {
	case 2:
		if asciiEqualFold(k, "Te") {
			return hopTE
		}
	case 6:
		if asciiEqualFold(k, "Expect") {
			return hopExpect
		}
	case 7:
		if asciiEqualFold(k, "Trailer") {
			return hopTrailer
		}
		if asciiEqualFold(k, "Upgrade") {
			return hopUpgrade
		}
	case 10:
		if asciiEqualFold(k, "Connection") {
			return hopConnection
		}
		if asciiEqualFold(k, "Keep-Alive") {
			return hopKeepAlive
		}
	case 16:
		if asciiEqualFold(k, "Proxy-Connection") {
			return hopProxyConnection
		}
	case 17:
		if asciiEqualFold(k, "Transfer-Encoding") {
			return hopTransferEncoding
		}
	case 18:
		if asciiEqualFold(k, "Proxy-Authenticate") {
			return hopProxyAuthenticate
		}
	case 19:
		if asciiEqualFold(k, "Proxy-Authorization") {
			return hopProxyAuthorization
		}
	}
	if hasReservedPrefix(k) {
		return hopReserved
	}
	return 0
}

// maxStripped bounds the distinct headers a request's Connection lines may
// name, and the distinct pinboard-* names it may carry, for pinboard to
// strip: each deletion scans the whole header (fasthttp), so a 16 KiB
// request carrying a thousand of either cost milliseconds of CPU, some 40
// times what reading it did, and one client keeping a few connections
// busy with them slowed every other tenant's requests. Clients name a
// handful at most (TE, Keep-Alive, Upgrade); a request past the bound is
// refused (errTooManyStripped).
const maxStripped = 32

// errTooManyStripped refuses a request past maxStripped.
var errTooManyStripped = errors.New("too many Connection-named or pinboard-* headers")

// stripHop is the slow path of header stripping: found (from one pass of
// hopBit over the header) holds something to remove. It deletes the
// headers every Connection header names (a message may carry several),
// Connection itself, and every found hop-by-hop header not in keep. It
// reports whether a Connection header named Cookie, which a request keeps
// apart from its other headers (saveCookies). A request's header was
// bounded before (checkStripBound); a response's is not.
//
// It is generic over the header so that its methods are called directly:
// passed as func values (h.All(), h.Del), they escaped, and every request
// with a Connection: keep-alive line — most browsers' and load balancers'
// — cost three allocations.
func stripHop[H hopHeader](found, keep uint16, h H) (namedCookie bool) {
	if found&hopNamed != 0 {
		named := connectionNamed(h.All())
		for _, n := range named {
			namedCookie = namedCookie || strings.EqualFold(n, fasthttp.HeaderCookie)
		}
		for _, n := range carried(named, h.All()) {
			h.Del(n)
		}
	}
	if found&hopConnection != 0 {
		h.Del(fasthttp.HeaderConnection)
	}
	for i, name := range hopBitNames {
		if bit := uint16(1) << i; found&bit != 0 && keep&bit == 0 {
			h.Del(name)
		}
	}
	return namedCookie
}

// hopHeader is a header stripHop edits: a request's or a response's.
type hopHeader interface {
	All() iter.Seq2[[]byte, []byte]
	Del(key string)
}

// connectionNamed returns the header names every Connection line of all
// lists (appendConnectionNamed).
func connectionNamed(all iter.Seq2[[]byte, []byte]) []string {
	var named []string
	for k, v := range all {
		if asciiEqualFold(k, "Connection") {
			named = appendConnectionNamed(named, v)
		}
	}
	return named
}

// hopFound is the fast path's one pass over a header: the hopBit of every
// name, or'ed, and hopNamed. Zero (the common case) means nothing to
// strip.
func hopFound(all iter.Seq2[[]byte, []byte]) uint16 {
	found, _ := hopScan(all)
	return found &^ hopBadName
}

// hopScan is hopFound that also counts the header's lines and sets
// hopBadName. A bare "Connection: close" is no line to strip: fasthttp
// keeps it as a flag, which All yields as that line, and which the
// proxy clears itself (forward) or replaces (a WebSocket's Connection:
// Upgrade), as a response's is cleared before stripResponseHop.
func hopScan(all iter.Seq2[[]byte, []byte]) (found uint16, lines int) {
	for k, v := range all {
		b := hopBit(k)
		if b == hopConnection {
			switch {
			case string(v) == "close":
				b = 0
			case namesHeader(v):
				b |= hopNamed
			}
		}
		if bytes.IndexByte(k, ' ') >= 0 {
			b |= hopBadName
		}
		found |= b
		lines++
	}
	return found, lines
}

// namesHeader reports whether a Connection value v lists a token
// appendConnectionNamed would take for a header name.
func namesHeader(v []byte) bool {
	_, _, ok := nextNamed(v)
	return ok
}

// nextNamed returns the first token of the Connection value v that names
// a header to strip (appendConnectionNamed says which do not), and what
// follows it; ok is false when there is none.
func nextNamed(v []byte) (tok, rest []byte, ok bool) {
	for len(v) > 0 {
		if i := bytes.IndexByte(v, ','); i >= 0 {
			tok, v = v[:i], v[i+1:]
		} else {
			tok, v = v, nil
		}
		if tok = bytes.TrimSpace(tok); len(tok) > 0 && !notHeaderName(tok) {
			return tok, v, true
		}
	}
	return nil, nil, false
}

// checkStripBound returns errTooManyStripped when stripping a request
// whose hopFound is found would delete more than maxStripped distinct
// headers named by its Connection lines, or more than maxStripped
// distinct pinboard-* names. It deletes nothing: the proxy checks the
// bound with the rest of what the header alone refuses (Proxy.parse),
// before the request is placed or told 100 Continue, and strips after.
func checkStripBound(h *fasthttp.RequestHeader, found uint16) error {
	if found&hopNamed != 0 && len(carried(connectionNamed(h.All()), h.All())) > maxStripped {
		return errTooManyStripped
	}
	if found&hopReserved != 0 && len(reservedNames(h)) > maxStripped {
		return errTooManyStripped
	}
	return nil
}

// stripRequestHop removes hop-by-hop headers, the headers the Connection
// header names, and every client-supplied pinboard-* header, from a
// request whose bound was checked (checkStripBound). keepUpgrade keeps
// Upgrade (and the caller re-adds Connection: Upgrade) for WebSocket
// handshakes. Expect goes too: fasthttp
// answers Expect: 100-continue itself, and forwarding it would make the
// worker answer a second 100 the client never asked for. It allocates
// nothing unless the request actually carries Connection-named or
// reserved headers. Cookie lines, kept apart while the header is edited,
// are rq's (saveCookies): a Connection header naming Cookie drops them
// there. found is the header's hopFound, which the proxy took with the
// header's checks (Proxy.parse, rq.hop): a request carrying none of it
// (the common case) costs no deletion, each of which would rescan the
// header, and no second pass.
func stripRequestHop(h *fasthttp.RequestHeader, rq *request, found uint16, keepUpgrade bool) {
	if found == 0 {
		return
	}
	ed := editor{h, &rq.order}
	var keep uint16
	if keepUpgrade {
		keep = hopUpgrade
	}
	if stripHop(found, keep, ed) {
		rq.rawCookies, rq.cookieEnds = rq.rawCookies[:0], rq.cookieEnds[:0]
	}
	if found&hopReserved != 0 {
		for _, n := range reservedNames(h) {
			ed.Del(n)
		}
	}
}

// appendConnectionNamed appends the header names a Connection value lists
// (RFC 9110 §7.6.1), except the tokens that are not header names and the
// headers that frame or route the message: Content-Length and
// Transfer-Encoding are how this hop reads the body — a worker answer
// whose Connection names Content-Length would otherwise lose its length
// after pinboard decided how much to read, leave the body on a pooled
// connection and hand it to the next client as its answer — and Host is
// how the request is routed.
func appendConnectionNamed(dst []string, v []byte) []string {
	for tok, rest, ok := nextNamed(v); ok; tok, rest, ok = nextNamed(rest) {
		dst = append(dst, string(tok))
	}
	return dst
}

// notHeaderName reports a Connection token that names no header to strip
// (appendConnectionNamed says why).
func notHeaderName(tok []byte) bool {
	return asciiEqualFold(tok, "close") || asciiEqualFold(tok, "keep-alive") || asciiEqualFold(tok, "upgrade") ||
		asciiEqualFold(tok, "content-length") || asciiEqualFold(tok, "transfer-encoding") || asciiEqualFold(tok, "host")
}

// carried returns the names in named that a header of all carries, each
// once, spelt as the header spells it. A deletion scans the whole header
// (fasthttp), so deleting every name a client lists — "a" thousands of
// times, or names it never sends — cost tens of milliseconds of CPU for
// one 16 KiB request, a core kept busy by a few of them a second. Only
// requests whose Connection header names a header get here: the map and
// the lowered copies are the slow path's.
func carried(named []string, all iter.Seq2[[]byte, []byte]) []string {
	if len(named) == 0 {
		return nil
	}
	want := make(map[string]bool, len(named))
	for _, n := range named {
		want[ascii.Lower(n)] = true
	}
	var out []string
	var lower []byte
	for k := range all {
		lower = ascii.AppendLower(lower[:0], string(k))
		if want[string(lower)] {
			out = append(out, string(k))
			delete(want, string(lower))
		}
	}
	return out
}

// reservedNames returns the distinct pinboard-* names of h, each once
// (the server gives names in canonical case, so equal names are equal
// strings), and stops past maxStripped of them: a deletion scans the
// whole header (fasthttp), so each name is deleted once, however many
// lines carry it.
func reservedNames(h *fasthttp.RequestHeader) []string {
	var names []string
	for k := range h.All() {
		if hasReservedPrefix(k) && !slices.Contains(names, string(k)) {
			if names = append(names, string(k)); len(names) > maxStripped {
				break
			}
		}
	}
	return names
}

// hasReservedPrefix reports a pinboard-* name, or its underscored alias
// pinboard_* (see underscoreAlias).
func hasReservedPrefix(k []byte) bool {
	return len(k) >= len(reservedPrefix) && (asciiEqualFold(k[:len(reservedPrefix)], "pinboard-") ||
		asciiEqualFold(k[:len(reservedPrefix)], "pinboard_"))
}

// underscoreAlias reports whether k is name spelled with at least one
// underscore for a hyphen (X_Forwarded_For for X-Forwarded-For), case
// ignored. To HTTP it is another header; CGI-style environments (WSGI,
// and frameworks mounting WSGI apps) map both to one variable
// (HTTP_X_FORWARDED_FOR), so a client could pass its own value under a
// name pinboard sets.
func underscoreAlias(k []byte, name string) bool {
	if len(k) != len(name) || bytes.IndexByte(k, '_') < 0 {
		return false
	}
	for i := 0; i < len(k); i++ {
		c, d := k[i], name[i]
		if c == '_' && d == '-' {
			continue
		}
		if c|0x20 != d|0x20 || (c|0x20 < 'a' || c|0x20 > 'z') && c != d {
			return false
		}
	}
	return true
}

// stripResponseHop removes hop-by-hop headers from a worker's response.
// Expect and pinboard-* names have no meaning in a response and stay.
// The lines of a field sent more than once keep the worker's order
// (stripResponseHopInOrder).
func stripResponseHop(h *fasthttp.ResponseHeader) {
	stripFoundResponseHop(hopFound(h.All()), h)
}

// stripFoundResponseHop is stripResponseHop for the names found in h
// already (checkResponseFraming's pass).
func stripFoundResponseHop(found uint16, h *fasthttp.ResponseHeader) {
	if found&^(hopExpect|hopReserved) == 0 {
		return // Fast path: nothing to remove.
	}
	// A worker's answer is not bounded: the worker is the fleet's own.
	if responseRepeats(h) {
		stripResponseHopInOrder(found, h)
		return
	}
	stripHop(found, hopExpect, h)
}

// repeated reports whether h has more than one line named name.
func repeated(h *fasthttp.RequestHeader, name []byte) bool {
	n := 0
	for k := range h.All() {
		if len(k) == len(name) && bytes.EqualFold(k, name) {
			if n++; n > 1 {
				return true
			}
		}
	}
	return false
}

func asciiEqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := 0; i < len(b); i++ {
		c, d := b[i], s[i]
		if c|0x20 != d|0x20 {
			return false
		}
		if c|0x20 < 'a' || c|0x20 > 'z' {
			if c != d {
				return false
			}
		}
	}
	return true
}

// hasPrefixFold reports whether b starts with the lowercase ASCII prefix,
// ignoring case.
func hasPrefixFold(b []byte, prefix string) bool {
	return len(b) >= len(prefix) && asciiEqualFold(b[:len(prefix)], prefix)
}

// hdrCookie is the request header saveCookies keeps.
var hdrCookie = []byte(fasthttp.HeaderCookie)

// saveCookies keeps the client's Cookie lines as they came, before
// anything iterates h; restoreCookies puts them back once the header
// passes are done. Why: fasthttp parses the Cookie lines into its cookie
// list the first time the header is iterated (RequestHeader.All, used by
// the hop-by-hop and forwarding passes and the placement's affinity) and
// from then on writes that list instead of the lines: several lines
// became one, quotes were dropped, and a quoted value with an escaped
// quote was lost altogether. The worker gets the client's bytes (R-DP-1).
// Nothing is copied for a request without cookies.
func saveCookies(h *fasthttp.RequestHeader, rq *request) {
	for _, v := range h.PeekAll(fasthttp.HeaderCookie) {
		rq.rawCookies = append(rq.rawCookies, v...)
		rq.cookieEnds = append(rq.cookieEnds, len(rq.rawCookies))
	}
}

// restoreCookies replaces whatever h holds as cookies by the lines
// saveCookies kept, as plain header lines: with special headers off for
// the call, the additions bypass the cookie parser. h's cookie list stays
// collected and empty, so no later iteration parses them again.
func restoreCookies(h *fasthttp.RequestHeader, rq *request) {
	if len(rq.cookieEnds) == 0 {
		return
	}
	h.DelAllCookies()
	was := h.DisableSpecialHeader()
	start := 0
	for _, end := range rq.cookieEnds {
		h.AddBytesKV(hdrCookie, rq.rawCookies[start:end])
		start = end
	}
	if !was {
		h.EnableSpecialHeader()
	}
}
