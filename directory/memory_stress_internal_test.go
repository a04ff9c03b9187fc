package directory

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// checkIndexes: byNS, byClient, byURL name only registered sessions, byNS
// sorted and complete; every registered session's row set is exact.
func checkIndexes(t *testing.T, m *Memory, now time.Time) {
	t.Helper()
	checkRowsConsistent(t, m)
	m.mu.Lock()
	defer m.mu.Unlock()
	for ns, set := range m.byNS {
		if !slices.IsSortedFunc(set, func(a, b *memSession) int { return compareStrings(a.info.SessionID, b.info.SessionID) }) {
			t.Fatalf("byNS[%q] not sorted", ns)
		}
		for _, s := range set {
			if m.sessions[s.info.SessionID] != s || s.gone {
				t.Fatalf("byNS[%q] holds dropped session %s", ns, s.info.SessionID)
			}
		}
	}
	for _, s := range m.sessions {
		if s.gone {
			t.Fatalf("gone session %s still registered", s.info.SessionID)
		}
		for _, ns := range s.info.Namespaces {
			if _, ok := slices.BinarySearchFunc(m.byNS[ns], s.info.SessionID, bySessionID); !ok {
				t.Fatalf("session %s missing from byNS[%q]", s.info.SessionID, ns)
			}
		}
		if m.byClient[s.info.ClientID][s.info.SessionID] != s {
			t.Fatalf("session %s missing from byClient", s.info.SessionID)
		}
	}
	for cid, set := range m.byClient {
		for sid, s := range set {
			if m.sessions[sid] != s {
				t.Fatalf("byClient[%s] holds dropped %s", cid, sid)
			}
		}
	}
	for url, s := range m.byURL {
		if m.sessions[s.info.SessionID] != s {
			t.Fatalf("byURL[%s] holds dropped %s", url, s.info.SessionID)
		}
	}
	// A row on a live, registered session's owner is the only route; a
	// row whose session is gone must be in dropped or about to be freed.
	for i := range m.shards {
		for k, r := range m.shards[i].rows {
			if r.owner != r.sess.owner {
				t.Fatalf("row %q owner/session mismatch", k)
			}
		}
	}
	for k, w := range m.windDowns {
		sh := m.shardOf(k)
		r := sh.rows[k]
		if !r.present() || r.epoch != w.epoch {
			t.Fatalf("wind-down %q at epoch %d without its placement (%+v)", k, w.epoch, r)
		}
	}
}

// TestMemoryStressInvariants_RPL1_RLS2: many goroutines claim, release,
// register (single and multi-batch, with bindings and URL takeover),
// heartbeat, void, drain, wind down and sweep against one memory store
// on a shared clock for 4 s; checked every 50 ms: the indexes name only
// registered sessions and each session's row set is exact, every pending
// wind-down has its placement at its epoch, no epoch goes to two ids; and
// once every lease is long past a sweep leaves nothing. (That a new
// placement never lands on an ended session is not checked here: it
// races with the ending; the contract suite checks it step by step.)
func TestMemoryStressInvariants_RPL1_RLS2(t *testing.T) {
	ctx := context.Background()
	const ttl = 200 * time.Millisecond
	base := time.Unix(1_800_000_000, 0)
	var clock atomic.Int64
	clock.Store(base.UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	tick := func() time.Time { return time.Unix(0, clock.Add(int64(50*time.Microsecond))) }
	m := NewMemory(ttl, base)
	_, _ = m.Place(ctx, &PlaceRequest{NS: "/a", ID: "warm", Now: base})
	clock.Add(int64(2 * ttl))

	const clients = 6
	var sessMu sync.Mutex
	cur := make([]string, clients) // each client's last session
	nss := []string{"/a", "/b"}
	reg := func(c int, inst map[string][]string, host string, ep int64) {
		sessMu.Lock()
		prev := cur[c]
		sessMu.Unlock()
		r := &Registration{ClientID: fmt.Sprint("c", c), Sub: "s", Secret: "k", Namespaces: nss,
			AdvertiseURL: fmt.Sprintf("http://h%d:1/", c%4), Headroom: 10, PrevSessionID: prev, Instances: inst,
			Hostname: host, Epoch: ep}
		res, err := m.Register(ctx, r, tick())
		if err == nil {
			sessMu.Lock()
			cur[c] = res.SessionID
			sessMu.Unlock()
		}
	}
	for c := range clients {
		reg(c, nil, "", 0)
	}

	type epochOwner struct{ sid, key string }
	var epMu sync.Mutex
	epochs := map[uint64]epochOwner{}
	var failures atomic.Int64
	fail := func(format string, a ...any) {
		if failures.Add(1) < 10 {
			t.Errorf(format, a...)
		}
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	spawn := func(fn func(r *rand.Rand)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(rand.Uint64(), 1))
			for {
				select {
				case <-stop:
					return
				default:
				}
				fn(r)
			}
		}()
	}
	// Placers.
	for range 8 {
		spawn(func(r *rand.Rand) {
			ns := nss[r.IntN(2)]
			id := fmt.Sprint("i", r.IntN(400))
			at := tick()
			rt, err := m.Place(ctx, &PlaceRequest{NS: ns, ID: id, Now: at, Host: []string{"", "hostA"}[r.IntN(2)]})
			if err != nil {
				return
			}
			if rt.Placed && rt.Owner.Revoked() {
				// Revoked after the call is possible; before is not: check
				// the session was registered at placement via the epoch map.
				_ = rt
			}
			epMu.Lock()
			if o, ok := epochs[rt.Epoch]; ok && (o.key != ns+"/"+id) {
				fail("epoch %d handed to %s and %s", rt.Epoch, o.key, ns+"/"+id)
			}
			epochs[rt.Epoch] = epochOwner{rt.Owner.SessionID, ns + "/" + id}
			epMu.Unlock()
			_, _ = m.Lookup([]byte(ns), []byte(id), at)
			if r.IntN(3) == 0 {
				_, _ = m.Release(ctx, &ReleaseRequest{SessionID: rt.Owner.SessionID, NS: ns, ID: id, Epoch: rt.Epoch}, at)
			}
			if r.IntN(20) == 0 {
				d := at.Add(time.Duration(r.IntN(100)) * time.Millisecond)
				_, _, _ = m.WindDown(ctx, ns, id, "", &d, at)
			}
		})
	}
	// Heartbeaters.
	spawn(func(r *rand.Rand) {
		c := r.IntN(clients)
		sessMu.Lock()
		sid := cur[c]
		sessMu.Unlock()
		if _, err := m.Heartbeat(ctx, &Beat{SessionID: sid, Sub: "s", Headroom: float64(r.IntN(10)), Degraded: r.IntN(30) == 0, Draining: r.IntN(40) == 0}, tick()); err != nil {
			reg(c, nil, "", 0)
		}
	})
	// Re-registrations: reclaim across batches, bindings, voids.
	spawn(func(r *rand.Rand) {
		c := r.IntN(clients)
		inst := map[string][]string{}
		n := 5
		if r.IntN(4) == 0 {
			n = 600
		}
		for range n {
			ns := nss[r.IntN(2)]
			inst[ns] = append(inst[ns], fmt.Sprint("i", r.IntN(400)))
		}
		host := ""
		if r.IntN(3) == 0 {
			host = []string{"hostA", "HOSTA", "hostB"}[r.IntN(3)]
		}
		reg(c, inst, host, int64(r.IntN(3)))
		if r.IntN(10) == 0 {
			sessMu.Lock()
			sid := cur[r.IntN(clients)]
			sessMu.Unlock()
			_ = m.Void(ctx, sid, now())
		}
		time.Sleep(time.Millisecond)
	})
	// Drains, sweeps, clock.
	spawn(func(r *rand.Rand) {
		c := fmt.Sprint("c", r.IntN(clients))
		at := tick()
		switch r.IntN(3) {
		case 0:
			_, _ = m.SetDrain(ctx, c, DrainState{Draining: true, Deadline: at.Add(time.Duration(r.IntN(50)) * time.Millisecond)}, at)
		case 1:
			_, _ = m.SetDrain(ctx, c, DrainState{}, at)
		}
		time.Sleep(500 * time.Microsecond)
	})
	spawn(func(r *rand.Rand) {
		_ = m.Sweep(ctx, tick())
		clock.Add(int64(time.Duration(r.IntN(3)) * time.Millisecond))
		time.Sleep(200 * time.Microsecond)
	})
	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) && failures.Load() == 0 {
		time.Sleep(50 * time.Millisecond)
		checkIndexes(t, m, now())
	}
	close(stop)
	wg.Wait()
	checkIndexes(t, m, now())

	// Every lease long past: one sweep leaves nothing behind.
	end := now().Add(10 * ttl)
	if err := m.Sweep(ctx, end); err != nil {
		t.Fatal(err)
	}
	end = end.Add(time.Hour)
	if err := m.Sweep(ctx, end); err != nil {
		t.Fatal(err)
	}
	sizes := MemorySizes(m)
	for k, v := range sizes {
		if v != 0 && k != "" {
			t.Errorf("unexpected %s after everything lapsed; got %d; want 0", k, v)
		}
	}
	m.mu.Lock()
	t.Logf("windDue heap: %d; epochs handed out: %d", len(m.windDue), len(epochs))
	m.mu.Unlock()
}
