package fleet

import (
	"bytes"
	"crypto/subtle"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/attest"
)

// Wire names from the reference worker (pinned.pinboard.wire).
const (
	hdrAttestation = "Pinboard-Attestation"
	hdrProxySecret = "Pinboard-Proxy-Secret"
)

var (
	prefixW       = []byte("/w/")
	pathChallenge = []byte("/_pinned/challenge")
	argChallenge  = []byte("challenge")

	bodyInvalidAttestation = []byte(`{"detail":"invalid attestation"}`)
	bodyInvalidSecret      = []byte(`{"detail":"invalid proxy secret"}`)
	bodyUnknownChallenge   = []byte(`{"detail":"unknown challenge"}`)
	bodyNotFound           = []byte(`{"detail":"Not Found"}`)
)

// Handle is the fleet's request handler: /w/{i}/… to worker i.
func (f *Fleet) Handle(ctx *fasthttp.RequestCtx) {
	uri := ctx.Request.Header.RequestURI()
	path := uri
	if i := bytes.IndexByte(uri, '?'); i >= 0 {
		path = uri[:i]
	}
	if !bytes.HasPrefix(path, prefixW) {
		reply(ctx, fasthttp.StatusNotFound, bodyNotFound)
		return
	}
	rest := path[len(prefixW):]
	n, k := 0, 0
	for k < len(rest) && rest[k] >= '0' && rest[k] <= '9' && k < 9 {
		n = n*10 + int(rest[k]-'0')
		k++
	}
	w := f.Worker(n)
	if k == 0 || w == nil || w.left.Load() {
		reply(ctx, fasthttp.StatusNotFound, bodyNotFound)
		return
	}
	w.serve(ctx, rest[k:])
}

func reply(ctx *fasthttp.RequestCtx, status int, body []byte) {
	ctx.SetStatusCode(status)
	ctx.Response.Header.SetContentType("application/json")
	ctx.Response.SetBodyRaw(body)
}

// serve handles rest, the path after the worker's prefix.
func (w *Worker) serve(ctx *fasthttp.RequestCtx, rest []byte) {
	now := w.fleet.o.Now()
	token := ctx.Request.Header.Peek(hdrAttestation)
	if bytes.Equal(rest, pathChallenge) {
		w.serveChallenge(ctx, token, now)
		return
	}
	// The reference's host dependency: only attested traffic reaches an
	// instance route (R-TR-5).
	if !w.verify(token, now) {
		reply(ctx, fasthttp.StatusForbidden, bodyInvalidAttestation)
		return
	}
	ns, id, action, ok := splitInstance(rest)
	if !ok {
		reply(ctx, fasthttp.StatusNotFound, bodyNotFound)
		return
	}
	switch string(action) {
	case "json":
		ctx.SetStatusCode(fasthttp.StatusOK)
		ctx.Response.Header.SetContentType("application/json")
		b := ctx.Response.Body()[:0]
		b = append(b, `{"ns":"`...)
		b = append(b, ns...)
		b = append(b, `","id":"`...)
		b = append(b, id...)
		b = append(b, `","worker":`...)
		b = strconv.AppendInt(b, int64(w.Index), 10)
		b = append(b, '}')
		ctx.Response.SetBodyRaw(b)
	case "sse":
		w.fleet.serveSSE(ctx)
	case "ws":
		w.fleet.serveWebSocket(ctx)
	case "upload":
		w.fleet.serveUpload(ctx)
	case "download":
		w.fleet.serveDownload(ctx)
	default:
		reply(ctx, fasthttp.StatusNotFound, bodyNotFound)
	}
}

// splitInstance splits "/{ns}/{id}/{action}".
func splitInstance(p []byte) (ns, id, action []byte, ok bool) {
	if len(p) < 2 || p[0] != '/' {
		return nil, nil, nil, false
	}
	i := bytes.IndexByte(p[1:], '/') + 1
	if i <= 1 {
		return nil, nil, nil, false
	}
	j := bytes.IndexByte(p[i+1:], '/') + i + 1
	if j <= i+1 {
		return nil, nil, nil, false
	}
	return p[:i], p[i+1 : j], p[j+1:], true
}

// serveChallenge answers the registration probe like the reference's
// _verify_probe and challenge route: the proxy secret (or a valid
// attestation) is required, then the challenge must be the current one.
func (w *Worker) serveChallenge(ctx *fasthttp.RequestCtx, token []byte, now time.Time) {
	if !ctx.IsGet() {
		reply(ctx, fasthttp.StatusMethodNotAllowed, []byte(`{"detail":"Method Not Allowed"}`))
		return
	}
	provided := ctx.Request.Header.Peek(hdrProxySecret)
	if subtle.ConstantTimeCompare(provided, w.secret) != 1 && !w.verify(token, now) {
		reply(ctx, fasthttp.StatusForbidden, bodyInvalidSecret)
		return
	}
	st := w.st.Load()
	if subtle.ConstantTimeCompare(ctx.QueryArgs().PeekBytes(argChallenge), []byte(st.challenge)) != 1 {
		reply(ctx, fasthttp.StatusNotFound, bodyUnknownChallenge)
		return
	}
	b := append(ctx.Response.Body()[:0], `{"value":"`...)
	b = append(b, st.value...)
	b = append(b, `"}`...)
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.Response.Header.SetContentType("application/json")
	ctx.Response.SetBodyRaw(b)
}

// verifiedToken is an attestation VerifyAttestation accepted.
type verifiedToken struct {
	token  string
	claims *attest.AttestationClaims
}

// verify reports whether token is a valid attestation for the worker's
// current session at now, with exactly attest.VerifyAttestation's (the
// reference's) verdict. The last accepted token is cached: its verdict
// depends only on the token, the secret, the audience and now, and now
// enters only through the iat/exp window, which is checked again here on
// every use. Pinboard mints one token per session and second, so the
// cache turns the per-request HMAC and JSON parse into a comparison.
func (w *Worker) verify(token []byte, now time.Time) bool {
	session := w.st.Load().session
	if len(token) == 0 || session == "" {
		return false
	}
	if v := w.verified.Load(); v != nil && v.claims.Aud == session && string(token) == v.token {
		return v.claims.Within(now)
	}
	claims, err := attest.VerifyAttestation(string(token), w.secret, []string{session}, now)
	if err != nil {
		return false
	}
	w.verified.Store(&verifiedToken{token: string(token), claims: claims})
	return true
}
