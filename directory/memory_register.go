package directory

import (
	"context"
	"maps"
	"slices"
	"strings"
	"time"
)

// Register implements Store. The lock is held to open the registration —
// decide the bindings (a refused registration leaves no trace), create
// the session, supersede what it displaces, name the earlier sessions of
// the process — then for each RegisterBatch of listed instances, released
// in between so heartbeats and placements proceed however many a worker
// lists, and once more to hand the earlier sessions over; the rows the
// sessions it superseded or handed over still hold are freed last, a
// batch per hold (memory_drop.go). Each id is
// claimed for the session, or is a duplicate when another live session
// holds it at that moment (R-REG-1). A session ended between batches
// (superseded, or dropped by a later registration of the same process)
// fails the registration; nothing more is written for it.
func (m *Memory) Register(_ context.Context, reg *Registration, now time.Time) (*RegisterResult, error) {
	m.mu.Lock()
	g, err := m.openRegistration(reg, now)
	if err != nil {
		m.mu.Unlock()
		return nil, err
	}
	n := 0
	for _, ns := range sortedKeys(reg.Instances) {
		serves := slices.Contains(g.s.info.Namespaces, ns)
		for _, id := range reg.Instances[ns] {
			if n > 0 && n%RegisterBatch == 0 {
				if err := m.nextBatch(g.s, now); err != nil {
					m.finishDrops(g.displaced)
					return nil, err
				}
			}
			n++
			m.reclaim(g, NSID{ns, id}, serves, now)
		}
	}
	m.handOverQueues(g.earlier, g.s, now)
	for _, e := range g.earlier {
		m.dropSession(e)
	}
	m.mu.Unlock()
	m.finishDrops(g.displaced)
	m.finishDrops(g.earlier)
	return g.res, nil
}

// memRegistering is one Register call in progress.
type memRegistering struct {
	s       *memSession
	earlier []*memSession // earlier sessions of the process, handed over last
	// displaced: the sessions it superseded; the rows they held are
	// taken, freed when the registration ends.
	displaced []*memSession
	res       *RegisterResult
}

// reclaim points one listed row at the new session, or reports it as a
// duplicate: of a namespace the session does not serve, or held by
// another live session that is not an earlier one of the process (or was
// when the registration came: a session it displaced). Callers hold m.mu.
func (m *Memory) reclaim(g *memRegistering, k NSID, serves bool, now time.Time) {
	sh, key, r := m.row(k.NS, k.ID)
	// r.sess == g.s: listed twice, or placed on the session between batches.
	taken := r.present() && r.sess != g.s && !slices.Contains(g.earlier, r.sess) &&
		(r.owner.Live(now) || slices.Contains(g.displaced, r.sess))
	switch {
	case !serves || taken:
		g.res.Duplicates = append(g.res.Duplicates, k)
	case r.present() && slices.Contains(g.earlier, r.sess):
		// Nothing placed it elsewhere since: the worker's instance holds
		// this epoch and releases at it (RegistrationClient.release).
		m.putRow(sh, key, k.NS, k.ID, g.s, r.epoch)
	case !r.present() || r.sess != g.s:
		m.setRow(sh, key, k.NS, k.ID, g.s)
	}
}

// nextBatch releases the lock between two batches of a registration's
// instances and takes it back; the session must still be there. Called
// with m.mu held; returns without it on error.
func (m *Memory) nextBatch(s *memSession, now time.Time) error {
	m.mu.Unlock()
	if m.afterBatch != nil {
		m.afterBatch()
	}
	m.mu.Lock()
	if m.sessions[s.info.SessionID] != s {
		err := registrationEnded(s.info.ClientID, s.info.SessionID, m.goneErr(s.info.SessionID, now))
		m.mu.Unlock()
		return err
	}
	return nil
}

// openRegistration is the first step of Register, under m.mu: it decides
// the bindings, creates the session, takes its bindings and supersedes the
// sessions they displace, applies an operator drain, and names the
// earlier sessions of the process. The superseded sessions are
// remembered: listed ids they held are duplicates, as they were another
// live session's when the registration came.
func (m *Memory) openRegistration(reg *Registration, now time.Time) (*memRegistering, error) {
	plans, err := m.planBindings(reg, now)
	if err != nil {
		return nil, err
	}
	id := NewSessionID()
	lease := now.Add(m.ttl)
	s := &memSession{
		owner: NewOwner(id, reg.ClientID, reg.AdvertiseURL, []byte(reg.Secret), lease),
		info: SessionInfo{
			SessionID:    id,
			ClientID:     reg.ClientID,
			Sub:          reg.Sub,
			Secret:       reg.Secret,
			AdvertiseURL: reg.AdvertiseURL,
			Namespaces:   slices.Clone(reg.Namespaces),
			Hostname:     reg.Hostname,
			Env:          reg.Env,
			Envs:         maps.Clone(reg.Envs),
			Epoch:        reg.Epoch,
			Headroom:     reg.Headroom,
			Draining:     reg.Draining,
			LeaseUntil:   lease,
			RegisteredAt: now,
		},
		rows: make(map[NSID]struct{}),
	}
	earlier := m.earlierSessions(reg)
	m.sessions[id] = s
	if m.byClient[reg.ClientID] == nil {
		m.byClient[reg.ClientID] = make(map[string]*memSession)
	}
	m.byClient[reg.ClientID][id] = s
	for _, ns := range s.info.Namespaces {
		m.indexNS(ns, s)
	}
	g := &memRegistering{s: s, earlier: earlier, res: &RegisterResult{SessionID: id, LeaseUntil: lease}}
	g.displaced = m.applyBindings(s, plans, earlier, now)
	m.takeURL(g, earlier)
	if d := m.drains[reg.ClientID]; d != nil {
		spendTimedDrain(&d.state, now, m.ttl)
		g.res.Drain = d.state
		d.seen = now
		g.res.LeaseUntil = capLease(lease, d.state, m.ttl)
		s.owner.SetLeaseUntil(g.res.LeaseUntil)
		s.info.LeaseUntil = g.res.LeaseUntil
	}
	return g, nil
}

// takeURL makes g's session the one registered at its advertise URL and
// voids the session of another process found there (RegisterResult.Voided,
// R-LS-3): the registration's probe was answered at that URL with the new
// session's secret, so the URL no longer reaches it. Its rows are taken,
// as a superseded session's are. Callers hold m.mu.
func (m *Memory) takeURL(g *memRegistering, earlier []*memSession) {
	url := g.s.info.AdvertiseURL
	o := m.byURL[url]
	m.byURL[url] = g.s
	if o == nil || o == g.s || slices.Contains(earlier, o) || slices.Contains(g.displaced, o) || m.sessions[o.info.SessionID] != o {
		return
	}
	m.dropSession(o)
	g.displaced = append(g.displaced, o)
	g.res.Voided = append(g.res.Voided, SessionRef{SessionID: o.info.SessionID, ClientID: o.info.ClientID})
}

// earlierSessions returns the sessions this registration continues
// (R-REG-1: process continuity). They hand their rows over, and whatever
// they held that the worker no longer lists is freed with them. clientId
// is minted per process, so every session of the same client and account
// is the process's: the one it names as previous, and any other — a
// registration whose answer was lost (the worker's HTTP timeout) left a
// session the worker never learnt, whose rows would otherwise come back as
// duplicates of the worker's own instances, which it would then abort.
//
// They come oldest first — the one named as previous, then the others by
// registration — as redis_register.lua lists them: their control messages
// are handed over in that order (handOverQueues), and a wind-down queued
// on an older session goes ahead of the revoke queued for it on a newer
// one. In map order, the revoke came first in about one run in seven and
// the worker aborted an instance it was told to keep (R-CM-1).
func (m *Memory) earlierSessions(reg *Registration) []*memSession {
	var out []*memSession
	for _, o := range m.byClient[reg.ClientID] {
		if o.info.Sub == reg.Sub {
			out = append(out, o)
		}
	}
	slices.SortFunc(out, func(a, b *memSession) int {
		switch {
		case a.info.SessionID == reg.PrevSessionID:
			return -1
		case b.info.SessionID == reg.PrevSessionID:
			return 1
		}
		if c := a.info.RegisteredAt.Compare(b.info.RegisteredAt); c != 0 {
			return c
		}
		return strings.Compare(a.info.SessionID, b.info.SessionID)
	})
	return out
}

// spendTimedDrain turns a timed drain whose cap (deadline plus one lease)
// has passed into an untimed one. The timed drain has done its work — the
// placements were released at the deadline and the old session ran out —
// so a process that is still alive and registers again stays out of new
// placements (draining) but gets a normal lease, instead of a lease that
// ends before it starts and a re-register every heartbeat for ever. An
// operator undrain brings it back.
func spendTimedDrain(d *DrainState, now time.Time, ttl time.Duration) {
	if d.Draining && !d.Deadline.IsZero() && !now.Before(d.Deadline.Add(ttl)) {
		d.Deadline = time.Time{}
	}
}

// handOverQueues moves the control messages queued for the earlier
// sessions' ids that s reclaimed onto s's queue (R-CM-1: delivered until
// acked — a session lost in between must not lose them; the worker
// forgets its pending acks when it registers, so delivering them again
// under s is safe). They go ahead of any queued on s between the batches
// of its registration: a message for an id was queued on an earlier
// session while that held the id, before any queued on s once s reclaimed
// it, and the worker applies them in order — a revoke delivered before
// its wind-down revoked nothing.
func (m *Memory) handOverQueues(earlier []*memSession, s *memSession, now time.Time) {
	var kept []ControlMessage
	for _, prev := range earlier {
		q := m.queues[prev.info.SessionID]
		if q == nil {
			continue
		}
		for _, c := range q.msgs {
			if _, ok := s.rows[NSID{c.NS, c.ID}]; ok {
				kept = append(kept, c)
			}
		}
	}
	if len(kept) == 0 {
		return
	}
	q := m.queues[s.info.SessionID]
	if q == nil {
		q = &memQueue{}
		m.queues[s.info.SessionID] = q
	}
	q.msgs = append(kept, q.msgs...)
	q.touched = now
}
