// Package server assembles pinboard: one fasthttp listener serving the
// registry API, the operator API and the data plane (R-SRV-1). It is the Go
// counterpart of the Node package's createPinboard/servePinboard
// (R-SRV-4): cmd/pinboard reads the environment and calls it, programs
// embed it with an Options struct.
package server

import (
	"errors"
	"fmt"
	"github.com/pinboard-go/pinboard/internal/ascii"
	"log/slog"
	"net"
	"strings"
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

// Options configure a Pinboard. Store and Passport are required; every
// other field may be left zero for the default it names.
type Options struct {
	// Store is the directory (directory.NewMemory, directory.OpenRedis).
	// The caller owns it: pinboard never closes it. Close it after the
	// node has stopped — after Shutdown returned, or Serve when its
	// context ended (Serve returns before a Shutdown called on its own
	// has finished, and requests still draining then use the store).
	Store directory.Store
	// Passport authenticates workers, operators and clients (R-TR).
	Passport *attest.Passport
	// BasePath mounts pinboard under a prefix ("/pb"); "" for the root.
	BasePath string
	// LeaseTTL is the worker lease (R-LS-1). The store grants it
	// (directory.NewMemory's, RedisOptions.LeaseTTL): left zero, it is
	// the store's; set, it must equal the store's, or New refuses. A
	// Store of another kind, with no LeaseTTL method, is not checked: zero
	// is DefaultLeaseTTL there.
	LeaseTTL time.Duration
	// BalanceFactor bounds affinity (R-PL-4), a finite number >= 1;
	// anything else (the zero value too) uses
	// directory.DefaultBalanceFactor.
	BalanceFactor float64
	// AffinityKey is the programmatic affinity.key (R-PL-4, the Node
	// package's affinity: { key }). It is called only when a data-plane
	// request may need a new placement — the node knows no live owner of
	// its id (with Redis, another node may have placed it: the key then
	// goes unused) — once per request (a retry after a refusal reuses the
	// answer); never for an id the node resolves, nor for registry or
	// health paths. A non-empty key with ok=true is a rendezvous
	// preference: every request with that key prefers the same worker
	// while its headroom is at least 1/BalanceFactor of the best one's.
	// ok=false or an empty key is null: power of two choices. Nil uses the
	// client IP as the key (the peer, or X-Forwarded-For from
	// TrustedProxies).
	//
	// It is called concurrently from many connections' goroutines, so it
	// must be safe for concurrent use, and it runs on the request path:
	// keep it quick and non-blocking. ctx is valid only during the call;
	// read the request's header, path or peer from it, but do not keep it,
	// consume or read its body (it is streamed to the worker), or write a
	// response.
	AffinityKey func(ctx *fasthttp.RequestCtx) (key string, ok bool)
	// TrustedProxies decide whose X-Forwarded-For is believed (for the
	// client IP of AffinityKey's default); nil trusts nobody.
	TrustedProxies *proxy.TrustedProxies
	// Upstream tunes worker connection pools.
	Upstream proxy.UpstreamOptions
	// ProbeTimeout bounds one challenge probe; default 2s.
	ProbeTimeout time.Duration
	// RegistryWorkers and RegistryQueue size the control plane's pool
	// (defaults 64 and 4096); RegistryMinWorkers is the governor's floor
	// (default 4×GOMAXPROCS). See registry.Options.
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
	// ProxyMetrics receives the data plane's metrics; nil uses Metrics,
	// or records none.
	ProxyMetrics proxy.Metrics
	// RegistryObserver receives the registry's heartbeat, probe and queue
	// events; nil uses Metrics, or records none.
	RegistryObserver registry.Observer
	// AccessLogSample is the fraction of requests (0..1) logged at info
	// level with method, path, status and duration; 0, the default, logs
	// none and adds no work per request.
	AccessLogSample float64
	// Pprof serves Go's profiles under /debug/pprof/ on the admin listener
	// (PINBOARD_PPROF=1). Off by default: profiles reveal internals.
	Pprof bool
	// ShutdownDelay is how long Serve keeps serving after its context
	// ends, readiness already 503, before the shutdown stops taking work
	// (PINBOARD_SHUTDOWN_DELAY_MS; 0, the default, none). A load balancer
	// that routes by /readyz, with no preStop hook to wait for it, keeps
	// sending new connections for an interval or two after the signal:
	// closing the listener at once refused those and reset the ones
	// already in its accept queue.
	ShutdownDelay time.Duration
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
	// shutStarted is set by the first shutdown, and shutDone closed when
	// it has finished: later ones wait for it (shutdown).
	shutStarted atomic.Bool
	shutDone    chan struct{}
	// unready turns readiness 503 during Options.ShutdownDelay, while
	// everything else still serves (stopping is set after it).
	unready atomic.Bool
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
	// conns are the client connections the server serves (trackConn),
	// each with its servings not yet reported ended, for a shutdown past
	// its budget to close (closeConns).
	connsMu sync.Mutex
	conns   map[net.Conn]int

	adminMu     sync.Mutex
	admin       *fasthttp.Server
	adminLn     net.Listener
	adminClosed bool
}

// New builds a Pinboard from o. Its errors name the Options field or
// value refused.
//
// New starts the control plane's worker pool: a Pinboard built is stopped
// by Serve's shutdown or by Shutdown, which also releases one that was
// never served (Shutdown(0, nil)); one merely dropped keeps those
// goroutines for the life of the process.
func New(o Options) (*Pinboard, error) {
	if o.Store == nil {
		return nil, errors.New("cannot build pinboard: Options.Store is required")
	}
	if o.Passport == nil {
		return nil, errors.New("cannot build pinboard: Options.Passport is required")
	}
	// The store grants the leases; LeaseTTL is what health reports and
	// what paces the sweep. Apart, a registration got the store's lease
	// while /registry/health said another (R-LS-1, R-SRV-4).
	if s, ok := o.Store.(interface{ LeaseTTL() time.Duration }); ok {
		switch ttl := s.LeaseTTL(); {
		case o.LeaseTTL <= 0:
			o.LeaseTTL = ttl
		case o.LeaseTTL != ttl:
			return nil, fmt.Errorf("cannot build pinboard: Options.LeaseTTL %v differs from the store's lease TTL %v, which grants the leases: set it on the store (directory.NewMemory, RedisOptions.LeaseTTL) and leave it out here", o.LeaseTTL, ttl)
		}
	}
	if o.LeaseTTL <= 0 {
		o.LeaseTTL = DefaultLeaseTTL
	}
	// The proxy is given no clock unless one was set: its own default is
	// the real clock, whose readings it may use for socket deadlines too
	// (proxy.Options.Now). Given time.Now, it could not tell, and read the
	// clock once more per request for each deadline.
	proxyNow := o.Now
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
	if err := CheckBasePath(o.BasePath); err != nil {
		return nil, fmt.Errorf("cannot build pinboard: %w", err)
	}
	base := trimSlash(o.BasePath)
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
		conns:   make(map[net.Conn]int),

		shutDone: make(chan struct{}),
	}
	pb.proxy = proxy.New(proxy.Options{
		Store:          o.Store,
		Passport:       o.Passport,
		Now:            proxyNow,
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
		// Prefixed as New's other errors: a program's log says which
		// call failed.
		return nil, fmt.Errorf("cannot build pinboard: %w", err)
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
		// A proxy adds nothing of its own to what workers answer, but
		// a Date: every answer carries exactly one, from pinboard's
		// clock (fasthttp's, refreshed each second). RFC 9110 §6.6.1
		// asks one of pinboard's own 2xx and 4xx answers (the registry,
		// the probes) and of a proxy relaying an answer that has none;
		// a worker's own Date gives way to it, as nginx does by default
		// (its proxy_hide_header list). The Node pinboard's answers,
		// on Node's http server, always carried one.
		NoDefaultServerHeader: true,
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
			now := time.Now()
			rawio.KeepWriteDeadline(ctx.Conn(), now, pb.stall)
			if dest, _ := pb.destination(ctx); dest == toProxy && !pb.proxy.Expect(ctx) {
				pb.refusedEarly(ctx, now)
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
		ConnState:         pb.trackConn,
		Logger:            fasthttpLogger{o.Logger},

		// fasthttp's error for a request it cannot read quotes the
		// header it read, Authorization and Cookie lines included, and
		// Logger writes it at debug level: a client's bearer token in
		// pinboard's log (R-TR-1,
		// TestUnreadableRequestCredentialsNotLogged_RTR1).
		SecureErrorLogMessage: true,
	}
	if o.Metrics != nil {
		o.Metrics.Attach(metrics.Sources{
			Store:            o.Store,
			OpenStreams:      pb.proxy.OpenStreams,
			OpenEventStreams: pb.proxy.OpenEventStreams,
			OpenWebSockets:   pb.proxy.OpenWebSockets,
			OpenConnections:  pb.openConnections,
			RegistryQueue:    reg.QueueDepth,
			RegistryRunning:  reg.Running,
			RegistryCap:      reg.Capacity,
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

// Proxy returns the data plane (for metrics and tests).
func (pb *Pinboard) Proxy() *proxy.Proxy { return pb.proxy }

// Registry returns the control plane (for metrics and tests).
func (pb *Pinboard) Registry() *registry.Registry { return pb.registry }

// fasthttpLogger routes fasthttp's own messages to slog.
type fasthttpLogger struct{ l *slog.Logger }

func (f fasthttpLogger) Printf(format string, args ...any) {
	f.l.Debug(fmt.Sprintf(format, args...), "component", "fasthttp")
}

// CheckBasePath returns an error if p cannot be Options.BasePath: a base
// path is "" (none) or an absolute path as clients send it
// (BasePathAsSent), trailing slashes aside; any other could match no
// request, and every one, worker registrations included, would be
// answered 404 (R-SRV-4). New refuses what it refuses; cmd/pinboard
// checks PINBOARD_BASE_PATH with it, so that the rule and its wording live
// here only.
func CheckBasePath(p string) error {
	if base := trimSlash(p); base != "" && (base[0] != '/' || !BasePathAsSent(base)) {
		return fmt.Errorf("cannot use base path %q: must be an absolute path like /pinboard, as clients send it (ASCII, other bytes %%XX-escaped, no . or .. segment)", p)
	}
	return nil
}

// BasePathAsSent reports whether p is a path as clients put it on the wire
// (PINBOARD_BASE_PATH's rule, and Options.BasePath's): the base path is
// matched against the request target byte for byte but for the case of an
// escape's hex digits (R-SRV-4), and clients percent-encode a byte outside RFC 3986's pchar
// (httpx, the reference worker's client, sends /pinbøard as
// /pinb%C3%B8ard) and remove "." and ".." segments (§5.2.4), so a base
// path holding either could never match: every request, worker
// registrations included, was answered 404.
func BasePathAsSent(p string) bool {
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', strings.IndexByte("/-._~!$&'()*+,;=:@", c) >= 0:
		case c == '%' && i+2 < len(p) && ascii.IsHex(p[i+1]) && ascii.IsHex(p[i+2]):
			i += 2
		default:
			return false
		}
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == "." || seg == ".." {
			return false
		}
	}
	return true
}
