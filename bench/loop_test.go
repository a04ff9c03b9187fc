package bench

import (
	"errors"
	"sync"
	"testing"
	"time"
)

// virtualClock is a Clock for one worker: sleeping and doing work advance
// it; nothing waits for real.
type virtualClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *virtualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *virtualClock) SleepUntil(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.After(c.now) {
		c.now = t
	}
}

func (c *virtualClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// fixedDoer takes exactly service time on the virtual clock.
type fixedDoer struct {
	clock   *virtualClock
	service time.Duration
	seqs    []uint64
}

func (d *fixedDoer) Do(seq uint64) error {
	d.seqs = append(d.seqs, seq)
	d.clock.advance(d.service)
	return nil
}
func (d *fixedDoer) Close() error { return nil }

func TestSlots(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		rate float64
		want uint64
	}{
		{time.Second, 100, 100},
		{time.Second, 3, 3},
		{time.Second + time.Nanosecond, 1, 2},
		{time.Second, 0, 0},
		{0, 10, 0},
		{10 * time.Second, 33_333, 333_330},
	} {
		if got := Slots(c.d, c.rate); got != c.want {
			t.Fatalf("unexpected Slots(%v, %v); got %d; want %d", c.d, c.rate, got, c.want)
		}
	}
}

// TestOpenLoopUnderCapacity: an idle worker sleeps into each slot, and the
// latency is the service time alone.
func TestOpenLoopUnderCapacity(t *testing.T) {
	clock := &virtualClock{now: time.Unix(1000, 0)}
	doer := &fixedDoer{clock: clock, service: 2 * time.Millisecond}
	l := &Loop{Rate: 100, Duration: time.Second, Workers: 1, Clock: clock}
	res, err := l.Run(func(int) (Doer, error) { return doer, nil })
	if err != nil {
		t.Fatal(err)
	}
	if res.Sent != 100 || res.OK != 100 || res.Dropped != 0 {
		t.Fatalf("unexpected counts; got sent %d ok %d dropped %d; want 100 100 0", res.Sent, res.OK, res.Dropped)
	}
	if got := res.Latency.Max(); got != int64(2*time.Millisecond) {
		t.Fatalf("unexpected max latency; got %v; want 2ms", time.Duration(got))
	}
	if res.Slack.Max() != 0 || res.Slack.Count() != 99 {
		t.Fatalf("unexpected slack; got max %d over %d slots; want 0 over 99 (slot 0 is due at the start)", res.Slack.Max(), res.Slack.Count())
	}
	for i, s := range doer.seqs {
		if s != uint64(i) {
			t.Fatalf("unexpected sequence at %d; got %d", i, s)
		}
	}
}

// TestOpenLoopCoordinatedOmission: a worker that cannot keep up delays
// every later slot, and each delayed request is measured from its due
// time — slot i is picked at 10i ms, due at 5i ms, done at 10i+10 ms.
func TestOpenLoopCoordinatedOmission(t *testing.T) {
	clock := &virtualClock{now: time.Unix(1000, 0)}
	doer := &fixedDoer{clock: clock, service: 10 * time.Millisecond}
	l := &Loop{Rate: 200, Duration: time.Second, Workers: 1, Clock: clock}
	res, err := l.Run(func(int) (Doer, error) { return doer, nil })
	if err != nil {
		t.Fatal(err)
	}
	if res.Sent != 200 || res.Dropped != 0 {
		t.Fatalf("unexpected counts; got sent %d dropped %d; want 200 0", res.Sent, res.Dropped)
	}
	if got, want := res.Latency.Max(), int64(1005*time.Millisecond); got != want {
		t.Fatalf("unexpected max latency; got %v; want %v", time.Duration(got), time.Duration(want))
	}
	// Rank 100 of 10, 15, …, 1005 ms is 505 ms; the histogram reports its
	// bucket's top, within 1/128.
	p50 := res.Latency.Percentile(50)
	if want := int64(505 * time.Millisecond); p50 < want || float64(p50) > float64(want)*(1+1.0/128) {
		t.Fatalf("unexpected p50; got %v; want about 505ms", time.Duration(p50))
	}
	// The service time alone would hide the stall entirely.
	if got := res.Service.Max(); got != int64(10*time.Millisecond) {
		t.Fatalf("unexpected max service time; got %v; want 10ms", time.Duration(got))
	}
	if res.Elapsed != 2*time.Second {
		t.Fatalf("unexpected elapsed; got %v; want 2s", res.Elapsed)
	}
}

// TestOpenLoopGrace: slots still unsent Grace after the end are dropped.
func TestOpenLoopGrace(t *testing.T) {
	clock := &virtualClock{now: time.Unix(1000, 0)}
	doer := &fixedDoer{clock: clock, service: 10 * time.Millisecond}
	l := &Loop{Rate: 200, Duration: time.Second, Workers: 1, Clock: clock, Grace: 500 * time.Millisecond}
	res, err := l.Run(func(int) (Doer, error) { return doer, nil })
	if err != nil {
		t.Fatal(err)
	}
	// Slot i is picked at 10i ms; the last one picked by 1.5 s is i=150.
	if res.Sent != 151 || res.Dropped != 49 {
		t.Fatalf("unexpected counts; got sent %d dropped %d; want 151 49", res.Sent, res.Dropped)
	}
}

type kindErr string

func (k kindErr) Error() string { return string(k) }
func (k kindErr) Kind() string  { return string(k) }

type countingDoer struct{ n int }

func (d *countingDoer) Do(seq uint64) error {
	d.n++
	switch seq % 4 {
	case 1:
		return kindErr("status")
	case 2:
		return errors.New("plain")
	}
	return nil
}
func (d *countingDoer) Close() error { return nil }

// TestOpenLoopManyWorkersExactSlots: with real time and many workers every
// due slot is sent exactly once (no timing is asserted).
func TestOpenLoopManyWorkersExactSlots(t *testing.T) {
	var mu sync.Mutex
	var doers []*countingDoer
	live := &Live{}
	l := &Loop{Rate: 2000, Duration: 100 * time.Millisecond, Workers: 8, Live: live}
	res, err := l.Run(func(int) (Doer, error) {
		d := &countingDoer{}
		mu.Lock()
		doers = append(doers, d)
		mu.Unlock()
		return d, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, d := range doers {
		n += d.n
	}
	if res.Sent != 200 || n != 200 || live.Done.Load() != 200 {
		t.Fatalf("unexpected sends; got result %d, doers %d, live %d; want 200", res.Sent, n, live.Done.Load())
	}
	if res.OK != 100 || res.Errors["status"] != 50 || res.Errors["error"] != 50 || live.Errors.Load() != 100 {
		t.Fatalf("unexpected outcome counts; got ok %d errors %v", res.OK, res.Errors)
	}
	if res.Latency.Count() != 200 || res.Service.Count() != 200 {
		t.Fatalf("unexpected histogram counts; got %d and %d", res.Latency.Count(), res.Service.Count())
	}
}

func TestClosedLoop(t *testing.T) {
	clock := &virtualClock{now: time.Unix(1000, 0)}
	doer := &fixedDoer{clock: clock, service: 3 * time.Millisecond}
	l := &Loop{Duration: 30 * time.Millisecond, Workers: 1, Clock: clock}
	res, err := l.Run(func(int) (Doer, error) { return doer, nil })
	if err != nil {
		t.Fatal(err)
	}
	if res.Mode != "closed" || res.Sent != 10 || res.Elapsed != 30*time.Millisecond {
		t.Fatalf("unexpected closed loop; got mode %s sent %d elapsed %v", res.Mode, res.Sent, res.Elapsed)
	}
	if got := res.Throughput(); got < 333 || got > 334 {
		t.Fatalf("unexpected throughput; got %v; want 333.3", got)
	}
}

func TestLoopDoerError(t *testing.T) {
	l := &Loop{Duration: time.Millisecond, Workers: 2}
	_, err := l.Run(func(w int) (Doer, error) {
		if w == 1 {
			return nil, errors.New("cannot dial")
		}
		return &countingDoer{}, nil
	})
	if err == nil {
		t.Fatal("unexpected success with a failing newDoer")
	}
}
