package directory

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/pinboard-go/pinboard/internal/ascii"
)

// The node's decoded view of the namespaces it places new ids in.
//
// A new placement ranks every worker serving the namespace (R-PL-3,
// R-PL-4). Reading that from rueidis's client-side cache on every placement
// meant building two cacheable commands per member, looking each up and
// decoding it again: 20–24 ms and 5 MB of garbage per placement with 10,000
// workers in one namespace. The view keeps what those reads decode — the
// sorted member set "n:<ns>", per session its headroom and whether its own
// drain or a degraded state rules it out ("h:<sid>"), per client whether an
// operator drained it ("d:<clientId>") — and re-reads only the keys Redis
// said changed. A placement then walks the members once (their known leases
// and host bindings) and reads the few entries a push marked: its own last
// claim's headroom, and the heartbeats since.
//
// The view follows the row cache's invariant (redis_cache.go): a value is
// kept only while Redis tracks its key for this node, and only if no push
// for the key was handled between the start of the read that produced it
// and its store. Every read goes through rueidis's client cache, which sends
// CLIENT CACHING YES with it when it misses, so Redis pushes the key's next
// change (a refused id's repeated placement, or an unknown namespace's empty
// member set, costs no round trip there); every entry counts the pushes for
// its key (ver), a reader notes
// ver before its read and stores only if ver is still that, and flushed and
// dropRows move the generation (gen) so that after a lost connection or a
// flushed tracking table every entry is read again. A value that changes
// between the read and the claim costs balance, never correctness: the
// claim script re-checks every ranked candidate and falls back on its own
// pick.
//
// mu guards the maps and the namespace and client entries. A session's
// entry lives in the session (redisSession.view), so a placement reaches it
// without a map look-up and it ends with the session; its push count is
// atomic, so the most frequent push, a heartbeat's, never waits for a
// placement's walk of the members.
type placeViews struct {
	mu      sync.Mutex
	gen     uint64
	ns      map[string]*nsView
	clients map[string]*clientView
}

// maxNSViews bounds the namespaces a node keeps a member set for. Only
// namespaces with members are kept (a request for an unknown one keeps
// nothing), so the bound is on namespaces workers serve; past it an
// arbitrary one is dropped and read again on its next placement.
const maxNSViews = 4096

// viewBatch bounds the entries one pipeline reads: one cached read each,
// which a client-cache miss sends as at most five commands (CLIENT CACHING
// YES, and the read in a MULTI block with the key's PTTL: 1,005 with the
// row's), a pipeline stays under rueidis's BlockingPipeline (2,000), past
// which it would go over a pooled connection whose invalidations the node
// does not hear (resolveBatch).
const viewBatch = 200

// nsView is one namespace's member set.
type nsView struct {
	ver  uint64 // pushes for "n:<ns>"
	gen  uint64
	snap *nsSnap // the set as read, nil until then and once stale: current while gen is the views'
}

// nsSnap is a member set as read. Its members never change; sess fills in
// as the node learns the sessions.
type nsSnap struct {
	members []string                       // session ids, sorted: policies see candidates in session-id order
	sess    []atomic.Pointer[redisSession] // aligned with members; nil where the node does not know the session yet
}

// headView is one session's headroom and own state, from "h:<sid>".
type headView struct {
	ver   atomic.Uint64 // pushes for the key, counted without mu
	okVer uint64        // ver when the value was read: current while ver still is
	gen   uint64
	has   bool // holds a value, current or not
	hr    float64
	out   bool // own drain, degraded or gone: not a candidate
	// client is the session's client entry, attached by the first
	// placement that ranks the session and released when it ends.
	client *clientView
}

// clientView is one client's operator drain, from "d:<clientId>", shared by
// the client's sessions (a re-registered worker's old and new one).
type clientView struct {
	cid     string
	ver     uint64 // pushes for the key
	gen     uint64
	ok      bool
	has     bool
	drained bool
	refs    int // sessions attached
}

func (v *placeViews) init() {
	v.ns = make(map[string]*nsView)
	v.clients = make(map[string]*clientView)
}

// Push handlers: they run on the push reader (onInvalidations), so they only
// count and mark.

func (v *placeViews) touchNS(ns string) {
	v.mu.Lock()
	if e := v.ns[ns]; e != nil {
		e.ver++
		e.snap = nil
	}
	v.mu.Unlock()
}

// touchHead counts a push for a session's "h:" key. A push for a session the
// node does not know yet needs no count: its entry is first read after the
// session is adopted, so after the push.
func (r *Redis) touchHead(sid string) {
	if s := r.session(sid); s != nil {
		s.view.ver.Add(1)
	}
}

// touchClient counts a push for a client's "d:" key: a drain, an undrain,
// and every heartbeat of a drained client (redis_heartbeat.lua notes it).
func (v *placeViews) touchClient(cid string) {
	v.mu.Lock()
	if c := v.clients[cid]; c != nil {
		c.ver++
		c.ok = false
	}
	v.mu.Unlock()
}

// reset makes every entry stale, and every read in flight unable to store.
func (v *placeViews) reset() {
	v.mu.Lock()
	v.gen++
	v.mu.Unlock()
}

// release detaches an ended session from its client entry, dropping the
// entry with its last session. kill calls it after revoking the Owner, and
// stale attaches an entry only to an Owner not revoked, under mu, so none
// is left behind.
func (v *placeViews) release(s *redisSession) {
	v.mu.Lock()
	if c := s.view.client; c != nil {
		s.view.client = nil
		if c.refs--; c.refs == 0 && v.clients[c.cid] == c {
			delete(v.clients, c.cid)
		}
	}
	v.mu.Unlock()
}

// current reports whether a session's entry holds a value no push has
// overtaken. Callers hold mu.
func (h *headView) current(gen uint64) bool {
	return h.has && h.gen == gen && h.okVer == h.ver.Load()
}

// members returns the namespace's member set, reading it when the view has
// none current. The entry exists before the read, so a push handled while
// the read is in flight counts against it; a namespace found empty keeps
// no entry (a request for an unknown one keeps nothing).
func (r *Redis) members(ctx context.Context, ns string) (*nsSnap, error) {
	v := &r.views
	v.mu.Lock()
	e := v.ns[ns]
	if e != nil && e.snap != nil && e.gen == v.gen {
		snap := e.snap
		v.mu.Unlock()
		return snap, nil
	}
	if e == nil {
		if len(v.ns) >= maxNSViews {
			for k := range v.ns { // arbitrary victim: maps iterate randomly
				delete(v.ns, k)
				break
			}
		}
		e = &nsView{}
		v.ns[ns] = e
	}
	ver, gen := e.ver, v.gen
	v.mu.Unlock()

	members, err := r.readMembers(ctx, ns)
	if r.afterViewRead != nil {
		r.afterViewRead("members")
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if err != nil {
		if v.ns[ns] == e && e.snap == nil {
			delete(v.ns, ns)
		}
		return nil, err
	}
	snap := &nsSnap{members: members, sess: make([]atomic.Pointer[redisSession], len(members))}
	switch {
	case v.ns[ns] != e:
		// Dropped (maxNSViews) while reading: the next placement reads again.
	case len(members) == 0:
		delete(v.ns, ns)
	case e.ver == ver && v.gen == gen:
		e.snap, e.gen = snap, gen
	}
	return snap, nil
}

// readMembers reads a namespace's member set through the client cache (an
// unknown namespace's empty set is cached there, not in the view), sorted.
func (r *Redis) readMembers(ctx context.Context, ns string) ([]string, error) {
	start := time.Now()
	res := r.c.DoCache(ctx, r.c.B().Smembers().Key(r.key("n", ns)).Cache(), cacheTTL)
	r.observeCached("place.members", start, res)
	members, err := res.AsStrSlice()
	if err != nil {
		return nil, unavailable("read the workers of", ns, err)
	}
	// Session-id order, not the set's: a policy's ties must not follow
	// the encoding of a Redis set (Policy).
	slices.Sort(members)
	return members, nil
}

// placeScratch is one placement's working memory, pooled: with thousands of
// workers in a namespace its slices are the size of the namespace.
type placeScratch struct {
	all   []*redisSession // aligned with the snapshot's members
	live  []*redisSession // those that may take the id by the node's knowledge
	reads []viewRead      // in live order, a session's "h:" before its "d:"
	cands []Candidate
	cmds  []rueidis.CacheableTTL
}

// viewRead is one stale entry read again by this placement.
type viewRead struct {
	at       int         // index into live
	client   *clientView // for "d:<clientId>"; nil for "h:<sid>"
	ver, gen uint64
	hr       float64 // h: the headroom
	out      bool    // h: own drain, degraded or gone; d: drained
}

var scratchPool = sync.Pool{New: func() any { return new(placeScratch) }}

func getScratch() *placeScratch { return scratchPool.Get().(*placeScratch) }

func putScratch(sc *placeScratch) {
	clear(sc.all)
	clear(sc.live)
	clear(sc.reads)
	clear(sc.cands)
	clear(sc.cmds)
	sc.all, sc.live, sc.reads, sc.cands, sc.cmds = sc.all[:0], sc.live[:0], sc.reads[:0], sc.cands[:0], sc.cmds[:0]
	scratchPool.Put(sc)
}

// liveMembers fills sc.live with the members that may take the request's
// new id by the node's own knowledge: a live lease, not excluded, and the
// host binding (R-LS-4). Sessions the node does not know are read from
// Redis (resolve) and noted in the snapshot.
func (r *Redis) liveMembers(ctx context.Context, req *PlaceRequest, snap *nsSnap, sc *placeScratch) error {
	var missing []string
	for i, sid := range snap.members {
		s := snap.sess[i].Load()
		if s == nil || s.owner.Revoked() {
			// Unknown when last looked at, or ended since: the node may
			// know it (again) now.
			if s = r.session(sid); s != nil {
				snap.sess[i].Store(s)
			} else if sid != "" {
				missing = append(missing, sid)
			}
		}
		sc.all = append(sc.all, s)
	}
	if len(missing) > 0 {
		ss, err := r.resolve(ctx, missing)
		if err != nil {
			return err
		}
		for i, s := range sc.all {
			if s == nil {
				if s = ss[snap.members[i]]; s != nil {
					sc.all[i] = s
					snap.sess[i].Store(s)
				}
			}
		}
	}
	host := ascii.Lower(req.Host)
	bound := false
	if host != "" {
		for _, s := range sc.all {
			if s != nil && s.host == host && s.owner.Live(req.Now) {
				bound = true
				break
			}
		}
	}
	for i, s := range sc.all {
		if s == nil || snap.members[i] == req.Exclude || !s.owner.Live(req.Now) || (bound && s.host != host) {
			continue
		}
		sc.live = append(sc.live, s)
	}
	return nil
}

// stale fills sc.reads with the entries of sc.live that need reading,
// attaching client entries to sessions that have none yet.
func (r *Redis) stale(sc *placeScratch) {
	v := &r.views
	v.mu.Lock()
	defer v.mu.Unlock()
	for j, s := range sc.live {
		h := &s.view
		if h.client == nil {
			if s.owner.Revoked() {
				continue // ended since liveMembers (release)
			}
			c := v.clients[s.owner.ClientID]
			if c == nil {
				c = &clientView{cid: s.owner.ClientID}
				v.clients[c.cid] = c
			}
			c.refs++
			h.client = c
		}
		if !h.current(v.gen) {
			sc.reads = append(sc.reads, viewRead{at: j, ver: h.ver.Load(), gen: v.gen})
		}
		if c := h.client; !c.ok || c.gen != v.gen {
			sc.reads = append(sc.reads, viewRead{at: j, client: c, ver: c.ver, gen: v.gen})
		}
	}
}

// appendReads appends the cached reads of sc.reads[from:to] to sc.cmds.
func (r *Redis) appendReads(sc *placeScratch, from, to int) {
	for _, rd := range sc.reads[from:to] {
		s := sc.live[rd.at]
		if rd.client != nil {
			sc.cmds = append(sc.cmds, rueidis.CT(r.c.B().Hget().Key(r.key("d", s.owner.ClientID)).Field("dl").Cache(), cacheTTL))
		} else {
			sc.cmds = append(sc.cmds, rueidis.CT(r.c.B().Hmget().Key(r.key("h", s.owner.SessionID)).Field("hr", "dr", "dg").Cache(), cacheTTL))
		}
	}
}

// decodeReads decodes the replies to sc.reads[from:to], in res from res[at]
// on.
func (r *Redis) decodeReads(sc *placeScratch, from, to int, res []rueidis.RedisResult, at int) error {
	for k := from; k < to; k++ {
		rd := &sc.reads[k]
		s := sc.live[rd.at]
		reply := res[at+k-from]
		if rd.client != nil {
			switch err := reply.Error(); {
			case err == nil:
				rd.out = true // operator drain
			case !rueidis.IsRedisNil(err):
				return unavailable("read drain of", s.owner.ClientID, err)
			}
			continue
		}
		h, err := reply.AsStrSlice()
		if err != nil {
			return unavailable("read headroom of", s.owner.SessionID, err)
		}
		// Out: gone (no hash — HMGET answers three nils, which read as
		// "": every registration writes hr, and the session's removal
		// deletes the hash with its membership, after this node read the
		// member set), drained by its own heartbeat, or degraded.
		rd.out = len(h) < 3 || h[0] == "" || h[1] == "1" || (h[2] != "" && h[2] != "0")
		if !rd.out {
			rd.hr, _ = strconv.ParseFloat(h[0], 64)
		}
	}
	return nil
}

// candidates reads the stale entries sc.reads[first:] (the first ones came
// with the row, decoded from res from res[at] on), stores those no push
// overtook, and fills sc.cands from the view: the live members no drain or
// degraded state rules out, in session-id order.
func (r *Redis) candidates(ctx context.Context, sc *placeScratch, first int, res []rueidis.RedisResult, at int) error {
	if err := r.decodeReads(sc, 0, first, res, at); err != nil {
		return err
	}
	for from := first; from < len(sc.reads); from += viewBatch {
		to := min(from+viewBatch, len(sc.reads))
		sc.cmds = sc.cmds[:0]
		r.appendReads(sc, from, to)
		start := time.Now()
		res := r.c.DoMultiCache(ctx, sc.cmds...)
		r.observeMulti("place.read", start, res)
		if err := r.decodeReads(sc, from, to, res, 0); err != nil {
			return err
		}
	}
	if r.afterViewRead != nil {
		r.afterViewRead("entries")
	}
	v := &r.views
	v.mu.Lock()
	defer v.mu.Unlock()
	r.storeReads(sc.reads, sc.live)
	k := 0
	for j, s := range sc.live {
		h := &s.view
		c := h.client
		hr, out, has := h.hr, h.out, h.has
		drained, known := false, false
		if c != nil {
			drained, known = c.drained, c.has
		}
		// This placement's reads, even those a push overtook: the value
		// as read is as fresh as the claim needs (it re-checks).
		for ; k < len(sc.reads) && sc.reads[k].at == j; k++ {
			if rd := &sc.reads[k]; rd.client != nil {
				drained, known = rd.out, true
			} else {
				hr, out, has = rd.hr, rd.out, true
			}
		}
		if c == nil || !has || !known || out || drained {
			continue
		}
		sc.cands = append(sc.cands, Candidate{SessionID: s.owner.SessionID, ClientID: s.owner.ClientID, Headroom: hr})
	}
	return nil
}

// keepReads stores the decoded reads no push overtook, for a placement that
// ends without ranking (the row named a live owner): read once, they need
// not be read again by the next placement.
func (r *Redis) keepReads(reads []viewRead, live []*redisSession) {
	r.views.mu.Lock()
	r.storeReads(reads, live)
	r.views.mu.Unlock()
}

// storeReads stores each decoded read whose entry counted no push since the
// read began, in the same generation. Callers hold views.mu.
func (r *Redis) storeReads(reads []viewRead, live []*redisSession) {
	gen := r.views.gen
	for k := range reads {
		rd := &reads[k]
		if rd.gen != gen {
			continue
		}
		if c := rd.client; c != nil {
			if c.ver == rd.ver {
				c.drained, c.has, c.ok, c.gen = rd.out, true, true, rd.gen
			}
			continue
		}
		// Stored at okVer rd.ver, a value a push overtook is stale anyway;
		// the check keeps it from replacing one read later.
		if h := &live[rd.at].view; h.ver.Load() == rd.ver {
			h.hr, h.out, h.has, h.okVer, h.gen = rd.hr, rd.out, true, rd.ver, rd.gen
		}
	}
}

// rank orders sc.cands with the request's policy.
func rank(req *PlaceRequest, sc *placeScratch) []string {
	if len(sc.cands) == 0 {
		return nil
	}
	var ibuf [4]int
	idx := req.rank(ibuf[:0], sc.cands)
	ranked := make([]string, 0, len(idx))
	for _, i := range idx {
		ranked = append(ranked, sc.cands[i].SessionID)
	}
	return ranked
}
