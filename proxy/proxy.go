// Package proxy is pinboard's data plane (R-DP): it resolves
// /{ns}/{id}/{rest} to the owning worker session through the directory and
// forwards the request there over pooled connections, streaming bodies both
// ways, relaying Server-Sent Events and WebSockets, and signing every
// forwarded request with the attestation the worker verifies (R-TR-5).
//
// The hot path — parse, resolve a placed id, forward over a warm connection
// — allocates nothing; BenchmarkHotPath guards it.
package proxy

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/attest"
	"github.com/pinboard-go/pinboard/directory"
)

// Options configure a Proxy. Store and Passport are required; nil or zero
// fields take the documented defaults.
type Options struct {
	// Store is the directory ids are resolved, placed and released in:
	// the one the registry registers workers in.
	Store directory.Store
	// Passport authenticates clients' credentials and admits requests,
	// cluster calls included, by its namespace policies (R-TR-1, R-TR-4).
	Passport *attest.Passport
	// Now is the clock; nil uses time.Now.
	Now func() time.Time
	// BasePath is the prefix pinboard is mounted under ("" or "/pb").
	BasePath string
	// Policy ranks candidates for new placements; nil uses
	// directory.HeadroomPolicy with DefaultBalanceFactor.
	Policy directory.Policy
	// AffinityKey is the programmatic affinity.key (R-PL-4): it returns the
	// rendezvous key for a new placement, or ok=false for "null" (power of
	// two choices); an empty key is null too. It must not consume the
	// body. Nil uses the client IP.
	AffinityKey func(ctx *fasthttp.RequestCtx) (key string, ok bool)
	// TrustedProxies are the peers whose X-Forwarded-For is believed.
	TrustedProxies *TrustedProxies
	// Upstream tunes the worker connection pools.
	Upstream UpstreamOptions
	// SmallBody is the largest response body read whole before it is sent
	// (fewer writes for small JSON); larger or unsized bodies stream.
	// Default 64 KiB.
	SmallBody int
	// Logger receives one line per noteworthy failure; nil discards.
	Logger *slog.Logger
	// Metrics receives counters; nil records nothing.
	Metrics Metrics
	// Resume serves further requests on a client connection an event
	// stream was relayed on (events.go), once the worker ended the stream
	// cleanly: fasthttp.Server.ServeConn of the server the proxy runs in.
	// It owns the connection and closes it when done. Nil closes such
	// connections, and event streams then answer with Connection: close.
	Resume func(net.Conn) error
}

// Metrics is the data plane's view of the metrics registry. Implementations
// must not allocate: they run on the hot path.
type Metrics interface {
	// Request counts a finished request by status, with the time until its
	// response header was ready. ns is the namespace when the request was
	// resolved to a worker — bounded by what workers registered — and nil
	// when it never was (bad path, refused credential, unknown namespace,
	// placement refused); it is only valid during the call.
	Request(ns []byte, status int, d time.Duration)
	// UpstreamError counts a failure reaching a worker by kind ("dial",
	// "write", "read", "invalid", "timeout", "pool", "unattested"), a
	// streamed body that broke off on the worker's side included.
	UpstreamError(kind string)
	// Resolve counts a directory resolution: hit (cached live placement) or
	// a placement attempt.
	Resolve(hit bool)
	// Placement counts a new placement; replaced when the id moved: off a
	// worker that refused it in-band (R-PL-6) or off an owner whose lease
	// had passed (R-LS-2).
	Placement(replaced bool)
	// UpstreamConnect counts a connection opened to a worker: a pooled
	// one or a WebSocket's. Requests that open connections at the rate
	// they come are not reusing them, a cost no error shows.
	UpstreamConnect()
}

type nopMetrics struct{}

func (nopMetrics) Request([]byte, int, time.Duration) {}
func (nopMetrics) UpstreamError(string)               {}
func (nopMetrics) Resolve(bool)                       {}
func (nopMetrics) Placement(bool)                     {}
func (nopMetrics) UpstreamConnect()                   {}

// Proxy is the data plane handler. It is safe for concurrent use.
type Proxy struct {
	store     directory.Store
	passport  *attest.Passport
	now       func() time.Time
	realClock bool // now is time.Now: its readings may set deadlines
	base      []byte
	policy    directory.Policy
	affinity  func(ctx *fasthttp.RequestCtx) (string, bool)
	trusted   *TrustedProxies
	ups       *upstreams
	smallBody int
	log       *slog.Logger
	metrics   Metrics

	// declines ranks workers that lately turned a new activation away
	// last for new ids (R-PL-6).
	declines declines

	streams *streams
	hijacks *hijacks

	resume func(net.Conn) error

	reqPool sync.Pool
	opCtx   opContexts

	// loopLogged is the Unix second looped last logged in: one line a
	// second at most, whatever the rate of looping requests.
	loopLogged atomic.Int64
}

// New returns a Proxy.
func New(o Options) *Proxy {
	p := &Proxy{
		store:     o.Store,
		passport:  o.Passport,
		now:       o.Now,
		base:      []byte(trimSlash(o.BasePath)),
		policy:    o.Policy,
		affinity:  o.AffinityKey,
		trusted:   o.TrustedProxies,
		ups:       newUpstreams(o.Upstream),
		smallBody: o.SmallBody,
		log:       o.Logger,
		metrics:   o.Metrics,
		streams:   newStreams(),
		hijacks:   newHijacks(),
		resume:    o.Resume,
	}
	p.hijacks.stall = p.ups.opts.StallTimeout
	if p.now == nil {
		p.now, p.realClock = time.Now, true
	}
	if p.policy == nil {
		p.policy = &directory.HeadroomPolicy{}
	}
	if p.smallBody <= 0 {
		p.smallBody = 64 << 10
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if p.metrics == nil {
		p.metrics = nopMetrics{}
	}
	p.streams.metrics = p.metrics
	p.ups.metrics = p.metrics
	if p.trusted == nil {
		p.trusted = &TrustedProxies{}
	}
	p.reqPool.New = func() any { return new(request) }
	p.opCtx.d = placeTimeout
	return p
}

func trimSlash(s string) string {
	for len(s) > 0 && s[len(s)-1] == '/' {
		s = s[:len(s)-1]
	}
	return s
}

// Run sweeps idle worker connections, and ends the event streams and
// WebSockets of sessions the store ended (streams.endRevoked,
// hijacks.endRevoked), once a second until ctx ends. Call it once.
func (p *Proxy) Run(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.ups.sweep(p.now(), 10*time.Minute)
			if n, w := p.streams.endRevoked(time.Now()), p.hijacks.endRevoked(time.Now()); n+w > 0 {
				p.log.Info("streams of ended sessions closed; their clients reconnect to the ids' owners now", "eventStreams", n, "webSockets", w)
			}
		}
	}
}

// StallTimeout is UpstreamOptions.StallTimeout with its default applied;
// 0 when it is off.
func (p *Proxy) StallTimeout() time.Duration { return p.ups.opts.StallTimeout }

// OpenStreams is the number of streaming responses in flight.
func (p *Proxy) OpenStreams() int64 { return p.streams.Open() }

// OpenWebSockets is the number of relayed WebSocket connections.
func (p *Proxy) OpenWebSockets() int64 { return p.hijacks.Open() }

// OpenEventStreams is the number of Server-Sent Event streams among
// OpenStreams: responses that never end by themselves.
func (p *Proxy) OpenEventStreams() int64 { return p.streams.OpenEvents() }

// RelayedEventStreams is the number of event streams among
// OpenEventStreams relayed off the server, on hijacked connections the
// server no longer counts as open (events.go).
func (p *Proxy) RelayedEventStreams() int64 { return p.streams.Relays() }

// RelayedDownloads is the number of other bodies among OpenStreams
// relayed off the server (unsized bodies to HTTP/1.0 clients, events.go):
// requests in flight on connections the server no longer counts as open,
// which a graceful shutdown's grace must wait for like any other.
func (p *Proxy) RelayedDownloads() int64 { return p.streams.Downloads() }

// DefaultCloseWait bounds CloseStreams, and CloseStreamsContext when ctx
// has no deadline.
const DefaultCloseWait = 2 * time.Second

// CloseStreams is CloseStreamsContext with DefaultCloseWait.
func (p *Proxy) CloseStreams() { p.CloseStreamsContext(context.Background()) }

// CloseStreamsContext ends every streaming response and WebSocket relay; the
// graceful shutdown calls it at the end of its grace period, since
// fasthttp's Shutdown neither ends idle streams nor sees hijacked
// connections. Event streams between two events end cleanly (a proper end
// of the chunked body; the client reconnects elsewhere), other streams are
// cut. Each WebSocket gets a Close frame 1001 "going away" toward both the
// client and the worker, at a frame boundary, and then has until ctx's
// deadline (DefaultCloseWait without one) for the closing handshake before
// its connections are closed. It returns once every relay finished — at
// that deadline what is left is cut, and it waits up to cutWait more for
// that to let go of its worker connections — and then closes idle worker
// connections.
func (p *Proxy) CloseStreamsContext(ctx context.Context) {
	now := p.now()
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(DefaultCloseWait)
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	// A read deadline is wall-clock time, whatever clock p runs on.
	p.streams.stopAll(time.Now())
	p.hijacks.shutdown(deadline)
	cut := false
	if !p.streams.waitRelays(ctx) {
		p.streams.cutRelays()
		cut = true
	}
	if !p.hijacks.wait(ctx) {
		p.hijacks.closeAll()
		cut = true
	}
	if cut {
		// A cut relay's next write or read fails at once and it lets go
		// of its worker connection: wait for that, so that nothing of a
		// relay outlives the shutdown (a caller that goes on, tests, an
		// embedding program, would otherwise find worker connections and
		// goroutines still about).
		cctx, cancel := context.WithTimeout(context.Background(), cutWait)
		p.streams.waitRelays(cctx)
		p.hijacks.wait(cctx)
		cancel()
	}
	// Bounded by deadline: what a goodbye writes has it.
	p.hijacks.goodbyes.Wait()
	p.ups.closeAll(now)
}

// cutWait bounds CloseStreamsContext's wait for the relays it cut.
const cutWait = 100 * time.Millisecond

// ownerState is the data plane's per-session state, kept on the
// directory.Owner so a hot lookup reaches it without a map.
type ownerState struct {
	up  *upstream
	att attestationCache
	// born is when this proxy first routed to the session (unix ns). A
	// WebSocket handshake refused with 403 is retried only while the
	// session is young (see youngSession).
	born int64
}

// youngSession is how long after this proxy first routes to a session a
// WebSocket handshake it refuses with 403 is taken for the session gap
// (unattestedWaits) and retried. The reference worker refuses an
// unattested upgrade with a bare 403 (a WebSocketException before accept),
// the same answer as a route's own refusal, so unlike a request's 403 the
// answer alone cannot tell the gap apart; a worker learns its session
// within milliseconds of its register ack, so past a second a new
// session's 403 is the route's own. A re-registration's new session is a
// new one too. The other half of the gap, an upgrade still routed to the
// session the re-registering worker dropped (that session is old), is
// told apart by the id no longer being placed there (maybeGap), not by a
// wait. For a second after this proxy starts every session is young: a
// route refusing an upgrade then runs up to four times.
const youngSession = time.Second

// state returns the owner's data-plane state, building it on first use.
// A state whose pool the idle sweep dropped (a worker idle for ten
// minutes) is renewed, or the owner would dial a fresh connection for
// every request from then on.
func (p *Proxy) state(o *directory.Owner) (*ownerState, error) {
	st, ok := o.Ext().(*ownerState)
	if ok && !st.up.pool.gone.Load() {
		return st, nil
	}
	up, err := p.ups.get(o.AdvertiseURL)
	if err != nil {
		return nil, err
	}
	if !ok {
		fresh := &ownerState{up: up, born: p.now().UnixNano()}
		return o.SetExtIfAbsent(fresh).(*ownerState), nil
	}
	fresh := &ownerState{up: up, born: st.born}
	if o.CompareAndSwapExt(st, fresh) {
		return fresh, nil
	}
	return o.Ext().(*ownerState), nil
}
