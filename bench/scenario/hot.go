package scenario

import (
	"context"
	"math"
	"time"

	"github.com/pinboard-go/pinboard/bench"
)

var allTargets = []string{direct, nginx, pinboard}

// hotTargets are the hot-ids scenario's: the three, and between nginx and
// pinboard the relays that show what a Go proxy spends per request with
// the HTTP work taken out (package bench/relay).
var hotTargets = []string{direct, nginx, relayGoroutine, relayEpoll, pinboard}

// targetsIn returns the names of names that r has a target for.
func (r *runner) targetsIn(names []string) []string {
	var have []string
	for _, n := range names {
		if r.tgt[n] != nil {
			have = append(have, n)
		}
	}
	return have
}

// hot is the steady state: 1000 placed ids, small JSON answers.
//
// The relays, when they run, are measured like nginx (viaWorker), and
// the open-loop rate stays a third of the slower proxy's peak (nginx's or
// pinboard's).
//
// Each round runs, per target, a short warm-up, then a closed-loop peak
// (64 connections, as fast as answers come) and, once every target's peak
// is known, an open-loop latency run at one fixed rate for all targets:
// a third of the slower proxy's first-round peak, so every target runs
// well below saturation (the generator and the fleet share the CPUs) and
// latency is compared at equal load.
func (r *runner) hot(ctx context.Context) error {
	ws, err := r.fl.workers()
	if err != nil {
		return err
	}
	// Recorded for the report: runs before it rotated one place a round.
	r.res.fact("hot.order", "spread")
	for round := 1; round <= r.cfg.Rounds; round++ {
		order := spreadOrder(r.targetsIn(hotTargets), round, r.cfg.Rounds)
		for _, name := range order {
			if err := ctx.Err(); err != nil {
				return err
			}
			t := r.tgt[name]
			rt := newRoute(t, ws)
			doers := rt.fixedDoers(rt.hotRequests("/bench", r.sz.hotIDs, "json"))
			warm := &bench.Loop{Duration: r.sz.warmup, Workers: r.sz.conns}
			if _, err := warm.RunContext(ctx, doers); err != nil {
				return err
			}
			if _, err := r.measure("hot", "peak", round, t, &bench.Loop{Duration: r.sz.peak, Workers: r.sz.conns}, doers); err != nil {
				return err
			}
		}
		if r.rate == 0 {
			r.rate = openRate(r.res.agg("hot", "peak", nginx).RPS, r.res.agg("hot", "peak", pinboard).RPS)
			r.res.fact("hot.rate", r.rate)
			r.logf("open-loop rate for latency runs: %.0f req/s", r.rate)
		}
		for _, name := range order {
			t := r.tgt[name]
			rt := newRoute(t, ws)
			doers := rt.fixedDoers(rt.hotRequests("/bench", r.sz.hotIDs, "json"))
			l := &bench.Loop{Rate: r.rate, Duration: r.sz.latency, Workers: r.sz.openConns}
			if _, err := r.measure("hot", "latency", round, t, l, doers); err != nil {
				return err
			}
		}
	}
	return nil
}

// openRate is a third of the slower proxy's peak, rounded down to 500/s.
func openRate(peaks ...float64) float64 {
	lo := math.Inf(1)
	for _, p := range peaks {
		if p > 0 {
			lo = min(lo, p)
		}
	}
	if math.IsInf(lo, 1) {
		return 1000
	}
	return max(500, math.Floor(lo/3/500)*500)
}

// sleepCtx sleeps d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
