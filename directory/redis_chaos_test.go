package directory_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/tools/redistest"
)

// migrateSlot moves the slot of key from the master serving it to another
// master, as a resharding does (CLUSTER SETSLOT IMPORTING/MIGRATING,
// MIGRATE of every key, SETSLOT NODE on every master), and returns the
// target.
func migrateSlot(t *testing.T, c *redistest.Cluster, key string) *redistest.Server {
	t.Helper()
	src, err := c.NodeFor(key)
	if err != nil {
		t.Fatal(err)
	}
	var dst *redistest.Server
	for _, n := range c.Nodes {
		if n != src {
			dst = n
			break
		}
	}
	do := func(s *redistest.Server, args ...string) string {
		t.Helper()
		out, err := s.Do(args...)
		if err != nil || strings.HasPrefix(out, "ERR") {
			t.Fatalf("unexpected reply to %v; got %q, %v", args, out, err)
		}
		return strings.TrimSpace(out)
	}
	slot := do(src, "CLUSTER", "KEYSLOT", key)
	srcID, dstID := do(src, "CLUSTER", "MYID"), do(dst, "CLUSTER", "MYID")
	do(dst, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID)
	do(src, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID)
	// Row names hold a NUL, which no command line can carry: the keys
	// move through a Go client.
	cl, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{src.Addr}, ForceSingleClient: true, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := ctxT(t)
	for {
		keys, err := cl.Do(ctx, cl.B().Arbitrary("CLUSTER", "GETKEYSINSLOT").Args(slot, "1000").Build()).AsStrSlice()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) == 0 {
			break
		}
		args := append([]string{strconv.Itoa(dst.Port), "", "0", "5000", "KEYS"}, keys...)
		if err := cl.Do(ctx, cl.B().Arbitrary("MIGRATE", "127.0.0.1").Args(args...).Build()).Error(); err != nil {
			t.Fatalf("cannot migrate %d keys: %v", len(keys), err)
		}
	}
	for _, n := range c.Nodes {
		do(n, "CLUSTER", "SETSLOT", slot, "NODE", dstID)
	}
	return dst
}

// A resharding moves the directory's slot to another master. Until a
// node's client refreshes its slot map, its commands for the slot are
// redirected (MOVED), each on its own: a claim's tracked read-back
// (CLIENT CACHING YES, MGET row) lost its CLIENT CACHING YES, which is
// keyless and answered by the old master, so the row entered the local
// cache without the new master tracking it. A re-placement through
// another node was then never pushed, and the node kept routing the id to
// the old owner until its next periodic check (10 s), past the staleness
// budget (R-PL-1: one owner across every node).
func TestRedisClusterSlotMigrationKeepsTracking_RPL1(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-master redis cluster")
	}
	c := redistest.StartCluster(t, 3)
	ctx := ctxT(t)
	const ttl = 10 * time.Second
	a := openNode(t, c.URL(), "mig", ttl)
	b := openNode(t, c.URL(), "mig", ttl)
	now, wa, wb := warmPair(t, a, b)
	if _, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "before", Now: now}); err != nil {
		t.Fatal(err)
	}
	// Each move has a chance that the client refreshes its map before the
	// first claim (rueidis refreshes at a random delay under 1 s after the
	// first MOVED): three moves make missing the window unlikely.
	for round := range 3 {
		migrateSlot(t, c, "{mig}:era")
		checkTrackedAfterMove(t, a, b, wa, wb, now, "r"+strconv.Itoa(round)+"-")
	}
}

// checkTrackedAfterMove places ids through A right after a move of the
// directory's slot, re-places them through B and wants A to drop them
// within the staleness budget.
func checkTrackedAfterMove(t *testing.T, a, b *directory.Redis, wa, wb string, now time.Time, pfx string) {
	t.Helper()
	ctx := ctxT(t)
	const n = 10
	for i := range n {
		id := pfx + strconv.Itoa(i)
		var r directory.Route
		var err error
		for range 50 { // errors while the client follows the move are fine
			if r, err = a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: id, Now: now}); err == nil {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err != nil || r.Owner.SessionID != wa {
			t.Fatalf("unexpected placement of %s through A; got %+v, %v; want owner %s", id, r, err, wa)
		}
		if r, ok := a.Lookup([]byte("/c"), []byte(id), now); !ok || r.Owner.SessionID != wa {
			t.Fatalf("unexpected lookup of %s on A after its own claim; got %+v, %v; want the cached owner %s", id, r, ok, wa)
		}
	}
	for i := range n {
		id := pfx + strconv.Itoa(i)
		r, err := b.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: id, Now: now, Exclude: wa})
		if err != nil || r.Owner.SessionID != wb {
			t.Fatalf("unexpected re-placement of %s through B; got %+v, %v; want %s", id, r, err, wb)
		}
	}
	// The staleness budget of a 10 s lease is 2.5 s; a push takes
	// milliseconds.
	deadline := time.Now().Add(2500 * time.Millisecond)
	for i := range n {
		id := pfx + strconv.Itoa(i)
		for {
			r, ok := a.Lookup([]byte("/c"), []byte(id), now)
			if !ok || r.Owner.SessionID != wa {
				break
			}
			if time.Now().After(deadline) {
				stale := 0
				for j := range n {
					if r, ok := a.Lookup([]byte("/c"), []byte(pfx+strconv.Itoa(j)), now); ok && r.Owner.SessionID == wa {
						stale++
					}
				}
				t.Fatalf("unexpected lookups on A 2.5 s after B re-placed them; got %d of %d ids still on %s; want a miss or %s", stale, n, wa, wb)
			}
			time.Sleep(time.Millisecond)
		}
	}
}
