package directory

import (
	"math"
	"math/rand/v2"
)

// DefaultBalanceFactor bounds affinity when PINBOARD_AFFINITY_BALANCE_FACTOR
// is unset: a preferred worker keeps new ids while its headroom is at least
// half of the best candidate's (below zero: its deficit at most twice the
// best one's). The guide gives no default; 2 is ours (docs/PROTOCOL.md).
const DefaultBalanceFactor = 2.0

// PickInput carries one request's affinity inputs (R-PL-4).
type PickInput struct {
	// CallerSession is set for attested cluster calls: placement prefers
	// the caller's own worker when it is eligible.
	CallerSession string
	// Key is the rendezvous key (the client IP in the standalone binary, or
	// the programmatic affinity key); it counts only with HasKey.
	Key string
	// HasKey is true when the request has a key. False means "null": power
	// of two choices on headroom. The proxy never sets it for an empty key.
	HasKey bool
}

// Policy ranks eligible candidates for a new placement. Rank appends to dst
// indices into cands, best first; it returns at least one index when cands
// is non-empty. The store claims the first ranked candidate that is still
// eligible at claim time, so later entries are fallbacks. Every store hands
// cands in session-id order, so a policy that breaks ties by position
// picks the same for the same state on every store and node. Rank keeps
// neither dst nor cands past the call: stores reuse them.
type Policy interface {
	Rank(dst []int, cands []Candidate, in *PickInput) []int
}

// HeadroomPolicy is the guide's placement rule (R-PL-3, R-PL-4):
//   - an attested cluster call prefers the caller's own worker;
//   - with an affinity key, the rendezvous (highest random weight) order of
//     the key over client ids, skipping workers whose headroom falls below
//     the best headroom divided by BalanceFactor (when the best is below
//     zero: multiplied by it, so overcommit stays bounded too);
//   - without a key, power of two choices on headroom.
//
// Headroom is a weight, never a limit: zero or negative headroom stays
// eligible (R-PL-3). The zero value uses DefaultBalanceFactor and the
// global random source; it is safe for concurrent use.
type HeadroomPolicy struct {
	// BalanceFactor >= 1; values closer to 1 tighten the affinity guard.
	// Anything else (0, below 1, NaN, +Inf) uses DefaultBalanceFactor.
	BalanceFactor float64
	// IntN returns a uniform int in [0, n); nil uses math/rand/v2.
	IntN func(n int) int
}

var _ Policy = (*HeadroomPolicy)(nil)

// DefaultPolicy is used when a PlaceRequest carries none.
var DefaultPolicy Policy = &HeadroomPolicy{}

// rank appends to dst the request's policy's ranking of cands
// (DefaultPolicy when the request carries none): both stores rank so.
func (req *PlaceRequest) rank(dst []int, cands []Candidate) []int {
	policy := req.Policy
	if policy == nil {
		policy = DefaultPolicy
	}
	return policy.Rank(dst, cands, &req.Pick)
}

// Rank implements Policy.
func (p *HeadroomPolicy) Rank(dst []int, cands []Candidate, in *PickInput) []int {
	n := len(cands)
	if n == 0 {
		return dst
	}
	if in.CallerSession != "" {
		for i := range cands {
			if cands[i].SessionID == in.CallerSession {
				dst = append(dst, i)
				return p.fallback(dst, cands, i)
			}
		}
	}
	if n == 1 {
		return append(dst, 0)
	}
	if in.HasKey {
		return p.rendezvous(dst, cands, in.Key)
	}
	return p.twoChoices(dst, cands)
}

// factor is BalanceFactor, or DefaultBalanceFactor for anything that is
// no finite number >= 1: NaN compares false with every headroom and would
// switch the guard off.
func (p *HeadroomPolicy) factor() float64 {
	if !(p.BalanceFactor >= 1) || math.IsInf(p.BalanceFactor, 1) {
		return DefaultBalanceFactor
	}
	return p.BalanceFactor
}

func (p *HeadroomPolicy) intN(n int) int {
	if p.IntN != nil {
		return p.IntN(n)
	}
	return rand.IntN(n)
}

// rendezvous walks candidates in highest-random-weight order for key and
// takes the first whose headroom passes the balance guard. Doing it in one
// pass: the best-scoring candidate among those passing the guard.
func (p *HeadroomPolicy) rendezvous(dst []int, cands []Candidate, key string) []int {
	maxH, maxI := cands[0].Headroom, 0
	for i := 1; i < len(cands); i++ {
		if h := cands[i].Headroom; h > maxH {
			maxH, maxI = h, i
		}
	}
	// Below zero the guard bounds overcommit instead: a worker keeps new
	// ids while its deficit is at most factor times the best one's. Without
	// it, a fleet at zero headroom (full, as slot probes report it) sent
	// every new id of one client IP to one worker until the next heartbeat.
	floor := maxH / p.factor()
	if maxH < 0 {
		floor = maxH * p.factor()
	}
	best := maxI
	var bestScore uint64
	found := false
	for i := range cands {
		if cands[i].Headroom < floor {
			continue
		}
		s := rendezvousScore(key, cands[i].ClientID)
		if !found || s > bestScore {
			best, bestScore, found = i, s, true
		}
	}
	dst = append(dst, best)
	return p.fallback(dst, cands, best)
}

// twoChoices samples two distinct candidates and prefers the one with more
// headroom (ties: the first sampled), which balances load with no shared
// state beyond the headroom each placement decrements.
func (p *HeadroomPolicy) twoChoices(dst []int, cands []Candidate) []int {
	n := len(cands)
	a := p.intN(n)
	b := p.intN(n - 1)
	if b >= a {
		b++
	}
	if cands[b].Headroom > cands[a].Headroom {
		a, b = b, a
	}
	dst = append(dst, a, b)
	return dst
}

// fallback appends the candidate with the most headroom when it differs
// from first, so a claim racing another node's drain still lands.
func (p *HeadroomPolicy) fallback(dst []int, cands []Candidate, first int) []int {
	best := -1
	for i := range cands {
		if i == first {
			continue
		}
		if best < 0 || cands[i].Headroom > cands[best].Headroom {
			best = i
		}
	}
	if best >= 0 {
		dst = append(dst, best)
	}
	return dst
}

// rendezvousScore is a deterministic 64-bit weight of (key, clientID): the
// same on every node and across restarts, unlike hash/maphash.
func rendezvousScore(key, clientID string) uint64 {
	const (
		offset = 14695981039346656037
		prime  = 1099511628211
	)
	h := uint64(offset)
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= prime
	}
	h ^= 0xff
	h *= prime
	for i := 0; i < len(clientID); i++ {
		h ^= uint64(clientID[i])
		h *= prime
	}
	// splitmix64 finalizer: FNV's low bits alone correlate for similar keys.
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}
