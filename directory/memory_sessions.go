package directory

import (
	"context"
	"maps"
	"slices"
	"time"
)

// liveSession returns a session inside its lease; callers hold m.mu.
func (m *Memory) liveSession(id string, now time.Time) *memSession {
	s := m.sessions[id]
	if s == nil || !s.owner.Live(now) {
		return nil
	}
	return s
}

// Session implements Store.
func (m *Memory) Session(_ context.Context, sessionID string, now time.Time) (*SessionInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.liveSession(sessionID, now)
	if s == nil {
		return nil, m.goneErr(sessionID, now)
	}
	info := m.infoLocked(s)
	return &info, nil
}

func (m *Memory) infoLocked(s *memSession) SessionInfo {
	info := s.info
	info.Namespaces = slices.Clone(info.Namespaces)
	info.Envs = maps.Clone(info.Envs)
	info.LeaseUntil = s.owner.LeaseUntil()
	info.Placements = len(s.rows)
	if d := m.drains[s.info.ClientID]; d != nil {
		info.Drain = d.state
	}
	return info
}

// Heartbeat implements Store.
func (m *Memory) Heartbeat(_ context.Context, beat *Beat, now time.Time) (*BeatResult, error) {
	// The acks as a set, made before the lock: a body may list tens of
	// thousands (up to its 1 MiB), and checking each queued message
	// against the list held every other call for hundreds of ms (R-CM-1).
	var acked map[string]struct{}
	if len(beat.Acks) > 0 {
		acked = make(map[string]struct{}, len(beat.Acks))
		for _, a := range beat.Acks {
			acked[a] = struct{}{}
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.liveSession(beat.SessionID, now)
	if s == nil {
		return nil, m.goneErr(beat.SessionID, now)
	}
	if s.info.Sub != beat.Sub {
		return nil, ErrForbidden
	}
	res := &BeatResult{Draining: beat.Draining, WasDegraded: s.info.Degraded, WasDraining: s.info.Draining}
	lease := now.Add(m.ttl)
	if d := m.drains[s.info.ClientID]; d != nil {
		d.seen = now
		res.Drain = d.state
		res.Draining = res.Draining || d.state.Draining
		lease = capLease(lease, d.state, m.ttl)
	}
	s.owner.SetLeaseUntil(lease)
	s.info.LeaseUntil = lease
	res.LeaseUntil = lease
	s.info.Headroom = beat.Headroom
	s.info.Draining = beat.Draining
	switch {
	case beat.Degraded && !s.info.Degraded:
		s.info.Degraded, s.info.DegradedSince = true, now
	case !beat.Degraded:
		s.info.Degraded, s.info.DegradedSince = false, time.Time{}
	}
	if q := m.queues[beat.SessionID]; q != nil {
		if len(acked) > 0 {
			q.msgs = slices.DeleteFunc(q.msgs, func(c ControlMessage) bool {
				_, ok := acked[c.MsgID]
				return ok
			})
		}
		q.touched = now
		res.Messages = slices.Clone(q.msgs)
		// The deadlines are copied too, into one array for the lot: no
		// answer shares memory with the queue, as none does on the Redis
		// store, which decodes each anew. Revokes (no deadline) need none.
		n := 0
		for _, msg := range res.Messages {
			if msg.Deadline != nil {
				n++
			}
		}
		if n > 0 {
			deadlines := make([]time.Time, 0, n)
			for i, msg := range res.Messages {
				if msg.Deadline != nil {
					deadlines = append(deadlines, *msg.Deadline)
					res.Messages[i].Deadline = &deadlines[len(deadlines)-1]
				}
			}
		}
	}
	return res, nil
}

// Void implements Store. The session goes at once, under one hold of
// the lock; its rows are then freed a batch per hold (finishDrop). A session another call is still dropping is finished too.
func (m *Memory) Void(_ context.Context, sessionID string, _ time.Time) error {
	m.mu.Lock()
	s := m.sessions[sessionID]
	if s != nil {
		m.dropSession(s)
		m.retire(s)
	} else {
		s = m.dropped[sessionID]
	}
	m.mu.Unlock()
	if s != nil {
		m.finishDrop(s)
	}
	return nil
}

// Deregister implements Store.
func (m *Memory) Deregister(ctx context.Context, sessionID string, now time.Time) error {
	return m.Void(ctx, sessionID, now)
}

// Release implements Store.
func (m *Memory) Release(ctx context.Context, req *ReleaseRequest, now time.Time) (bool, error) {
	n, err := m.ReleaseBatch(ctx, []ReleaseRequest{*req}, now)
	return n == 1, err
}

// releaseLocked frees req's row if its session still holds it (at its
// epoch, when non-zero); callers hold m.mu.
func (m *Memory) releaseLocked(req *ReleaseRequest) bool {
	sh, key, r := m.row(req.NS, req.ID)
	if !r.present() || r.owner.SessionID != req.SessionID || (req.Epoch != 0 && r.epoch != req.Epoch) {
		return false
	}
	m.freeRow(sh, key, r, req.NS, req.ID)
	return true
}

// ReleaseBatch implements Store: the lock is held RegisterBatch releases
// at a time, so other calls proceed in between however many a worker
// sends.
func (m *Memory) ReleaseBatch(_ context.Context, reqs []ReleaseRequest, _ time.Time) (int, error) {
	n := 0
	for start := 0; start < len(reqs); start += RegisterBatch {
		m.mu.Lock()
		for i := start; i < min(start+RegisterBatch, len(reqs)); i++ {
			if m.releaseLocked(&reqs[i]) {
				n++
			}
		}
		m.mu.Unlock()
	}
	return n, nil
}

// Workers implements Store.
func (m *Memory) Workers(_ context.Context, now time.Time) ([]SessionInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]SessionInfo, 0, len(m.sessions))
	for _, s := range m.sessions {
		if s.owner.Live(now) {
			out = append(out, m.infoLocked(s))
		}
	}
	slices.SortFunc(out, func(a, b SessionInfo) int {
		if c := a.RegisteredAt.Compare(b.RegisteredAt); c != 0 {
			return c
		}
		return compareStrings(a.SessionID, b.SessionID)
	})
	return out, nil
}

// Expired implements ExpiredCounter.
func (m *Memory) Expired(_ context.Context, now time.Time) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, s := range m.sessions {
		if !s.owner.Live(now) {
			n++
		}
	}
	return n, nil
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// goneErr explains a missing session: superseded (R-LS-4) or unknown.
func (m *Memory) goneErr(id string, now time.Time) error {
	if t, ok := m.tombs[id]; ok && !now.After(t.until) {
		e := *t.err
		return &e
	}
	return ErrUnknownSession
}
