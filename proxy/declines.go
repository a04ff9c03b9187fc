package proxy

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/pinboard-go/pinboard/directory"
)

// declineMemory is how long a worker that turned a new activation away is
// ranked last for new ids on this node: one heartbeat interval (the
// worker's 3 s, pinned RegistrationClient), after which the worker has
// told pinboard what it can — its own drain, a renewed lease — and is
// asked again. Nothing in a heartbeat says an instance slot came free
// (headroom is memory, docs/PROTOCOL.md "Answers that move a placement"),
// so a full worker costs one wasted round trip per node per interval,
// instead of one per new id.
const declineMemory = 3 * time.Second

// declines remembers, on this node, the sessions that refused (R-PL-6) or
// declined a new activation lately. It only ever reorders candidates:
// a decliner stays eligible and is tried after the others, so a fleet
// whose every worker declines behaves as without it.
//
// A decline (host draining, at capacity) is remembered for its namespace
// only: each of a worker's hosts has its own max_instances and wind-down
// (pinned hosting/host.py PinnedHost), so one full host says nothing of
// the others. An in-band refusal is remembered for every namespace: it
// is the worker's lease, which its hosts share.
type declines struct {
	// n is the number of entries, read without the lock so that placements
	// pay nothing while no worker has declined.
	n atomic.Int32
	// end is when the latest memory ends (Unix ns), read without the lock
	// too: past it every entry has passed, and placements pay nothing
	// again although the entries stay until the next note.
	end   atomic.Int64
	mu    sync.Mutex
	until map[declineKey]time.Time // → end of its memory
}

// declineKey names what declined: a session in one namespace, or in
// every namespace (ns "").
type declineKey struct{ session, ns string }

// note remembers that session declined at now in namespace ns ("": in
// every namespace), and forgets entries that have passed (the map holds
// at most the fleet's sessions in each of their namespaces).
func (d *declines) note(session, ns string, now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.until == nil {
		d.until = make(map[declineKey]time.Time)
	}
	for s, t := range d.until {
		if !now.Before(t) {
			delete(d.until, s)
		}
	}
	until := now.Add(declineMemory)
	d.until[declineKey{session, ns}] = until
	d.n.Store(int32(len(d.until)))
	if e := until.UnixNano(); e > d.end.Load() {
		d.end.Store(e)
	}
}

// policy returns inner, or inner ranking last the sessions that declined
// in namespace ns (or in every namespace) before now, while any is
// remembered and its memory has not passed.
func (d *declines) policy(inner directory.Policy, ns string, now time.Time) directory.Policy {
	if d.n.Load() == 0 || now.UnixNano() >= d.end.Load() {
		return inner
	}
	return &declinersLast{inner: inner, d: d, ns: ns, now: now}
}

// declinersLast ranks the candidates that did not decline with the inner
// policy, then the decliners, ranked among themselves, as fallbacks.
type declinersLast struct {
	inner directory.Policy
	d     *declines
	ns    string
	now   time.Time
}

// Rank implements directory.Policy.
func (p *declinersLast) Rank(dst []int, cands []directory.Candidate, in *directory.PickInput) []int {
	var keep, last []int
	p.d.mu.Lock()
	for i := range cands {
		if p.declined(cands[i].SessionID) {
			last = append(last, i)
		} else {
			keep = append(keep, i)
		}
	}
	p.d.mu.Unlock()
	if len(last) == 0 || len(keep) == 0 {
		return p.inner.Rank(dst, cands, in)
	}
	dst = p.rankSubset(dst, cands, keep, in)
	return p.rankSubset(dst, cands, last, in)
}

// declined reports whether session declined in p's namespace or in every
// namespace, with its memory not passed; callers hold p.d.mu.
func (p *declinersLast) declined(session string) bool {
	for _, k := range [...]declineKey{{session, ""}, {session, p.ns}} {
		if t, ok := p.d.until[k]; ok && p.now.Before(t) {
			return true
		}
	}
	return false
}

// rankSubset appends the inner policy's ranking of the candidates at idx
// to dst, as indices into cands.
func (p *declinersLast) rankSubset(dst []int, cands []directory.Candidate, idx []int, in *directory.PickInput) []int {
	sub := make([]directory.Candidate, len(idx))
	for j, i := range idx {
		sub[j] = cands[i]
	}
	ranked := p.inner.Rank(nil, sub, in)
	for _, j := range ranked {
		dst = append(dst, idx[j])
	}
	return dst
}
