package directory

import (
	"errors"
	"testing"
	"time"
)

type seenCommand struct {
	op  string
	d   time.Duration
	err error
}

type commandLog struct{ seen []seenCommand }

func (c *commandLog) StoreCommand(op string, d time.Duration, err error) {
	c.seen = append(c.seen, seenCommand{op, d, err})
}

// A call the gate refused made no round trip: its observer gets the error
// with a zero duration (no latency to record, CommandObserver), where a
// call that went to Redis and failed reports the time it took (R-DP-4).
func TestRefusedCallsReportNoLatency_RDP4(t *testing.T) {
	log := &commandLog{}
	r := &Redis{obs: log}
	start := time.Now().Add(-time.Millisecond)
	r.observe("place", start, errNotAnswering)
	r.observeMulti("heartbeat", start, notAnswering(2))
	r.observe("place", start, errors.New("i/o timeout"))
	if len(log.seen) != 3 {
		t.Fatalf("unexpected observations; got %+v; want 3", log.seen)
	}
	for i, want := range []bool{true, true, false} {
		s := log.seen[i]
		if s.err == nil {
			t.Fatalf("unexpected observation %d without an error: %+v", i, s)
		}
		if refused := s.d == 0; refused != want {
			t.Fatalf("unexpected duration for observation %d (%s, %v); got %v; want 0: %v", i, s.op, s.err, s.d, want)
		}
	}
}
