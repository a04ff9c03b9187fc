package directory

import (
	"context"
	"time"
)

// capLease applies the timed drain cap: the lease never runs past the drain
// deadline plus one lease (R-LS-5).
func capLease(lease time.Time, d DrainState, ttl time.Duration) time.Time {
	if d.Draining && !d.Deadline.IsZero() {
		if limit := d.Deadline.Add(ttl); lease.After(limit) {
			return limit
		}
	}
	return lease
}

// SetDrain implements Store.
func (m *Memory) SetDrain(_ context.Context, clientID string, drain DrainState, now time.Time) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	found := false
	for _, s := range m.sessions {
		if s.info.ClientID == clientID && s.owner.Live(now) {
			found = true
			if drain.Draining {
				s.owner.SetLeaseUntil(capLease(s.owner.LeaseUntil(), drain, m.ttl))
			}
		}
	}
	if !drain.Draining {
		// Undrain clears the record even when no session is live: a
		// process between sessions must not stay drained for want of one.
		_, had := m.drains[clientID]
		delete(m.drains, clientID)
		return found || had, nil
	}
	if !found {
		return false, nil
	}
	m.drains[clientID] = &memDrain{state: drain, seen: now}
	return true, nil
}

// WindDown implements Store.
func (m *Memory) WindDown(_ context.Context, ns, id, owner string, deadline *time.Time, now time.Time) (string, string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, key, r := m.row(ns, id)
	if !r.present() || !r.owner.Live(now) {
		return "", "", ErrNoPlacement
	}
	sid := r.owner.SessionID
	if owner != "" && owner != sid {
		return "", "", ErrOwnerChanged
	}
	q := m.queues[sid]
	if q == nil {
		q = &memQueue{}
		m.queues[sid] = q
	}
	msg := ControlMessage{MsgID: NewMsgID(), Type: "wind_down", NS: ns, ID: id, Deadline: deadline}
	q.msgs = append(q.msgs, msg)
	q.touched = now
	if deadline != nil {
		m.windDowns[key] = memWindDown{ns: ns, id: id, epoch: r.epoch, at: *deadline}
	} else {
		delete(m.windDowns, key)
	}
	return msg.MsgID, sid, nil
}

// memWindDown is a timed wind-down's placement: ns/id at epoch, freed at
// at by the sweep (the heartbeat reference's deadline: "seconds from now
// until the placement is freed").
type memWindDown struct {
	ns, id string
	epoch  uint64
	at     time.Time
}

// sweepWindDowns frees the placements whose wind-down deadline passed, if
// still the one wound down (the same epoch: a re-registration that
// reclaimed it keeps it; released and placed again, it is another).
// Callers hold m.mu.
func (m *Memory) sweepWindDowns(now time.Time) {
	for k, w := range m.windDowns {
		if now.Before(w.at) {
			continue
		}
		delete(m.windDowns, k)
		if sh, key, r := m.row(w.ns, w.id); r.present() && r.epoch == w.epoch {
			m.freeRow(sh, key, r, w.ns, w.id)
		}
	}
}
