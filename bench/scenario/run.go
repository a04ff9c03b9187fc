// Package scenario runs pinboard's benchmark scenarios against the real
// binary and two baselines in one go (issue 5, BENCHMARKS.md):
//
//   - direct: the load generator talks to the simulated fleet itself;
//   - nginx: Debian's nginx-light in front of the same fleet;
//   - pinboard: cmd/pinboard (REDIS_URL=memory:) in front of the fleet,
//     resolving every request's owner and attesting it.
//
// Every process runs on 127.0.0.1, each in its own process group, killed
// when the run ends. Rounds alternate the order of the targets
// (A/B/C, B/C/A, C/A/B) so slow drift of a noisy machine cancels out.
package scenario

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pinboard-go/pinboard/bench"
)

// Config is one benchmark run. Zero values take the defaults.
type Config struct {
	// Quick shortens everything (make bench BENCH_QUICK=1).
	Quick bool
	// Rounds per scenario; default 3 (1 when Quick).
	Rounds int
	// Scenarios to run, by name; empty runs all (see Scenarios).
	Scenarios []string
	// PinboardBin and PinbenchBin are the built binaries; NginxBin is
	// nginx (default "nginx" on PATH).
	PinboardBin, PinbenchBin, NginxBin string
	// OutDir receives results.json, plots and process logs.
	OutDir string
	// Markdown, when set, is the BENCHMARKS.md to rewrite.
	Markdown string
	// PlotDir, when set, receives copies of the plots BENCHMARKS.md shows.
	PlotDir string
	// ProxyCPU, FleetCPU and GenCPU are taskset CPU lists ("1", "0-1")
	// for the proxies (pinboard, nginx), the fleets and the load
	// generator (this process). Empty: every CPU.
	ProxyCPU, FleetCPU, GenCPU string
	// PinboardEnv is extra KEY=VALUE environment for pinboard nodes
	// (GOMAXPROCS=1, GOGC=…), noted in the results.
	PinboardEnv []string
	// NginxWorkers is nginx's worker_processes; default one per CPU in
	// ProxyCPU (every CPU when it is empty).
	NginxWorkers int
	// RedisURL, when set (redis://…, or "auto" for a private
	// redis-server), adds the scenarios on the Redis store: hot ids on a
	// Redis node ("redis") and the heartbeat storm with the registry on a
	// node apart from the data plane ("storm-split").
	RedisURL string
	// Log receives progress lines; default os.Stderr.
	Log io.Writer
	// Plot draws the PNG plots; nil skips them (see bench/plot).
	Plot func(res *Results, dir string) ([]string, error)
}

// Scenarios are the scenario names in the order they run. Large bodies
// run before SSE: the idle streams leave the proxy holding their memory
// (pinboard's RSS stays at its with-streams figure, ~80 MiB over its
// before), and a transfer measured after them reuses that memory, so its
// RSS growth would read +0 MiB whatever it allocated.
var Scenarios = []string{"hot", "ws", "large", "sse", "cold", "churn", "storm", "redis", "storm-split"}

// sizes are the knobs Quick shrinks.
type sizes struct {
	warmup, peak, latency    time.Duration
	hotIDs, conns, openConns int
	fleetWorkers             int
	wsConns, wsSize          int
	sseStreams, sseEvents    int
	sseIdle                  int
	large                    int64
	coldPeak, coldLatency    time.Duration
	churnEvery, churnPhase   time.Duration
	stormWorkers             int
	stormPhase               time.Duration
}

func sizesFor(quick bool) sizes {
	if quick {
		return sizes{
			warmup: time.Second, peak: 3 * time.Second, latency: 3 * time.Second,
			hotIDs: 1000, conns: 64, openConns: 128, fleetWorkers: 16,
			wsConns: 64, wsSize: 128,
			sseStreams: 300, sseEvents: 4, sseIdle: 2000,
			large:    256 << 20,
			coldPeak: 3 * time.Second, coldLatency: 3 * time.Second,
			churnEvery: 250 * time.Millisecond, churnPhase: 4 * time.Second,
			stormWorkers: 2000, stormPhase: 4 * time.Second,
		}
	}
	return sizes{
		warmup: 2 * time.Second, peak: 8 * time.Second, latency: 10 * time.Second,
		hotIDs: 1000, conns: 64, openConns: 128, fleetWorkers: 16,
		wsConns: 64, wsSize: 128,
		sseStreams: 2000, sseEvents: 10, sseIdle: 10000,
		large:    1 << 30,
		coldPeak: 6 * time.Second, coldLatency: 8 * time.Second,
		churnEvery: 250 * time.Millisecond, churnPhase: 10 * time.Second,
		stormWorkers: 10000, stormPhase: 6 * time.Second,
	}
}

type runner struct {
	cfg  Config
	sz   sizes
	ps   *procs
	res  *Results
	log  io.Writer
	tty  bool
	self int

	pb  *pinboardNode
	ng  *nginxProc
	fl  *fleetProc
	tgt map[string]*target
	// rate is the hot open-loop rate, fixed after the first round.
	rate float64
	// quietBudget is what is left of the time the run may spend waiting
	// for other processes' load to settle before phases.
	quietBudget time.Duration
	// noQuietWait: the caller already waited (the storm must not hold its
	// heartbeats past a lease while waiting); nor does measure repeat
	// such a phase, which would hold them as long.
	noQuietWait bool
	// repeatBudget is what is left of the time the run may spend
	// measuring again phases that ran under other load (measure).
	repeatBudget time.Duration
	// noRepeat: a phase is measured once whatever the load (the churn's
	// windows, whose churn runs across the phase).
	noRepeat bool
	// ctx is the run's (Run's): Ctrl-C ends the phase under way, its
	// quiet wait and its repeats, not only the scenarios after it.
	ctx context.Context
	// once measures one attempt of a phase: measureOnce, or a test's.
	once func(scn, phase string, round int, t *target, l *bench.Loop, doers func(int) (bench.Doer, error)) (*Record, time.Duration, error)
}

// Run runs the configured scenarios and writes results.json, the plots
// and (when configured) BENCHMARKS.md.
func Run(ctx context.Context, cfg Config) (*Results, error) {
	if cfg.Log == nil {
		cfg.Log = os.Stderr
	}
	if cfg.Rounds <= 0 {
		cfg.Rounds = 3
		if cfg.Quick {
			cfg.Rounds = 1
		}
	}
	if cfg.NginxWorkers <= 0 {
		cfg.NginxWorkers = nginxWorkers(cfg.ProxyCPU)
	}
	if cfg.NginxBin == "" {
		cfg.NginxBin = "nginx"
	}
	if _, err := exec.LookPath(cfg.NginxBin); err != nil && cfg.NginxBin == "nginx" {
		cfg.NginxBin = "/usr/sbin/nginx" // Debian's, when /usr/sbin is not on PATH
	}
	for _, p := range []*string{&cfg.OutDir, &cfg.PinboardBin, &cfg.PinbenchBin} {
		if abs, err := filepath.Abs(*p); err == nil {
			*p = abs
		}
	}
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.OutDir, 0o755); err != nil {
		return nil, fmt.Errorf("cannot create %s: %w", cfg.OutDir, err)
	}
	r := &runner{
		cfg: cfg, sz: sizesFor(cfg.Quick), log: cfg.Log,
		ps:   &procs{dir: cfg.OutDir, proxyCPU: cfg.ProxyCPU, fleetCPU: cfg.FleetCPU},
		res:  &Results{Quick: cfg.Quick, Rounds: cfg.Rounds, Started: time.Now(), Facts: map[string]any{}},
		self: os.Getpid(), ctx: ctx,
	}
	if f, ok := cfg.Log.(*os.File); ok {
		r.tty = bench.IsTerminal(f)
	}
	r.quietBudget = 4 * time.Minute
	r.repeatBudget = 3 * time.Minute
	if cfg.Quick {
		r.quietBudget = 30 * time.Second
		r.repeatBudget = 30 * time.Second
	}
	r.res.Machine = machine(cfg.NginxBin)
	r.res.Pinning = pinning(cfg)
	r.res.PinboardEnv = cfg.PinboardEnv
	if cfg.GenCPU != "" {
		if out, err := exec.Command("taskset", "-a", "-p", "-c", cfg.GenCPU, strconv.Itoa(os.Getpid())).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("cannot pin the generator to CPU %s: %v: %s", cfg.GenCPU, err, out)
		}
	}
	defer r.ps.stopAll()
	err := r.run(ctx)
	r.res.Finished = time.Now()
	if werr := r.res.write(filepath.Join(cfg.OutDir, "results.json")); werr != nil && err == nil {
		err = werr
	}
	if err != nil {
		return r.res, err
	}
	var plots []string
	if cfg.Plot != nil {
		if plots, err = cfg.Plot(r.res, cfg.OutDir); err != nil {
			return r.res, fmt.Errorf("cannot draw the plots: %w", err)
		}
		if cfg.PlotDir != "" {
			if err := copyFiles(plots, cfg.PlotDir); err != nil {
				return r.res, err
			}
		}
	}
	if cfg.Markdown != "" {
		if err := WriteMarkdown(cfg.Markdown, r.res, cfg.PlotDir, plots); err != nil {
			return r.res, err
		}
	}
	fmt.Fprint(r.log, "\n"+Summary(r.res))
	return r.res, nil
}

// check finds what would otherwise fail only after pinboard, a fleet and
// nginx started (or, for a misspelt scenario, run nothing and report
// success): unknown scenarios and missing programs.
func (c *Config) check() error {
	for _, name := range c.Scenarios {
		known := false
		for _, s := range Scenarios {
			known = known || s == name
		}
		if !known {
			return fmt.Errorf("unknown scenario %q (want %s)", name, strings.Join(Scenarios, ","))
		}
	}
	for _, bin := range []struct{ what, path, hint string }{
		{"the pinboard binary", c.PinboardBin, " (make build, or -pinboard)"},
		{"pinbench itself", c.PinbenchBin, ""},
		{"nginx", c.NginxBin, " (make bench-deps installs nginx-light, or -nginx)"},
		{"taskset", "taskset", " (util-linux)"},
	} {
		if _, err := exec.LookPath(bin.path); err != nil {
			return fmt.Errorf("cannot find %s %q%s: %w", bin.what, bin.path, bin.hint, err)
		}
	}
	return nil
}

func (r *runner) want(name string) bool {
	if len(r.cfg.Scenarios) == 0 {
		return (name != "redis" && name != "storm-split") || r.cfg.RedisURL != ""
	}
	for _, s := range r.cfg.Scenarios {
		if s == name {
			return true
		}
	}
	return false
}

func (r *runner) logf(format string, args ...any) {
	fmt.Fprintf(r.log, format+"\n", args...)
}

func (r *runner) run(ctx context.Context) error {
	raiseFDLimit()
	r.logf("pinbench: %d CPU(s), %s, results in %s", r.res.Machine.NProc, r.res.Machine.CPU, r.cfg.OutDir)
	var err error
	if r.pb, err = r.ps.startPinboard("pinboard", r.cfg.PinboardBin, "memory:", r.cfg.PinboardEnv); err != nil {
		return err
	}
	if r.fl, err = r.ps.startFleet("fleet", r.cfg.PinbenchBin, r.pb.url, r.sz.fleetWorkers, 4, "/bench", 2*time.Minute); err != nil {
		return err
	}
	if r.ng, err = r.ps.startNginx(r.cfg.NginxBin, r.cfg.NginxWorkers, r.fl.ports); err != nil {
		return err
	}
	var fleetAddrs []string
	for _, p := range r.fl.ports {
		fleetAddrs = append(fleetAddrs, fmt.Sprintf("127.0.0.1:%d", p))
	}
	r.tgt = map[string]*target{
		direct:   {name: direct, addrs: fleetAddrs, viaWorker: true},
		nginx:    {name: nginx, addrs: []string{r.ng.addr}, pid: r.ng.pid(), tree: true, viaWorker: true},
		pinboard: {name: pinboard, addrs: []string{r.pb.addr}, pid: r.pb.pid()},
	}
	if r.want("hot") {
		// The relays are a floor to read pinboard's figures against, not
		// a baseline: one that does not start is logged and left out.
		for _, m := range []struct{ name, mode string }{{relayGoroutine, "goroutine"}, {relayEpoll, "epoll"}} {
			rp, err := r.ps.startRelay(m.name, r.cfg.PinbenchBin, m.mode, r.cfg.NginxWorkers, r.fl.ports)
			if err != nil {
				r.logf("%s left out of the hot-ids scenario: %v", m.name, err)
				continue
			}
			r.tgt[m.name] = &target{name: m.name, addrs: []string{rp.addr}, pid: rp.pid(), viaWorker: true}
		}
	}
	r.logf("pinboard %s, nginx %s (%d workers), fleet of %d workers on ports %v",
		r.pb.addr, r.ng.addr, r.cfg.NginxWorkers, r.sz.fleetWorkers, r.fl.ports)
	r.logf("waiting out the cold-start quarantine (one lease, R-CS-1)…")
	if err := waitPlacements(ctx, r.pb, "/bench/"+HotID(0)+"/json", 60*time.Second); err != nil {
		return err
	}
	if err := r.placeHot(r.tgt[pinboard]); err != nil {
		return err
	}
	steps := r.steps()
	for _, name := range Scenarios {
		if !r.want(name) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		r.logf("\n== %s", name)
		if err := steps[name](ctx); err != nil {
			var skip *skipError
			if errors.As(err, &skip) {
				r.logf("skipped %s: %s", name, skip.why)
				r.res.Skipped = append(r.res.Skipped, name+": "+skip.why)
				continue
			}
			return fmt.Errorf("scenario %s: %w", name, err)
		}
	}
	return nil
}

// steps are the scenarios by name; they run in the order of Scenarios.
func (r *runner) steps() map[string]func(context.Context) error {
	return map[string]func(context.Context) error{
		"hot": r.hot, "ws": r.ws, "sse": r.sse, "large": r.large,
		"cold": r.cold, "churn": r.churn, "storm": r.storm, "redis": r.redis,
		"storm-split": r.stormSplit,
	}
}

// skipError is a scenario that cannot run here; the report says why.
type skipError struct{ why string }

func (e *skipError) Error() string { return e.why }

// placeHot requests every hot id once through t (pinboard, or another
// node), so the measured phases see only placed ids, cached on that node
// (cold placements are their own scenario).
func (r *runner) placeHot(t *target) error {
	rt := newRoute(t, nil)
	reqs := rt.hotRequests("/bench", r.sz.hotIDs, "json")
	d, err := rt.fixedDoers(reqs)(0)
	if err != nil {
		return err
	}
	defer d.Close()
	for i := range reqs {
		if err := d.Do(uint64(i)); err != nil {
			return fmt.Errorf("cannot place hot id %d through %s: %w", i, t.name, err)
		}
	}
	return nil
}

// orderFor rotates the target order per round (A/B/C, B/C/A, C/A/B, …;
// A/B, B/A for two) so each target runs first, middle and last equally
// often.
func orderFor(names []string, round int) []string {
	n := len(names)
	out := make([]string, n)
	for i := range names {
		out[i] = names[(i+round-1)%n]
	}
	return out
}

// spreadOrder is orderFor for more targets than rounds: each round
// rotates by ceil(n/rounds) places instead of one, so that over the
// rounds no target keeps its place or its neighbours in the same order
// behind or ahead of it (five targets in three rounds: the last runs
// fifth, third and first). With as many rounds as targets, or more, it
// is orderFor.
func spreadOrder(names []string, round, rounds int) []string {
	n := len(names)
	step := 1
	if rounds > 0 && n > rounds {
		step = (n + rounds - 1) / rounds
	}
	out := make([]string, n)
	for i := range names {
		out[i] = names[(i+(round-1)*step)%n]
	}
	return out
}

// quietLoad is the other processes' CPU below which a phase starts at
// once; above it the run waits (within quietBudget) for it to settle.
const quietLoad = 0.3

// waitQuiet waits, at most 15 s and within the run's budget, until
// processes outside this run use less than quietLoad CPUs: the machine is
// shared, and a phase measured while another session's test suite runs
// measures that suite. It returns the load it last saw.
func (r *runner) waitQuiet(ctx context.Context) float64 {
	began := time.Now()
	limit := min(15*time.Second, r.quietBudget)
	announced := false
	var load float64
	for {
		busy0, _ := bench.BusyCPU()
		ours0 := r.ps.cpu()
		start := time.Now()
		sleepCtx(ctx, 500*time.Millisecond)
		busy1, _ := bench.BusyCPU()
		ours1 := r.ps.cpu()
		load = max(0, float64((busy1-busy0)-(ours1-ours0))/float64(time.Since(start)))
		if load < quietLoad || ctx.Err() != nil || time.Since(began) >= limit {
			break
		}
		if !announced {
			r.logf("    (other processes use %.1f CPUs: waiting up to %s for them to settle)", load, (limit - time.Since(began)).Round(time.Second))
			announced = true
		}
	}
	if announced {
		r.quietBudget = max(0, r.quietBudget-time.Since(began))
		r.res.mu.Lock()
		r.res.QuietWait += time.Since(began).Seconds()
		r.res.mu.Unlock()
	}
	return load
}

// maxRepeats bounds how often one phase is measured again for the other
// load it ran under.
const maxRepeats = 2

// measure runs one load phase against t and records it. A phase during
// which other processes (or the hypervisor's steal) took otherLoadCores
// or more on average, or steal took stealPeakCores or more over any half
// second (a burst that sets the phase's p99 while hardly moving its
// average), is measured again, up to maxRepeats times within the run's
// repeatBudget, and the least loud attempt (loudness) is kept: bursts
// of steal on this shared machine last seconds, and waiting before a
// phase (waitQuiet) cannot see one coming. The choice is by the
// machine's load, never by the figures, and made alike for every target;
// the repeats are counted in the results.
func (r *runner) measure(scn, phase string, round int, t *target, l *bench.Loop, doers func(int) (bench.Doer, error)) (*Record, error) {
	once := r.once
	if once == nil {
		once = r.measureOnce
	}
	var kept *Record
	for attempt := 0; ; attempt++ {
		run, wall, err := once(scn, phase, round, t, l, doers)
		if err != nil {
			return nil, err
		}
		if err := r.context().Err(); err != nil {
			// Interrupted: a phase cut short is no measurement.
			return nil, err
		}
		if kept == nil || loudness(run) < loudness(kept) {
			kept = run
		}
		if quiet(run) || r.noQuietWait || r.noRepeat || attempt == maxRepeats || r.repeatBudget <= 0 {
			break
		}
		r.repeatBudget -= wall
		r.res.mu.Lock()
		r.res.Repeated++
		r.res.mu.Unlock()
		r.logf("    (other load %.1f CPUs during the phase, steal %.1f at its peak: measuring it again, the attempt with the least kept)", run.ForeignCores, run.StealPeak)
	}
	r.res.add(kept)
	return kept, nil
}

// measureOnce runs one load phase against t and returns its record and
// how long it ran.
func (r *runner) measureOnce(scn, phase string, round int, t *target, l *bench.Loop, doers func(int) (bench.Doer, error)) (*Record, time.Duration, error) {
	label := fmt.Sprintf("%s/%s %s r%d", scn, t.name, phase, round)
	ctx := r.context()
	if !r.noQuietWait {
		r.waitQuiet(ctx)
	}
	pb0, _ := r.proxyCPU(t)
	fl0, _ := bench.ReadProc(r.fl.pid())
	g0, _ := bench.ReadProc(r.self)
	busy0, _ := bench.BusyCPU()
	ours0 := r.ps.cpu()
	live := &bench.Live{}
	l.Live = live
	total := l.Duration
	p := bench.StartProgress(r.log, r.tty, label, total, live)
	peak := r.samplePeak()
	start := time.Now()
	res, err := l.RunContext(ctx, doers)
	wall := time.Since(start)
	stealPeak := peak()
	p.Stop()
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return nil, 0, fmt.Errorf("%s: %w", label, err)
	}
	pb1, _ := r.proxyCPU(t)
	fl1, _ := bench.ReadProc(r.fl.pid())
	g1, _ := bench.ReadProc(r.self)
	busy1, _ := bench.BusyCPU()
	ours1 := r.ps.cpu()
	s := bench.Summarize(res)
	run := &Record{Scenario: scn, Target: t.name, Phase: phase, Round: round, Summary: s}
	if ok := float64(s.OK); ok > 0 {
		run.ProxyCPUus = float64(pb1.CPU-pb0.CPU) / 1e3 / ok
		run.FleetCPUus = float64(fl1.CPU-fl0.CPU) / 1e3 / ok
		run.GenCPUus = float64(g1.CPU-g0.CPU) / 1e3 / ok
	}
	run.ProxyCores = float64(pb1.CPU-pb0.CPU) / float64(wall)
	run.ForeignCores = max(0, float64((busy1-busy0)-(ours1-ours0))/float64(wall))
	run.StealPeak = stealPeak
	line := fmt.Sprintf("    %-8s %-8s %9s req/s  p50 %7s  p99 %7s  p99.9 %7s", t.name, phase, bench.FmtRate(s.RPS),
		bench.FmtUs(s.Latency.P50), bench.FmtUs(s.Latency.P99), bench.FmtUs(s.Latency.P999))
	if t.pid != 0 {
		line += fmt.Sprintf("  proxy %.1f µs/req", run.ProxyCPUus)
	}
	if n := s.ErrorCount() + s.Dropped; n > 0 {
		line += fmt.Sprintf("  errors %d %v", n, s.Errors)
	}
	if !quiet(run) {
		line += fmt.Sprintf("  [other load %.1f CPUs, steal %.1f at its peak]", run.ForeignCores, run.StealPeak)
	}
	r.logf("%s", line)
	return run, wall, nil
}

// peakEvery is the interval over which samplePeak measures steal.
const peakEvery = 500 * time.Millisecond

// samplePeak measures the machine's steal (bench.StealCPU) every
// peakEvery until the returned function is called; that function stops
// it and returns the most seen in one interval, in CPUs.
func (r *runner) samplePeak() func() float64 {
	stop, done := make(chan struct{}), make(chan float64, 1)
	go func() {
		t := time.NewTicker(peakEvery)
		defer t.Stop()
		steal0, err0 := bench.StealCPU()
		at0 := time.Now()
		var most float64
		for {
			select {
			case <-stop:
				done <- most
				return
			case <-t.C:
			}
			steal1, err1 := bench.StealCPU()
			at1 := time.Now()
			if dt := at1.Sub(at0); dt > 0 && err0 == nil && err1 == nil {
				most = max(most, float64(steal1-steal0)/float64(dt))
			}
			steal0, err0, at0 = steal1, err1, at1
		}
	}()
	return func() float64 {
		close(stop)
		return <-done
	}
}

// context is the run's context; Background for a runner a test built.
func (r *runner) context() context.Context {
	if r.ctx == nil {
		return context.Background()
	}
	return r.ctx
}

func (r *runner) proxyCPU(t *target) (bench.ProcStat, error) {
	if t.pid == 0 {
		return bench.ProcStat{}, nil
	}
	return cpuOf(t.pid, t.tree)
}

func pinning(cfg Config) string {
	if cfg.ProxyCPU == "" && cfg.FleetCPU == "" && cfg.GenCPU == "" {
		return "none (every process may run on every CPU)"
	}
	or := func(s string) string {
		if s == "" {
			return "all"
		}
		return s
	}
	return fmt.Sprintf("taskset: proxy (pinboard, nginx) on CPU %s, fleets on CPU %s, generator on CPU %s", or(cfg.ProxyCPU), or(cfg.FleetCPU), or(cfg.GenCPU))
}

// machine describes the box for BENCHMARKS.md.
func machine(nginxBin string) Machine {
	m := Machine{NProc: runtime.NumCPU(), Go: runtime.Version(), Date: time.Now().UTC().Format("2006-01-02 15:04 UTC")}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if out, err := exec.Command("uname", "-r").Output(); err == nil {
		m.Kernel = strings.TrimSpace(string(out))
	}
	m.Nginx = nginxVersion(nginxBin)
	var rl syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl) == nil {
		m.FDLimit = rl.Max
	}
	return m
}

// raiseFDLimit lifts the soft open-files limit to the hard one for the
// harness and its children (thousands of streams).
func raiseFDLimit() {
	var rl syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl) == nil && rl.Cur < rl.Max {
		rl.Cur = rl.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl)
	}
}

func copyFiles(files []string, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("cannot create %s: %w", dir, err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}
