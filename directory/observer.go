package directory

import "time"

// CommandObserver sees every round trip a networked store makes (a Redis
// command, pipeline or script), for metrics. op names the operation with a
// small fixed vocabulary ("place", "heartbeat", "lookup", …) — never a key,
// an id or anything else unbounded. err is the round trip's error, nil on
// success; domain outcomes (unknown session, no placement) are not errors.
// d is 0 for a call refused without a round trip (Redis held as not
// answering, gatedClient): an error with no latency, which would
// otherwise fill a latency histogram with near-zero figures during an
// outage.
//
// Implementations must be safe for concurrent use and must not block or
// allocate: stores call them on the hot path. *metrics.Metrics is one.
type CommandObserver interface {
	StoreCommand(op string, d time.Duration, err error)
}

// NopCommandObserver records nothing; stores use it when given nil.
type NopCommandObserver struct{}

// StoreCommand implements CommandObserver.
func (NopCommandObserver) StoreCommand(string, time.Duration, error) {}
