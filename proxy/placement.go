package proxy

import (
	"bytes"
	"errors"
	"strings"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/directory"
)

// place resolves or claims (ns, id) through the store (R-PL-1). The
// affinity inputs are computed once per request, before any rewrite, so a
// retry after a refusal asks the policy the same question (R-PL-4).
//
// exclude, when not zero, is the placement just moved off (moveOff): its
// session gets no new placement, and its row at that epoch is placed anew
// — a live row at another epoch is a placement another request made since
// and is resolved to (directory.PlaceRequest.ExcludeEpoch).
func (p *Proxy) place(ctx *fasthttp.RequestCtx, rq *request, now time.Time, exclude directory.Route) (directory.Route, error) {
	if !rq.pickSet {
		rq.pickSet = true
		rq.pick.CallerSession = rq.callerSession
		if p.affinity != nil {
			// Only a non-empty key is a rendezvous preference (the
			// guide's affinity.key); "" is null, as ok=false is.
			rq.pick.Key, rq.pick.HasKey = p.affinity(ctx)
			rq.pick.HasKey = rq.pick.HasKey && rq.pick.Key != ""
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
	ns := string(rq.ns)
	rq.placeReq = directory.PlaceRequest{
		NS: ns, ID: string(rq.id), Now: now,
		Policy: p.declines.policy(p.policy, ns, now), Pick: rq.pick,
		Host: host,
	}
	if exclude.Owner != nil {
		rq.placeReq.Exclude, rq.placeReq.ExcludeEpoch = exclude.Owner.SessionID, exclude.Epoch
	}
	r, err := p.store.Place(c, &rq.placeReq)
	if err == nil && r.Placed {
		// Replaced: the id moved, off a refusing worker (R-PL-6) or off
		// an owner whose lease passed (R-LS-2).
		p.metrics.Placement(exclude.Owner != nil || r.Replaced)
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
	served      outcome = iota // the worker's response is set on ctx
	refused                    // the worker refused a new activation in-band
	failed                     // an error response is set on ctx
	unattested                 // the worker did not accept the attestation yet
	declined                   // the worker cannot take a new activation (draining, full); its answer is on ctx
	released                   // the worker let the placement go (its fence); its answer is on ctx
	unreachable                // the owner's address refused the connection; 502 is on ctx
)

// dialOutcome is a failed dial's outcome: unreachable when the advertise
// address refused the connection — nothing listens there, so no pooled
// connection reaches the worker either — else failed (502 on ctx). A
// timeout, a TLS handshake that failed, a local error (EMFILE) say nothing
// of the worker: it may be alive and serving the id to requests on
// connections already open, and moving the id would run it twice (R-PL-1).
func dialOutcome(err error) outcome {
	if errors.Is(err, syscall.ECONNREFUSED) {
		return unreachable
	}
	return failed
}

// The reference worker's 503s (detail with Retry-After: 1, pinned
// hosting/_records.py _retry_503) that say the placement itself is no good
// there, raised before any route runs (hosting/directory.py
// LocalDirectory.get): a new activation refused while the host drains
// (LocalDirectory.wind_down_all, which pinboard never hears of: only the
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

// moveOff handles a worker's answer that the placement is no good there:
// an in-band refusal (R-PL-6), a decline or a released epoch (see
// bodyHostDraining), or a new placement's worker whose address refused
// the connection (unreachable, see moves). It releases the placement at its
// epoch — a refusal or a decline turned a new activation away, the fence's
// epoch is one the worker let go, and a worker not dialed got nothing, so
// no instance lives on under it — and, unless last is set (a second
// move, or a request that cannot be sent again: lastMove), places the id once
// more: off that session, or anywhere after a release (a fresh epoch
// passes the fence); the new placement leaves a live row another request
// made since alone (place's exclude). When it goes no further (false) the
// answer is on ctx: pinboard's own 503 for a refusal, whose marker must
// not reach the client, and for a placement that failed after it;
// pinboard's 502 "owner unreachable" for a worker not dialed; the
// worker's own answer otherwise, whose Retry-After finds the id free.
// Going on, it returns the time to go on from, as resolve does.
func (p *Proxy) moveOff(ctx *fasthttp.RequestCtx, rq *request, route directory.Route, out outcome, last bool) (directory.Route, time.Time, bool) {
	// From the answer on, not from when the id was resolved: a lease that
	// lapsed during the round trip must not win the id (R-LS-2).
	now := p.now()
	p.release(rq, route, now)
	switch out {
	case refused, unreachable:
		// The lease (R-PL-6), or an advertise URL that refuses
		// connections until the lease lapses (R-LS-2): every host of the
		// worker is no good.
		p.declines.note(route.Owner.SessionID, "", now)
	case declined:
		// One host full or winding down: its namespace only.
		p.declines.note(route.Owner.SessionID, string(rq.ns), now)
	}
	if last {
		if out == refused {
			writeError(ctx, fasthttp.StatusServiceUnavailable, "worker refused the activation (lease unhealthy); retry", 1)
		}
		return route, now, false
	}
	exclude := route
	if out == released {
		exclude = directory.Route{}
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

// moves reports whether a try's outcome moves the placement (moveOff): a
// refusal, a decline or a released epoch; and a worker whose address
// refused the connection (unreachable) when this request placed the id
// there, rather than answering 502 until the dead
// worker's lease lapses (R-LS-2, up to a lease). Nothing listens there, so
// nothing reached that worker — no activation, a streamed body unread, and
// no other request on a connection already open — and the placement is
// released and made afresh elsewhere without a second owner ever running
// the id (R-PL-1). Any other failed dial answers 502 and moves nothing
// (dialOutcome). An id
// placed before keeps its owner: a worker restarting at its address
// serves it again, and the lease decides
// (TestKilledWorkerReplacedAfterLease_RLS2_RDP4). A request moves once
// (lastMove): a new placement that a move made on a second dead worker is
// released and not made again, and the client's retry finds the id free.
// Before, it stayed there, and every retry of the id was answered 502
// until that worker's lease lapsed
// (TestNewPlacementOnSecondDeadWorkerReleased_RDP3_RLS2_RPL1).
func moves(out outcome, route directory.Route) bool {
	switch out {
	case refused, declined, released:
		return true
	case unreachable:
		return route.Placed
	}
	return false
}

// lastMove reports whether moveOff, after a try's outcome that moves the
// placement, only releases it (its last): the request already moved once
// (refusals), or, unless its worker was never dialed (unreachable: the
// body is still unread), it cannot be sent again (replayable false).
func lastMove(out outcome, refusals int, replayable bool) bool {
	return refusals > 0 || (out != unreachable && !replayable)
}
