package directory

// A dropped session (deregister, void, sweep, supersede, hand-over) goes
// at once: its record and indexes under one hold of m.mu (dropSession).
// Its rows, dead-owner rows from then on (Lookup and Place check the
// owner, revoked), are then freed RegisterBatch at a time, the lock
// released in between, so that dropping a session holding 100,000 ids
// does not hold every other call (docs/DIRECTORY.md, "Scripts"; Redis
// does the same in redis_drop.lua). The forced release of a timed drain
// (R-LS-5) frees the rows of live sessions the same way (Sweep).

// retire lists a dropped session, or a live one a timed drain
// force-releases, with rows left, so that a repeated drop or the sweep
// finishes it. Callers hold m.mu.
func (m *Memory) retire(s *memSession) {
	if len(s.rows) > 0 {
		m.dropped[s.info.SessionID] = s
	}
}

// freeRows frees at most RegisterBatch rows of a retired session — those
// still pointing at it are deleted — and reports whether rows remain.
// Callers hold m.mu.
func (m *Memory) freeRows(s *memSession) bool {
	n := 0
	for k := range s.rows {
		if n == RegisterBatch {
			break
		}
		n++
		delete(s.rows, k)
		// Rows change only under m.mu, held here: what row read is current.
		if sh, key, r := m.row(k.NS, k.ID); r.present() && r.sess == s {
			m.freeRow(sh, key, r, k.NS, k.ID)
		}
	}
	if len(s.rows) > 0 {
		return true
	}
	delete(m.dropped, s.info.SessionID)
	return false
}

// finishDrop frees the rows of a dropped session, a batch per hold of
// the lock, until none is left. Called without m.mu.
func (m *Memory) finishDrop(s *memSession) {
	m.inBatches(func() bool { return m.freeRows(s) })
}

// finishDrops runs finishDrop for each session.
func (m *Memory) finishDrops(list []*memSession) {
	for _, s := range list {
		m.finishDrop(s)
	}
}

// freeDropped frees the rows of every dropped session, a batch per hold
// of the lock, until none is left. Called without m.mu.
func (m *Memory) freeDropped() {
	m.inBatches(func() bool {
		for _, s := range m.dropped {
			return m.freeRows(s) || len(m.dropped) > 0
		}
		return false
	})
}

// inBatches runs step, which frees one batch and reports whether more is
// left, under m.mu until it reports none, releasing the lock (and running
// afterDrop) in between. Called without m.mu.
func (m *Memory) inBatches(step func() bool) {
	for first := true; ; first = false {
		if !first && m.afterDrop != nil {
			m.afterDrop()
		}
		m.mu.Lock()
		more := step()
		m.mu.Unlock()
		if !more {
			return
		}
	}
}
