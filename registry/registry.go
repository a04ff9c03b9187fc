// Package registry is pinboard's control plane API (R-REG, R-LS, R-CM):
// worker registration with the challenge probe, heartbeats, release and
// deregister, and the operator API (workers, health, drain, wind-down).
//
// Every request runs on a bounded ants pool apart from the data plane, so a
// heartbeat storm or slow probes queue up here instead of taking CPU and
// goroutines from proxied traffic; past the queue bound the registry
// answers 503 with Retry-After. A governor (governor.go) resizes the pool
// from the process's scheduling latency, so that registry work that is
// runnable at once stays small while proxied requests wait for a CPU.
package registry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/panjf2000/ants/v2"
	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/attest"
	"github.com/pinboard-go/pinboard/directory"
)

// Options configure a Registry.
type Options struct {
	// Store is the directory sessions are registered in; required, and
	// the node's proxy must use the same one.
	Store directory.Store
	// Passport authenticates registry requests: register, heartbeat,
	// release and deregister need the worker scope, the rest the operator
	// scope (R-TR-2), and claims bound what each may reach (R-TR-3).
	// Required.
	Passport *attest.Passport
	// LeaseTTL is PINBOARD_LEASE_TTL_MS (R-LS-1).
	LeaseTTL time.Duration
	// Now is the clock; nil uses time.Now.
	Now func() time.Time
	// Prober probes advertise URLs; nil uses NewProber(ProbeTimeout).
	Prober *Prober
	// ProbeTimeout bounds one challenge probe; default 2s.
	ProbeTimeout time.Duration
	// Workers is the most registry requests handled at once (the ants
	// pool's largest capacity); default 64.
	Workers int
	// MinWorkers is the smallest capacity the governor shrinks the pool to
	// while the process's scheduling latency is high (governor.go); default
	// 4×GOMAXPROCS, at most Workers. MinWorkers equal to Workers turns the
	// governor off (so do the defaults from GOMAXPROCS 16 up).
	MinWorkers int
	// Queue is how many registry requests may wait for a pool worker
	// before the registry answers 503; default 4096.
	Queue int
	// OpTimeout bounds one registry operation against the store; default 5s.
	OpTimeout time.Duration
	// BasePath is the prefix pinboard is mounted under.
	BasePath string
	// Logger receives the registry's events (registrations, voids,
	// degraded probes, supersedes, drains, wind-downs) and, one a second at
	// most, its store failures; nil discards.
	Logger *slog.Logger
	// Observer receives registry events for metrics; nil ignores them.
	Observer Observer
	// BodyStall is how long a request body read in pieces may make no
	// progress: each read pushes the client connection's read deadline
	// this far, so a large body over a slow link is not cut while it
	// moves. 0 leaves the deadline the server set.
	BodyStall time.Duration
	// MaxQueueWait is how long a register or heartbeat may wait for a pool
	// worker and still be handled; default WorkerTimeout less 1 s. One
	// that waited longer is answered 503 "registry busy" unhandled (see
	// ServeHTTP).
	MaxQueueWait time.Duration
	// AnswerWithin is how long after a register or heartbeat arrives its
	// challenge probe may still end; default WorkerTimeout less 500 ms for
	// the store and the answer. A probe that cannot end by then is not
	// made, or cut short, and the request answered 503 "registry busy"
	// unhandled, as one that waited past MaxQueueWait (Prober.ProbeBy).
	AnswerWithin time.Duration
}

// WorkerTimeout is how long the reference worker waits for the answer to
// its register or heartbeat (pinned.pinboard.registration: httpx
// timeout=5.0) before it gives up and sends the next one, with a new
// challenge.
const WorkerTimeout = 5 * time.Second

// Observer sees registry outcomes (for metrics). Methods must be cheap.
type Observer interface {
	Heartbeat(d time.Duration, outcome string)
	Probe(d time.Duration, result ProbeResult)
	QueueDepth(n int)
}

type nopObserver struct{}

func (nopObserver) Heartbeat(time.Duration, string)  {}
func (nopObserver) Probe(time.Duration, ProbeResult) {}
func (nopObserver) QueueDepth(int)                   {}

// Registry serves /registry/*. It is safe for concurrent use.
type Registry struct {
	store    directory.Store
	passport *attest.Passport
	ttl      time.Duration
	now      func() time.Time
	prober   *Prober
	pool     *ants.Pool
	// running counts pool tasks being run (Running): ants's own count
	// takes in its idle workers too, until they expire.
	running  atomic.Int32
	opTime   time.Duration
	base     string
	log      *slog.Logger
	obs      Observer
	stall    time.Duration // Options.BodyStall
	maxWait  time.Duration // Options.MaxQueueWait
	within   time.Duration // Options.AnswerWithin
	stopping atomic.Bool
	gov      *governor
	stopGov  context.CancelFunc
	govDone  chan struct{}

	// unreachable: advertise URLs a register's probe found unreachable.
	unreachable unreachableURLs

	// failLogged is the second (Unix, the registry's clock) of the last
	// "registry operation failed" line, failQuiet the failures not logged
	// since: storeFailed logs one a second.
	failLogged, failQuiet atomic.Int64
}

// New returns a Registry; Close releases its pool.
func New(o Options) (*Registry, error) {
	r := &Registry{
		store:    o.Store,
		passport: o.Passport,
		ttl:      o.LeaseTTL,
		now:      o.Now,
		prober:   o.Prober,
		opTime:   o.OpTimeout,
		base:     o.BasePath,
		log:      o.Logger,
		obs:      o.Observer,
		stall:    o.BodyStall,
		maxWait:  o.MaxQueueWait,
		within:   o.AnswerWithin,
	}
	if r.maxWait <= 0 {
		r.maxWait = WorkerTimeout - time.Second
	}
	if r.within <= 0 {
		r.within = WorkerTimeout - 500*time.Millisecond
	}
	if r.now == nil {
		r.now = time.Now
	}
	if r.prober == nil {
		t := o.ProbeTimeout
		if t <= 0 {
			t = 2 * time.Second
		}
		r.prober = NewProber(t)
	}
	if r.opTime <= 0 {
		r.opTime = 5 * time.Second
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if r.obs == nil {
		r.obs = nopObserver{}
	}
	workers, queue := o.Workers, o.Queue
	if workers <= 0 {
		workers = 64
	}
	if queue <= 0 {
		queue = 4096
	}
	// ants holds a pool's capacity in an int32: past it, Workers wrapped
	// (1<<32+1 was a pool of one, 1<<32 one that never ran a task).
	workers = min(workers, math.MaxInt32)
	minWorkers := o.MinWorkers
	if minWorkers <= 0 {
		minWorkers = 4 * runtime.GOMAXPROCS(0)
	}
	minWorkers = min(minWorkers, workers)
	// Idle pool workers expire after a second: ants hands a task to an idle
	// worker before it checks the capacity, so after the governor shrinks
	// the pool, workers left idle from before would run the next burst at
	// the old size. A second is shorter than the 3 s between a worker's
	// heartbeats; a new worker goroutine costs about a microsecond.
	pool, err := ants.NewPool(workers, ants.WithMaxBlockingTasks(queue), ants.WithExpiryDuration(time.Second))
	if err != nil {
		return nil, fmt.Errorf("cannot start the registry pool: %w", err)
	}
	r.pool = pool
	if minWorkers < workers {
		r.gov = &governor{
			pool: pool, min: minWorkers, max: workers, interval: governorInterval,
			target: governorTarget, busyWait: governorBusyWait, maxWait: governorMaxWait,
			sched: newSchedLatency().p99, log: r.log,
		}
		ctx, cancel := context.WithCancel(context.Background())
		r.stopGov, r.govDone = cancel, make(chan struct{})
		go func() {
			defer close(r.govDone)
			r.gov.run(ctx)
		}()
	}
	return r, nil
}

// Close stops the pool, waiting up to timeout for running tasks.
func (r *Registry) Close(timeout time.Duration) error {
	if r.stopGov != nil {
		r.stopGov()
		<-r.govDone
	}
	err := r.pool.ReleaseTimeout(timeout)
	// Probe connections idle in the prober's pools would otherwise stay
	// open (and fasthttp's cleaner with them) for their idle timeout.
	r.prober.CloseIdle()
	return err
}

// Stop makes the registry answer 503 "not the serving fleet" from now on:
// a node shutting down must not take new sessions it cannot serve.
func (r *Registry) Stop() { r.stopping.Store(true) }

// QueueDepth is the number of registry requests waiting for the pool.
func (r *Registry) QueueDepth() int { return r.pool.Waiting() }

// Running is the number of registry requests being handled: pool tasks
// running now. Not the pool's Running, which counts its worker goroutines,
// idle ones included until they expire (a second or two after a burst).
func (r *Registry) Running() int { return int(r.running.Load()) }

// Capacity is how many registry requests may be handled at once now: the
// governor moves it between MinWorkers and Workers.
func (r *Registry) Capacity() int { return r.pool.Cap() }

// ServeHTTP handles /registry/*. path is the request path with the base
// path removed. The handler waits for the pool task: fasthttp's ctx must
// not be touched after ServeHTTP returns.
func (r *Registry) ServeHTTP(ctx *fasthttp.RequestCtx, path []byte) {
	start := time.Now()
	defer closeIfBodyUnread(ctx)
	h, p, scope := r.route(ctx, path)
	if h == nil && p == nil {
		return
	}
	// Heartbeats turned away before their handler runs are counted here,
	// by why: a worker refused is what an operator watches for.
	beat := string(path) == "/registry/heartbeat"
	// Credentials first, on the request's own goroutine: every handler
	// checks them first anyway (the reference's error table puts them
	// first; a worker with a bad token learns that from a stopping node
	// too, not only a Retry-After), and a request without them must take
	// no pool slot. The registry shares the public listener with the data
	// plane: anonymous requests each queued for a pool worker let anyone
	// fill the queue, and workers' heartbeats were answered 503 "registry
	// busy" until their leases lapsed.
	if r.principal(ctx, scope) == nil {
		if beat {
			r.obs.Heartbeat(time.Since(start), "auth")
		}
		return
	}
	if r.stopping.Load() {
		replyRetry(ctx, bodyNotServing, 1)
		if beat {
			r.obs.Heartbeat(time.Since(start), "stopping")
		}
		return
	}
	if ctx.IsPost() && ctx.Request.IsBodyStream() {
		r.preread(ctx)
	}
	if h != nil {
		r.submit(ctx, func() *probeCall { h(ctx); return nil }, nil)
		return
	}
	// A register or heartbeat may wait for the pool maxWait in all (its
	// waits around an off-pool probe together): submit turns it away past
	// that (outcome "stale").
	// Its probe must end while the worker still waits for the answer
	// (AnswerWithin): one that cannot is "stale" too.
	left, answerBy := r.maxWait, start.Add(r.within)
	due := false
	call, why := r.submit(ctx, func() *probeCall {
		call := p(ctx)
		if call == nil || call.offPool {
			return call
		}
		// Probe and all in this one pool task: the pool bounds how many
		// probe answers can wake goroutines at once (governor.go).
		res, err := r.probe(call, answerBy)
		if due = errors.Is(err, ErrAnswerDue); !due {
			call.then(ctx, res, err)
		}
		return nil
	}, &left)
	if due {
		r.answerDue(ctx, beat, start)
		return
	}
	if why != "" || call == nil {
		r.refused(beat, why, start)
		return
	}
	// A degraded session's probe, off the pool on the request's own
	// goroutine; then back to the pool with its answer.
	res, err := r.probe(call, answerBy)
	if errors.Is(err, ErrAnswerDue) {
		r.answerDue(ctx, beat, start)
		return
	}
	// The probe's own time counts as well: the store write must start
	// while the worker still waits (answerBy). Charged only the queue
	// waits, a register probed for 2 s and then queued was stored after
	// its worker had retried through another node — dropping the session
	// the worker now used — and a heartbeat landed after the newer one
	// its worker sent on timing out (undoing its draining).
	left = min(left, time.Until(answerBy))
	_, why = r.submit(ctx, func() *probeCall { call.then(ctx, res, err); return nil }, &left)
	// Turned away on its way back (its probe done) is turned away all
	// the same: counted, or a heartbeat answered 503 went uncounted.
	r.refused(beat, why, start)
}

// answerDue answers a register or heartbeat whose probe could not end
// before its worker stops waiting (ErrAnswerDue) as one that waited for
// the pool too long (submit's "stale"): 503 "registry busy", nothing
// recorded. Its worker sends the next one with a new challenge.
func (r *Registry) answerDue(ctx *fasthttp.RequestCtx, beat bool, start time.Time) {
	replyRetry(ctx, bodyBusy, 1)
	r.log.Debug("registry request's probe could not end before its worker stops waiting, not handled",
		"path", string(ctx.Path()), "after", time.Since(start).Round(time.Millisecond))
	r.refused(beat, "stale", start)
}

// refused counts a heartbeat submit turned away, by why ("" when it ran).
func (r *Registry) refused(beat bool, why string, start time.Time) {
	if why != "" && beat {
		r.obs.Heartbeat(time.Since(start), why)
	}
}

// principalKey is the request user value holding the principal its
// credential authenticated as (principal).
type principalKey struct{}

// prereadKey is the request user value holding a body preread read.
type prereadKey struct{}

// prereadBody is a request body read before the pool task, or why not.
type prereadBody struct {
	b   []byte
	err error
}

// preread reads a streamed request body (the server streams every body,
// for the data plane: Options.BodyStall) on the request's own goroutine,
// before the pool task, which readBody then gives it to. A small body is
// there already and costs nothing more here than on the pool. Read on the pool, a body that
// keeps moving however slowly (BodyStall renews the deadline at every
// read: one byte a minute keeps a MiB coming for two years) held a pool
// slot all that time, and as many of them as the pool has workers left
// every other worker's heartbeat queued until its lease lapsed. ServeHTTP
// checks the credential first, so only a client with a worker or operator
// key has a body buffered off the pool.
func (r *Registry) preread(ctx *fasthttp.RequestCtx) {
	b, err := r.readBody(ctx)
	ctx.SetUserValue(prereadKey{}, &prereadBody{b: b, err: err})
}

// closeIfBodyUnread makes an answer to a request whose chunked body was
// never read (turned away before preread, or not a POST) say Connection:
// close. fasthttp discards at most 256 KiB of an unread body after the
// answer and then closes the connection; for a chunked body it cannot
// tell before the answer is written, which went out as keep-alive with
// the connection then closed under the client's next request (RFC 9112
// section 9.6; readBody does the same for a 413).
func closeIfBodyUnread(ctx *fasthttp.RequestCtx) {
	if ctx.Request.IsBodyStream() && ctx.Request.Header.ContentLength() == -1 && ctx.UserValue(prereadKey{}) == nil {
		ctx.SetConnectionClose()
	}
}

// probe makes call's challenge probe, to end by answerBy, and records it;
// one answerBy stopped is not a probe outcome (the heartbeat's "stale").
func (r *Registry) probe(call *probeCall, answerBy time.Time) (ProbeResult, error) {
	start := time.Now()
	res, err := r.prober.ProbeBy(answerBy, call.url, call.secret, call.challenge, call.value)
	if !errors.Is(err, ErrAnswerDue) {
		r.obs.Probe(time.Since(start), res)
	}
	return res, err
}

// submit runs task on the pool and waits for it. When it cannot, it
// answers 503 itself and says why (a heartbeat outcome): "busy" (the pool
// full), "stopping" (the pool closed as the node stops) or, with left
// given, "stale": the wait for a pool worker used up what was left of
// *left, which submit lowers by each wait. A register or heartbeat that
// waited that long is answered without being handled: its worker has
// given up on it or is about to (WorkerTimeout) and sends the next one
// with a new challenge. Handled, its probe asked for the old challenge,
// which the worker answers 404 — a healthy session marked degraded (no
// new placements) until its next heartbeat — or a register won while its
// worker backed off: a session the worker never learns of, listed and
// placed on until its lease lapsed. The budget spans a request's waits:
// each of two around an off-pool probe under it, a register handled after
// both stored a session its worker had given up on.
func (r *Registry) submit(ctx *fasthttp.RequestCtx, task func() *probeCall, left *time.Duration) (call *probeCall, why string) {
	done := make(chan struct{})
	submitted := time.Now()
	err := r.pool.Submit(func() {
		defer close(done)
		// Down before done closes: a request answered is no longer counted.
		r.running.Add(1)
		defer r.running.Add(-1)
		if left != nil {
			if *left -= time.Since(submitted); *left < 0 {
				why = "stale"
				return
			}
		}
		call = task()
	})
	if err == nil && r.gov != nil {
		// Submit returns once a pool worker took the task: this is the
		// wait for the pool alone.
		r.gov.waited(time.Since(submitted))
	}
	r.obs.QueueDepth(r.pool.Waiting())
	if err != nil {
		body := bodyBusy
		why = "busy"
		if !errors.Is(err, ants.ErrPoolOverload) {
			body = bodyNotServing
			if r.stopping.Load() {
				why = "stopping" // the pool closed under it
			}
		}
		replyRetry(ctx, body, 1)
		return nil, why
	}
	<-done
	if why == "stale" {
		replyRetry(ctx, bodyBusy, 1)
		r.log.Debug("registry request waited past the worker's timeout, not handled",
			"path", string(ctx.Path()), "over", (-*left).Round(time.Millisecond))
	}
	return call, why
}

// handler serves one registry endpoint on the pool.
type handler func(ctx *fasthttp.RequestCtx)

// probing serves an endpoint that must probe the worker's advertise URL
// (register, heartbeat): it checks the request on the pool and, to go on,
// returns the probe to make instead of making it, or nil once it has
// answered.
type probing func(ctx *fasthttp.RequestCtx) *probeCall

// probeCall is a challenge probe a handler needs, and what to do with its
// result. The probe is made in the handler's pool task — the pool bounds
// how many probe answers can wake goroutines at once, which is what keeps
// a heartbeat storm off the data plane's tail (governor.go) — except for
// a degraded session, or a register whose advertise URL the last one's
// probe found unreachable: its last probe failed, so this one most likely
// waits for the whole probe timeout too, and a slot held all that time is
// a heartbeat another worker cannot get answered. Workers cut off from
// pinboard (a firewall, a wrong ADVERTISE_URL) thus hold a slot on their
// first failing heartbeat or register only; from the next one on, their
// probes wait on the requests' own goroutines. On a Redis directory that
// is their first failing heartbeat through each node: a known session's
// degraded state is the probe outcome the node last recorded itself
// (directory.KnownSessions), not another node's.
type probeCall struct {
	url, secret, challenge, value string
	then                          func(ctx *fasthttp.RequestCtx, res ProbeResult, err error)
	offPool                       bool // probe off the pool: it most likely times out
}

// route picks the handler (h or p) for path and the scope it requires, answering
// 404/405 itself (nil).
func (r *Registry) route(ctx *fasthttp.RequestCtx, path []byte) (handler, probing, string) {
	post := ctx.IsPost()
	get := ctx.IsGet() || ctx.IsHead()
	var h handler
	var p probing
	var wantPost bool
	scope := attest.ScopeOperator
	switch string(path) {
	case "/registry/register":
		p, wantPost, scope = r.register, true, attest.ScopeWorker
	case "/registry/heartbeat":
		p, wantPost, scope = r.heartbeat, true, attest.ScopeWorker
	case "/registry/release":
		h, wantPost, scope = r.release, true, attest.ScopeWorker
	case "/registry/deregister":
		h, wantPost, scope = r.deregister, true, attest.ScopeWorker
	case "/registry/drain":
		h, wantPost = r.drain, true
	case "/registry/undrain":
		h, wantPost = r.undrain, true
	case "/registry/wind-down":
		h, wantPost = r.windDown, true
	case "/registry/workers":
		h = r.workers
	case "/registry/health":
		h = r.health
	case "/registry/placement":
		h = r.placement
	default:
		reply(ctx, fasthttp.StatusNotFound, bodyNotFound)
		return nil, nil, ""
	}
	if (wantPost && !post) || (!wantPost && !get) {
		if wantPost {
			ctx.Response.Header.Set(fasthttp.HeaderAllow, fasthttp.MethodPost)
		} else {
			ctx.Response.Header.Set(fasthttp.HeaderAllow, "GET, HEAD")
		}
		reply(ctx, fasthttp.StatusMethodNotAllowed, bodyMethod)
		return nil, nil, ""
	}
	return h, p, scope
}

// principal authenticates the request and checks scope (R-TR-2): 401
// without an accepted credential, 403 without the scope.
func (r *Registry) principal(ctx *fasthttp.RequestCtx, scope string) *attest.Principal {
	// Authenticated once per request: ServeHTTP checks the credential
	// before the pool task, and the handler asks again for the principal.
	pr, _ := ctx.UserValue(principalKey{}).(*attest.Principal)
	if pr == nil {
		var err error
		pr, err = r.passport.Authenticate(ctx.Request.Header.Peek(fasthttp.HeaderAuthorization))
		if err != nil || pr == nil {
			reply(ctx, fasthttp.StatusUnauthorized, bodyUnauthorized)
			// RFC 9110 §15.5.2: a 401 MUST carry a challenge; the
			// credential is a bearer token (RFC 6750).
			ctx.Response.Header.Set(fasthttp.HeaderWWWAuthenticate, "Bearer")
			return nil
		}
		ctx.SetUserValue(principalKey{}, pr)
	}
	if !pr.HasScope(scope) {
		reply(ctx, fasthttp.StatusForbidden, bodyForbidden)
		return nil
	}
	return pr
}

func (r *Registry) opContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), r.opTime)
}

// storeFailed answers a store error that is not one of the domain errors.
// It logs at most one line a second, counting the failures it did not
// log: while the directory is down every heartbeat fails, and a fleet of
// 10,000 workers on 3 s heartbeats logged 3,333 lines a second through
// each node (pinboard_registry_heartbeats_total{outcome="unavailable"}
// counts them all).
func (r *Registry) storeFailed(ctx *fasthttp.RequestCtx, op string, err error) {
	if sec := r.now().Unix(); r.failLogged.Swap(sec) != sec {
		r.log.Warn("registry operation failed", "op", op, "err", err, "notLogged", r.failQuiet.Swap(0))
	} else {
		r.failQuiet.Add(1)
	}
	replyRetry(ctx, bodyUnavailable, 1)
}

// ms converts a duration to whole milliseconds, never negative.
func ms(d time.Duration) int64 {
	if d < 0 {
		return 0
	}
	return d.Milliseconds()
}

// seconds converts a duration to seconds with millisecond precision, never
// negative: control message and drain deadlines are "seconds from now,
// computed at delivery; 0 once passed" (R-CM-1, R-LS-5).
func seconds(d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(d.Milliseconds()) / 1000
}
