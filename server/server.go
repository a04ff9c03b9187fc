// Package server assembles pinboard: one fasthttp listener serving the
// registry API, the operator API and the data plane (R-SRV-1). It is the Go
// counterpart of the Node package's createPinboard/servePinboard
// (R-SRV-4): cmd/pinboard reads the environment and calls it, programs
// embed it with an Options struct.
package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/attest"
	"github.com/pinboard-go/pinboard/directory"
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
	// BalanceFactor bounds affinity (R-PL-4); default
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
	// RegistryWorkers and RegistryQueue size the control plane's pool.
	RegistryWorkers, RegistryQueue int
	// ReadTimeout bounds reading one request (header and body) from a
	// client; 0 means none. IdleTimeout bounds a keep-alive connection
	// waiting for its next request; default 75s. HeaderTimeout bounds
	// reading a request header; default 30s (slowloris).
	ReadTimeout, IdleTimeout, HeaderTimeout time.Duration
	// MaxHeaderBytes caps a request header (431 beyond); default 16 KiB.
	MaxHeaderBytes int
	// Logger; nil discards.
	Logger *slog.Logger
	// Now is the clock; nil uses time.Now.
	Now func() time.Time
	// ProxyMetrics and RegistryObserver receive metrics; nil records none.
	ProxyMetrics     proxy.Metrics
	RegistryObserver registry.Observer
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
	ready    func() bool
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
	base := trimSlash(o.BasePath)
	if base != "" && base[0] != '/' {
		return nil, fmt.Errorf("cannot build pinboard: base path %q must start with /", o.BasePath)
	}
	reg, err := registry.New(registry.Options{
		Store:        o.Store,
		Passport:     o.Passport,
		LeaseTTL:     o.LeaseTTL,
		Now:          o.Now,
		ProbeTimeout: o.ProbeTimeout,
		Workers:      o.RegistryWorkers,
		Queue:        o.RegistryQueue,
		BasePath:     base,
		Logger:       o.Logger,
		Observer:     o.RegistryObserver,
	})
	if err != nil {
		return nil, err
	}
	pb := &Pinboard{
		opts:     o,
		store:    o.Store,
		registry: reg,
		base:     []byte(base),
		log:      o.Logger,
		now:      o.Now,
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
	})
	pb.srv = &fasthttp.Server{
		Handler: pb.Handle,
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
		IdleTimeout:                  o.IdleTimeout,
		HeaderReceived: func(*fasthttp.RequestHeader) fasthttp.RequestConfig {
			// The header arrived in time; the body gets ReadTimeout (none by
			// default: a 1 GiB upload must not be cut at the header limit).
			return fasthttp.RequestConfig{ReadTimeout: bodyTimeout(o.ReadTimeout)}
		},
		// WebSocket relays close their own connections and are tracked by
		// the proxy for shutdown.
		KeepHijackedConns: true,
		CloseOnShutdown:   true,
		Logger:            fasthttpLogger{o.Logger},
	}
	return pb, nil
}

// bodyTimeout maps "no body timeout" onto a deadline far enough away:
// fasthttp keeps the header deadline unless the config sets another one.
func bodyTimeout(d time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return 365 * 24 * time.Hour
}

func trimSlash(s string) string {
	for len(s) > 0 && s[len(s)-1] == '/' {
		s = s[:len(s)-1]
	}
	return s
}

var (
	registryPrefix = []byte("/registry/")
	pathLivez      = []byte("/livez")
	pathReadyz     = []byte("/readyz")
)

// Handle is the node's fasthttp handler: /registry/* to the registry,
// /livez and /readyz for orchestrators, everything else to the data plane.
// A namespace called "registry" is therefore reserved.
func (pb *Pinboard) Handle(ctx *fasthttp.RequestCtx) {
	uri := ctx.Request.Header.RequestURI()
	path := uri
	if i := bytes.IndexByte(uri, '?'); i >= 0 {
		path = uri[:i]
	}
	if len(pb.base) > 0 && bytes.HasPrefix(path, pb.base) {
		path = path[len(pb.base):]
	}
	switch {
	case bytes.HasPrefix(path, registryPrefix):
		pb.registry.ServeHTTP(ctx, path)
	case bytes.Equal(path, pathLivez):
		pb.livez(ctx)
	case bytes.Equal(path, pathReadyz):
		pb.readyz(ctx)
	default:
		pb.proxy.ServeHTTP(ctx)
	}
}

func (pb *Pinboard) livez(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("application/json")
	ctx.SetBodyString(`{"ok":true}`)
}

// readyz answers 200 when the store answers and the cold-start quarantine
// is over; 503 otherwise. Orchestrators route traffic by it.
func (pb *Pinboard) readyz(ctx *fasthttp.RequestCtx) {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	q, err := pb.store.Quarantine(c, pb.now())
	ctx.SetContentType("application/json")
	switch {
	case err != nil:
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.SetBodyString(`{"ok":false,"error":"directory unavailable"}`)
	case q > 0:
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.SetBodyString(fmt.Sprintf(`{"ok":false,"quarantineMs":%d}`, q.Milliseconds()))
	default:
		ctx.SetBodyString(`{"ok":true,"quarantineMs":0}`)
	}
}

// Proxy returns the data plane (for metrics and tests).
func (pb *Pinboard) Proxy() *proxy.Proxy { return pb.proxy }

// Registry returns the control plane (for metrics and tests).
func (pb *Pinboard) Registry() *registry.Registry { return pb.registry }

// Serve serves ln until ctx ends, then shuts down gracefully: stop
// accepting, let in-flight requests finish within grace, then end streams
// and WebSocket relays and return. Background loops (directory sweeps,
// pool sweeps) run while it serves.
func (pb *Pinboard) Serve(ctx context.Context, ln net.Listener, grace time.Duration) error {
	bg, stopBG := context.WithCancel(context.Background())
	defer stopBG()
	go pb.proxy.Run(bg)
	go pb.sweep(bg)

	errc := make(chan error, 1)
	go func() { errc <- pb.srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("cannot serve: %w", err)
	case <-ctx.Done():
	}
	return pb.Shutdown(grace, errc)
}

// Shutdown stops the node: the registry answers 503 "not the serving
// fleet", the listener closes, in-flight requests get grace to finish, then
// streams and relays are ended.
func (pb *Pinboard) Shutdown(grace time.Duration, errc <-chan error) error {
	pb.registry.Stop()
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	// Returns once every connection closed, or at the end of grace with
	// streams (SSE, WebSockets) still open: those never end by themselves.
	err := pb.srv.ShutdownWithContext(sctx)
	pb.proxy.CloseStreams()
	if errors.Is(err, context.DeadlineExceeded) {
		err = nil
	}
	if errc != nil {
		select {
		case <-errc:
		case <-time.After(5 * time.Second):
		}
	}
	if cerr := pb.registry.Close(5 * time.Second); cerr != nil && err == nil {
		err = fmt.Errorf("cannot stop the registry pool: %w", cerr)
	}
	return err
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
