package proxy

import (
	"io"
	"net"
	"sync"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/internal/rawio"
)

// An event stream (text/event-stream, R-DP-2) is relayed off the fasthttp
// server: the client connection is hijacked once the response header is
// known and a goroutine of its own copies events from the worker, writing
// each as one HTTP/1.1 chunk the moment it arrives.
//
// Why: streams idle for minutes or hours, and thousands are open at once.
// Inside the server a stream holds the connection's 16 KiB read and write
// buffers, a 4 KiB copy buffer, the request context and the deep stack of
// the connection's goroutine until it ends. Hijacked, it holds the worker
// connection's 4 KiB stream buffer and a shallow goroutine, and waits for
// the next event without a buffer (carryReader.fill): an event's bytes
// pass through a pooled buffer only while they move. Measured with
// BenchmarkIdleSSEStreamMemory (server/) and the bench harness's idle
// streams (BENCHMARKS.md, docs/bench/HISTORY.md).
//
// The connection stays the client's keep-alive connection: when the worker
// ends the stream cleanly, the connection goes back to the server for the
// next request (Options.Resume). It is closed instead, and the response
// says Connection: close, when the client asked for that, when the client
// already sent bytes past its request (pipelining: those are not this
// relay's to read), and when there is no Resume.

// chunkRoom is the space before an event's bytes in a relay buffer: its
// chunk-size line, at most 16 hex digits and CRLF.
const chunkRoom = 18

// eventBufSize is a relay buffer: a chunk-size line, up to 4 KiB of event
// bytes (the worker connection's stream buffer, streamBufSize) and the
// chunk's closing CRLF.
const eventBufSize = chunkRoom + streamBufSize + 2

var eventBufs = sync.Pool{New: func() any { b := make([]byte, eventBufSize); return &b }}

// lastChunk ends a chunked body without trailers.
var lastChunk = []byte("0\r\n\r\n")

// relayable reports whether a response body may be relayed as an event
// stream off the server: an unsized text/event-stream body to an HTTP/1.1
// client whose request has gone up whole. HTTP/1.0 clients read
// close-delimited bodies (relayUntilClose), and a request body still
// going up ties the response to the server's request stream: it stays on
// the server's path.
func relayable(ctx *fasthttp.RequestCtx, sse bool, size int64, up *upload) bool {
	return sse && size < 0 && ctx.Request.Header.IsHTTP11() && uploaded(up)
}

// uploaded reports whether a request's body has gone up whole: read whole
// before the round trip (up is nil), or streamed and finished without an
// error (settled: the answer may come before the upload's last write
// returns). Before, a streamed one never counted, and an event stream
// answering a large POST (a prompt) stayed on the server's path for its
// whole life, holding twice the memory of a relayed one.
func uploaded(up *upload) bool {
	return up == nil || up.settled() && up.wait()
}

// hijackEvents hands the client connection and b to an event relay once
// the handler returns. The server writes nothing itself: the relay writes
// the response header (with chunked framing) and then the events.
func (p *Proxy) hijackEvents(ctx *fasthttp.RequestCtx, b *upstreamBody) {
	closeAfter := ctx.Request.Header.ConnectionClose() || p.resume == nil
	p.startRelay(b).hijack(ctx, func(hc net.Conn) {
		// ctx is valid until this returns, and then released along with
		// the server's read buffer: the relay keeps neither. Bytes the
		// client sent past its request are not this relay's to read: the
		// connection closes after the stream.
		rh := &ctx.Response.Header
		rh.SetContentLength(-1) // chunked
		if closeAfter || bufferedBytes(hc) != nil {
			rh.SetConnectionClose()
		}
		keep := !rh.ConnectionClose()
		if err := b.writeClient(rh.Header()); err != nil {
			p.endRelay(b, err, false)
			return
		}
		go p.relayStream(b, true, keep)
	})
}

// relayUntilClose sends an unsized body to an HTTP/1.0 client, which
// cannot read chunked (RFC 9112 §6.1): the body is delimited by the
// connection's close, as nginx sends it. fasthttp chunks every unsized
// stream, so the connection is hijacked and the body relayed as an event
// stream is (relayStream), each read as it arrives, without framing. The
// response header carries none either: the worker's Transfer-Encoding
// went with the hop-by-hop headers.
//
// Like an event relay it is tracked for shutdown (streams.relayStart),
// which the server no longer sees once the connection is hijacked: the
// grace waits for it as for any request in flight, and the end of the
// shutdown cuts it. Without a request body still going up it runs on a
// goroutine of its own, so that ctx and the server's read buffer go back
// at once; an upload still in progress reads the request through ctx,
// which lives only as long as the hijack handler, so the relay then runs
// inside it.
func (p *Proxy) relayUntilClose(ctx *fasthttp.RequestCtx, b *upstreamBody) {
	ctx.Response.Header.SetConnectionClose()
	b.untilClose = true // before startRelay: cutRelays reads it under its lock
	p.startRelay(b).hijack(ctx, func(net.Conn) {
		if err := b.writeClient(ctx.Response.Header.Header()); err != nil {
			p.endRelay(b, err, false)
			return
		}
		if !uploaded(b.up) {
			p.relayStream(b, false, false)
			return
		}
		go p.relayStream(b, false, false)
	})
}

// startRelay counts b as a relay off the server and returns the guard of
// its hijack: a hijack fasthttp never runs ends the relay (errHijackSkipped)
// after hijackWait, or at once when shutdown cuts it (cutRelays).
func (p *Proxy) startRelay(b *upstreamBody) *hijackGuard {
	g := &hijackGuard{orphaned: func() { p.endRelay(b, errHijackSkipped, false) }}
	p.streams.relayStart(b, g)
	return g
}

// relayStream copies the worker's body to the client until either side
// ends the stream or shutdown stops it (an event stream cleanly, between
// events): as HTTP/1.1 chunks, one per read, or (HTTP/1.0) as it comes,
// the connection's close ending it. keep lets a chunked stream that ended
// cleanly hand the connection back to the server.
func (p *Proxy) relayStream(b *upstreamBody, chunked, keep bool) {
	for {
		// A body already whole (an event stream sized 0) has nothing
		// more to wait for: waiting, the relay sent no last chunk and
		// held the worker connection until the client gave up.
		if !b.done && b.idle() {
			// Wait for the worker without a buffer, checking on the
			// client every few seconds (carryReader.fill). Other errors
			// are the next Read's to report, a shutdown's deadline
			// included (it ends the stream cleanly).
			if err := b.pc.src.fill(b.pc.br); err != nil {
				p.endRelay(b, err, false)
				return
			}
		}
		bp := eventBufs.Get().(*[]byte)
		buf := *bp
		n, err := b.Read(buf[chunkRoom : chunkRoom+streamBufSize])
		var werr error
		if n > 0 {
			out := buf[chunkRoom : chunkRoom+n]
			if chunked {
				out = appendChunk(buf, n)
			}
			werr = b.writeClient(out)
		}
		eventBufs.Put(bp)
		switch {
		case werr != nil:
			p.endRelay(b, werr, false)
			return
		case err == io.EOF:
			if chunked {
				werr = b.writeClient(lastChunk)
			}
			p.endRelay(b, werr, werr == nil && keep && !b.stopped.Load())
			return
		case err != nil:
			// The worker's stream broke mid-way: the client sees a
			// truncated body (no last chunk), as from the server's path.
			p.endRelay(b, err, false)
			return
		}
	}
}

// appendChunk frames the n event bytes at buf[chunkRoom:] as one chunk
// and returns it: the size line written just before them, CRLF after.
func appendChunk(buf []byte, n int) []byte {
	end := chunkRoom + n
	buf[end], buf[end+1] = '\r', '\n'
	i := chunkRoom - 2
	buf[i], buf[i+1] = '\r', '\n'
	for v := n; ; v >>= 4 {
		i--
		buf[i] = "0123456789abcdef"[v&0xf]
		if v < 16 {
			break
		}
	}
	return buf[i : end+2]
}

// endRelay lets go of the stream and of the client connection: back to
// the server for its next request when resume, closed otherwise.
func (p *Proxy) endRelay(b *upstreamBody, err error, resume bool) {
	client, sse, untilClose := b.client, b.sse, b.untilClose
	_ = b.CloseWithError(err)
	if resume {
		// A cleanly ended stream: the connection serves the client's
		// next request, as it would have on the server's path (resume
		// returns when that connection ends: the relay ends first),
		// and closes lingering as the server's connections do (a
		// shutdown's closes are immediate: rawio.Linger.Stop).
		p.streams.relayEnd(sse)
		rawio.Relinger(client)
		_ = p.resume(client)
		return
	}
	// Closed before the relay counts as ended, so that a shutdown that
	// waited for the relays (CloseStreamsContext) finds its client gone.
	// A relay that wrote its whole body (err nil) is done with the
	// connection: it lingers like any other (rawio.Relinger), so that
	// bytes the client sent past its request, which nobody read, do not
	// turn the close that ends the body into a reset.
	//
	// A close-delimited body that did not end whole — the worker cut it
	// (its chunked framing without the last chunk, its connection reset),
	// shutdown cut it — ends in a reset: the close is all an HTTP/1.0
	// client has to tell a whole body from a cut one (RFC 9112 §8), and a
	// clean one passed a partial download off as complete
	// (TestHTTP10CutBodyEndsInReset_RDP2). An event stream that shutdown
	// ends between events ends whole (err nil).
	switch {
	case err == nil:
		rawio.Relinger(client)
	case untilClose:
		rawio.Abort(client)
	}
	_ = client.Close()
	p.streams.relayEnd(sse)
}
