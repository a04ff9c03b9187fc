package directory

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/pinboard-go/pinboard/internal/ascii"
)

// Place implements Store: the slow path behind a Lookup miss.
//
//  1. One cached read (DoMultiCache) of the row and of the entries of the
//     node's view of the namespace a push marked (redis_view.go): the
//     headroom and drain flags of sessions and clients; leases come from
//     the local session cache. A live owner in the row is the answer, and
//     the row enters the local cache, so this id's next request needs no
//     Redis at all.
//  2. Otherwise the policy ranks the view (R-PL-4) and the claim script
//     resolves or claims atomically: it re-checks the existing owner and
//     every ranked candidate, stamps the cold start, decrements headroom
//     and mints the epoch (R-PL-1..3, R-CS-1). Its reply is the answer;
//     the row is read back with tracking on in the same round trip so it
//     can enter the local cache (execTracked).
//
// A new placement costs two round trips; resolving an owner another node
// placed costs one. A marked member set costs one more, first; a view
// with more than viewBatch marked entries, one more per batch past the
// first (once: a read entry stays current until its key changes).
//
// The owner a claim names can end before this node reads its session —
// another node placed the id on a worker that registered there and
// deregistered or re-registered since — and the id is then placed once
// more (its row names a session gone, which the claim replaces), not
// answered 503 "directory unavailable": Redis answered, and nothing a
// client could do differently would help it.
func (r *Redis) Place(ctx context.Context, req *PlaceRequest) (Route, error) {
	rt, err := r.place(ctx, req)
	if errors.Is(err, errOwnerGone) && ctx.Err() == nil {
		rt, err = r.place(ctx, req)
	}
	return rt, err
}

// place is Place, once.
func (r *Redis) place(ctx context.Context, req *PlaceRequest) (Route, error) {
	name := rowName(req.NS, req.ID)
	key := r.prefix + "p:" + name
	kw := r.watchKey(key)
	defer r.unwatch(kw)

	snap, err := r.members(ctx, req.NS)
	if err != nil {
		return Route{}, err
	}
	sc := getScratch()
	defer putScratch(sc)
	if err := r.liveMembers(ctx, req, snap, sc); err != nil {
		return Route{}, err
	}
	sc.cmds = append(sc.cmds, rueidis.CT(r.c.B().Get().Key(key).Cache(), cacheTTL))
	r.stale(sc)
	first := min(len(sc.reads), viewBatch)
	r.appendReads(sc, 0, first)
	start := time.Now()
	res := r.c.DoMultiCache(ctx, sc.cmds...)
	r.observeMulti("place.read", start, res)
	cur, err := res[0].ToString()
	if err != nil && !rueidis.IsRedisNil(err) {
		return Route{}, unavailable("claim", req.NS+"/"+req.ID, err)
	}
	if sid, ep, ok := parseRow(cur); ok && !req.excludes(sid, ep) {
		owners, err := r.resolve(ctx, []string{sid})
		if err != nil {
			return Route{}, err
		}
		if s := owners[sid]; s != nil && s.owner.Live(req.Now) {
			r.fill(kw, 0, redisRow{s.owner, ep})
			if r.decodeReads(sc, 0, first, res, 1) == nil {
				r.keepReads(sc.reads[:first], sc.live)
			}
			return Route{Owner: s.owner, Epoch: ep}, nil
		}
	}
	if err := r.candidates(ctx, sc, first, res, 1); err != nil {
		return Route{}, err
	}
	ranked := rank(req, sc)
	args := make([]string, 0, 8+len(ranked))
	args = append(args, r.prefix, micros(req.Now), r.leaseMicros(), name, req.NS, req.excludeArg(), ascii.Lower(req.Host),
		strconv.FormatUint(r.seenEpoch.Load(), 10))
	args = append(args, ranked...)
	r.stats.claims.Add(1)
	msg, back, err := r.execTracked(ctx, "place.claim", scriptClaim, key, args, []string{key}, nil, false)
	if err != nil {
		return Route{}, unavailable("claim", req.NS+"/"+req.ID, err)
	}
	reply, err := msg.AsStrSlice()
	if err != nil {
		return Route{}, unavailable("claim", req.NS+"/"+req.ID, err)
	}
	return r.claimed(ctx, req, kw, back, reply)
}

// claimed turns the claim script's reply into the route, and fills the
// local cache from the tracked read-back.
func (r *Redis) claimed(ctx context.Context, req *PlaceRequest, kw keyWatch, back []rueidis.RedisMessage, reply []string) (Route, error) {
	if len(reply) == 0 {
		return Route{}, unavailable("claim", req.NS+"/"+req.ID, errShortReply)
	}
	switch reply[0] {
	case "quarantine":
		stamp := time.Time{}
		if len(reply) > 1 {
			stamp = fromMicros(reply[1])
		}
		if len(reply) > 2 && reply[2] == "1" {
			// This claim found the directory went back in time and
			// started a new era: the revalidator drops this node's cache.
			r.log.Warn(msgWentBack)
			r.flushed()
		}
		// Measured from the request time as the script compared it, in
		// microseconds rounded up (micros): from req.Now itself, the first
		// attempt's rest was the lease and a fraction of a microsecond,
		// "resume in 15001ms" with Retry-After 16 (R-CS-1).
		rem := stamp.Add(r.ttl).Sub(fromMicros(micros(req.Now)))
		if rem <= 0 {
			rem = time.Millisecond
		}
		return Route{}, &QuarantineError{Remaining: rem}
	case "unknown":
		return Route{}, ErrUnknownNamespace
	case "noeligible":
		return Route{}, ErrNoEligible
	case "owner", "placed":
	default:
		return Route{}, unavailable("claim", req.NS+"/"+req.ID, errShortReply)
	}
	if len(reply) < 4 {
		return Route{}, unavailable("claim", req.NS+"/"+req.ID, errShortReply)
	}
	sid := reply[1]
	ep, err := strconv.ParseUint(reply[2], 10, 64)
	if err != nil {
		return Route{}, unavailable("claim", req.NS+"/"+req.ID, err)
	}
	if r.afterClaim != nil {
		r.afterClaim(sid)
	}
	ss, err := r.resolve(ctx, []string{sid})
	if err != nil {
		return Route{}, err
	}
	s := ss[sid]
	if s == nil {
		// Deregistered between the claim and this read: Place places the
		// id again.
		return Route{}, unavailable("claim", req.NS+"/"+req.ID, errOwnerGone)
	}
	s.setLease(fromMicros(reply[3]))
	r.sawEpoch(kw, ep)
	placed := reply[0] == "placed"
	own := uint64(0)
	if placed {
		own = 1 // the invalidation our own write caused
	}
	if len(back) == 1 {
		if v, err := back[0].ToString(); err == nil {
			if bsid, bep, ok := parseRow(v); ok && bsid == sid {
				r.fill(kw, own, redisRow{s.owner, bep})
			}
		}
	}
	return Route{Owner: s.owner, Epoch: ep, Placed: placed, Replaced: placed && len(reply) > 4 && reply[4] == "1"}, nil
}

// execTracked runs a write script and reads keys back with tracking on, in
// one pipelined round trip on the slot's single connection:
//
//	[CLIENT CACHING YES, MGET keys]   only when lead is set
//	EVALSHA script
//	CLIENT CACHING YES, MGET keys+extra
//
// The leading read makes Redis track every key before the script runs, so
// each key the script writes causes exactly one invalidation push to this
// node (Redis invalidates the writer too). Redis sends that push before
// the next command's reply, and rueidis hands it to onInvalidations before
// it completes this call: when execTracked returns, the pushes our own
// writes caused have been counted, and the trailing read re-tracked every
// key. A caller then fills a key only if its watch counted exactly the
// pushes its own script caused; anything more is someone else's write.
//
// Callers watch the keys before calling. On NOSCRIPT the round trip is
// repeated with EVAL (pipeScript).
func (r *Redis) execTracked(ctx context.Context, op string, sc *script, key string, args, keys, extra []string, lead bool) (rueidis.RedisMessage, []rueidis.RedisMessage, error) {
	trail := keys
	if len(extra) > 0 {
		trail = append(append(make([]string, 0, len(keys)+len(extra)), keys...), extra...)
	}
	res, at := r.pipeScript(ctx, op, sc, key, args, func(eval rueidis.Completed) (rueidis.Commands, int) {
		cmds := make(rueidis.Commands, 0, 9)
		if lead && len(keys) > 0 {
			cmds = r.appendTracked(cmds, r.c.B().Mget().Key(keys...).Build())
		}
		at := len(cmds)
		cmds = append(cmds, eval)
		if len(trail) > 0 {
			cmds = r.appendTracked(cmds, r.c.B().Mget().Key(trail...).Build())
		}
		return cmds, at
	})
	msg, err := res[at].ToMessage()
	if err != nil && !rueidis.IsRedisNil(err) {
		return msg, nil, err
	}
	var back []rueidis.RedisMessage
	if len(trail) > 0 {
		m, err := r.trackedReply(res, len(res)-r.trackedLen())
		if err != nil {
			return msg, nil, err
		}
		if back, err = m.ToArray(); err != nil {
			return msg, nil, err
		}
	}
	return msg, back, nil
}

// appendTracked appends read to cmds so that Redis tracks the keys it
// reads for this node: rueidis's tracking is OPTIN, so CLIENT CACHING YES
// goes right before it. On Redis Cluster the two are one MULTI block. A
// client whose slot map is stale (a resharding moved the directory's
// slot, until rueidis refreshes its map) has each command of a pipeline
// redirected (MOVED) on its own: the keyless CLIENT CACHING YES is
// answered by the old master and only the read follows the slot, so the
// new master served it untracked and the rows it filled were never
// invalidated (TestRedisClusterSlotMigrationKeepsTracking_RPL1). rueidis
// moves a MULTI block as a whole, and the flag CLIENT CACHING YES sets
// lasts until EXEC.
func (r *Redis) appendTracked(cmds rueidis.Commands, read rueidis.Completed) rueidis.Commands {
	if r.cluster.Load() {
		return append(cmds, r.c.B().Multi().Build(), r.c.B().ClientCaching().Yes().Build(), read, r.c.B().Exec().Build())
	}
	return append(cmds, r.c.B().ClientCaching().Yes().Build(), read)
}

// trackedLen is the number of commands appendTracked appends.
func (r *Redis) trackedLen() int {
	if r.cluster.Load() {
		return 4
	}
	return 2
}

// trackedReply returns the reply of the read appendTracked appended at
// res[at]; its error is the read's, or Nil for a nil reply, as
// RedisResult.ToMessage.
func (r *Redis) trackedReply(res []rueidis.RedisResult, at int) (rueidis.RedisMessage, error) {
	if !r.cluster.Load() {
		return res[at+1].ToMessage()
	}
	tx, err := res[at+3].ToArray()
	if err != nil {
		return rueidis.RedisMessage{}, err
	}
	if len(tx) != 2 {
		return rueidis.RedisMessage{}, errShortReply
	}
	return tx[1], tx[1].Error()
}

// parseRow splits a row value "<sessionId> <epoch>".
func parseRow(v string) (sid string, epoch uint64, ok bool) {
	i := strings.IndexByte(v, ' ')
	if i <= 0 {
		return "", 0, false
	}
	ep, err := strconv.ParseUint(v[i+1:], 10, 64)
	if err != nil {
		return "", 0, false
	}
	return v[:i], ep, true
}
