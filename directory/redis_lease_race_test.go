package directory_test

import (
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/tools/redistest"
)

// A node reads an unknown session (its record and, tracked, its lease) and
// adopts it. A push for that lease handled after the read but before the
// adoption — the session deregistered, superseded or voided meanwhile —
// found no session to mark, and the node kept the lease it read as
// current: never re-read (nothing marked it, and Redis sends no further
// push for a key it stopped tracking), so the node held the departed
// worker live for the rest of that lease instead of noticing at its next
// lease refresh (R-LS-2, R-REG-3; docs/DIRECTORY.md "Leases across
// nodes"). The lease generation is now compared after the adoption.
func TestRedisLeasePushDuringAdoption_RLS2(t *testing.T) {
	_, nodes, w, now := startDirectory(t, "adopt", 10*time.Second, 2)
	ctx, a, b := ctxT(t), nodes[1], nodes[0] // w registered through B
	fired := false
	directory.SetAfterSessionRead(a, func() {
		if fired {
			return
		}
		fired = true
		gen := directory.LeaseGen(a)
		if err := b.Deregister(ctx, w, now); err != nil {
			t.Errorf("cannot deregister: %v", err)
			return
		}
		// A tracks the lease key since its read: the deletion's push
		// reaches it, with nobody adopted yet to mark.
		waitFor(t, 5*time.Second, "A to handle the lease push", func() bool { return directory.LeaseGen(a) != gen })
	})
	if _, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: now}); !errors.Is(err, directory.ErrUnknownNamespace) {
		t.Fatalf("unexpected placement; got %v; want ErrUnknownNamespace (the only worker left)", err)
	}
	if !fired {
		t.Fatal("unexpected resolve: the session was not read")
	}
	if _, err := directory.RefreshDirty(ctx, a); err != nil {
		t.Fatal(err)
	}
	if directory.KnownLive(a, w, now) {
		t.Fatalf("unexpected live session %s on A after its lease refresh; want it gone (deregistered through B)", w)
	}
}

// A heartbeat that Redis answers "unknown" (the session deregistered or
// voided through another node, or its lease passed) or "superseded" ends
// the session on the node that asked, at once: that node was holding it
// live from the lease it last read, until its refresher re-read the lease
// before it ran low (R-LS-2, R-REG-3; docs/DIRECTORY.md "Leases across
// nodes"), and the worker is told it is gone while its ids would still
// route to it here.
func TestRedisGoneHeartbeatEndsSessionLocally_RLS2(t *testing.T) {
	_, nodes, w, now := startDirectory(t, "gonebeat", 10*time.Second, 2)
	ctx, a, b := ctxT(t), nodes[1], nodes[0] // w registered through B
	if _, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: now}); err != nil {
		t.Fatalf("cannot place through A: %v", err)
	}
	if !directory.KnownLive(a, w, now) {
		t.Fatalf("unexpected session state; want %s live on A after it placed x there", w)
	}
	if err := b.Deregister(ctx, w, now); err != nil {
		t.Fatalf("cannot deregister through B: %v", err)
	}
	_, err := a.Heartbeat(ctx, &directory.Beat{SessionID: w, Sub: "sub", Headroom: 10}, now)
	if !errors.Is(err, directory.ErrUnknownSession) {
		t.Fatalf("unexpected heartbeat through A; got %v; want ErrUnknownSession", err)
	}
	if directory.KnownLive(a, w, now) {
		t.Fatalf("unexpected live session %s on A after its heartbeat was answered unknown; want it ended there", w)
	}
}

// A node re-reads the leases renewed elsewhere once they are due (a
// quarter lease old), in its refresher's ticks (a tenth of a lease, at
// most 500 ms). Each tick read 512 of them at most and waited for the
// next tick: 1,024 sessions a second with a 15 s lease, while a node that
// placed in a namespace knows every worker serving it and each needs a
// re-read every 2–4 s with pinned's 3 s heartbeats. Past about 2,500
// workers the refresher fell behind for good: known leases ran out while
// Redis held them live, every request for their ids missed the cache and
// went to the claim script, and the policy ranked new placements among the
// workers whose leases the node happened to have re-read (R-LS-2, R-PL-4;
// docs/DIRECTORY.md "Leases across nodes"). A tick now reads every due
// lease.
func TestRedisRefresherReadsEveryDueLease_RLS2(t *testing.T) {
	const ttl, n = 15 * time.Second, 1200
	srv := redistest.StartServer(t)
	ctx := ctxT(t)
	b := openNode(t, srv.URL(), "refresh", ttl)
	now := warmRedis(t, b, time.Now())
	var clock atomic.Int64
	clock.Store(now.UnixNano())
	a, err := directory.OpenRedis(ctx, srv.URL(), directory.RedisOptions{LeaseTTL: ttl, Prefix: "refresh",
		Now: func() time.Time { return time.Unix(0, clock.Load()) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	sids := make([]string, n)
	for i := range sids {
		sids[i] = register(t, b, "w"+strconv.Itoa(i), 10, now)
	}
	// A places in /c: it reads every session serving it, leases tracked.
	if _, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: now}); err != nil {
		t.Fatalf("cannot place through A: %v", err)
	}
	beat := now.Add(time.Second)
	for _, sid := range sids {
		if _, err := b.Heartbeat(ctx, &directory.Beat{SessionID: sid, Sub: "sub", Headroom: 10}, beat); err != nil {
			t.Fatalf("cannot heartbeat %s: %v", sid, err)
		}
	}
	// Every renewal is pushed to A; the leases A knows are due from a
	// quarter lease on.
	waitFor(t, 5*time.Second, "A to hear every renewal", func() bool {
		if _, err := a.Placement(ctx, "/sync", "x", now); !errors.Is(err, directory.ErrNoPlacement) {
			t.Fatalf("cannot sync A: %v", err)
		}
		return directory.DirtySessions(a) == n
	})
	// No lease is due before the clock moves (each ends a lease and a
	// second from now, the horizon is three quarters of one), so the
	// first pass counted after it is the first to re-read any: every due
	// lease must be known once it is done, not one batch of them.
	before := a.Stats().RefreshPasses
	clock.Store(now.Add(ttl / 2).UnixNano())
	waitFor(t, 5*time.Second, "A's refresher to finish a pass", func() bool { return a.Stats().RefreshPasses != before })
	past := now.Add(ttl + time.Millisecond) // past the lease A knew, before the renewed one
	stale := 0
	for _, sid := range sids {
		if !directory.KnownLive(a, sid, past) {
			stale++
		}
	}
	if stale > 0 {
		t.Fatalf("unexpected known leases on A after a refresher tick; %d of %d sessions renewed through B still end at their old lease; want every due lease re-read", stale, n)
	}
}
