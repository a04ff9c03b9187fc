package directory_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/tools/redistest"
)

// Pinboard runs for weeks while workers come and go, each process a new
// session (often a new clientId and advertise URL). Every structure a
// session adds to must be emptied again when it ends, whichever way it
// ends: deregister, lease expiry (SIGKILL), a void by the next process at
// its URL, an explicit void, supersession by its own re-registration, a
// timed operator drain; on the node it registered through and on one
// that only saw it serve requests. These tests churn sessions through
// every path and check that the stores return to their baseline, so that
// a future leak fails here.

const churnTTL = 10 * time.Second

// churnSessions is how many sessions each test runs through, a wave of
// churnWave at a time.
const (
	churnSessions = 200
	churnWave     = 20
)

// churn registers churnSessions sessions through a, places and looks up
// ids through b (which may be a), winds one down, ends every session by
// one of six paths, and finally lets every lease lapse and sweeps.
func churn(t *testing.T, a, b directory.Store, now time.Time) time.Time {
	t.Helper()
	ctx := context.Background()
	ended := 0
	for wave := 0; ended < churnSessions; wave++ {
		type live struct {
			cid, sid, url string
			ids           []string
			path          int
		}
		var ws []live
		for j := range churnWave {
			i := ended + j
			w := live{cid: fmt.Sprintf("c%d", i), url: fmt.Sprintf("http://127.0.0.1:9/w%d", i), path: i % 6}
			res, err := a.Register(ctx, churnReg(w.cid, w.url, i, "", nil), now)
			if err != nil {
				t.Fatalf("cannot register %s: %v", w.cid, err)
			}
			w.sid = res.SessionID
			ws = append(ws, w)
		}
		for k := range ws {
			w := &ws[k]
			for n := range 5 {
				id := fmt.Sprintf("%s-%d", w.cid, n)
				rt, err := b.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: id, Now: now, Policy: preferSession(w.sid)})
				if err != nil {
					t.Fatalf("cannot place %s: %v", id, err)
				}
				if rt.Owner.SessionID == w.sid {
					w.ids = append(w.ids, id)
				}
				b.Lookup([]byte("/c"), []byte(id), now)
				a.Lookup([]byte("/c"), []byte(id), now)
			}
			if len(w.ids) == 0 {
				t.Fatalf("unexpected placements; none on %s", w.sid)
			}
			deadline := now.Add(time.Hour)
			if _, _, err := b.WindDown(ctx, "/c", w.ids[0], w.sid, &deadline, now); err != nil {
				t.Fatalf("cannot wind %s down: %v", w.ids[0], err)
			}
			if _, err := b.Heartbeat(ctx, &directory.Beat{SessionID: w.sid, Sub: "sub", Headroom: 100}, now); err != nil {
				t.Fatalf("cannot heartbeat %s: %v", w.sid, err)
			}
		}
		for _, w := range ws {
			switch w.path {
			case 0: // deregister, through the other node
				if err := b.Deregister(ctx, w.sid, now); err != nil {
					t.Fatalf("cannot deregister %s: %v", w.sid, err)
				}
			case 1: // SIGKILL: the lease lapses, the sweep drops it
			case 2: // a new process at the same URL voids it, then leaves
				res, err := a.Register(ctx, churnReg(w.cid+"-next", w.url, 0, "", nil), now)
				if err != nil || len(res.Voided) != 1 {
					t.Fatalf("unexpected register at %s; got %+v, %v; want one voided", w.url, res, err)
				}
				if err := a.Deregister(ctx, res.SessionID, now); err != nil {
					t.Fatalf("cannot deregister %s: %v", res.SessionID, err)
				}
			case 3:
				if err := a.Void(ctx, w.sid, now); err != nil {
					t.Fatalf("cannot void %s: %v", w.sid, err)
				}
			case 4: // its own re-registration supersedes it, then is killed
				if _, err := a.Register(ctx, churnReg(w.cid, w.url, 0, w.sid, w.ids), now); err != nil {
					t.Fatalf("cannot re-register %s: %v", w.cid, err)
				}
			case 5: // a timed drain forces its ids out, then it leaves
				if _, err := b.SetDrain(ctx, w.cid, directory.DrainState{Draining: true, Deadline: now.Add(time.Second)}, now); err != nil {
					t.Fatalf("cannot drain %s: %v", w.cid, err)
				}
			}
		}
		ended += churnWave
		now = now.Add(2 * time.Second)
		sweep(t, a, b, now)
		for _, w := range ws {
			if w.path == 5 {
				if err := a.Deregister(ctx, w.sid, now); err != nil {
					t.Fatalf("cannot deregister %s: %v", w.sid, err)
				}
			}
		}
	}
	// Every lease lapses; two leases on, every drain record and queue too.
	for range 4 {
		now = now.Add(churnTTL)
		sweep(t, a, b, now)
	}
	return now
}

func sweep(t *testing.T, a, b directory.Store, now time.Time) {
	t.Helper()
	for _, s := range []directory.Store{a, b} {
		if err := s.Sweep(context.Background(), now); err != nil {
			t.Fatalf("cannot sweep: %v", err)
		}
	}
}

func churnReg(cid, url string, i int, prev string, ids []string) *directory.Registration {
	reg := &directory.Registration{ClientID: cid, Sub: "sub", Secret: "k-" + cid,
		Namespaces: []string{"/c", fmt.Sprintf("/n%d", i%4)}, AdvertiseURL: url, Headroom: 100,
		Hostname: fmt.Sprintf("h%d.example", i%7), Env: "blue", PrevSessionID: prev}
	if len(ids) > 0 {
		reg.Instances = map[string][]string{"/c": ids}
	}
	return reg
}

// preferSession ranks sid first, so that each session gets ids.
type preferSession string

func (p preferSession) Rank(dst []int, cands []directory.Candidate, _ *directory.PickInput) []int {
	for i := range cands {
		if cands[i].SessionID == string(p) {
			dst = append(dst, i)
		}
	}
	for i := range cands {
		if cands[i].SessionID != string(p) {
			dst = append(dst, i)
		}
	}
	return dst
}

func nonZero(m map[string]int) map[string]int {
	maps.DeleteFunc(m, func(_ string, n int) bool { return n == 0 })
	return m
}

func TestMemoryChurnLeavesNothing(t *testing.T) {
	now := time.Now()
	m := directory.NewMemory(churnTTL, now)
	now = warmRedis(t, m, now)
	churn(t, m, m, now)
	if got := nonZero(directory.MemorySizes(m)); len(got) > 0 {
		t.Fatalf("unexpected memory store after %d sessions ended; got %v; want every structure empty", churnSessions, got)
	}
}

func TestRedisChurnLeavesNothing(t *testing.T) {
	srv := redistest.StartServer(t)
	a := openNode(t, srv.URL(), "churn", churnTTL)
	b := openNode(t, srv.URL(), "churn", churnTTL)
	now := warmRedis(t, a, time.Now())
	churn(t, a, b, now)
	ctx := ctxT(t)
	for _, r := range []*directory.Redis{a, b} {
		if _, err := directory.RefreshDirty(ctx, r); err != nil {
			t.Fatalf("cannot refresh leases: %v", err)
		}
	}
	for name, r := range map[string]*directory.Redis{"a": a, "b": b} {
		if got := nonZero(directory.RedisSizes(r)); len(got) > 0 {
			t.Errorf("unexpected node %s after %d sessions ended; got %v; want every structure empty", name, churnSessions, got)
		}
	}
	out, err := srv.Do("--scan", "--pattern", "*")
	if err != nil {
		t.Fatalf("cannot scan: %v", err)
	}
	keys := strings.Fields(out)
	slices.Sort(keys)
	want := []string{"{churn}:epoch", "{churn}:era", "{churn}:stamp"}
	if !slices.Equal(keys, want) {
		t.Fatalf("unexpected keys after %d sessions ended; got %q; want %q", churnSessions, keys, want)
	}
}

// A wipe (FLUSHALL, a restart without persistence) ends every session at
// once: each node's local sessions, rows and watches must go with it,
// on the node they registered through and on the other.
func TestRedisWipeLeavesNothingLocal(t *testing.T) {
	srv := redistest.StartServer(t)
	a := openNode(t, srv.URL(), "wipe", churnTTL)
	b := openNode(t, srv.URL(), "wipe", churnTTL)
	ctx := ctxT(t)
	now := warmRedis(t, a, time.Now())
	for i := range 50 {
		cid := fmt.Sprintf("c%d", i)
		res, err := a.Register(ctx, churnReg(cid, "http://127.0.0.1:9/"+cid, i, "", nil), now)
		if err != nil {
			t.Fatalf("cannot register %s: %v", cid, err)
		}
		for n := range 3 {
			id := fmt.Sprintf("%s-%d", cid, n)
			if _, err := b.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: id, Now: now, Policy: preferSession(res.SessionID)}); err != nil {
				t.Fatalf("cannot place %s: %v", id, err)
			}
			a.Lookup([]byte("/c"), []byte(id), now)
			b.Lookup([]byte("/c"), []byte(id), now)
		}
		if _, err := b.Heartbeat(ctx, &directory.Beat{SessionID: res.SessionID, Sub: "sub", Headroom: 100}, now); err != nil {
			t.Fatalf("cannot heartbeat: %v", err)
		}
	}
	if got := directory.RedisSizes(b); got["sessions"] == 0 || got["rows"] == 0 {
		t.Fatalf("unexpected node b before the wipe; got %v; want sessions and rows", got)
	}
	if err := srv.FlushAll(); err != nil {
		t.Fatalf("cannot flush: %v", err)
	}
	for name, r := range map[string]*directory.Redis{"a": a, "b": b} {
		if err := r.Revalidate(ctx); err != nil {
			t.Fatalf("cannot revalidate %s: %v", name, err)
		}
		if _, err := directory.RefreshDirty(ctx, r); err != nil {
			t.Fatalf("cannot refresh %s: %v", name, err)
		}
		if got := nonZero(directory.RedisSizes(r)); len(got) > 0 {
			t.Errorf("unexpected node %s after a wipe; got %v; want every structure empty", name, got)
		}
	}
}

// Each node reads a client's operator drain record, "d:<clientId>",
// through its client-side cache while it ranks the client's sessions, and
// Redis tracks a key so read, for that node, until the key is written:
// one that never exists (a client never drained) stayed in Redis's
// tracking table, and its nil reply in the node's client cache, after the
// client's last session ended — one entry per departed worker and node,
// for as long as the nodes ran (a fleet whose workers restart with new
// clientIds grew both without end). Every key still tracked once the churn
// is over must be one that still exists.
func TestRedisChurnLeavesNothingTracked_RSRV3(t *testing.T) {
	srv := redistest.StartServer(t)
	a := openNode(t, srv.URL(), "churn", churnTTL)
	b := openNode(t, srv.URL(), "churn", churnTTL)
	now := warmRedis(t, a, time.Now())
	churn(t, a, b, now)
	out, err := srv.Do("--scan", "--pattern", "*")
	if err != nil {
		t.Fatalf("cannot scan: %v", err)
	}
	keys := len(strings.Fields(out))
	if got := trackedKeys(t, srv); got > keys {
		t.Fatalf("unexpected keys tracked for the nodes after %d sessions ended; got %d; want at most the %d keys left", churnSessions, got, keys)
	}
}

// trackedKeys is Redis's tracking_total_keys: the keys some client's
// client-side cache is told about when they change.
func trackedKeys(t *testing.T, srv *redistest.Server) int {
	t.Helper()
	out, err := srv.Do("info", "stats")
	if err != nil {
		t.Fatalf("cannot read INFO stats: %v", err)
	}
	for _, l := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "tracking_total_keys:"); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("cannot parse tracking_total_keys %q: %v", v, err)
			}
			return n
		}
	}
	t.Fatalf("no tracking_total_keys in INFO stats: %q", out)
	return 0
}
