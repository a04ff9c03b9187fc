package proxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/internal/rawio"
)

// prepare points the request at the owner: the advertise URL's path prefix
// plus the original path, the attestation for this session, the epoch.
func (p *Proxy) prepare(ctx *fasthttp.RequestCtx, rq *request, st *ownerState, route directory.Route, now time.Time) {
	h := &ctx.Request.Header
	rq.uri = append(append(rq.uri[:0], st.up.prefix...), rq.path...)
	// Request.SetRequestURIBytes, not the header's: it also drops the
	// server's parsed URI, which Request.Write would otherwise re-render
	// (normalised) in place of the raw path.
	ctx.Request.SetRequestURIBytes(rq.uri)
	if rq.noHost {
		// Each try's own worker: after a refusal or a session gap the
		// request may go to another worker than the one an earlier try
		// named here, which got that worker's host:port before.
		h.SetHost(st.up.host)
	}
	rq.st, rq.owner = st, route.Owner
	p.attest(ctx, rq, now)
	rq.num = strconv.AppendUint(rq.num[:0], route.Epoch, 10)
	h.SetCanonical(hdrEpoch, rq.num)
}

// roundTrip writes the request prepare readied for rq's owner to a pooled
// connection and reads the response header; the body is relayed by the
// server afterwards.
func (p *Proxy) roundTrip(ctx *fasthttp.RequestCtx, rq *request, now time.Time, replayable, retryUnattested bool) outcome {
	st := rq.st
	pool := st.up.pool
	st.up.touch(now)
	idempotent := idempotentRequest(&ctx.Request.Header)
	retry := false
	for {
		pc, late, err := pool.get(now)
		if err != nil {
			if errors.Is(err, errPoolExhausted) {
				p.metrics.UpstreamError("pool")
				writeError(ctx, fasthttp.StatusServiceUnavailable, "owner busy: connection pool exhausted", 1)
			} else {
				p.metrics.UpstreamError("dial")
				writeError(ctx, fasthttp.StatusBadGateway, "owner unreachable", 0)
				return dialOutcome(err)
			}
			return failed
		}
		if late {
			// The pool dialed or waited: the deadlines below count from
			// now. From the request's arrival, a request that waited
			// longer than the header timeout (or the first client check)
			// for a connection found its read deadline passed before it
			// went out, and was answered 504 without reaching the worker.
			now = p.now()
			p.reattest(ctx, rq, now)
		}
		reused := pc.reused
		pc.answered = false
		pc.waitStart = time.Time{} // set again by awaitHeader when it checks on the client
		pc.waitOwner = rq.owner
		if !replayable {
			pc.clearDeadline() // the upload arms it once the body is out
		}
		wall := p.wallClock(now)
		up, err := writeRequest(ctx, pool, pc, wall)
		rq.bodyTaken = rq.bodyTaken || up != nil
		wrote := err == nil
		if wrote && up == nil {
			// A request read whole goes out with the first read of its
			// answer (pconn.Read): a failed send shows here.
			err = awaitHeader(ctx, pool, pc, wall)
			if pc.sendErr != nil {
				err, wrote = pc.sendErr, false
			}
		}
		if errors.Is(pc.sendErr, rawio.ErrNotQuiet) {
			// An idle connection the worker closed, or sent bytes on:
			// nothing went out; the next one (popIdle).
			pool.discard(pc)
			continue
		}
		if !wrote && up == nil && earlyAnswer(ctx, pool, pc, wall, err) {
			return p.relay(ctx, pool, pc, rq.owner, nil, retryUnattested)
		}
		if wrote && up != nil {
			err = awaitUploadHeader(ctx, pc, up)
		}
		if err != nil {
			pool.discard(pc)
			if errors.Is(err, errClientGone) {
				clientClosed(ctx)
				return failed
			}
			if up != nil {
				up.stop()
				if up.clientErr {
					// The client went away or cut its body short: nothing
					// the worker did (the connection closed with the upload).
					ctx.Response.Reset()
					writeError(ctx, fasthttp.StatusBadRequest, "cannot read the request body", 0)
					ctx.SetConnectionClose()
					return failed
				}
			}
			// A reused connection the worker closed while idle fails before
			// any response byte; the request most likely never ran, so an
			// idempotent one goes again on a fresh connection if its body
			// is still in hand. "Most likely": the worker may also have run
			// it and then dropped the connection, which is why a POST is
			// never replayed (Go's transport has the same rule). Once a
			// byte of the answer came (part of its header, an interim
			// 100 or 103), the worker had the request: no replay, as in
			// Go's transport (TestGetNotReplayedAfterAnswerBegan_RDP1).
			if reused && replayable && idempotent && !retry && !pc.answered && staleConn(err) {
				retry = true
				continue
			}
			ctx.Response.Reset()
			p.answerUpstreamError(ctx, err, wrote)
			return failed
		}
		return p.relay(ctx, pool, pc, rq.owner, up, retryUnattested)
	}
}

// earlyAnswer reads the worker's answer to a request whose write failed
// (err) because the worker closed or reset the connection (workerClosed):
// a worker that answers before it reads the body (a 401, an in-band
// refusal raised before the route reads it) and closes with the body
// unread resets the connection under the write, and its answer is already
// in. It reports whether one was read into ctx.Response; the connection is
// then never pooled (it is closed). Otherwise the write's error stands,
// for a retry on a fresh connection or the client's 502: the read found
// the end of the connection, which the failed write already said.
func earlyAnswer(ctx *fasthttp.RequestCtx, pool *connPool, pc *pconn, now time.Time, err error) bool {
	if !workerClosed(err) || awaitHeader(ctx, pool, pc, now) != nil {
		return false
	}
	ctx.Response.Header.SetConnectionClose()
	return true
}

// statusClientClosed is nginx's 499: the client left before the worker
// answered. No client sees it; the access log and metrics do.
const statusClientClosed = 499

// clientClosed answers a request whose client left while pinboard waited
// for the worker (errClientGone): 499, and the connection closes.
func clientClosed(ctx *fasthttp.RequestCtx) {
	ctx.Response.Reset()
	writeError(ctx, statusClientClosed, "client closed the request", 0)
	ctx.SetConnectionClose()
}

// awaitHeader reads the worker's response header to a request sent whole
// (no upload running), within the pool's header timeout from now (a
// reading of the real clock, wallClock: the deadlines are the kernel's;
// the caller's, so the wait costs no clock read of its own). While it
// waits it checks, every clientCheckEvery, that the client is still there
// (rawio.PeerGone, as nginx does with proxy_ignore_client_abort off),
// and gives up with errClientGone once it left: its worker connection is
// then closed, which tells the worker (uvicorn's http.disconnect).
// Before, a client that sent a long-poll request and left held a pooled
// worker connection, and the worker's route, until the worker answered or
// the header timeout (5 minutes by default) passed; a client could leave
// a worker's whole pool held that way without holding one socket itself.
// The check rides on the header deadline, kept lazily as before
// (armHeaderDeadline), only shorter: no timer or goroutine per request.
func awaitHeader(ctx *fasthttp.RequestCtx, pool *connPool, pc *pconn, now time.Time) error {
	pc.armHeaderDeadline(now, pc.startWait(now, pool.headerTimeout, clientCheckEvery))
	for {
		hop, err := readResponseHeader(&ctx.Response.Header, pc.br)
		pc.respHop = hop
		if err == nil {
			return nil
		}
		if pc.sendErr != nil {
			return err // the request did not go out whole (roundTrip)
		}
		if again, err := pc.keepWaiting(err, ctx.Conn()); !again {
			return err
		}
	}
}

// awaitUploadHeader is awaitHeader for a request whose body streams up
// (up): no deadline until the body is out, then the header timeout with
// the client checked on as awaitHeader does (the upload arms the wait).
func awaitUploadHeader(ctx *fasthttp.RequestCtx, pc *pconn, up *upload) error {
	defer up.headerDone()
	for {
		hop, err := readResponseHeader(&ctx.Response.Header, pc.br)
		pc.respHop = hop
		// Only the upload's deadline can pass here, set as it ended:
		// wait orders its setting of the wait before keepWaiting reads it.
		if err == nil || !isTimeout(err) || !up.wait() {
			return err
		}
		if again, err := pc.keepWaiting(err, ctx.Conn()); !again {
			return err
		}
	}
}

// startWait begins a wait of d from now for the worker's answer, checked
// on the client every check (keepWaiting), and returns how far ahead the
// first read deadline goes: d itself when it is no longer than a check
// (nothing to check then).
func (pc *pconn) startWait(now time.Time, d, check time.Duration) time.Duration {
	if d <= check {
		return d
	}
	pc.waitStart, pc.waitFor = now, d
	return check
}

// keepWaiting decides on a read from the worker that failed with err
// during a wait awaitHeader started: true when it was only the client
// check's deadline, the client is still there and the header timeout has
// not passed (the deadline is then set for the next check); otherwise
// false with the error to report, errClientGone when the client left. A
// deadline is no failure of the read: what was read stays in pc.br, and
// the read goes on from there.
func (pc *pconn) keepWaiting(err error, client net.Conn) (bool, error) {
	if pc.waitStart.IsZero() || !isTimeout(err) {
		return false, err
	}
	t := time.Now()
	left := pc.waitFor - t.Sub(pc.waitStart)
	if left <= 0 {
		return false, err
	}
	if rawio.PeerGone(client) {
		return false, errClientGone
	}
	if pc.waitOwner != nil && pc.waitOwner.Revoked() {
		// Its answer would come from a worker no longer the id's owner,
		// if at all: a frozen worker's kernel holds the connection, and
		// the client waited the whole header timeout (5 min) while the
		// id served from another worker — as its event streams did
		// before they were ended (streams.endRevoked).
		return false, errOwnerEnded
	}
	pc.deadline = lazyDeadline{t.Add(min(left, clientCheckEvery))}
	_ = pc.c.SetReadDeadline(pc.deadline.at)
	return true, nil
}

// readSized reads resp's sized body (its Content-Length, at most
// maxSize) from pc whole, as Response.ReadBody does, under the wait
// awaitHeader started: the body of an answer read in the handler has
// the header timeout, as before the client checks, not only the time to
// the next check; and a client that leaves meanwhile is noticed too.
// Allocates nothing once the response's body buffer is warm.
func readSized(resp *fasthttp.Response, pc *pconn, client net.Conn, maxSize int) error {
	if pc.waitStart.IsZero() {
		return resp.ReadBody(pc.br, maxSize)
	}
	n := resp.Header.ContentLength()
	if n < 0 || n > maxSize {
		return fasthttp.ErrBodyTooLarge
	}
	resp.ResetBody()
	for n > 0 {
		if pc.br.Buffered() == 0 {
			if _, err := pc.br.Peek(1); err != nil {
				if again, err := pc.keepWaiting(err, client); !again {
					if err == io.EOF {
						err = io.ErrUnexpectedEOF
					}
					return err
				}
				continue
			}
		}
		b, _ := pc.br.Peek(min(pc.br.Buffered(), n))
		resp.AppendBody(b)
		_, _ = pc.br.Discard(len(b))
		n -= len(b)
	}
	return nil
}

// http11 is the version every request goes to a worker with.
var http11 = []byte("HTTP/1.1")

// writeRequest sends the request as HTTP/1.1, whatever the client's
// version (fast path: an HTTP/1.1 client's request as it is).
//
// Slow path: an HTTP/1.0 client's request (ApacheBench, health checks,
// curl -0). Sent as HTTP/1.0, the worker closes its connection after
// every answer (uvicorn/h11 keeps no HTTP/1.0 connection alive), and each
// such request cost a connect to the worker and a socket in TIME_WAIT.
// As HTTP/1.1 it takes the pooled keep-alive connections as any other
// request does, as nginx's proxy_http_version 1.1 sends it. That is sound:
// its body is framed by Content-Length or absent (fasthttp refuses
// Transfer-Encoding on HTTP/1.0 and reads a request without either as
// bodiless, RFC 9112 §6.1, §6.3), its Connection header went with the
// hop-by-hop ones, prepare gave a request without Host the worker's, and
// the worker's answer is framed for pinboard, which answers the client by
// the client's version (relay: an unsized body until the close). That
// version is restored once the header is out: the server reads it after
// the handler to frame the answer (Content-Length, Connection:
// keep-alive), and relay and relayable decide by it.
func writeRequest(ctx *fasthttp.RequestCtx, pool *connPool, pc *pconn, now time.Time) (*upload, error) {
	h := &ctx.Request.Header
	if h.IsHTTP11() {
		return writeRequest11(ctx, pool, pc, now)
	}
	var proto [len("HTTP/1.0")]byte // fasthttp admits HTTP/d.d only
	n := copy(proto[:], h.Protocol())
	h.SetProtocolBytes(http11)
	up, err := writeRequest11(ctx, pool, pc, now)
	h.SetProtocolBytes(proto[:n])
	return up, err
}

// writeRequest11 writes the request as its header says. A buffered body
// goes with the header; a streamed body goes from its own goroutine (full
// duplex), returned as the upload the caller must wait for before it lets
// go of the connection.
func writeRequest11(ctx *fasthttp.RequestCtx, pool *connPool, pc *pconn, now time.Time) (*upload, error) {
	if pool.stall > 0 {
		// A worker that takes no bytes (frozen, its receive window
		// closed) is cut after the stall timeout, as a streamed upload
		// is (upload.renew): the header timeout bounds reads only, and a
		// request read whole — up to 64 KiB of body — waited for as long
		// as the worker stayed frozen. Kept lazily: a timer operation
		// about once a second on a busy connection.
		rawio.KeepWriteDeadline(pc.c, now, pool.stall)
	}
	bw := pool.writer(pc)
	if !ctx.Request.IsBodyStream() {
		err := ctx.Request.Write(bw)
		if err == nil {
			// The last bytes go out with the wait for the answer
			// (pconn.Read); bw's buffer holds them until then.
			pc.capture = true
			err = bw.Flush()
			pc.capture = false
		}
		if err == nil && pc.out != nil {
			pc.outW = bw
			return nil, nil
		}
		pool.putWriter(bw)
		return nil, err
	}
	h := &ctx.Request.Header
	cl := h.ContentLength()
	if cl < 0 {
		cl = -1
	}
	// Re-assert the framing: hop-by-hop stripping removed the client's
	// Transfer-Encoding, and the body is re-chunked here.
	h.SetContentLength(cl)
	err := h.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		pool.putWriter(bw)
		return nil, err
	}
	return startUpload(ctx.RequestBodyStream(), bw, cl, pool.putWriter, ctx.Conn(), pc, pool.headerTimeout, pool.stall, clientCheckEvery), nil
}

// readResponseHeader reads the final response header, skipping 1xx
// interim responses (100 Continue, 103 Early Hints). A 101 is an error:
// WebSocket handshakes never come this way (websocket.go), and a server
// must not switch to a protocol the request did not ask for (RFC 9110
// §15.2.2) — the bytes after it are not HTTP, so its connection must
// neither be relayed as a response nor go back to the pool.
//
// An answer framed ambiguously is an error too (framing.go): its
// connection is closed and the client gets 502.
//
// It returns the final answer's hop-by-hop names (checkResponseFraming).
func readResponseHeader(rh *fasthttp.ResponseHeader, br *bufio.Reader) (hop uint16, err error) {
	for i := 0; ; i++ {
		if hop, err = readFramedHeader(rh, br); err != nil {
			return 0, err
		}
		s := rh.StatusCode()
		if s == fasthttp.StatusSwitchingProtocols {
			return 0, errUnaskedSwitch
		}
		if s >= 200 {
			return hop, nil
		}
		if i == 8 {
			return 0, errTooManyInterim
		}
	}
}

var (
	errTooManyInterim = errors.New("too many interim responses from worker")
	errUnaskedSwitch  = errors.New("worker switched protocols on a request that asked for no upgrade")
)
