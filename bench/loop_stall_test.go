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
//
// How much of the stall each slot meets depends on when its worker got
// to it, which a loaded machine shifts (a worker reaching a slot after
// its due time does not sleep; a fixed p75 of 20 ms failed at 19 ms). What
// holds however late the workers run: each idle slot's latency includes
// its slack (the sleep's lateness), so the m-th largest latency is at
// least the m-th largest slack; measured from the send, the latencies
// are the instant doer's, near zero, and fall below it.
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
	// Up to 50 of 100 requests were sent 0–50 ms after they were due.
	for _, m := range []uint64{1, 10, 25} {
		if res.Slack.Count() < m {
			break
		}
		lat, slack := nthLargest(res.Latency, m), nthLargest(res.Slack, m)
		if lat < slack {
			t.Fatalf("generator stall hidden from open-loop latency: latency's %d-th largest %v; want at least slack's, %v (slack max %v)",
				m, time.Duration(lat), time.Duration(slack), time.Duration(res.Slack.Max()))
		}
	}
}

// nthLargest is h's m-th largest value (its bucket's highest).
func nthLargest(h *Hist, m uint64) int64 {
	n := h.Count()
	return h.Percentile(100 * (float64(n-m) + 0.5) / float64(n))
}
