package directory

import (
	"context"
	"time"
)

// Sweep implements Store: sessions one lease past their expiry go;
// control queues expire two leases after their last use (R-CM-1); timed
// drains past their deadline force-release the client's placements
// (R-LS-5), its sessions staying until their capped lease passes. The
// rows of both — with any other dropped session's left — and those of
// timed wind-downs past their deadline (R-CM-1) are freed a batch at a
// time after (sweepWindDowns, freeDropped).
func (m *Memory) Sweep(_ context.Context, now time.Time) error {
	m.dropLapsed(m.sweepRecords(now))
	m.sweepWindDowns(now)
	m.freeDropped()
	return nil
}

// sweepRecords is Sweep but for the dropping of the sessions one lease
// past their expiry, which it returns, and the freeing of rows: dropped
// sessions' and those of due wind-downs.
func (m *Memory) sweepRecords(now time.Time) []*memSession {
	m.mu.Lock()
	defer m.mu.Unlock()
	var lapsed []*memSession
	for _, s := range m.sessions {
		if now.Sub(s.owner.LeaseUntil()) > m.ttl {
			lapsed = append(lapsed, s)
		}
	}
	for id, q := range m.queues {
		if now.Sub(q.touched) > 2*m.ttl {
			delete(m.queues, id)
		}
	}
	for id, t := range m.tombs {
		if now.After(t.until) {
			delete(m.tombs, id)
		}
	}
	m.sweepBindings(now)
	var live map[string]bool // clients with a live session, once a drain needs it
	for clientID, d := range m.drains {
		if d.state.Draining && !d.state.Deadline.IsZero() && !d.released && !now.Before(d.state.Deadline) {
			// Listed for freeDropped under this same hold, so the flag is
			// never set without the rows to free recorded.
			d.released = true
			for _, s := range m.byClient[clientID] {
				m.retire(s)
			}
		}
		if now.Sub(d.seen) > 2*m.ttl {
			if live == nil {
				live = m.liveClients(now)
			}
			if !live[clientID] {
				delete(m.drains, clientID)
			}
		}
	}
	return lapsed
}

// dropLapsed drops the sessions sweepRecords found lapsed, RegisterBatch
// per hold of m.mu, each namespace's index compacted once a batch: a
// fleet-wide outage lapses thousands together, and dropping 10,000 in one
// hold held every other call 8-17 ms (BenchmarkMemoryScaleSweepLapse).
// One lapsed past its lease can only be dropped: no heartbeat renews it,
// though a registration of its process may drop it first (then skipped).
// Called without m.mu.
func (m *Memory) dropLapsed(lapsed []*memSession) {
	if len(lapsed) == 0 {
		return
	}
	touched := make(map[string]struct{})
	m.inBatches(func() bool {
		n := min(RegisterBatch, len(lapsed))
		for _, s := range lapsed[:n] {
			if m.sessions[s.info.SessionID] != s {
				continue
			}
			m.dropRecord(s)
			m.retire(s)
			for _, ns := range s.info.Namespaces {
				touched[ns] = struct{}{}
			}
		}
		for ns := range touched {
			m.compactNS(ns)
		}
		clear(touched)
		lapsed = lapsed[n:]
		return len(lapsed) > 0
	})
}

// sweepBindings drops the bindings no live session holds. One pass over
// the sessions finds the held ones: bindingState for each binding looked
// at every session, bindings × sessions under the store's lock — with
// hostname-aware fleets (a binding per hostname and namespace) that held
// off every request for the sweep's length.
func (m *Memory) sweepBindings(now time.Time) {
	if len(m.bindings) == 0 {
		return
	}
	held := make(map[*memBinding]bool, len(m.bindings))
	var key []byte // bindingKey, built without a string per look
	for _, s := range m.sessions {
		if s.info.Hostname == "" || !s.owner.Live(now) {
			continue
		}
		for _, ns := range s.info.Namespaces {
			key = appendBindingKey(key[:0], s.info.Hostname, ns)
			if b := m.bindings[string(key)]; b != nil && holdsBinding(&s.info, b.hostname, b.ns, b.env, b.epoch) {
				held[b] = true
			}
		}
	}
	for k, b := range m.bindings {
		if !held[b] {
			delete(m.bindings, k)
		}
	}
}

// liveClients returns the clients with a live session.
func (m *Memory) liveClients(now time.Time) map[string]bool {
	live := make(map[string]bool)
	for _, s := range m.sessions {
		if s.owner.Live(now) {
			live[s.info.ClientID] = true
		}
	}
	return live
}
