package scenario

import (
	"context"
	"fmt"

	"github.com/pinboard-go/pinboard/bench"
	"github.com/pinboard-go/pinboard/bench/fleet"
)

// churn measures hot-id traffic through pinboard while workers leave and
// join: every 250 ms one worker deregisters (its ids re-place on their
// next request) and a new one registers. Windows with and without churn
// alternate; nginx has no placements to lose, so pinboard runs alone.
func (r *runner) churn(ctx context.Context) error {
	if r.rate == 0 {
		r.rate = 2000
	}
	t := r.tgt[pinboard]
	rt := newRoute(t, nil)
	doers := rt.fixedDoers(rt.hotRequests("/bench", r.sz.hotIDs, "json"))
	for round := 1; round <= r.cfg.Rounds; round++ {
		phases := []bool{false, true}
		if round%2 == 0 {
			phases = []bool{true, false}
		}
		for _, on := range phases {
			if err := ctx.Err(); err != nil {
				return err
			}
			phase := "steady"
			if on {
				phase = "churn"
				q := fmt.Sprintf("/churn?every=%d&grace=1000", r.sz.churnEvery.Milliseconds())
				if err := r.fl.call("POST", q, nil); err != nil {
					return err
				}
			}
			l := &bench.Loop{Rate: r.rate, Duration: r.sz.churnPhase, Workers: r.sz.openConns}
			r.noRepeat = true // the churn runs across the whole phase
			_, err := r.measure("churn", phase, round, t, l, doers)
			r.noRepeat = false
			cp := ChurnPhase{Round: round, Churn: on}
			if on {
				var cr fleet.ChurnResult
				if cerr := r.fl.call("POST", "/churn/stop", &cr); cerr != nil && err == nil {
					err = cerr
				}
				cp.Left, cp.Joined, cp.Errors = cr.Left, cr.Joined, cr.Errors
				r.logf("    churn: %d left, %d joined, %d churn errors", cr.Left, cr.Joined, cr.Errors)
			}
			if err != nil {
				return err
			}
			r.res.mu.Lock()
			r.res.Churn = append(r.res.Churn, cp)
			r.res.mu.Unlock()
		}
	}
	return nil
}
