package proxy

import (
	"bufio"
	"bytes"
	"errors"

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

// A third passes fasthttp too: a framing field whose value is folded onto
// the next line (obs-fold, "Transfer-Encoding:" then " chunked"), which
// fasthttp unfolds and frames by. An edge that neither unfolds nor
// refuses it frames the request without a body, and the bytes pinboard
// reads as its chunks are that edge's next request. RFC 9112 §5.2 allows
// unfolding; nginx refuses it, and so does pinboard: 400, "malformed
// request" as for the other framing fields fasthttp refuses.

// framingRefusal is the 400's message for a request that must be refused
// for its framing fields (above), or "": one pass over the raw header
// lines, allocating nothing. The parsed header cannot tell: a skipped
// identity leaves the length of a request without a body (0 once
// fasthttp read it).
func framingRefusal(h *fasthttp.RequestHeader) string {
	_, f := scanHeader(h.RawHeaders())
	switch {
	case f.folded:
		return "malformed request"
	case f.te && (f.cl || h.ContentLength() != -1):
		return "ambiguous request framing: Transfer-Encoding must be chunked alone"
	}
	return ""
}

// headerFields is what scanHeader finds among a block's header lines.
type headerFields struct {
	te, cl bool // a Transfer-Encoding, a Content-Length field
	// folded: a Transfer-Encoding or Content-Length line continued on
	// the next (obs-fold).
	folded bool
	// encodings counts Content-Encoding lines: fasthttp keeps the last
	// one alone (joinContentEncodings).
	encodings int
}

// scanHeader walks the header lines b starts with, once, and reports the
// fields above among them; end is the length of the block, its blank line
// (LF or CRLF) included, or -1 when b ends first. Empty lines before the
// first line are skipped, as fasthttp does. fasthttp's request parser
// refused names with anything between them and the colon; its response
// parser drops white space there (fieldNamed).
func scanHeader(b []byte) (end int, f headerFields) {
	i := 0
	for i < len(b) && (b[i] == '\r' || b[i] == '\n') {
		i++
	}
	framing := false // the field being read is a framing field
	for i < len(b) {
		line := b[i:]
		j := bytes.IndexByte(line, '\n')
		if j >= 0 {
			line = line[:j]
		}
		switch {
		case len(line) > 0 && (line[0] == ' ' || line[0] == '\t'):
			// obs-fold: this line continues the field before it.
			f.folded = f.folded || framing
		case fieldNamed(line, "Transfer-Encoding"):
			f.te, framing = true, true
		case fieldNamed(line, "Content-Length"):
			f.cl, framing = true, true
		case fieldNamed(line, "Content-Encoding"):
			f.encodings++
			framing = false
		default:
			framing = false
		}
		if j < 0 {
			break
		}
		i += j + 1
		switch {
		case i < len(b) && b[i] == '\n':
			return i + 1, f
		case i+1 < len(b) && b[i] == '\r' && b[i+1] == '\n':
			return i + 2, f
		}
	}
	return -1, f
}

// fieldNamed reports whether line is a field called name. White space
// before the colon is skipped: fasthttp's response parser drops it and
// takes the name as it is (its request parser refuses it).
func fieldNamed(line []byte, name string) bool {
	if len(line) <= len(name) || !asciiEqualFold(line[:len(name)], name) {
		return false
	}
	rest := line[len(name):]
	for len(rest) > 0 && (rest[0] == ' ' || rest[0] == '\t') {
		rest = rest[1:]
	}
	return len(rest) > 0 && rest[0] == ':'
}

// RefuseUnreadable answers a request pinboard must not read on: one in an
// HTTP version whose major is not 1 (505: fasthttp reads "HTTP/2.0" or
// "HTTP/9.9" as HTTP/1.0, and the worker got it as HTTP/1.1; RFC 9110
// §15.6.6), or one whose framing is ambiguous (above, 400). It closes the
// connection, leaving the body fasthttp has not read unread, and reports
// whether it answered. ServeHTTP checks every request itself; a server
// that routes other paths past it (the node's registry and probes) calls
// it first.
func RefuseUnreadable(ctx *fasthttp.RequestCtx) bool {
	if proto := ctx.Request.Header.Protocol(); len(proto) > 5 && proto[5] != '1' {
		writeError(ctx, fasthttp.StatusHTTPVersionNotSupported, "HTTP version not supported", 0)
		ctx.SetConnectionClose()
		return true
	}
	msg := framingRefusal(&ctx.Request.Header)
	if msg == "" {
		return false
	}
	writeError(ctx, fasthttp.StatusBadRequest, msg, 0)
	ctx.SetConnectionClose()
	return true
}

// Response framing (RFC 9112 §6.3), worker → pinboard. A worker
// connection is pooled only when its answer was framed one way and read
// exactly to its end: bytes pinboard reads past, or stops short of, would
// be the next client's answer. fasthttp's response parser refuses most
// ambiguous answers (two Content-Lengths, a length that is not digits, a
// coding other than chunked, two Transfer-Encodings, CR or NUL in a
// value); these pass it, and are refused here, 502 and the connection
// closed, before anything reaches the client:
//
//   - Content-Length beside Transfer-Encoding: chunked, in either order:
//     chunked wins and the connection stays open. §6.3 says it "ought to
//     be handled as an error" (response splitting): the worker may have
//     meant the length. nginx refuses it from an upstream too.
//   - Transfer-Encoding on an answer that is not HTTP/1.1: fasthttp skips
//     the field and frames the body by its Content-Length or the close,
//     chunk framing and all. §6.1: the framing is faulty, even with a
//     Content-Length.
//   - A status below 100 ("000"): taken for an interim answer, so the
//     bytes behind it were read as the final answer (RFC 9110 §15: three
//     digits, 100 to 599).
//   - A Transfer-Encoding or Content-Length value folded onto the next
//     line (obs-fold, "Transfer-Encoding:" then " chunked"): fasthttp
//     unfolds it and frames by it. §5.2 lets a proxy unfold a field or
//     answer 502; a framing field is where peers that do and do not
//     unfold part ways, and nginx answers 502.
//   - A field name with a space in it ("X A: 1"): fasthttp refuses every
//     other byte a token cannot hold (RFC 9110 §5.1) and lets this one
//     through; relayed, a client's parser refused the whole answer.
//   - A header block not ended by CRLF CRLF (bare LF line ends, §2.2): a
//     bare LF inside the block is read as a line end, but fasthttp waits
//     for a CRLF CRLF that never comes, until the header timeout, while
//     the worker waits for the next request.
//
// What the client gets is pinboard's own framing of the body it read
// (writeResponse): one of Content-Length or chunked, or a body ended by
// the close.

var (
	errResponseFraming   = errors.New("ambiguous response framing from worker: Transfer-Encoding must be chunked alone, on HTTP/1.1")
	errResponseStatus    = errors.New("invalid response status from worker")
	errResponseLineEnd   = errors.New("response header from worker not ended by CRLF CRLF")
	errResponseFieldName = errors.New("response header from worker with a space in a field name")
)

// peekResponseHeader waits until br holds a whole response header block
// and returns it, up to and including its blank line, without consuming
// it (it aliases br's buffer until the next read), with what scanHeader
// found in it. A block bigger than br's buffer is errHeaderTooLarge.
// Allocates nothing.
func peekResponseHeader(br *bufio.Reader) (block []byte, f headerFields, err error) {
	for n := 1; ; n = br.Buffered() + 1 {
		if _, err := br.Peek(n); err != nil {
			if errors.Is(err, bufio.ErrBufferFull) {
				return nil, f, errHeaderTooLarge
			}
			return nil, f, err
		}
		b, _ := br.Peek(br.Buffered())
		if end, f := scanHeader(b); end >= 0 {
			return b[:end], f, nil
		}
	}
}

var crlfcrlf = []byte("\r\n\r\n")

// readFramedHeader reads a response header from br into rh and refuses the
// framings above; it returns the hop-by-hop names checkResponseFraming
// found in it.
func readFramedHeader(rh *fasthttp.ResponseHeader, br *bufio.Reader) (hop uint16, err error) {
	block, f, err := peekResponseHeader(br)
	if err != nil {
		return 0, err
	}
	if !bytes.HasSuffix(block, crlfcrlf) {
		return 0, errResponseLineEnd
	}
	if err := rh.Read(br); err != nil {
		return 0, err
	}
	// block is intact: a whole block in the buffer is parsed without a
	// read, and the buffer moves only on a read.
	if f.encodings > 1 {
		joinContentEncodings(rh, block)
	}
	return checkResponseFraming(rh, block, f)
}

// joinContentEncodings gives rh the values of every Content-Encoding line
// of its raw block, in order, joined by ", ": several lines of a list
// field are one list (RFC 9110 §5.3, §8.4). fasthttp keeps one value and
// each line replaced the one before, so a body coded twice on two lines
// went out as coded once (R-DP-1). Slow path, for an answer with two
// lines or more (scanHeader counted them).
func joinContentEncodings(rh *fasthttp.ResponseHeader, block []byte) {
	var joined []byte
	n := 0
	for rest := block; len(rest) > 0; {
		line := rest
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			line, rest = rest[:i], rest[i+1:]
		} else {
			rest = nil
		}
		if !fieldNamed(line, "Content-Encoding") {
			continue
		}
		v := bytes.Trim(line[bytes.IndexByte(line, ':')+1:], " \t\r")
		if len(v) == 0 {
			continue
		}
		if n++; n > 1 {
			joined = append(joined, ", "...)
		}
		joined = append(joined, v...)
	}
	rh.SetContentEncodingBytes(joined)
}

// checkResponseFraming refuses a parsed response header whose raw block
// (status line included), with the fields scanHeader found in it, is
// framed as above. The names are classified in the same pass (hopScan),
// and the hop-by-hop ones returned for stripResponseHop, so that an
// answer's header is walked once for both.
func checkResponseFraming(rh *fasthttp.ResponseHeader, block []byte, f headerFields) (hop uint16, err error) {
	// RFC 9110 §15: every valid status is 100 to 599. fasthttp takes any
	// three digits; a status past 599 means nothing to a client, and one
	// below 100 reads as 200 (statusBelow100).
	if statusBelow100(block) || rh.StatusCode() > 599 {
		return 0, errResponseStatus
	}
	if f.folded || f.te && (f.cl || !rh.IsHTTP11()) {
		return 0, errResponseFraming
	}
	// A field name is a token (RFC 9110 §5.1). fasthttp refuses every
	// other byte a token cannot hold, and lets a space through (hopBadName):
	// relayed, a client's parser (Node's llhttp) failed the whole answer.
	hop, _ = hopScan(rh.All())
	if hop&hopBadName != 0 {
		return 0, errResponseFieldName
	}
	return hop, nil
}

// statusBelow100 reports whether the status code of a status line that
// fasthttp accepted (a version, spaces, three digits) starts with 0. The
// parsed header cannot tell: it reports a status 0 as 200.
func statusBelow100(block []byte) bool {
	block = bytes.TrimLeft(block, "\r\n")
	i := bytes.IndexByte(block, ' ')
	if i < 0 {
		return false
	}
	block = bytes.TrimLeft(block[i:], " ")
	return len(block) > 0 && block[0] == '0'
}
