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
	cands  []Candidate
	ranked []int
	picks  []*memSession
	// byNS: the sessions serving each namespace in session-id order, the
	// order Place hands a policy its candidates in: sorting them per
	// placement took 1-4 ms under mu with 10,000 sessions in a namespace,
	// holding every other call (BenchmarkMemoryScalePlace).
	byNS     map[string][]*memSession
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
	// windDue: the same by deadline, soonest first, so the sweep touches
	// only the due ones (memory_drain.go); stale entries are skipped.
	windDue windDueHeap
	// dropped: sessions gone, or live ones a timed drain force-releases,
	// with rows still to free (memory_drop.go).
	dropped map[string]*memSession
	stamp   time.Time
	epoch   uint64

	shards [memoryShards]memShard
	// longKeys builds Lookup keys past lookupKeyLen.
	longKeys keyPool

	// afterBatch, when set (tests only, before use), runs between the
	// batches of a registration's instances, without the lock.
	afterBatch func()
	// afterDrop, when set (tests only, before use), runs between the
	// batches of rows a dropped session or due wind-downs free, without
	// the lock.
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
	// gone is set when the session's record is dropped (dropRecord).
	gone bool
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
		byNS:      make(map[string][]*memSession),
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
	if len(ns)+len(id)+1 > lookupKeyLen {
		kb := m.longKeys.get()
		key := appendKeyBytes(*kb, ns, id)
		rt, ok := m.lookupKey(key, now)
		m.longKeys.put(kb, key)
		return rt, ok
	}
	var buf [lookupKeyLen]byte
	return m.lookupKey(appendKeyBytes(buf[:0], ns, id), now)
}

func (m *Memory) lookupKey(key []byte, now time.Time) (Route, bool) {
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
	if w, ok := m.windDowns[key]; ok && old.present() && w.epoch == old.epoch && epoch != old.epoch {
		delete(m.windDowns, key) // the placement wound down is replaced (freeRow)
	}
	// The set's strings are the key's own bytes (ns, NUL, id): a placement
	// keeps one string alive, not the caller's two as well — fewer
	// objects for the collector to mark in a table of millions.
	s.rows[NSID{key[:len(ns)], key[len(ns)+1:]}] = struct{}{}
	return r
}

// freeRow deletes the row r of ns/id at key in sh, and the timed
// wind-down of that placement: it can no longer fire (a placement again
// has a new epoch), and kept to its deadline — up to a week — the sweep
// walked it every second; callers hold m.mu.
func (m *Memory) freeRow(sh *memShard, key string, r memRow, ns, id string) {
	sh.mu.Lock()
	delete(sh.rows, key)
	sh.mu.Unlock()
	delete(r.sess.rows, NSID{ns, id})
	if w, ok := m.windDowns[key]; ok && w.epoch == r.epoch {
		delete(m.windDowns, key)
	}
}

// dropSession removes a session's record: it is gone, its Owner revoked,
// its rows dead-owner rows any claim re-places. The rows themselves are
// freed a batch at a time (memory_drop.go). Callers hold m.mu.
func (m *Memory) dropSession(s *memSession) {
	m.dropRecord(s)
	for _, ns := range s.info.Namespaces {
		m.unindexNS(ns, s)
	}
}

// dropRecord is dropSession but for byNS, which the caller compacts
// (unindexNS, or compactNS after many). Callers hold m.mu.
func (m *Memory) dropRecord(s *memSession) {
	s.gone = true
	s.owner.Revoke()
	delete(m.sessions, s.info.SessionID)
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

// LeaseTTL is the lease every registration and heartbeat gets (R-LS-1).
func (m *Memory) LeaseTTL() time.Duration { return m.ttl }

// Place implements Store.
func (m *Memory) Place(_ context.Context, req *PlaceRequest) (Route, error) {
	now := req.Now
	m.mu.Lock()
	defer m.mu.Unlock()
	sh, key, r := m.row(req.NS, req.ID)
	if r.present() && r.owner.Live(now) && !req.excludes(r.owner.SessionID, r.epoch) {
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
	sess := m.picks[:0]
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
	defer func() {
		clear(sess) // no sessions kept alive past the call
		m.picks = sess[:0]
	}()
	if !live {
		return Route{}, ErrUnknownNamespace
	}
	if len(sess) == 0 {
		return Route{}, ErrNoEligible
	}
	// sess is in session-id order (byNS), as the Redis store gives them: a
	// policy's ties must not follow map order (Policy).
	cands := m.cands[:0]
	for _, s := range sess {
		cands = append(cands, Candidate{SessionID: s.info.SessionID, ClientID: s.info.ClientID, Headroom: s.info.Headroom})
	}
	ranked := req.rank(m.ranked[:0], cands)
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

// indexNS adds s to the sessions serving ns, in session-id order;
// callers hold m.mu.
func (m *Memory) indexNS(ns string, s *memSession) {
	set := m.byNS[ns]
	if i, found := slices.BinarySearchFunc(set, s.info.SessionID, bySessionID); !found {
		m.byNS[ns] = slices.Insert(set, i, s)
	}
}

// unindexNS removes s from the sessions serving ns; callers hold m.mu.
func (m *Memory) unindexNS(ns string, s *memSession) {
	set := m.byNS[ns]
	i, found := slices.BinarySearchFunc(set, s.info.SessionID, bySessionID)
	if !found || set[i] != s {
		return
	}
	if set = slices.Delete(set, i, i+1); len(set) == 0 {
		delete(m.byNS, ns)
	} else {
		m.byNS[ns] = set
	}
}

// compactNS removes the dropped sessions (dropRecord) from the sessions
// serving ns in one pass; callers hold m.mu.
func (m *Memory) compactNS(ns string) {
	set := m.byNS[ns]
	if set = slices.DeleteFunc(set, func(s *memSession) bool { return s.gone }); len(set) == 0 {
		delete(m.byNS, ns)
	} else {
		m.byNS[ns] = set
	}
}

func bySessionID(s *memSession, id string) int { return strings.Compare(s.info.SessionID, id) }

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

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
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
