package directory_test

import (
	"errors"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
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
