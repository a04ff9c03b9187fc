package registry

import (
	"log/slog"
	"math"
	"runtime"
	"sync"
	"testing"
	"time"
)

// fakePool records the capacity the governor sets; waiting is how many
// tasks it says are queued.
type fakePool struct{ c, waiting int }

func (p *fakePool) Cap() int      { return p.c }
func (p *fakePool) Tune(size int) { p.c = size }
func (p *fakePool) Waiting() int  { return p.waiting }

// testGovernor returns a governor over a fake pool at capacity start whose
// scheduling latency is whatever *p99 holds (ok false when it is negative).
func testGovernor(start int, p99 *time.Duration) (*governor, *fakePool) {
	pool := &fakePool{c: start}
	return &governor{
		pool: pool, min: 4, max: 64, interval: governorInterval,
		target: governorTarget, busyWait: governorBusyWait, maxWait: governorMaxWait,
		sched: func() (time.Duration, bool) { return *p99, *p99 >= 0 },
		log:   slog.New(slog.DiscardHandler),
	}, pool
}

func TestGovernorShrinksWhileGoroutinesWaitForACPU(t *testing.T) {
	p99 := 5 * time.Millisecond
	g, pool := testGovernor(64, &p99)
	want := []int{48, 36, 27, 21, 16, 12, 9, 7, 6, 5, 4, 4}
	for i, w := range want {
		if got := g.step(); got != w || pool.c != w {
			t.Fatalf("unexpected capacity after step %d; got %d (pool %d); want %d", i+1, got, pool.c, w)
		}
	}
	// A queue wait under maxWait does not outweigh a congested scheduler.
	g.waited(500 * time.Millisecond)
	if got := g.step(); got != 4 {
		t.Fatalf("unexpected capacity with a short queue wait and a congested scheduler; got %d; want 4", got)
	}
}

func TestGovernorGrowsOnlyWhenTasksQueue(t *testing.T) {
	p99 := 200 * time.Microsecond
	g, pool := testGovernor(8, &p99)
	if got := g.step(); got != 8 {
		t.Fatalf("unexpected capacity with nothing queued; got %d; want 8", got)
	}
	g.waited(governorBusyWait - time.Microsecond)
	if got := g.step(); got != 8 {
		t.Fatalf("unexpected capacity after a wait under busyWait; got %d; want 8", got)
	}
	g.waited(3 * time.Millisecond)
	g.waited(governorBusyWait) // the longest wait of the window counts
	g.waited(time.Millisecond)
	if got := g.step(); got != 9 {
		t.Fatalf("unexpected capacity after a queued task; got %d; want 9", got)
	}
	// The wait is per window: the next step without one holds.
	if got := g.step(); got != 9 {
		t.Fatalf("unexpected capacity in a quiet window; got %d; want 9", got)
	}
	for range 40 {
		g.waited(50 * time.Millisecond)
		g.step()
	}
	if pool.c != 64 {
		t.Fatalf("unexpected capacity after sustained queueing; got %d; want the maximum 64", pool.c)
	}
}

func TestGovernorLivenessBeforeLatency(t *testing.T) {
	p99 := 20 * time.Millisecond
	g, _ := testGovernor(4, &p99)
	g.waited(governorMaxWait)
	if got := g.step(); got != 8 {
		t.Fatalf("unexpected capacity after a task waited maxWait on a congested node; got %d; want 8", got)
	}
}

// Every worker stuck (probes to unreachable workers): no wait ends to be
// recorded, but a queue that stays non-empty for maxWait doubles the pool.
func TestGovernorGrowsWhenTheQueueNeverDrains(t *testing.T) {
	p99 := 20 * time.Millisecond
	g, pool := testGovernor(8, &p99)
	pool.waiting = 3
	steps := int(governorMaxWait / governorInterval)
	for i := 1; i < steps; i++ {
		g.step() // congested: shrinks while the queue is young
	}
	if pool.c != 4 {
		t.Fatalf("unexpected capacity before the queue is maxWait old; got %d; want the floor 4", pool.c)
	}
	if got := g.step(); got != 8 {
		t.Fatalf("unexpected capacity once the queue is maxWait old; got %d; want 8", got)
	}
	if got := g.step(); got != 16 {
		t.Fatalf("unexpected capacity while the queue stays; got %d; want 16", got)
	}
	// A queue that moves (a task left it, after a short wait) is not stuck.
	g.waited(time.Millisecond)
	if got := g.step(); got != 12 {
		t.Fatalf("unexpected capacity while the queue moves on a congested node; got %d; want 12", got)
	}
	for i := 1; i < steps; i++ {
		g.step() // 9, 7, 6, 5: the queue is stuck again, not yet for maxWait
	}
	if pool.c != 5 {
		t.Fatalf("unexpected capacity before the queue is stuck maxWait again; got %d; want 5", pool.c)
	}
	if got := g.step(); got != 10 {
		t.Fatalf("unexpected capacity once the queue is stuck maxWait again; got %d; want 10", got)
	}
	pool.waiting = 0
	if got := g.step(); got != 8 {
		t.Fatalf("unexpected capacity once the queue drained on a congested node; got %d; want 8", got)
	}
}

func TestGovernorHoldsWithoutASignal(t *testing.T) {
	p99 := time.Duration(-1) // too few goroutines scheduled to tell
	g, _ := testGovernor(20, &p99)
	if got := g.step(); got != 20 {
		t.Fatalf("unexpected capacity on an idle node; got %d; want 20", got)
	}
}

func TestGovernorWaitedIsSafeForConcurrentUse(t *testing.T) {
	p99 := time.Duration(-1)
	g, _ := testGovernor(4, &p99)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 1000 {
				g.waited(time.Duration(i*1000 + j))
			}
		}()
	}
	wg.Wait()
	if got := g.longestWait.Load(); got != 7999 {
		t.Fatalf("unexpected longest wait; got %d; want 7999", got)
	}
}

func TestHistogramP99(t *testing.T) {
	buckets := []float64{0, 1e-6, 1e-5, 1e-4, 1e-3, math.Inf(1)}
	for _, c := range []struct {
		name   string
		counts []uint64
		want   time.Duration
		ok     bool
	}{
		{"too few to tell", []uint64{0, 10, 89, 0, 0}, 0, false},
		{"all fast", []uint64{0, 1000, 0, 0, 0}, 10 * time.Microsecond, true},
		{"one percent slow stays under", []uint64{0, 990, 0, 0, 10}, 10 * time.Microsecond, true},
		{"two percent slow", []uint64{0, 980, 0, 20, 0}, time.Millisecond, true},
		{"open last bucket reads its lower bound", []uint64{0, 900, 0, 0, 100}, time.Millisecond, true},
	} {
		var total uint64
		for _, n := range c.counts {
			total += n
		}
		got, ok := histogramP99(c.counts, buckets, total)
		if got != c.want || ok != c.ok {
			t.Errorf("%s: unexpected p99; got %v %v; want %v %v", c.name, got, ok, c.want, c.ok)
		}
	}
}

func TestSchedLatencyReadsTheRuntime(t *testing.T) {
	s := newSchedLatency()
	if len(s.prev) == 0 {
		t.Fatal("unexpected empty /sched/latencies:seconds histogram")
	}
	// Enough goroutine transitions for a window to tell.
	var wg sync.WaitGroup
	for range 4 * minScheduled * 8 {
		wg.Add(1)
		go func() { defer wg.Done(); runtime.Gosched() }()
	}
	wg.Wait()
	p99, ok := s.p99()
	if !ok || p99 <= 0 || p99 > time.Minute {
		t.Fatalf("unexpected scheduling-latency p99; got %v %v; want a positive duration", p99, ok)
	}
	// The next window starts empty.
	if _, ok := s.p99(); ok {
		t.Fatal("unexpected p99 from a window with no scheduling events")
	}
}

// defaultFloor is the governor floor New picks for Workers without
// MinWorkers: 4×GOMAXPROCS, or no governor (0) when that reaches Workers.
func defaultFloor(workers int) int {
	if f := 4 * runtime.GOMAXPROCS(0); f < workers {
		return f
	}
	return 0
}

func TestRegistryGovernorBounds(t *testing.T) {
	for _, c := range []struct {
		workers, min int
		floor        int // 0: no governor
	}{
		{64, 0, defaultFloor(64)},
		{64, 3, 3},
		{64, 64, 0}, // MinWorkers = Workers turns the governor off
		{8, 100, 0}, // and so does a larger one (clamped)
	} {
		r, err := New(Options{Passport: testPassport(t), Workers: c.workers, MinWorkers: c.min, LeaseTTL: testTTL})
		if err != nil {
			t.Fatal(err)
		}
		if got := r.Capacity(); got != c.workers {
			t.Errorf("unexpected starting capacity; got %d; want Workers=%d", got, c.workers)
		}
		floor := 0
		if r.gov != nil {
			floor = r.gov.min
		}
		if floor != c.floor {
			t.Errorf("Workers=%d MinWorkers=%d: unexpected governor floor; got %d; want %d", c.workers, c.min, floor, c.floor)
		}
		if err := r.Close(time.Second); err != nil {
			t.Fatal(err)
		}
	}
}

// Workers past an int32 is clamped to the largest pool ants can hold: it
// keeps the capacity in an int32, and Workers 1<<32+1 (a caller's "no
// limit") made a pool of one, 1<<32 one that never ran a task — every
// register and heartbeat queued, then 503 (R-SRV-3, R-SRV-4).
func TestRegistryWorkersPastInt32Clamped_RSRV4(t *testing.T) {
	for _, workers := range []int{1<<32 + 1, 1 << 32, math.MaxInt} {
		r, err := New(Options{Passport: testPassport(t), Workers: workers, MinWorkers: 1, LeaseTTL: testTTL})
		if err != nil {
			t.Fatal(err)
		}
		if got := r.Capacity(); got != math.MaxInt32 {
			t.Errorf("Workers=%d: unexpected capacity; got %d; want %d", workers, got, math.MaxInt32)
		}
		if r.gov == nil || r.gov.max != math.MaxInt32 {
			t.Errorf("Workers=%d: unexpected governor ceiling; got %+v; want %d", workers, r.gov, math.MaxInt32)
		}
		if err := r.Close(time.Second); err != nil {
			t.Fatal(err)
		}
	}
}

// waitQueued waits up to 10 s for a task to queue in r's pool.
func waitQueued(t *testing.T, r *Registry) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); r.pool.Waiting() < 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("unexpected pool with no task queued after 10s")
		}
	}
}

// The registry reports each task's queue wait to the governor: a request
// that waited behind a busy pool worker shows up in the next step.
func TestRegistryReportsQueueWait(t *testing.T) {
	h := newHarness(t)
	r := h.registryWith(Options{Workers: 2, MinWorkers: 1})
	// Stop the governor's own steps: the test reads the wait they reset.
	r.stopGov()
	<-r.govDone
	r.stopGov = nil
	r.pool.Tune(1)
	block := make(chan struct{})
	started := make(chan struct{})
	if err := r.pool.Submit(func() { close(started); <-block }); err != nil {
		t.Fatal(err)
	}
	<-started
	r.gov.longestWait.Store(0)
	done := make(chan response)
	go func() { done <- h.do(r, "GET", "/registry/health", operatorToken, "") }()
	waitQueued(t, r)
	time.Sleep(20 * time.Millisecond) // the queue wait the registry must report
	close(block)
	if res := <-done; res.status != 200 {
		t.Fatalf("unexpected reply; got %d %s", res.status, res.body)
	}
	if got := time.Duration(r.gov.longestWait.Load()); got < 20*time.Millisecond {
		t.Fatalf("unexpected recorded queue wait; got %v; want at least 20ms", got)
	}
}

// The pool shrinks only when the scheduling latency is over target: at
// the target it holds.
func TestGovernorHoldsAtTarget(t *testing.T) {
	p99 := governorTarget
	g, _ := testGovernor(8, &p99)
	if got := g.step(); got != 8 {
		t.Fatalf("unexpected capacity with the p99 at the target; got %d; want 8", got)
	}
}

// Growth is an eighth but at least one: a small pool whose tasks queue
// grows too.
func TestGovernorGrowsSmallPoolByOne(t *testing.T) {
	p99 := 200 * time.Microsecond
	g, _ := testGovernor(4, &p99)
	g.waited(governorBusyWait)
	if got := g.step(); got != 5 {
		t.Fatalf("unexpected capacity of a pool of 4 with a queued task; got %d; want 5", got)
	}
}

// minScheduled events are enough to tell; fewer are not.
func TestHistogramP99AtMinScheduled(t *testing.T) {
	buckets := []float64{0, 1e-6, 1e-5, math.Inf(1)}
	if got, ok := histogramP99([]uint64{0, minScheduled, 0}, buckets, minScheduled); !ok || got != 10*time.Microsecond {
		t.Fatalf("unexpected p99 of %d events; got %v %v; want 10µs true", minScheduled, got, ok)
	}
	if _, ok := histogramP99([]uint64{0, minScheduled - 1, 0}, buckets, minScheduled-1); ok {
		t.Fatalf("unexpected p99 of %d events; want none", minScheduled-1)
	}
}
