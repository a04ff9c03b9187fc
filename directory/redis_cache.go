package directory

import (
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"
)

// redisShards spreads the node-local placement cache over independent
// locks, as the memory store does.
const redisShards = 64

// The node-local placement cache: placement key → (owner, epoch), decoded
// once, read by Lookup with one shard read lock and no allocation.
//
// Invariant: an entry exists only while Redis tracks its key for this node
// (the entry came from a tracked read), so any later write of the key
// anywhere reaches onInvalidations and removes it. Two races would break
// that, and watches close both:
//
//   - a push arriving between a read and the insert of its value: the
//     insert must lose;
//   - a node's own write: Redis invalidates the writer too (no NOLOOP), so
//     the push caused by our own claim must not remove the entry we insert
//     from that claim's tracked read-back.
//
// A watch counts the pushes for one key while an operation on it is in
// flight. The operation knows how many pushes it caused itself (one per
// key its script wrote, see execTracked), and inserts only if the count is
// exactly that; any other push is a write it did not see, and wins. A
// watch also remembers the connection generation: once the revalidator
// finds the tracking connection replaced (redis_sessions.go), reads made
// on the old one never enter the cache.
type redisShard struct {
	mu    sync.RWMutex
	rows  map[string]redisRow
	watch map[string]*redisWatch
	_     [32]byte // keep neighbouring shard locks off one cache line
}

type redisRow struct {
	owner *Owner
	epoch uint64
}

// redisWatch counts invalidations of one key; refs is how many operations
// hold it. Both are guarded by the shard lock.
type redisWatch struct {
	n    uint64
	refs int
}

func (r *Redis) shardBytes(key []byte) *redisShard { return &r.shards[fnv32(key)%redisShards] }

func (r *Redis) shardOf(key string) *redisShard { return &r.shards[fnv32(key)%redisShards] }

// Lookup implements Store. Fast path: one shard read lock, no allocation,
// no Redis round trip. A cached row whose owner's known lease has passed is
// never used (R-LS-2): the lease is checked here, from the expiry Redis
// last told this node.
func (r *Redis) Lookup(ns, id []byte, now time.Time) (Route, bool) {
	if len(r.prefix)+2+len(ns)+len(id)+1 > lookupKeyLen {
		kb := r.longKeys.get()
		key := r.appendRowKey(*kb, ns, id)
		rt, ok := r.lookupKey(key, now)
		r.longKeys.put(kb, key)
		return rt, ok
	}
	var buf [lookupKeyLen]byte
	return r.lookupKey(r.appendRowKey(buf[:0], ns, id), now)
}

// appendRowKey appends the placement key of (ns, id), "P p:ns\x00id".
func (r *Redis) appendRowKey(dst, ns, id []byte) []byte {
	dst = append(dst, r.prefix...)
	dst = append(dst, 'p', ':')
	return appendKeyBytes(dst, ns, id)
}

func (r *Redis) lookupKey(key []byte, now time.Time) (Route, bool) {
	sh := r.shardBytes(key)
	sh.mu.RLock()
	row, ok := sh.rows[string(key)]
	sh.mu.RUnlock()
	if !ok || !row.owner.Live(now) {
		return Route{}, false
	}
	return Route{Owner: row.owner, Epoch: row.epoch}, true
}

// keyWatch is one operation's hold on a watch.
type keyWatch struct {
	key  string
	sh   *redisShard
	w    *redisWatch
	base uint64 // invalidations counted before the operation
	gen  uint64 // connection generation at the start
}

// watchKey starts counting invalidations of key. Every watchKey is paired
// with an unwatch.
func (r *Redis) watchKey(key string) keyWatch {
	sh := r.shardOf(key)
	kw := keyWatch{key: key, sh: sh, gen: r.connGen.Load()}
	sh.mu.Lock()
	w := sh.watch[key]
	if w == nil {
		w = &redisWatch{}
		sh.watch[key] = w
	}
	w.refs++
	kw.w, kw.base = w, w.n
	sh.mu.Unlock()
	return kw
}

func (r *Redis) unwatch(kw keyWatch) {
	kw.sh.mu.Lock()
	if kw.w.refs--; kw.w.refs == 0 && kw.sh.watch[kw.key] == kw.w {
		delete(kw.sh.watch, kw.key)
	}
	kw.sh.mu.Unlock()
}

// fill inserts row when exactly own invalidations of the key (those the
// operation's own writes caused) were counted since the watch began, on
// the same connection, and reports whether it did.
func (r *Redis) fill(kw keyWatch, own uint64, row redisRow) bool {
	sh, key := kw.sh, kw.key
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if r.connGen.Load() != kw.gen {
		return false
	}
	r.noteEpoch(row.epoch) // read in this generation, even if stale now
	if kw.w.n != kw.base+own {
		return false
	}
	if _, ok := sh.rows[key]; !ok && len(sh.rows) >= r.maxRows {
		for k := range sh.rows { // arbitrary victim: maps iterate randomly
			delete(sh.rows, k)
			break
		}
	}
	sh.rows[key] = row
	r.stats.fills.Add(1)
	return true
}

// forget removes keys from the local cache as if Redis had invalidated
// them: used after this node deleted them, so Lookup never waits for the
// push to stop serving a freed row.
func (r *Redis) forget(keys []string) {
	for _, k := range keys {
		r.invalidate(k)
	}
}

func (r *Redis) invalidate(key string) {
	sh := r.shardOf(key)
	sh.mu.Lock()
	delete(sh.rows, key)
	if w := sh.watch[key]; w != nil {
		w.n++
	}
	sh.mu.Unlock()
}

// dropRows empties the local placement cache after the tracking
// connection was replaced: fills still in flight read on the old
// connection and are refused by their generation.
func (r *Redis) dropRows() {
	r.connGen.Add(1)
	r.views.reset()
	for i := range r.shards {
		sh := &r.shards[i]
		sh.mu.Lock()
		clear(sh.rows)
		sh.mu.Unlock()
	}
}

// onInvalidations is rueidis's push callback. It runs on the connection's
// reader goroutine, after rueidis dropped its own cache entries, so it must
// be quick: local map deletes and flags, never I/O.
//
// nil means everything: a FLUSHALL or FLUSHDB of any database (Redis then
// stops tracking every key, for every client), or a connection closed
// (invalidations may be lost from here on; with a cluster it may also be a
// connection to another master). Rows are kept for now, so cached ids keep
// routing while Redis is unreachable (their owners' known leases still
// bound them); the revalidator drops them once Redis answers again.
func (r *Redis) onInvalidations(msgs []rueidis.RedisMessage) {
	if msgs == nil {
		r.flushed()
		return
	}
	for i := range msgs {
		key, err := msgs[i].ToString()
		// Keys the node reads with tracking are "<prefix><kind>:<name>"
		// with a one-letter kind; longer names ("leases", "hb:<ns>",
		// "dropped") are never read so.
		if err != nil || len(key) < len(r.prefix)+2 || !strings.HasPrefix(key, r.prefix) || key[len(r.prefix)+1] != ':' {
			continue
		}
		name := key[len(r.prefix)+2:]
		switch key[len(r.prefix)] {
		case 'p':
			r.invalidate(key)
			r.stats.invalidations.Add(1)
		case 'l':
			r.leaseChanged(name)
		case 'n':
			r.views.touchNS(name)
		case 'h':
			r.touchHead(name)
		case 'd':
			r.views.touchClient(name)
		}
	}
}

func (r *Redis) flushed() {
	r.views.reset()
	if !r.cluster.Load() {
		r.untracked.Store(true)
	}
	r.leaseGen.Add(1)
	r.stats.flushes.Add(1) // after what it counts, as reconnects and wipes
	select {
	case r.reval <- struct{}{}:
	default:
	}
}
