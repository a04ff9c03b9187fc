package directory

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// checkRowsConsistent: every session's row set names exactly the rows
// pointing at it, for sessions still registered.
func checkRowsConsistent(t *testing.T, m *Memory) {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range m.shards {
		sh := &m.shards[i]
		for k, r := range sh.rows {
			if !r.present() {
				t.Fatalf("zero row stored at %q", k)
			}
			if m.sessions[r.sess.info.SessionID] != r.sess {
				continue
			}
			found := false
			for nsid := range r.sess.rows {
				if string(appendKey(nil, nsid.NS, nsid.ID)) == k {
					found = true
				}
			}
			if !found {
				t.Fatalf("row %q points at %s, whose set lacks it", k, r.sess.info.SessionID)
			}
		}
	}
	for _, s := range m.sessions {
		for nsid := range s.rows {
			_, _, r := m.row(nsid.NS, nsid.ID)
			if !r.present() || r.sess != s {
				t.Fatalf("session %s lists %v, whose row is %+v", s.info.SessionID, nsid, r)
			}
		}
	}
}

// TestMemoryConcurrentPlacementsKeepRowSets_RPL1_RREG1: placements
// (sharing the store's policy scratch), releases, lookups,
// re-registrations that reclaim ids (R-REG-1) and sweeps, concurrently
// (make test runs it with -race), leave every registered session's row
// set (strings that are substrings of the row key) naming exactly the
// rows (held by value in the shard maps) that point at it (R-PL-1).
func TestMemoryConcurrentPlacementsKeepRowSets_RPL1_RREG1(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	m := NewMemory(time.Hour, now)
	_, _ = m.Place(ctx, &PlaceRequest{NS: "/c", ID: "warm", Now: now})
	now = now.Add(2 * time.Hour)
	var sids []string
	for i := range 4 {
		res, err := m.Register(ctx, &Registration{ClientID: fmt.Sprint("c", i), Sub: "s", Secret: "k", Namespaces: []string{"/c", "/d"},
			AdvertiseURL: fmt.Sprintf("http://127.0.0.1:%d", 10+i), Headroom: 100}, now)
		if err != nil {
			t.Fatal(err)
		}
		sids = append(sids, res.SessionID)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var req PlaceRequest
			for i := range 3000 {
				ns := "/c"
				if i%2 == 0 {
					ns = "/d"
				}
				id := fmt.Sprint("i", rand.IntN(200))
				req = PlaceRequest{NS: ns, ID: id, Now: now, Pick: PickInput{Key: fmt.Sprint(g), HasKey: g%2 == 0}}
				if rand.IntN(5) == 0 {
					req.Exclude = sids[rand.IntN(len(sids))]
				}
				r, err := m.Place(ctx, &req)
				if err != nil {
					continue
				}
				if rand.IntN(4) == 0 {
					_, _ = m.Release(ctx, &ReleaseRequest{SessionID: r.Owner.SessionID, NS: ns, ID: id, Epoch: r.Epoch}, now)
				}
				_, _ = m.Lookup([]byte(ns), []byte(id), now)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 50 {
			// Re-register one client, reclaiming some ids.
			c := i % 4
			inst := map[string][]string{"/c": {"i1", "i2", "i3"}, "/d": {"i4", "i5"}}
			_, _ = m.Register(ctx, &Registration{ClientID: fmt.Sprint("c", c), Sub: "s", Secret: "k", Namespaces: []string{"/c", "/d"},
				AdvertiseURL: fmt.Sprintf("http://127.0.0.1:%d", 10+c), Headroom: 100, Instances: inst}, now)
			_ = m.Sweep(ctx, now)
		}
	}()
	wg.Wait()
	checkRowsConsistent(t, m)
}
