package bench

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Doer performs one request on its own connection. A Doer is used by one
// goroutine at a time. seq numbers requests across every Doer of a run, from
// 0; templates use it to pick ids.
type Doer interface {
	Do(seq uint64) error
	Close() error
}

// Kinded errors name their kind in LoopResult.Errors ("status", "read",
// "dial", …); other errors count as "error".
type Kinded interface{ Kind() string }

// Clock is the scheduler's time source; tests substitute a virtual clock.
type Clock interface {
	Now() time.Time
	// SleepUntil returns at t or later.
	SleepUntil(t time.Time)
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }
func (realClock) SleepUntil(t time.Time) {
	if d := time.Until(t); d > 0 {
		time.Sleep(d)
	}
}

// SleepUntilContext is SleepUntil that returns early, false, when ctx
// is done.
func (realClock) SleepUntilContext(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// contextSleeper is a Clock whose sleep a cancelled context can cut
// short; without it an interrupted open loop waits out the sleep of each
// idle worker (up to Workers/Rate seconds).
type contextSleeper interface {
	SleepUntilContext(ctx context.Context, t time.Time) bool
}

// RealClock is the wall clock.
var RealClock Clock = realClock{}

// Loop is one load run: open loop at a constant arrival rate (Rate > 0) or
// closed loop (Rate == 0: every worker sends its next request as soon as
// the previous one is answered, which measures peak throughput).
//
// Open loop avoids coordinated omission: request i is due at
// start + i/Rate whatever happened to earlier requests, workers take due
// slots from one shared counter, and a slot that waited because every
// worker was busy is measured from its due time, so a stall shows up in
// the latency of every request it delayed.
type Loop struct {
	// Rate is the arrival rate in requests per second; 0 runs closed loop.
	Rate float64
	// Duration is how long slots are issued (open loop) or requests are
	// sent (closed loop).
	Duration time.Duration
	// Workers is the number of concurrent connections; default 64.
	Workers int
	// Grace bounds how long after Duration an open loop keeps sending
	// slots that are already late; what is left is counted as Dropped.
	// Default 10s.
	Grace time.Duration
	// Clock is the time source; nil uses RealClock.
	Clock Clock
	// Live, when set, receives the running counters (for a progress bar).
	Live *Live
}

// Live counters of a running loop, safe to read from another goroutine.
type Live struct {
	Done   atomic.Uint64
	Errors atomic.Uint64
}

// LoopResult is what one Loop run measured.
type LoopResult struct {
	Mode     string        `json:"mode"` // "open" or "closed"
	Rate     float64       `json:"rate,omitempty"`
	Workers  int           `json:"workers"`
	Duration time.Duration `json:"duration"`
	// Elapsed runs from the start to the last completion.
	Elapsed time.Duration `json:"elapsed"`
	// Sent counts requests handed to a Doer; OK those that returned nil.
	Sent uint64 `json:"sent"`
	OK   uint64 `json:"ok"`
	// Dropped counts open-loop slots never sent (past Grace, or due
	// before an interruption).
	Dropped uint64 `json:"dropped,omitempty"`
	// Interrupted: the run's context ended it early; Duration is then
	// the part that ran.
	Interrupted bool              `json:"interrupted,omitempty"`
	Errors      map[string]uint64 `json:"errors,omitempty"`
	// Latency is the open loop's response time, from each slot's due
	// time whether or not a worker was free for it. In closed loop it
	// equals Service.
	Latency *Hist `json:"-"`
	// Service is from the actual send to the end of the response.
	Service *Hist `json:"-"`
	// Slack is how late the generator's sleep woke for slots an idle
	// worker waited for (included in Latency, reported on its own too).
	Slack *Hist `json:"-"`
}

// Throughput is successful requests per second of Elapsed.
func (r *LoopResult) Throughput() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.OK) / r.Elapsed.Seconds()
}

// slotOffset is slot i's due time after the start.
func slotOffset(i uint64, rate float64) time.Duration {
	return time.Duration(float64(i) * float64(time.Second) / rate)
}

// Slots is the number of open-loop slots due within d at rate.
func Slots(d time.Duration, rate float64) uint64 {
	if rate <= 0 || d <= 0 {
		return 0
	}
	n := uint64(math.Ceil(d.Seconds() * rate))
	for n > 0 && slotOffset(n-1, rate) >= d {
		n--
	}
	for slotOffset(n, rate) < d {
		n++
	}
	return n
}

var errNoWorkers = errors.New("cannot run a load loop without workers")

// Run runs the loop with one Doer per worker from newDoer, closing them at
// the end. A newDoer error stops the run before it starts.
func (l *Loop) Run(newDoer func(worker int) (Doer, error)) (*LoopResult, error) {
	return l.RunContext(context.Background(), newDoer)
}

// RunContext is Run that stops early when ctx is done (Ctrl-C): workers
// send nothing more, requests in flight finish (each Doer bounds its
// own), and the result covers the part that ran, with Interrupted set,
// Duration cut to the moment of the interruption and only slots due
// before it counted as Dropped.
func (l *Loop) RunContext(ctx context.Context, newDoer func(worker int) (Doer, error)) (*LoopResult, error) {
	workers := l.Workers
	if workers <= 0 {
		workers = 64
	}
	grace := l.Grace
	if grace <= 0 {
		grace = 10 * time.Second
	}
	clock := l.Clock
	if clock == nil {
		clock = RealClock
	}
	doers := make([]Doer, 0, workers)
	defer func() {
		for _, d := range doers {
			_ = d.Close()
		}
	}()
	for w := 0; w < workers; w++ {
		d, err := newDoer(w)
		if err != nil {
			return nil, err
		}
		doers = append(doers, d)
	}
	if len(doers) == 0 {
		return nil, errNoWorkers
	}
	res := &LoopResult{Mode: "closed", Rate: l.Rate, Workers: workers, Duration: l.Duration}
	open := l.Rate > 0
	if open {
		res.Mode = "open"
	}
	var (
		next   atomic.Uint64
		mu     sync.Mutex
		wg     sync.WaitGroup
		lastAt time.Time
	)
	res.Latency, res.Service, res.Slack = NewHist(), NewHist(), NewHist()
	res.Errors = map[string]uint64{}
	start := clock.Now()
	end := start.Add(l.Duration)
	giveUp := end.Add(grace)
	total := Slots(l.Duration, l.Rate)
	// stoppedAt is when ctx ended the run, noted as it happens (workers
	// may take a while to notice and finish what they had in flight).
	var (
		stoppedAt time.Time
		noted     = make(chan struct{})
		finished  = make(chan struct{})
	)
	defer close(finished)
	go func() {
		defer close(noted)
		select {
		case <-ctx.Done():
			stoppedAt = clock.Now()
		case <-finished:
		}
	}()
	for _, d := range doers {
		wg.Add(1)
		go func(d Doer) {
			defer wg.Done()
			w := &loopWorker{lat: NewHist(), svc: NewHist(), slack: NewHist(), errs: map[string]uint64{}}
			if open {
				w.runOpen(ctx, d, clock, &next, total, start, giveUp, l.Rate, l.Live)
			} else {
				w.runClosed(ctx, d, clock, &next, end, l.Live)
			}
			mu.Lock()
			res.Latency.Merge(w.lat)
			res.Service.Merge(w.svc)
			res.Slack.Merge(w.slack)
			res.Sent += w.sent
			res.OK += w.ok
			for k, v := range w.errs {
				res.Errors[k] += v
			}
			if w.last.After(lastAt) {
				lastAt = w.last
			}
			mu.Unlock()
		}(d)
	}
	wg.Wait()
	if ctx.Err() != nil {
		<-noted
		if at := stoppedAt.Sub(start); at < l.Duration {
			// Only what was due before the interruption counts: the
			// slots after it were never meant to be sent.
			res.Interrupted = true
			res.Duration = max(at, 0)
			total = Slots(res.Duration, l.Rate)
		}
	}
	if open && res.Sent < total {
		res.Dropped = total - res.Sent
	}
	if lastAt.IsZero() {
		lastAt = clock.Now()
	}
	res.Elapsed = lastAt.Sub(start)
	if open && res.Elapsed < res.Duration {
		res.Elapsed = res.Duration
	}
	return res, nil
}

type loopWorker struct {
	lat, svc, slack *Hist
	sent, ok        uint64
	errs            map[string]uint64
	last            time.Time
}

func (w *loopWorker) runOpen(ctx context.Context, d Doer, clock Clock, next *atomic.Uint64, total uint64, start, giveUp time.Time, rate float64, live *Live) {
	cs, _ := clock.(contextSleeper)
	if ctx.Done() == nil {
		// A run that cannot be cancelled (Run: every bench scenario)
		// sleeps as it always did, with no timer and select per slot.
		cs = nil
	}
	for {
		if ctx.Err() != nil {
			return
		}
		i := next.Add(1) - 1
		if i >= total {
			return
		}
		due := start.Add(slotOffset(i, rate))
		picked := clock.Now()
		if picked.After(giveUp) {
			return
		}
		idle := picked.Before(due)
		if idle {
			if cs != nil {
				if !cs.SleepUntilContext(ctx, due) {
					return
				}
			} else {
				clock.SleepUntil(due)
				if ctx.Err() != nil {
					return
				}
			}
		}
		sent := clock.Now()
		err := d.Do(i)
		done := clock.Now()
		// Always from the due time: a late wake-up of an idle worker is
		// most often the generator losing its CPU to the system under
		// test on a shared machine, and every slot held by a sleeping
		// worker (Workers/Rate seconds of them) would hide it.
		w.lat.Record(int64(done.Sub(due)))
		if idle {
			w.slack.Record(int64(sent.Sub(due)))
		}
		w.svc.Record(int64(done.Sub(sent)))
		w.count(err, live)
		w.last = done
	}
}

func (w *loopWorker) runClosed(ctx context.Context, d Doer, clock Clock, next *atomic.Uint64, end time.Time, live *Live) {
	for {
		if ctx.Err() != nil {
			return
		}
		sent := clock.Now()
		if !sent.Before(end) {
			return
		}
		err := d.Do(next.Add(1) - 1)
		done := clock.Now()
		w.lat.Record(int64(done.Sub(sent)))
		w.svc.Record(int64(done.Sub(sent)))
		w.count(err, live)
		w.last = done
	}
}

func (w *loopWorker) count(err error, live *Live) {
	w.sent++
	if err == nil {
		w.ok++
	} else {
		kind := "error"
		var k Kinded
		if errors.As(err, &k) {
			kind = k.Kind()
		}
		w.errs[kind]++
	}
	if live != nil {
		live.Done.Add(1)
		if err != nil {
			live.Errors.Add(1)
		}
	}
}
