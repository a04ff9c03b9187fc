package directory

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/pinboard-go/pinboard/internal/ascii"
)

// Register implements Store. One script (redis_register.lua) opens the
// registration: it decides the hostname bindings (a refused registration
// leaves no trace), creates the session, supersedes the sessions it
// displaces and names the earlier sessions of the process. The listed
// instances are reclaimed in that same call when they fit one batch
// (RegisterBatch); otherwise in batches of that size, one script call and
// round trip each (redis_register_batch.lua), and the earlier sessions are
// handed over last (redis_register_done.lua). The rows the sessions it
// superseded or handed over still hold are freed a batch per call too
// (drop): the superseded ones' before the batches, the earlier ones' at
// the end. Redis serves nobody while a script runs, so the batch bounds
// how long one registration holds every node's round trips
// (docs/DIRECTORY.md, "Scripts").
//
// The result is the one a single script would give: each id is claimed
// atomically for the session, or reported as a duplicate when another
// live session holds it at that moment (R-REG-1). A session ended between
// batches (superseded, or dropped by a later registration of the same
// process) fails the registration, and nothing more is written for it. A
// failed round trip fails it too, leaving a live session the worker never
// learnt: its next registration takes that session's rows over as its
// own (the same client id), else the sweep frees them one lease after.
//
// While the registration lists at most trackLimit instances, the
// reclaimed rows are read back with tracking on in the round trip that
// wrote them (execTracked), so this node serves them from its cache right
// away and hears when anyone moves them.
func (r *Redis) Register(ctx context.Context, reg *Registration, now time.Time) (*RegisterResult, error) {
	g := &registering{r: r, reg: reg, sid: NewSessionID(), now: now, dups: make(map[string]bool)}
	all, served := listedRows(reg)
	g.track = len(served.rows) <= trackLimit
	complete := len(served.rows) <= RegisterBatch
	res, err := g.open(ctx, served.rows, complete)
	if err != nil {
		return nil, err
	}
	if !complete {
		// The sessions it superseded are gone; their rows it did not free
		// yet are freed before the batches, and listed ones are duplicates.
		for _, sid := range g.displaced {
			if err := r.drop(ctx, "register.drop", sid, true, g.markHeld); err != nil {
				return nil, err
			}
		}
		g.displaced = nil
		if err := g.reclaimBatches(ctx, served.rows); err != nil {
			return nil, err
		}
		if err := g.ownHeld(ctx); err != nil {
			return nil, err
		}
	}
	for _, earlier := range g.earlier {
		r.kill(earlier)
	}
	g.finishDrops(ctx)
	for _, row := range all {
		if g.dups[row] || !served.has(row) {
			ns, id, _ := strings.Cut(row, "\x00")
			res.Duplicates = append(res.Duplicates, NSID{ns, id})
		}
	}
	return res, nil
}

// registering is one Register call in progress. It is used by the
// calling goroutine only.
type registering struct {
	r       *Redis
	reg     *Registration
	sid     string
	now     time.Time
	s       *redisSession
	earlier []string        // earlier sessions of the process, handed over last
	held    map[string]bool // rows the sessions it superseded held
	// displaced: the sessions it superseded, whose rows past the first
	// batch are still to be freed (drop).
	displaced []string
	track     bool            // read reclaimed rows back into the local cache
	dups      map[string]bool // rows another live session holds
}

// open runs redis_register.lua, with the rows when complete (they fit
// one batch, and this call finishes the registration). It adopts the new
// session locally and revokes the sessions it superseded.
func (g *registering) open(ctx context.Context, rows []string, complete bool) (*RegisterResult, error) {
	r := g.r
	var rw rowWatch
	args := g.openArgs(complete)
	if complete {
		args = append(args, rows...)
		if g.track {
			rw = r.watchRows(rows)
			defer rw.release(r)
		}
	}
	gen := r.leaseGen.Load() // the new lease is read back tracked: adoptRead
	msg, back, err := r.execTracked(ctx, "register", scriptRegister, r.key("s", g.sid), args, rw.keys, []string{r.key("l", g.sid)}, true)
	if err != nil {
		return nil, unavailable("register", g.reg.ClientID, err)
	}
	reply, err := msg.ToArray()
	if err == nil && len(reply) == 5 {
		if f := strs(reply); f[0] == "superseded" {
			ep, _ := strconv.ParseInt(f[4], 10, 64)
			return nil, &SupersededError{Hostname: f[1], NS: f[2], Env: f[3], Epoch: ep}
		}
	}
	if err != nil || len(reply) < 8 {
		return nil, unavailable("register", g.reg.ClientID, replyErr(err))
	}
	head := strs(reply[:3])
	res := &RegisterResult{SessionID: g.sid, LeaseUntil: fromMicros(head[0])}
	if head[1] == "1" {
		res.Drain = DrainState{Draining: true, Deadline: fromMicros(head[2])}
	}
	g.s = r.adoptRead(g.sid, &redisSession{owner: NewOwner(g.sid, g.reg.ClientID, g.reg.AdvertiseURL, []byte(g.reg.Secret), res.LeaseUntil),
		host: ascii.Lower(g.reg.Hostname)}, gen)
	freed := strs(arr(reply[5]))
	r.forget(r.rowKeys(freed))
	g.displaced = strs(arr(reply[7]))
	for _, displaced := range g.displaced {
		r.kill(displaced)
	}
	if len(reply) > 8 {
		v := strs(arr(reply[8]))
		for i := 0; i+1 < len(v); i += 2 {
			res.Voided = append(res.Voided, SessionRef{SessionID: v[i], ClientID: v[i+1]})
		}
	}
	g.earlier = strs(arr(reply[6]))
	if complete {
		g.reclaimed(rw, rows, back, strs(arr(reply[3])), strs(arr(reply[4])))
	} else {
		// The rows the superseded sessions held: listed ones are
		// duplicates (reclaimBatches).
		g.held = make(map[string]bool, len(freed))
		for _, row := range freed {
			g.held[row] = true
		}
	}
	return res, nil
}

// markHeld records rows freed from the sessions the registration
// superseded: listed ones are duplicates (reclaimBatches).
func (g *registering) markHeld(rows []string) {
	for _, row := range rows {
		g.held[row] = true
	}
}

// finishDrops frees, a batch per call, the rows the sessions the
// registration dropped still hold: the earlier sessions it handed over
// and, for a registration of one batch, those it superseded. They are
// gone already (their rows re-placeable by anyone), so this is cleanup: a
// failure leaves the rest to the sweep and does not fail the
// registration.
func (g *registering) finishDrops(ctx context.Context) {
	for _, sid := range append(g.displaced, g.earlier...) {
		if err := g.r.drop(ctx, "register.drop", sid, false, nil); err != nil {
			g.r.log.Warn("directory left the rows of a dropped session to the sweep", "session", sid, "err", err)
			return
		}
	}
}

// openArgs are redis_register.lua's arguments up to the rows.
func (g *registering) openArgs(complete bool) []string {
	reg := g.reg
	envs := []byte("{}")
	if len(reg.Envs) > 0 {
		envs, _ = json.Marshal(reg.Envs)
	}
	args := make([]string, 0, 18+RegisterBatch)
	return append(args, g.r.prefix, micros(g.now), g.r.leaseMicros(), g.sid, reg.ClientID, reg.Sub, reg.Secret,
		reg.AdvertiseURL, strings.Join(reg.Namespaces, " "), reg.Hostname, reg.Env,
		strconv.FormatInt(reg.Epoch, 10), strconv.FormatFloat(reg.Headroom, 'g', -1, 64),
		flag(reg.Draining), reg.PrevSessionID, string(envs), reg.Takeover, flag(complete))
}

// reclaimBatches reclaims the served rows in batches of RegisterBatch,
// one script call each, then hands the earlier sessions over. Rows the
// sessions the registration superseded held (freed by the opening call)
// are duplicates without a round trip: they were another live session's
// when the registration came, as a single script would have found them.
func (g *registering) reclaimBatches(ctx context.Context, served []string) error {
	rows := served
	if len(g.held) > 0 {
		rows = make([]string, 0, len(served))
		for _, row := range served {
			if g.held[row] {
				g.dups[row] = true
			} else {
				rows = append(rows, row)
			}
		}
	}
	for len(rows) > 0 {
		n := min(len(rows), RegisterBatch)
		if err := g.batch(ctx, rows[:n]); err != nil {
			return err
		}
		rows = rows[n:]
		if len(rows) > 0 && g.r.afterBatch != nil {
			g.r.afterBatch()
		}
	}
	if len(g.earlier) == 0 {
		return nil
	}
	args := append([]string{g.r.prefix, micros(g.now), g.r.leaseMicros(), g.sid}, g.earlier...)
	reply, err := g.r.runWrite(ctx, "register.done", scriptRegisterDone, g.r.key("s", g.sid), args).ToArray()
	if err != nil {
		return unavailable("register", g.reg.ClientID, err)
	}
	if err := g.ended(reply); err != nil {
		return err
	}
	g.r.forget(g.r.rowKeys(strs(arr(reply[1]))))
	return nil
}

// ownHeld takes back from the duplicates the superseded sessions' rows a
// request placed on this session since the opening call freed them (the
// session was the only eligible one): routed here, the worker's instance
// serves them, and reported as duplicates it aborted it — the memory
// store, which keeps them until the registration ends, finds them its own
// (contract case SupersededRowPlacedBetweenBatches_RLS4_RREG1). One read,
// only when such rows were listed.
func (g *registering) ownHeld(ctx context.Context) error {
	var rows []string
	for row := range g.held {
		if g.dups[row] {
			rows = append(rows, row)
		}
	}
	if len(rows) == 0 {
		return nil
	}
	// One MGET: every key has the one hash tag ("One hash tag").
	vals, err := g.r.c.Do(ctx, g.r.c.B().Mget().Key(g.r.rowKeys(rows)...).Build()).AsStrSlice()
	if err != nil {
		return unavailable("register", g.reg.ClientID, err)
	}
	for i, v := range vals {
		if sid, _, ok := parseRow(v); ok && sid == g.sid { // a missing row reads "": no row
			delete(g.dups, rows[i])
		}
	}
	return nil
}

// batch reclaims rows (at most RegisterBatch) in one script call.
func (g *registering) batch(ctx context.Context, rows []string) error {
	args := make([]string, 0, 4+len(g.earlier)+len(rows))
	args = append(args, g.r.prefix, micros(g.now), g.sid, strconv.Itoa(len(g.earlier)))
	args = append(args, g.earlier...)
	args = append(args, rows...)
	var rw rowWatch
	if g.track {
		rw = g.r.watchRows(rows)
		defer rw.release(g.r)
	}
	msg, back, err := g.r.execTracked(ctx, "register.batch", scriptRegisterBatch, g.r.key("s", g.sid), args, rw.keys, nil, true)
	if err != nil {
		return unavailable("register", g.reg.ClientID, err)
	}
	reply, err := msg.ToArray()
	if err != nil {
		return unavailable("register", g.reg.ClientID, err)
	}
	if err := g.ended(reply); err != nil {
		return err
	}
	g.reclaimed(rw, rows, back, strs(arr(reply[1])), strs(arr(reply[2])))
	return nil
}

// ended reads a batch or hand-over reply: nil for {"ok", …}, else why the
// session is gone.
func (g *registering) ended(reply []rueidis.RedisMessage) error {
	if len(reply) >= 2 {
		if f, _ := reply[0].ToString(); f == "ok" {
			return nil
		}
	}
	g.r.kill(g.sid)
	err := goneErr(strs(reply))
	if err == nil {
		return unavailable("register", g.reg.ClientID, errShortReply)
	}
	return registrationEnded(g.reg.ClientID, g.sid, err)
}

// reclaimed records a script call's duplicates and fills the local cache
// with the rows it wrote, from the tracked read-back when there is one.
func (g *registering) reclaimed(rw rowWatch, rows []string, back []rueidis.RedisMessage, dups, written []string) {
	for _, row := range dups {
		g.dups[row] = true
	}
	if rw.keys == nil {
		g.r.forget(g.r.rowKeys(written))
		return
	}
	wrote := make(map[string]bool, len(written))
	for _, row := range written {
		wrote[row] = true
	}
	for i, row := range rows {
		if i >= len(back) {
			break
		}
		own := uint64(0)
		if wrote[row] {
			own = 1 // the invalidation the script's own write caused
		}
		if v, err := back[i].ToString(); err == nil {
			if bsid, bep, ok := parseRow(v); ok && bsid == g.sid {
				g.r.fill(rw.watches[i], own, redisRow{g.s.owner, bep})
			}
		}
	}
}

// rowWatch watches the placement keys of the rows one script call may
// write (execTracked).
type rowWatch struct {
	keys    []string
	watches []keyWatch
}

func (r *Redis) watchRows(rows []string) rowWatch {
	rw := rowWatch{keys: r.rowKeys(rows), watches: make([]keyWatch, len(rows))}
	for i, key := range rw.keys {
		rw.watches[i] = r.watchKey(key)
	}
	return rw
}

func (rw rowWatch) release(r *Redis) {
	for _, kw := range rw.watches {
		r.unwatch(kw)
	}
}

// rowList is the served rows of a registration, in the order listed.
type rowList struct {
	rows []string
	ns   map[string]bool // namespaces served
}

// has reports whether row "ns\x00id" is in a namespace served.
func (l rowList) has(row string) bool {
	ns, _, _ := strings.Cut(row, "\x00")
	return l.ns[ns]
}

// listedRows returns every listed row "ns\x00id" in order (namespaces
// sorted, ids as listed) and those of namespaces the worker serves: the
// others are duplicates (R-REG-1), as the memory store decides (memory_register.go).
func listedRows(reg *Registration) ([]string, rowList) {
	served := rowList{ns: make(map[string]bool, len(reg.Namespaces))}
	for _, ns := range reg.Namespaces {
		served.ns[ns] = true
	}
	var all []string
	for _, ns := range sortedKeys(reg.Instances) {
		for _, id := range reg.Instances[ns] {
			row := rowName(ns, id)
			all = append(all, row)
			if served.ns[ns] {
				served.rows = append(served.rows, row)
			}
		}
	}
	return all, served
}
