package fleet

import (
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pinboard-go/pinboard/bench"
)

// Stats counts what the fleet's workers saw from pinboard. Safe for
// concurrent use.
type Stats struct {
	mu        sync.Mutex
	ack       *bench.Hist // heartbeat round trips, ns
	beats     uint64
	degraded  uint64
	byStatus  map[string]uint64
	registers map[string]uint64
	acksSent  uint64
	messages  atomic.Uint64
}

func newStats() *Stats {
	return &Stats{ack: bench.NewHist(), byStatus: map[string]uint64{}, registers: map[string]uint64{}}
}

func outcome(status int, err error) string {
	if err != nil {
		return "transport"
	}
	return strconv.Itoa(status)
}

func (s *Stats) heartbeat(d time.Duration, status int, err error, degraded bool, acks int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.beats++
	s.byStatus[outcome(status, err)]++
	if err == nil {
		s.ack.Record(int64(d))
	}
	if degraded {
		s.degraded++
	}
	s.acksSent += uint64(acks)
}

func (s *Stats) register(status int, err error) {
	s.mu.Lock()
	s.registers[outcome(status, err)]++
	s.mu.Unlock()
}

// Snapshot is Stats as JSON (times in microseconds).
type Snapshot struct {
	Heartbeats uint64            `json:"heartbeats"`
	ByStatus   map[string]uint64 `json:"byStatus"`
	Degraded   uint64            `json:"degraded"`
	Registers  map[string]uint64 `json:"registers"`
	Messages   uint64            `json:"messages"`
	AcksSent   uint64            `json:"acksSent"`
	AckP50us   float64           `json:"ackP50us"`
	AckP90us   float64           `json:"ackP90us"`
	AckP99us   float64           `json:"ackP99us"`
	AckP999us  float64           `json:"ackP999us"`
	AckMaxUs   float64           `json:"ackMaxUs"`
	AckMeanUs  float64           `json:"ackMeanUs"`
	// AckHist is the whole ack distribution, for merging phases.
	AckHist []bench.Bucket `json:"ackHist,omitempty"`
}

// Snapshot returns the counters; reset starts them again from zero.
func (s *Stats) Snapshot(reset bool) Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.ack.Quantiles([]float64{50, 90, 99, 99.9})
	out := Snapshot{
		Heartbeats: s.beats, Degraded: s.degraded, AcksSent: s.acksSent,
		ByStatus: map[string]uint64{}, Registers: map[string]uint64{},
		Messages: s.messages.Load(),
		AckP50us: us(q[0]), AckP90us: us(q[1]), AckP99us: us(q[2]), AckP999us: us(q[3]),
		AckMaxUs: us(s.ack.Max()), AckMeanUs: s.ack.Mean() / 1e3,
		AckHist: bench.BucketsOf(s.ack),
	}
	for k, v := range s.byStatus {
		out.ByStatus[k] = v
	}
	for k, v := range s.registers {
		out.Registers[k] = v
	}
	if reset {
		s.ack.Reset()
		s.beats, s.degraded, s.acksSent = 0, 0, 0
		clear(s.byStatus)
		clear(s.registers)
		s.messages.Store(0)
	}
	return out
}

func us(ns int64) float64 { return float64(ns) / 1e3 }
