package proxy

import (
	"bytes"
	"crypto/subtle"
	"errors"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/directory"
)

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
		var se *directory.SupersededError
		switch {
		case errors.As(err, &se):
			// A superseded session (R-LS-4) is as gone as a lapsed one:
			// a 503 would have the calling instance retry a call that can
			// never pass.
			writeError(ctx, fasthttp.StatusForbidden, "unknown caller session", 0)
		case errors.Is(err, directory.ErrUnknownSession):
			// During the cold-start quarantine the session is most
			// likely one the wipe or restart took, whose worker
			// re-registers at its next heartbeat: the call would meet
			// the quarantine's 503 anyway once it passes, so it gets
			// that, and its Retry-After, rather than a 403 that reads
			// as final.
			if rem, qerr := p.store.Quarantine(c, now); qerr == nil && rem > 0 {
				placeFailed(ctx, &directory.QuarantineError{Remaining: rem})
			} else {
				writeError(ctx, fasthttp.StatusForbidden, "unknown caller session", 0)
			}
		default:
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
	if v := p.passport.AdmitCall(rq.ns, info.Sub); !v.OK {
		if v.MissingScope != "" {
			writeError(ctx, fasthttp.StatusForbidden, "calling session's credential lacks scope "+strconv.Quote(v.MissingScope)+" that the namespace's policy asks of clients", 0)
		} else {
			writeError(ctx, fasthttp.StatusForbidden, "namespace not covered by the calling session's credential", 0)
		}
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
