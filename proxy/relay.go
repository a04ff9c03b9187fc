package proxy

import (
	"bytes"
	"errors"
	"io"
	"syscall"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/directory"
)

// refusedInBand reports whether a worker's answer is its in-band refusal
// of a new activation (R-PL-6): 503 with the Pinned-Refusal marker, for a
// request or a WebSocket handshake alike.
func refusedInBand(rh *fasthttp.ResponseHeader) bool {
	return rh.StatusCode() == fasthttp.StatusServiceUnavailable && bytes.Equal(rh.PeekBytes(hdrRefusal), valLeaseRefusal)
}

// relay sets up the response body: read whole when small and sized (still
// under the header deadline), streamed otherwise (no deadline: streams
// may idle for hours). It owns pc from here.
func (p *Proxy) relay(ctx *fasthttp.RequestCtx, pool *connPool, pc *pconn, owner *directory.Owner, up *upload, retryUnattested bool) outcome {
	rh := &ctx.Response.Header
	status := rh.StatusCode()
	cl := rh.ContentLength()
	keep := !rh.ConnectionClose()
	rh.ResetConnectionClose()
	ownVersion(rh)
	stripFoundResponseHop(pc.respHop, rh)
	noBody := ctx.Request.Header.IsHead() || status < 200 || status == fasthttp.StatusNoContent || status == fasthttp.StatusNotModified
	if refusedInBand(rh) {
		// The refusal body is small; drain it so the connection stays warm.
		ok := !noBody && cl >= 0 && cl <= p.smallBody && readSized(&ctx.Response, pc, ctx.Conn(), p.smallBody) == nil
		p.finish(pool, pc, ok && keep, up)
		resetForRetry(&ctx.Response)
		return refused
	}
	if mayMovePlacement(status, cl) && !noBody {
		if !p.readSmallBody(ctx, pool, pc, keep, up) {
			return failed
		}
		return movesPlacement(ctx.Response.Body())
	}
	if status == fasthttp.StatusForbidden && cl == len(bodyUnattested) && !noBody {
		if !p.readSmallBody(ctx, pool, pc, keep, up) {
			return failed
		}
		if !bytes.Equal(ctx.Response.Body(), bodyUnattested) {
			return served
		}
		p.metrics.UpstreamError("unattested")
		if !retryUnattested {
			return served
		}
		resetForRetry(&ctx.Response)
		return unattested
	}
	// An event stream is relayed per event whatever its framing (R-DP-2):
	// never read whole, even when small and sized.
	sse := isEventStream(rh)
	switch {
	case noBody:
		if ctx.Request.Header.IsHead() {
			skipHeadBody(ctx, cl)
			// The GET body (an event stream, a streamed download, sized
			// or not) may still be running: uvicorn runs the app for
			// HEAD too, drops what it sends, and reads the connection's
			// next request only once it ends, which nothing on the wire
			// tells — and a small body is not done sooner: the time is
			// the route's (a slow generator), not the size's. Pooled,
			// the connection would hold the next client's request until
			// then; closed, the app sees the disconnect.
			keep = false
		} else if cl > 0 || cl == -1 {
			// A 204 or 304 announcing a body (RFC 9110 §8.6 forbids
			// Content-Length on a 204; on a 304 it is the GET's) ends at
			// its header (RFC 9112 §6.3), but uvicorn writes whatever
			// body the app sends with it, whenever the app sends it:
			// bytes arriving after the idle check would answer the next
			// client's request on this connection.
			keep = false
		}
		p.finish(pool, pc, keep, up)
	case cl >= 0 && cl <= p.smallBody && !sse:
		if !p.readSmallBody(ctx, pool, pc, keep, up) {
			return failed
		}
	default:
		mode, size := bodyFixed, int64(cl)
		switch cl {
		case -1:
			mode, size = bodyChunked, -1
		case -2:
			mode, size, keep = bodyEOF, -1, false
		}
		pc.clearDeadline()
		pool.streamReader(pc)
		b := acquireBody(pool, pc, p.streams, owner, mode, size, keep, sse, up, ctx.Conn())
		if sse {
			// Each event is flushed as it comes whatever the worker's
			// framing (R-DP-2, as Go's ReverseProxy does): fasthttp
			// flushes per read only an unsized body, so a sized stream
			// goes out as an unsized one (chunked, or to an HTTP/1.0
			// client ended by the close, its Content-Length kept).
			size = -1
		}
		if relayable(ctx, sse, size, up) {
			p.hijackEvents(ctx, b)
			return served
		}
		if size < 0 && !ctx.Request.Header.IsHTTP11() {
			p.relayUntilClose(ctx, b)
			break
		}
		ctx.Response.SetBodyStream(b, int(size))
		if size < 0 {
			// Unsized bodies are usually streams (SSE): send the header now
			// rather than with the first event (R-DP-2).
			ctx.Response.ImmediateHeaderFlush = true
		}
	}
	return served
}

// skipHeadBody answers HEAD with the worker's header and no body (RFC
// 9110 §9.3.2), its Content-Length cl kept as the worker sent it.
func skipHeadBody(ctx *fasthttp.RequestCtx, cl int) {
	ctx.Response.SkipBody = true
	if cl >= 0 {
		ctx.Response.Header.SetContentLength(cl)
	}
}

// isEventStream reports a text/event-stream answer (R-DP-2).
func isEventStream(rh *fasthttp.ResponseHeader) bool {
	return hasPrefixFold(rh.ContentType(), "text/event-stream")
}

// ownVersion answers the client in pinboard's HTTP version whatever the
// worker's (RFC 9110 §6.2: an intermediary sends its own HTTP-version).
// A worker's "HTTP/1.0" went to the client as it was, with the chunked
// framing pinboard gives an unsized body, which an HTTP/1.1 client must
// take as faulty (RFC 9112 §6.1): Go's client read the chunk framing as
// the body, and waited for a close that never came. Whether the worker's
// connection stays open was read from its version before (ConnectionClose).
func ownVersion(rh *fasthttp.ResponseHeader) {
	if !rh.IsHTTP11() {
		rh.SetProtocol(http11)
	}
}

// readSmallBody reads a sized response body whole and lets go of the
// connection; on a read error it answers itself and reports false: 504
// when the header timeout passed first (the worker froze mid-answer:
// nothing of it reached the client, which gets what a header that late
// gets; before, 502 "owner unreachable"), else 502.
func (p *Proxy) readSmallBody(ctx *fasthttp.RequestCtx, pool *connPool, pc *pconn, keep bool, up *upload) bool {
	if err := readSized(&ctx.Response, pc, ctx.Conn(), p.smallBody); err != nil {
		p.finish(pool, pc, false, up)
		if errors.Is(err, errClientGone) {
			clientClosed(ctx)
			return false
		}
		ctx.Response.Reset()
		p.answerUpstreamError(ctx, err, true)
		return false
	}
	p.finish(pool, pc, keep, up)
	return true
}

// finish lets go of a connection after a response read in the handler. A
// worker that answered while the upload still runs is mid-request: its
// connection closes, which also ends the upload.
func (p *Proxy) finish(pool *connPool, pc *pconn, keep bool, up *upload) {
	if keep && up != nil && !up.settled() {
		keep = false
	}
	if !keep {
		pool.discard(pc)
		if up != nil {
			up.stop()
		}
		return
	}
	if up != nil && !up.wait() {
		pool.discard(pc)
		return
	}
	pool.put(pc, p.now())
}

func staleConn(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, fasthttp.ErrConnectionClosed)
}

// idempotentRequest is Go's transport's rule for replaying a request
// after a connection failure: GET, HEAD, OPTIONS, TRACE, or a request
// carrying an idempotency key.
func idempotentRequest(h *fasthttp.RequestHeader) bool {
	switch {
	case h.IsGet(), h.IsHead(), h.IsOptions(), h.IsTrace():
		return true
	}
	return len(h.PeekCanonical(hdrIdempotencyKey)) > 0 || len(h.PeekCanonical(hdrXIdempotencyKey)) > 0
}
