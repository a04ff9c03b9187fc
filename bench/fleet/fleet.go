// Package fleet is a simulated worker fleet for benchmarks and unit tests:
// N virtual workers that speak the reference worker's (pinned 0.16.0)
// protocol to pinboard — register, heartbeat every 3 s with a fresh
// challenge each time, acks of control messages, deregister — and serve
// data-plane routes behind their advertise URLs, verifying every
// request's Pinboard-Attestation exactly as the reference worker does
// (attest.VerifyAttestation, audience = the worker's current session).
//
// Workers share a few listening ports of one process: worker i advertises
// http://HOST:PORT/w/i/ on listener i % Listeners, and pinboard forwards
// to <advertiseUrl><ns>/<id>/<rest>. One fasthttp server serves every
// listener, so the fleet costs little CPU next to the proxy it measures.
//
// Routes under a worker's prefix:
//
//	GET  /_pinned/challenge?challenge=C   {"value": V} (proxy secret or attestation)
//	GET  /{ns}/{id}/json                  small JSON
//	GET  /{ns}/{id}/sse?n=N&every=MS      Server-Sent Events stamped with the send time
//	GET  /{ns}/{id}/ws                    WebSocket echo
//	POST /{ns}/{id}/upload                consumes the body: {"bytes": N}
//	GET  /{ns}/{id}/download?size=N       N bytes
//
// This stand-in is for benchmarks and unit tests only; the e2e suite uses
// the real Python worker.
package fleet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/internal/rawio"
)

// Options configure a Fleet. Zero values take the documented defaults.
type Options struct {
	// PinboardURL is where workers register ("http://127.0.0.1:8080"), with
	// pinboard's base path if it has one ("http://127.0.0.1:8080/pb",
	// server.Options.BasePath): registry calls go to <PinboardURL>/registry/….
	// Empty: the fleet serves but never registers (unit tests).
	PinboardURL string
	// Token is the worker credential sent as Authorization: Bearer.
	Token string
	// Namespaces every worker serves; default ["/bench"].
	Namespaces []string
	// Workers is the number of virtual workers at start.
	Workers int
	// MaxWorkers bounds Workers plus later joins; default 2*Workers+64.
	MaxWorkers int
	// Listeners is the number of listening ports; default 4.
	Listeners int
	// Host is the listening address and the advertise URL host; default
	// 127.0.0.1.
	Host string
	// Heartbeat is the heartbeat interval; default 3s (the reference's).
	Heartbeat time.Duration
	// Headroom is what every worker reports; default 1000.
	Headroom float64
	// RegisterConcurrency bounds registrations in flight; default 32.
	RegisterConcurrency int
	// MaxConns bounds connections to pinboard; default 256.
	MaxConns int
	// Now is the clock for attestation checks; nil uses time.Now.
	Now func() time.Time
}

func (o *Options) withDefaults() Options {
	d := *o
	if len(d.Namespaces) == 0 {
		d.Namespaces = []string{"/bench"}
	}
	if d.MaxWorkers <= 0 {
		d.MaxWorkers = 2*d.Workers + 64
	}
	if d.MaxWorkers < d.Workers {
		d.MaxWorkers = d.Workers
	}
	if d.Listeners <= 0 {
		d.Listeners = 4
	}
	if d.Host == "" {
		d.Host = "127.0.0.1"
	}
	if d.Heartbeat <= 0 {
		d.Heartbeat = 3 * time.Second
	}
	if d.Headroom == 0 {
		d.Headroom = 1000
	}
	if d.RegisterConcurrency <= 0 {
		d.RegisterConcurrency = 32
	}
	if d.MaxConns <= 0 {
		d.MaxConns = 256
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	return d
}

// Fleet is a set of virtual workers. Its methods are safe for concurrent
// use.
type Fleet struct {
	o      Options
	srv    *fasthttp.Server
	pb     *fasthttp.HostClient
	pbBase string // PinboardURL's path, without a trailing slash
	auth   string
	closed chan struct{}

	mu      sync.Mutex
	lns     []net.Listener
	ports   []int
	n       int // workers created so far
	running bool
	runCtx  context.Context
	loops   sync.WaitGroup
	// workers is indexed by the number in the advertise URL path.
	workers []atomic.Pointer[Worker]

	hijacked sync.Map // net.Conn -> struct{}: SSE and WebSocket streams

	stats   *Stats
	paused  atomic.Bool
	regSema chan struct{}
}

// New returns a fleet with o.Workers workers that neither listen nor
// register yet: call Listen, then Register and Run (or serve a listener of
// your own with Serve).
func New(o Options) (*Fleet, error) {
	o = o.withDefaults()
	f := &Fleet{
		o:       o,
		closed:  make(chan struct{}),
		workers: make([]atomic.Pointer[Worker], o.MaxWorkers),
		stats:   newStats(),
		regSema: make(chan struct{}, o.RegisterConcurrency),
	}
	f.srv = &fasthttp.Server{
		Handler:                      f.Handle,
		Name:                         "fleet",
		NoDefaultServerHeader:        true,
		NoDefaultDate:                true,
		NoDefaultContentType:         true,
		StreamRequestBody:            true,
		DisablePreParseMultipartForm: true,
		MaxRequestBodySize:           1 << 62,
		ReadBufferSize:               16 << 10,
		WriteBufferSize:              16 << 10,
		KeepHijackedConns:            true,
		CloseOnShutdown:              true,
		IdleTimeout:                  2 * time.Minute,
		Concurrency:                  1 << 20,
	}
	if o.PinboardURL != "" {
		u, err := url.Parse(o.PinboardURL)
		if err != nil || u.Scheme != "http" || u.Host == "" {
			return nil, fmt.Errorf("cannot use pinboard URL %q: want http://host:port", o.PinboardURL)
		}
		f.pb = &fasthttp.HostClient{
			Addr:                     u.Host,
			Name:                     "fleet",
			NoDefaultUserAgentHeader: true,
			MaxConns:                 o.MaxConns,
			MaxConnWaitTimeout:       10 * time.Second,
			ReadTimeout:              10 * time.Second,
			WriteTimeout:             10 * time.Second,
			MaxIdleConnDuration:      30 * time.Second,
			Dial: func(addr string) (net.Conn, error) {
				c, err := fasthttp.Dial(addr)
				if err != nil {
					return nil, err
				}
				return rawio.Wrap(c), nil
			},
		}
		f.auth = "Bearer " + o.Token
		// Dropped, the registry calls of a fleet pointed at a pinboard
		// under a base path were answered 404 and Register retried them
		// until its context ended (R-SRV-4).
		f.pbBase = strings.TrimRight(u.EscapedPath(), "/")
	}
	return f, nil
}

// Listen opens o.Listeners ports on o.Host (the kernel picks them) and
// serves them, then creates the initial workers with advertise URLs on
// them.
func (f *Fleet) Listen() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := 0; i < f.o.Listeners; i++ {
		ln, err := net.Listen("tcp", net.JoinHostPort(f.o.Host, "0"))
		if err != nil {
			return fmt.Errorf("cannot listen on %s: %w", f.o.Host, err)
		}
		// Raw reads and writes: the fleet shares the machine with the
		// proxy it measures, so every microsecond it saves is the proxy's.
		ln = rawio.Listener(ln)
		f.lns = append(f.lns, ln)
		f.ports = append(f.ports, ln.Addr().(*net.TCPAddr).Port)
		go func() { _ = f.srv.Serve(ln) }()
	}
	for f.n < f.o.Workers {
		f.addWorkerLocked()
	}
	return nil
}

// Serve serves ln (tests bring their own listener); advertise URLs then
// point at port. Call it instead of Listen.
func (f *Fleet) Serve(ln net.Listener, port int) {
	f.mu.Lock()
	f.lns = append(f.lns, ln)
	f.ports = append(f.ports, port)
	for f.n < f.o.Workers {
		f.addWorkerLocked()
	}
	f.mu.Unlock()
	go func() { _ = f.srv.Serve(ln) }()
}

// Ports are the listening ports (baselines reach the workers there).
func (f *Fleet) Ports() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int(nil), f.ports...)
}

var errFleetFull = errors.New("fleet is full: raise MaxWorkers")

func (f *Fleet) addWorkerLocked() (*Worker, error) {
	if f.n >= len(f.workers) {
		return nil, errFleetFull
	}
	i := f.n
	f.n++
	port := f.ports[i%len(f.ports)]
	w := &Worker{
		Index:        i,
		ClientID:     randomHex(16),
		Secret:       randomHex(32),
		AdvertiseURL: "http://" + net.JoinHostPort(f.o.Host, strconv.Itoa(port)) + "/w/" + strconv.Itoa(i) + "/",
		fleet:        f,
		stop:         make(chan struct{}),
	}
	w.secret = []byte(w.Secret)
	w.st.Store(&wstate{})
	f.workers[i].Store(w)
	return w, nil
}

// Worker returns worker i, or nil.
func (f *Fleet) Worker(i int) *Worker {
	if i < 0 || i >= len(f.workers) {
		return nil
	}
	return f.workers[i].Load()
}

// Workers returns every worker that has not begun to leave. A leaving
// worker still answers during its grace, but a listing taken then (a
// baseline's route, right after a churn window) must not name it.
func (f *Fleet) Workers() []*Worker {
	f.mu.Lock()
	n := f.n
	f.mu.Unlock()
	out := make([]*Worker, 0, n)
	for i := 0; i < n; i++ {
		if w := f.workers[i].Load(); w != nil && !w.leaving.Load() {
			out = append(out, w)
		}
	}
	return out
}

// Stats returns the heartbeat statistics.
func (f *Fleet) Stats() *Stats { return f.stats }

// Pause stops sending heartbeats (their schedule keeps running) until
// Resume: the A/B switch of the heartbeat storm. Keep pauses well inside
// one lease or sessions lapse.
func (f *Fleet) Pause()  { f.paused.Store(true) }
func (f *Fleet) Resume() { f.paused.Store(false) }

// Register registers every worker that has no session yet, at most
// RegisterConcurrency at a time, retrying deferrals until ctx ends.
func (f *Fleet) Register(ctx context.Context) error {
	ws := f.Workers()
	errc := make(chan error, len(ws))
	var wg sync.WaitGroup
	for _, w := range ws {
		if w.Session() != "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.registerUntil(ctx); err != nil {
				errc <- err
			}
		}()
	}
	wg.Wait()
	close(errc)
	return <-errc
}

// Run starts every worker's heartbeat loop, spread evenly over one
// interval, and returns; loops end with ctx or Close.
func (f *Fleet) Run(ctx context.Context) {
	f.mu.Lock()
	f.running, f.runCtx = true, ctx
	f.mu.Unlock()
	ws := f.Workers()
	for k, w := range ws {
		offset := time.Duration(int64(f.o.Heartbeat) * int64(k) / int64(len(ws)))
		f.startLoop(ctx, w, offset)
	}
}

func (f *Fleet) startLoop(ctx context.Context, w *Worker, offset time.Duration) {
	f.loops.Add(1)
	go func() {
		defer f.loops.Done()
		w.loop(ctx, offset)
	}()
}

// Join adds a worker, registers it and starts its heartbeats.
func (f *Fleet) Join(ctx context.Context) (*Worker, error) {
	f.mu.Lock()
	w, err := f.addWorkerLocked()
	running, runCtx := f.running, f.runCtx
	f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if err := w.registerUntil(ctx); err != nil {
		return w, err
	}
	if running {
		f.startLoop(runCtx, w, f.o.Heartbeat)
	}
	return w, nil
}

// Leave takes a worker out the way the reference worker shuts down: it
// deregisters (pinboard frees its placements, the next request for each
// id re-places), keeps serving what is already on its way for grace, and
// then its routes answer 404.
func (f *Fleet) Leave(ctx context.Context, w *Worker, grace time.Duration) error {
	w.leaving.Store(true)
	w.stopLoop()
	err := w.deregister(ctx)
	go func() {
		select {
		case <-time.After(grace):
		case <-f.closed:
		}
		w.left.Store(true)
	}()
	return err
}

// CloseStreams ends every open SSE and WebSocket stream and returns how
// many there were (a proxy holding idle streams then sees them end).
func (f *Fleet) CloseStreams() int {
	n := 0
	f.hijacked.Range(func(k, _ any) bool {
		_ = k.(net.Conn).Close()
		n++
		return true
	})
	return n
}

// Close deregisters every worker (when registered and ctx allows), ends
// heartbeats, streams and listeners.
func (f *Fleet) Close(ctx context.Context) error {
	select {
	case <-f.closed:
		return nil
	default:
	}
	close(f.closed)
	ws := f.Workers()
	for _, w := range ws {
		w.stopLoop()
	}
	f.loops.Wait()
	if f.pb != nil {
		var wg sync.WaitGroup
		sem := make(chan struct{}, f.o.RegisterConcurrency)
		for _, w := range ws {
			if w.Session() == "" {
				continue
			}
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				_ = w.deregister(ctx)
				<-sem
			}()
		}
		wg.Wait()
	}
	f.hijacked.Range(func(k, _ any) bool {
		_ = k.(net.Conn).Close()
		return true
	})
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := f.srv.ShutdownWithContext(sctx)
	if f.pb != nil {
		f.pb.CloseIdleConnections()
	}
	return err
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic("BUG: crypto/rand failed: " + err.Error())
	}
	return hex.EncodeToString(b)
}
