package directory

import (
	"slices"
	"time"
)

type bindingPlan struct {
	hostname, ns, env string
	verdict           BindingVerdict
}

// planBindings decides every binding of a registration before anything
// changes, so a refused registration leaves no trace (R-LS-4).
func (m *Memory) planBindings(reg *Registration, now time.Time) ([]bindingPlan, error) {
	if reg.Hostname == "" {
		return nil, nil
	}
	plans := make([]bindingPlan, 0, len(reg.Namespaces))
	for _, ns := range reg.Namespaces {
		env := EnvOf(reg.Env, reg.Envs, ns)
		cur := BindingState{}
		if b := m.bindings[bindingKey(reg.Hostname, ns)]; b != nil {
			cur = m.bindingState(b, now)
		}
		v := DecideBinding(cur, env, reg.Epoch, reg.Takeover)
		if v == BindRefuse {
			return nil, &SupersededError{Hostname: reg.Hostname, NS: ns, Env: cur.Env, Epoch: cur.Epoch}
		}
		plans = append(plans, bindingPlan{reg.Hostname, ns, env, v})
	}
	return plans, nil
}

// applyBindings records the new session's bindings and supersedes the
// sessions it displaces: their records go at once, and they are returned:
// their rows, still pointing at them, are duplicates if listed, and are
// freed when the registration ends (Register). The earlier sessions of
// the process are handed over instead.
//
// Unlike the sessions Void and the sweep drop, superseded ones are not
// listed in m.dropped (retire), on purpose. Redis keeps them out of its
// 'dropped' set too while the registration's batches run, in
// 'displacing', which the sweep lists one lease on: a failed script call
// between batches must leave their rows to any node's sweep. Here nothing
// can fail between the supersede and Register's finishDrops (no I/O; a
// crash loses the whole store), so there is nothing for the sweep to
// finish. And listed, a concurrent Sweep or Void could
// free their rows while the registration's batches still run, turning ids
// they held into claims instead of the duplicates reclaim makes of them
// (it checks the row still points at a displaced session). Register drops
// the earlier sessions of the process unlisted too, after the batches: it
// frees their rows itself right after, with nothing that can fail.
func (m *Memory) applyBindings(s *memSession, plans []bindingPlan, earlier []*memSession, now time.Time) []*memSession {
	var displaced []*memSession
	for _, p := range plans {
		m.bindings[bindingKey(p.hostname, p.ns)] = &memBinding{hostname: p.hostname, ns: p.ns, env: p.env, epoch: s.info.Epoch}
		if p.verdict != BindSupersede {
			continue
		}
		for _, o := range m.sessions {
			if o == s || !o.owner.Live(now) || !sameHost(o.info.Hostname, p.hostname) || slices.Contains(earlier, o) {
				continue
			}
			if holdsBinding(&o.info, p.hostname, p.ns, p.env, s.info.Epoch) {
				continue
			}
			serves := false
			for _, n := range o.info.Namespaces {
				serves = serves || n == p.ns
			}
			if !serves {
				continue
			}
			m.tombs[o.info.SessionID] = memTomb{
				err:   &SupersededError{Hostname: p.hostname, NS: p.ns, Env: p.env, Epoch: s.info.Epoch, ClientID: o.info.ClientID},
				until: now.Add(2 * m.ttl),
			}
			m.dropSession(o)
			displaced = append(displaced, o)
		}
	}
	return displaced
}

// bindingState reports whether a live session still holds b.
func (m *Memory) bindingState(b *memBinding, now time.Time) BindingState {
	st := BindingState{Env: b.env, Epoch: b.epoch}
	for _, o := range m.sessions {
		if o.owner.Live(now) && holdsBinding(&o.info, b.hostname, b.ns, b.env, b.epoch) {
			st.Live = true
			break
		}
	}
	return st
}
