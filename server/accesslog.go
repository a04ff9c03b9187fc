package server

import (
	"bytes"
	"log/slog"
	"math"
	"math/rand/v2"
	"time"

	"github.com/valyala/fasthttp"
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
	uri := ctx.Request.Header.RequestURI()
	if i := bytes.IndexByte(uri, '?'); i >= 0 {
		uri = uri[:i]
	}
	path := string(uri)
	pb.Handle(ctx)
	pb.access.log.Info("access",
		"method", method,
		"path", path,
		"status", ctx.Response.StatusCode(),
		"durationMs", float64(time.Since(start).Microseconds())/1000,
		"remote", ctx.RemoteAddr().String(),
	)
}
