package directory

import (
	"maps"
	"slices"
	"sync"
	"time"
)

// KnownSessions is an optional Store ability: answering, without a round
// trip to the store, what the registry checks before a heartbeat's
// challenge probe — the session's identity and whether its lease is live
// as far as this node knows.
//
// The registry reads a session before every heartbeat (R-REG-2: the 409
// rows come before the probe, the probe needs the advertise URL, and the
// credential must still cover the registration). On Redis that read was a
// script call of its own beside the heartbeat script: half of Redis's work
// for a heartbeat, and one more round trip on the registry pool's clock
// (docs/DIRECTORY.md, "Heartbeats"). A session's identity never changes
// (its s: record is written once, at register), and the lease a node's
// last heartbeat of the session returned is known, so the read can be
// skipped while that lease runs. What it may miss — the session dropped or
// superseded through another node, a timed drain capping the lease since —
// the heartbeat script checks again in the step that renews, and the
// registry reads the session afresh before it acts on a probe mismatch.
type KnownSessions interface {
	// KnownSession returns the session's identity — every SessionInfo
	// field but Headroom, Draining, Drain, DegradedSince and Placements,
	// which are not kept — and ok when this node saw the session live, with
	// a lease still running at now, in a read or a heartbeat's answer.
	// Degraded is the probe outcome this node last recorded: a hint, not
	// the store's state. The SessionInfo is the caller's.
	KnownSession(sessionID string, now time.Time) (*SessionInfo, bool)
}

var _ KnownSessions = (*Redis)(nil)

// beatSessions is a Redis node's record of the sessions that heartbeat
// through it (KnownSessions): identity and the last lease it learned.
// Entries go when the node learns the session ended (kill), when their
// lease passes (looked up, or pruned about once a lease), and on a wipe.
// Every session read through the node records one (heartbeats, releases,
// the proxy's cluster calls): bounded by the sessions read within about
// the last two leases. Safe for concurrent use.
type beatSessions struct {
	mu     sync.Mutex
	m      map[string]*SessionInfo
	pruned time.Time
}

// KnownSession implements KnownSessions.
func (r *Redis) KnownSession(sessionID string, now time.Time) (*SessionInfo, bool) {
	b := &r.beats
	b.mu.Lock()
	defer b.mu.Unlock()
	info := b.m[sessionID]
	if info == nil {
		return nil, false
	}
	if !now.Before(info.LeaseUntil) {
		delete(b.m, sessionID)
		return nil, false
	}
	c := *info
	c.Namespaces, c.Envs = slices.Clone(c.Namespaces), maps.Clone(c.Envs)
	return &c, true
}

// put records a session read from Redis: its identity and lease.
func (b *beatSessions) put(info *SessionInfo) {
	c := SessionInfo{
		SessionID: info.SessionID, ClientID: info.ClientID, Sub: info.Sub, Secret: info.Secret,
		AdvertiseURL: info.AdvertiseURL, Namespaces: slices.Clone(info.Namespaces),
		Hostname: info.Hostname, Env: info.Env, Envs: maps.Clone(info.Envs), Epoch: info.Epoch,
		Degraded: info.Degraded, LeaseUntil: info.LeaseUntil, RegisteredAt: info.RegisteredAt,
	}
	b.mu.Lock()
	if b.m == nil {
		b.m = make(map[string]*SessionInfo)
	}
	b.m[info.SessionID] = &c
	b.mu.Unlock()
}

// renew records a heartbeat's answer for a session already recorded.
func (b *beatSessions) renew(sid string, lease time.Time, degraded bool) {
	b.mu.Lock()
	if info := b.m[sid]; info != nil {
		info.LeaseUntil, info.Degraded = lease, degraded
	}
	b.mu.Unlock()
}

// forget drops a session the node learned is over.
func (b *beatSessions) forget(sid string) {
	b.mu.Lock()
	delete(b.m, sid)
	b.mu.Unlock()
}

// clear drops every entry (the directory was wiped).
func (b *beatSessions) clear() {
	b.mu.Lock()
	clear(b.m)
	b.mu.Unlock()
}

// prune drops the entries whose lease has passed — sessions that ended,
// or went on heartbeating through other nodes — at most once every
// interval, so that a sweep each second does not walk every entry.
func (b *beatSessions) prune(now time.Time, every time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if now.Sub(b.pruned) < every {
		return
	}
	b.pruned = now
	maps.DeleteFunc(b.m, func(_ string, info *SessionInfo) bool { return !now.Before(info.LeaseUntil) })
}
