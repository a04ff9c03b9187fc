// Package server assembles pinboard: one fasthttp listener serving the
// registry API, the operator API and the data plane (R-SRV-1). It is the Go
// counterpart of the Node package's createPinboard/servePinboard
// (R-SRV-4): cmd/pinboard reads the environment and calls it, programs
// embed it with an Options struct.
package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/attest"
	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/internal/rawio"
	"github.com/pinboard-go/pinboard/metrics"
	"github.com/pinboard-go/pinboard/proxy"
	"github.com/pinboard-go/pinboard/registry"
)

// DefaultLeaseTTL is PINBOARD_LEASE_TTL_MS's default (R-SRV-3).
const DefaultLeaseTTL = 15 * time.Second

// Options configure a Pinboard. Store and Passport are required.
type Options struct {
	// Store is the directory (memory: or Redis).
	Store directory.Store
	// Passport authenticates workers, operators and clients (R-TR).
	Passport *attest.Passport
	// BasePath mounts pinboard under a prefix ("/pb"); "" for the root.
	BasePath string
	// LeaseTTL is the worker lease (R-LS-1); default 15s.
	LeaseTTL time.Duration
	// BalanceFactor bounds affinity (R-PL-4), a finite number >= 1;
	// anything else (the zero value too) uses
	// directory.DefaultBalanceFactor.
	BalanceFactor float64
	// AffinityKey is the programmatic affinity.key: nil uses the client IP;
	// a function returning ok=false means null (power of two choices).
	AffinityKey func(ctx *fasthttp.RequestCtx) (key string, ok bool)
	// TrustedProxies decide whose X-Forwarded-For is believed.
	TrustedProxies *proxy.TrustedProxies
	// Upstream tunes worker connection pools.
	Upstream proxy.UpstreamOptions
	// ProbeTimeout bounds one challenge probe; default 2s.
	ProbeTimeout time.Duration
	// RegistryWorkers and RegistryQueue size the control plane's pool;
	// RegistryMinWorkers is the governor's floor (registry.Options).
	RegistryWorkers, RegistryMinWorkers, RegistryQueue int
	// ReadTimeout bounds reading one request body from a client; 0 leaves
	// it to Upstream.StallTimeout (a body must keep moving). IdleTimeout bounds a keep-alive connection
	// waiting for its next request; default 75s. HeaderTimeout bounds
	// reading a request header; default 30s (slowloris).
	ReadTimeout, IdleTimeout, HeaderTimeout time.Duration
	// MaxHeaderBytes caps a request header (431 beyond); default 16 KiB.
	MaxHeaderBytes int
	// Logger; nil discards.
	Logger *slog.Logger
	// Now is the clock; nil uses time.Now.
	Now func() time.Time
	// Metrics, when set, records the node's metrics and serves them on the
	// admin listener (ServeAdmin); it is also the default for ProxyMetrics
	// and RegistryObserver. Nil records nothing and costs nothing.
	Metrics *metrics.Metrics
	// ProxyMetrics and RegistryObserver receive metrics; nil uses Metrics,
	// or records none.
	ProxyMetrics     proxy.Metrics
	RegistryObserver registry.Observer
	// AccessLogSample is the fraction of requests (0..1) logged at info
	// level with method, path, status and duration; 0, the default, logs
	// none and adds no work per request.
	AccessLogSample float64
	// Pprof serves Go's profiles under /debug/pprof/ on the admin listener
	// (PINBOARD_PPROF=1). Off by default: profiles reveal internals.
	Pprof bool
}

// Pinboard is one pinboard node.
type Pinboard struct {
	opts     Options
	store    directory.Store
	proxy    *proxy.Proxy
	registry *registry.Registry
	base     []byte
	log      *slog.Logger
	now      func() time.Time
	srv      *fasthttp.Server
	metrics  *metrics.Metrics
	access   accessLog
	stopping atomic.Bool
	// linger closes client connections with unread input lingering
	// (rawio.Linger): a client still sending a body pinboard or the
	// worker answered without reading gets the answer, not a reset.
	linger *rawio.Linger
	// stall is the proxy's stall timeout: the write deadline Handle keeps
	// on client connections (0: none).
	stall time.Duration
	// resumed are the connections event relays handed back (resume) while
	// they wait for the client's next request; shutdown closes them.
	resumedMu sync.Mutex
	resumed   map[net.Conn]struct{}

	adminMu     sync.Mutex
	admin       *fasthttp.Server
	adminLn     net.Listener
	adminClosed bool
}

// New builds a Pinboard from o.
func New(o Options) (*Pinboard, error) {
	if o.Store == nil {
		return nil, errors.New("cannot build pinboard: Options.Store is required")
	}
	if o.Passport == nil {
		return nil, errors.New("cannot build pinboard: Options.Passport is required")
	}
	if o.LeaseTTL <= 0 {
		o.LeaseTTL = DefaultLeaseTTL
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 75 * time.Second
	}
	if o.HeaderTimeout <= 0 {
		o.HeaderTimeout = 30 * time.Second
	}
	if o.MaxHeaderBytes <= 0 {
		o.MaxHeaderBytes = 16 << 10
	}
	if o.Metrics != nil {
		if o.ProxyMetrics == nil {
			o.ProxyMetrics = o.Metrics
		}
		if o.RegistryObserver == nil {
			o.RegistryObserver = o.Metrics
		}
	}
	if o.AccessLogSample < 0 || o.AccessLogSample > 1 {
		return nil, fmt.Errorf("cannot build pinboard: access log sample %v must be within 0..1", o.AccessLogSample)
	}
	base := trimSlash(o.BasePath)
	if base != "" && base[0] != '/' {
		return nil, fmt.Errorf("cannot build pinboard: base path %q must start with /", o.BasePath)
	}
	pb := &Pinboard{
		linger:  rawio.NewLinger(lingerMax, lingerWait, lingerTotal),
		opts:    o,
		store:   o.Store,
		base:    []byte(base),
		log:     o.Logger,
		now:     o.Now,
		metrics: o.Metrics,
		access:  newAccessLog(o.AccessLogSample, o.Logger),
		resumed: make(map[net.Conn]struct{}),
	}
	pb.proxy = proxy.New(proxy.Options{
		Store:          o.Store,
		Passport:       o.Passport,
		Now:            o.Now,
		BasePath:       base,
		Policy:         &directory.HeadroomPolicy{BalanceFactor: o.BalanceFactor},
		AffinityKey:    o.AffinityKey,
		TrustedProxies: o.TrustedProxies,
		Upstream:       o.Upstream,
		Logger:         o.Logger,
		Metrics:        o.ProxyMetrics,
		// An event stream that ended cleanly hands its connection back
		// for the client's next request; during shutdown it is closed.
		Resume: pb.resume,
	})
	pb.stall = pb.proxy.StallTimeout()
	reg, err := registry.New(registry.Options{
		Store:        o.Store,
		Passport:     o.Passport,
		LeaseTTL:     o.LeaseTTL,
		Now:          o.Now,
		ProbeTimeout: o.ProbeTimeout,
		Workers:      o.RegistryWorkers,
		MinWorkers:   o.RegistryMinWorkers,
		Queue:        o.RegistryQueue,
		BasePath:     base,
		Logger:       o.Logger,
		Observer:     o.RegistryObserver,
		BodyStall:    bodyStall(o.ReadTimeout, pb.stall),
	})
	if err != nil {
		return nil, err
	}
	pb.registry = reg
	bodyRead := bodyTimeout(o.ReadTimeout, pb.stall)
	handler := pb.Handle
	if pb.access.on() {
		// Sampling wraps the handler only when asked for: off, requests
		// take the plain handler and pay nothing for it.
		handler = pb.handleLogged
	}
	pb.srv = &fasthttp.Server{
		Handler: handler,
		// A proxy adds nothing of its own to what workers answer.
		NoDefaultServerHeader: true,
		NoDefaultDate:         true,
		NoDefaultContentType:  true,
		// Bodies stream through (R-DP-2); the registry enforces its own
		// 1 MiB limit, and multipart is never pre-parsed.
		StreamRequestBody:            true,
		DisablePreParseMultipartForm: true,
		MaxRequestBodySize:           1 << 62,
		ReadBufferSize:               o.MaxHeaderBytes,
		WriteBufferSize:              16 << 10,
		ReadTimeout:                  o.HeaderTimeout,
		// Responses are written under the stall timeout, kept per
		// connection by Handle (not fasthttp's WriteTimeout, a timer
		// operation per response); fasthttp writes a 100 Continue before
		// the handler runs, so it gets the same here.
		//
		// A data-plane request the proxy refuses on its header alone is
		// answered in place of the 100 (proxy.Expect), and fasthttp then
		// closes the connection without reading the body.
		ExpectHandler: func(ctx *fasthttp.RequestCtx) int {
			rawio.KeepWriteDeadline(ctx.Conn(), time.Now(), pb.stall)
			if dest, _ := pb.destination(ctx); dest == toProxy && !pb.proxy.Expect(ctx) {
				return ctx.Response.StatusCode()
			}
			return fasthttp.StatusContinue
		},
		// fasthttp answers a request it cannot read (431, 400, 408)
		// itself, without Handle: the deadline the previous response left
		// on a keep-alive connection may have passed since, and the
		// answer would be dropped for a bare close.
		ErrorHandler: func(ctx *fasthttp.RequestCtx, err error) {
			if nothingRead(ctx, err) {
				// Nothing to answer: closed without a byte (what
				// fasthttp writes after this goes nowhere).
				_ = ctx.Conn().Close()
				return
			}
			rawio.KeepWriteDeadline(ctx.Conn(), time.Now(), pb.stall)
			serverError(ctx, err)
		},
		IdleTimeout: o.IdleTimeout,
		HeaderReceived: func(*fasthttp.RequestHeader) fasthttp.RequestConfig {
			// The header arrived in time; the body gets ReadTimeout, or by
			// default the stall timeout (see bodyTimeout).
			return fasthttp.RequestConfig{ReadTimeout: bodyRead}
		},
		// WebSocket relays close their own connections and are tracked by
		// the proxy for shutdown.
		KeepHijackedConns: true,
		CloseOnShutdown:   true,
		Logger:            fasthttpLogger{o.Logger},
	}
	if o.Metrics != nil {
		o.Metrics.Attach(metrics.Sources{
			Store:           o.Store,
			OpenStreams:     pb.proxy.OpenStreams,
			OpenWebSockets:  pb.proxy.OpenWebSockets,
			OpenConnections: func() int64 { return int64(max(pb.srv.GetOpenConnectionsCount(), 0)) },
			RegistryQueue:   reg.QueueDepth,
			RegistryRunning: reg.Running,
			RegistryCap:     reg.Capacity,
		})
	}
	return pb, nil
}

// serverError answers a request fasthttp cannot read (431, 408, 400 as
// fasthttp's default does) with a JSON error like every other error of the
// proxy (R-DP-4): a malformed or ambiguous framing — duplicate
// Content-Length, a coding other than chunked, space before the colon —
// is refused here, before any handler (docs/PROTOCOL.md §5). fasthttp
// closes the connection after it.
func serverError(ctx *fasthttp.RequestCtx, err error) {
	var small *fasthttp.ErrSmallBuffer
	var op *net.OpError
	switch {
	case errors.As(err, &small):
		proxy.WriteError(ctx, fasthttp.StatusRequestHeaderFieldsTooLarge, "request header too large", 0)
	case errors.As(err, &op) && op.Timeout():
		proxy.WriteError(ctx, fasthttp.StatusRequestTimeout, "request timeout", 0)
	default:
		proxy.WriteError(ctx, fasthttp.StatusBadRequest, "malformed request", 0)
	}
}

// nothingRead reports whether err ended a new connection on which the
// client sent nothing: its header timeout passed (or the read failed)
// before a first byte. fasthttp hands such a first request's read error
// over bare, where a header it began reading comes wrapped ("error when
// reading request headers") and a body's read error follows a parsed
// header. Such a connection is closed without an answer, as nginx and
// Go's net/http close it: an unsolicited 408 on a connection a client or
// a load balancer opened ahead of its first request is read by the
// client as the answer to the request it sends just then (R-DP-4).
func nothingRead(ctx *fasthttp.RequestCtx, err error) bool {
	_, bare := err.(*net.OpError)
	return bare && len(ctx.Request.Header.RawHeaders()) == 0
}

// bodyTimeout is the client read deadline from the end of a request
// header on: ReadTimeout when set. Otherwise the stall timeout: fasthttp
// reads the first 8 KiB of a body before the handler runs and drains an
// unread one after it, and the proxy reads a small body whole, none of it
// renewing the deadline — a client silent after its header would hold a
// goroutine and a descriptor as long as this allows. A streamed upload is
// not cut by it: the proxy renews the deadline while the body moves. With
// the stall timeout off too, a deadline far enough away stands for none
// (fasthttp keeps the header deadline unless the config sets another one).
func bodyTimeout(read, stall time.Duration) time.Duration {
	switch {
	case read > 0:
		return read
	case stall > 0:
		return stall
	}
	return 365 * 24 * time.Hour
}

// bodyStall is the registry's BodyStall: with ReadTimeout set, a body gets
// that much in all (the server's deadline, set at its header); otherwise
// it must keep moving, each read within the stall timeout, as an upload
// to a worker must — a deadline never renewed cut a 1 MiB body sent over
// a slow link, and answered it 400 "invalid json".
func bodyStall(read, stall time.Duration) time.Duration {
	if read > 0 {
		return 0
	}
	return stall
}

func trimSlash(s string) string {
	for len(s) > 0 && s[len(s)-1] == '/' {
		s = s[:len(s)-1]
	}
	return s
}

var (
	registryPrefix = []byte(registry.ReservedNamespace + "/")
	pathLivez      = []byte("/livez")
	pathReadyz     = []byte("/readyz")
)

// Handle is the node's fasthttp handler: /registry/* to the registry,
// /livez and /readyz for orchestrators, everything else to the data plane.
// A namespace called "registry" is therefore reserved.
func (pb *Pinboard) Handle(ctx *fasthttp.RequestCtx) {
	pb.route(ctx)
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
		if len(path) <= len(pb.base) || path[len(pb.base)] != '/' || !bytes.HasPrefix(path, pb.base) {
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
		if !proxy.RefuseAmbiguousFraming(ctx) {
			pb.registry.ServeHTTP(ctx, path)
		}
	case toLivez:
		if !proxy.RefuseAmbiguousFraming(ctx) && getOrHead(ctx) {
			pb.livez(ctx)
		}
	case toReadyz:
		if !proxy.RefuseAmbiguousFraming(ctx) && getOrHead(ctx) {
			pb.readyz(ctx)
		}
	default:
		pb.proxy.ServeHTTP(ctx)
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
	if pb.stopping.Load() {
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

// Proxy returns the data plane (for metrics and tests).
func (pb *Pinboard) Proxy() *proxy.Proxy { return pb.proxy }

// Registry returns the control plane (for metrics and tests).
func (pb *Pinboard) Registry() *registry.Registry { return pb.registry }

// Serve serves ln until ctx ends, then shuts down gracefully (see
// Shutdown). Background loops (directory sweeps, pool sweeps) run while it
// serves, and have ended when it returns: a sweep still running on the
// store then would meet a caller that closes the store once Serve
// returned (cmd/pinboard does).
func (pb *Pinboard) Serve(ctx context.Context, ln net.Listener, grace time.Duration) error {
	bg, stopBG := context.WithCancel(context.Background())
	var loops sync.WaitGroup
	loops.Go(func() { pb.proxy.Run(bg) })
	loops.Go(func() { pb.sweep(bg) })
	defer func() {
		stopBG()
		loops.Wait()
	}()

	// Raw read(2)/write(2) on client connections: loopback-fast writes
	// otherwise park the goroutine's P in syscall state and cost context
	// switches per request (internal/rawio, BENCHMARKS.md). Closed with
	// unread input, they linger (pb.linger).
	cln := &onceCloseListener{Listener: patientListener{rawio.ListenerLinger(ln, pb.linger), pb.log}}
	errc := make(chan error, 1)
	go func() { errc <- pb.srv.Serve(cln) }()
	select {
	case err := <-errc:
		pb.closeAdmin()
		return fmt.Errorf("cannot serve: %w", err)
	case <-ctx.Done():
	}
	return pb.shutdown(grace, errc, cln)
}

// resume serves the client's further requests on a connection an event
// stream was relayed on (proxy.Options.Resume), or closes it once the
// node is stopping. The connection first waits for the next request here,
// under the idle timeout as any keep-alive connection: to fasthttp's
// ServeConn it is a new connection, whose first byte gets the header
// timeout — and, when that passes, an unsolicited 408 the client read as
// the answer to the request it sent after a pause.
func (pb *Pinboard) resume(c net.Conn) error {
	if !pb.awaitRequest(c) {
		return c.Close()
	}
	return pb.srv.ServeConn(c)
}

// awaitRequest waits up to the idle timeout for the client's next request
// on c, a connection handed back by an event relay. It reports false when
// the client closed c or sent nothing in time, and when the node is
// stopping (shutdown closes c meanwhile, closeResumed).
func (pb *Pinboard) awaitRequest(c net.Conn) bool {
	if _, ok := c.(*rawio.Conn); !ok {
		// Serve's listener gives only *rawio.Conn; no raw wait otherwise.
		return !pb.stopping.Load()
	}
	pb.resumedMu.Lock()
	if pb.stopping.Load() {
		pb.resumedMu.Unlock()
		return false
	}
	pb.resumed[c] = struct{}{}
	pb.resumedMu.Unlock()
	defer func() {
		pb.resumedMu.Lock()
		delete(pb.resumed, c)
		pb.resumedMu.Unlock()
	}()
	if c.SetReadDeadline(time.Now().Add(pb.opts.IdleTimeout)) != nil {
		return false
	}
	for {
		// AwaitEdge may return with nothing to read (see its contract):
		// look, and wait again.
		if rawio.AwaitEdge(c) != nil || rawio.PeerClosed(c) {
			return false
		}
		if rawio.Readable(c) {
			return !pb.stopping.Load()
		}
	}
}

// closeResumed closes the connections waiting in awaitRequest: a node
// stopping serves no further request on them.
func (pb *Pinboard) closeResumed() {
	pb.resumedMu.Lock()
	defer pb.resumedMu.Unlock()
	for c := range pb.resumed {
		_ = c.Close()
	}
}

// The lingering close of client connections (rawio.Linger): nginx's
// lingering_timeout and lingering_time are 5 s and 30 s; a client still
// sending gets less here, and at most lingerMax connections linger at
// once (each a descriptor and a goroutine), so that clients cannot pile
// them up.
const (
	lingerMax   = 1024
	lingerWait  = 2 * time.Second
	lingerTotal = 10 * time.Second
)

// onceCloseListener closes its listener once; later calls return nil
// (fasthttp's Shutdown returns its Close error, which would fail a clean
// shutdown). Serve closes the listener itself at shutdown: fasthttp's
// Shutdown closes only the listeners its Serve already registered, and
// does nothing at all before the first one, so a shutdown that started
// right after Serve was called left the listener open and served on.
type onceCloseListener struct {
	net.Listener
	once sync.Once
}

func (l *onceCloseListener) Close() error {
	var err error
	l.once.Do(func() { err = l.Listener.Close() })
	return err
}

// CloseWait bounds the end of a shutdown: the WebSocket closing handshakes
// and the last bytes of ended streams. A shutdown takes at most the grace
// plus CloseWait (and 0.1 s for the relays cut at its end to let go of
// their worker connections, proxy.CloseStreamsContext), which is what an
// orchestrator's kill timeout must exceed with some slack (deploy/,
// checked by cmd/pinboard's deploy tests).
const CloseWait = 2 * time.Second

// Shutdown stops the node in three steps:
//
//  1. Readiness turns 503, the registry answers 503 "not the serving
//     fleet" (Retry-After: workers go to another node), the listener
//     closes, idle keep-alive connections close.
//  2. In-flight requests — including uploads, downloads and WebSocket
//     handshakes — get up to grace to finish. The step ends early once
//     nothing but event streams and WebSockets is left: those never end
//     by themselves.
//  3. Event streams end (cleanly between events), other streams still
//     running are cut, each WebSocket gets a Close frame 1001 "going away"
//     toward the client and the worker; up to 2s more for the closing
//     handshakes, then whatever is left is closed.
//
// Then the registry pool and the admin listener stop; requests still
// running then, registry ones included, end with the process. errc, if
// not nil, is the public listener's Serve result, awaited briefly.
func (pb *Pinboard) Shutdown(grace time.Duration, errc <-chan error) error {
	return pb.shutdown(grace, errc, nil)
}

// shutdown is Shutdown; ln, if not nil, is the public listener, closed
// here as well as by fasthttp's Shutdown (see onceCloseListener).
func (pb *Pinboard) shutdown(grace time.Duration, errc <-chan error, ln io.Closer) error {
	pb.stopping.Store(true)
	// From now on connections close at once: fasthttp closes idle ones to
	// end their wait for a next request, and one lingering instead would
	// read and serve a request that arrived just then, its answer lost.
	pb.linger.Stop()
	pb.closeResumed()
	pb.registry.Stop()
	start := time.Now()
	sctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- pb.srv.ShutdownWithContext(sctx) }()
	if ln != nil {
		_ = ln.Close()
	}

	var err error
	finished := pb.drain(grace, done, &err)
	pb.log.Info("shutdown: closing streams", "afterMs", time.Since(start).Milliseconds(),
		"eventStreams", pb.proxy.OpenEventStreams(), "streams", pb.proxy.OpenStreams(), "webSockets", pb.proxy.OpenWebSockets())
	cctx, ccancel := context.WithTimeout(context.Background(), CloseWait)
	pb.proxy.CloseStreamsContext(cctx)
	if !finished {
		select {
		case err = <-done:
		case <-cctx.Done():
			cancel()
			err = <-done
		}
	}
	ccancel()
	// Canceled: requests were still in flight when the budget ran out;
	// they end with the process.
	cut := errors.Is(err, context.Canceled)
	if cut {
		err = nil
	}
	if errc != nil {
		select {
		case <-errc:
		case <-time.After(5 * time.Second):
		}
	}
	if cut {
		// Registry requests among them (a body still arriving, a store
		// call) are cut as the data plane's are: waiting for them took
		// the shutdown past its budget, then failed it (exit 1).
		if cerr := pb.registry.Close(registryCutWait); cerr != nil {
			pb.log.Warn("shutdown: registry requests still running are cut", "err", cerr)
		}
	} else if cerr := pb.registry.Close(5 * time.Second); cerr != nil && err == nil {
		err = fmt.Errorf("cannot stop the registry pool: %w", cerr)
	}
	pb.closeAdmin()
	return err
}

// registryCutWait is how long the registry pool gets to stop when
// requests outlived the shutdown's budget: its idle workers' exit, not
// the requests still running.
const registryCutWait = 100 * time.Millisecond

// drain is step 2 of Shutdown: it returns when the server finished (true,
// its result in *err) and no download relayed off it is left, when grace
// ran out, or when only event streams are left on open connections. It
// reports whether the server finished.
func (pb *Pinboard) drain(grace time.Duration, done <-chan error, err *error) bool {
	timer := time.NewTimer(grace)
	defer timer.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	finished := false
	for {
		select {
		case *err = <-done:
			finished, done = true, nil
		case <-timer.C:
			return finished
		case <-tick.C:
		}
		// A body relayed off the server to an HTTP/1.0 client is a
		// request in flight on a connection the server no longer counts.
		if pb.proxy.RelayedDownloads() > 0 {
			continue
		}
		// Each event stream the server still writes holds one connection
		// (relayed ones left it); a connection doing anything else is an
		// in-flight request.
		if finished || int64(pb.srv.GetOpenConnectionsCount()) <= pb.proxy.OpenEventStreams()-pb.proxy.RelayedEventStreams() {
			return finished
		}
	}
}

// sweep runs the store's housekeeping a few times per lease.
func (pb *Pinboard) sweep(ctx context.Context) {
	every := pb.opts.LeaseTTL / 8
	if every > time.Second {
		every = time.Second
	}
	if every < 50*time.Millisecond {
		every = 50 * time.Millisecond
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c, cancel := context.WithTimeout(ctx, 5*time.Second)
			if err := pb.store.Sweep(c, pb.now()); err != nil {
				pb.log.Warn("directory sweep failed", "err", err)
			}
			cancel()
		}
	}
}

// fasthttpLogger routes fasthttp's own messages to slog.
type fasthttpLogger struct{ l *slog.Logger }

func (f fasthttpLogger) Printf(format string, args ...any) {
	f.l.Debug(fmt.Sprintf(format, args...), "component", "fasthttp")
}
