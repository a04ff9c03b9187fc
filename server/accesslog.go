package server

import (
	"bytes"
	"log/slog"
	"math"
	"math/rand/v2"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/proxy"
)

// accessLog samples requests for an access log (PINBOARD_ACCESS_LOG_SAMPLE).
// Pinboard logs no line per request by default: with sampling off the
// public listener's handler is Handle itself, without this wrapper.
type accessLog struct {
	threshold uint64 // a request is logged when a random uint64 < threshold
	all       bool
	log       *slog.Logger
}

func newAccessLog(rate float64, log *slog.Logger) accessLog {
	a := accessLog{log: log}
	switch {
	case rate >= 1:
		a.all = true
	case rate > 0:
		a.threshold = uint64(rate * math.MaxUint64)
	}
	return a
}

func (a accessLog) on() bool { return a.all || a.threshold > 0 }

func (a accessLog) sampled() bool { return a.all || rand.Uint64() < a.threshold }

// handleLogged is Handle plus the sampled access log line: method, path
// (without the query, which may carry secrets), status, time until the
// response header was ready, client address.
func (pb *Pinboard) handleLogged(ctx *fasthttp.RequestCtx) {
	if !pb.access.sampled() {
		pb.Handle(ctx)
		return
	}
	start := time.Now()
	method := string(ctx.Method())
	// Handle does this first too (the second call costs a byte compare):
	// an absolute-form target is logged as the path it routes by.
	_ = proxy.ToOriginForm(&ctx.Request)
	path := loggedPath(ctx.Request.Header.RequestURI())
	pb.Handle(ctx)
	pb.access.line(ctx, method, path, start)
}

// line logs one request's access line.
func (a accessLog) line(ctx *fasthttp.RequestCtx, method, path string, start time.Time) {
	a.log.Info("access",
		"method", method,
		"path", path,
		"status", ctx.Response.StatusCode(),
		"durationMs", float64(time.Since(start).Microseconds())/1000,
		"remote", ctx.RemoteAddr().String(),
	)
}

// refusedEarly logs, when sampled, a request the data plane refused on
// its header alone in place of a 100 Continue (Server.ExpectHandler):
// fasthttp never runs the handler for it, so handleLogged never saw it,
// while the metrics counted it.
func (pb *Pinboard) refusedEarly(ctx *fasthttp.RequestCtx, start time.Time) {
	if pb.access.on() && pb.access.sampled() {
		pb.access.line(ctx, string(ctx.Method()), loggedPath(ctx.Request.Header.RequestURI()), start)
	}
}

// loggedPath is a request target as the access log shows it: without the
// query, and without the scheme and authority of an absolute form that
// ToOriginForm refused (userinfo, no host), which it leaves in place: a
// userinfo ("http://user:password@host/…") is a credential.
func loggedPath(uri []byte) string {
	if i := bytes.IndexByte(uri, '?'); i >= 0 {
		uri = uri[:i]
	}
	if len(uri) > 0 && uri[0] != '/' {
		if i := bytes.Index(uri, []byte("://")); i >= 0 {
			rest := uri[i+len("://"):]
			uri = nil
			if j := bytes.IndexByte(rest, '/'); j >= 0 {
				uri = rest[j:]
			}
		}
	}
	return string(uri)
}
