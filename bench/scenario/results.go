package scenario

import (
	"encoding/json"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/pinboard-go/pinboard/bench"
	"github.com/pinboard-go/pinboard/bench/fleet"
)

// Machine is what BENCHMARKS.md notes about the box.
type Machine struct {
	NProc   int    `json:"nproc"`
	CPU     string `json:"cpu"`
	Kernel  string `json:"kernel"`
	Go      string `json:"go"`
	Nginx   string `json:"nginx"`
	Date    string `json:"date"`
	FDLimit uint64 `json:"fdLimit"`
}

// Record is one measured load phase.
type Record struct {
	Scenario string        `json:"scenario"`
	Target   string        `json:"target"`
	Phase    string        `json:"phase"`
	Round    int           `json:"round"`
	Summary  bench.Summary `json:"summary"`
	// ProxyCPUus is the proxy process's utime+stime over the phase divided
	// by successful requests (nginx: master and workers).
	ProxyCPUus float64 `json:"proxyCpuUsPerReq,omitempty"`
	// ProxyCores is the proxy's CPU time over the phase's wall time.
	ProxyCores float64 `json:"proxyCores,omitempty"`
	FleetCPUus float64 `json:"fleetCpuUsPerReq,omitempty"`
	GenCPUus   float64 `json:"generatorCpuUsPerReq,omitempty"`
	// ForeignCores is CPU the machine spent outside this run's processes
	// during the phase (/proc/stat busy time minus ours, over wall time):
	// other tenants of a shared machine, and steal (the hypervisor running
	// other machines on our CPUs), which slows this run just the same.
	ForeignCores float64 `json:"foreignCores"`
	// StealPeak is the most steal in any half second of the phase
	// (peakEvery), in CPUs: a burst lasting a second or two hardly moves
	// a 10-second phase's average, and sets its p99 all the same.
	StealPeak float64 `json:"stealPeakCores,omitempty"`
}

// Results is everything one `pinbench run` measured (results.json).
type Results struct {
	Machine Machine `json:"machine"`
	Quick   bool    `json:"quick"`
	Rounds  int     `json:"rounds"`
	Pinning string  `json:"pinning"`
	// PinboardEnv is extra environment the pinboard nodes ran with.
	PinboardEnv []string       `json:"pinboardEnv,omitempty"`
	Started     time.Time      `json:"started"`
	Finished    time.Time      `json:"finished"`
	Runs        []*Record      `json:"runs"`
	Facts       map[string]any `json:"facts"`
	Large       []LargeRun     `json:"large,omitempty"`
	Storm       []StormPhase   `json:"storm,omitempty"`
	Churn       []ChurnPhase   `json:"churn,omitempty"`
	Skipped     []string       `json:"skipped,omitempty"`
	// QuietWait is how long the run waited for other processes' load to
	// settle before phases, in seconds.
	QuietWait float64 `json:"quietWaitS"`
	// Repeated counts the phases measured again for the other load they
	// ran under (runner.measure); Runs holds the attempt kept of each.
	Repeated int `json:"repeatedPhases"`

	mu sync.Mutex
}

// LargeRun is one 1 GiB transfer through one target.
type LargeRun struct {
	Target    string  `json:"target"`
	Direction string  `json:"direction"` // "upload" or "download"
	Round     int     `json:"round"`
	Bytes     int64   `json:"bytes"`
	Seconds   float64 `json:"seconds"`
	MiBps     float64 `json:"mibPerS"`
	// RSSGrowthMiB is the proxy's peak RSS during the transfer minus its
	// RSS before (sampled every 10 ms).
	RSSGrowthMiB float64 `json:"rssGrowthMiB"`
	RSSBeforeMiB float64 `json:"rssBeforeMiB"`
	ProxyCPUs    float64 `json:"proxyCpuS"`
	Error        string  `json:"error,omitempty"`
}

// StormPhase is one data-plane window with the heartbeat storm on or off.
type StormPhase struct {
	// Scenario is "storm" or "storm-split" (empty in results written
	// before storm-split existed: "storm").
	Scenario string `json:"scenario,omitempty"`
	Round    int    `json:"round"`
	On       bool   `json:"on"`
	Workers  int    `json:"workers"`
	// Acks is the storm fleet's heartbeat statistics over the window. The
	// window's data plane, and its proxy's CPU, are in its Record.
	Acks fleet.Snapshot `json:"acks"`
}

// ChurnPhase is one data-plane window with or without churn.
type ChurnPhase struct {
	Round  int  `json:"round"`
	Churn  bool `json:"churn"`
	Left   int  `json:"left"`
	Joined int  `json:"joined"`
	Errors int  `json:"churnErrors"`
}

func (r *Results) add(run *Record) {
	r.mu.Lock()
	r.Runs = append(r.Runs, run)
	r.mu.Unlock()
}

func (r *Results) fact(k string, v any) {
	r.mu.Lock()
	if r.Facts == nil {
		r.Facts = map[string]any{}
	}
	r.Facts[k] = v
	r.mu.Unlock()
}

// factString returns the string under k, "" if there is none.
func (r *Results) factString(k string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	v, _ := r.Facts[k].(string)
	return v
}

// appendFact adds v to the list of per-round values under k.
func (r *Results) appendFact(k string, v float64) {
	r.mu.Lock()
	if r.Facts == nil {
		r.Facts = map[string]any{}
	}
	switch l := r.Facts[k].(type) {
	case []float64:
		r.Facts[k] = append(l, v)
	case []any: // read back from results.json
		r.Facts[k] = append(l, v)
	default:
		r.Facts[k] = []float64{v}
	}
	r.mu.Unlock()
}

// factList returns the per-round values under k, sorted; a single
// number (results.json of an older run) is a list of one.
func (r *Results) factList(k string) []float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []float64
	switch l := r.Facts[k].(type) {
	case []float64:
		out = append(out, l...)
	case []any:
		for _, v := range l {
			if f, ok := v.(float64); ok {
				out = append(out, f)
			}
		}
	case float64:
		out = []float64{l}
	}
	slices.Sort(out)
	return out
}

// factF returns a numeric fact, or 0.
func (r *Results) factF(k string) float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch v := r.Facts[k].(type) {
	case float64:
		return v
	case int:
		return float64(v)
	case int64:
		return float64(v)
	case uint64:
		return float64(v)
	}
	return 0
}

func (r *Results) write(path string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// Agg is one (scenario, phase, target) over its rounds: medians of the
// per-round figures, and latency percentiles of every round's requests
// together.
type Agg struct {
	N          int
	RPS        float64 // median
	RPSMin     float64
	RPSMax     float64
	ProxyCPUus float64 // median
	ProxyCores float64 // median
	FleetCPUus float64
	// Foreign is the mean CPU (cores) used by other processes on the
	// machine during these phases.
	Foreign float64
	Latency bench.Percentiles
	// SlackP99 is the worst round's generator timer slack p99 (µs).
	SlackP99   float64
	Hist       *bench.Hist
	OK, Errors uint64
	ErrorKinds map[string]uint64
	Rate       float64
}

func (r *Results) agg(scenario, phase, target string) Agg {
	return r.aggWhere(scenario, phase, target, nil)
}

// otherLoadCores is the CPU other processes must use during a phase for
// the phase to be flagged as measured under other load.
const otherLoadCores = 0.2

// stealPeakCores is the steal over one half second of a phase
// (Record.StealPeak) that flags the phase too.
const stealPeakCores = 0.4

// loudness is how far a phase's other load went past what flags it: at 1
// or more, its average or its steal's peak reached the threshold.
func loudness(run *Record) float64 {
	return max(run.ForeignCores/otherLoadCores, run.StealPeak/stealPeakCores)
}

// quiet keeps the phases measured without other load.
func quiet(run *Record) bool { return loudness(run) < 1 }

// aggWhere is agg over the rounds keep accepts (nil: all).
func (r *Results) aggWhere(scenario, phase, target string, keep func(*Record) bool) Agg {
	r.mu.Lock()
	defer r.mu.Unlock()
	a := Agg{Hist: bench.NewHist(), ErrorKinds: map[string]uint64{}}
	var rps, cpu, cores, fleetCPU []float64
	var foreign float64
	for _, run := range r.Runs {
		if run.Scenario != scenario || run.Target != target || run.Phase != phase {
			continue
		}
		if keep != nil && !keep(run) {
			continue
		}
		a.N++
		s := run.Summary
		rps = append(rps, s.RPS)
		cpu = append(cpu, run.ProxyCPUus)
		cores = append(cores, run.ProxyCores)
		fleetCPU = append(fleetCPU, run.FleetCPUus)
		foreign += run.ForeignCores
		a.Hist.Merge(bench.HistOf(s.LatHist))
		a.OK += s.OK
		for k, v := range s.Errors {
			a.Errors += v
			a.ErrorKinds[k] += v
		}
		a.Errors += s.Dropped
		if s.Dropped > 0 {
			a.ErrorKinds["dropped"] += s.Dropped
		}
		a.Rate = s.Rate
		a.SlackP99 = max(a.SlackP99, s.Slack.P99)
	}
	if a.N == 0 {
		return a
	}
	a.RPS, a.RPSMin, a.RPSMax = median(rps), slices.Min(rps), slices.Max(rps)
	a.ProxyCPUus, a.ProxyCores, a.FleetCPUus = median(cpu), median(cores), median(fleetCPU)
	a.Latency = bench.PercentilesOf(a.Hist)
	a.Foreign = foreign / float64(a.N)
	return a
}

// Foreign is the mean CPU other processes used during the measured
// phases, and the highest of one phase.
func (r *Results) Foreign() (mean, peak float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, run := range r.Runs {
		mean += run.ForeignCores
		peak = max(peak, run.ForeignCores)
	}
	if len(r.Runs) > 0 {
		mean /= float64(len(r.Runs))
	}
	return mean, peak
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Aggregate is (scenario, phase, target) over its rounds.
func (r *Results) Aggregate(scenario, phase, target string) Agg {
	return r.agg(scenario, phase, target)
}
