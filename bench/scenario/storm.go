package scenario

import (
	"context"
	"math"
	"time"

	"github.com/pinboard-go/pinboard/bench"
	"github.com/pinboard-go/pinboard/bench/fleet"
)

// stormTargets are the data planes measured with the storm on and off.
// The storm is aimed at pinboard's registry in every window; nginx and
// direct are the same run's baselines for what a busy machine alone does
// to a tail: the storm fleet, sending the heartbeats and answering the
// probes, shares the two CPUs with every data plane, and pinboard's
// registry work is there in their windows too. Pinboard's impact beyond
// theirs is what its own control plane costs its data plane.
var stormTargets = []string{pinboard, nginx, direct}

// storm registers 10,000 virtual workers (2,000 in quick mode) on the one
// pinboard node, heartbeating every 3 s: 3,333 heartbeats a second, each
// with its challenge probe back to the worker. Data-plane windows at a
// quarter of the hot rate, through each target in turn, alternate
// between storm on and storm paused (heartbeats held for one window,
// well inside the 15 s lease), measuring heartbeat ack latency and what
// the storm does to data-plane latency.
func (r *runner) storm(ctx context.Context) error {
	ws, err := r.fl.workers()
	if err != nil {
		return err
	}
	n := r.sz.stormWorkers
	r.logf("    registering %d workers…", n)
	start := time.Now()
	sf, err := r.ps.startFleet("fleet-storm", r.cfg.PinbenchBin, r.pb.url, n, 64, "/storm", 5*time.Minute)
	if err != nil {
		return err
	}
	defer sf.stop(60 * time.Second)
	r.res.fact("storm.workers", n)
	r.res.fact("storm.registerS", time.Since(start).Seconds())
	r.logf("    %d workers registered in %.1fs", n, time.Since(start).Seconds())
	// Three intervals before the first window: the storm is the steady
	// heartbeat load, and the seconds after 10,000 registrations at once are
	// their aftermath (ack p99 82–129 ms in a window starting one interval
	// after, 37 ms in one starting three after; docs/bench/HISTORY.md). The
	// registration itself is reported on its own (storm.registerS).
	sleepCtx(ctx, 9500*time.Millisecond)
	sr := &stormRun{scn: "storm", sf: sf, n: n, rate: r.stormRate(), order: stormTargets, tgt: r.tgt, ws: ws}
	r.res.fact("storm.rate", sr.rate)
	return r.stormRounds(ctx, sr)
}

// stormRun is one storm scenario's measured part: its storm fleet, and
// the data planes measured with the storm on and paused.
type stormRun struct {
	scn   string // "storm" or "storm-split": the records' scenario
	sf    *fleetProc
	n     int     // storm workers
	rate  float64 // data-plane req/s
	order []string
	tgt   map[string]*target // by name, every name in order
	ws    []fleet.WorkerInfo // the main fleet: the baselines' backends
}

// stormRate is the storm scenarios' data-plane rate. The storm alone
// takes most of this machine (pinboard's registry and the storm fleet,
// which in production runs elsewhere): the data plane runs at a quarter
// of the hot rate, so that what is measured is the storm's effect on it
// rather than a saturated machine.
func (r *runner) stormRate() float64 {
	if r.rate == 0 {
		r.rate = 2000
	}
	return max(500, math.Floor(r.rate/4/100)*100)
}

// stormRounds measures sr's data planes in rotating order, one pair of
// windows (storm on, storm paused) each per round. One round more than
// configured: an even count, so that as many rounds put the storm-on
// window first as put it second (the order alternates per round), and
// with the default three rounds, four: storm-split's four data planes
// each run once in each place of the rotation.
func (r *runner) stormRounds(ctx context.Context, sr *stormRun) error {
	rounds := r.cfg.Rounds + 1
	for round := 1; round <= rounds; round++ {
		for _, name := range orderFor(sr.order, round) {
			t := sr.tgt[name]
			// Minted per target and round: a baseline's attestations last
			// about a minute, and one target's pair of windows is 16 s.
			rt := newRoute(t, sr.ws)
			doers := rt.fixedDoers(rt.hotRequests("/bench", r.sz.hotIDs, "json"))
			phases := []bool{true, false}
			if round%2 == 0 {
				phases = []bool{false, true}
			}
			for _, on := range phases {
				if err := r.stormWindow(ctx, sr, t, doers, round, on); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// stormWindow measures one data-plane window of sr through t with the
// storm on, or paused for the window's length.
func (r *runner) stormWindow(ctx context.Context, sr *stormRun, t *target, doers func(int) (bench.Doer, error), round int, on bool) error {
	sf := sr.sf
	if err := ctx.Err(); err != nil {
		return err
	}
	phase := "storm-on"
	r.waitQuiet(ctx)
	if !on {
		phase = "storm-off"
		if err := sf.call("POST", "/pause", nil); err != nil {
			return err
		}
		sleepCtx(ctx, 300*time.Millisecond) // heartbeats in flight finish
	}
	if _, err := sf.stats(true); err != nil {
		return err
	}
	l := &bench.Loop{Rate: sr.rate, Duration: r.sz.stormPhase, Workers: r.sz.openConns}
	r.noQuietWait = true
	_, err := r.measure(sr.scn, phase, round, t, l, doers)
	r.noQuietWait = false
	if err != nil {
		return err
	}
	st, serr := sf.stats(true)
	if !on {
		if err := sf.call("POST", "/resume", nil); err != nil {
			return err
		}
	}
	if serr != nil {
		return serr
	}
	r.res.mu.Lock()
	r.res.Storm = append(r.res.Storm, StormPhase{Scenario: sr.scn, Round: round, On: on, Workers: sr.n, Acks: st})
	r.res.mu.Unlock()
	if on {
		r.logf("    %s: %d heartbeats (%v), ack p50 %s p99 %s max %s, degraded %d",
			sr.scn, st.Heartbeats, st.ByStatus, bench.FmtUs(st.AckP50us), bench.FmtUs(st.AckP99us), bench.FmtUs(st.AckMaxUs), st.Degraded)
	}
	if !on {
		// Resumed heartbeats arrive within one interval; let the next "on"
		// window start with the storm at full rate.
		sleepCtx(ctx, 3*time.Second)
	}
	return nil
}
