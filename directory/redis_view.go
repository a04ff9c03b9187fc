package directory

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/pinboard-go/pinboard/internal/ascii"
)

// The node's decoded view of the namespaces it places new ids in.
//
// A new placement ranks every worker serving the namespace (R-PL-3,
// R-PL-4). Reading that from rueidis's client-side cache on every placement
// meant building two cacheable commands per member, looking each up and
// decoding it again: 18.8 ms and 4.8 MB of garbage per placement with
// 10,000 workers in one namespace. The view keeps what those reads decode —
// the sorted member set, and per session its headroom and whether its own
// drain, a degraded state or an operator drain rules it out — and re-reads
// only the keys Redis said changed. A placement then walks the members once
// (their known leases and host bindings) and reads the few entries a push
// marked: its own last claim's headroom, and the heartbeats since.
//
// The view follows the row cache's invariant (redis_cache.go): a value is
// kept only while Redis tracks its key for this node, and only if no push
// for the key was handled between the start of the read that produced it
// and its store. The keys are read with DoCache (CLIENT CACHING YES), so
// Redis pushes their next change; every entry counts the pushes for its
// keys (ver), a reader notes ver before its read and stores only if ver is
// still that, and flushed and dropRows move the generation (gen) so that
// after a lost connection or a flushed tracking table every entry is read
// again. A value that changes between the read and the claim costs balance,
// never correctness: the claim script re-checks every ranked candidate and
// falls back on its own pick.
//
// The per-session entries live in the sessions themselves (redisSession.view),
// so a placement reaches each without a map look-up, and they end with their
// sessions; placeViews.mu guards them.
type placeViews struct {
	mu  sync.Mutex
	gen uint64
	ns  map[string]*nsView
}

// maxNSViews bounds the namespaces a node keeps a member set for. Only
// namespaces with members are kept (a request for an unknown one keeps
// nothing), so the bound is on namespaces workers serve; past it an
// arbitrary one is dropped and read again on its next placement.
const maxNSViews = 4096

// nsView is one namespace's member set.
type nsView struct {
	ver  uint64 // pushes for the key "n:<ns>"
	gen  uint64
	ok   bool
	snap *nsSnap
}

// nsSnap is a member set as read; immutable once published.
type nsSnap struct {
	members []string        // session ids, sorted: policies see candidates in session-id order
	sess    []*redisSession // aligned with members; nil where the node did not know the session
}

// headView is one session's placement inputs, from "h:<sid>" (headroom,
// own drain, degraded) and "d:<clientId>" (operator drain).
type headView struct {
	ver uint64 // pushes for either key
	gen uint64
	ok  bool // current: no push since the read that produced the value
	has bool // holds a value, current or not
	hr  float64
	out bool // own drain, degraded, gone or operator drain: not a candidate
}

func (v *placeViews) init() { v.ns = make(map[string]*nsView) }

// Push handlers: they run on the push reader (onInvalidations), so they only
// count and mark.

func (v *placeViews) touchNS(ns string) {
	v.mu.Lock()
	if e := v.ns[ns]; e != nil {
		e.ver++
		e.ok = false
	}
	v.mu.Unlock()
}

// touchHead marks one session's entry. A push for a session the node does
// not know yet needs no mark: its entry is first read after the session is
// adopted, so after the push.
func (r *Redis) touchHead(sid string) {
	s := r.session(sid)
	if s == nil {
		return
	}
	r.views.mu.Lock()
	s.view.ver++
	s.view.ok = false
	r.views.mu.Unlock()
}

// touchClient marks every session of a client: an operator drain is kept
// per client id. Drains are rare; the walk is over the sessions this node
// knows. Lock order: smu, then views.mu.
func (r *Redis) touchClient(cid string) {
	r.smu.RLock()
	r.views.mu.Lock()
	for _, s := range r.sessions {
		if s.owner.ClientID == cid {
			s.view.ver++
			s.view.ok = false
		}
	}
	r.views.mu.Unlock()
	r.smu.RUnlock()
}

// reset makes every entry stale, and every read in flight unable to store.
func (v *placeViews) reset() {
	v.mu.Lock()
	v.gen++
	v.mu.Unlock()
}

// members returns the namespace's member set, reading it when the view has
// none current. The entry exists before the read, so a push handled while
// the read is in flight counts against it; a namespace found empty keeps
// no entry (a request for an unknown one keeps nothing).
func (r *Redis) members(ctx context.Context, ns string) (*nsSnap, error) {
	v := &r.views
	v.mu.Lock()
	e := v.ns[ns]
	if e != nil && e.ok && e.gen == v.gen {
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

	start := time.Now()
	mres := r.c.DoCache(ctx, r.c.B().Smembers().Key(r.key("n", ns)).Cache(), cacheTTL)
	r.observeCached("place.members", start, mres)
	members, err := mres.AsStrSlice()
	if err != nil {
		return nil, unavailable("read the workers of", ns, err)
	}
	// Session-id order, not the set's: a policy's ties must not follow
	// the encoding of a Redis set (Policy).
	slices.Sort(members)
	snap := &nsSnap{members: members, sess: make([]*redisSession, len(members))}
	for i, sid := range members {
		snap.sess[i] = r.session(sid)
	}
	if r.afterViewRead != nil {
		r.afterViewRead()
	}

	v.mu.Lock()
	defer v.mu.Unlock()
	switch {
	case v.ns[ns] != e:
		// Dropped (maxNSViews) while reading: the next placement reads again.
	case len(members) == 0:
		delete(v.ns, ns)
	case e.ver == ver && v.gen == gen:
		e.snap, e.ok, e.gen = snap, true, gen
	}
	return snap, nil
}

// placeScratch is one placement's working memory, pooled: with thousands of
// workers in a namespace its slices are the size of the namespace.
type placeScratch struct {
	all   []*redisSession // aligned with the snapshot's members
	live  []*redisSession // those that may take the id by the node's knowledge
	reads []headRead
	cands []Candidate
	cmds  []rueidis.CacheableTTL
}

// headRead is one stale entry re-read by this placement.
type headRead struct {
	at       int // index into live
	ver, gen uint64
	hr       float64
	out      bool
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
// Redis (resolve).
func (r *Redis) liveMembers(ctx context.Context, req *PlaceRequest, snap *nsSnap, sc *placeScratch) error {
	var missing []string
	for i, sid := range snap.members {
		s := snap.sess[i]
		if s == nil || s.owner.Revoked() {
			// Unknown when the set was read, or ended since: the node may
			// know it (again) now.
			s = r.session(sid)
			if s == nil && sid != "" {
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
				sc.all[i] = ss[snap.members[i]]
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

// stale fills sc.reads with the entries of sc.live that need reading, and
// appends their cached reads to sc.cmds: two per entry.
func (r *Redis) stale(sc *placeScratch) {
	v := &r.views
	v.mu.Lock()
	for j, s := range sc.live {
		if h := &s.view; !h.ok || h.gen != v.gen {
			sc.reads = append(sc.reads, headRead{at: j, ver: h.ver, gen: v.gen})
		}
	}
	v.mu.Unlock()
	for _, rd := range sc.reads {
		s := sc.live[rd.at]
		sc.cmds = append(sc.cmds,
			rueidis.CT(r.c.B().Hmget().Key(r.key("h", s.owner.SessionID)).Field("hr", "dr", "dg").Cache(), cacheTTL),
			rueidis.CT(r.c.B().Hget().Key(r.key("d", s.owner.ClientID)).Field("dl").Cache(), cacheTTL))
	}
}

// candidates decodes the reads' replies (two per entry in sc.reads, in
// order), stores those no push overtook, and fills sc.cands from the view:
// the live members no drain or degraded state rules out, in session-id
// order.
func (r *Redis) candidates(sc *placeScratch, res []rueidis.RedisResult) error {
	for k := range sc.reads {
		rd := &sc.reads[k]
		s := sc.live[rd.at]
		h, err := res[2*k].AsStrSlice()
		if err != nil {
			return unavailable("read headroom of", s.owner.SessionID, err)
		}
		drained := false
		if err := res[2*k+1].Error(); err == nil {
			drained = true // operator drain
		} else if !rueidis.IsRedisNil(err) {
			return unavailable("read drain of", s.owner.ClientID, err)
		}
		rd.out = drained || len(h) < 3 || h[1] == "1" || (h[2] != "" && h[2] != "0") // own drain, degraded, or gone
		if !rd.out {
			rd.hr, _ = strconv.ParseFloat(h[0], 64)
		}
	}
	if r.afterViewRead != nil {
		r.afterViewRead()
	}
	v := &r.views
	v.mu.Lock()
	defer v.mu.Unlock()
	k := 0
	for j, s := range sc.live {
		h := &s.view
		hr, out, has := h.hr, h.out, h.has
		if k < len(sc.reads) && sc.reads[k].at == j {
			rd := &sc.reads[k]
			k++
			hr, out, has = rd.hr, rd.out, true
			if h.ver == rd.ver && v.gen == rd.gen {
				h.hr, h.out, h.has, h.ok, h.gen = rd.hr, rd.out, true, true, rd.gen
			}
		}
		if !has || out {
			continue
		}
		sc.cands = append(sc.cands, Candidate{SessionID: s.owner.SessionID, ClientID: s.owner.ClientID, Headroom: hr})
	}
	return nil
}

// rank orders sc.cands with the request's policy.
func rank(req *PlaceRequest, sc *placeScratch) []string {
	if len(sc.cands) == 0 {
		return nil
	}
	policy := req.Policy
	if policy == nil {
		policy = DefaultPolicy
	}
	var ibuf [4]int
	idx := policy.Rank(ibuf[:0], sc.cands, &req.Pick)
	ranked := make([]string, 0, len(idx))
	for _, i := range idx {
		ranked = append(ranked, sc.cands[i].SessionID)
	}
	return ranked
}
