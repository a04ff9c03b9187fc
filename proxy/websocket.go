package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/internal/rawio"
)

// maxHandshakeHeader caps a worker's handshake response header.
const maxHandshakeHeader = 16 << 10

// handshakeTimeout bounds the upgrade exchange with the worker, or
// UpstreamOptions.ResponseHeaderTimeout when that is shorter: a 101 is a
// response header too.
const handshakeTimeout = 30 * time.Second

var errHeaderTooLarge = errors.New("worker handshake response header too large")

func isWebSocket(h *fasthttp.RequestHeader) bool {
	return h.ConnectionUpgrade() && asciiEqualFold(h.Peek(fasthttp.HeaderUpgrade), "websocket")
}

// upgradeWithBody reports whether an upgrade request announces a body:
// a Content-Length above 0, or chunked framing (fasthttp reports -1; -2
// is no framing header at all, no body for a request).
func upgradeWithBody(h *fasthttp.RequestHeader) bool {
	cl := h.ContentLength()
	return cl > 0 || cl == -1
}

// refuseUpgradeWithBody answers an upgrade request that carries a body:
// 400, and the connection closes. Nothing forbids a body there (RFC 9110
// §9.3.1 leaves a GET body undefined, RFC 6455 §4.1 asks for none), but the
// bytes after the header are the body, not the WebSocket stream: relayed
// after a 101 they would reach the worker as frames (the worker, told of a
// body it never got, could read frames as that body), and left unread
// they could be parsed as the client's next request. Refusing is what
// makes that impossible; closing also leaves no body for fasthttp to
// skip over.
func refuseUpgradeWithBody(ctx *fasthttp.RequestCtx) {
	writeError(ctx, fasthttp.StatusBadRequest, "a WebSocket upgrade request cannot carry a body", 0)
	ctx.SetConnectionClose()
}

// serveWebSocket relays a WebSocket upgrade (R-DP-2). The handshake never
// goes through the connection pool — a 101 connection must not return to
// it (../shared/notes/FASTHTTP.md) — so it dials the worker itself, sends
// the rewritten request, and on 101 hijacks the client connection and
// copies bytes both ways. Any other answer (403 without attestation, a 503
// refusal) is relayed as a normal response, except a 403 from a session
// this proxy has just started routing to: that may be the worker not yet
// holding its session id (R-TR-5), and the handshake is tried again like
// a request answered "invalid attestation", resolving the id each time.
func (p *Proxy) serveWebSocket(ctx *fasthttp.RequestCtx, rq *request, route directory.Route, now time.Time) {
	h := &ctx.Request.Header
	p.rewriteRequest(ctx, rq, true)
	h.Set(fasthttp.HeaderConnection, "Upgrade")
	// One Upgrade line, the one isWebSocket read: uvicorn (h11 and
	// httptools alike) takes the last line for the upgrade, and would
	// serve "Upgrade: websocket" then "Upgrade: h2c" as a plain GET.
	h.Del(fasthttp.HeaderUpgrade)
	h.Set(fasthttp.HeaderUpgrade, "websocket")
	for waits, refusals := 0, 0; ; {
		st, err := p.state(route.Owner)
		if err != nil {
			writeError(ctx, fasthttp.StatusBadGateway, "owner unreachable", 0)
			return
		}
		p.prepare(ctx, rq, st, route, now)
		conn, br, raw, out := p.handshake(ctx, rq)
		var ok bool
		if out != served {
			if moves(out, route) {
				if route, now, ok = p.moveOff(ctx, rq, route, out, refusals > 0); ok {
					refusals++
					continue
				}
			}
			return
		}
		status := ctx.Response.StatusCode()
		if status == fasthttp.StatusSwitchingProtocols {
			_ = conn.SetDeadline(time.Time{})
			pending := make([]byte, br.Buffered())
			_, _ = io.ReadFull(br, pending)
			ctx.Response.Reset()
			// The relay writes the worker's 101 itself and the server
			// writes nothing (hijack), but the request is counted by the
			// status left here (Metrics.Request, the access log): a
			// relayed WebSocket is a 101, not the 200 of a reset response.
			ctx.Response.SetStatusCode(fasthttp.StatusSwitchingProtocols)
			client := ctx.Conn()
			g := p.hijacks.pend(conn)
			g.hijack(ctx, func(hc net.Conn) {
				// The relay reads the client's connection itself, not
				// through hc and the server's 16 KiB read buffer, and runs
				// on a goroutine of its own, so that the server lets go of
				// the buffer and the request context when this returns: an
				// idle WebSocket then holds neither (and no copy buffer,
				// see wsDir.copy). Bytes the server had read past the
				// upgrade request (a client may not send any before the
				// 101, RFC 6455 §4.1) go to the worker first.
				r := p.hijacks.start(client, conn, g, route.Owner)
				go p.hijacks.run(r, raw, pending, bufferedBytes(hc))
			})
			return
		}
		if refusedInBand(&ctx.Response.Header) {
			// An in-band refusal (R-PL-6): the worker's resolve dependency
			// refuses before accept, and starlette sends that as an HTTP
			// denial response carrying the marker. An upgrade has no body,
			// so it is placed once more elsewhere, as forward does.
			_ = conn.Close()
			resetForRetry(&ctx.Response)
			if route, now, ok = p.moveOff(ctx, rq, route, refused, refusals > 0); !ok {
				return
			}
			refusals++
			continue
		}
		if status == fasthttp.StatusServiceUnavailable {
			// A decline or a released epoch (see bodyHostDraining) moves
			// the placement as for any request; other 503s are relayed.
			p.relayRefusedUpgrade(ctx, conn, br)
			if out := movesPlacement(ctx.Response.Body()); out != served {
				if route, now, ok = p.moveOff(ctx, rq, route, out, refusals > 0); ok {
					refusals++
					continue
				}
			}
			return
		}
		if status != fasthttp.StatusForbidden || waits == len(unattestedWaits) || !p.maybeGap(rq, route, st, now) {
			p.relayRefusedUpgrade(ctx, conn, br)
			return
		}
		_ = conn.Close()
		resetForRetry(&ctx.Response)
		p.metrics.UpstreamError("unattested")
		if route, now, ok = p.afterGap(ctx, rq, waits); !ok {
			return
		}
		waits++
	}
}

// maybeGap reports whether an upgrade that route's owner refused with 403
// may have met the session gap (R-TR-5) rather than the route's own
// refusal, which a bare 403 cannot tell apart: the session is young (see
// youngSession), or the id is no longer placed on it — the worker lost
// the session (its lease lapsed, the store forgot it), which is what
// makes it re-register, and dropped its session id with it; a
// re-registration then moves the id to the new session. A route's own
// refusal from an older session that still holds the id costs one
// cached lookup, no wait.
func (p *Proxy) maybeGap(rq *request, route directory.Route, st *ownerState, now time.Time) bool {
	if now.UnixNano()-st.born <= int64(youngSession) {
		return true
	}
	cur, ok := p.store.Lookup(rq.ns, rq.id, p.now())
	return !ok || cur.Owner != route.Owner
}

// handshake dials the owner, sends the upgrade request and reads the
// answer's header into ctx.Response, keeping its raw bytes for a 101
// (served). On failure it answers the client itself and reports failed,
// or unreachable when the owner could not be dialed.
func (p *Proxy) handshake(ctx *fasthttp.RequestCtx, rq *request) (net.Conn, *bufio.Reader, []byte, outcome) {
	st := rq.st
	conn, err := st.up.dial(st.up.addr)
	if err != nil {
		p.metrics.UpstreamError("dial")
		writeError(ctx, fasthttp.StatusBadGateway, "owner unreachable", 0)
		return nil, nil, nil, dialOutcome(err)
	}
	// Raw reads and writes toward the worker, as on pooled connections:
	// every relayed message is one of each.
	conn = rawio.Wrap(conn)
	// Counted from now that the connection is up: a dial slowed by SYN
	// retransmits (up to DialTimeout) is not the worker's answer being
	// late, as for pooled requests (roundTrip).
	now := p.now()
	end := p.wallClock(now).Add(min(handshakeTimeout, st.up.pool.headerTimeout))
	_ = conn.SetDeadline(end)
	p.reattest(ctx, rq, now) // the dial may have taken up to DialTimeout
	if _, err := conn.Write(ctx.Request.Header.Header()); err != nil {
		_ = conn.Close()
		p.answerUpstreamError(ctx, err, false)
		return nil, nil, nil, failed
	}
	br := bufio.NewReaderSize(newAnswerReader(conn, ctx.Conn(), end), 4096)
	raw, err := readHandshakeAnswer(br, &ctx.Response.Header)
	if err != nil {
		_ = conn.Close()
		if errors.Is(err, errClientGone) {
			clientClosed(ctx)
			return nil, nil, nil, failed
		}
		ctx.Response.Reset()
		p.answerUpstreamError(ctx, err, true)
		return nil, nil, nil, failed
	}
	return conn, br, raw, served
}

// answerReader reads a worker's answer to an upgrade until end, checking
// every clientCheckEvery that the client is still there (rawio.PeerGone),
// as awaitHeader does for other requests: errClientGone once it left, and
// the handshake lets go of the worker's connection (which tells the
// worker, as uvicorn's http.disconnect). Before, a client that sent a
// handshake and left held the worker connection, and a goroutine here,
// for the handshake's whole deadline (30 s), and was counted as the
// worker's timeout (504) though no client saw it. A deadline is no
// failure of the read: bufio keeps what came before it.
type answerReader struct {
	c, client net.Conn
	end       time.Time
}

// newAnswerReader returns c's reader until end, c's read deadline set for
// the first check.
func newAnswerReader(c, client net.Conn, end time.Time) *answerReader {
	r := &answerReader{c: c, client: client, end: end}
	r.arm(time.Now())
	return r
}

// arm sets c's read deadline to the next check, or to end when that comes
// first.
func (r *answerReader) arm(now time.Time) {
	at := now.Add(clientCheckEvery)
	if at.After(r.end) {
		at = r.end
	}
	_ = r.c.SetReadDeadline(at)
}

func (r *answerReader) Read(p []byte) (int, error) {
	for {
		n, err := r.c.Read(p)
		if err == nil || !isTimeout(err) {
			return n, err
		}
		now := time.Now()
		if !now.Before(r.end) {
			return n, err
		}
		if n > 0 {
			r.arm(now)
			return n, nil
		}
		if rawio.PeerGone(r.client) {
			return 0, errClientGone
		}
		r.arm(now)
	}
}

// relayRefusedUpgrade forwards a worker's non-101 answer to an upgrade.
func (p *Proxy) relayRefusedUpgrade(ctx *fasthttp.RequestCtx, conn net.Conn, br *bufio.Reader) {
	defer conn.Close()
	rh := &ctx.Response.Header
	rh.ResetConnectionClose()
	ownVersion(rh)
	stripResponseHop(rh)
	if s := rh.StatusCode(); s == fasthttp.StatusNoContent || s == fasthttp.StatusNotModified {
		return
	}
	if ctx.Request.Header.IsHead() {
		// Nothing follows the header of an answer to HEAD, whatever its
		// Content-Length says (RFC 9110 §9.3.2): read for one, the
		// handshake waited for bytes that never came until its deadline
		// (30 s) and the client got 502 instead of the worker's answer.
		skipHeadBody(ctx, rh.ContentLength())
		return
	}
	if err := ctx.Response.ReadBody(br, 1<<20); err != nil {
		if errors.Is(err, errClientGone) {
			clientClosed(ctx)
			return
		}
		// By what failed, as for any answer (R-DP-4): a body that did not
		// come within the handshake's deadline is 504, one past the cap
		// an invalid answer; before, every failure was 502 "owner
		// unreachable" (TestFrozenUpgradeRefusalIs504_RDP4).
		ctx.Response.Reset()
		p.answerUpstreamError(ctx, err, true)
	}
}

// readHandshakeAnswer reads the worker's answer to an upgrade into rh and
// returns its raw bytes. Interim answers before it (100 Continue, 103
// Early Hints, RFC 9110 §15.2) are read past, as readResponseHeader does
// for other requests: taken for the answer, a 103 went to the client as
// its final response, which then waited for one that never came. A 101
// is the answer here.
func readHandshakeAnswer(br *bufio.Reader, rh *fasthttp.ResponseHeader) ([]byte, error) {
	for i := 0; ; i++ {
		raw, err := readRawHeader(br)
		if err != nil {
			return nil, err
		}
		// Sized to the header: bufio's default 4 KiB would refuse a 101
		// with a long Set-Cookie that readRawHeader accepted.
		if err := rh.Read(bufio.NewReaderSize(bytes.NewReader(raw), len(raw)+16)); err != nil {
			return nil, err
		}
		// The same framing rules as other answers (framing.go): a refusal
		// is relayed as a response, and a status below 100 would make
		// the answer behind it the handshake's.
		_, f := scanHeader(raw)
		if _, err := checkResponseFraming(rh, raw, f); err != nil {
			return nil, err
		}
		if s := rh.StatusCode(); s == fasthttp.StatusSwitchingProtocols && !verbatimSafe(raw) {
			return nil, errHandshakeLines
		} else if s >= 200 || s == fasthttp.StatusSwitchingProtocols {
			return raw, nil
		}
		if i == 8 {
			return nil, errTooManyInterim
		}
	}
}

// errHandshakeLines: a 101 with a bare LF line end or a folded line.
// Relayed byte for byte, pinboard would send what RFC 9112 forbids a
// sender (§2.2: CRLF; §5.2: a proxy MUST replace obs-fold or answer 502);
// other answers are written anew by the HTTP server.
var errHandshakeLines = errors.New("worker handshake answer with bare LF or folded lines")

// verbatimSafe reports whether raw (a header block) may go to the client
// as it is: every line ended by CRLF, none folded.
func verbatimSafe(raw []byte) bool {
	for i, c := range raw {
		switch {
		case c == '\n' && (i == 0 || raw[i-1] != '\r'):
			return false
		case (c == ' ' || c == '\t') && i > 0 && raw[i-1] == '\n':
			return false
		}
	}
	return true
}

// readRawHeader reads a response header up to and including its blank
// line, keeping the exact bytes so a 101 reaches the client as the worker
// sent it.
func readRawHeader(br *bufio.Reader) ([]byte, error) {
	var raw []byte
	// cont: the last read stopped at a full buffer, inside a line, so
	// what comes next is that line's rest: a "\n" or "\r\n" left of a
	// line of 4095 or 4096 bytes is no blank line.
	cont := false
	for {
		line, err := br.ReadSlice('\n')
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return nil, err
		}
		raw = append(raw, line...)
		if len(raw) > maxHandshakeHeader {
			return nil, errHeaderTooLarge
		}
		if err == nil && !cont && (len(line) == 2 && line[0] == '\r' || len(line) == 1) {
			return raw, nil
		}
		cont = err != nil
	}
}

// hijacks tracks relayed WebSocket connections: fasthttp's Shutdown
// neither counts nor closes hijacked connections.
type hijacks struct {
	// stall bounds each relayed write (wsDir.stall); set once at start.
	stall time.Duration
	// closeWait is how long the worker gets to close its end after the
	// client's FIN (DefaultCloseWait); set once at start, by tests only.
	closeWait time.Duration

	mu sync.Mutex
	m  map[*wsRelay]struct{}
	// pending holds the hijacks of 101s that fasthttp has not run yet (it
	// first flushes answers held back before them, and skips the hijack
	// when that fails): wait counts them and closeAll abandons them,
	// closing their worker connections, instead of leaving those to the
	// orphan timer (hijackWait) after the shutdown.
	pending map[*hijackGuard]struct{}
	// closing is set by shutdown, for good: a relay whose 101 arrives
	// later is told goodbye as soon as the 101 is through, bounded by the
	// same deadline, instead of outliving the shutdown untracked.
	closing  bool
	deadline time.Time
	// idle tells wait when the last relay ended.
	idle idleSignal
	// goodbyes counts shutdown's goodbyes still being sent, each over by
	// the shutdown's deadline (see shutdown).
	goodbyes sync.WaitGroup
}

func newHijacks() *hijacks {
	return &hijacks{m: make(map[*wsRelay]struct{}), pending: make(map[*hijackGuard]struct{}), closeWait: DefaultCloseWait}
}

// Open returns the number of relayed connections.
func (hj *hijacks) Open() int64 {
	hj.mu.Lock()
	defer hj.mu.Unlock()
	return int64(len(hj.m))
}

// pend tracks the hijack of a 101 until it runs (start) or is abandoned,
// which closes upstream, the worker's connection.
func (hj *hijacks) pend(upstream net.Conn) *hijackGuard {
	g := &hijackGuard{}
	g.orphaned = func() {
		hj.mu.Lock()
		delete(hj.pending, g)
		hj.idle.check(hj.count())
		hj.mu.Unlock()
		_ = upstream.Close()
	}
	hj.mu.Lock()
	hj.pending[g] = struct{}{}
	hj.mu.Unlock()
	return g
}

// count is what wait waits for: relays and pending hijacks. Called with
// mu held.
func (hj *hijacks) count() int { return len(hj.m) + len(hj.pending) }

// start tracks a relay between client and upstream, in place of g, its
// pending hijack (nil: none), so that wait never sees neither. owner is
// the worker's session (nil: none known).
func (hj *hijacks) start(client, upstream net.Conn, g *hijackGuard, owner *directory.Owner) *wsRelay {
	r := newWSRelay(client, upstream, hj.stall)
	r.owner = owner
	hj.mu.Lock()
	hj.m[r] = struct{}{}
	delete(hj.pending, g)
	hj.mu.Unlock()
	return r
}

// run copies a WebSocket that start tracked both ways until either side
// ends it. early holds bytes the client sent before the 101 reached it.
func (hj *hijacks) run(r *wsRelay, handshake, pending, early []byte) {
	client, upstream := r.client, r.upstream
	hj.mu.Lock()
	closing, deadline := hj.closing, hj.deadline
	hj.mu.Unlock()
	if closing {
		r.goAway(deadline)
	}
	defer func() {
		hj.mu.Lock()
		delete(hj.m, r)
		hj.idle.check(hj.count())
		hj.mu.Unlock()
	}()
	defer upstream.Close()
	// The client connection closes once, at the end (a second Close of a
	// lingering connection would cut its linger short).
	defer client.Close()
	going, deadline, err := r.writeHandshake(handshake)
	if err != nil {
		return
	}
	// Frames the worker sent right behind its 101 go through the tracker
	// (and, with a goodbye pending, Close follows them).
	if len(pending) > 0 {
		if err := r.down.forward(pending); err != nil {
			return
		}
	}
	if len(early) > 0 {
		if err := r.up.forward(early); err != nil {
			return
		}
	}
	if going {
		r.shutdown(deadline)
	}
	done := make(chan struct{})
	var upErr error
	go func() {
		err := r.up.copy()
		upErr = err
		// The client finished sending. A FIN is passed on, and the worker,
		// which should close its end now (RFC 6455 §7.1.1), gets
		// DefaultCloseWait to do so. A client gone (a reset, a dead peer)
		// or a worker that failed ends the relay at once: the worker may
		// have nothing to send for hours, and the relay would wait for it.
		if tc := rawio.TCP(upstream); tc != nil && errors.Is(err, io.EOF) {
			_ = tc.CloseWrite()
			wait := time.Now().Add(hj.closeWait)
			_ = upstream.SetReadDeadline(wait)
			// A client answering shutdown's Close does exactly this:
			// the wait must not outlast the goodbye's deadline.
			r.capToGoodbye(wait, upstream.SetReadDeadline)
		} else {
			_ = upstream.Close()
		}
		close(done)
	}()
	if err := r.down.copy(); !errors.Is(err, io.EOF) {
		// Either side failed: both end at once.
		_ = client.Close()
		_ = upstream.Close()
		<-done
		return
	}
	// The worker ended the stream, most likely after its Close frame.
	// What the client sends from now on reaches nobody, and the client
	// is likely still sending — its answering Close, frames in flight —
	// or has bytes waiting unread here: closed at once, the connection
	// would answer them with a reset, which fails the client's writes
	// and can cut the worker's last frames on their way. So the relay
	// stops reading the client (a read deadline, not a close), lets the
	// worker go, and the client connection closes lingering, as the
	// server's connections do (rawio.Relinger; immediate once shutdown
	// stopped the lingering).
	_ = upstream.Close()
	_ = client.SetReadDeadline(time.Now())
	<-done
	if !errors.Is(upErr, io.EOF) {
		rawio.MoreInput(client)
	}
	rawio.Relinger(client)
}

// shutdown sends Close 1001 both ways on every relay (see wsrelay.go) —
// and on every relay that starts later, right after its 101 — and lets
// them finish until deadline.
//
// Each relay is told on a goroutine of its own, which ends by the
// deadline at the latest (goAway bounds both connections by it): a relay
// whose client does not read can hold its goodbye that long (its Close
// frame's write, or 0.1 s of tryClose's retries behind a blocked
// forward). Told one after the other, twenty stalled clients used up the
// whole close budget (CloseWait), and the relays after them in the list,
// healthy ones included, were cut without their Close frame.
func (hj *hijacks) shutdown(deadline time.Time) {
	hj.mu.Lock()
	hj.closing, hj.deadline = true, deadline
	relays := make([]*wsRelay, 0, len(hj.m))
	for r := range hj.m {
		relays = append(relays, r)
	}
	hj.mu.Unlock()
	hj.goodbyes.Add(len(relays))
	for _, r := range relays {
		go func() {
			defer hj.goodbyes.Done()
			r.goAway(deadline)
		}()
	}
}

// endRevoked tells goodbye — Close 1001 "going away" toward the client and
// the worker, the connections closed closeWait later at the latest, as at
// shutdown — to every relay whose session the store ended (see
// streams.endRevoked: a frozen worker's WebSocket idles for ever, and one
// from a session the fleet moved on from runs beside the id's new
// owner). It returns how many it told.
func (hj *hijacks) endRevoked(now time.Time) int {
	hj.mu.Lock()
	var ended []*wsRelay
	for r := range hj.m {
		if r.owner != nil && r.owner.Revoked() && !r.going.Load() {
			ended = append(ended, r)
		}
	}
	hj.mu.Unlock()
	deadline := now.Add(hj.closeWait)
	for _, r := range ended {
		// Each on its own: a direction inside a frame waits for its
		// boundary (wsDir.tryClose) up to 0.1 s.
		go r.goAway(deadline)
	}
	return len(ended)
}

// closeAll closes every relayed connection, and abandons every pending
// hijack (closing its worker connection).
func (hj *hijacks) closeAll() {
	hj.mu.Lock()
	for r := range hj.m {
		_ = r.client.Close()
		_ = r.upstream.Close()
	}
	pending := make([]*hijackGuard, 0, len(hj.pending))
	for g := range hj.pending {
		pending = append(pending, g)
	}
	hj.mu.Unlock()
	// Outside mu: abandoning takes it. A guard whose hijack ran (start
	// is on its way) does nothing.
	for _, g := range pending {
		g.abandon()
	}
}

// wait blocks until every relay finished or ctx ends, and reports
// whether they all did.
func (hj *hijacks) wait(ctx context.Context) bool {
	return hj.idle.await(ctx, &hj.mu, hj.count)
}

// idleSignal tells a waiter when a count of things in flight drops to
// zero. Not a WaitGroup: things may start while someone waits (relays
// after shutdown began), which a WaitGroup at zero does not allow. The
// owner's mutex guards it.
type idleSignal struct{ ch chan struct{} }

// check wakes the waiters once n, the count after a change, is zero.
func (s *idleSignal) check(n int) {
	if n == 0 && s.ch != nil {
		close(s.ch)
		s.ch = nil
	}
}

// await blocks until count, read under mu (the owner's), is zero or ctx
// ends, and reports whether it reached zero.
func (s *idleSignal) await(ctx context.Context, mu *sync.Mutex, count func() int) bool {
	for {
		mu.Lock()
		idle := s.wait(count())
		mu.Unlock()
		if idle == nil {
			return true
		}
		select {
		case <-idle:
		case <-ctx.Done():
			return false
		}
	}
}

// wait returns a channel closed when the count, now n, drops to zero, or
// nil when it is zero already.
func (s *idleSignal) wait(n int) <-chan struct{} {
	if n == 0 {
		return nil
	}
	if s.ch == nil {
		s.ch = make(chan struct{})
	}
	return s.ch
}
