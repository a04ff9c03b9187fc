package directory

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/pinboard-go/pinboard/internal/ascii"
)

// redisSession is this node's view of one worker session: the *Owner the
// proxy hangs its per-owner state on (stable for the session's life) and
// whether its lease may have moved since the node last read it.
type redisSession struct {
	owner *Owner
	host  string // lower-cased hostname binding, "" for none (R-LS-4)
	// dirty: a renewal was signalled (or tracking was lost) after the last
	// read. The local lease is then older than Redis's, which is safe:
	// renewals only extend, so an old expiry is conservative.
	dirty atomic.Bool
	// view: its headroom and own state as new placements rank them
	// (redis_view.go): the push count atomic, the rest guarded by
	// Redis.views.mu.
	view headView
}

// session returns the node's session, or nil.
func (r *Redis) session(sid string) *redisSession {
	r.smu.RLock()
	s := r.sessions[sid]
	r.smu.RUnlock()
	return s
}

// adopt installs s unless the session is known already, and returns the
// one in place: Owners are stable per session.
func (r *Redis) adopt(sid string, s *redisSession) *redisSession {
	r.smu.Lock()
	defer r.smu.Unlock()
	if old := r.sessions[sid]; old != nil {
		return old
	}
	r.sessions[sid] = s
	return s
}

// adoptRead adopts a session whose lease was read with tracking on after
// leaseGen was gen. A lease push handled since then may be for it: one
// handled before the adoption found no session to mark, and Redis sends no
// other until the key is read again, so the session is marked dirty (its
// lease re-read before it runs low) when the generation moved. Compared
// after the adoption: a push handled later finds the session itself.
func (r *Redis) adoptRead(sid string, s *redisSession, gen uint64) *redisSession {
	s = r.adopt(sid, s)
	if r.leaseGen.Load() != gen {
		s.dirty.Store(true)
	}
	return s
}

// kill ends a session locally: its Owner is revoked for good.
func (r *Redis) kill(sid string) {
	r.beats.forget(sid)
	r.smu.Lock()
	s := r.sessions[sid]
	delete(r.sessions, sid)
	r.smu.Unlock()
	if s != nil {
		s.owner.Revoke()
		r.views.release(s)
	}
}

// setLease records a lease expiry read from Redis or returned by a
// script. A lease read before a concurrent kill and stored after it is
// ignored: Owner.SetLeaseUntil never revives a revoked Owner.
func (s *redisSession) setLease(t time.Time) { s.owner.SetLeaseUntil(t) }

// leaseChanged runs on the push reader: a session's lease key was written
// (a renewal, a drain cap) or deleted (the session ended). Mark it; the
// refresher re-reads it before the known lease runs low.
func (r *Redis) leaseChanged(sid string) {
	r.leaseGen.Add(1)
	if s := r.session(sid); s != nil {
		s.dirty.Store(true)
	}
}

// resolve returns the node's sessions for sids, reading unknown ones from
// Redis, resolveBatch sessions per round trip. The identity fields never
// change; the lease key is read with tracking on, so its next renewal or
// deletion is pushed. Sessions that no longer exist are missing from the
// result.
func (r *Redis) resolve(ctx context.Context, sids []string) (map[string]*redisSession, error) {
	out := make(map[string]*redisSession, len(sids))
	var missing []string
	for _, sid := range sids {
		if s := r.session(sid); s != nil {
			out[sid] = s
		} else if sid != "" {
			missing = append(missing, sid)
		}
	}
	for batch := range slices.Chunk(missing, resolveBatch) {
		if err := r.readSessions(ctx, batch, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// resolveBatch bounds the sessions one pipeline reads: at most five
// commands each (appendTracked on a cluster), a pipeline stays under
// rueidis's BlockingPipeline (2,000 commands, the default), past which it
// goes over a second, pooled connection. Tracked reads there register
// their keys on a connection whose close the node does not watch
// (revalidate watches the main one): invalidations lost with it left a
// deregistered session known until its known lease ran out
// (TestRedisResolvesManySessionsOnItsConnection_RLS2_RPL1).
const resolveBatch = 256

// readSessions reads the sessions sids from Redis in one round trip and
// adds those that exist to out.
func (r *Redis) readSessions(ctx context.Context, sids []string, out map[string]*redisSession) error {
	gen := r.leaseGen.Load()
	stride := 1 + r.trackedLen()
	cmds := make(rueidis.Commands, 0, stride*len(sids))
	for _, sid := range sids {
		cmds = append(cmds, r.c.B().Hmget().Key(r.key("s", sid)).Field("cid", "url", "sec", "host").Build())
		cmds = r.appendTracked(cmds, r.c.B().Get().Key(r.key("l", sid)).Build())
	}
	start := time.Now()
	res := r.c.DoMulti(ctx, cmds...)
	r.observeMulti("session.resolve", start, res)
	for i, sid := range sids {
		f, err := res[stride*i].AsStrSlice()
		if err != nil {
			return unavailable("read session", sid, err)
		}
		var l string
		m, err := r.trackedReply(res, stride*i+1)
		if err == nil {
			l, err = m.ToString()
		}
		if err != nil && !rueidis.IsRedisNil(err) {
			return unavailable("read session", sid, err)
		}
		if len(f) < 4 || f[0] == "" || l == "" {
			continue // gone
		}
		s := &redisSession{owner: NewOwner(sid, f[0], f[1], []byte(f[2]), fromMicros(l)), host: ascii.Lower(f[3])}
		if r.afterSessionRead != nil {
			r.afterSessionRead()
		}
		out[sid] = r.adoptRead(sid, s, gen)
	}
	return nil
}

// refreshLoop re-reads dirty leases lazily: a session whose lease was
// renewed elsewhere is refreshed once the expiry this node knows is more
// than a quarter lease old (less than three quarters away). Steady
// heartbeats then cost each node one two-command read per session per
// quarter lease at most, not one per heartbeat, and the known lease is
// never much older than a quarter lease plus one heartbeat: cached ids
// keep routing through a Redis outage of up to about half a lease.
// Deleted lease keys end the session locally.
func (r *Redis) refreshLoop(ctx context.Context) {
	every := min(max(r.ttl/10, 20*time.Millisecond), 500*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := r.refreshDue(ctx, false); err != nil && ctx.Err() == nil {
			r.log.Debug("directory lease refresh failed", "err", err)
		}
	}
}

// refreshBatch is the most leases one read asks for.
const refreshBatch = 512

// refreshDue re-reads every dirty lease that is due (every dirty one with
// force), refreshBatch per read, and reports how many it read. Every due
// lease, not one batch: a batch a tick kept up with 1,024 sessions a
// second (15 s lease), fewer than the workers of a large namespace need,
// and known leases ran out while Redis held them live
// (TestRedisRefresherReadsEveryDueLease_RLS2). A read that fails leaves
// its leases and the later ones dirty for the next tick.
func (r *Redis) refreshDue(ctx context.Context, force bool) (int, error) {
	horizon := r.now().Add(r.ttl * 3 / 4)
	var due []string
	var sess []*redisSession
	r.smu.RLock()
	for sid, s := range r.sessions {
		if s.dirty.Load() && (force || s.owner.LeaseUntil().Before(horizon)) {
			due = append(due, sid)
			sess = append(sess, s)
		}
	}
	r.smu.RUnlock()
	read := 0
	for len(due) > 0 {
		n := min(len(due), refreshBatch)
		if err := r.refreshLeases(ctx, due[:n], sess[:n]); err != nil {
			return read, err
		}
		read += n
		due, sess = due[n:], sess[n:]
	}
	if read > 0 {
		r.stats.refreshPasses.Add(1)
	}
	return read, nil
}

// refreshLeases re-reads the leases of the sessions due (ids) and sess
// (theirs) in one read.
func (r *Redis) refreshLeases(ctx context.Context, due []string, sess []*redisSession) error {
	for _, s := range sess {
		s.dirty.Store(false) // before the read: a push during it marks again
	}
	keys := make([]string, len(due))
	for i, sid := range due {
		keys[i] = r.key("l", sid)
	}
	c, cancel := context.WithTimeout(ctx, r.budget)
	defer cancel()
	start := time.Now()
	res := r.c.DoMulti(c, r.appendTracked(make(rueidis.Commands, 0, 4), r.c.B().Mget().Key(keys...).Build())...)
	r.observeMulti("lease.refresh", start, res)
	m, err := r.trackedReply(res, 0)
	var vals []rueidis.RedisMessage
	if err == nil {
		vals, err = m.ToArray()
	}
	if err != nil {
		for _, s := range sess {
			s.dirty.Store(true)
		}
		return fmt.Errorf("cannot refresh %d leases: %w", len(due), err)
	}
	r.stats.refreshes.Add(uint64(len(due)))
	for i, sid := range due {
		v, err := vals[i].ToString()
		if err != nil || v == "" {
			r.kill(sid)
			continue
		}
		sess[i].setLease(fromMicros(v))
	}
	return nil
}

// The era key detects wipes, the connection identity lost tracking. A
// node remembers the era and the identity of the connection that tracks
// its keys (CLIENT INFO's id and addr: ids restart at 1 with the server,
// the client's ephemeral port does not repeat so soon); a flush push, a closed connection or a periodic check makes it look
// again, on that same connection (a keyed read pins the slot's node):
//
//   - same era, same connection: nothing was lost (with a cluster, the
//     closed connection belonged to another master), unless a flush push
//     came: Redis frees its whole tracking table on a FLUSHDB of any
//     database, so the cached rows are dropped as after a reconnect;
//   - same era, new connection: Redis kept its data (a reconnect or a
//     failover) but this node's tracking is gone and invalidations may
//     have been missed: cached rows are dropped and re-read on demand, and
//     leases are re-read before they run low;
//   - same era, new connection, but the epoch counter below an epoch this
//     node read: Redis kept only older data (an older snapshot, a lagging
//     replica promoted) and lost placements whose workers still hold the
//     instances: a new era is started (redis_regress.lua) and it is a wipe;
//   - missing or different era: the directory was wiped (FLUSHALL, a
//     restart without persistence): rows and sessions go, and the next
//     placement attempt starts the cold-start quarantine (R-CS-1).
func (r *Redis) openEra(ctx context.Context) error {
	era, id, err := r.ensureEra(ctx)
	if err != nil {
		return err
	}
	r.eraMu.Lock()
	r.era, r.connID = era, id
	r.eraMu.Unlock()
	return nil
}

// ensureEra creates the era key when missing and returns it with the
// identity of the connection serving the directory's slot.
func (r *Redis) ensureEra(ctx context.Context) (string, string, error) {
	k := r.prefix + "era"
	before := r.now()
	res := r.onSlot(ctx,
		r.c.B().Set().Key(k).Value(newEra(before)).Nx().Build(),
		r.c.B().Get().Key(k).Build(),
		r.c.B().ClientInfo().Build(),
		r.c.B().Time().Build())
	r.noteClock(before, r.now(), res[3])
	// The SET is a no-op while the era exists, and a Redis refusing
	// writes for a while (writesHeld: out of memory, too few replicas, a
	// failing snapshot) still answers the GET: the check goes on with the
	// era read. Any other refusal of the SET (NOPERM, READONLY) fails the
	// check, so that a node that may never write does not open. Without
	// an era, the SET's error says why none could be started.
	serr := res[0].Error()
	if rueidis.IsRedisNil(serr) {
		serr = nil
	}
	if serr != nil && !writesHeld(serr) {
		return "", "", unavailable("read", k, serr)
	}
	era, err := res[1].ToString()
	if err != nil {
		if rueidis.IsRedisNil(err) && serr != nil {
			err = serr
		}
		return "", "", unavailable("read", k, err)
	}
	id, err := connIdentity(res[2])
	if err != nil {
		return "", "", unavailable("read", "client info", err)
	}
	return era, id, nil
}

// onSlot runs cmds, the first keyed with the directory's slot and the
// rest keyless (CLIENT INFO, TIME), in one round trip on the connection
// serving that slot. On Redis Cluster they are one MULTI block: a client
// whose slot map is stale (a failover or resharding, until rueidis
// refreshes its map) has each command of a pipeline redirected (MOVED) on
// its own, so the keyed read followed the slot while CLIENT INFO was
// answered by the old master, and the connection check took the old
// connection — where the node's rows were tracked, and a replica's full
// resync may have freed them — for the one serving the directory
// (TestRedisClusterConnectionCheckFollowsFailover_RPL1). rueidis moves a
// MULTI block as a whole (appendTracked). A block Redis refuses (an
// error reply to EXEC, EXECABORT when a command was refused as it was
// queued: the era's SET under NOREPLICAS, and under OOM every queued
// command, reads too, so the revalidator's block as well) is sent again
// as a plain pipeline, where OOM and NOREPLICAS refuse only the write
// (TestRedisEraCheckWhileWritesRefused_RCS1); a block that failed
// otherwise fails every command with its error.
func (r *Redis) onSlot(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	if !r.cluster.Load() {
		return r.c.DoMulti(ctx, cmds...)
	}
	block := make(rueidis.Commands, 0, len(cmds)+2)
	block = append(block, r.c.B().Multi().Build())
	for i := range cmds {
		// Pinned: rueidis recycles a command once it is answered, and
		// the fallback below sends these again (without it, the second
		// DoMulti panics on the recycled commands).
		cmds[i] = cmds[i].Pin()
	}
	block = append(block, cmds...)
	block = append(block, r.c.B().Exec().Build())
	res := r.c.DoMulti(ctx, block...)
	exec := res[len(res)-1]
	out := make([]rueidis.RedisResult, len(cmds))
	tx, err := exec.ToArray()
	_, refused := rueidis.IsRedisErr(err)
	switch {
	case rueidis.IsRedisNil(err) || (err == nil && len(tx) != len(cmds)):
		// A nil EXEC (only a WATCH makes one) must not read as a
		// missing era.
		err, exec = errShortReply, rueidis.NewErrorResult(errShortReply)
	case refused:
		return r.c.DoMulti(ctx, cmds...)
	}
	for i := range out {
		if err != nil {
			out[i] = exec
		} else {
			out[i] = rueidis.NewResult(tx[i], nil)
		}
	}
	return out
}

// writesHeld reports whether err is Redis refusing writes until
// something outside pinboard changes: OOM (maxmemory reached under
// noeviction), NOREPLICAS (min-replicas-to-write unmet), MISCONF (a
// snapshot failing under stop-writes-on-bgsave-error).
func writesHeld(err error) bool {
	switch redisErrCode(err) {
	case "OOM", "NOREPLICAS", "MISCONF":
		return true
	}
	return false
}

// connIdentity extracts "id=… addr=…" from a CLIENT INFO reply.
func connIdentity(res rueidis.RedisResult) (string, error) {
	info, err := res.ToString()
	if err != nil {
		return "", err
	}
	var id, addr string
	// RESP3 sends CLIENT INFO as a verbatim string: "txt:id=…".
	for _, f := range strings.Fields(strings.TrimPrefix(info, "txt:")) {
		if v, ok := strings.CutPrefix(f, "id="); ok {
			id = v
		} else if v, ok := strings.CutPrefix(f, "addr="); ok {
			addr = v
		}
	}
	if id == "" || addr == "" {
		return "", fmt.Errorf("unexpected CLIENT INFO reply %q", info)
	}
	return id + " " + addr, nil
}

// revalidateLoop settles flushes once Redis answers, and checks the
// connection every revalidateEvery in case it was replaced without a
// flush reaching this node. While Redis is unreachable, cached rows keep
// routing under their owners' known leases (which cannot be renewed
// meanwhile).
func (r *Redis) revalidateLoop(ctx context.Context) {
	t := time.NewTicker(revalidateEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.reval:
		case <-t.C:
		}
		// Retry fast: rows cached on a lost connection are dropped only
		// here, so once Redis is back this loop bounds how long a node can
		// miss a re-placement made meanwhile. A Redis that does not answer
		// slows the loop by itself (each try waits up to the budget).
		backoff := 10 * time.Millisecond
		for {
			c, cancel := context.WithTimeout(ctx, r.budget)
			err := r.revalidate(c)
			cancel()
			if err == nil || ctx.Err() != nil {
				break
			}
			r.log.Debug("directory revalidation waiting for redis", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, revalidateRetryMax)
		}
	}
}

// msgWentBack is logged by the node that finds the directory went back in
// time, by a claim or by revalidation.
const msgWentBack = "directory went back in time (a restart from an older snapshot, or a lagging replica promoted): placements made since are lost; handled as a wipe"

// regressed reports, after a reconnect, whether the directory went back in
// time: this node read an epoch above Redis's epoch counter, or another
// node found that and started a new era (redis_regress.lua). With force it
// starts a new era regardless. Callers hold eraMu.
func (r *Redis) regressed(ctx context.Context, force bool) (bool, error) {
	seen := r.seenEpoch.Load()
	if seen == 0 && !force {
		return false, nil
	}
	reply, err := r.run(ctx, "revalidate.epoch", scriptRegress, r.prefix+"era",
		[]string{r.prefix, strconv.FormatUint(seen, 10), newEra(r.now()), flag(force)}).AsStrSlice()
	if err != nil {
		return false, err
	}
	if len(reply) < 2 {
		return false, errShortReply
	}
	return reply[1] == "1" || reply[0] != r.era, nil
}

// newEra names a new era: its creation time in microseconds, then random
// hex. The time orders eras, so a node that finds an era older than the one
// it knew can tell an old dump came back (eraTime).
func newEra(now time.Time) string {
	return strconv.FormatInt(now.UnixMicro(), 10) + "-" + randomHex(8)
}

// eraTime returns the creation time of an era named by newEra (the claim
// script's are "<µs>-r<epoch>"), 0 for an era without one.
func eraTime(era string) int64 {
	t, _, ok := strings.Cut(era, "-")
	if !ok {
		return 0
	}
	v, err := strconv.ParseInt(t, 10, 64)
	if err != nil {
		return 0
	}
	return v
}

// sawEpoch records a placement epoch a claim under kw returned, unless a
// wipe or reconnect came in between (its epoch may be of the old era).
// Under the shard lock: a wipe's dropRows takes every shard lock after
// moving connGen and before it clears seenEpoch.
func (r *Redis) sawEpoch(kw keyWatch, ep uint64) {
	kw.sh.mu.Lock()
	defer kw.sh.mu.Unlock()
	if r.connGen.Load() == kw.gen {
		r.noteEpoch(ep)
	}
}

// noteEpoch raises seenEpoch to ep.
func (r *Redis) noteEpoch(ep uint64) {
	for {
		cur := r.seenEpoch.Load()
		if ep <= cur || r.seenEpoch.CompareAndSwap(cur, ep) {
			return
		}
	}
}

// untrack drops every cached row and marks every lease for re-reading:
// Redis no longer tracks them for this node (a new connection, or its
// tracking table flushed), so their next change would not be pushed.
// Callers hold eraMu.
func (r *Redis) untrack() {
	r.dropRows()
	r.leaseGen.Add(1)
	r.smu.RLock()
	for _, s := range r.sessions {
		s.dirty.Store(true)
	}
	r.smu.RUnlock()
	// Counted last, as wipes are: a reader that sees the count finds the
	// rows dropped and the leases due for a re-read.
	r.stats.reconnects.Add(1)
}

// leaveReplica closes the connection when a write was refused with
// READONLY since the last look (noteReadOnly): the node reaches a replica,
// and Redis never closes a connection for that. QUIT closes it once Redis
// answered (allowed to every client, unlike CLIENT KILL); the next command
// reconnects through the URL's address, which a failover pointed at the
// new master, and the closed connection's nil invalidation brings the
// node through this check again, where the new connection is handled as
// after any reconnect. At most once per revalidateEvery: an address that
// still leads to a replica (its DNS not updated yet, or a URL naming a
// replica) is tried again at the periodic check, not at every refused
// write.
func (r *Redis) leaveReplica(ctx context.Context) {
	last := r.lastQuit.Load()
	if !r.demoted.Load() || (last != 0 && time.Since(time.Unix(0, last)) < revalidateEvery) {
		return
	}
	r.demoted.Store(false)
	r.lastQuit.Store(time.Now().UnixNano())
	r.log.Warn("redis refused a write as a replica (READONLY): a failover moved the master; reconnecting")
	_ = r.c.Do(ctx, r.c.B().Quit().Build()).Error()
}

// revalidateEvery is the period of the connection check (3 commands: the
// era, the connection's identity, Redis's clock).
const revalidateEvery = 10 * time.Second

// revalidateRetryMax caps the pause between revalidation attempts while
// Redis is unreachable.
const revalidateRetryMax = 50 * time.Millisecond

func (r *Redis) revalidate(ctx context.Context) error {
	// Past the gate: this is how the node learns Redis answers again.
	ctx = context.WithValue(ctx, ungated{}, struct{}{})
	r.leaveReplica(ctx)
	k := r.prefix + "era"
	start, before := time.Now(), r.now()
	res := r.onSlot(ctx, r.c.B().Get().Key(k).Build(), r.c.B().ClientInfo().Build(), r.c.B().Time().Build())
	r.observeMulti("revalidate", start, res)
	switch err := res[0].NonRedisError(); {
	case err == nil:
		r.up()
	case timedOut(err):
		// No answer within the budget (a connection's deadline, or the
		// revalidator's own): Redis is not answering, however the
		// connection looks.
		r.goDown(err)
	}
	r.noteClock(before, r.now(), res[2])
	cur, err := res[0].ToString()
	if err != nil && !rueidis.IsRedisNil(err) {
		return err
	}
	id, err2 := connIdentity(res[1])
	if err2 != nil {
		return err2
	}
	r.eraMu.Lock()
	defer r.eraMu.Unlock()
	kept := err == nil && cur == r.era // the era key survived
	if kept && id == r.connID {
		// Same connection, but a nil invalidation came: Redis may have
		// freed its tracking table (a FLUSHDB of another database) and
		// will push nothing for the rows cached before it. Cleared
		// before dropRows: whatever a later one hides was read before
		// that drop too.
		if r.untracked.Swap(false) {
			r.untrack()
			r.log.Info("directory tracking flushed by redis: cached placements will be re-read")
		}
		return nil
	}
	// Lost data that kept an era key: an epoch this node read is above the
	// counter, or the era is older than the one it knew (an old dump loaded
	// after a wipe, whose cold-start stamp would let placements through).
	var regressed bool
	var rerr error
	switch {
	case kept:
		regressed, rerr = r.regressed(ctx, false)
	case err == nil && eraTime(cur) < eraTime(r.era):
		_, rerr = r.regressed(ctx, true)
		regressed = true
	}
	if rerr != nil {
		return rerr
	}
	r.untracked.Store(false) // every branch below drops the rows
	if kept && !regressed {
		r.connID = id
		r.untrack()
		r.log.Info("directory reconnected: cached placements will be re-read")
		return nil
	}
	if regressed {
		r.log.Warn(msgWentBack)
	}
	era, id, err := r.ensureEra(ctx)
	if err != nil {
		return err
	}
	r.era, r.connID = era, id
	r.dropRows()
	r.beats.clear()
	// Epochs read before the wipe say nothing about the new era's counter.
	// After dropRows: a fill or claim that saw the old generation has
	// recorded its epoch by now, and later ones see the new one.
	r.seenEpoch.Store(0)
	// Sessions are re-read at once: those the wipe took are revoked, those
	// registered since keep their Owner.
	r.leaseGen.Add(1)
	r.smu.RLock()
	for _, s := range r.sessions {
		s.dirty.Store(true)
	}
	r.smu.RUnlock()
	// Counted once handled: a reader that sees the count finds nothing of
	// the old era cached (a test waiting for it read a row in between,
	// when it was counted before the drop).
	r.stats.wipes.Add(1)
	if _, err := r.refreshDue(ctx, true); err != nil {
		return err
	}
	r.log.Warn("directory wiped: local cache dropped; placements resume after the cold-start quarantine")
	return nil
}
