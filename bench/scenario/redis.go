package scenario

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/pinboard-go/pinboard/bench"
)

// redis repeats the hot-ids scenario on a second pinboard node whose
// directory is Redis (REDIS_URL=redis://…), against nginx in the same
// rounds. RedisURL "auto" starts a private redis-server on a free port.
// When this build of pinboard has no Redis store the scenario is skipped.
func (r *runner) redis(ctx context.Context) error {
	url, stop, err := r.startRedis("redis")
	if err != nil {
		return err
	}
	defer stop()
	node, err := r.ps.startPinboard("pinboard-redis", r.cfg.PinboardBin, url, r.cfg.PinboardEnv)
	if err != nil {
		return &skipError{fmt.Sprintf("pinboard did not start on %s: %v", url, err)}
	}
	defer node.stop(10 * time.Second)
	rf, err := r.ps.startFleet("fleet-redis", r.cfg.PinbenchBin, node.url, r.sz.fleetWorkers, 4, "/bench", 2*time.Minute)
	if err != nil {
		return err
	}
	defer rf.stop(30 * time.Second)
	r.res.fact("redis.fleetWorkers", r.sz.fleetWorkers)
	if err := waitPlacements(ctx, node, "/bench/"+HotID(0)+"/json", 90*time.Second); err != nil {
		return err
	}
	t := &target{name: "pinboard-redis", addrs: []string{node.addr}, pid: node.pid()}
	if err := r.placeHot(t); err != nil {
		return err
	}
	ws, err := r.fl.workers()
	if err != nil {
		return err
	}
	if r.rate == 0 {
		r.rate = 2000
	}
	for round := 1; round <= r.cfg.Rounds; round++ {
		for _, name := range orderFor([]string{nginx, "pinboard-redis"}, round) {
			tt := t
			if name == nginx {
				tt = r.tgt[nginx]
			}
			rt := newRoute(tt, ws)
			doers := rt.fixedDoers(rt.hotRequests("/bench", r.sz.hotIDs, "json"))
			if _, err := r.measure("redis", "peak", round, tt, &bench.Loop{Duration: r.sz.peak, Workers: r.sz.conns}, doers); err != nil {
				return err
			}
			// Background: what Redis executes with no requests at all
			// (the fleet's heartbeats, pinboard's sweeps), measured in an
			// idle window so it can be told apart from what requests cost.
			var bg float64 = -1
			if name != nginx {
				if b0 := redisCommands(url); b0 >= 0 {
					t0 := time.Now()
					sleepCtx(ctx, redisIdleWindow)
					if b1 := redisCommands(url); b1 >= 0 {
						bg = float64(b1-b0) / time.Since(t0).Seconds()
					}
				}
			}
			c0, t0 := redisCommands(url), time.Now()
			rec, err := r.measure("redis", "latency", round, tt, &bench.Loop{Rate: r.rate, Duration: r.sz.latency, Workers: r.sz.openConns}, doers)
			if err != nil {
				return err
			}
			if c1 := redisCommands(url); name != nginx && c0 >= 0 && c1 >= 0 && rec.Summary.OK > 0 {
				total := float64(c1 - c0)
				r.res.appendFact("redis.commandsPerRequest", total/float64(rec.Summary.OK))
				if bg >= 0 {
					r.res.appendFact("redis.backgroundPerSecond", bg)
					caused := max(0, total-bg*time.Since(t0).Seconds())
					r.res.appendFact("redis.requestCommandsPerRequest", caused/float64(rec.Summary.OK))
				}
			}
		}
	}
	return nil
}

// startRedis returns the Redis URL a scenario's nodes use: the configured
// one, or, for "auto", a private redis-server (process name) on a free port (without
// persistence), stopped by the returned func. A skipError when there is
// none.
func (r *runner) startRedis(name string) (string, func(), error) {
	url := r.cfg.RedisURL
	if url == "" {
		return "", nil, &skipError{"no Redis URL given (make bench BENCH_REDIS=auto)"}
	}
	if url != "auto" {
		return url, func() {}, nil
	}
	port, err := freePort()
	if err != nil {
		return "", nil, err
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		return "", nil, &skipError{"redis-server is not installed"}
	}
	rp, err := r.ps.start(name, r.cfg.FleetCPU, baseEnv(), []string{"redis-server", "--bind", "127.0.0.1", "--port", strconv.Itoa(port),
		"--save", "", "--appendonly", "no", "--protected-mode", "no"}, nil)
	if err != nil {
		return "", nil, err
	}
	url = "redis://127.0.0.1:" + strconv.Itoa(port)
	deadline := time.Now().Add(10 * time.Second)
	for redisCommands(url) < 0 {
		if rp.exited() || time.Now().After(deadline) {
			rp.stop(5 * time.Second)
			return "", nil, fmt.Errorf("redis-server on %s did not answer within 10 s; see %s.log", url, name)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return url, func() { rp.stop(5 * time.Second) }, nil
}

// redisIdleWindow is how long the background command rate is sampled
// before each measured phase.
const redisIdleWindow = 3 * time.Second

// redisCommands is INFO stats' total_commands_processed, or -1.
func redisCommands(url string) int64 {
	out, err := exec.Command("redis-cli", "-u", url, "info", "stats").Output()
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_commands_processed:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err == nil {
				return n
			}
		}
	}
	return -1
}
