package bench

import (
	"context"
	"testing"
	"time"
)

type nopDoer struct{}

func (nopDoer) Do(uint64) error { return nil }
func (nopDoer) Close() error    { return nil }

func nopDoers(int) (Doer, error) { return nopDoer{}, nil }

// An interrupted open loop returns at once, even with workers asleep
// until slots seconds away, and reports only the part that ran: the
// slots after the interruption are neither sent nor dropped.
func TestLoopInterruptedOpen(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	l := &Loop{Rate: 0.1, Duration: time.Minute, Workers: 2}
	began := time.Now()
	res, err := l.RunContext(ctx, nopDoers)
	if err != nil {
		t.Fatalf("unexpected error; got %v; want nil", err)
	}
	if took := time.Since(began); took > 5*time.Second {
		t.Fatalf("unexpected time to stop; got %v; want well under the 10s sleep of a worker", took)
	}
	if !res.Interrupted {
		t.Fatalf("unexpected Interrupted; got false; want true")
	}
	if res.Sent != 1 || res.Dropped != 0 {
		t.Fatalf("unexpected sent/dropped; got %d/%d; want 1/0 (one slot due before the interruption)", res.Sent, res.Dropped)
	}
	if res.Duration < 250*time.Millisecond || res.Duration > 5*time.Second {
		t.Fatalf("unexpected Duration; got %v; want about 300ms, the part that ran", res.Duration)
	}
	if s := Summarize(res); !s.Interrupted {
		t.Fatalf("unexpected Summary.Interrupted; got false; want true")
	}
}

// A busy open loop interrupted part way: rate and duration as they ran.
func TestLoopInterruptedOpenRate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	l := &Loop{Rate: 200, Duration: 20 * time.Second, Workers: 4}
	res, err := l.RunContext(ctx, nopDoers)
	if err != nil {
		t.Fatalf("unexpected error; got %v; want nil", err)
	}
	due := Slots(res.Duration, 200)
	if res.Sent+res.Dropped != due {
		t.Fatalf("unexpected sent+dropped; got %d+%d; want %d, the slots due in %v", res.Sent, res.Dropped, due, res.Duration)
	}
	if res.Sent < 50 || res.Elapsed > 5*time.Second {
		t.Fatalf("unexpected run; got sent %d in %v; want about 100 in 500ms", res.Sent, res.Elapsed)
	}
	if tp := res.Throughput(); tp < 100 || tp > 300 {
		t.Fatalf("unexpected throughput; got %.0f/s; want about 200/s over the part that ran", tp)
	}
}

func TestLoopInterruptedClosed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	l := &Loop{Duration: time.Minute, Workers: 2}
	began := time.Now()
	res, err := l.RunContext(ctx, nopDoers)
	if err != nil {
		t.Fatalf("unexpected error; got %v; want nil", err)
	}
	if took := time.Since(began); took > 5*time.Second || !res.Interrupted || res.OK == 0 {
		t.Fatalf("unexpected result; got took %v, interrupted %v, ok %d; want quick, true, > 0", took, res.Interrupted, res.OK)
	}
}

// A run that ends on its own is not marked interrupted.
func TestLoopNotInterrupted(t *testing.T) {
	res, err := (&Loop{Rate: 100, Duration: 100 * time.Millisecond, Workers: 2}).RunContext(context.Background(), nopDoers)
	if err != nil || res.Interrupted || res.Sent != 10 || res.Dropped != 0 {
		t.Fatalf("unexpected result; got err %v, interrupted %v, sent %d, dropped %d; want nil, false, 10, 0", err, res.Interrupted, res.Sent, res.Dropped)
	}
}
