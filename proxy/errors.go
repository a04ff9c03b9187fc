package proxy

import (
	"encoding/json"
	"errors"
	"net"
	"os"
	"strconv"
	"syscall"

	"github.com/valyala/fasthttp"
)

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
	case errors.Is(err, errOwnerEnded):
		p.metrics.UpstreamError("ended")
		writeError(ctx, fasthttp.StatusBadGateway, "owner session ended", 0)
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
