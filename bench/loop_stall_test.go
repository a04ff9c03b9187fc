package bench

import (
	"sync"
	"testing"
	"time"
)

// stallingClock is the real clock, except that the generator is
// descheduled for a while: a SleepUntil whose target falls in
// [from, to) after the first Now (the loop's start) returns at to — what
// a load generator sharing two CPUs with the proxy it measures sees when
// the proxy takes both.
type stallingClock struct {
	once     sync.Once
	start    time.Time
	from, to time.Duration
}

func (c *stallingClock) Now() time.Time {
	now := time.Now()
	c.once.Do(func() { c.start = now })
	return now
}

func (c *stallingClock) SleepUntil(t time.Time) {
	if off := t.Sub(c.start); off >= c.from && off < c.to {
		t = c.start.Add(c.to)
	}
	RealClock.SleepUntil(t)
}

type instantDoer struct{}

func (instantDoer) Do(uint64) error { return nil }
func (instantDoer) Close() error    { return nil }

// TestOpenLoopGeneratorStallIsCharged: requests due while the generator
// could not send are answered late by up to the stall; open-loop latency
// must say so. Sixty-four workers at 1,000/s hold the next 64 ms of slots,
// so every slot due in a 50 ms stall belongs to a worker that was idle
// and slept into it: measured from the send, the stall disappears.
func TestOpenLoopGeneratorStallIsCharged(t *testing.T) {
	clock := &stallingClock{from: 20 * time.Millisecond, to: 70 * time.Millisecond}
	l := &Loop{Rate: 1000, Duration: 100 * time.Millisecond, Workers: 64, Clock: clock}
	res, err := l.Run(func(int) (Doer, error) { return instantDoer{}, nil })
	if err != nil {
		t.Fatal(err)
	}
	if res.Sent != 100 {
		t.Fatalf("unexpected sends; got %d; want 100", res.Sent)
	}
	if got := time.Duration(res.Slack.Max()); got < 40*time.Millisecond {
		t.Fatalf("the stall did not happen; slack max %v", got)
	}
	// 50 of 100 requests were sent 0–50 ms after they were due.
	if got := time.Duration(res.Latency.Percentile(75)); got < 20*time.Millisecond {
		t.Fatalf("generator stall hidden from open-loop latency: p75 %v, max %v; slack max %v",
			got, time.Duration(res.Latency.Max()), time.Duration(res.Slack.Max()))
	}
}
