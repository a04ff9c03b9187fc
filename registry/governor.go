package registry

import (
	"context"
	"log/slog"
	"math"
	rtmetrics "runtime/metrics"
	"sync/atomic"
	"time"
)

// governor sizes the registry pool from what the process can run without
// delaying the data plane.
//
// Go's scheduler has no priorities: a registry goroutine that is runnable
// competes for a P with every proxied request. A pool sized for slow probes
// (many handlers waiting on the network at once) lets a burst of heartbeats
// on a busy node make that many goroutines runnable together, and a proxied
// request then queues behind all of them. The heartbeat storm measured it
// (docs/bench/HISTORY.md, "Heartbeat storm"): with 10,000 workers on one 2-CPU node, a pool of 64 left
// the data plane's p99 about twice as high as a pool of 2 to 8, and the
// acks were no faster. The default floor, 4×GOMAXPROCS, measured the best
// acks of the small pools (14–18 ms p99 against 22–29 ms at 2×GOMAXPROCS)
// for the same data-plane p99.
//
// A fixed small pool is wrong too: a handler waits on its challenge probe
// (a degraded session's waits off the pool, see probeCall) and on the
// store, so the concurrency a node needs is the request rate times that
// wait — a few here, dozens across zones.
// The governor adapts between the two with AIMD on the signal that matters,
// the process's goroutine scheduling latency (runtime/metrics
// /sched/latencies:seconds, the time runnable goroutines wait for a P):
//
//   - a registry task waited past maxWait in the queue, or the queue has
//     not moved for maxWait — tasks waiting and none leaving it at any
//     step (every worker stuck, say on a store that stopped answering, so
//     no wait has ended to be recorded): double,
//     whatever the scheduling latency — leases must not lapse because the
//     control plane was throttled (liveness comes before latency);
//   - the window's scheduling-latency p99 is over target: shrink by a
//     quarter, not below min;
//   - tasks queued (waited past busyWait) and latency is fine: grow by an
//     eighth, at least one, up to max.
//
// Only the step goroutine changes the capacity; the counters it reads are
// updated by pool tasks with atomics.
type governor struct {
	pool interface {
		Cap() int
		Tune(int)
		Waiting() int
	}
	min, max int
	// interval is the time between steps.
	interval time.Duration
	// target is the scheduling-latency p99 above which the pool shrinks.
	target time.Duration
	// busyWait and maxWait classify the longest queue wait of a window.
	busyWait, maxWait time.Duration
	// sched returns the scheduling-latency p99 since the previous call
	// (ok false when too few goroutines were scheduled to tell).
	sched func() (p99 time.Duration, ok bool)
	// log receives one debug line per capacity change.
	log *slog.Logger
	// longestWait is the longest queue wait seen since the last step, in ns.
	longestWait atomic.Int64
	// queuedSteps counts consecutive steps that found tasks queued and
	// none taken from the queue since the step before; only the step
	// goroutine uses it.
	queuedSteps int
}

// Governor defaults. A step every 200 ms sees enough scheduling events to
// tell (the runtime records the latency of one goroutine transition in
// eight). The 1 ms target is about the data plane's p99 on an idle node
// (BENCHMARKS.md, hot ids): above it, requests are waiting for a CPU. A
// heartbeat's own work is a fraction of a millisecond, so a task that
// waited 2 ms for a pool worker says the pool, not the CPU, is short; the
// storm measured 10 ms instead to cost the acks' p99 (16 → 73 ms) and buy
// the data plane nothing it could tell from noise. A task queued 1 s — a
// third of a heartbeat interval — grows the pool regardless.
const (
	governorInterval = 200 * time.Millisecond
	governorTarget   = time.Millisecond
	governorBusyWait = 2 * time.Millisecond
	governorMaxWait  = time.Second
)

// waited records how long a task sat in the queue before a pool worker
// took it. Safe for concurrent use.
func (g *governor) waited(d time.Duration) {
	for {
		cur := g.longestWait.Load()
		if int64(d) <= cur || g.longestWait.CompareAndSwap(cur, int64(d)) {
			return
		}
	}
}

// step makes one adjustment and returns the new capacity.
func (g *governor) step() int {
	c := g.pool.Cap()
	wait := time.Duration(g.longestWait.Swap(0))
	p99, ok := g.sched()
	// Every task that left the queue recorded a wait, however short: none
	// recorded while tasks wait means the queue did not move.
	if wait == 0 && g.pool.Waiting() > 0 {
		g.queuedSteps++
	} else {
		g.queuedSteps = 0
	}
	stuck := time.Duration(g.queuedSteps)*g.interval >= g.maxWait
	next := c
	switch {
	case wait >= g.maxWait || stuck:
		next = 2 * c
	case ok && p99 > g.target:
		next = c - max(1, c/4)
	case wait >= g.busyWait:
		next = c + max(1, c/8)
	}
	next = min(max(next, g.min), g.max)
	if next != c {
		g.pool.Tune(next)
		g.log.Debug("registry capacity", "from", c, "to", next, "schedP99", p99, "longestWait", wait, "queuedFor", time.Duration(g.queuedSteps)*g.interval)
	}
	return next
}

// run steps every g.interval until ctx ends.
func (g *governor) run(ctx context.Context) {
	t := time.NewTicker(g.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			g.step()
		}
	}
}

// schedLatency reads /sched/latencies:seconds and reports the p99 of the
// goroutine scheduling latencies recorded since its previous call. It is
// not safe for concurrent use (one governor owns it).
type schedLatency struct {
	sample [1]rtmetrics.Sample
	prev   []uint64
	delta  []uint64
}

// minScheduled: fewer scheduling events in a window say nothing about
// contention (an idle node).
const minScheduled = 100

func newSchedLatency() *schedLatency {
	s := &schedLatency{}
	s.sample[0].Name = "/sched/latencies:seconds"
	s.p99() // the first window starts now
	return s
}

func (s *schedLatency) p99() (time.Duration, bool) {
	rtmetrics.Read(s.sample[:])
	if s.sample[0].Value.Kind() != rtmetrics.KindFloat64Histogram {
		return 0, false
	}
	h := s.sample[0].Value.Float64Histogram()
	if len(s.prev) != len(h.Counts) {
		s.prev = append(s.prev[:0], h.Counts...)
		s.delta = make([]uint64, len(h.Counts))
		return 0, false
	}
	var total uint64
	for i, c := range h.Counts {
		s.delta[i] = c - s.prev[i]
		s.prev[i] = c
		total += s.delta[i]
	}
	return histogramP99(s.delta, h.Buckets, total)
}

// histogramP99 is the upper bound of the bucket holding the 99th
// percentile; buckets has one more entry than counts (runtime/metrics).
// Reading the upper bound errs toward "over target": with the runtime's
// buckets, a p99 from about 0.92 ms up reads as 1.05 ms.
func histogramP99(counts []uint64, buckets []float64, total uint64) (time.Duration, bool) {
	if total < minScheduled {
		return 0, false
	}
	rank := total - total/100
	var seen uint64
	for i, c := range counts {
		seen += c
		if seen >= rank {
			upper := buckets[i+1]
			if math.IsInf(upper, 1) { // the last bucket is open
				upper = buckets[i]
			}
			return time.Duration(upper * float64(time.Second)), true
		}
	}
	return 0, false
}
