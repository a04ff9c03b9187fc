package scenario

import (
	"context"
	"fmt"
	"time"

	"github.com/pinboard-go/pinboard/bench"
)

// cold sends every request to a new id: each one is a placement (R-PL-1:
// the store claims the id on a worker, biased by headroom and client-IP
// affinity) before it is forwarded. A fleet of its own serves /cold so
// its placements go when it deregisters at the end. The baselines send
// the same new-id requests to the main fleet: for them nothing changes.
func (r *runner) cold(ctx context.Context) error {
	cf, err := r.ps.startFleet("fleet-cold", r.cfg.PinbenchBin, r.pb.url, r.sz.fleetWorkers, 4, "/cold", 2*r.sz.peak+time.Minute)
	if err != nil {
		return err
	}
	defer cf.stop(30 * time.Second)
	ws, err := r.fl.workers()
	if err != nil {
		return err
	}
	var rate float64
	for round := 1; round <= r.cfg.Rounds; round++ {
		order := orderFor(allTargets, round)
		for _, name := range order {
			if err := ctx.Err(); err != nil {
				return err
			}
			t := r.tgt[name]
			rt := newRoute(t, ws)
			doers := rt.coldDoers("/cold", fmt.Sprintf("%dp", round), "json")
			if _, err := r.measure("cold", "peak", round, t, &bench.Loop{Duration: r.sz.coldPeak, Workers: r.sz.conns}, doers); err != nil {
				return err
			}
		}
		if rate == 0 {
			rate = openRate(r.res.agg("cold", "peak", nginx).RPS, r.res.agg("cold", "peak", pinboard).RPS)
			r.res.fact("cold.rate", rate)
		}
		for _, name := range order {
			t := r.tgt[name]
			rt := newRoute(t, ws)
			doers := rt.coldDoers("/cold", fmt.Sprintf("%dl", round), "json")
			l := &bench.Loop{Rate: rate, Duration: r.sz.coldLatency, Workers: r.sz.openConns}
			if _, err := r.measure("cold", "latency", round, t, l, doers); err != nil {
				return err
			}
		}
	}
	return nil
}
