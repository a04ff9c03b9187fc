package directory_test

import (
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/tools/redistest"
)

// startDirectory starts a redis-server and n nodes on one directory
// (prefix, ttl), passes the cold start through the first and registers
// worker "a" there: the set-up of the tests below.
func startDirectory(t *testing.T, prefix string, ttl time.Duration, n int) (*redistest.Server, []*directory.Redis, string, time.Time) {
	t.Helper()
	srv := redistest.StartServer(t)
	nodes := make([]*directory.Redis, n)
	for i := range nodes {
		nodes[i] = openNode(t, srv.URL(), prefix, ttl)
	}
	now := warmRedis(t, nodes[0], time.Now())
	return srv, nodes, register(t, nodes[0], "a", 1e6, now), now
}

// Release then Place on the same node re-places the id, as on the memory
// store: the release's own invalidation is handled before Release returns,
// so the next read through the client cache cannot return the released row
// (R-PL-2, R-PL-6: a refused id is released and placed again).
func TestRedisReleaseThenPlaceSameNode_RPL2(t *testing.T) {
	_, nodes, wa, now := startDirectory(t, "rel", 10*time.Second, 2)
	ctx, a, b := ctxT(t), nodes[0], nodes[1]
	const rounds = 1000
	for i := range rounds {
		id := "r" + strconv.Itoa(i)
		r1, err := b.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: id, Now: now})
		if err != nil || r1.Owner.SessionID != wa {
			t.Fatalf("cannot place through B: %+v %v", r1, err)
		}
		// A resolves B's placement: the row is now in A's client cache.
		if r, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: id, Now: now}); err != nil || r.Epoch != r1.Epoch {
			t.Fatalf("cannot resolve through A: %+v %v", r, err)
		}
		if ok, err := a.Release(ctx, &directory.ReleaseRequest{SessionID: wa, NS: "/c", ID: id, Epoch: r1.Epoch}, now); err != nil || !ok {
			t.Fatalf("cannot release: %v %v", ok, err)
		}
		r2, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: id, Now: now})
		if err != nil {
			t.Fatal(err)
		}
		if !r2.Placed || r2.Epoch <= r1.Epoch {
			t.Fatalf("unexpected placement after a release (round %d); got %+v; want a new placement above epoch %d", i, r2, r1.Epoch)
		}
	}
}

// A restart that restores an older snapshot keeps the era key but loses
// the placements made since, whose workers still hold the instances. The
// node that read such a placement's epoch finds the epoch counter below it
// and starts a new era: every node handles it as a wipe, the next
// placement attempt starts the cold-start quarantine (R-CS-1), and the
// epochs minted after it never go back (R-PL-1: workers fence on them).
func TestRedisSnapshotRestoreIsAWipe_RCS1_RPL1(t *testing.T) {
	const ttl = 30 * time.Second
	srv, nodes, _, now := startDirectory(t, "roll", ttl, 2)
	ctx, a, b := ctxT(t), nodes[0], nodes[1]
	if _, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: now}); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Do("SAVE"); err != nil {
		t.Fatal(err)
	}
	r1, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "y", Now: now}) // lost in the restore
	if err != nil {
		t.Fatal(err)
	}
	wipes := a.Stats().Wipes
	if err := srv.Restart(); err != nil { // SIGKILL, then dump.rdb loads
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "node A to find the directory went back", func() bool { return a.Stats().Wipes > wipes })
	later := now.Add(time.Millisecond)
	for name, n := range map[string]*directory.Redis{"A": a, "B": b} {
		_, err := n.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "y", Now: later})
		var q *directory.QuarantineError
		if !errors.As(err, &q) {
			t.Fatalf("unexpected placement through %s after a snapshot restore; got %v; want the cold-start quarantine", name, err)
		}
	}
	waitFor(t, 10*time.Second, "node B to take the new era", func() bool {
		_ = b.Revalidate(ctx)
		return b.Stats().Wipes > 0
	})
	past := later.Add(ttl)
	register(t, a, "a2", 1e6, past)
	r2, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "y", Now: past})
	if err != nil {
		t.Fatalf("cannot place after the quarantine: %v", err)
	}
	if r2.Epoch <= r1.Epoch {
		t.Fatalf("unexpected epoch after a snapshot restore; got %d after %d", r2.Epoch, r1.Epoch)
	}
}

// The first new placement after Redis went back in time finds it when its
// node read a lost placement: checked inside the claim, before anything is
// minted — a mint raises the epoch counter past every epoch read before,
// so a node's later revalidation could no longer tell (R-CS-1). The other
// nodes take the new era at their next check.
func TestRedisClaimFindsLostPlacements_RCS1(t *testing.T) {
	const ttl = 30 * time.Second
	srv, nodes, _, now := startDirectory(t, "lost", ttl, 2)
	ctx, a, b := ctxT(t), nodes[0], nodes[1]
	r1, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "y", Now: now})
	if err != nil {
		t.Fatal(err)
	}
	// B routes y: it has read y's epoch.
	if r, err := b.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "y", Now: now}); err != nil || r.Epoch != r1.Epoch {
		t.Fatalf("cannot resolve y through B: %+v %v", r, err)
	}
	// What a restore from a snapshot taken before y does to the counter;
	// the connections stay, so no revalidation runs.
	if _, err := srv.Do("SET", "{lost}:epoch", strconv.FormatUint(r1.Epoch-1000, 10)); err != nil {
		t.Fatal(err)
	}
	later := now.Add(time.Millisecond)
	_, err = b.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "z", Now: later})
	var q *directory.QuarantineError
	if !errors.As(err, &q) {
		t.Fatalf("unexpected first placement after the directory went back; got %v; want the cold-start quarantine", err)
	}
	era, err := srv.Do("GET", "{lost}:era")
	if err != nil {
		t.Fatal(err)
	}
	// B's revalidator drops its cache by itself, well before its periodic
	// check (10 s); 5 s leaves a loaded machine room.
	waitFor(t, 5*time.Second, "node B to take the new era", func() bool { return b.Stats().Wipes > 0 })
	// A read y's epoch too; the counter B raised keeps A's claim from
	// starting yet another era (which would be named after its later now).
	if _, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "z", Now: later.Add(time.Millisecond)}); !errors.As(err, &q) {
		t.Fatalf("unexpected placement through A; got %v; want the quarantine", err)
	}
	if again, err := srv.Do("GET", "{lost}:era"); err != nil || again != era {
		t.Fatalf("the era changed again after A's claim: %q, then %q (%v)", era, again, err)
	}
	waitFor(t, 10*time.Second, "node A to take the new era", func() bool {
		_ = a.Revalidate(ctx)
		return a.Stats().Wipes > 0
	})
	past := later.Add(ttl)
	register(t, a, "a2", 1e6, past)
	if r, err := b.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "z", Now: past}); err != nil || r.Epoch <= r1.Epoch {
		t.Fatalf("unexpected placement after the quarantine; got %+v %v; want an epoch above %d", r, err, r1.Epoch)
	}
}

// A reconnect after a wipe is not taken for the directory going back in
// time: what a node read before the wipe is forgotten with it, though the
// wiped Redis has no epoch counter yet (R-CS-1).
func TestRedisReconnectAfterWipeIsNoRegression_RCS1(t *testing.T) {
	srv, nodes, _, now := startDirectory(t, "again", 30*time.Second, 1)
	ctx, a := ctxT(t), nodes[0]
	if _, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "y", Now: now}); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "node A to find the wipe", func() bool { return a.Stats().Wipes > 0 })
	if _, err := srv.Do("CLIENT", "KILL", "TYPE", "normal"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "node A to reconnect", func() bool {
		_ = a.Revalidate(ctx)
		return a.Stats().Reconnects > 0 || a.Stats().Wipes > 1
	})
	if s := a.Stats(); s.Wipes != 1 {
		t.Fatalf("unexpected wipes after a reconnect to the wiped directory; got %d; want 1 (reconnects %d)", s.Wipes, s.Reconnects)
	}
}

// A dump from before a wipe loaded after it (FLUSHALL, placements resume,
// then a restart from the old RDB file) brings back an era older than the
// one the node knew, and the old cold-start stamp: it starts a new era
// and the quarantine, or the ids placed since would be placed again
// (R-CS-1).
func TestRedisOlderEraComesBack_RCS1(t *testing.T) {
	const ttl = 30 * time.Second
	srv, nodes, _, now := startDirectory(t, "old", ttl, 1)
	ctx, a := ctxT(t), nodes[0]
	if _, err := srv.Do("SAVE"); err != nil { // era E0, stamp long past
		t.Fatal(err)
	}
	if _, err := srv.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "node A to find the wipe", func() bool { return a.Stats().Wipes > 0 })
	now = warmRedis(t, a, now.Add(time.Millisecond)) // era E1, placements resume
	register(t, a, "a", 1e6, now)
	if _, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "y", Now: now}); err != nil {
		t.Fatal(err)
	}
	if err := srv.Restart(); err != nil { // loads E0's dump
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "node A to find the old era", func() bool {
		_ = a.Revalidate(ctx)
		return a.Stats().Wipes > 1
	})
	_, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "y", Now: now.Add(time.Millisecond)})
	var q *directory.QuarantineError
	if !errors.As(err, &q) {
		t.Fatalf("unexpected placement after an old dump came back; got %v; want the cold-start quarantine", err)
	}
}

// A reconnect to a Redis that kept everything (a network blip, a restart
// from an up-to-date snapshot) is not a wipe: no quarantine (R-CS-1).
func TestRedisRestartWithCurrentSnapshotIsNoWipe_RCS1(t *testing.T) {
	srv, nodes, _, now := startDirectory(t, "keep", 30*time.Second, 1)
	ctx, a := ctxT(t), nodes[0]
	r1, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "y", Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Do("SAVE"); err != nil {
		t.Fatal(err)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "node A to reconnect", func() bool { return a.Stats().Reconnects > 0 })
	r2, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "y", Now: now})
	if err != nil || r2.Epoch != r1.Epoch || a.Stats().Wipes != 0 {
		t.Fatalf("unexpected placement after a restart that kept everything; got %+v %v (wipes %d); want epoch %d", r2, err, a.Stats().Wipes, r1.Epoch)
	}
}

// A Redis that lost its script cache (a restart with persistence, a
// failover to a replica that never ran the scripts, SCRIPT FLUSH) answers
// EVALSHA with NOSCRIPT; every kind of script call then runs the script
// with EVAL and succeeds (R-PL-1, R-REG-2, R-REG-3).
func TestRedisScriptCacheLost_RPL1_RREG2_RREG3(t *testing.T) {
	srv, nodes, wa, now := startDirectory(t, "nos", 10*time.Second, 1)
	ctx, a := ctxT(t), nodes[0]
	flush := func() {
		t.Helper()
		if _, err := srv.Do("SCRIPT", "FLUSH"); err != nil {
			t.Fatal(err)
		}
	}
	flush() // place: a tracked pipeline (execTracked)
	r, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: now})
	if err != nil || !r.Placed || r.Owner.SessionID != wa {
		t.Fatalf("cannot place after SCRIPT FLUSH: %+v %v", r, err)
	}
	flush() // heartbeat: rueidis.Lua
	if _, err := a.Heartbeat(ctx, &directory.Beat{SessionID: wa, Sub: "sub", Headroom: 10}, now); err != nil {
		t.Fatalf("cannot heartbeat after SCRIPT FLUSH: %v", err)
	}
	flush() // release: a write with a trailing read (runWrite)
	if ok, err := a.Release(ctx, &directory.ReleaseRequest{SessionID: wa, NS: "/c", ID: "x", Epoch: r.Epoch}, now); err != nil || !ok {
		t.Fatalf("cannot release after SCRIPT FLUSH: %v %v", ok, err)
	}
	if p, err := a.Placement(ctx, "/c", "x", now); !errors.Is(err, directory.ErrNoPlacement) {
		t.Fatalf("placement still there after the release: %+v %v", p, err)
	}
	flush() // sweep: runWrite as well
	if err := a.Sweep(ctx, now.Add(time.Minute)); err != nil {
		t.Fatalf("cannot sweep after SCRIPT FLUSH: %v", err)
	}
	if _, err := a.Heartbeat(ctx, &directory.Beat{SessionID: wa, Sub: "sub", Headroom: 10}, now.Add(time.Minute)); !errors.Is(err, directory.ErrUnknownSession) {
		t.Fatalf("session survived a sweep one minute past its lease: %v", err)
	}
}

// The control queue expires two leases after its last write or read
// (R-CM-1), as TestMemoryQueueExpiry_RCM1 checks on the memory store. Redis
// counts the expiry in its own time, so this reads the queue's PTTL: a
// wind-down (write) and a heartbeat (read) each set it back to two leases.
func TestRedisQueueExpiry_RCM1(t *testing.T) {
	const ttl = time.Second
	srv, nodes, wa, now := startDirectory(t, "queue", ttl, 1)
	ctx, s := ctxT(t), nodes[0]
	if _, err := s.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: now}); err != nil {
		t.Fatal(err)
	}
	pttl := func(what string) time.Duration {
		t.Helper()
		v, err := srv.Do("PTTL", "{queue}:q:"+wa)
		if err != nil {
			t.Fatal(err)
		}
		ms, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("unexpected PTTL reply %q", v)
		}
		if ms < 0 {
			t.Fatalf("unexpected queue without an expiry after %s; got PTTL %d", what, ms)
		}
		return time.Duration(ms) * time.Millisecond
	}
	// fresh checks the expiry was set back to two leases by an operation
	// that started at start: less only by the time since then (and Redis's
	// millisecond rounding), however loaded the machine — a fixed window
	// failed when the operation and the PTTL took longer than it.
	fresh := func(what string, start time.Time) {
		t.Helper()
		d := pttl(what)
		if low := 2*ttl - time.Since(start) - 5*time.Millisecond; d <= low || d > 2*ttl {
			t.Fatalf("unexpected queue expiry after %s; got %v; want two leases (%v) less the time since (above %v)", what, d, 2*ttl, low)
		}
	}
	start := time.Now()
	if _, _, err := s.WindDown(ctx, "/c", "x", "", nil, now); err != nil {
		t.Fatal(err)
	}
	fresh("the wind-down", start)
	time.Sleep(800 * time.Millisecond)
	if d := pttl("waiting"); d > 2*ttl-700*time.Millisecond {
		t.Fatalf("unexpected queue expiry 0.8s after the write; got %v", d)
	}
	start = time.Now()
	if res, err := s.Heartbeat(ctx, &directory.Beat{SessionID: wa, Sub: "sub", Headroom: 1}, now); err != nil || len(res.Messages) != 1 {
		t.Fatalf("unexpected heartbeat; got %+v, %v; want the message", res, err)
	}
	fresh("the heartbeat that read it", start)
	time.Sleep(800 * time.Millisecond)
	start = time.Now()
	if _, _, err := s.WindDown(ctx, "/c", "x", "", nil, now); err != nil {
		t.Fatal(err)
	}
	fresh("a second wind-down", start)
}

// A heartbeat removes the messages it acks from the control queue
// (R-CM-1). It ran one LREM per ack, each scanning the list from its head:
// quadratic when unacked messages lead the queue, and all of it in one
// script — 10,000 acks behind 10,000 unacked messages held Redis 3.8 s,
// longer than every node's staleness budget, so every node took its
// connection for dead. The queue is now rewritten once, in list order:
// counted in commands, which do not depend on the machine's speed.
func TestRedisHeartbeatAcksLinear_RCM1(t *testing.T) {
	srv, nodes, wa, now := startDirectory(t, "acks", time.Minute, 1)
	ctx, s := ctxT(t), nodes[0]
	const n = 20000
	msgs := make([]string, n)
	for i := range msgs {
		msgs[i] = fmt.Sprintf("%016x - /c\x00x", i)
	}
	c := rawClient(t, srv.Addr)
	for i := 0; i < n; i += 1000 {
		if err := c.Do(ctx, c.B().Rpush().Key("{acks}:q:"+wa).Element(msgs[i:i+1000]...).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	// The worker acks the second half: the first half stays queued.
	acks := make([]string, 0, n/2)
	for _, m := range msgs[n/2:] {
		acks = append(acks, m[:16])
	}
	before := totalCommands(t, srv)
	res, err := s.Heartbeat(ctx, &directory.Beat{SessionID: wa, Sub: "sub", Headroom: 1, Acks: acks}, now)
	// Commands run inside the script count (INFO's total): a few dozen
	// for the whole queue, where one LREM per ack made them n/2 more.
	ran := totalCommands(t, srv) - before
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Messages) != n/2 {
		t.Fatalf("unexpected messages after the acks; got %d; want %d", len(res.Messages), n/2)
	}
	for i, m := range res.Messages {
		if m.MsgID != msgs[i][:16] {
			t.Fatalf("unexpected message %d after the acks; got %s; want %s (queue order kept)", i, m.MsgID, msgs[i][:16])
		}
	}
	if ran > 100 {
		t.Fatalf("unexpected commands for a heartbeat acking %d messages behind %d unacked; got %d; want a few dozen (the queue rewritten once, not one scan per ack)", n/2, n/2, ran)
	}
	// Acking the rest empties the queue.
	acks = acks[:0]
	for _, m := range res.Messages {
		acks = append(acks, m.MsgID)
	}
	if res, err := s.Heartbeat(ctx, &directory.Beat{SessionID: wa, Sub: "sub", Headroom: 1, Acks: acks}, now); err != nil || len(res.Messages) != 0 {
		t.Fatalf("unexpected heartbeat after acking every message; got %+v, %v; want no message", res, err)
	}
	if ex, err := c.Do(ctx, c.B().Exists().Key("{acks}:q:"+wa).Build()).AsInt64(); err != nil || ex != 0 {
		t.Fatalf("unexpected queue after acking every message; got exists=%d, %v; want none", ex, err)
	}
}

// A re-registration hands the earlier session's pending control messages
// to the new session; the new queue expires two leases after that write
// like any other (R-CM-1), not never: a worker that re-registers and then
// stops left a queue in Redis for good.
func TestRedisHandedOverQueueExpires_RCM1(t *testing.T) {
	const ttl = time.Second
	srv, nodes, wa, now := startDirectory(t, "handq", ttl, 1)
	ctx, s := ctxT(t), nodes[0]
	if r, err := s.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: now}); err != nil || r.Owner.SessionID != wa {
		t.Fatalf("cannot place x; got %+v, %v", r, err)
	}
	if _, _, err := s.WindDown(ctx, "/c", "x", "", nil, now); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res, err := s.Register(ctx, &directory.Registration{ClientID: "a", Sub: "sub", Secret: "k-a", Namespaces: []string{"/c"},
		AdvertiseURL: "http://127.0.0.1:9/a", Headroom: 1, PrevSessionID: wa, Instances: map[string][]string{"/c": {"x"}}}, now)
	if err != nil {
		t.Fatal(err)
	}
	v, err := srv.Do("PTTL", "{handq}:q:"+res.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	ms, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("unexpected PTTL reply %q", v)
	}
	if d := time.Duration(ms) * time.Millisecond; d <= 2*ttl-time.Since(start)-5*time.Millisecond || d > 2*ttl {
		t.Fatalf("unexpected expiry of the handed-over queue; got PTTL %d ms; want two leases (%v) less the time since", ms, 2*ttl)
	}
}

// The first placement attempt after a boot or a wipe starts one lease of
// quarantine, not more: its 503 reads "resume in 15000ms" with Retry-After
// 15, as README.md shows for memory:, and every node's readiness and
// registry health say the same. The stamp is the request time in
// microseconds rounded up, and the rest was measured from the request time
// itself: a time with a fraction of a microsecond read 15001ms and
// Retry-After 16 through Redis (R-CS-1).
func TestRedisColdStartQuarantineIsOneLease_RCS1(t *testing.T) {
	const ttl = 15 * time.Second
	srv := redistest.StartServer(t)
	a := openNode(t, srv.URL(), "cold", ttl)
	b := openNode(t, srv.URL(), "cold", ttl)
	ctx := ctxT(t)
	now := time.Now().Truncate(time.Microsecond).Add(789 * time.Nanosecond)
	_, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: now})
	var q *directory.QuarantineError
	if !errors.As(err, &q) {
		t.Fatalf("unexpected first placement; got %v; want the cold-start quarantine", err)
	}
	if q.Remaining != ttl || q.Error() != "cold start: placements resume in 15000ms" {
		t.Fatalf("unexpected quarantine on the first attempt; got %v (%q); want %v", q.Remaining, q.Error(), ttl)
	}
	for name, n := range map[string]*directory.Redis{"A": a, "B": b} {
		if rem, err := n.Quarantine(ctx, now); err != nil || rem != ttl {
			t.Errorf("unexpected quarantine through %s; got %v, %v; want %v", name, rem, err, ttl)
		}
	}
	// Waiting what it said is enough.
	end := now.Add(q.Remaining)
	register(t, a, "w", 1, end)
	if _, err := b.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: end}); err != nil {
		t.Fatalf("cannot place once the quarantine said it ended: %v", err)
	}
}
