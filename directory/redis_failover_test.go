package directory_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/internal/testlog"
	"github.com/pinboard-go/pinboard/tools/redistest"
)

// A Redis Cluster master fails over to its replica under two running
// nodes (3 masters, 3 replicas), while both claim the same new ids: a
// controlled promotion (CLUSTER FAILOVER on the replica, which waits until
// the replica has every write of its master) and, in the next test, the
// master killed (SIGKILL) and its replica elected. Without restarting
// either node:
//   - the ids both nodes cached before the failover, re-placed through B
//     after it, stop routing on A within the staleness budget (2.5 s of a
//     10 s lease): A's tracking lived on its connection to the old master,
//     and the new master knows nothing of it (R-PL-1). After CLUSTER
//     FAILOVER that connection stays open (rueidis keeps one to every
//     replica) and the old master, now a replica, pushes the invalidations
//     of the writes it replicates (12–15 ms here); after a kill, the
//     closed connection wakes the revalidator, which drops A's rows once
//     the slot answers again;
//   - heartbeats, new placements (the claim script on a master that never
//     loaded it: NOSCRIPT, then EVAL) and the read-only scripts answer
//     again within a bounded time (R-SRV-3, R-LS-1);
//   - every id claimed concurrently through both nodes across the
//     failover has one owner and epoch, the same on both nodes and in
//     Redis (R-PL-1).
func TestRedisClusterFailoverKeepsOneOwner_RSRV3_RPL1(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-master redis cluster with replicas")
	}
	testClusterFailover(t, false)
}

// The same with the master killed (SIGKILL): until the cluster elects its
// replica (node timeout 2 s here) the directory's slot is down, cached ids
// keep routing and the rest fails with ErrUnavailable; then all resumes.
// An acknowledged write not yet replicated when the master died is lost
// (Redis replicates asynchronously): see docs/DIRECTORY.md, "Limits".
func TestRedisClusterMasterKilledKeepsOneOwner_RSRV3_RPL1(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-master redis cluster with replicas")
	}
	testClusterFailover(t, true)
}

func testClusterFailover(t *testing.T, kill bool) {
	c := redistest.StartClusterReplicas(t, 3, 1)
	ctx := ctxT(t)
	const ttl = 10 * time.Second
	var logA, logB testlog.Buffer
	a := openNodeLogged(t, c.URL(), "fo", ttl, &logA)
	b := openNodeLogged(t, c.URL(), "fo", ttl, &logB)
	defer func() {
		if t.Failed() {
			t.Logf("node A's log:\n%s\nnode B's log:\n%s", logA.String(), logB.String())
		}
	}()
	now, wa, wb := warmPair(t, a, b)

	// Hot ids, placed through A and resolved through B: cached on both.
	const hot = 20
	epochs := make([]uint64, hot)
	for i := range hot {
		id := "hot-" + strconv.Itoa(i)
		r, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: id, Now: now})
		if err != nil || r.Owner.SessionID != wa {
			t.Fatalf("unexpected placement of %s through A; got %+v, %v; want owner %s", id, r, err, wa)
		}
		epochs[i] = r.Epoch
		if r2, err := b.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: id, Now: now}); err != nil || r2.Owner.SessionID != wa || r2.Epoch != r.Epoch {
			t.Fatalf("unexpected resolution of %s through B; got %+v, %v; want %+v", id, r2, err, r)
		}
		for _, n := range []*directory.Redis{a, b} {
			if r, ok := n.Lookup([]byte("/c"), []byte(id), now); !ok || r.Owner.SessionID != wa {
				t.Fatalf("unexpected lookup of %s; got %+v, %v; want the cached owner %s", id, r, ok, wa)
			}
		}
	}
	master, replica, err := c.MasterAndReplica("{fo}:era")
	if err != nil {
		t.Fatal(err)
	}
	// Redis 7 replicates a script's effects, not the script: the replica
	// has none cached, and the first claim there is a NOSCRIPT, then EVAL.
	scriptsBefore := "?"
	if info, err := replica.Info("memory"); err == nil {
		scriptsBefore = info["number_of_cached_scripts"]
	}

	// Both nodes claim the same new ids, one after another, across the
	// failover.
	claims := startClaimers(ctx, now, a, b)
	t.Cleanup(func() { claims.stop() }) // before the nodes close

	time.Sleep(100 * time.Millisecond)
	failedAt := time.Now()
	if kill {
		master.Stop()
		// While the slot has no master, cached ids keep routing (R-DP-4).
		time.Sleep(500 * time.Millisecond)
		for i := range hot {
			if r, ok := a.Lookup([]byte("/c"), []byte("hot-"+strconv.Itoa(i)), now); !ok || r.Owner.SessionID != wa {
				t.Fatalf("unexpected lookup of hot-%d on A with the master down; got %+v, %v; want the cached owner %s", i, r, ok, wa)
			}
		}
	} else if out, err := replica.Do("CLUSTER", "FAILOVER"); err != nil || out != "OK" {
		t.Fatalf("unexpected reply to CLUSTER FAILOVER; got %q, %v", out, err)
	}
	if err := replica.WaitRole("master", 20*time.Second); err != nil {
		t.Fatal(err)
	}
	promoted := time.Since(failedAt)

	// Heartbeats and a new placement through each node answer again.
	bound := 5 * time.Second
	if kill {
		bound = 15 * time.Second
	}
	beat := func(n *directory.Redis, sid string) error {
		_, err := n.Heartbeat(ctx, &directory.Beat{SessionID: sid, Sub: "sub", Headroom: 1}, now)
		return err
	}
	var recovered [4]time.Duration
	for i, step := range []func() error{
		func() error { return beat(a, wa) },
		func() error { return beat(b, wb) },
		func() error {
			_, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "new-a", Now: now})
			return err
		},
		func() error {
			_, err := b.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "new-b", Now: now})
			return err
		},
	} {
		recovered[i] = retryUntil(t, kill, bound, failedAt, step)
	}
	// The read-only scripts (EVALSHA_RO: the session read, the listing).
	for _, n := range []*directory.Redis{a, b} {
		retryUntil(t, kill, bound, failedAt, func() error {
			_, err := n.Session(ctx, wb, now)
			return err
		})
		retryUntil(t, kill, bound, failedAt, func() error {
			ws, err := n.Workers(ctx, now)
			if err == nil && len(ws) != 2 {
				t.Fatalf("unexpected workers listing after the failover; got %d; want 2", len(ws))
			}
			return err
		})
	}

	// B re-places every hot id on its own worker; A must stop routing it
	// to A's worker within the staleness budget.
	replaced := make([]time.Time, hot)
	for i := range hot {
		id := "hot-" + strconv.Itoa(i)
		var r directory.Route
		retryUntil(t, kill, bound, failedAt, func() error {
			var err error
			r, err = b.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: id, Now: now, Exclude: wa})
			return err
		})
		if r.Owner.SessionID != wb || r.Epoch <= epochs[i] {
			t.Fatalf("unexpected re-placement of %s through B after the failover; got %+v; want a new placement on %s above epoch %d", id, r, wb, epochs[i])
		}
		epochs[i] = r.Epoch
		replaced[i] = time.Now()
	}
	var worst time.Duration
	for i := range hot {
		id := "hot-" + strconv.Itoa(i)
		for {
			r, ok := a.Lookup([]byte("/c"), []byte(id), now)
			if !ok || r.Owner.SessionID != wa {
				break
			}
			if d := time.Since(replaced[i]); d > 2500*time.Millisecond {
				t.Fatalf("unexpected lookup of %s on A %v after B re-placed it following the failover; got the old owner %s; want a miss or %s",
					id, d.Round(time.Millisecond), wa, wb)
			}
			time.Sleep(time.Millisecond)
		}
		worst = max(worst, time.Since(replaced[i]))
		r, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: id, Now: now})
		if err != nil || r.Owner.SessionID != wb || r.Epoch != epochs[i] {
			t.Fatalf("unexpected resolution of %s through A after the re-placement; got %+v, %v; want %s at epoch %d", id, r, err, wb, epochs[i])
		}
	}

	res := claims.stop()
	checkOneOwner(t, ctx, a, now, res, kill)
	t.Logf("promoted after %v; first acked heartbeat A %v, B %v; first new placement A %v, B %v (from the failover); "+
		"A dropped the re-placed hot ids %v after B's re-placement at worst; %d ids claimed by both nodes across it, %d errors meanwhile %v; "+
		"scripts cached on the replica before: %s",
		promoted.Round(time.Millisecond), recovered[0].Round(time.Millisecond), recovered[1].Round(time.Millisecond),
		recovered[2].Round(time.Millisecond), recovered[3].Round(time.Millisecond), worst.Round(time.Millisecond), len(res.ids), res.errs, res.kinds, scriptsBefore)
}

// claimRun is two nodes claiming the same ids in turn ("k-0", "k-1", …)
// until stopped; each id is retried on its node until it is answered.
type claimRun struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	got    [2]map[string]directory.Route
	res    claimResults
}

type claimResults struct {
	ids  []string
	got  [2]map[string]directory.Route
	errs int
	// kinds counts the errors by their last part (Redis's reply or the
	// transport error).
	kinds map[string]int
	// other: an error that is neither ErrUnavailable nor a quarantine.
	other error
}

func startClaimers(ctx context.Context, now time.Time, nodes ...*directory.Redis) *claimRun {
	ctx, cancel := context.WithCancel(ctx)
	cr := &claimRun{cancel: cancel}
	for i, n := range nodes {
		cr.got[i] = make(map[string]directory.Route)
		cr.wg.Add(1)
		go func() {
			defer cr.wg.Done()
			for k := 0; ctx.Err() == nil; k++ {
				id := "k-" + strconv.Itoa(k)
				for ctx.Err() == nil {
					r, err := n.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: id, Now: now})
					if err == nil {
						cr.mu.Lock()
						cr.got[i][id] = r
						cr.mu.Unlock()
						break
					}
					if ctx.Err() != nil { // stopped, not an answer
						break
					}
					cr.mu.Lock()
					cr.res.errs++
					if cr.res.kinds == nil {
						cr.res.kinds = make(map[string]int)
					}
					cr.res.kinds[errKind(err)]++
					var q *directory.QuarantineError
					if !errors.Is(err, directory.ErrUnavailable) && !errors.As(err, &q) && cr.res.other == nil {
						cr.res.other = err
					}
					cr.mu.Unlock()
					time.Sleep(5 * time.Millisecond)
				}
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	return cr
}

// errKind is the last ": "-separated part of err, digits dropped.
func errKind(err error) string {
	msg := err.Error()
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		msg = msg[i+2:]
	}
	return strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' {
			return -1
		}
		return r
	}, msg)
}

func (cr *claimRun) stop() claimResults {
	cr.cancel()
	cr.wg.Wait()
	res := cr.res
	res.got = cr.got
	for id := range cr.got[0] {
		if _, ok := cr.got[1][id]; ok {
			res.ids = append(res.ids, id)
		}
	}
	return res
}

// checkOneOwner wants every id both nodes got an answer for to have one
// owner and epoch on both, and the same in Redis. After a master was
// killed, a claim it acknowledged but had not replicated yet is lost
// (asynchronous replication): the id may then be claimed again, and the
// node that read the lost epoch finds the directory went back in time at
// its next claim (a new era and the cold-start quarantine). Such ids are
// logged, and the quarantine must have followed.
func checkOneOwner(t *testing.T, ctx context.Context, n *directory.Redis, now time.Time, res claimResults, kill bool) {
	t.Helper()
	if res.other != nil {
		t.Fatalf("unexpected claim error across the failover; got %v; want ErrUnavailable or a quarantine at most", res.other)
	}
	if len(res.ids) < 20 {
		t.Fatalf("unexpected claims across the failover; got %d ids answered on both nodes; want at least 20", len(res.ids))
	}
	var split []string
	for _, id := range res.ids {
		ra, rb := res.got[0][id], res.got[1][id]
		if ra.Owner.SessionID != rb.Owner.SessionID || ra.Epoch != rb.Epoch {
			split = append(split, id+": "+ra.Owner.SessionID+"@"+strconv.FormatUint(ra.Epoch, 10)+" vs "+rb.Owner.SessionID+"@"+strconv.FormatUint(rb.Epoch, 10))
			continue
		}
		p, err := n.Placement(ctx, "/c", id, now)
		if err != nil {
			t.Fatalf("cannot read the placement of %s: %v", id, err)
		}
		if p == nil || p.SessionID != ra.Owner.SessionID || p.Epoch != ra.Epoch {
			split = append(split, id+": redis holds "+placementString(p)+", both nodes "+ra.Owner.SessionID+"@"+strconv.FormatUint(ra.Epoch, 10))
		}
	}
	if len(split) == 0 {
		return
	}
	if !kill {
		t.Fatalf("unexpected owners across a controlled failover (no write can be lost there); got %d ids split: %s", len(split), strings.Join(split, "; "))
	}
	t.Logf("acknowledged claims lost with the killed master (asynchronous replication): %s", strings.Join(split, "; "))
}

func placementString(p *directory.PlacementInfo) string {
	if p == nil {
		return "nothing"
	}
	return p.SessionID + "@" + strconv.FormatUint(p.Epoch, 10)
}

// retryUntil calls step until it succeeds, failing the test when it has
// not within bound of since or returns anything but ErrUnavailable; it
// returns the time from since to the success.
//
// With lossPossible (a master was killed), a cold-start quarantine ends
// the test as skipped: a claim the master acknowledged had not reached the
// replica (asynchronous replication; a window of microseconds here), and a
// node that read it found the directory went back in time — the path
// TestRedisClusterLostWriteOnFailover_RSRV3_RPL1_RCS1 checks on purpose.
func retryUntil(t *testing.T, lossPossible bool, bound time.Duration, since time.Time, step func() error) time.Duration {
	t.Helper()
	for {
		err := step()
		if err == nil {
			return time.Since(since)
		}
		var q *directory.QuarantineError
		if lossPossible && errors.As(err, &q) {
			t.Skipf("a claim acknowledged by the killed master was lost and found (quarantine %v): see TestRedisClusterLostWriteOnFailover_RSRV3_RPL1_RCS1", q.Remaining)
		}
		if !errors.Is(err, directory.ErrUnavailable) {
			t.Fatalf("unexpected error after the failover; got %v; want success or ErrUnavailable", err)
		}
		if time.Since(since) > bound {
			t.Fatalf("unexpected failure %v after the failover; got %v; want success within %v", time.Since(since).Round(time.Millisecond), err, bound)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Redis replicates asynchronously: a claim the master acknowledged and
// died before sending to its replica is lost when the replica is promoted
// (here the replica is paused, SIGSTOP, while the claim runs, which
// widens the window from the replication's one-way delay to the pause).
// What the directory does then (docs/DIRECTORY.md, "Limits"):
//   - a node that read the lost placement finds the epoch counter below
//     what it read, after its reconnect: the directory went back in time,
//     a new era and the cold-start quarantine follow (R-CS-1), so no new
//     placement can give the id a second owner while its old owner may
//     still host it;
//   - a node that read none of the lost placements, placing first, cannot
//     tell: the id is placed again, at a higher epoch (the worker fences
//     the older one). This is the limit the test pins down.
func TestRedisClusterLostWriteOnFailover_RSRV3_RPL1_RCS1(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-master redis cluster with replicas")
	}
	for _, tc := range []struct {
		name   string
		reader bool // the claiming node runs on and reads the lost epoch
	}{{"ClaimingNodeDetects", true}, {"FreshNodePlacesAgain", false}} {
		t.Run(tc.name, func(t *testing.T) {
			c := redistest.StartClusterReplicas(t, 3, 1)
			ctx := ctxT(t)
			const ttl = 10 * time.Second
			a := openNode(t, c.URL(), "lost", ttl)
			b := openNode(t, c.URL(), "lost", ttl)
			now, wa, wb := warmPair(t, a, b)
			if _, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "kept", Now: now}); err != nil {
				t.Fatal(err)
			}
			master, replica, err := c.MasterAndReplica("{lost}:era")
			if err != nil {
				t.Fatal(err)
			}

			// The replica paused and its link closed by the master: the
			// claim below reaches the master's backlog only. (A pause
			// alone loses nothing: the stream waits in the paused
			// replica's socket.)
			if err := replica.Pause(); err != nil {
				t.Fatal(err)
			}
			if out, err := master.Do("CLIENT", "KILL", "TYPE", "replica"); err != nil || out != "1" {
				_ = replica.Resume()
				t.Fatalf("unexpected reply to CLIENT KILL TYPE replica; got %q, %v; want 1", out, err)
			}
			r1, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "lost", Now: now})
			if err != nil || !r1.Placed || r1.Owner.SessionID != wa {
				_ = replica.Resume()
				t.Fatalf("unexpected claim while the replica is paused; got %+v, %v; want a new placement on %s", r1, err, wa)
			}
			if !tc.reader {
				_ = a.Close() // the node that read it is gone (restarted, scaled down)
			}
			master.Stop()
			if err := replica.Resume(); err != nil {
				t.Fatal(err)
			}
			if err := replica.WaitRole("master", 20*time.Second); err != nil {
				t.Fatal(err)
			}

			var r2 directory.Route
			var q *directory.QuarantineError
			deadline := time.Now().Add(15 * time.Second)
			for {
				// Only one node places: a placement through B first (which
				// read nothing lost) would hide the loss from A too, as
				// in the second case.
				n := b
				if tc.reader {
					n = a
				}
				// The clock moved on during the failover (seconds): the
				// new epoch is minted above it.
				r2, err = n.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "lost", Now: now.Add(time.Second), Exclude: wa})
				if err == nil || errors.As(err, &q) {
					break
				}
				if !errors.Is(err, directory.ErrUnavailable) || time.Now().After(deadline) {
					t.Fatalf("unexpected placement after the failover; got %v; want a placement or a quarantine within 15 s", err)
				}
				time.Sleep(20 * time.Millisecond)
			}
			var p *directory.PlacementInfo
			retryUntil(t, false, 5*time.Second, time.Now(), func() error {
				var err error
				p, err = b.Placement(ctx, "/c", "kept", now)
				return err
			})
			if p == nil || p.SessionID != wa {
				t.Fatalf("unexpected placement of an id replicated before the failover; got %+v; want it on %s", p, wa)
			}
			if tc.reader {
				if q == nil {
					t.Fatalf("unexpected placement of the lost id through the node that read it; got %+v; want the cold-start quarantine (the directory went back in time)", r2)
				}
				t.Logf("lost claim (epoch %d) found by the node that read it: quarantine %v", r1.Epoch, q.Remaining)
				return
			}
			if err != nil {
				t.Fatalf("unexpected placement through a node that read nothing lost; got %v; want a new placement (the loss cannot be seen there)", err)
			}
			if !r2.Placed || r2.Owner.SessionID != wb || r2.Epoch <= r1.Epoch {
				t.Fatalf("unexpected placement of the lost id; got %+v; want a new placement on %s above the lost epoch %d", r2, wb, r1.Epoch)
			}
			t.Logf("lost claim %s@%d placed again as %s@%d by a node that never read it: two workers were told they own it; the epochs tell them apart",
				wa, r1.Epoch, r2.Owner.SessionID, r2.Epoch)
		})
	}
}
