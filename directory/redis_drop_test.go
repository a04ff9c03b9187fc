package directory_test

import (
	"context"
	"errors"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/tools/redistest"
)

// TestRedisDropBatchIsRegisterBatch: the scripts free as many rows per
// call as a registration reclaims (DROPBATCH in redis_lib.lua).
func TestRedisDropBatchIsRegisterBatch(t *testing.T) {
	m := regexp.MustCompile(`(?m)^local DROPBATCH = (\d+)$`).FindStringSubmatch(directory.LuaLib)
	if m == nil || m[1] != strconv.Itoa(directory.RegisterBatch) {
		t.Fatalf("unexpected DROPBATCH in redis_lib.lua; got %q; want %d", m, directory.RegisterBatch)
	}
}

// scard returns how many rows a session's row set still lists.
func scard(t *testing.T, c rueidis.Client, prefix, sid string) int64 {
	t.Helper()
	n, err := c.Do(context.Background(), c.B().Scard().Key("{"+prefix+"}:r:"+sid).Build()).AsInt64()
	if err != nil {
		t.Errorf("cannot read the row set of %s: %v", sid, err)
	}
	return n
}

// TestRedisDropHoldsOneBatch: dropping a session holding many rows —
// a deregister (R-REG-3), a void (R-LS-3), the sweep of a dead session
// (R-LS-2) — never holds Redis for more than one batch: each script call
// frees at most RegisterBatch of its rows (its row set, read between the
// calls, shrinks by at most that), and Redis's SLOWLOG shows other
// clients' commands — a PING, a placement through another node —
// executed between them. So does the forced release of a timed drain past
// its deadline (R-LS-5), which frees the rows of a session that stays
// live. One script for the whole session, as before, fails both.
func TestRedisDropHoldsOneBatch_RREG3_RLS3_RLS2_RLS5(t *testing.T) {
	srv := redistest.StartServer(t)
	c := rawClient(t, srv.Addr)
	const n = 20 * directory.RegisterBatch
	for _, tc := range []string{"deregister", "void", "sweep", "drain"} {
		t.Run(tc, func(t *testing.T) {
			prefix := "drops-" + tc
			s := openNode(t, srv.URL()+"?client_name=dropping-"+tc, prefix, time.Hour)
			other := openNode(t, srv.URL()+"?client_name=other-"+tc, prefix, time.Hour)
			reg, now := ownInstances(t, s, n)
			sid := reg.PrevSessionID
			left, calls := int64(n), 1
			directory.SetAfterDropBatch(s, func() {
				cur := scard(t, c, prefix, sid)
				if left-cur > directory.RegisterBatch || cur >= left {
					t.Errorf("unexpected rows freed by one script call; got %d; want 1 to %d", left-cur, directory.RegisterBatch)
				}
				left = cur
				calls++
				if calls%5 != 2 {
					return
				}
				mark := "between-" + strconv.Itoa(calls)
				if err := c.Do(context.Background(), c.B().Ping().Message(mark).Build()).Error(); err != nil {
					t.Errorf("cannot PING between batches: %v", err)
				}
				if _, err := other.Place(context.Background(), &directory.PlaceRequest{NS: "/warm", ID: mark, Now: now}); err == nil ||
					!errors.Is(err, directory.ErrUnknownNamespace) {
					t.Errorf("unexpected placement through another node between batches; got %v; want ErrUnknownNamespace", err)
				}
			})
			slowlogAll(t, c)
			var err error
			switch tc {
			case "deregister":
				err = s.Deregister(context.Background(), sid, now)
			case "void":
				err = s.Void(context.Background(), sid, now)
			case "sweep":
				err = s.Sweep(context.Background(), now.Add(2*time.Hour+time.Millisecond))
			case "drain":
				err = s.Sweep(context.Background(), drainPast(t, s, reg.ClientID, now))
			}
			if err != nil {
				t.Fatalf("cannot %s: %v", tc, err)
			}
			if want := n / directory.RegisterBatch; calls < want {
				t.Fatalf("unexpected script calls of the drop; got %d; want at least %d", calls, want)
			}
			if tc == "drain" {
				wantReleased(t, c, prefix, sid)
			} else if left := sessionKeys(t, c, prefix); len(left) != 0 {
				t.Fatalf("unexpected keys left after the drop; got %q", left[:min(len(left), 4)])
			}
			var first, last int64 = -1, -1
			for _, e := range slowlog(t, c) {
				if e.client == "dropping-"+tc && isScript(e) {
					if first < 0 {
						first = e.id
					}
					last = e.id
				}
			}
			pings, claims := 0, 0
			for _, e := range slowlog(t, c) {
				if e.id <= first || e.id >= last {
					continue
				}
				switch {
				case strings.EqualFold(e.args[0], "ping") && len(e.args) == 2 && strings.HasPrefix(e.args[1], "between-"):
					pings++
				case e.client == "other-"+tc && isScript(e):
					claims++
				}
			}
			if want := (calls + 2) / 5; pings != want || claims < want {
				t.Fatalf("unexpected commands of other clients between the drop's script calls; got %d PINGs, %d claims; want %d and at least %d",
					pings, claims, want, want)
			}
		})
	}
}

// TestRedisDropFailsBetweenBatches: a drop cut short between two batches
// (here the caller's context ends) answers ErrUnavailable with the session
// already gone — no heartbeat renews it, its rows re-place — and the next
// sweep, with no lease passing, frees the rest, leaving no key behind
// (R-REG-3, R-LS-2). A sweep cut short likewise leaves the rest to the
// next one.
func TestRedisDropFailsBetweenBatches_RREG3_RLS2(t *testing.T) {
	srv := redistest.StartServer(t)
	c := rawClient(t, srv.Addr)
	const n = 4 * directory.RegisterBatch
	for _, tc := range []string{"deregister", "sweep"} {
		t.Run(tc, func(t *testing.T) {
			prefix := "dropfails-" + tc
			s := openNode(t, srv.URL(), prefix, time.Hour)
			reg, now := ownInstances(t, s, n)
			sid := reg.PrevSessionID
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			directory.SetAfterDropBatch(s, cancel)
			var err error
			if tc == "deregister" {
				err = s.Deregister(ctx, sid, now)
			} else {
				now = now.Add(2*time.Hour + time.Millisecond)
				err = s.Sweep(ctx, now)
			}
			if !errors.Is(err, directory.ErrUnavailable) || !errors.Is(err, context.Canceled) {
				t.Fatalf("unexpected result of a drop whose context ended; got %v; want ErrUnavailable", err)
			}
			if strings.Contains(err.Error(), "script reply") {
				t.Fatalf("unexpected message of a drop whose context ended; got %q; want the cancellation alone, not a bad reply", err)
			}
			directory.SetAfterDropBatch(s, nil)
			if _, err := s.Heartbeat(context.Background(), &directory.Beat{SessionID: sid, Sub: "s"}, now); !errors.Is(err, directory.ErrUnknownSession) {
				t.Fatalf("unexpected heartbeat of the session cut short; got %v; want ErrUnknownSession", err)
			}
			if got := scard(t, c, prefix, sid); got != n-directory.RegisterBatch {
				t.Fatalf("unexpected rows left; got %d; want %d", got, n-directory.RegisterBatch)
			}
			b := register(t, s, "b", n, now)
			r, err := s.Place(context.Background(), &directory.PlaceRequest{NS: "/c", ID: "instance-" + strconv.Itoa(n-1), Now: now})
			if err != nil || r.Owner.SessionID != b || !r.Placed {
				t.Fatalf("unexpected placement of an id the session cut short held; got %+v, %v; want placed on %s", r, err, b)
			}
			if err := s.Deregister(context.Background(), b, now); err != nil {
				t.Fatal(err)
			}
			if err := s.Sweep(context.Background(), now); err != nil {
				t.Fatal(err)
			}
			if left := sessionKeys(t, c, prefix); len(left) != 0 {
				t.Fatalf("unexpected keys left after the sweep; got %d, %q", len(left), left[:min(len(left), 4)])
			}
		})
	}
}

// drainPast puts client on a timed drain whose deadline is a minute after
// now, and returns the deadline: a sweep then force-releases its rows.
func drainPast(t *testing.T, s directory.Store, client string, now time.Time) time.Time {
	t.Helper()
	deadline := now.Add(time.Minute)
	if found, err := s.SetDrain(context.Background(), client, directory.DrainState{Draining: true, Deadline: deadline}, now); !found || err != nil {
		t.Fatalf("cannot drain %s; got %v, %v", client, found, err)
	}
	return deadline
}

// wantReleased fails unless the drained session sid holds no row and no
// release is left to finish (the 'dropped' set is gone), while the
// session itself is still there.
func wantReleased(t *testing.T, c rueidis.Client, prefix, sid string) {
	t.Helper()
	if left := scard(t, c, prefix, sid); left != 0 {
		t.Fatalf("unexpected rows left after the forced release; got %d; want 0", left)
	}
	ctx := context.Background()
	n, err := c.Do(ctx, c.B().Exists().Key("{"+prefix+"}:dropped", "{"+prefix+"}:s:"+sid).Build()).AsInt64()
	if err != nil || n != 1 {
		t.Fatalf("unexpected keys after the forced release; got %d of the 'dropped' set and the session record, %v; want the record alone", n, err)
	}
	keys, err := c.Do(ctx, c.B().Keys().Pattern("{"+prefix+"}:p:*").Build()).AsStrSlice()
	if err != nil || len(keys) != 0 {
		t.Fatalf("unexpected placement rows after the forced release; got %d, %v; want none", len(keys), err)
	}
}

// TestRedisDrainReleaseFailsBetweenBatches_RLS5: a sweep cut short between
// two batches of a timed drain's forced release (here the caller's
// context ends, as when its node dies) answers ErrUnavailable; the drained
// session is still live, its remaining rows listed, and the next sweeps —
// on two other nodes at once, the deadline long passed and the release
// flag long set — free every one of them: released once, not lost. Ids
// freed place on another worker.
func TestRedisDrainReleaseFailsBetweenBatches_RLS5(t *testing.T) {
	srv := redistest.StartServer(t)
	c := rawClient(t, srv.Addr)
	const n = 12 * directory.RegisterBatch
	const prefix = "drainfails"
	s := openNode(t, srv.URL(), prefix, time.Hour)
	reg, now := ownInstances(t, s, n)
	sid := reg.PrevSessionID
	now = drainPast(t, s, reg.ClientID, now)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	directory.SetAfterDropBatch(s, cancel)
	err := s.Sweep(ctx, now)
	if !errors.Is(err, directory.ErrUnavailable) || !errors.Is(err, context.Canceled) {
		t.Fatalf("unexpected result of a sweep whose context ended; got %v; want ErrUnavailable", err)
	}
	if got := scard(t, c, prefix, sid); got != n-directory.RegisterBatch {
		t.Fatalf("unexpected rows left; got %d; want %d", got, n-directory.RegisterBatch)
	}
	if _, err := s.Heartbeat(context.Background(), &directory.Beat{SessionID: sid, Sub: "s"}, now); err != nil {
		t.Fatalf("cannot heartbeat the drained session: %v", err)
	}
	others := []*directory.Redis{openNode(t, srv.URL(), prefix, time.Hour), openNode(t, srv.URL(), prefix, time.Hour)}
	errs := make(chan error, len(others))
	for _, o := range others {
		go func() { errs <- o.Sweep(context.Background(), now.Add(time.Second)) }()
	}
	for range others {
		if err := <-errs; err != nil {
			t.Fatalf("cannot sweep on another node: %v", err)
		}
	}
	wantReleased(t, c, prefix, sid)
	b := register(t, s, "b", n, now)
	for _, i := range []int{0, n / 2, n - 1} {
		id := "instance-" + strconv.Itoa(i)
		r, err := others[i%2].Place(context.Background(), &directory.PlaceRequest{NS: "/c", ID: id, Now: now})
		if err != nil || r.Owner.SessionID != b || !r.Placed {
			t.Fatalf("unexpected placement of %s after the forced release; got %+v, %v; want placed on %s", id, r, err, b)
		}
	}
}

// TestRedisSupersedeCutShortLeftToTheSweep_RLS4_RREG1: a registration
// that supersedes a session holding many rows frees what the opening call
// left itself (redis_drop.lua, displacer), so no sweep frees those rows
// unseen by it while it runs (SweepDuringSupersedeKeepsDuplicates in the
// contract suite). Cut short between two of those calls, it leaves them to
// the sweep all the same: not at once — the registration may still be
// running — but one lease later, and then every key goes.
func TestRedisSupersedeCutShortLeftToTheSweep_RLS4_RREG1(t *testing.T) {
	srv := redistest.StartServer(t)
	c := rawClient(t, srv.Addr)
	const n = 4 * directory.RegisterBatch
	const prefix = "supersede-cut"
	ttl := time.Minute
	s := openNode(t, srv.URL(), prefix, ttl)
	ctx := context.Background()
	now := time.Now()
	_, _ = s.Place(ctx, &directory.PlaceRequest{NS: "/warm", ID: "x", Now: now})
	now = now.Add(ttl)
	list := make([]string, n)
	for i := range list {
		list[i] = "instance-" + strconv.Itoa(i)
	}
	bound := func(client string, epoch int64) *directory.Registration {
		return &directory.Registration{ClientID: client, Sub: "s", Secret: "k", Namespaces: []string{"/c"},
			AdvertiseURL: "http://127.0.0.1:9/" + client, Headroom: 1e9, Hostname: "app.example", Env: client, Epoch: epoch,
			Instances: map[string][]string{"/c": list}}
	}
	blue, err := s.Register(ctx, bound("blue", 1), now)
	if err != nil {
		t.Fatal(err)
	}
	cut, cancel := context.WithCancel(ctx)
	defer cancel()
	directory.SetAfterDropBatch(s, cancel)
	if _, err := s.Register(cut, bound("green", 2), now); !errors.Is(err, directory.ErrUnavailable) {
		t.Fatalf("unexpected result of a registration whose context ended; got %v; want ErrUnavailable", err)
	}
	directory.SetAfterDropBatch(s, nil)
	left := scard(t, c, prefix, blue.SessionID)
	if left == 0 || left == n {
		t.Fatalf("unexpected rows of the superseded session left; got %d; want some of %d", left, n)
	}
	if err := s.Sweep(ctx, now); err != nil {
		t.Fatal(err)
	}
	if got := scard(t, c, prefix, blue.SessionID); got != left {
		t.Fatalf("unexpected rows freed by a sweep while the registration may still run; got %d left; want %d", got, left)
	}
	now = now.Add(ttl + time.Millisecond)
	if err := s.Sweep(ctx, now.Add(ttl)); err != nil { // green's lease passed too
		t.Fatal(err)
	}
	var keys []string
	for _, k := range sessionKeys(t, c, prefix) {
		if !strings.HasPrefix(k, "{"+prefix+"}:t:") { // blue's tomb: it expires on Redis's clock
			keys = append(keys, k)
		}
	}
	if len(keys) != 0 {
		t.Fatalf("unexpected keys left after the sweep; got %d, %q; want none", len(keys), keys[:min(len(keys), 4)])
	}
}
