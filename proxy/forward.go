package proxy

import (
	"io"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/attest"
	"github.com/pinboard-go/pinboard/directory"
)

// Wire names from the reference worker (pinned.pinboard.wire), in
// fasthttp's canonical form: the hot path sets and peeks them with
// SetCanonical and PeekCanonical, skipping a key copy and normalization
// per call (the server normalizes incoming names the same way).
var (
	hdrAttestation   = []byte("Pinboard-Attestation")
	hdrEpoch         = []byte("Pinboard-Epoch")
	hdrFrom          = []byte("Pinboard-From")
	hdrSession       = []byte("Pinboard-Session")
	hdrSessionSecret = []byte("Pinboard-Session-Secret")
	hdrDepth         = []byte("Pinboard-Subrequest-Depth")
	hdrRefusal       = []byte("Pinned-Refusal")
	valLeaseRefusal  = []byte("lease-unhealthy")
	hdrAuthorization = []byte("Authorization")
	hdrXFF           = []byte("X-Forwarded-For")
	hdrXFProto       = []byte("X-Forwarded-Proto")
	hdrXFHost        = []byte("X-Forwarded-Host")
	valHTTP          = []byte("http")
	valHTTPS         = []byte("https")

	hdrIdempotencyKey  = []byte("Idempotency-Key")
	hdrXIdempotencyKey = []byte("X-Idempotency-Key")

	// The challenge of a 401 (RFC 9110 §11.6.1): a passport credential
	// is a bearer token (attest.Passport.Authenticate, RFC 6750).
	hdrWWWAuthenticate = []byte("Www-Authenticate")
	valBearer          = []byte("Bearer")
)

// maxSubrequestDepth is the reference worker's MAX_DEPTH for cluster calls.
const maxSubrequestDepth = 50

// placeTimeout bounds one placement (or session check, or release)
// against the store: at least this long, at most a second more
// (opContexts).
const placeTimeout = 5 * time.Second

// request is the pooled per-request state. Slices are scratch buffers
// reused across requests; ns, id and path are copies because forwarding
// rewrites the request URI they were parsed from.
type request struct {
	ns, id    []byte
	path      []byte // path and query from the namespace on
	uri       []byte
	num       []byte
	xff       []byte
	tmp       []byte // scratch for a header value kept across a deletion
	att       []byte
	body      []byte
	principal *attest.Principal
	// passport: the Authorization is a passport credential, consumed
	// here and never forwarded (R-TR-4): an admitted client's, whose
	// account rides in the attestation (principal), or one a cluster
	// call carries, attested by its session instead.
	passport bool

	// The client's Cookie lines as sent (rawCookies), cookieEnds[i] the
	// end of line i (saveCookies).
	rawCookies []byte
	cookieEnds []int

	// The try's owner and its state, set by prepare; attSec is the second
	// of the attestation the header carries (Proxy.attest).
	st     *ownerState
	owner  *directory.Owner
	attSec int64

	// Attested cluster call (R-TR-6).
	call          bool
	caller        []byte
	depth         int
	callerSession string

	pick    directory.PickInput
	pickSet bool
	// placeReq is the request's placement attempt, reused: a pointer
	// handed to the store through its interface would be allocated per
	// call (the stores keep nothing of it, directory.Store).
	placeReq directory.PlaceRequest

	// routed is set once the request resolved to a worker: its namespace
	// is then a registered one, safe as a metrics label.
	routed bool

	// noHost: the client sent no Host (HTTP/1.0 need not); each try
	// gets its worker's (prepare), and placement sees none.
	noHost bool

	// bodyTaken: a streamed request body went to an upload, which reads
	// it (ServeHTTP: unreadChunked).
	bodyTaken bool

	// order puts back the order of repeated fields after the header's
	// edits (keepFieldOrder).
	order fieldOrder

	// sent is the header as it came, kept while Expect checks it.
	sent fasthttp.RequestHeader

	// hop is the header's hopFound, taken by parse with its checks and
	// used by stripRequestHop: nothing between them adds a header.
	hop uint16
}

func (rq *request) reset() {
	rq.ns, rq.id, rq.path = rq.ns[:0], rq.id[:0], rq.path[:0]
	rq.principal, rq.passport = nil, false
	rq.st, rq.owner, rq.attSec = nil, nil, 0
	rq.call, rq.caller, rq.depth, rq.callerSession = false, rq.caller[:0], 0, ""
	rq.pick, rq.pickSet = directory.PickInput{}, false
	rq.placeReq = directory.PlaceRequest{}
	rq.routed, rq.noHost, rq.hop, rq.bodyTaken = false, false, 0, false
	rq.rawCookies, rq.cookieEnds = rq.rawCookies[:0], rq.cookieEnds[:0]
	rq.order.reset()
}

// ServeHTTP handles one data-plane request: /{ns}/{id}/{rest...}.
func (p *Proxy) ServeHTTP(ctx *fasthttp.RequestCtx) {
	start := p.now()
	rq := p.reqPool.Get().(*request)
	p.serve(ctx, rq, start)
	if !rq.bodyTaken && unreadChunked(ctx) {
		ctx.SetConnectionClose()
	}
	var ns []byte
	if rq.routed {
		ns = rq.ns
	}
	p.metrics.Request(ns, ctx.Response.StatusCode(), p.now().Sub(start))
	rq.reset()
	p.reqPool.Put(rq)
}

// unreadChunked reports whether the request has a chunked body that the
// handler left unread (no upload took it): pinboard's own answer to it
// must say Connection: close. fasthttp discards at most 256 KiB of an
// unread body after the answer and then closes the connection; for a
// Content-Length it decides that before the answer is written and says
// so, for a chunked body it cannot, and the answer went out as keep-alive
// with the connection then closed under the client's next request (RFC
// 9112 section 9.6; TestAnswerLeavingChunkedBodyUnreadSaysClose_RDP4_RREG7).
func unreadChunked(ctx *fasthttp.RequestCtx) bool {
	return ctx.Request.IsBodyStream() && ctx.Request.Header.ContentLength() == -1
}

// wallClock returns now, a reading of the proxy's clock, for a socket
// deadline: as it is from the real clock, else the real time. An injected
// clock (Options.Now) is for leases; a deadline set from one that stands
// still or runs ahead never fires.
func (p *Proxy) wallClock(now time.Time) time.Time {
	if p.realClock {
		return now
	}
	return time.Now()
}

func (p *Proxy) serve(ctx *fasthttp.RequestCtx, rq *request, now time.Time) {
	if !p.parse(ctx, rq) {
		return
	}
	if rq.hop&hopReserved != 0 && p.looped(ctx, now) {
		return
	}
	if sess := ctx.Request.Header.PeekCanonical(hdrSession); len(sess) > 0 {
		if !p.clusterCall(ctx, rq, sess, now) {
			return
		}
		now = p.now() // after the store's round trip (resolve says why)
	} else if !p.admit(ctx, rq) {
		return
	}
	p.dispatch(ctx, rq, now)
}

// looped refuses a request pinboard itself forwarded: one carrying an
// attestation that verifies for a session of this directory. A worker
// advertise URL that reaches pinboard — registered by a key whose
// allowedBackendHosts cover pinboard's own address (`*`, a pod range),
// its challenge probe answered through pinboard by a worker serving the
// namespace the probe's path names — would otherwise send every request
// for its ids back through pinboard, each hop holding a worker connection
// up to the pool's cap: one client request became a thousand in flight,
// each for up to the worker header timeout. Clients cannot mint an
// attestation (they hold no worker secret); a worker replaying one it
// received only has its own request refused. Anything else carrying the
// header — a forgery, a session this directory does not know, a store
// that does not answer — goes on to be stripped as before (R-TR-5). The
// check costs nothing unless the request carries a pinboard-* header
// (rq.hop); then it costs a session lookup, like a cluster call.
func (p *Proxy) looped(ctx *fasthttp.RequestCtx, now time.Time) bool {
	tok := ctx.Request.Header.PeekCanonical(hdrAttestation)
	if len(tok) == 0 {
		return false
	}
	aud, ok := attest.AttestationAudience(string(tok))
	if !ok {
		return false
	}
	info, err := p.store.Session(p.opCtx.get(), aud, now)
	if err != nil {
		return false
	}
	if _, err := attest.VerifyAttestation(string(tok), []byte(info.Secret), []string{aud}, now); err != nil {
		return false
	}
	if sec := now.Unix(); p.loopLogged.Swap(sec) != sec {
		p.log.Warn("refused a request pinboard forwarded to itself: a worker's advertise URL reaches pinboard",
			"sessionId", aud, "clientId", info.ClientID, "advertiseUrl", info.AdvertiseURL)
	}
	writeError(ctx, fasthttp.StatusLoopDetected, "loop detected: a worker's advertise URL reaches pinboard", 0)
	return true
}

// Expect decides a request that asks Expect: 100-continue on its header
// alone, before the client sends its body: what serve checks before it
// touches the store — framing, target, Authorization lines, the header's
// names and bounds, the namespace policy (a cluster call's session is
// checked with its body) — is answered here in place of the 100, and the
// client sends nothing only to have it dropped (RFC 9110 §10.1.1). It
// reports whether the request may go on; if not, the answer is on ctx.
//
// The checks iterate the header, which makes fasthttp parse its Cookie
// lines into its cookie list: the request's own parse (ServeHTTP) then
// found them merged into one line, quotes dropped, a quoted value with an
// escaped quote lost (saveCookies). The header of a request that goes on
// is put back as it came (TestExpectContinueCookiesForwardedVerbatim_RDP1).
func (p *Proxy) Expect(ctx *fasthttp.RequestCtx) bool {
	start := p.now()
	rq := p.reqPool.Get().(*request)
	ctx.Request.Header.CopyTo(&rq.sent)
	ok := p.parse(ctx, rq) && (len(ctx.Request.Header.PeekCanonical(hdrSession)) > 0 || p.admit(ctx, rq))
	if ok {
		// Request's setter drops a URI parse ToOriginForm left.
		rq.sent.CopyTo(&ctx.Request.Header)
		ctx.Request.SetRequestURIBytes(rq.sent.RequestURI())
	} else {
		p.metrics.Request(nil, ctx.Response.StatusCode(), p.now().Sub(start))
	}
	rq.sent.Reset()
	rq.reset()
	p.reqPool.Put(rq)
	return ok
}

// parse answers what the request's header alone refuses and fills rq
// with its target; it reports whether the request goes on.
func (p *Proxy) parse(ctx *fasthttp.RequestCtx, rq *request) bool {
	// First of all: any answer on a connection whose request is framed
	// ambiguously leaves what follows it to be read as the next request.
	if RefuseUnreadable(ctx) {
		return false
	}
	if ctx.Request.Header.IsConnect() {
		// The data plane does not tunnel (nginx refuses CONNECT too,
		// since 1.21.1). Forwarded, a 2xx answer would make the worker's
		// connection a tunnel (RFC 9110 §9.3.6; h11 switches protocols
		// on it) that relay would read as a plain response and pool, to
		// answer the next client's request with the tunnel's bytes. The
		// client's connection closes: a client may send its tunnel's
		// first bytes right behind the request, and they are no request.
		writeError(ctx, fasthttp.StatusNotImplemented, "CONNECT is not supported", 0)
		ctx.SetConnectionClose()
		return false
	}
	if m := ctx.Request.Header.Method(); asciiEqualFold(m, "TRACE") || asciiEqualFold(m, "TRACK") {
		// Answered by echoing the request received (RFC 9110 §9.3.8),
		// which would hand the client pinboard's attestation: a token
		// the worker takes on every route of every namespace it serves
		// for a minute (R-TR-5), and a credential no TRACE may carry.
		// TRACK is IIS's echo; another case, a server reading methods
		// case-insensitively. nginx refuses TRACE too.
		writeError(ctx, fasthttp.StatusNotImplemented, "TRACE is not supported", 0)
		return false
	}
	if err := ToOriginForm(&ctx.Request); err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, err.Error(), 0)
		return false
	}
	saveCookies(&ctx.Request.Header, rq)
	t, err := ParseTarget(ctx.Request.Header.RequestURI(), p.base)
	if err != nil {
		if err == errNotInstance || err == errOutsideBase || err == errWorkerRoute {
			writeError(ctx, fasthttp.StatusNotFound, "not found", 0)
			return false
		}
		writeError(ctx, fasthttp.StatusBadRequest, err.Error(), 0)
		return false
	}
	rq.noHost = len(ctx.Request.Header.Host()) == 0
	rq.ns = appendNamespace(rq.ns, t.NS)
	if string(rq.ns) == workerNamespace {
		writeError(ctx, fasthttp.StatusNotFound, "not found", 0)
		return false
	}
	rq.id = append(rq.id, t.ID...)
	rq.path = append(append(rq.path, t.Path...), t.Query...)

	if repeated(&ctx.Request.Header, hdrAuthorization) {
		// A singleton field (RFC 9110 §11.6.2). Only the first line is
		// checked as a credential; a passport token in another would pass
		// unchecked and unconsumed to the worker.
		writeError(ctx, fasthttp.StatusBadRequest, "more than one Authorization header", 0)
		return false
	}
	// Stripping and putting repeated fields back in order are bounded;
	// a request past a bound is refused here, with nothing placed for it
	// (a new id would keep its placement).
	hop, lines := hopScan(ctx.Request.Header.All())
	rq.hop = hop &^ hopBadName
	if hop&hopBadName != 0 {
		// A field name is a token (RFC 9110 §5.1): with a space in it,
		// the request is as malformed as one fasthttp refuses for any
		// other such byte, and gets that answer; forwarded, the worker's
		// HTTP parser refused it instead, its connection closed.
		writeError(ctx, fasthttp.StatusBadRequest, "malformed request", 0)
		ctx.SetConnectionClose()
		return false
	}
	err = nil
	if hop&(hopNamed|hopReserved) != 0 {
		err = checkStripBound(&ctx.Request.Header, hop)
	}
	if err == nil {
		err = checkRepeatBound(&ctx.Request.Header, &rq.order, lines)
	}
	if err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, err.Error(), 0)
		ctx.SetConnectionClose()
		return false
	}
	return true
}

// dispatch resolves an admitted request's owner and forwards it, or
// relays its WebSocket.
func (p *Proxy) dispatch(ctx *fasthttp.RequestCtx, rq *request, now time.Time) {
	ws := isWebSocket(&ctx.Request.Header)
	if ws && upgradeWithBody(&ctx.Request.Header) {
		refuseUpgradeWithBody(ctx)
		return
	}
	route, now, err := p.resolve(ctx, rq, now)
	if err != nil {
		placeFailed(ctx, err)
		return
	}
	rq.routed = true
	if ws {
		p.serveWebSocket(ctx, rq, route, now)
		return
	}
	p.forward(ctx, rq, route, now)
}

// resolve finds the id's owner: the directory's cached lookup for a live
// placement (no round trip), else a placement through the store. It
// returns the time to go on from: now, or after a placement a reading
// taken once the store answered. The worker's deadlines count from it:
// from before a slow round trip (a busy Redis), a request found its read
// deadline passed before it went out, and was answered 504 unsent.
func (p *Proxy) resolve(ctx *fasthttp.RequestCtx, rq *request, now time.Time) (directory.Route, time.Time, error) {
	route, ok := p.store.Lookup(rq.ns, rq.id, now)
	p.metrics.Resolve(ok)
	if ok {
		return route, now, nil
	}
	route, err := p.place(ctx, rq, now, directory.Route{})
	return route, p.now(), err
}

// admit applies the namespace policy (R-TR-4). A pinboard credential is
// consumed here: its Authorization header never reaches the worker, the
// account rides in the attestation instead. A header that is not a
// pinboard credential passes through untouched to the worker's own auth.
func (p *Proxy) admit(ctx *fasthttp.RequestCtx, rq *request) bool {
	pr, err := p.passport.Authenticate(ctx.Request.Header.PeekCanonical(hdrAuthorization))
	if err != nil {
		pr = nil
	}
	switch p.passport.Admit(rq.ns, pr) {
	case attest.Allow:
		rq.principal, rq.passport = pr, pr != nil
		return true
	case attest.Unauthorized:
		// RFC 9110 §15.5.2: a 401 MUST carry a challenge, here for a
		// credential the request lacked or that did not authenticate.
		writeError(ctx, fasthttp.StatusUnauthorized, "unauthorized", 0)
		ctx.Response.Header.SetCanonical(hdrWWWAuthenticate, valBearer)
	default:
		writeError(ctx, fasthttp.StatusForbidden, "forbidden", 0)
	}
	return false
}

// forward sends the request to the route's owner and sets up the relay of
// its response. A worker refusing an activation in-band (R-PL-6) gets its
// placement released and the id is placed once more, elsewhere.
func (p *Proxy) forward(ctx *fasthttp.RequestCtx, rq *request, route directory.Route, now time.Time) {
	h := &ctx.Request.Header
	clientClose := h.ConnectionClose()
	h.ResetConnectionClose()
	p.rewriteRequest(ctx, rq, false)
	h.SetNoDefaultContentType(true)
	if ctx.Request.IsBodyStream() {
		if cl := h.ContentLength(); cl >= 0 && cl <= p.smallBody {
			// Small bodies are read whole: one write to the worker, and the
			// request stays replayable for a retry (R-PL-6).
			if !p.bufferBody(ctx, rq, cl) {
				writeError(ctx, fasthttp.StatusBadRequest, "cannot read the request body", 0)
				ctx.SetConnectionClose()
				return
			}
			// The body may have taken longer than the stall timeout to
			// come (each read within it): the write and header deadlines
			// toward the worker and the attestation count from now. From
			// the header's arrival, a new connection's write deadline was
			// already past, and a slow client was answered 504 with its
			// request never sent.
			now = p.now()
		}
	}
	replayable := !ctx.Request.IsBodyStream()
	for refusals, waits := 0, 0; ; {
		st, err := p.state(route.Owner)
		if err != nil {
			writeError(ctx, fasthttp.StatusBadGateway, "owner unreachable", 0)
			break
		}
		p.prepare(ctx, rq, st, route, now)
		out := p.roundTrip(ctx, rq, now, replayable, replayable && waits < len(unattestedWaits))
		if out == unattested {
			var ok bool
			if route, now, ok = p.afterGap(ctx, rq, waits); !ok {
				break
			}
			waits++
			continue
		}
		if !moves(out, route) {
			break
		}
		var ok bool
		if route, now, ok = p.moveOff(ctx, rq, route, out, lastMove(out, refusals, replayable)); !ok {
			break
		}
		refusals++
	}
	if clientClose {
		ctx.SetConnectionClose()
	}
}

// bufferBody reads a small streamed body into rq's scratch buffer. A
// client that stops sending is cut after the stall timeout, as a streamed
// upload is (upload.renew); the server clears the deadline after the
// request (RequestCtx.SetReadDeadline).
func (p *Proxy) bufferBody(ctx *fasthttp.RequestCtx, rq *request, cl int) bool {
	if cap(rq.body) < cl {
		rq.body = make([]byte, cl)
	}
	b := rq.body[:cl]
	r, stall := ctx.RequestBodyStream(), p.ups.opts.StallTimeout
	var due lazyDeadline
	for n := 0; n < cl; {
		if stall > 0 {
			if d, ok := due.due(time.Now(), stall); ok {
				_ = ctx.SetReadDeadline(d)
			}
		}
		m, err := r.Read(b[n:])
		n += m
		if err != nil && (err != io.EOF || n < cl) {
			return false
		}
	}
	ctx.Request.SetBodyRaw(b)
	return true
}
