package server

import (
	"bytes"
	"context"
	"errors"
	"net"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/pprofhandler"

	"github.com/pinboard-go/pinboard/metrics"
	"github.com/pinboard-go/pinboard/proxy"
)

var (
	pathMetrics = []byte("/metrics")
	pathPprof   = []byte("/debug/pprof/")
)

var _ proxy.Metrics = (*metrics.Metrics)(nil)

// ServeAdmin serves the admin endpoints on ln until Shutdown finishes:
//
//	GET /metrics  Prometheus text exposition (404 without Options.Metrics)
//	GET /livez    liveness, as on the public listener
//	GET /readyz   readiness, as on the public listener
//	GET /debug/pprof/…  Go profiles, only with Options.Pprof
//
// The admin listener is unauthenticated: bind it to a private address
// (PINBOARD_METRICS_ADDR). It keeps answering during a graceful shutdown,
// so orchestrators see readiness fail and scrapers see the drain, and
// closes last. It returns nil once closed by Shutdown.
func (pb *Pinboard) ServeAdmin(ln net.Listener) error {
	pb.adminMu.Lock()
	if pb.adminClosed {
		pb.adminMu.Unlock()
		_ = ln.Close()
		return nil
	}
	srv := &fasthttp.Server{
		Handler:               pb.HandleAdmin,
		NoDefaultServerHeader: true,
		ReadTimeout:           10 * time.Second,
		WriteTimeout:          30 * time.Second,
		IdleTimeout:           60 * time.Second,
		ReadBufferSize:        8 << 10,
		// As on the public listener: no request header quoted in a log.
		SecureErrorLogMessage: true,
		Logger:                fasthttpLogger{pb.log},
	}
	pb.admin, pb.adminLn = srv, ln
	pb.adminMu.Unlock()
	err := srv.Serve(newPatientListener(ln, pb.log))
	pb.adminMu.Lock()
	closed := pb.adminClosed
	pb.adminMu.Unlock()
	if closed {
		return nil
	}
	return err
}

// closeAdmin stops the admin listener (the last step of Shutdown).
func (pb *Pinboard) closeAdmin() {
	pb.adminMu.Lock()
	pb.adminClosed = true
	srv, ln := pb.admin, pb.adminLn
	pb.adminMu.Unlock()
	if srv == nil {
		return
	}
	// Closing ln first covers a Serve that has not registered it yet.
	_ = ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := srv.ShutdownWithContext(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		pb.log.Debug("admin listener shutdown", "err", err)
	}
}

// HandleAdmin is the admin listener's handler (see ServeAdmin).
func (pb *Pinboard) HandleAdmin(ctx *fasthttp.RequestCtx) {
	if !getOrHead(ctx) {
		return
	}
	path := ctx.Path()
	switch {
	case bytes.Equal(path, pathMetrics) && pb.metrics != nil:
		ctx.SetContentType(metrics.ContentType)
		ctx.SetBody(pb.metrics.AppendPrometheus(context.Background(), nil))
	case bytes.Equal(path, pathLivez):
		pb.livez(ctx)
	case bytes.Equal(path, pathReadyz):
		pb.readyz(ctx)
	case pb.opts.Pprof && bytes.HasPrefix(path, pathPprof):
		pprofhandler.PprofHandler(ctx)
	default:
		ctx.SetStatusCode(fasthttp.StatusNotFound)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":"not found"}`)
	}
}
