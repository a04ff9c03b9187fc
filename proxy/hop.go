package proxy

import (
	"bytes"

	"github.com/valyala/fasthttp"
)

// Hop-by-hop headers (RFC 9110 §7.6.1) belong to one connection and are
// never forwarded. fasthttp already owns Transfer-Encoding and
// Content-Length framing; Connection: close is a flag it keeps apart.
var hopHeaders = [...]string{
	"Keep-Alive",
	"Proxy-Connection",
	"Proxy-Authenticate",
	"Proxy-Authorization",
	"Te",
	"Trailer",
	"Transfer-Encoding",
	"Upgrade",
}

// reservedPrefix marks pinboard's own wire headers (pinned.pinboard.wire):
// attestation, proxy secret, epoch and the cluster-call identity. A client
// must never be able to send them to a worker (R-TR-5).
var reservedPrefix = []byte("pinboard-")

// stripRequestHop removes hop-by-hop headers, the headers the Connection
// header names, and every client-supplied pinboard-* header. keepUpgrade
// keeps Upgrade (and the caller re-adds Connection: Upgrade) for WebSocket
// handshakes. It allocates nothing unless the request actually carries
// Connection-named or reserved headers.
func stripRequestHop(h *fasthttp.RequestHeader, keepUpgrade bool) {
	stripConnectionNamed(h.Peek(fasthttp.HeaderConnection), h.Del)
	h.Del(fasthttp.HeaderConnection)
	for _, name := range hopHeaders {
		if keepUpgrade && name == "Upgrade" {
			continue
		}
		h.Del(name)
	}
	// fasthttp answers Expect: 100-continue itself; forwarding it would make
	// the worker answer a second 100 the client never asked for.
	h.Del(fasthttp.HeaderExpect)
	stripReserved(h)
}

// stripConnectionNamed deletes each header listed in a Connection value
// (RFC 9110 §7.6.1), except the tokens that are not header names.
func stripConnectionNamed(v []byte, del func(string)) {
	for len(v) > 0 {
		var tok []byte
		if i := bytes.IndexByte(v, ','); i >= 0 {
			tok, v = v[:i], v[i+1:]
		} else {
			tok, v = v, nil
		}
		tok = bytes.TrimSpace(tok)
		if len(tok) == 0 || asciiEqualFold(tok, "close") || asciiEqualFold(tok, "keep-alive") || asciiEqualFold(tok, "upgrade") {
			continue
		}
		del(string(tok))
	}
}

func stripReserved(h *fasthttp.RequestHeader) {
	found := false
	for k := range h.All() {
		if hasReservedPrefix(k) {
			found = true
			break
		}
	}
	if !found {
		return
	}
	var names []string
	for k := range h.All() {
		if hasReservedPrefix(k) {
			names = append(names, string(k))
		}
	}
	for _, n := range names {
		h.Del(n)
	}
}

func hasReservedPrefix(k []byte) bool {
	return len(k) >= len(reservedPrefix) && asciiEqualFold(k[:len(reservedPrefix)], "pinboard-")
}

// stripResponseHop removes hop-by-hop headers from a worker's response.
func stripResponseHop(h *fasthttp.ResponseHeader) {
	stripConnectionNamed(h.Peek(fasthttp.HeaderConnection), h.Del)
	h.Del(fasthttp.HeaderConnection)
	for _, name := range hopHeaders {
		h.Del(name)
	}
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
