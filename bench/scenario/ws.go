package scenario

import (
	"context"

	"github.com/pinboard-go/pinboard/bench"
)

// ws is WebSocket echo: 64 connections (each to its own hot id), each
// sending a 128-byte binary message and waiting for the echo. The
// handshake is not timed; each Do is one round trip through the relay.
func (r *runner) ws(ctx context.Context) error {
	ws, err := r.fl.workers()
	if err != nil {
		return err
	}
	var rate float64
	doersFor := func(t *target) func(int) (bench.Doer, error) {
		rt := newRoute(t, ws)
		wt := &bench.WSTarget{Size: r.sz.wsSize, Path: func(w int) (string, []string) {
			return string(rt.appendPath(nil, w, "/bench", HotID(w), "ws")), rt.headers(w)
		}}
		return func(w int) (bench.Doer, error) {
			c := *wt
			c.Addr = rt.addr(w)
			return c.NewDoer(w)
		}
	}
	for round := 1; round <= r.cfg.Rounds; round++ {
		order := orderFor(allTargets, round)
		for _, name := range order {
			if err := ctx.Err(); err != nil {
				return err
			}
			t := r.tgt[name]
			if _, err := r.measure("ws", "peak", round, t, &bench.Loop{Duration: r.sz.peak, Workers: r.sz.wsConns}, doersFor(t)); err != nil {
				return err
			}
		}
		if rate == 0 {
			rate = openRate(r.res.agg("ws", "peak", nginx).RPS, r.res.agg("ws", "peak", pinboard).RPS)
			r.res.fact("ws.rate", rate)
		}
		for _, name := range order {
			t := r.tgt[name]
			l := &bench.Loop{Rate: rate, Duration: r.sz.latency, Workers: r.sz.wsConns}
			if _, err := r.measure("ws", "latency", round, t, l, doersFor(t)); err != nil {
				return err
			}
		}
	}
	return nil
}
