package proxy

import (
	"bytes"

	"github.com/valyala/fasthttp"
)

// Request framing (RFC 9112 §6). fasthttp refuses most ambiguous framings
// before the handler runs (../shared/notes/FASTHTTP.md: two
// Content-Lengths, several Transfer-Encodings, a coding other than chunked,
// Transfer-Encoding on HTTP/1.0, space before the colon). Two pass, and
// leave no trace in the parsed header:
//
//   - Transfer-Encoding: identity is skipped as if absent: the request is
//     framed by its Content-Length, or has no body, and the bytes after
//     its header — a smuggled request — are read as the client's next
//     request. RFC 9112 §6.1: a request whose final coding is not chunked
//     MUST be answered 400 and its connection closed.
//   - Content-Length beside Transfer-Encoding: chunked: chunked wins and
//     the connection closes after the answer. §6.3 allows that or a
//     refusal; a front proxy that framed it by the Content-Length would
//     have sent pinboard's worker the rest as a request of its own.
//
// Both are refused: 400 and the connection closed, nothing forwarded
// (nginx has refused both since 1.21.1). What is forwarded then carries
// exactly one framing field: writeRequest re-asserts it.

// ambiguousFraming reports whether a request must be refused for its
// framing fields (above): one pass over the raw header lines, allocating
// nothing. The parsed header cannot tell: a skipped identity leaves the
// length of a request without a body (0 once fasthttp read it).
func ambiguousFraming(h *fasthttp.RequestHeader) bool {
	te, cl := rawFraming(h.RawHeaders())
	return te && (cl || h.ContentLength() != -1)
}

// rawFraming reports whether raw (a header block without its request
// line) has a Transfer-Encoding and a Content-Length field. fasthttp
// refused names with anything between them and the colon.
func rawFraming(raw []byte) (te, cl bool) {
	for len(raw) > 0 {
		line := raw
		if i := bytes.IndexByte(raw, '\n'); i >= 0 {
			line, raw = raw[:i], raw[i+1:]
		} else {
			raw = nil
		}
		switch {
		case fieldNamed(line, "Transfer-Encoding"):
			te = true
		case fieldNamed(line, "Content-Length"):
			cl = true
		}
	}
	return te, cl
}

func fieldNamed(line []byte, name string) bool {
	return len(line) > len(name) && line[len(name)] == ':' && asciiEqualFold(line[:len(name)], name)
}

// RefuseAmbiguousFraming answers a request whose framing is ambiguous
// (above) 400 and closes the connection, leaving the body fasthttp has not
// read unread, and reports whether it did. ServeHTTP checks every request
// itself; a server that routes other paths past it (the node's registry
// and probes) calls it first.
func RefuseAmbiguousFraming(ctx *fasthttp.RequestCtx) bool {
	if !ambiguousFraming(&ctx.Request.Header) {
		return false
	}
	writeError(ctx, fasthttp.StatusBadRequest, "ambiguous request framing: Transfer-Encoding must be chunked alone", 0)
	ctx.SetConnectionClose()
	return true
}
