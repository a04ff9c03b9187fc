package directory_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/tools/redistest"
)

// A Redis that stops answering without closing anything — paused with
// SIGSTOP here, as a frozen VM, a stalled server or a silent partition
// would be — held every call that needed it until its caller's deadline,
// for as long as it stayed paused: a new placement the proxy's whole 5–6 s
// placeTimeout, a heartbeat 3 s, a readiness check 3 s, where a stopped
// Redis fails them in milliseconds (R-DP-4: 503 with Retry-After while
// nothing can serve). Now, once the node finds Redis silent (its
// keep-alive, then its revalidation, time out), such calls fail at once
// with ErrUnavailable; cached ids keep routing under their owners' known
// leases throughout; and when Redis answers again everything resumes on
// the same store, the placement made before the pause unchanged.
func TestRedisPausedFailsFastAndRecovers_RDP4(t *testing.T) {
	srv := redistest.StartServer(t)
	testPaused(t, srv.URL(), srv)
}

// The same on a 3-master Redis Cluster, the master serving the
// directory's slot paused (the other two mark it failed and answer
// CLUSTERDOWN meanwhile).
func TestRedisClusterPausedFailsFastAndRecovers_RDP4(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	srv, err := c.NodeFor("{pause}:era")
	if err != nil {
		t.Fatal(err)
	}
	testPaused(t, c.URL(), srv)
}

// testPaused pauses srv, the server holding the directory at url.
func testPaused(t *testing.T, url string, srv *redistest.Server) {
	const budget = time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	a, err := directory.OpenRedis(ctx, url, directory.RedisOptions{LeaseTTL: 40 * time.Second, Prefix: "pause", Staleness: budget})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	t0 := warmRedis(t, a, time.Now())
	begin := time.Now()
	now := func() time.Time { return t0.Add(time.Since(begin)) }
	wa := register(t, a, "a", 10, t0)
	r1, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: t0})
	if err != nil || r1.Owner.SessionID != wa {
		t.Fatalf("unexpected placement; got %+v, %v; want %s", r1, err, wa)
	}
	if _, err := a.Quarantine(ctx, t0); err != nil {
		t.Fatal(err)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	paused := true
	defer func() {
		if paused {
			_ = srv.Resume()
		}
	}()
	// Each call gets far longer than the node takes to find Redis
	// silent: one that waits for Redis shows as taking the budget or more.
	call := func(f func(context.Context) error) (time.Duration, error) {
		c, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		start := time.Now()
		err := f(c)
		return time.Since(start), err
	}
	place := func(id string) func(context.Context) error {
		return func(c context.Context) error {
			_, err := a.Place(c, &directory.PlaceRequest{NS: "/c", ID: id, Now: now()})
			return err
		}
	}
	pausedAt := time.Now()
	for n := 0; ; n++ {
		if r, ok := a.Lookup([]byte("/c"), []byte("x"), now()); !ok || r.Owner.SessionID != wa || r.Epoch != r1.Epoch {
			t.Fatalf("unexpected lookup of a cached id %v into the pause; got %+v, %v; want %s at epoch %d",
				time.Since(pausedAt), r, ok, wa, r1.Epoch)
		}
		d, err := call(place("y"))
		if !errors.Is(err, directory.ErrUnavailable) {
			t.Fatalf("unexpected new placement while redis is paused; got %v; want ErrUnavailable", err)
		}
		if d < budget/2 && errors.Is(err, directory.ErrNotAnswering) {
			t.Logf("new placements fail at once %v into the pause (%d waited for redis before)", time.Since(pausedAt).Round(time.Millisecond), n)
			break
		}
		if time.Since(pausedAt) > 20*time.Second {
			t.Fatalf("unexpected wait: new placements still wait for a redis paused %v (the last %v: %v); want them failing at once",
				time.Since(pausedAt).Round(time.Millisecond), d.Round(time.Millisecond), err)
		}
	}
	for what, f := range map[string]func(context.Context) error{
		"a new placement": place("z"),
		"readiness": func(c context.Context) error {
			_, err := a.Quarantine(c, now())
			return err
		},
		"a heartbeat": func(c context.Context) error {
			_, err := a.Heartbeat(c, &directory.Beat{SessionID: wa, Sub: "sub", Headroom: 10}, now())
			return err
		},
		"a registration": func(c context.Context) error {
			_, err := a.Register(c, &directory.Registration{ClientID: "b", Sub: "sub", Secret: "k-b", Namespaces: []string{"/c"},
				AdvertiseURL: "http://127.0.0.1:9/b", Headroom: 1}, now())
			return err
		},
		"the workers listing": func(c context.Context) error {
			_, err := a.Workers(c, now())
			return err
		},
		"a sweep": func(c context.Context) error { return a.Sweep(c, now()) },
	} {
		d, err := call(f)
		if !errors.Is(err, directory.ErrUnavailable) || !errors.Is(err, directory.ErrNotAnswering) || d >= budget/2 {
			t.Fatalf("unexpected answer to %s while redis is paused and known silent; got %v after %v; want ErrUnavailable at once", what, err, d)
		}
	}
	if r, ok := a.Lookup([]byte("/c"), []byte("x"), now()); !ok || r.Owner.SessionID != wa {
		t.Fatalf("unexpected lookup of a cached id %v into the pause; got %+v, %v; want %s", time.Since(pausedAt), r, ok, wa)
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	paused = false
	resumed := time.Now()
	for {
		d, err := call(place("y"))
		if err == nil {
			t.Logf("placements resumed %v after redis did", time.Since(resumed).Round(time.Millisecond))
			break
		}
		if time.Since(resumed) > 20*time.Second {
			t.Fatalf("unexpected placement %v after redis resumed; got %v after %v; want the node back without a restart", time.Since(resumed), err, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
	r2, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: now()})
	if err != nil || r2.Owner.SessionID != wa || r2.Epoch != r1.Epoch || r2.Placed {
		t.Fatalf("unexpected resolution of the id placed before the pause; got %+v, %v; want %s at epoch %d, not placed again", r2, err, wa, r1.Epoch)
	}
	if _, err := a.Heartbeat(ctx, &directory.Beat{SessionID: wa, Sub: "sub", Headroom: 10}, now()); err != nil {
		t.Fatalf("cannot heartbeat after the pause: %v", err)
	}
	if q, err := a.Quarantine(ctx, now()); err != nil || q != 0 {
		t.Fatalf("unexpected readiness after the pause; got %v, %v; want 0, nil (no wipe)", q, err)
	}
}

// A claim cut short — its caller's deadline passing while Redis holds it
// (CLIENT PAUSE WRITE: reads go on, scripts wait) — still runs when Redis
// goes on, after its caller was told the directory is unavailable. Two
// such claims for one id, from two nodes preferring different workers,
// leave one owner: the first to run places it, the second finds it live;
// both nodes then resolve that owner at that epoch, and exactly one
// worker's row set lists the id (R-PL-1). A caller's own deadline does not
// make the node hold Redis silent (a slow Redis is not a silent one): the
// next calls go to Redis as before.
func TestRedisClaimsCutShortLeaveOneOwner_RPL1(t *testing.T) {
	srv := redistest.StartServer(t)
	ctx := ctxT(t)
	a := openNode(t, srv.URL(), "cut", 15*time.Second)
	b := openNode(t, srv.URL(), "cut", 15*time.Second)
	now := warmRedis(t, a, time.Now())
	w1 := register(t, a, "w1", 10, now)
	w2 := register(t, b, "w2", 10, now)
	// Shorter than the staleness budget (3 s): the connections live on.
	if _, err := srv.Do("CLIENT", "PAUSE", "1000", "WRITE"); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 2)
	for _, n := range []struct {
		s      *directory.Redis
		prefer string
	}{{a, w1}, {b, w2}} {
		go func() {
			c, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			_, err := n.s.Place(c, &directory.PlaceRequest{NS: "/c", ID: "m", Now: now, Pick: directory.PickInput{CallerSession: n.prefer}})
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; !errors.Is(err, directory.ErrUnavailable) {
			t.Fatalf("unexpected claim while redis holds scripts; got %v; want ErrUnavailable at the caller's deadline", err)
		}
	}
	var want directory.Route
	for i, n := range []*directory.Redis{a, b, a, b} {
		// The first call of each node may still queue behind its claim.
		r, err := n.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "m", Now: now})
		if err != nil {
			t.Fatalf("unexpected placement after the claims cut short; got %v; want the owner one of them placed", err)
		}
		if i == 0 {
			want = r
		}
		if r.Owner.SessionID != want.Owner.SessionID || r.Epoch != want.Epoch || r.Placed {
			t.Fatalf("unexpected owner through node %d after the claims cut short; got %s at %d (placed %v); want %s at %d",
				i%2, r.Owner.SessionID, r.Epoch, r.Placed, want.Owner.SessionID, want.Epoch)
		}
	}
	raw := rawClient(t, srv.Addr)
	if n1, n2 := scard(t, raw, "cut", w1), scard(t, raw, "cut", w2); n1+n2 != 1 {
		t.Fatalf("unexpected row sets after two claims of one id; got %d on w1 and %d on w2; want the id on one worker", n1, n2)
	}
	for i, n := range []*directory.Redis{a, b} {
		if r, ok := n.Lookup([]byte("/c"), []byte("m"), now); ok && (r.Owner.SessionID != want.Owner.SessionID || r.Epoch != want.Epoch) {
			t.Fatalf("unexpected cached owner on node %d; got %s at %d; want %s at %d", i, r.Owner.SessionID, r.Epoch, want.Owner.SessionID, want.Epoch)
		}
	}
}

// Redis out of memory (noeviction at maxmemory, as docs/DIRECTORY.md asks):
// it refuses every write, and every read that fills the client cache (rueidis
// fills through MULTI, which Redis refuses while out of memory). New
// placements, heartbeats, registrations and readiness fail with
// ErrUnavailable naming Redis's OOM, cached ids keep routing, no script
// leaves a key half-written, and everything resumes once memory is freed.
func TestRedisOutOfMemoryFailsCleanly_RDP4(t *testing.T) {
	srv := redistest.StartServer(t)
	ctx := ctxT(t)
	a := openNode(t, srv.URL(), "oom", 15*time.Second)
	now := warmRedis(t, a, time.Now())
	w := register(t, a, "w1", 10, now)
	if _, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: now}); err != nil {
		t.Fatal(err)
	}
	keys, err := srv.Do("DBSIZE")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Do("CONFIG", "SET", "maxmemory", "1"); err != nil {
		t.Fatal(err)
	}
	reg := &directory.Registration{ClientID: "w2", Sub: "sub", Secret: "k-w2", Namespaces: []string{"/c"},
		AdvertiseURL: "http://127.0.0.1:9/w2", Headroom: 1, Instances: map[string][]string{"/c": {"x", "z"}}}
	for what, f := range map[string]func() error{
		"a new placement": func() error {
			_, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "y", Now: now})
			return err
		},
		"a heartbeat": func() error {
			_, err := a.Heartbeat(ctx, &directory.Beat{SessionID: w, Sub: "sub", Headroom: 3}, now)
			return err
		},
		"a registration": func() error {
			_, err := a.Register(ctx, reg, now)
			return err
		},
		"readiness": func() error {
			_, err := a.Quarantine(ctx, now)
			return err
		},
	} {
		if err := f(); !errors.Is(err, directory.ErrUnavailable) || !strings.Contains(err.Error(), "OOM") {
			t.Fatalf("unexpected answer to %s while redis is out of memory; got %v; want ErrUnavailable naming OOM", what, err)
		}
	}
	if r, ok := a.Lookup([]byte("/c"), []byte("x"), now); !ok || r.Owner.SessionID != w {
		t.Fatalf("unexpected lookup of a cached id while redis is out of memory; got %+v, %v; want %s", r, ok, w)
	}
	if after, err := srv.Do("DBSIZE"); err != nil || after != keys {
		t.Fatalf("unexpected keys after the refused calls; got %s, %v; want %s: nothing written", after, err, keys)
	}
	if _, err := srv.Do("CONFIG", "SET", "maxmemory", "0"); err != nil {
		t.Fatal(err)
	}
	if r, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "y", Now: now}); err != nil || r.Owner.SessionID != w {
		t.Fatalf("unexpected placement once memory is freed; got %+v, %v; want %s", r, err, w)
	}
	if _, err := a.Heartbeat(ctx, &directory.Beat{SessionID: w, Sub: "sub", Headroom: 3}, now); err != nil {
		t.Fatalf("cannot heartbeat once memory is freed: %v", err)
	}
	res, err := a.Register(ctx, reg, now)
	if err != nil || len(res.Duplicates) != 1 {
		t.Fatalf("unexpected registration once memory is freed; got %+v, %v; want x a duplicate (w1 holds it)", res, err)
	}
}
