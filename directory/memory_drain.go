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
	if deadline != nil {
		// The queue's own copy: the caller's variable is not the queued
		// deadline (Heartbeat hands out copies in turn).
		d := *deadline
		deadline = &d
	}
	msg := ControlMessage{MsgID: NewMsgID(), Type: "wind_down", NS: ns, ID: id, Deadline: deadline}
	q.msgs = append(q.msgs, msg)
	q.touched = now
	if deadline != nil {
		m.windDowns[key] = memWindDown{ns: ns, id: id, epoch: r.epoch, at: *deadline}
		m.dueWindDown(key, *deadline)
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

// windDue is a timed wind-down's deadline as queued for the sweep: the
// row key and the deadline it was queued with. An entry is stale, and
// skipped, once its key has no wind-down or one with a later deadline (a
// later WindDown queued that one again).
type windDue struct {
	key string
	at  time.Time
}

// windDueHeap is a min-heap of windDue by deadline. Hand-rolled rather
// than container/heap, whose Pop boxes every entry in an interface: an
// allocation per freed row under m.mu.
type windDueHeap []windDue

func (h *windDueHeap) push(e windDue) {
	*h = append(*h, e)
	q := *h
	for i := len(q) - 1; i > 0; {
		p := (i - 1) / 2
		if !q[i].at.Before(q[p].at) {
			break
		}
		q[i], q[p] = q[p], q[i]
		i = p
	}
}

func (h *windDueHeap) pop() windDue {
	q := *h
	e := q[0]
	n := len(q) - 1
	q[0] = q[n]
	q[n] = windDue{}
	q = q[:n]
	for i := 0; ; {
		c := 2*i + 1
		if c >= n {
			break
		}
		if c+1 < n && q[c+1].at.Before(q[c].at) {
			c++
		}
		if !q[c].at.Before(q[i].at) {
			break
		}
		q[i], q[c] = q[c], q[i]
		i = c
	}
	*h = q
	return e
}

// dueWindDown queues key's wind-down deadline for the sweep. Stale
// entries (wind-downs revoked, freed, or queued again) would pile up to
// their deadlines — up to a week — so the heap is rebuilt from
// m.windDowns once it holds twice as many as are live. Callers hold m.mu.
func (m *Memory) dueWindDown(key string, at time.Time) {
	if len(m.windDue) > 2*len(m.windDowns)+1024 {
		clear(m.windDue)
		m.windDue = m.windDue[:0]
		for k, w := range m.windDowns {
			m.windDue.push(windDue{key: k, at: w.at})
		}
		return // key's entry is among them
	}
	m.windDue.push(windDue{key: key, at: at})
}

// sweepWindDowns frees the placements whose wind-down deadline passed, if
// still the one wound down (the same epoch: a re-registration that
// reclaimed it keeps it; released and placed again, it is another): at
// most RegisterBatch of them per hold of m.mu, released in between, and
// only the due ones looked at. Walking every wind-down under the lock
// each sweep held it 3 ms with 100,000 waiting, and freeing 100,000 that
// fell due together 250 ms (BenchmarkMemoryScaleWindDownRelease100k).
// Called without m.mu.
func (m *Memory) sweepWindDowns(now time.Time) {
	m.inBatches(func() bool {
		for n := 0; n < RegisterBatch; n++ {
			if len(m.windDue) == 0 || now.Before(m.windDue[0].at) {
				return false
			}
			e := m.windDue.pop()
			w, ok := m.windDowns[e.key]
			if !ok || now.Before(w.at) {
				continue // stale: revoked, freed, or due later
			}
			delete(m.windDowns, e.key)
			if sh, key, r := m.row(w.ns, w.id); r.present() && r.epoch == w.epoch {
				m.freeRow(sh, key, r, w.ns, w.id)
			}
		}
		return len(m.windDue) > 0 && !now.Before(m.windDue[0].at)
	})
}
