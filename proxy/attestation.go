package proxy

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/attest"
	"github.com/pinboard-go/pinboard/directory"
)

// attestationCache keeps the current attestation for one owner session,
// per account. A token carries only the audience (the session), the issue
// second and optionally the account, so within one second every request to
// the same session by the same account carries the same bytes: minting once
// per second per session keeps HMAC off the hot path (R-TR-5).
//
// Cluster calls name their caller and depth and are minted per request.
type attestationCache struct {
	anon atomic.Pointer[cachedToken]
	acct sync.Map // *attest.Principal -> *atomic.Pointer[cachedToken]
}

type cachedToken struct {
	iat int64
	b   []byte
}

// token returns the attestation for rq to owner; the bytes stay valid for
// the request (cached tokens are immutable, per-request ones live in rq).
func (c *attestationCache) token(now time.Time, owner *directory.Owner, rq *request) []byte {
	sec := now.Unix()
	in := attest.AttestationInput{
		Secret:   owner.Secret,
		Aud:      owner.SessionID,
		IssuedAt: sec,
		Depth:    -1,
	}
	if rq.call {
		in.Caller = string(rq.caller)
		in.Depth = rq.depth
		rq.att = attest.AppendAttestation(rq.att[:0], &in)
		return rq.att
	}
	slot := &c.anon
	if pr := rq.principal; pr != nil {
		in.Acct = pr.AcctJSON
		v, ok := c.acct.Load(pr)
		if !ok {
			v, _ = c.acct.LoadOrStore(pr, new(atomic.Pointer[cachedToken]))
		}
		slot = v.(*atomic.Pointer[cachedToken])
	}
	if t := slot.Load(); t != nil && t.iat == sec {
		return t.b
	}
	t := &cachedToken{iat: sec, b: attest.AppendAttestation(nil, &in)}
	slot.Store(t)
	return t.b
}

// attest sets the request's attestation for its owner (rq.st, rq.owner),
// issued at now (R-TR-5).
func (p *Proxy) attest(ctx *fasthttp.RequestCtx, rq *request, now time.Time) {
	rq.attSec = now.Unix()
	ctx.Request.Header.SetCanonical(hdrAttestation, rq.st.att.token(now, rq.owner, rq))
}

// reattest mints the attestation again, at now, when the second changed
// since prepare minted it: a request that waited for a worker connection
// (up to ConnWait, then a dial of up to DialTimeout) goes out with an
// attestation from when it goes out. The worker accepts one up to 30 s
// past its exp (iat + 30 s) and no later, so a streamed upload that had
// waited longer was answered 403 "invalid attestation", and a body read
// as it streams cannot be sent again.
func (p *Proxy) reattest(ctx *fasthttp.RequestCtx, rq *request, now time.Time) {
	if now.Unix() != rq.attSec {
		p.attest(ctx, rq, now)
	}
}
