package directory_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/tools/redistest"
)

// TestRedisAgreesWithMemory_RPL1_RLS2_RREG1_RCM1 runs random sequences of
// every Store operation — registrations reclaiming instances, hostname
// bindings with envs and takeovers, URL takeovers, heartbeats with acks and
// foreign subs, placements with exclusions and hosts, releases, deregisters,
// drains, wind-downs, sweeps, clock steps — against a memory store and
// against two Redis nodes sharing one directory, the operation going to
// either node, and compares every answer. The contract suite checks each
// store alone, case by case; this checks that the two stores cannot drift
// apart on orders of operations nobody wrote a case for. After every step
// each Redis node's cached rows are checked against Redis: a Lookup hit
// must be the row Redis holds, with a live owner (R-PL-1: another node's
// writes reach the cache).
//
// Session ids, epochs and message ids differ between stores; they are
// compared by order of first appearance. The policy ranks by headroom,
// then by registration order, so both stores pick alike.
func TestRedisAgreesWithMemory_RPL1_RLS2_RREG1_RCM1(t *testing.T) {
	srv := redistest.StartServer(t)
	seeds, steps := 30, 100
	if testing.Short() {
		seeds = 8
	}
	for seed := range seeds {
		if !agreeRun(t, srv.URL(), uint64(seed), steps) {
			return
		}
	}
}

// agreeSide is one store (or two nodes of one) and the names it gave.
type agreeSide struct {
	s     directory.Store
	nodes []*directory.Redis
	sids  []string // by registration order
	ord   map[string]int
	eps   []uint64 // by first appearance
	epo   map[uint64]int
	msgs  []string // by first appearance
	msgo  map[string]int
	clock time.Time
}

func newAgreeSide(s directory.Store, now time.Time, nodes ...*directory.Redis) *agreeSide {
	return &agreeSide{s: s, nodes: nodes, ord: map[string]int{}, epo: map[uint64]int{}, msgo: map[string]int{}, clock: now}
}

func (d *agreeSide) sid(sid string) string {
	if o, ok := d.ord[sid]; ok {
		return "S" + strconv.Itoa(o)
	}
	return "S?" + sid
}

func (d *agreeSide) epoch(ep uint64) string {
	if ep == 0 {
		return "E-"
	}
	o, ok := d.epo[ep]
	if !ok {
		o = len(d.eps)
		d.eps = append(d.eps, ep)
		d.epo[ep] = o
	}
	return "E" + strconv.Itoa(o)
}

func (d *agreeSide) msg(id string) string {
	o, ok := d.msgo[id]
	if !ok {
		o = len(d.msgs)
		d.msgs = append(d.msgs, id)
		d.msgo[id] = o
	}
	return "M" + strconv.Itoa(o)
}

func (d *agreeSide) info(i directory.SessionInfo) string {
	return fmt.Sprintf("{%s %s %s %s %q %s %s %v %d hr=%v dr=%v dg=%v/%s lease=%s reg=%s drain=%v/%s n=%d}",
		d.sid(i.SessionID), i.ClientID, i.Sub, i.AdvertiseURL, i.Namespaces, i.Hostname, i.Env, i.Envs, i.Epoch,
		i.Headroom, i.Draining, i.Degraded, us(i.DegradedSince), us(i.LeaseUntil), us(i.RegisteredAt),
		i.Drain.Draining, us(i.Drain.Deadline), i.Placements)
}

func us(t time.Time) string {
	if t.IsZero() {
		return "0"
	}
	return strconv.FormatInt(t.UnixMicro(), 10)
}

// agreePolicy ranks by headroom, then by registration order.
type agreePolicy struct{ d *agreeSide }

func (p agreePolicy) Rank(dst []int, cands []directory.Candidate, _ *directory.PickInput) []int {
	start := len(dst)
	for i := range cands {
		dst = append(dst, i)
	}
	slices.SortStableFunc(dst[start:], func(a, b int) int {
		if ca, cb := cands[a], cands[b]; ca.Headroom != cb.Headroom {
			if ca.Headroom > cb.Headroom {
				return -1
			}
			return 1
		}
		return p.d.ord[cands[a].SessionID] - p.d.ord[cands[b].SessionID]
	})
	return dst
}

func agreeErr(err error) string {
	var se *directory.SupersededError
	var q *directory.QuarantineError
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &se):
		return se.Error() + " cid=" + se.ClientID
	case errors.As(err, &q):
		return "quarantine " + q.Remaining.String()
	}
	for _, e := range []error{directory.ErrUnknownNamespace, directory.ErrNoEligible, directory.ErrUnknownSession,
		directory.ErrForbidden, directory.ErrNoPlacement, directory.ErrOwnerChanged} {
		if errors.Is(err, e) {
			return e.Error()
		}
	}
	return "unexpected " + err.Error()
}

var (
	agreeClients = []string{"a", "b", "c"}
	agreeNS      = []string{"/x", "/y"}
	agreeIDs     = []string{"i0", "i1", "i2", "i3"}
	agreeHosts   = []string{"h1", "H1", "h2"}
	agreeEnvs    = []string{"blue", "green", "red"}
)

// agreeIn is one step's random inputs, drawn once and given to every side.
type agreeIn struct {
	op, node, mask, sess, host int
	r1, r2, r3                 int
	headroom                   float64
	b1, b2                     bool
	ns, id                     string
	inst                       []int
}

func drawAgreeIn(rng *rand.Rand, sessions int) agreeIn {
	in := agreeIn{op: rng.IntN(17), node: rng.IntN(2), mask: 1 + rng.IntN(3), sess: -1, host: rng.IntN(6),
		r1: rng.IntN(1000), r2: rng.IntN(1000), r3: rng.IntN(1000), headroom: float64(rng.IntN(4)),
		b1: rng.IntN(4) == 0, b2: rng.IntN(4) == 0,
		ns: agreeNS[rng.IntN(len(agreeNS))], id: agreeIDs[rng.IntN(len(agreeIDs))]}
	if rng.IntN(4) == 0 {
		in.headroom = 0.5 + float64(rng.IntN(3))
	}
	if sessions > 0 {
		in.sess = rng.IntN(sessions)
	}
	for i := range 8 {
		if rng.IntN(3) == 0 {
			in.inst = append(in.inst, i)
		}
	}
	return in
}

func agreeRun(t *testing.T, url string, seed uint64, steps int) bool {
	t.Helper()
	const ttl = 2 * time.Second
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	ctx := ctxT(t)
	prefix := fmt.Sprintf("agree%d-%d", time.Now().UnixNano()%1e9, seed)
	nodes := []*directory.Redis{openNode(t, url, prefix, ttl), openNode(t, url, prefix, ttl)}
	sides := []*agreeSide{newAgreeSide(directory.NewMemory(ttl, now), now), newAgreeSide(nil, now, nodes...)}
	rng := rand.New(rand.NewPCG(seed, 7))
	var log []string
	for step := range steps {
		in := drawAgreeIn(rng, len(sides[0].sids))
		var desc string
		outs := make([]string, len(sides))
		for k, d := range sides {
			if d.nodes != nil {
				d.s = d.nodes[in.node]
				if in.op >= 4 && in.op <= 6 {
					// The view a node ranks with reads leases it knows; one
					// renewed through the other node is re-read lazily, which
					// may change the policy's pick, never correctness.
					for _, n := range d.nodes {
						if _, err := directory.RefreshDirty(ctx, n); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
			desc, outs[k] = agreeApply(ctx, d, in)
		}
		if desc == "" {
			continue
		}
		outs[1] += agreeCheckCache(ctx, sides[1])
		log = append(log, fmt.Sprintf("%3d %s [node %d]\n    memory: %s\n    redis:  %s", step, desc, in.node, outs[0], outs[1]))
		if outs[0] != outs[1] {
			t.Errorf("unexpected answers, seed %d; the stores disagree at the last step:\n%s", seed, strings.Join(log, "\n"))
			return false
		}
	}
	return true
}

// agreeCheckCache reports every row a node serves from its cache that
// Redis does not hold with a live owner. A round trip on the node first
// takes in the pushes sent before its reply.
func agreeCheckCache(ctx context.Context, d *agreeSide) string {
	var out string
	for ni, n := range d.nodes {
		if _, err := n.Placement(ctx, "/sync", "x", d.clock); !errors.Is(err, directory.ErrNoPlacement) {
			return fmt.Sprintf(" cannot sync node %d: %v", ni, err)
		}
		for _, ns := range agreeNS {
			for _, id := range agreeIDs {
				rt, ok := n.Lookup([]byte(ns), []byte(id), d.clock)
				if !ok {
					continue
				}
				pi, err := d.nodes[1-ni].Placement(ctx, ns, id, d.clock)
				if err != nil || pi.SessionID != rt.Owner.SessionID || pi.Epoch != rt.Epoch || !pi.Live {
					out += fmt.Sprintf(" STALE node %d serves %s/%s at %s %s; redis holds %+v %v",
						ni, ns, id, d.sid(rt.Owner.SessionID), d.epoch(rt.Epoch), pi, err)
				}
			}
		}
	}
	return out
}

// agreeApply runs one operation on d and describes it and its answer with
// d's names; desc is empty for an operation that needs a session when
// none was registered yet.
func agreeApply(ctx context.Context, d *agreeSide, in agreeIn) (desc, out string) {
	sid := func(fallback int) string { return d.sids[(in.sess+fallback)%len(d.sids)] }
	if in.sess < 0 && (in.op == 2 || in.op == 3 || in.op == 7 || in.op == 8 || in.op == 12) {
		return "", ""
	}
	switch in.op {
	case 0, 1:
		reg := &directory.Registration{ClientID: agreeClients[in.r1%3], Sub: "w", Secret: "s",
			AdvertiseURL: "http://h/" + agreeClients[in.r1%3], Headroom: in.headroom, Draining: in.b1 && in.b2}
		if in.r3%3 == 0 {
			reg.AdvertiseURL = "http://h/shared"
		}
		if in.r2%5 == 0 {
			reg.Sub = "w2"
		}
		for i, ns := range agreeNS {
			if in.mask&(1<<i) != 0 {
				reg.Namespaces = append(reg.Namespaces, ns)
			}
		}
		if (in.r1/3)%3 == 1 {
			reg.Envs = map[string]string{reg.Namespaces[0]: agreeEnvs[in.r3%3]}
		}
		if in.host < 3 {
			reg.Hostname, reg.Env, reg.Epoch = agreeHosts[in.host], agreeEnvs[in.r1%2], int64(1+in.r2%3)
			if in.r3%4 == 0 {
				reg.Takeover = "wind_down"
			}
		}
		if in.sess >= 0 && in.b1 {
			reg.PrevSessionID = sid(0)
		}
		for _, i := range in.inst {
			if reg.Instances == nil {
				reg.Instances = map[string][]string{}
			}
			reg.Instances[agreeNS[i/4]] = append(reg.Instances[agreeNS[i/4]], agreeIDs[i%4])
		}
		desc = fmt.Sprintf("register %s sub=%s url=%s ns=%v envs=%v host=%s/%s/%d/%s prev=%v hr=%v dr=%v instances=%v",
			reg.ClientID, reg.Sub, reg.AdvertiseURL, reg.Namespaces, reg.Envs, reg.Hostname, reg.Env, reg.Epoch, reg.Takeover,
			reg.PrevSessionID != "", reg.Headroom, reg.Draining, reg.Instances)
		res, err := d.s.Register(ctx, reg, d.clock)
		if err != nil {
			return desc, agreeErr(err)
		}
		d.ord[res.SessionID] = len(d.sids)
		d.sids = append(d.sids, res.SessionID)
		var dups, voided []string
		for _, x := range res.Duplicates {
			dups = append(dups, x.NS+"/"+x.ID)
		}
		for _, v := range res.Voided {
			voided = append(voided, d.sid(v.SessionID)+"/"+v.ClientID)
		}
		slices.Sort(dups)
		slices.Sort(voided)
		return desc, fmt.Sprintf("%s lease=%s dups=%v drain=%v/%s voided=%v",
			d.sid(res.SessionID), us(res.LeaseUntil), dups, res.Drain.Draining, us(res.Drain.Deadline), voided)
	case 2, 3:
		beat := &directory.Beat{SessionID: sid(0), Sub: "w", Headroom: in.headroom, Draining: in.b1, Degraded: in.b2}
		if in.r3%7 == 0 {
			beat.Sub = "w2"
		}
		for i, m := range d.msgs {
			if (in.r1>>(i%10))&1 == 1 {
				beat.Acks = append(beat.Acks, m)
			}
		}
		desc = fmt.Sprintf("heartbeat S%d sub=%s hr=%v dr=%v dg=%v acks=%d", d.ord[beat.SessionID], beat.Sub, beat.Headroom, beat.Draining, beat.Degraded, len(beat.Acks))
		res, err := d.s.Heartbeat(ctx, beat, d.clock)
		if err != nil {
			return desc, agreeErr(err)
		}
		var msgs []string
		for _, m := range res.Messages {
			dl := "revoke"
			if m.Deadline != nil {
				dl = us(*m.Deadline)
			}
			msgs = append(msgs, d.msg(m.MsgID)+" "+m.Type+" "+m.NS+"/"+m.ID+" "+dl)
		}
		return desc, fmt.Sprintf("lease=%s dr=%v drain=%v/%s msgs=%v", us(res.LeaseUntil), res.Draining, res.Drain.Draining, us(res.Drain.Deadline), msgs)
	case 4, 5, 6:
		req := &directory.PlaceRequest{NS: in.ns, ID: in.id, Now: d.clock, Policy: agreePolicy{d}}
		if in.sess >= 0 && in.r1%5 == 0 {
			req.Exclude = sid(0)
		}
		if in.r2%3 == 0 {
			req.Host = agreeHosts[in.r2%3]
		}
		desc = fmt.Sprintf("place %s/%s exclude=%s host=%s", in.ns, in.id, d.sid(req.Exclude), req.Host)
		rt, err := d.s.Place(ctx, req)
		if err != nil {
			return desc, agreeErr(err)
		}
		return desc, fmt.Sprintf("%s %s placed=%v replaced=%v", d.sid(rt.Owner.SessionID), d.epoch(rt.Epoch), rt.Placed, rt.Replaced)
	case 7:
		reqs := make([]directory.ReleaseRequest, 1+in.r3%4)
		for i := range reqs {
			reqs[i] = directory.ReleaseRequest{SessionID: sid(i), NS: agreeNS[(in.r2+i)%2], ID: agreeIDs[(in.r3+i)%4]}
			if (in.r1>>i)&1 == 1 && len(d.eps) > 0 {
				reqs[i].Epoch = d.eps[(in.r2+i)%len(d.eps)]
			}
			desc += fmt.Sprintf(" S%d:%s/%s@%s", d.ord[reqs[i].SessionID], reqs[i].NS, reqs[i].ID, d.epoch(reqs[i].Epoch))
		}
		if len(reqs) == 1 {
			ok, err := d.s.Release(ctx, &reqs[0], d.clock)
			return "release" + desc, fmt.Sprintf("%v %s", ok, agreeErr(err))
		}
		n, err := d.s.ReleaseBatch(ctx, reqs, d.clock)
		return "release batch" + desc, fmt.Sprintf("%d %s", n, agreeErr(err))
	case 8:
		if in.b1 {
			return fmt.Sprintf("void S%d", in.sess), agreeErr(d.s.Void(ctx, sid(0), d.clock))
		}
		return fmt.Sprintf("deregister S%d", in.sess), agreeErr(d.s.Deregister(ctx, sid(0), d.clock))
	case 9:
		drain := directory.DrainState{Draining: in.r1%3 != 0}
		if drain.Draining && in.r2%2 == 0 {
			drain.Deadline = d.clock.Add(time.Duration(in.r3) * 3 * time.Millisecond)
		}
		found, err := d.s.SetDrain(ctx, agreeClients[in.r3%3], drain, d.clock)
		return fmt.Sprintf("drain %s %v %s", agreeClients[in.r3%3], drain.Draining, us(drain.Deadline)), fmt.Sprintf("%v %s", found, agreeErr(err))
	case 10:
		owner := ""
		if in.sess >= 0 && in.r1%3 == 0 {
			owner = sid(0)
		}
		var deadline *time.Time
		if in.r2%3 != 0 {
			at := d.clock.Add(time.Duration(in.r3) * 3 * time.Millisecond)
			deadline = &at
		}
		desc = fmt.Sprintf("wind down %s/%s owner=%s timed=%v", in.ns, in.id, d.sid(owner), deadline != nil)
		msg, s, err := d.s.WindDown(ctx, in.ns, in.id, owner, deadline, d.clock)
		if err != nil {
			return desc, agreeErr(err)
		}
		return desc, d.msg(msg) + " " + d.sid(s)
	case 11:
		pi, err := d.s.Placement(ctx, in.ns, in.id, d.clock)
		if err != nil {
			return "placement " + in.ns + "/" + in.id, agreeErr(err)
		}
		return "placement " + in.ns + "/" + in.id, fmt.Sprintf("%s %s live=%v %s %s", d.sid(pi.SessionID), d.epoch(pi.Epoch), pi.Live, pi.ClientID, pi.Advertise)
	case 12:
		info, err := d.s.Session(ctx, sid(0), d.clock)
		if err != nil {
			return fmt.Sprintf("session S%d", in.sess), agreeErr(err)
		}
		return fmt.Sprintf("session S%d", in.sess), d.info(*info)
	case 13:
		ws, err := d.s.Workers(ctx, d.clock)
		var list []string
		for _, w := range ws {
			list = append(list, d.info(w))
		}
		slices.Sort(list) // one registration time: the order is the session ids'
		return "workers", agreeErr(err) + " " + strings.Join(list, ",")
	case 14:
		err := d.s.Sweep(ctx, d.clock)
		n, err2 := d.s.(directory.ExpiredCounter).Expired(ctx, d.clock)
		return "sweep", fmt.Sprintf("%s expired=%d %s", agreeErr(err), n, agreeErr(err2))
	case 15:
		d.clock = d.clock.Add(time.Duration(in.r1) * 3 * time.Millisecond)
		q, err := d.s.Quarantine(ctx, d.clock)
		return fmt.Sprintf("advance %dms", in.r1*3), fmt.Sprintf("quarantine=%v %s", q, agreeErr(err))
	default:
		// A hit is checked against Redis by agreeCheckCache; the memory
		// store answers every held row, the Redis store only cached ones.
		d.s.Lookup([]byte(in.ns), []byte(in.id), d.clock)
		return "lookup " + in.ns + "/" + in.id, ""
	}
}
