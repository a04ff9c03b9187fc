package directory_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/tools/redistest"
)

// Tests of what only a shared Redis directory has: several nodes, client
// caching and its invalidation, wipes, outages and reconnects. Each node
// is a separate *directory.Redis with its own connection, as separate
// pinboard processes would be.

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(float64(len(s)-1)*p)]
}

// A re-placement made through node B reaches node A's cache through
// Redis's invalidation push: A stops using the old owner without asking
// Redis, and its next placement read finds B's owner (R-PL-1: one owner
// across every node).
func TestRedisReplacementInvalidatesOtherNode_RPL1(t *testing.T) {
	srv := redistest.StartServer(t)
	testInvalidation(t, srv.URL())
}

func TestRedisClusterReplacementInvalidatesOtherNode_RPL1(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-master redis cluster")
	}
	c := redistest.StartCluster(t, 3)
	testInvalidation(t, c.URL())
}

func testInvalidation(t *testing.T, url string) {
	ctx := ctxT(t)
	a := openNode(t, url, "inv", 10*time.Second)
	b := openNode(t, url, "inv", 10*time.Second)
	now, wa, wb := warmPair(t, a, b)

	var delays []time.Duration
	for i := range 100 {
		id := "x" + strconv.Itoa(i)
		r1, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: id, Now: now})
		if err != nil || r1.Owner.SessionID != wa {
			t.Fatalf("unexpected placement through A; got %+v, %v; want owner %s", r1, err, wa)
		}
		if r, ok := a.Lookup([]byte("/c"), []byte(id), now); !ok || r.Owner != r1.Owner || r.Epoch != r1.Epoch {
			t.Fatalf("unexpected lookup on A after its own claim; got %+v, %v; want %+v", r, ok, r1)
		}
		// B re-places the id while A's owner is live: the in-band refusal
		// path (R-PL-6), a single write of the row.
		r2, err := b.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: id, Now: now, Exclude: wa})
		if err != nil || r2.Owner.SessionID != wb || !r2.Placed || r2.Epoch <= r1.Epoch {
			t.Fatalf("unexpected re-placement through B; got %+v, %v; want a new placement on %s", r2, err, wb)
		}
		// Bounded at 5 s: generous for a push on a loaded machine, and
		// still half the lease and the 10 s periodic check that would
		// hide a lost push.
		delays = append(delays, waitFor(t, 5*time.Second, "A to drop the replaced owner", func() bool {
			r, ok := a.Lookup([]byte("/c"), []byte(id), now)
			return !ok || r.Owner.SessionID != wa
		}))
		r3, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: id, Now: now})
		if err != nil || r3.Owner.SessionID != wb || r3.Placed || r3.Epoch != r2.Epoch {
			t.Fatalf("unexpected resolution through A; got %+v, %v; want B's placement %+v", r3, err, r2)
		}
		if r, ok := a.Lookup([]byte("/c"), []byte(id), now); !ok || r.Owner.SessionID != wb {
			t.Fatalf("unexpected lookup on A; got %+v, %v; want %s", r, ok, wb)
		}
	}
	t.Logf("claim through B returned → A's cache dropped the old owner: p50 %v, p99 %v, max %v (%d rounds)",
		percentile(delays, .5), percentile(delays, .99), percentile(delays, 1), len(delays))
}

// A steady-state Lookup is served from the node's cache: a hundred
// thousand lookups of hot ids cost Redis nothing.
func TestRedisLookupCostsNoRoundTrip(t *testing.T) {
	srv := redistest.StartServer(t)
	ctx := ctxT(t)
	a := openNode(t, srv.URL(), "hot", 10*time.Second)
	now := warmRedis(t, a, time.Now())
	register(t, a, "a", 1000, now)
	for i := range 100 {
		if _, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "h" + strconv.Itoa(i), Now: now}); err != nil {
			t.Fatal(err)
		}
	}
	before := totalCommands(t, srv)
	for i := range 100_000 {
		if _, ok := a.Lookup([]byte("/c"), []byte("h"+strconv.Itoa(i%100)), now); !ok {
			t.Fatalf("unexpected miss for h%d", i%100)
		}
	}
	// INFO itself counts once; the revalidator may run its 3-command
	// check once in a while.
	if d := totalCommands(t, srv) - before; d > 4 {
		t.Fatalf("unexpected Redis commands for 100k lookups; got %d; want at most 4", d)
	}
}

func totalCommands(t *testing.T, srv *redistest.Server) int {
	return infoInt(t, srv, "stats", "total_commands_processed")
}

// infoInt is the integer field of an INFO section of srv.
func infoInt(t *testing.T, srv *redistest.Server, section, field string) int {
	t.Helper()
	info, err := srv.Info(section)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(info[field])
	if err != nil {
		t.Fatalf("cannot read %s in INFO %s: %v (%v)", field, section, err, info)
	}
	return n
}

// After a wipe every node drops its cache, the next placement attempt
// starts the cold-start quarantine, workers get "unknown session" and
// re-register with their instances, and epochs keep growing (R-CS-1).
func TestRedisFlushAllDropsCachesAndQuarantines_RCS1(t *testing.T) {
	srv := redistest.StartServer(t)
	testWipe(t, srv.URL(), srv.FlushAll)
}

func TestRedisRestartDropsCachesAndQuarantines_RCS1(t *testing.T) {
	srv := redistest.StartServer(t)
	testWipe(t, srv.URL(), srv.Restart)
}

func TestRedisClusterFlushAllDropsCachesAndQuarantines_RCS1(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-master redis cluster")
	}
	c := redistest.StartCluster(t, 3)
	testWipe(t, c.URL(), c.FlushAll)
}

func testWipe(t *testing.T, url string, wipe func() error) {
	ctx := ctxT(t)
	const ttl = time.Second
	a := openNode(t, url, "wipe", ttl)
	b := openNode(t, url, "wipe", ttl)
	now := warmRedis(t, a, time.Now())
	wa := register(t, a, "a", 10, now)
	r1, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: now}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*directory.Redis{a, b} {
		if _, ok := n.Lookup([]byte("/c"), []byte("x"), now); !ok {
			t.Fatalf("unexpected miss before the wipe")
		}
	}
	// Time passes: epochs re-seed from the clock after the wipe.
	now = now.Add(time.Millisecond)
	if err := wipe(); err != nil {
		t.Fatalf("cannot wipe: %v", err)
	}
	d := waitFor(t, 5*time.Second, "both nodes to notice the wipe", func() bool {
		return a.Stats().Wipes >= 1 && b.Stats().Wipes >= 1
	})
	t.Logf("wipe noticed by both nodes after %v", d)
	for _, n := range []*directory.Redis{a, b} {
		if r, ok := n.Lookup([]byte("/c"), []byte("x"), now); ok {
			t.Fatalf("unexpected cached placement after a wipe; got %+v", r)
		}
	}
	if q, err := a.Quarantine(ctx, now); err != nil || q != 0 {
		t.Fatalf("unexpected quarantine before the first attempt after the wipe; got %v, %v", q, err)
	}
	_, err = b.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: now})
	var qe *directory.QuarantineError
	if !errors.As(err, &qe) || qe.Remaining != ttl {
		t.Fatalf("unexpected placement after the wipe; got %v; want a quarantine of %v", err, ttl)
	}
	// A learns about B's stamp through an invalidation push: allow it the
	// push's latency, on a loaded machine too (below the 10 s periodic
	// check).
	waitFor(t, 5*time.Second, "the stamp to show on the other node", func() bool {
		q, err := a.Quarantine(ctx, now)
		return err == nil && q == ttl
	})
	if _, err := a.Heartbeat(ctx, &directory.Beat{SessionID: wa, Sub: "sub", Headroom: 10}, now); !errors.Is(err, directory.ErrUnknownSession) {
		t.Fatalf("unexpected heartbeat after the wipe; got %v; want ErrUnknownSession (409, reregister)", err)
	}
	res, err := a.Register(ctx, &directory.Registration{ClientID: "a", Sub: "sub", Secret: "k-a", Namespaces: []string{"/c"},
		AdvertiseURL: "http://127.0.0.1:9/a", Headroom: 10, PrevSessionID: wa, Instances: map[string][]string{"/c": {"x"}}}, now)
	if err != nil || len(res.Duplicates) != 0 {
		t.Fatalf("unexpected re-registration; got %+v, %v", res, err)
	}
	now = now.Add(ttl - time.Millisecond)
	if _, err := a.Heartbeat(ctx, &directory.Beat{SessionID: res.SessionID, Sub: "sub", Headroom: 10}, now); err != nil {
		t.Fatalf("cannot renew the new session: %v", err)
	}
	now = now.Add(time.Millisecond)
	r2, err := b.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: now})
	if err != nil || r2.Owner.SessionID != res.SessionID || r2.Placed {
		t.Fatalf("unexpected placement after the quarantine; got %+v, %v; want the reclaimed owner %s", r2, err, res.SessionID)
	}
	if r2.Epoch <= r1.Epoch {
		t.Fatalf("unexpected epoch regression across the wipe; got %d; want > %d (workers fence on it)", r2.Epoch, r1.Epoch)
	}
}

// Redis down: cached placements keep routing under their owners' known
// leases, everything that needs Redis fails fast with ErrUnavailable, and
// the node recovers by itself when Redis returns with its data (R-DP-4).
func TestRedisOutageKeepsCachedRoutes(t *testing.T) {
	srv := redistest.StartServer(t)
	ctx := ctxT(t)
	a := openNode(t, srv.URL(), "outage", 10*time.Second)
	now := warmRedis(t, a, time.Now())
	wa := register(t, a, "a", 10, now)
	r1, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.StopSaving(); err != nil {
		t.Fatal(err)
	}
	if r, ok := a.Lookup([]byte("/c"), []byte("x"), now); !ok || r.Owner.SessionID != wa {
		t.Fatalf("unexpected lookup while redis is down; got %+v, %v; want the cached owner", r, ok)
	}
	start := time.Now()
	_, err = a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "y", Now: now})
	if !errors.Is(err, directory.ErrUnavailable) {
		t.Fatalf("unexpected placement while redis is down; got %v; want ErrUnavailable", err)
	}
	if _, err := a.Register(ctx, &directory.Registration{ClientID: "b", Sub: "sub", Namespaces: []string{"/c"}}, now); !errors.Is(err, directory.ErrUnavailable) {
		t.Fatalf("unexpected registration while redis is down; got %v; want ErrUnavailable", err)
	}
	if _, err := a.Quarantine(ctx, now); !errors.Is(err, directory.ErrUnavailable) {
		t.Fatalf("unexpected health while redis is down; got %v; want ErrUnavailable", err)
	}
	// The outage is what the message says, not a bad script reply.
	_, perr := a.Placement(ctx, "/c", "x", now)
	_, derr := a.SetDrain(ctx, "a", directory.DrainState{Draining: true}, now)
	for _, err := range []error{perr, derr} {
		if !errors.Is(err, directory.ErrUnavailable) || strings.Contains(err.Error(), "script reply") {
			t.Fatalf("unexpected error while redis is down; got %v; want ErrUnavailable saying why", err)
		}
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("unexpected latency of failures while redis is down; got %v", d)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the node to revalidate", func() bool { return a.Stats().Reconnects >= 1 })
	r2, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: now})
	if err != nil || r2.Owner.SessionID != wa || r2.Epoch != r1.Epoch || r2.Placed {
		t.Fatalf("unexpected resolution after the outage; got %+v, %v; want %+v", r2, err, r1)
	}
	if _, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "y", Now: now}); err != nil {
		t.Fatalf("cannot place after the outage: %v", err)
	}
}

// A node whose connection dropped may have missed invalidations: once it
// reconnects it drops its cached rows rather than trust them.
func TestRedisReconnectRevalidatesCache(t *testing.T) {
	srv := redistest.StartServer(t)
	ctx := ctxT(t)
	a := openNode(t, srv.URL(), "recon", 10*time.Second)
	b := openNode(t, srv.URL(), "recon", 10*time.Second)
	now := warmRedis(t, a, time.Now())
	wa := register(t, a, "a", 1e6, now)
	wb := register(t, a, "b", 1, now)
	if r, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: now}); err != nil || r.Owner.SessionID != wa {
		t.Fatalf("unexpected placement; got %+v, %v", r, err)
	}
	if _, err := srv.Do("CLIENT", "KILL", "TYPE", "normal"); err != nil {
		t.Fatal(err)
	}
	if r, err := b.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "x", Now: now, Exclude: wa}); err != nil || r.Owner.SessionID != wb {
		t.Fatalf("unexpected re-placement; got %+v, %v", r, err)
	}
	waitFor(t, 10*time.Second, "A to revalidate", func() bool { return a.Stats().Reconnects >= 1 })
	if r, ok := a.Lookup([]byte("/c"), []byte("x"), now); ok && r.Owner.SessionID == wa {
		t.Fatalf("unexpected stale owner after the reconnect; got %s; want a miss or %s", wa, wb)
	}
}

func TestParseRedisURL(t *testing.T) {
	for _, c := range []struct {
		url, want string // want: addresses|db|user|pass|tls|master, or "error"
	}{
		{"redis://127.0.0.1:6380", "127.0.0.1:6380|0|||false|"},
		{"redis://h", "h:6379|0|||false|"},
		{"redis://:p%40ss@h:1/3", "h:1|3||p@ss|false|"},
		{"redis://u:p@h?db=2&client_name=pb", "h:6379|2|u|p|false|"},
		{"rediss://h:6380", "h:6380|0|||true|"},
		{"rediss://h:6380?skip_verify=true", "h:6380|0|||true|"},
		{"redis+cluster://a:7000,b:7001,[::1]:7002", "a:7000,b:7001,[::1]:7002|0|||false|"},
		{"rediss+cluster://a:7000", "a:7000|0|||true|"},
		{"redis+sentinel://s1,s2:5000/mymaster?db=1", "s1:26379,s2:5000|1|||false|mymaster"},
		{"redis://a:1,b:2", "error"},
		{"redis://h:0", "error"},
		{"redis://h:99999", "error"},
		{"redis://h/x", "error"},
		{"redis+cluster://a:1/2", "error"},
		{"redis+sentinel://a:1", "error"},
		{"redis://h?skip_verify=1", "error"},
		{"redis://h?nope=1", "error"},
		{"http://h", "error"},
		{"h:6379", "error"},
		{"redis://", "error"},
	} {
		o, err := directory.ParseRedisURL(c.url)
		got := "error"
		if err == nil {
			got = fmt.Sprintf("%s|%d|%s|%s|%v|%s", strings.Join(o.InitAddress, ","), o.SelectDB, o.Username, o.Password,
				o.TLSConfig != nil, o.Sentinel.MasterSet)
		} else if !errors.Is(err, directory.ErrInvalidURL) {
			t.Errorf("%s: unexpected error type %v; want ErrInvalidURL", c.url, err)
		}
		if got != c.want {
			t.Errorf("%s: unexpected options; got %s (err %v); want %s", c.url, got, err, c.want)
		}
	}
	if _, err := directory.ParseRedisURL("redis://u:topsecret@h:bad"); err == nil || strings.Contains(err.Error(), "topsecret") {
		t.Errorf("unexpected error %v; want one without the password", err)
	}
}
