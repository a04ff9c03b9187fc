// Command redisfig measures the Redis directory's figures for
// docs/DIRECTORY.md and BENCHMARKS.md:
//
//   - Redis commands per proxied request in steady state: INFO commandstats
//     before and after a load run over a fixed set of hot ids, through
//     every node, with workers heartbeating as usual;
//   - new placements per second through one node and through three, over
//     HTTP (proxy, directory, worker), against one Redis;
//   - the delay from a claim on node A to node B no longer serving the old
//     owner from its cache (p50, p99).
//
// It starts its own redis-server (tools/redistest), pinboard nodes
// in-process (package server) and fake workers (fasthttp servers that
// register, heartbeat and answer every instance request with 200), all on
// 127.0.0.1. Run it with `go run ./bench/redisfig`; flags tune the sizes.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/attest"
	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/server"
	"github.com/pinboard-go/pinboard/tools/redistest"
)

const token = "redisfig-token"

var (
	nNodes   = flag.Int("nodes", 3, "pinboard nodes")
	nWorkers = flag.Int("workers", 4, "fake workers")
	nHot     = flag.Int("hot", 100, "hot ids in the steady-state run")
	duration = flag.Duration("duration", 10*time.Second, "steady-state load duration")
	conc     = flag.Int("conc", 32, "concurrent clients")
	nPlace   = flag.Int("place", 20000, "new ids per placement run")
	rounds   = flag.Int("rounds", 2000, "claim → visible rounds")
	leaseTTL = flag.Duration("lease", 15*time.Second, "PINBOARD_LEASE_TTL_MS")
	beat     = flag.Duration("heartbeat", 3*time.Second, "worker heartbeat interval (pinned's default is 3s)")
)

func main() {
	flag.Parse()
	log.SetFlags(log.Lshortfile)
	dir, err := os.MkdirTemp("", "redisfig-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	srv, err := redistest.Start(dir, false)
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Kill()
	// Skip the cold-start quarantine: stamp the bucket one lease ago.
	stamp := time.Now().Add(-*leaseTTL).UnixMicro()
	if _, err := srv.Do("SET", "{pinboard}:stamp", strconv.FormatInt(stamp, 10)); err != nil {
		log.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	nodes := startNodes(ctx, srv.URL(), *nNodes)
	workers := startWorkers(ctx, nodes, *nWorkers)
	client := &fasthttp.Client{MaxConnsPerHost: 4 * *conc, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second}

	fmt.Printf("## Redis directory figures\n\n")
	fmt.Printf("%d nodes, %d fake workers, lease %v, heartbeat %v, %d concurrent clients; GOMAXPROCS %d; %s\n\n",
		*nNodes, len(workers), *leaseTTL, *beat, *conc, runtime.GOMAXPROCS(0), redisVersion(srv))

	steady(srv, client, nodes)
	placements(client, nodes[:1], "1 node")
	placements(client, nodes, fmt.Sprintf("%d nodes", len(nodes)))
	visibility(srv.URL())
}

type node struct {
	url   string
	store *directory.Redis
}

// roundTrips counts the store's round trips to Redis by operation, seen
// through directory.CommandObserver.
type roundTrips struct {
	mu  sync.Mutex
	ops map[string]int64
}

var trips = &roundTrips{ops: map[string]int64{}}

func (t *roundTrips) StoreCommand(op string, d time.Duration, _ error) {
	if d == 0 {
		return // refused without a round trip
	}
	t.mu.Lock()
	t.ops[op]++
	t.mu.Unlock()
}

func (t *roundTrips) snapshot() map[string]int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]int64, len(t.ops))
	for k, v := range t.ops {
		out[k] = v
	}
	return out
}

func passport() *attest.Passport {
	js := `{"providers":[{"type":"staticToken","id":"fig","keys":[{"name":"fig","token":{"env":"FIG_TOKEN"},` +
		`"scopes":["pinboard:worker","pinboard:operator"],"claims":{"pinboard":{"namespaces":["*"],"allowedBackendHosts":["127.0.0.1"]}}}]}],` +
		`"namespaces":{"*":{"allow":"anonymous"}}}`
	p, err := attest.ParsePassport([]byte(js), func(k string) (string, bool) { return token, k == "FIG_TOKEN" })
	if err != nil {
		log.Fatal(err)
	}
	return p
}

func startNodes(ctx context.Context, url string, n int) []node {
	pp := passport()
	var out []node
	for range n {
		store, err := directory.OpenRedis(ctx, url, directory.RedisOptions{LeaseTTL: *leaseTTL, Observer: trips})
		if err != nil {
			log.Fatal(err)
		}
		pb, err := server.New(server.Options{Store: store, Passport: pp, LeaseTTL: *leaseTTL})
		if err != nil {
			log.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			log.Fatal(err)
		}
		go func() { _ = pb.Serve(ctx, ln, time.Second) }()
		out = append(out, node{url: "http://" + ln.Addr().String(), store: store})
	}
	return out
}

func redisVersion(srv *redistest.Server) string {
	if info, err := srv.Info("server"); err == nil && info["redis_version"] != "" {
		return "Redis " + info["redis_version"]
	}
	return "Redis ?"
}

// commandStats is INFO commandstats: calls by command.
func commandStats(srv *redistest.Server) map[string]int64 {
	calls, err := srv.CommandCalls()
	if err != nil {
		log.Fatal(err)
	}
	return calls
}

func get(c *fasthttp.Client, url string) int {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(url)
	if err := c.Do(req, resp); err != nil {
		return 0
	}
	return resp.StatusCode()
}

// steady measures Redis commands per proxied request over hot ids.
func steady(srv *redistest.Server, c *fasthttp.Client, nodes []node) {
	for i := range *nHot {
		for _, n := range nodes {
			for get(c, fmt.Sprintf("%s/counters/hot%d/whoami", n.url, i)) != 200 {
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
	before, tripsBefore := commandStats(srv), trips.snapshot()
	var ok, failed atomic.Int64
	deadline := time.Now().Add(*duration)
	var wg sync.WaitGroup
	for g := range *conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; time.Now().Before(deadline); i++ {
				n := nodes[i%len(nodes)]
				if get(c, fmt.Sprintf("%s/counters/hot%d/whoami", n.url, i%*nHot)) == 200 {
					ok.Add(1)
				} else {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	after, tripsAfter := commandStats(srv), trips.snapshot()
	total, parts := diff(before, after)
	rtTotal, rtParts := diff(tripsBefore, tripsAfter)
	reqs := ok.Load()
	fmt.Printf("### Steady state: Redis work per proxied request\n\n")
	fmt.Printf("| hot ids | requests | failed | req/s | round trips | round trips/request | commands | commands/request |\n|---|---|---|---|---|---|---|---|\n")
	fmt.Printf("| %d | %d | %d | %.0f | %d | %.5f | %d | %.5f |\n\n", *nHot, reqs, failed.Load(), float64(reqs)/duration.Seconds(),
		rtTotal, float64(rtTotal)/float64(reqs), total, float64(total)/float64(reqs))
	fmt.Printf("Round trips by operation (all nodes, background work included): %s\n\n", strings.Join(rtParts, ", "))
	fmt.Printf("Commands executed by Redis (INFO commandstats: commands inside scripts count too, and INFO itself): %s\n\n", strings.Join(parts, ", "))
}

func diff(before, after map[string]int64) (int64, []string) {
	var total int64
	var parts []string
	for k, n := range after {
		if d := n - before[k]; d > 0 {
			total += d
			parts = append(parts, fmt.Sprintf("%s %d", k, d))
		}
	}
	sort.Strings(parts)
	return total, parts
}

var placeRun atomic.Int64

// placements measures new placements per second over HTTP.
func placements(c *fasthttp.Client, nodes []node, label string) {
	run := placeRun.Add(1)
	var next, failed atomic.Int64
	tripsBefore := trips.snapshot()
	start := time.Now()
	var wg sync.WaitGroup
	for range *conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(*nPlace) {
					return
				}
				n := nodes[int(i)%len(nodes)]
				if get(c, fmt.Sprintf("%s/counters/new%d-%d/whoami", n.url, run, i)) != 200 {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	d := time.Since(start)
	if run == 1 {
		fmt.Printf("### New placements per second (HTTP: proxy, claim, fake worker)\n\n| through | ids | failed | seconds | placements/s | round trips/placement |\n|---|---|---|---|---|---|\n")
	}
	rt, parts := diff(tripsBefore, trips.snapshot())
	fmt.Printf("| %s | %d | %d | %.2f | %.0f | %.2f (%s) |\n", label, *nPlace, failed.Load(), d.Seconds(), float64(*nPlace)/d.Seconds(),
		float64(rt)/float64(*nPlace), strings.Join(parts, ", "))
}

// visibility measures claim on A → B no longer serving the old owner.
func visibility(url string) {
	ctx := context.Background()
	open := func() *directory.Redis {
		s, err := directory.OpenRedis(ctx, url, directory.RedisOptions{LeaseTTL: time.Hour, Prefix: "fig-visibility"})
		if err != nil {
			log.Fatal(err)
		}
		return s
	}
	a, b := open(), open()
	defer a.Close()
	defer b.Close()
	now := time.Now()
	_, _ = a.Place(ctx, &directory.PlaceRequest{NS: "/w", ID: "x", Now: now})
	now = now.Add(time.Hour)
	// Two processes at one advertise URL void each other (R-LS-3): each
	// worker has its own, never dialled.
	for i := range 2 {
		if _, err := a.Register(ctx, &directory.Registration{ClientID: "v" + strconv.Itoa(i), Sub: "s", Secret: "k",
			Namespaces: []string{"/c"}, AdvertiseURL: "http://127.0.0.1:" + strconv.Itoa(9+i) + "/", Headroom: 1e9}, now); err != nil {
			log.Fatal(err)
		}
	}
	id, ns := []byte("moving"), []byte("/c")
	delays := make([]time.Duration, 0, *rounds)
	fromCall := make([]time.Duration, 0, *rounds)
	for range *rounds {
		cur, err := b.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "moving", Now: now})
		if err != nil {
			log.Fatal(err)
		}
		called := time.Now()
		if _, err := a.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "moving", Now: now, Exclude: cur.Owner.SessionID}); err != nil {
			log.Fatal(err)
		}
		claimed := time.Now()
		for {
			if got, ok := b.Lookup(ns, id, now); !ok || got.Owner != cur.Owner {
				break
			}
			runtime.Gosched()
		}
		done := time.Now()
		delays = append(delays, done.Sub(claimed))
		fromCall = append(fromCall, done.Sub(called))
	}
	fmt.Printf("\n### Claim on node A → node B stops serving the old owner\n\n| measured from | rounds | p50 | p90 | p99 | max |\n|---|---|---|---|---|---|\n")
	for _, m := range []struct {
		label string
		ds    []time.Duration
	}{{"A's Place returning", delays}, {"A's Place called", fromCall}} {
		sort.Slice(m.ds, func(i, j int) bool { return m.ds[i] < m.ds[j] })
		pct := func(p float64) time.Duration { return m.ds[int(float64(len(m.ds)-1)*p)].Round(time.Microsecond) }
		fmt.Printf("| %s | %d | %v | %v | %v | %v |\n", m.label, len(m.ds), pct(.5), pct(.9), pct(.99), pct(1))
	}
	fmt.Printf("\nA's claim is a pipelined claim + tracked read-back, so B's push usually lands before A's reply: 0 means B had already dropped the row when A returned.\n")
}
