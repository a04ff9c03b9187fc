package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/internal/rawio"
	"github.com/pinboard-go/pinboard/proxy"
	"github.com/pinboard-go/pinboard/registry"
)

var (
	registryPrefix = []byte(registry.ReservedNamespace + "/")
	pathLivez      = []byte("/livez")
	pathReadyz     = []byte("/readyz")
)

// Handle is the node's fasthttp handler: /registry/* to the registry,
// /livez and /readyz for orchestrators, everything else to the data plane.
// A namespace called "registry" is therefore reserved.
//
// Handle is meant for the server Serve runs; mounting it under another
// fasthttp.Server (a router sending Options.BasePath to it) is not
// supported. There, event streams and WebSockets are cut unless that
// server sets KeepHijackedConns (their relays write after the handler
// returned); a connection whose event stream ended is served on by
// pinboard's own server, so its next requests never reach the host's
// other routes; the store sweep and the worker pool sweep, which Serve
// runs, do not run; and Shutdown neither drains nor closes that server's
// connections. Give pinboard a listener of its own and route to it
// instead. net/http has no fasthttp bridge in this direction.
func (pb *Pinboard) Handle(ctx *fasthttp.RequestCtx) {
	pb.route(ctx)
	if manyFields(&ctx.Request.Header) {
		// fasthttp keeps a request's parsed fields on the connection's
		// context for the connection's life: a header of thousands of
		// tiny fields (within MaxHeaderBytes) made an idle keep-alive
		// connection hold ten times the ~32 KiB docs/OPERATIONS.md sizes
		// it at. Answered, then closed; no browser or client library
		// sends that many (TestManyHeaderFieldsCloseTheConnection_RSRV1).
		ctx.SetConnectionClose()
	}
	// The answer is written after this, and must reach the client's
	// socket within the stall timeout from now (none when it is off), or
	// a client that never reads holds its connection for ever. From now,
	// not from the request's arrival: a worker may answer after longer
	// than the stall timeout (within the response header timeout), a
	// registry request may wait for its body, the pool and a probe, and
	// such answers were dropped for a bare close. A streamed body renews
	// the deadline as it moves, so an idle event stream is not cut.
	// Renewed about once a second on a busy connection
	// (rawio.KeepWriteDeadline). Serve's listener gives every connection
	// as a *rawio.Conn.
	if c, ok := ctx.Conn().(*rawio.Conn); ok {
		c.KeepWriteDeadline(time.Now(), pb.stall)
	}
}

// maxKeptFields is the most header fields a request may have and keep
// its connection open (manyFields).
const maxKeptFields = 100

// manyFields reports whether h has more than maxKeptFields fields: its
// raw header's line ends, one per field and one for the blank line. Each
// line but the blank one takes two bytes at least, so a header no longer
// than that for maxKeptFields fields is not counted: a short request pays
// a length compare.
func manyFields(h *fasthttp.RequestHeader) bool {
	raw := h.RawHeaders()
	return len(raw) > 2*(maxKeptFields+1) && bytes.Count(raw, newline) > maxKeptFields+1
}

var newline = []byte{'\n'}

// Where route hands a request.
const (
	toProxy = iota
	toRegistry
	toLivez
	toReadyz
)

// destination says where route hands the request, and the path it is
// routed by (inside the base path).
func (pb *Pinboard) destination(ctx *fasthttp.RequestCtx) (int, []byte) {
	// Absolute form (RFC 9112 §3.2.2) routes by its path; a malformed one
	// is left for the data plane to refuse.
	_ = proxy.ToOriginForm(&ctx.Request)
	uri := ctx.Request.Header.RequestURI()
	path := uri
	if i := bytes.IndexByte(uri, '?'); i >= 0 {
		path = uri[:i]
	}
	if len(pb.base) > 0 {
		if len(path) <= len(pb.base) || path[len(pb.base)] != '/' || !proxy.HasBasePath(path, pb.base) {
			// Outside the base path nothing is served (R-SRV-4): the data
			// plane answers it 404 like any unroutable path.
			return toProxy, path
		}
		path = path[len(pb.base):]
	}
	switch {
	case bytes.HasPrefix(path, registryPrefix):
		return toRegistry, path
	case bytes.Equal(path, pathLivez):
		return toLivez, path
	case bytes.Equal(path, pathReadyz):
		return toReadyz, path
	}
	return toProxy, path
}

// route hands the request to the registry, the health probes or the data
// plane.
func (pb *Pinboard) route(ctx *fasthttp.RequestCtx) {
	// The data plane refuses an ambiguous framing itself; the node's own
	// paths must too, or what follows it is read as the next request.
	switch dest, path := pb.destination(ctx); dest {
	case toRegistry:
		if !proxy.RefuseUnreadable(ctx) {
			pb.registry.ServeHTTP(ctx, path)
		}
	case toLivez:
		if !proxy.RefuseUnreadable(ctx) && getOrHead(ctx) {
			pb.livez(ctx)
		}
		closeIfChunkedBody(ctx)
	case toReadyz:
		if !proxy.RefuseUnreadable(ctx) && getOrHead(ctx) {
			pb.readyz(ctx)
		}
		closeIfChunkedBody(ctx)
	default:
		pb.proxy.ServeHTTP(ctx)
	}
}

// closeIfChunkedBody makes the answer to a request with a chunked body,
// which the health probes never read, say Connection: close: fasthttp
// discards at most 256 KiB of an unread body after the answer and then
// closes the connection, and for a chunked body cannot tell so before the
// answer is written (RFC 9112 section 9.6;
// TestAnswerLeavingChunkedBodyUnreadSaysClose_RDP4_RREG7).
func closeIfChunkedBody(ctx *fasthttp.RequestCtx) {
	if ctx.Request.IsBodyStream() && ctx.Request.Header.ContentLength() == -1 {
		ctx.SetConnectionClose()
	}
}

// getOrHead reports whether the request is a GET or HEAD; otherwise it
// answers 405 with Allow. The probes and the admin listener take only
// those (docs/OPERATIONS.md, "Health endpoints").
func getOrHead(ctx *fasthttp.RequestCtx) bool {
	if ctx.IsGet() || ctx.IsHead() {
		return true
	}
	ctx.Response.Header.Set(fasthttp.HeaderAllow, "GET, HEAD")
	ctx.SetStatusCode(fasthttp.StatusMethodNotAllowed)
	ctx.SetContentType("application/json")
	ctx.SetBodyString(`{"error":"method not allowed"}`)
	return false
}

// livez answers 200 while the process serves: liveness for orchestrators
// (restart the process when it fails).
func (pb *Pinboard) livez(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("application/json")
	ctx.SetBodyString(`{"ok":true}`)
}

// readyz answers 200 when the store answers and the cold-start quarantine
// is over; 503 otherwise, and from the moment a graceful shutdown begins.
// Orchestrators route traffic by it.
//
// ?exclude=store and ?exclude=quarantine (repeatable, as kube-apiserver's
// /readyz?exclude=…) leave a check out. Both are shared by every node on
// one store: behind a load balancer that is the only way to reach the
// fleet, failing them takes every node out at once — clients lose the
// cached routes that keep working through a Redis outage, and workers
// cannot re-register during the quarantine that waits for them. The
// shutdown check is the node's own and is never left out.
func (pb *Pinboard) readyz(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("application/json")
	var noStore, noQuarantine bool
	for _, v := range ctx.QueryArgs().PeekMulti("exclude") {
		switch string(v) {
		case "store":
			noStore = true
		case "quarantine":
			noQuarantine = true
		default:
			ctx.SetStatusCode(fasthttp.StatusBadRequest)
			b, _ := json.Marshal(map[string]any{"ok": false, "error": fmt.Sprintf("unknown readiness check %q: exclude store or quarantine", v)})
			ctx.SetBody(b)
			return
		}
	}
	if pb.unready.Load() || pb.stopping.Load() {
		notReady(ctx, time.Second)
		ctx.SetBodyString(`{"ok":false,"shuttingDown":true}`)
		return
	}
	if noStore && noQuarantine {
		ctx.SetBodyString(`{"ok":true}`)
		return
	}
	c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	q, err := pb.store.Quarantine(c, pb.now())
	switch {
	case err != nil && noStore:
		ctx.SetBodyString(`{"ok":true,"error":"directory unavailable"}`)
	case err != nil:
		notReady(ctx, time.Second)
		ctx.SetBodyString(`{"ok":false,"error":"directory unavailable"}`)
	case q > 0 && !noQuarantine:
		notReady(ctx, q)
		ctx.SetBodyString(fmt.Sprintf(`{"ok":false,"quarantineMs":%d}`, q.Milliseconds()))
	default:
		ctx.SetBodyString(fmt.Sprintf(`{"ok":true,"quarantineMs":%d}`, q.Milliseconds()))
	}
}

// notReady answers readiness's 503 with Retry-After, as every 503 of
// pinboard's carries one (docs/PROTOCOL.md, conventions): the rest of the
// quarantine rounded up, 1 s otherwise.
func notReady(ctx *fasthttp.RequestCtx, after time.Duration) {
	ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
	ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, strconv.Itoa(proxy.RetryAfterSeconds(after)))
}
