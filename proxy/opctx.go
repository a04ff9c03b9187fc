package proxy

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// opContexts hands out the contexts that bound store operations on the
// request path (placements, cluster-call session checks, releases).
//
// A context.WithTimeout per operation costs a runtime timer (and an
// allocation) each time: measured in BenchmarkColdPath it was as
// expensive as the memory store's whole placement. Operations started
// within the same second share one context instead, whose deadline is
// d plus one second after the first of them: every operation is bounded
// by at least d and at most d+1s. Expired contexts are cancelled (their
// timers released) when they leave a small ring of recent ones.
//
// Safe for concurrent use.
type opContexts struct {
	d   time.Duration
	cur atomic.Pointer[opCtx]

	mu   sync.Mutex
	ring [8]*opCtx
	next int
}

type opCtx struct {
	ctx    context.Context
	cancel context.CancelFunc
	until  int64 // unix ns: hand this context out until then
}

// get returns a context bounding an operation starting now (wall clock:
// deadlines are real time whatever clock the proxy runs on).
func (o *opContexts) get() context.Context { return o.at(time.Now()) }

func (o *opContexts) at(now time.Time) context.Context {
	ns := now.UnixNano()
	if c := o.cur.Load(); c != nil && ns < c.until && ns >= c.until-int64(time.Second) {
		return c.ctx
	}
	return o.rotate(now)
}

func (o *opContexts) rotate(now time.Time) context.Context {
	o.mu.Lock()
	defer o.mu.Unlock()
	ns := now.UnixNano()
	if c := o.cur.Load(); c != nil && ns < c.until && ns >= c.until-int64(time.Second) {
		return c.ctx // another goroutine rotated first
	}
	ctx, cancel := context.WithDeadline(context.Background(), now.Add(o.d+time.Second))
	c := &opCtx{ctx: ctx, cancel: cancel, until: ns + int64(time.Second)}
	// The evicted context was handed out len(ring)-1 rotations ago: its
	// deadline has normally passed and cancel only releases it. Should the
	// wall clock have jumped, a context still running is left to expire
	// by its own timer.
	if old := o.ring[o.next]; old != nil {
		if dl, _ := old.ctx.Deadline(); !now.Before(dl) {
			old.cancel()
		}
	}
	o.ring[o.next] = c
	o.next = (o.next + 1) % len(o.ring)
	o.cur.Store(c)
	return ctx
}
