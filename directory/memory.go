package directory

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"
)

// memoryShards spreads placement rows over independent locks so lookups on
// many cores do not contend on one RWMutex cache line.
const memoryShards = 64

// Memory is the in-process store behind REDIS_URL=memory: — one pinboard
// node, state lost on exit. It is a product feature for development and
// single-node deployments, and passes the same contract suite as Redis.
//
// Locking: mu guards sessions, drains, queues, the cold-start stamp and the
// epoch counter; every ownership decision holds it exclusively, which makes
// claims atomic. Placement rows live in shards with their own RWMutex so the
// hot Lookup takes only a shard read lock. Lock order: mu, then a shard.
type Memory struct {
	ttl time.Duration

	mu       sync.Mutex
	sessions map[string]*memSession
	// cands and ranked are Place's scratch for the policy, under mu: a
	// buffer handed to a Policy through its interface is allocated per
	// call otherwise.
	cands    []Candidate
	ranked   []int
	byNS     map[string]map[string]*memSession
	byClient map[string]map[string]*memSession
	// byURL: the session last registered at each advertise URL (a
	// registration voids the one it finds there, RegisterResult.Voided).
	byURL    map[string]*memSession
	drains   map[string]*memDrain
	queues   map[string]*memQueue
	bindings map[string]*memBinding
	tombs    map[string]memTomb
	// windDowns: the placements timed wind-downs free at their deadline,
	// by row key (sweepWindDowns).
	windDowns map[string]memWindDown
	// dropped: sessions gone, or live ones a timed drain force-releases,
	// with rows still to free (memory_drop.go).
	dropped map[string]*memSession
	stamp   time.Time
	epoch   uint64

	shards [memoryShards]memShard

	// afterBatch, when set (tests only, before use), runs between the
	// batches of a registration's instances, without the lock.
	afterBatch func()
	// afterDrop, when set (tests only, before use), runs between the
	// batches of rows a dropped session frees, without the lock.
	afterDrop func()
}

var (
	_ Store          = (*Memory)(nil)
	_ ExpiredCounter = (*Memory)(nil)
)

type memShard struct {
	mu   sync.RWMutex
	rows map[string]memRow
	_    [40]byte // keep neighbouring shard locks off one cache line
}

// memRow is a placement, held by value in its shard's map: a table of
// millions of rows is that many fewer objects for the collector to mark.
// The zero value is no row.
type memRow struct {
	owner *Owner
	sess  *memSession
	epoch uint64
}

// present reports whether r is a row (not the zero value a missing key
// reads as).
func (r memRow) present() bool { return r.sess != nil }

type memSession struct {
	owner *Owner
	info  SessionInfo
	rows  map[NSID]struct{}
}

type memDrain struct {
	state DrainState
	// released is set once a timed drain's forced release ran.
	released bool
	seen     time.Time
}

// memBinding is a {hostname}{ns} binding (R-LS-4).
type memBinding struct {
	hostname, ns, env string
	epoch             int64
}

// memTomb remembers a superseded session so its next heartbeat gets the
// superseded answer rather than "unknown session".
type memTomb struct {
	err   *SupersededError
	until time.Time
}

type memQueue struct {
	msgs    []ControlMessage
	touched time.Time
}

// NewMemory returns an empty memory store with the given lease TTL. Its
// epoch counter starts at the boot time in microseconds, so placement
// epochs keep growing across restarts of a memory: node and workers never
// see an epoch regress (their fences would answer 503).
func NewMemory(leaseTTL time.Duration, now time.Time) *Memory {
	m := &Memory{
		ttl:       leaseTTL,
		sessions:  make(map[string]*memSession),
		byNS:      make(map[string]map[string]*memSession),
		byClient:  make(map[string]map[string]*memSession),
		byURL:     make(map[string]*memSession),
		drains:    make(map[string]*memDrain),
		queues:    make(map[string]*memQueue),
		bindings:  make(map[string]*memBinding),
		tombs:     make(map[string]memTomb),
		windDowns: make(map[string]memWindDown),
		dropped:   make(map[string]*memSession),
		epoch:     uint64(now.UnixMicro()),
	}
	for i := range m.shards {
		m.shards[i].rows = make(map[string]memRow)
	}
	return m
}

// Name implements Store.
func (m *Memory) Name() string { return "memory" }

// Close implements Store.
func (m *Memory) Close() error { return nil }

func (m *Memory) shard(key []byte) *memShard { return &m.shards[fnv32(key)%memoryShards] }

// shardOf is shard for a key held as a string.
func (m *Memory) shardOf(key string) *memShard { return &m.shards[fnv32(key)%memoryShards] }

// fnv32 is FNV-1a of key.
func fnv32[K string | []byte](key K) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return h
}

// Lookup implements Store. Fast path: one shard read lock, no allocation.
func (m *Memory) Lookup(ns, id []byte, now time.Time) (Route, bool) {
	var buf [320]byte
	key := appendKeyBytes(buf[:0], ns, id)
	sh := m.shard(key)
	sh.mu.RLock()
	r := sh.rows[string(key)]
	sh.mu.RUnlock()
	if !r.present() || !r.owner.Live(now) {
		return Route{}, false
	}
	return Route{Owner: r.owner, Epoch: r.epoch}, true
}

// row returns ns/id's shard, key and row (the zero memRow: none). The key is a
// string, built once: a placement inserts it as the row's key and the
// session's row set refers into it (putRow).
func (m *Memory) row(ns, id string) (*memShard, string, memRow) {
	key := string(appendKey(make([]byte, 0, len(ns)+len(id)+1), ns, id))
	sh := m.shardOf(key)
	sh.mu.RLock()
	r := sh.rows[key]
	sh.mu.RUnlock()
	return sh, key, r
}

// setRow installs a row; callers hold m.mu.
func (m *Memory) setRow(sh *memShard, key, ns, id string, s *memSession) memRow {
	m.epoch++
	return m.putRow(sh, key, ns, id, s, m.epoch)
}

// putRow points the row at s with the given epoch; callers hold m.mu.
func (m *Memory) putRow(sh *memShard, key, ns, id string, s *memSession, epoch uint64) memRow {
	r := memRow{owner: s.owner, sess: s, epoch: epoch}
	sh.mu.Lock()
	old := sh.rows[key]
	sh.rows[key] = r
	sh.mu.Unlock()
	if old.present() && old.sess != s {
		delete(old.sess.rows, NSID{ns, id})
	}
	// The set's strings are the key's own bytes (ns, NUL, id): a placement
	// keeps one string alive, not the caller's two as well — fewer
	// objects for the collector to mark in a table of millions.
	s.rows[NSID{key[:len(ns)], key[len(ns)+1:]}] = struct{}{}
	return r
}

// dropSession removes a session's record: it is gone, its Owner revoked,
// its rows dead-owner rows any claim re-places. The rows themselves are
// freed a batch at a time (memory_drop.go). Callers hold m.mu.
func (m *Memory) dropSession(s *memSession) {
	s.owner.Revoke()
	delete(m.sessions, s.info.SessionID)
	for _, ns := range s.info.Namespaces {
		if set := m.byNS[ns]; set != nil {
			delete(set, s.info.SessionID)
			if len(set) == 0 {
				delete(m.byNS, ns)
			}
		}
	}
	delete(m.queues, s.info.SessionID)
	if m.byURL[s.info.AdvertiseURL] == s {
		delete(m.byURL, s.info.AdvertiseURL)
	}
	if set := m.byClient[s.info.ClientID]; set != nil {
		delete(set, s.info.SessionID)
		if len(set) == 0 {
			delete(m.byClient, s.info.ClientID)
		}
	}
}

// Place implements Store.
func (m *Memory) Place(_ context.Context, req *PlaceRequest) (Route, error) {
	now := req.Now
	m.mu.Lock()
	defer m.mu.Unlock()
	sh, key, r := m.row(req.NS, req.ID)
	if r.present() && r.owner.Live(now) && r.owner.SessionID != req.Exclude {
		return Route{Owner: r.owner, Epoch: r.epoch}, nil
	}
	if rem := m.quarantineLocked(now, true); rem > 0 {
		return Route{}, &QuarantineError{Remaining: rem}
	}
	set := m.byNS[req.NS]
	hostBound := false
	if req.Host != "" {
		for _, s := range set {
			if s.owner.Live(now) && sameHost(s.info.Hostname, req.Host) {
				hostBound = true
				break
			}
		}
	}
	var sessions [16]*memSession
	sess := sessions[:0]
	live := false
	for _, s := range set {
		if !s.owner.Live(now) {
			continue
		}
		live = true
		if !m.eligible(s, now) || s.info.SessionID == req.Exclude || (hostBound && !sameHost(s.info.Hostname, req.Host)) {
			continue
		}
		sess = append(sess, s)
	}
	if !live {
		return Route{}, ErrUnknownNamespace
	}
	if len(sess) == 0 {
		return Route{}, ErrNoEligible
	}
	// Session-id order, as the Redis store gives them: a policy's ties
	// must not follow map order (Policy).
	slices.SortFunc(sess, func(a, b *memSession) int { return strings.Compare(a.info.SessionID, b.info.SessionID) })
	cands := m.cands[:0]
	for _, s := range sess {
		cands = append(cands, Candidate{SessionID: s.info.SessionID, ClientID: s.info.ClientID, Headroom: s.info.Headroom})
	}
	policy := req.Policy
	if policy == nil {
		policy = DefaultPolicy
	}
	ranked := policy.Rank(m.ranked[:0], cands, &req.Pick)
	if len(ranked) == 0 {
		panic("BUG: policy ranked no candidate")
	}
	s := sess[ranked[0]]
	clear(cands) // no session ids kept past the call
	m.cands, m.ranked = cands[:0], ranked[:0]
	nr := m.setRow(sh, key, req.NS, req.ID, s)
	s.info.Headroom--
	return Route{Owner: s.owner, Epoch: nr.epoch, Placed: true, Replaced: r.present()}, nil
}

// eligible: live, not draining by its own flag or an operator drain, not
// degraded (R-PL-1, R-LS-3), and no forced release of its rows under way
// (R-LS-5).
func (m *Memory) eligible(s *memSession, now time.Time) bool {
	if s.info.Draining || s.info.Degraded {
		return false
	}
	if d := m.drains[s.info.ClientID]; d != nil && d.state.Draining {
		return false
	}
	// Listed while live: a forced release (R-LS-5) still freeing its rows,
	// which frees whatever the session holds, so an id placed on it now —
	// its client undrained before the last batch — would be freed too.
	if m.dropped[s.info.SessionID] == s {
		return false
	}
	return true
}

// quarantineLocked returns the remaining cold-start quarantine; stamp
// starts it on the first placement attempt (R-CS-1).
func (m *Memory) quarantineLocked(now time.Time, stamp bool) time.Duration {
	if m.stamp.IsZero() {
		if !stamp {
			return 0
		}
		m.stamp = now
	}
	rem := m.stamp.Add(m.ttl).Sub(now)
	if rem < 0 {
		return 0
	}
	return rem
}

// Quarantine implements Store.
func (m *Memory) Quarantine(_ context.Context, now time.Time) (time.Duration, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.quarantineLocked(now, false), nil
}

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

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

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
	res := &BeatResult{Draining: beat.Draining}
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

// freeRow deletes the row r of ns/id at key in sh; callers hold m.mu.
func (m *Memory) freeRow(sh *memShard, key string, r memRow, ns, id string) {
	sh.mu.Lock()
	delete(sh.rows, key)
	sh.mu.Unlock()
	delete(r.sess.rows, NSID{ns, id})
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

// Placement implements Store.
func (m *Memory) Placement(_ context.Context, ns, id string, now time.Time) (*PlacementInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, _, r := m.row(ns, id)
	if !r.present() {
		return nil, ErrNoPlacement
	}
	return &PlacementInfo{
		NS: ns, ID: id,
		SessionID: r.owner.SessionID,
		ClientID:  r.owner.ClientID,
		Advertise: r.owner.AdvertiseURL,
		Epoch:     r.epoch,
		Live:      r.owner.Live(now),
	}, nil
}

// Sweep implements Store: sessions one lease past their expiry go;
// control queues expire two leases after their last use (R-CM-1); timed
// drains past their deadline force-release the client's placements
// (R-LS-5), its sessions staying until their capped lease passes. The
// rows of both — with any other dropped session's left — are freed a
// batch at a time after (freeDropped).
func (m *Memory) Sweep(_ context.Context, now time.Time) error {
	m.sweepRecords(now)
	m.freeDropped()
	return nil
}

// sweepRecords is Sweep but for the freeing of dropped sessions' rows.
func (m *Memory) sweepRecords(now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range m.sessions {
		if now.Sub(s.owner.LeaseUntil()) > m.ttl {
			m.dropSession(s)
			m.retire(s)
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
	m.sweepWindDowns(now)
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

// goneErr explains a missing session: superseded (R-LS-4) or unknown.
func (m *Memory) goneErr(id string, now time.Time) error {
	if t, ok := m.tombs[id]; ok && !now.After(t.until) {
		e := *t.err
		return &e
	}
	return ErrUnknownSession
}

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
