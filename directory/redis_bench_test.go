package directory_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/tools/redistest"
)

// Benchmarks of the Redis directory against a real redis-server. Figures
// and how to reproduce them: docs/DIRECTORY.md.

// benchFleet opens n nodes on one fresh directory with four workers of
// ample headroom and the quarantine behind them. now is the time to use.
func benchFleet(b *testing.B, url string, n int) ([]*directory.Redis, []string, time.Time) {
	b.Helper()
	ctx := context.Background()
	prefix := fmt.Sprintf("bench%d", time.Now().UnixNano())
	nodes := make([]*directory.Redis, n)
	for i := range nodes {
		s, err := directory.OpenRedis(ctx, url, directory.RedisOptions{LeaseTTL: time.Hour, Prefix: prefix})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = s.Close() })
		nodes[i] = s
	}
	now := time.Now()
	_, _ = nodes[0].Place(ctx, &directory.PlaceRequest{NS: "/warm", ID: "x", Now: now})
	now = now.Add(time.Hour)
	var sids []string
	for i := range 4 {
		res, err := nodes[i%n].Register(ctx, &directory.Registration{ClientID: "w" + strconv.Itoa(i), Sub: "s", Secret: "k",
			Namespaces: []string{"/c"}, AdvertiseURL: "http://127.0.0.1:9/" + strconv.Itoa(i), Headroom: 1e9}, now)
		if err != nil {
			b.Fatal(err)
		}
		sids = append(sids, res.SessionID)
	}
	return nodes, sids, now
}

// BenchmarkRedisLookup is the data plane's steady state: a cached id,
// no round trip, no allocation.
func BenchmarkRedisLookup(b *testing.B) {
	srv := redistest.StartServer(b)
	nodes, _, now := benchFleet(b, srv.URL(), 1)
	ids := make([][]byte, 1000)
	for i := range ids {
		ids[i] = []byte("hot" + strconv.Itoa(i))
		if _, err := nodes[0].Place(context.Background(), &directory.PlaceRequest{NS: "/c", ID: string(ids[i]), Now: now}); err != nil {
			b.Fatal(err)
		}
	}
	ns := []byte("/c")
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, ok := nodes[0].Lookup(ns, ids[i%len(ids)], now); !ok {
				panic("miss")
			}
			i++
		}
	})
}

// BenchmarkRedisPlaceNew claims new ids as fast as 64 concurrent callers
// can, through one node and through three sharing one Redis.
func BenchmarkRedisPlaceNew(b *testing.B) {
	for _, n := range []int{1, 3} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			srv := redistest.StartServer(b)
			nodes, _, now := benchFleet(b, srv.URL(), n)
			var next atomic.Int64
			b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					i := next.Add(1)
					node := nodes[int(i)%len(nodes)]
					r, err := node.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "n" + strconv.FormatInt(i, 10), Now: now})
					if err != nil || !r.Placed {
						panic(fmt.Sprintf("cannot place: %+v %v", r, err))
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "placements/s")
		})
	}
}

// BenchmarkRedisFirstPlaceManySessions is a node's first placement in a
// namespace 800 workers serve: every session unknown to it is read from
// Redis (resolve, 256 per pipeline) before the claim. Each iteration opens
// a fresh node, whose open is timed too.
func BenchmarkRedisFirstPlaceManySessions(b *testing.B) {
	srv := redistest.StartServer(b)
	ctx := context.Background()
	const prefix = "first"
	open := func() *directory.Redis {
		s, err := directory.OpenRedis(ctx, srv.URL(), directory.RedisOptions{LeaseTTL: time.Hour, Prefix: prefix})
		if err != nil {
			b.Fatal(err)
		}
		return s
	}
	a := open()
	b.Cleanup(func() { _ = a.Close() })
	now := time.Now()
	_, _ = a.Place(ctx, &directory.PlaceRequest{NS: "/warm", ID: "x", Now: now})
	now = now.Add(time.Hour)
	for i := range 800 {
		if _, err := a.Register(ctx, &directory.Registration{ClientID: "m" + strconv.Itoa(i), Sub: "s", Secret: "k",
			Namespaces: []string{"/c"}, AdvertiseURL: "http://127.0.0.1:9/m" + strconv.Itoa(i), Headroom: 1e9}, now); err != nil {
			b.Fatal(err)
		}
	}
	for i := 0; b.Loop(); i++ {
		node := open()
		if _, err := node.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "first" + strconv.Itoa(i), Now: now}); err != nil {
			b.Fatal(err)
		}
		_ = node.Close()
	}
}

// BenchmarkRedisClaimVisibleOnOtherNode: node A re-places an id that node
// B serves from its cache (the in-band refusal path, one write); the time
// from A's claim returning to B's Lookup no longer returning the old owner
// is the invalidation delay. Reported as p50 and p99.
func BenchmarkRedisClaimVisibleOnOtherNode(b *testing.B) {
	srv := redistest.StartServer(b)
	nodes, sids, now := benchFleet(b, srv.URL(), 2)
	a, bn := nodes[0], nodes[1]
	ctx := context.Background()
	id, ns := []byte("moving"), []byte("/c")
	r, err := bn.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "moving", Now: now})
	if err != nil {
		b.Fatal(err)
	}
	delays := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		// B resolves the current owner so it caches (and tracks) the row.
		cur, err := bn.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "moving", Now: now})
		if err != nil {
			b.Fatal(err)
		}
		if got, ok := bn.Lookup(ns, id, now); !ok || got.Owner != cur.Owner {
			b.Fatalf("B does not serve the id from its cache")
		}
		next, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "moving", Now: now, Exclude: cur.Owner.SessionID})
		if err != nil || next.Owner == cur.Owner {
			b.Fatalf("cannot re-place: %v", err)
		}
		claimed := time.Now()
		for {
			if got, ok := bn.Lookup(ns, id, now); !ok || got.Owner != cur.Owner {
				break
			}
			if time.Since(claimed) > time.Second {
				b.Fatalf("B still serves the old owner 1s after the claim")
			}
			runtime.Gosched()
		}
		delays = append(delays, time.Since(claimed))
	}
	b.StopTimer()
	_ = r
	_ = sids
	slices.Sort(delays)
	b.ReportMetric(float64(delays[len(delays)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(delays[len(delays)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkRedisReregister100k: a worker re-registers listing the 100,000
// instances a register may carry at most (registry maxInstanceIDs), all
// its own. Redis runs each script to completion while it serves nobody
// else, so what matters is the longest single script call, not the total:
// reported as max-hold-ms from Redis's SLOWLOG (its own timing of each
// command), beside the longest PING another client waited meanwhile
// (ping-max-ms) and the script calls one re-registration took.
func BenchmarkRedisReregister100k(b *testing.B) {
	srv := redistest.StartServer(b)
	ctx := context.Background()
	s := openNode(b, srv.URL(), "bench-rereg", time.Hour)
	reg, now := ownInstances(b, s, 100_000)
	redisHoldRounds(b, rawClient(b, srv.Addr), func() {}, func() error {
		res, err := s.Register(ctx, reg, now)
		if err != nil || len(res.Duplicates) != 0 {
			return fmt.Errorf("cannot re-register: %v, %d duplicates", err, len(res.Duplicates))
		}
		reg.PrevSessionID = res.SessionID
		return nil
	}, nil)
}

// BenchmarkRedisDrop100k: a worker holding 100,000 ids deregisters (a
// void, the sweep of a dead session, a supersede and a hand-over drop a
// session the same way). Reported as BenchmarkRedisReregister100k does:
// max-hold-ms, the longest single script call from Redis's SLOWLOG,
// ping-max-ms, the longest PING another client waited meanwhile, and
// script-calls, the calls of one drop.
func BenchmarkRedisDrop100k(b *testing.B) {
	srv := redistest.StartServer(b)
	ctx := context.Background()
	s := openNode(b, srv.URL(), "bench-drop", time.Hour)
	var reg *directory.Registration
	var now time.Time
	redisHoldRounds(b, rawClient(b, srv.Addr), func() { reg, now = ownInstances(b, s, 100_000) }, func() error {
		return s.Deregister(ctx, reg.PrevSessionID, now)
	}, nil)
}

// BenchmarkRedisDrainRelease100k: an operator's timed drain of a worker
// holding 100,000 ids reaches its deadline, and the sweep force-releases
// them (R-LS-5). Reported as BenchmarkRedisDrop100k.
func BenchmarkRedisDrainRelease100k(b *testing.B) {
	srv := redistest.StartServer(b)
	ctx := context.Background()
	s := openNode(b, srv.URL(), "bench-drain", time.Hour)
	var deadline time.Time
	redisHoldRounds(b, rawClient(b, srv.Addr), func() { deadline = drainedOwner(b, s) }, func() error {
		return s.Sweep(ctx, deadline)
	}, func() { unplacedAfterRelease(b, s, deadline) })
}

// redisHoldRounds runs b.N rounds of prepare (untimed), op (timed) and
// check (untimed, when not nil), and reports what a long script call
// costs everybody else: max-hold-ms, the longest single script call of
// any op from Redis's SLOWLOG (its own timing), ping-max-ms, the longest
// PING another client waited while an op ran, and script-calls, the
// script calls of one op.
func redisHoldRounds(b *testing.B, c rueidis.Client, prepare func(), op func() error, check func()) {
	var hold, ping time.Duration
	var calls int
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		prepare()
		slowlogAll(b, c)
		b.StartTimer()
		pinged := pingWhile(c)
		err := op()
		ping = max(ping, pinged())
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		h, n := scriptCalls(b, c)
		hold, calls = max(hold, h), n
		if check != nil {
			check()
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(hold.Microseconds())/1000, "max-hold-ms")
	b.ReportMetric(float64(ping.Microseconds())/1000, "ping-max-ms")
	b.ReportMetric(float64(calls), "script-calls")
}

// rawClient is a plain client on one server, for commands the directory
// never sends (SLOWLOG, CONFIG, PING).
func rawClient(tb testing.TB, addr string) rueidis.Client {
	tb.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	return c
}

// ownInstances registers one worker holding n instances of /c and returns
// the re-registration that lists them all again, and the time to use.
func ownInstances(tb testing.TB, s directory.Store, n int) (*directory.Registration, time.Time) {
	tb.Helper()
	ctx := context.Background()
	now := time.Now()
	_, _ = s.Place(ctx, &directory.PlaceRequest{NS: "/warm", ID: "x", Now: now})
	now = now.Add(time.Hour)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = "instance-" + strconv.Itoa(i)
	}
	reg := &directory.Registration{ClientID: "w", Sub: "s", Secret: "k", Namespaces: []string{"/c"},
		AdvertiseURL: "http://127.0.0.1:9/w", Headroom: 1e9, Instances: map[string][]string{"/c": ids}}
	res, err := s.Register(ctx, reg, now)
	if err != nil || len(res.Duplicates) != 0 {
		tb.Fatalf("cannot register %d instances: %v", n, err)
	}
	reg.PrevSessionID = res.SessionID
	return reg, now
}

// slowlogAll makes Redis log every command from here on.
func slowlogAll(tb testing.TB, c rueidis.Client) {
	tb.Helper()
	ctx := context.Background()
	for _, cmd := range []rueidis.Completed{
		c.B().ConfigSet().ParameterValue().ParameterValue("slowlog-log-slower-than", "0").ParameterValue("slowlog-max-len", "1000000").Build(),
		c.B().SlowlogReset().Build(),
	} {
		if err := c.Do(ctx, cmd).Error(); err != nil {
			tb.Fatal(err)
		}
	}
}

// scriptCalls reads the SLOWLOG: the longest script call and how many
// there were.
func scriptCalls(tb testing.TB, c rueidis.Client) (time.Duration, int) {
	tb.Helper()
	var longest time.Duration
	n := 0
	for _, e := range slowlog(tb, c) {
		if isScript(e) {
			longest = max(longest, e.took)
			n++
		}
	}
	return longest, n
}

// pingWhile PINGs Redis back to back until the returned function is
// called, which reports the longest wait.
func pingWhile(c rueidis.Client) func() time.Duration {
	return longestWhile(func() { _ = c.Do(context.Background(), c.B().Ping().Build()).Error() })
}

// longestWhile runs probe back to back until the returned function is
// called, which reports the longest probe.
func longestWhile(probe func()) func() time.Duration {
	stop := make(chan struct{})
	done := make(chan time.Duration)
	go func() {
		var worst time.Duration
		for {
			select {
			case <-stop:
				done <- worst
				return
			default:
			}
			start := time.Now()
			probe()
			worst = max(worst, time.Since(start))
		}
	}()
	return func() time.Duration {
		close(stop)
		return <-done
	}
}

// BenchmarkRedisPlaceAmongSessions is a new placement through one warm
// node in a namespace that n workers serve: the node's view of the
// namespace (its members, each one's headroom and drain flags, from the
// client-side cache) is decoded and ranked per placement, so the cost
// grows with n (docs/DIRECTORY.md, "Scale").
func BenchmarkRedisPlaceAmongSessions(b *testing.B) {
	for _, n := range []int{4, 1000, 10000} {
		b.Run(fmt.Sprintf("sessions=%d", n), func(b *testing.B) {
			srv := redistest.StartServer(b)
			ctx := context.Background()
			s, err := directory.OpenRedis(ctx, srv.URL(), directory.RedisOptions{LeaseTTL: time.Hour, Prefix: "among"})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = s.Close() })
			now := time.Now()
			_, _ = s.Place(ctx, &directory.PlaceRequest{NS: "/warm", ID: "x", Now: now})
			now = now.Add(time.Hour)
			for i := range n {
				if _, err := s.Register(ctx, &directory.Registration{ClientID: "m" + strconv.Itoa(i), Sub: "s", Secret: "k",
					Namespaces: []string{"/c"}, AdvertiseURL: "http://127.0.0.1:9/m" + strconv.Itoa(i), Headroom: 1e9}, now); err != nil {
					b.Fatal(err)
				}
			}
			// The first placement reads every session; the loop measures
			// the steady state after it.
			if _, err := s.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "first", Now: now}); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if _, err := s.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "p" + strconv.Itoa(i), Now: now}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
