package proxy

import (
	"bufio"
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/attest"
	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/internal/rawio"
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
	rq.call, rq.caller, rq.depth, rq.callerSession = false, rq.caller[:0], 0, ""
	rq.pick, rq.pickSet = directory.PickInput{}, false
	rq.placeReq = directory.PlaceRequest{}
	rq.routed, rq.noHost, rq.hop = false, false, 0
	rq.rawCookies, rq.cookieEnds = rq.rawCookies[:0], rq.cookieEnds[:0]
	rq.order.reset()
}

// ServeHTTP handles one data-plane request: /{ns}/{id}/{rest...}.
func (p *Proxy) ServeHTTP(ctx *fasthttp.RequestCtx) {
	start := p.now()
	rq := p.reqPool.Get().(*request)
	p.serve(ctx, rq, start)
	var ns []byte
	if rq.routed {
		ns = rq.ns
	}
	p.metrics.Request(ns, ctx.Response.StatusCode(), p.now().Sub(start))
	rq.reset()
	p.reqPool.Put(rq)
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
	if RefuseAmbiguousFraming(ctx) {
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
	if err := ToOriginForm(&ctx.Request); err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, err.Error(), 0)
		return false
	}
	saveCookies(&ctx.Request.Header, rq)
	t, err := ParseTarget(ctx.Request.Header.RequestURI(), p.base)
	if err != nil {
		if err == errNotInstance || err == errOutsideBase {
			writeError(ctx, fasthttp.StatusNotFound, "not found", 0)
			return false
		}
		writeError(ctx, fasthttp.StatusBadRequest, err.Error(), 0)
		return false
	}
	rq.noHost = len(ctx.Request.Header.Host()) == 0
	rq.ns = appendNamespace(rq.ns, t.NS)
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
	route, err := p.place(ctx, rq, now, "")
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
		writeError(ctx, fasthttp.StatusUnauthorized, "unauthorized", 0)
	default:
		writeError(ctx, fasthttp.StatusForbidden, "forbidden", 0)
	}
	return false
}

// clusterCall verifies an instance-to-instance call (R-TR-6): the calling
// worker names its session and proves it with the session secret it
// registered; the caller then rides in the attestation and placement
// prefers the caller's own worker (R-PL-4). Verified calls carry no
// credential: the claims of the account that registered the calling
// session bound them (attest.Passport.AdmitCall), whatever the namespace
// policy says of clients.
func (p *Proxy) clusterCall(ctx *fasthttp.RequestCtx, rq *request, sess []byte, now time.Time) bool {
	h := &ctx.Request.Header
	c := p.opCtx.get()
	info, err := p.store.Session(c, string(sess), now)
	if err != nil {
		// A superseded session (R-LS-4) is as gone as a lapsed one: the
		// stores answer it with their superseded error, and a 503 would
		// have the calling instance retry a call that can never pass.
		var se *directory.SupersededError
		if errors.Is(err, directory.ErrUnknownSession) || errors.As(err, &se) {
			writeError(ctx, fasthttp.StatusForbidden, "unknown caller session", 0)
		} else {
			writeError(ctx, fasthttp.StatusServiceUnavailable, "directory unavailable", 1)
		}
		return false
	}
	if subtle.ConstantTimeCompare(h.PeekBytes(hdrSessionSecret), []byte(info.Secret)) != 1 {
		writeError(ctx, fasthttp.StatusForbidden, "invalid caller session secret", 0)
		return false
	}
	from := h.PeekBytes(hdrFrom)
	slash := bytes.LastIndexByte(from, '/')
	if len(from) < 4 || from[0] != '/' || slash <= 1 || slash == len(from)-1 {
		writeError(ctx, fasthttp.StatusBadRequest, "malformed pinboard-from", 0)
		return false
	}
	// The caller is an instance the calling worker hosts, so its namespace
	// is one the session registered (and its passport key covers):
	// otherwise a worker could have calls attested as coming from any
	// instance of the fleet, which the callee may trust.
	if !servesNamespace(info.Namespaces, from[:slash]) {
		writeError(ctx, fasthttp.StatusForbidden, "caller namespace not served by the calling session", 0)
		return false
	}
	if !p.passport.AdmitCall(rq.ns, info.Sub) {
		writeError(ctx, fasthttp.StatusForbidden, "namespace not covered by the calling session's credential", 0)
		return false
	}
	depth := 1
	if d := h.PeekBytes(hdrDepth); len(d) > 0 {
		n, ok := parseDepth(d)
		if !ok {
			writeError(ctx, fasthttp.StatusBadRequest, "malformed pinboard-subrequest-depth", 0)
			return false
		}
		if n > maxSubrequestDepth {
			writeError(ctx, fasthttp.StatusBadRequest, "subrequest depth exceeded", 0)
			return false
		}
		depth = n
	}
	// The call is attested by its session; a passport credential it
	// carries (an instance calling through a client set up with its
	// deployment's token) is consumed as a client's is, or the callee's
	// worker — another tenant's, on a namespace open to anonymous
	// clients — would receive a key to pinboard (R-TR-4).
	if pr, err := p.passport.Authenticate(h.PeekCanonical(hdrAuthorization)); err == nil && pr != nil {
		rq.passport = true
	}
	rq.call = true
	rq.caller = append(rq.caller, from...)
	rq.depth = depth
	rq.callerSession = info.SessionID
	return true
}

// parseDepth reads a pinboard-subrequest-depth value: a non-negative
// decimal integer, digits only (docs/PROTOCOL.md §2; strconv.Atoi also
// took "+3" and "-0"). Past 9 digits it is no depth a worker sends.
func parseDepth(d []byte) (int, bool) {
	if len(d) == 0 || len(d) > 9 {
		return 0, false
	}
	n := 0
	for _, c := range d {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

func servesNamespace(namespaces []string, ns []byte) bool {
	for _, n := range namespaces {
		if n == string(ns) {
			return true
		}
	}
	return false
}

// place resolves or claims (ns, id) through the store (R-PL-1). The
// affinity inputs are computed once per request, before any rewrite, so a
// retry after a refusal asks the policy the same question (R-PL-4).
func (p *Proxy) place(ctx *fasthttp.RequestCtx, rq *request, now time.Time, exclude string) (directory.Route, error) {
	if !rq.pickSet {
		rq.pickSet = true
		rq.pick.CallerSession = rq.callerSession
		if p.affinity != nil {
			rq.pick.Key, rq.pick.HasKey = p.affinity(ctx)
		} else {
			// Every X-Forwarded-For line: a trusted proxy that appends its
			// own line after a client's would otherwise leave the choice to
			// the client's (R-PL-4).
			rq.tmp = forwardedFor(&ctx.Request.Header, rq.tmp[:0])
			ip := p.trusted.ClientIP(addrOf(ctx.RemoteAddr()), rq.tmp)
			if ip.IsValid() {
				rq.pick.Key, rq.pick.HasKey = ip.String(), true
			}
		}
	}
	var host string
	if !rq.noHost {
		// Not a worker's Host that prepare gave a request without one
		// on an earlier try: that would pick by the worker's name.
		host = hostOnly(ctx.Request.Header.Host())
	}
	c := p.opCtx.get()
	rq.placeReq = directory.PlaceRequest{
		NS: string(rq.ns), ID: string(rq.id), Now: now,
		Policy: p.declines.policy(p.policy, now), Pick: rq.pick, Exclude: exclude,
		Host: host,
	}
	r, err := p.store.Place(c, &rq.placeReq)
	if err == nil && r.Placed {
		// Replaced: the id moved, off a refusing worker (R-PL-6) or off
		// an owner whose lease passed (R-LS-2).
		p.metrics.Placement(exclude != "" || r.Replaced)
	}
	return r, err
}

// hostOnly strips the port from a Host header value ("[::1]:80" -> "::1")
// and the trailing dot of a fully qualified name ("app.example." ->
// "app.example"): the same host to DNS, and a client that sends it must
// not miss the hostname's binding (R-LS-4; nginx drops the dot too).
func hostOnly(h []byte) string {
	host := string(h)
	if i := strings.LastIndexByte(host, ':'); i >= 0 && !strings.HasSuffix(host, "]") {
		host = host[:i]
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if len(host) > 1 && host[len(host)-1] == '.' {
		host = host[:len(host)-1]
	}
	return host
}

// placeFailed maps placement errors to the documented answers (R-DP-4).
func placeFailed(ctx *fasthttp.RequestCtx, err error) {
	var q *directory.QuarantineError
	switch {
	case errors.As(err, &q):
		writeError(ctx, fasthttp.StatusServiceUnavailable, q.Error(), RetryAfterSeconds(q.Remaining))
	case errors.Is(err, directory.ErrUnknownNamespace):
		writeError(ctx, fasthttp.StatusNotFound, "unknown namespace", 0)
	case errors.Is(err, directory.ErrNoEligible):
		writeError(ctx, fasthttp.StatusServiceUnavailable, "no worker can take new placements for this namespace", 1)
	default:
		writeError(ctx, fasthttp.StatusServiceUnavailable, "directory unavailable", 1)
	}
}

// RetryAfterSeconds is a Retry-After value for a wait of d: whole
// seconds rounded up, at least 1 (a client retrying sooner would meet
// the same refusal).
func RetryAfterSeconds(d time.Duration) int {
	s := int((d + time.Second - 1) / time.Second)
	if s < 1 {
		s = 1
	}
	return s
}

type outcome uint8

const (
	served     outcome = iota // the worker's response is set on ctx
	refused                   // the worker refused a new activation in-band
	failed                    // an error response is set on ctx
	unattested                // the worker did not accept the attestation yet
	declined                  // the worker cannot take a new activation (draining, full); its answer is on ctx
	released                  // the worker let the placement go (its fence); its answer is on ctx
)

// The reference worker's 503s (detail with Retry-After: 1, pinned
// hosting/_records.py _retry_503) that say the placement itself is no good
// there, raised before any route runs (hosting/directory.py
// LocalDirectory.get): a new activation refused while the host drains
// (PinnedHost wind_down_all, which pinboard never hears of: only the
// worker's own drain reaches the heartbeat) or at its max_instances (which
// headroom does not reflect, so zero headroom keeps it eligible, R-PL-3);
// and the fence refusing an epoch the worker has released
// (hosting/_fencing.py FenceTable.admit) before its release reaches
// pinboard. Relayed, they came back on every retry of the client: the row
// stayed on that worker. See docs/PROTOCOL.md, "Answers that move a
// placement".
var (
	bodyHostDraining  = []byte(`{"detail":"host draining; retry"}`)
	bodyAtCapacity    = []byte(`{"detail":"instance capacity reached; retry"}`)
	bodyReleasedEpoch = []byte(`{"detail":"released placement epoch; retry"}`)
)

// mayMovePlacement reports whether a worker's answer with this status and
// Content-Length may be one of the 503s above (read its body to know).
func mayMovePlacement(status, cl int) bool {
	return status == fasthttp.StatusServiceUnavailable &&
		(cl == len(bodyHostDraining) || cl == len(bodyAtCapacity) || cl == len(bodyReleasedEpoch))
}

// movesPlacement classifies a worker's 503 body: declined, released, or
// served for any other answer.
func movesPlacement(body []byte) outcome {
	switch {
	case bytes.Equal(body, bodyHostDraining), bytes.Equal(body, bodyAtCapacity):
		return declined
	case bytes.Equal(body, bodyReleasedEpoch):
		return released
	}
	return served
}

// bodyUnattested is what the reference worker answers, with 403, to an
// attestation whose audience is not its session (pinned
// hosting/host.py _verify_attestation). Its route never ran.
var bodyUnattested = []byte(`{"detail":"invalid attestation"}`)

// unattestedWaits are the pauses before a request the worker answered
// with bodyUnattested is resolved and sent again. A worker learns its
// session id from the register ack, so between pinboard writing the ack
// and the worker storing it — and for a whole re-registration, when the
// worker drops its session first — attestations for that session are
// refused. New workers have the most headroom and win new ids at once,
// so without a retry a deploy shows clients sporadic 403s. 75 ms in all
// covers a re-registration's round trip and probe on a busy node; a
// worker that keeps refusing (a wrong secret) still gets its 403 through.
var unattestedWaits = [...]time.Duration{5 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond}

// afterGap pauses for step waits of unattestedWaits, the worker not
// having taken its session yet, and resolves the id again: a
// re-registration moves it to the new session. A failed resolution is
// answered here (false).
func (p *Proxy) afterGap(ctx *fasthttp.RequestCtx, rq *request, waits int) (directory.Route, time.Time, bool) {
	time.Sleep(unattestedWaits[waits])
	route, now, err := p.resolve(ctx, rq, p.now())
	if err != nil {
		placeFailed(ctx, err)
		return route, now, false
	}
	return route, now, true
}

// forward sends the request to the route's owner and sets up the relay of
// its response. A worker refusing an activation in-band (R-PL-6) gets its
// placement released and the id is placed once more, elsewhere.
func (p *Proxy) forward(ctx *fasthttp.RequestCtx, rq *request, route directory.Route, now time.Time) {
	h := &ctx.Request.Header
	clientClose := h.ConnectionClose()
	h.ResetConnectionClose()
	fw := p.readForwarded(ctx, rq) // before a deletion moves lines
	if stripRequestHop(h, rq, rq.hop, false)&hopNamed != 0 {
		fw.count(h) // it may have taken forwarding headers
	}
	if rq.passport {
		h.DelBytes(hdrAuthorization)
		rq.order.edited = true
	}
	p.setForwarded(ctx, rq, fw)
	keepFieldOrder(h, rq)
	restoreCookies(h, rq)
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
		out := p.roundTrip(ctx, st, now, replayable, replayable && waits < len(unattestedWaits))
		if out == unattested {
			var ok bool
			if route, now, ok = p.afterGap(ctx, rq, waits); !ok {
				break
			}
			waits++
			continue
		}
		if out != refused && out != declined && out != released {
			break
		}
		var ok bool
		if route, now, ok = p.moveOff(ctx, rq, route, now, out, refusals > 0 || !replayable); !ok {
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

// moveOff handles a worker's answer that the placement is no good there:
// an in-band refusal (R-PL-6), a decline or a released epoch (see
// bodyHostDraining). It releases the placement at its epoch — a refusal
// or a decline turned a new activation away, and the fence's epoch is
// one the worker let go, so no instance lives on under it — and, unless
// last is set (a second refusal, or a request that cannot be sent again),
// places the id once more: off that session, or anywhere after a release
// (a fresh epoch passes the fence). When it goes no further (false) the
// answer is on ctx: pinboard's own 503 for a refusal, whose marker must
// not reach the client, and for a placement that failed after it; the
// worker's own answer otherwise, whose Retry-After finds the id free.
// Going on, it returns the time to go on from, as resolve does.
func (p *Proxy) moveOff(ctx *fasthttp.RequestCtx, rq *request, route directory.Route, now time.Time, out outcome, last bool) (directory.Route, time.Time, bool) {
	p.release(rq, route, now)
	if out == refused || out == declined {
		p.declines.note(route.Owner.SessionID, now)
	}
	if last {
		if out == refused {
			writeError(ctx, fasthttp.StatusServiceUnavailable, "worker refused the activation (lease unhealthy); retry", 1)
		}
		return route, now, false
	}
	exclude := route.Owner.SessionID
	if out == released {
		exclude = ""
	}
	next, err := p.place(ctx, rq, now, exclude)
	if err != nil {
		if out == refused {
			placeFailed(ctx, err)
		}
		return route, now, false
	}
	resetForRetry(&ctx.Response)
	return next, p.now(), true
}

func (p *Proxy) release(rq *request, route directory.Route, now time.Time) {
	c := p.opCtx.get()
	_, err := p.store.Release(c, &directory.ReleaseRequest{
		SessionID: route.Owner.SessionID, NS: string(rq.ns), ID: string(rq.id), Epoch: route.Epoch,
	}, now)
	if err != nil {
		p.log.Warn("cannot release a refused placement", "ns", string(rq.ns), "id", string(rq.id), "sessionId", route.Owner.SessionID, "err", err)
	}
}

// forwardedFor appends every X-Forwarded-For line of h to dst, in order,
// joined by ", " as one list.
func forwardedFor(h *fasthttp.RequestHeader, dst []byte) []byte {
	for k, v := range h.All() {
		if len(k) == len(hdrXFF) && asciiEqualFold(k, "X-Forwarded-For") && len(v) > 0 {
			if len(dst) > 0 {
				dst = append(dst, ", "...)
			}
			dst = append(dst, v...)
		}
	}
	return dst
}

// forwarded is what setForwarded reads of the client's forwarding
// headers (readForwarded): the lines of each, and a trusted peer's last
// Proto and Host values (copies in rq.tmp).
type forwarded struct {
	peer                                netip.Addr
	trusted                             bool
	nFor, nProto, nHost, nOther, nAlias int
	proto, host                         []byte
}

// count counts the forwarding headers of h and returns the last Proto and
// Host values, which alias h.
func (fw *forwarded) count(h *fasthttp.RequestHeader) (proto, host []byte) {
	fw.nFor, fw.nProto, fw.nHost, fw.nOther, fw.nAlias = 0, 0, 0, 0, 0
	for k, v := range h.All() {
		if forwardedAlias(k) {
			fw.nAlias++
			continue
		}
		switch len(k) {
		case len(hdrXFF):
			if asciiEqualFold(k, "X-Forwarded-For") {
				fw.nFor++
			}
		case len(hdrXFProto):
			if asciiEqualFold(k, "X-Forwarded-Proto") {
				fw.nProto, proto = fw.nProto+1, v
			}
		case len(hdrXFHost):
			if asciiEqualFold(k, "X-Forwarded-Host") {
				fw.nHost, host = fw.nHost+1, v
			}
		case len("Forwarded"): // and len("X-Real-IP")
			if asciiEqualFold(k, "Forwarded") || asciiEqualFold(k, "X-Real-IP") {
				fw.nOther++
			}
		}
	}
	return proto, host
}

// readForwarded counts the client's forwarding headers and, from a
// trusted peer, keeps what setForwarded passes on: its X-Forwarded-For
// lines joined in order (rq.xff) and its last Proto and Host lines
// (copied to rq.tmp). It runs before pinboard deletes anything from the
// header: a deletion moves the header's last line into the gap
// (keepFieldOrder), and read after one, the list came out of order and
// an earlier Proto or Host line passed for the last one
// (TestTrustedForwardedReadInClientOrder_RDP1_RPL4). A deletion removes
// every line of a name, so the kept values stay right for each name the
// header still has; counted again (count) after stripRequestHop deleted
// Connection-named headers, the only deletion before setForwarded that
// can take a forwarding header, they say which.
func (p *Proxy) readForwarded(ctx *fasthttp.RequestCtx, rq *request) forwarded {
	h := &ctx.Request.Header
	fw := forwarded{peer: addrOf(ctx.RemoteAddr())}
	fw.trusted = p.trusted.Trusted(fw.peer)
	proto, host := fw.count(h)
	rq.xff = rq.xff[:0]
	if fw.trusted {
		rq.xff = forwardedFor(h, rq.xff)
		rq.tmp = append(append(rq.tmp[:0], proto...), host...)
		fw.proto, fw.host = rq.tmp[:len(proto)], rq.tmp[len(proto):]
	}
	return fw
}

// setForwarded sets X-Forwarded-For/-Proto/-Host from what readForwarded
// read. A peer that is not a trusted proxy cannot smuggle in its own
// values: every copy it sent is replaced — a second X-Forwarded-For or
// -Proto line would otherwise reach the worker beside pinboard's, and
// uvicorn's proxy-headers middleware joins the For lines and takes the
// last Proto — and its Forwarded and X-Real-IP go too. A trusted proxy's
// For lines are joined in order (forwardedFor) before the peer is
// appended, and its last Proto and Host line are kept. Nothing is
// deleted unless there is a copy to remove.
func (p *Proxy) setForwarded(ctx *fasthttp.RequestCtx, rq *request, fw forwarded) {
	h := &ctx.Request.Header
	trusted, proto, host := fw.trusted, fw.proto, fw.host
	if !trusted || fw.nFor == 0 {
		rq.xff = rq.xff[:0]
	} else if len(rq.xff) > 0 {
		rq.xff = append(rq.xff, ", "...)
	}
	if fw.peer.IsValid() {
		rq.xff = fw.peer.AppendTo(rq.xff)
	}
	if !trusted || fw.nProto == 0 {
		proto = valHTTP
		if ctx.IsTLS() {
			proto = valHTTPS
		}
	}
	if !trusted || fw.nHost == 0 {
		host = h.Host()
	}
	setOnly(h, hdrXFF, rq.xff, fw.nFor)
	setOnly(h, hdrXFProto, proto, fw.nProto)
	setOnly(h, hdrXFHost, host, fw.nHost)
	if fw.nFor > 0 || fw.nProto > 0 || fw.nHost > 0 {
		rq.order.edited = true // setOnly may have deleted copies
	}
	if !trusted && fw.nOther > 0 {
		h.Del("Forwarded")
		h.Del("X-Real-IP")
		rq.order.edited = true
	}
	if fw.nAlias > 0 {
		delForwardedAliases(h)
		rq.order.edited = true
	}
}

// delForwardedAliases removes the underscored aliases of the forwarding
// headers (underscoreAlias) from every request, a trusted proxy's too: no
// proxy spells them so (nginx drops underscored names by default). Rare:
// the names are copied.
func delForwardedAliases(h *fasthttp.RequestHeader) {
	var names []string
	for k := range h.All() {
		if forwardedAlias(k) {
			names = append(names, string(k))
		}
	}
	for _, n := range names {
		h.Del(n)
	}
}

// forwardedAlias reports whether k is an underscored alias of a
// forwarding header pinboard sets or removes.
func forwardedAlias(k []byte) bool {
	for _, n := range [...]string{"X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host", "X-Real-IP"} {
		if underscoreAlias(k, n) {
			return true
		}
	}
	return false
}

// setOnly leaves key with the single value v (none when v is empty), the
// header holding n copies of it now; v must not alias one of them.
func setOnly(h *fasthttp.RequestHeader, key, v []byte, n int) {
	if n > 1 || (n == 1 && len(v) == 0) {
		h.DelBytes(key)
	}
	if len(v) > 0 {
		h.SetCanonical(key, v)
	}
}

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
	h.SetCanonical(hdrAttestation, st.att.token(now, route.Owner, rq))
	rq.num = strconv.AppendUint(rq.num[:0], route.Epoch, 10)
	h.SetCanonical(hdrEpoch, rq.num)
}

// roundTrip writes the request to a pooled connection and reads the
// response header; the body is relayed by the server afterwards.
func (p *Proxy) roundTrip(ctx *fasthttp.RequestCtx, st *ownerState, now time.Time, replayable, retryUnattested bool) outcome {
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
		}
		reused := pc.reused
		pc.waitStart = time.Time{} // set again by awaitHeader when it checks on the client
		if !replayable {
			pc.clearDeadline() // the upload arms it once the body is out
		}
		wall := p.wallClock(now)
		up, err := writeRequest(ctx, pool, pc, wall)
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
			return p.relay(ctx, pool, pc, nil, retryUnattested)
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
			// never replayed (Go's transport has the same rule).
			if reused && replayable && idempotent && !retry && staleConn(err) {
				retry = true
				continue
			}
			ctx.Response.Reset()
			p.answerUpstreamError(ctx, err, wrote)
			return failed
		}
		return p.relay(ctx, pool, pc, up, retryUnattested)
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
		err := readResponseHeader(&ctx.Response.Header, pc.br)
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
		err := readResponseHeader(&ctx.Response.Header, pc.br)
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
func readResponseHeader(rh *fasthttp.ResponseHeader, br *bufio.Reader) error {
	for i := 0; ; i++ {
		if err := readFramedHeader(rh, br); err != nil {
			return err
		}
		s := rh.StatusCode()
		if s == fasthttp.StatusSwitchingProtocols {
			return errUnaskedSwitch
		}
		if s >= 200 {
			return nil
		}
		if i == 8 {
			return errTooManyInterim
		}
	}
}

// refusedInBand reports whether a worker's answer is its in-band refusal
// of a new activation (R-PL-6): 503 with the Pinned-Refusal marker, for a
// request or a WebSocket handshake alike.
func refusedInBand(rh *fasthttp.ResponseHeader) bool {
	return rh.StatusCode() == fasthttp.StatusServiceUnavailable && bytes.Equal(rh.PeekBytes(hdrRefusal), valLeaseRefusal)
}

var (
	errTooManyInterim = errors.New("too many interim responses from worker")
	errUnaskedSwitch  = errors.New("worker switched protocols on a request that asked for no upgrade")
)

// relay sets up the response body: read whole when small and sized (still
// under the header deadline), streamed otherwise (no deadline: streams
// may idle for hours). It owns pc from here.
func (p *Proxy) relay(ctx *fasthttp.RequestCtx, pool *connPool, pc *pconn, up *upload, retryUnattested bool) outcome {
	rh := &ctx.Response.Header
	status := rh.StatusCode()
	cl := rh.ContentLength()
	keep := !rh.ConnectionClose()
	rh.ResetConnectionClose()
	ownVersion(rh)
	stripResponseHop(rh)
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
		b := acquireBody(pool, pc, p.streams, mode, size, keep, sse, up, ctx.Conn())
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
// connection; on a read error it answers 502 itself and reports false.
func (p *Proxy) readSmallBody(ctx *fasthttp.RequestCtx, pool *connPool, pc *pconn, keep bool, up *upload) bool {
	if err := readSized(&ctx.Response, pc, ctx.Conn(), p.smallBody); err != nil {
		p.finish(pool, pc, false, up)
		if errors.Is(err, errClientGone) {
			clientClosed(ctx)
			return false
		}
		ctx.Response.Reset()
		p.metrics.UpstreamError("read")
		writeError(ctx, fasthttp.StatusBadGateway, "owner unreachable", 0)
		return false
	}
	p.finish(pool, pc, keep, up)
	return true
}

// finish lets go of a connection after a response read in the handler. A
// worker that answered while the upload still runs is mid-request: its
// connection closes, which also ends the upload.
func (p *Proxy) finish(pool *connPool, pc *pconn, keep bool, up *upload) {
	if up != nil && !up.finished() {
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

// answerUpstreamError answers an exchange with a worker that failed, by
// where (R-DP-4): 504 "owner timed out" (kind "timeout") when the worker
// did not answer or take the request in time; 502 "owner unreachable"
// (kind "write") when its connection did not take the request (wrote
// false: nothing was read, so neither "read" nor "invalid" says what
// failed); 502 "invalid answer from owner" (kind "invalid") when its bytes
// were refused for what they said — framing, status line, header size
// (framing.go) — so an operator looks at the worker's HTTP server, not at
// whether it runs; 502 "owner unreachable" (kind "read") when the
// connection failed under the answer.
func (p *Proxy) answerUpstreamError(ctx *fasthttp.RequestCtx, err error, wrote bool) {
	switch {
	case isTimeout(err):
		p.metrics.UpstreamError("timeout")
		writeError(ctx, fasthttp.StatusGatewayTimeout, "owner timed out", 0)
	case !wrote:
		p.metrics.UpstreamError("write")
		writeError(ctx, fasthttp.StatusBadGateway, "owner unreachable", 0)
	case invalidAnswer(err):
		p.metrics.UpstreamError("invalid")
		writeError(ctx, fasthttp.StatusBadGateway, "invalid answer from owner", 0)
	default:
		p.metrics.UpstreamError("read")
		writeError(ctx, fasthttp.StatusBadGateway, "owner unreachable", 0)
	}
}

// invalidAnswer reports whether err refused the bytes a worker sent rather
// than reporting the connection failing: not a timeout, an end of input, a
// system call's error or a network error.
func invalidAnswer(err error) bool {
	var errno syscall.Errno
	var ne net.Error
	return !isTimeout(err) && !staleConn(err) && !errors.As(err, &errno) && !errors.As(err, &ne)
}

// isTimeout: a deadline passed. fasthttp's ErrTimeout (a header read cut
// by the deadline before any byte) has Timeout() but is no net.Error.
func isTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, fasthttp.ErrTimeout) || (errors.As(err, &te) && te.Timeout())
}

// resetForRetry clears a worker's answer before the request is tried
// again. Response.Reset alone also turns the server's NoDefaultContentType
// off for the rest of the response, and the answer relayed after the
// retry went out with a "text/plain; charset=utf-8" Content-Type the
// worker never sent (R-DP-1). pinboard adds none, as on requests
// (forward). A Date it may add: RFC 9110 §6.6.1 asks that of a proxy.
func resetForRetry(r *fasthttp.Response) {
	r.Reset()
	r.Header.SetNoDefaultContentType(true)
}

// writeError sets a JSON error response {"error": msg} (R-DP-4); a
// positive retryAfter adds Retry-After in seconds.
func writeError(ctx *fasthttp.RequestCtx, status int, msg string, retryAfter int) {
	WriteError(ctx, status, msg, retryAfter)
}

// WriteError is writeError for the server around the proxy: its own
// answers (requests fasthttp cannot read) take the same JSON shape.
func WriteError(ctx *fasthttp.RequestCtx, status int, msg string, retryAfter int) {
	ctx.Response.Reset()
	ctx.SetStatusCode(status)
	ctx.Response.Header.SetContentType("application/json")
	if retryAfter > 0 {
		ctx.Response.Header.Set("Retry-After", strconv.Itoa(retryAfter))
	}
	ctx.Response.SetBodyRaw(errorJSON(msg))
}

// errorJSON returns {"error":"msg"}.
func errorJSON(msg string) []byte {
	b, _ := json.Marshal(struct {
		Error string `json:"error"`
	}{msg})
	return b
}
