package directory

import (
	"context"
	"time"
)

// MemoryQueues exposes the number of control queues to tests.
func MemoryQueues(m *Memory) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.queues)
}

// Revalidate runs the era and connection check once, as the periodic
// check would.
func (r *Redis) Revalidate(ctx context.Context) error { return r.revalidate(ctx) }

// SetAfterRegisterBatch makes s call fn between two batches of the
// instances a registration reclaims, when the store is not held: tests
// interleave other calls there. Set it before s is used.
func SetAfterRegisterBatch(s Store, fn func()) {
	switch s := s.(type) {
	case *Memory:
		s.afterBatch = fn
	case *Redis:
		s.afterBatch = fn
	default:
		panic("BUG: unknown store")
	}
}

// SetAfterDropBatch makes s call fn between two batches of the rows a
// dropped session frees (a deregister, a void, a sweep, the end of a
// registration), or on the memory store the sweep of due timed
// wind-downs, when the store is not held. Set it before s is used.
func SetAfterDropBatch(s Store, fn func()) {
	switch s := s.(type) {
	case *Memory:
		s.afterDrop = fn
	case *Redis:
		s.afterDrop = fn
	default:
		panic("BUG: unknown store")
	}
}

// LuaLib is the helpers every directory script starts with.
var LuaLib = luaLib

// SetAfterSessionRead makes r call fn in resolve after it read unknown
// sessions from Redis and before it adopts them. Set it before r is used.
func SetAfterSessionRead(r *Redis, fn func()) { r.afterSessionRead = fn }

// LeaseGen counts the lease invalidations r has handled.
func LeaseGen(r *Redis) uint64 { return r.leaseGen.Load() }

// RefreshDirty re-reads every lease r marked as possibly changed, due or
// not, and reports how many it read.
func RefreshDirty(ctx context.Context, r *Redis) (int, error) { return r.refreshDue(ctx, true) }

// KnownLive reports whether r knows session sid and holds it live at now.
func KnownLive(r *Redis, sid string, now time.Time) bool {
	s := r.session(sid)
	return s != nil && s.owner.Live(now)
}

// MemoryBindings exposes the number of hostname bindings to tests.
func MemoryBindings(m *Memory) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.bindings)
}

// KnownSessionCount is how many sessions r keeps for KnownSessions.
func (r *Redis) KnownSessionCount() int {
	r.beats.mu.Lock()
	defer r.beats.mu.Unlock()
	return len(r.beats.m)
}

// DirtySessions counts the sessions r marked as possibly renewed.
func DirtySessions(r *Redis) int {
	r.smu.RLock()
	defer r.smu.RUnlock()
	n := 0
	for _, s := range r.sessions {
		if s.dirty.Load() {
			n++
		}
	}
	return n
}

// ErrNotAnswering is the error calls get while the node holds Redis for
// not answering.
var ErrNotAnswering = errNotAnswering

// MemorySizes counts every long-lived structure of m by name: a churn of
// sessions that all ended must leave each at its baseline.
func MemorySizes(m *Memory) map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	rows := 0
	for i := range m.shards {
		m.shards[i].mu.RLock()
		rows += len(m.shards[i].rows)
		m.shards[i].mu.RUnlock()
	}
	return map[string]int{
		"sessions": len(m.sessions), "byNS": len(m.byNS), "byClient": len(m.byClient),
		"byURL": len(m.byURL), "drains": len(m.drains), "queues": len(m.queues),
		"bindings": len(m.bindings), "tombs": len(m.tombs), "windDowns": len(m.windDowns),
		"dropped": len(m.dropped), "rows": rows,
	}
}

// RedisSizes counts every node-local structure of r by name.
func RedisSizes(r *Redis) map[string]int {
	rows, watch := 0, 0
	for i := range r.shards {
		r.shards[i].mu.RLock()
		rows += len(r.shards[i].rows)
		watch += len(r.shards[i].watch)
		r.shards[i].mu.RUnlock()
	}
	r.smu.RLock()
	sessions := len(r.sessions)
	r.smu.RUnlock()
	return map[string]int{"sessions": sessions, "beats": r.KnownSessionCount(), "rows": rows, "watch": watch}
}

// SetAfterViewRead makes r call fn in Place between the reads of its
// placement view and their store, with what was read: "members" (a
// namespace's member set) or "entries" (sessions' and clients' entries).
// Set it before r is used.
func SetAfterViewRead(r *Redis, fn func(what string)) { r.afterViewRead = fn }

// SetAfterClaim makes r call fn in Place between the claim script's reply
// and the read of the owner's session it names (sid). Set it before r is
// used.
func SetAfterClaim(r *Redis, fn func(sid string)) { r.afterClaim = fn }

// ViewVersions reports how many pushes r's placement view counted for the
// namespace ns and the session sid (0 when it holds no entry).
func ViewVersions(r *Redis, ns, sid string) (nsVer, headVer uint64) {
	s := r.session(sid)
	r.views.mu.Lock()
	defer r.views.mu.Unlock()
	if e := r.views.ns[ns]; e != nil {
		nsVer = e.ver
	}
	if s != nil {
		headVer = s.view.ver.Load()
	}
	return nsVer, headVer
}

// ViewClientVersion reports how many pushes r's placement view counted
// for the client cid's operator drain (0 when it holds no entry).
func ViewClientVersion(r *Redis, cid string) uint64 {
	r.views.mu.Lock()
	defer r.views.mu.Unlock()
	if c := r.views.clients[cid]; c != nil {
		return c.ver
	}
	return 0
}

// ViewCurrent reports whether r's placement view holds a current entry for
// the session sid and its client.
func ViewCurrent(r *Redis, sid string) bool {
	s := r.session(sid)
	if s == nil {
		return false
	}
	r.views.mu.Lock()
	defer r.views.mu.Unlock()
	c := s.view.client
	return s.view.current(r.views.gen) && c != nil && c.ok && c.gen == r.views.gen
}

// ViewSizes reports how many namespaces and clients r's placement view
// holds.
func ViewSizes(r *Redis) (namespaces, clients int) {
	r.views.mu.Lock()
	defer r.views.mu.Unlock()
	return len(r.views.ns), len(r.views.clients)
}
