package scenario

import (
	"context"
	"fmt"
	"time"
)

// The two nodes of the storm-split scenario, both on one Redis.
const (
	// registryNode takes every worker's register and heartbeat calls,
	// and serves the data plane as well: one node doing both, as in the
	// storm scenario but on Redis.
	registryNode = "pinboard-registry"
	// dataNode serves the data plane only: no worker calls it.
	dataNode = "pinboard-data"
)

// splitTargets are storm-split's data planes, the one its figure judges
// first: the data node, then the registry node and the two baselines in
// the same rounds.
var splitTargets = []string{dataNode, registryNode, nginx, direct}

// stormSplit measures the deployment docs/OPERATIONS.md offers SLO-bound
// fleets ("Registry nodes apart from the data plane"): on the Redis
// store, workers' PINBOARD_URL names registry nodes and clients reach
// other nodes, so the registry's work runs in processes of its own and
// the kernel, not Go's scheduler, shares the CPUs between the two. The
// storm (as in the storm scenario) is aimed at the registry node; the
// data plane is measured through the data node, through the registry node
// itself (one node doing both, on Redis), and through nginx and direct,
// storm on and off in the same rounds. Redis runs on the same two CPUs,
// as everything else does here.
func (r *runner) stormSplit(ctx context.Context) error {
	url, stopRedis, err := r.startRedis("redis-split")
	if err != nil {
		return err
	}
	defer stopRedis()
	reg, err := r.ps.startPinboard(registryNode, r.cfg.PinboardBin, url, r.cfg.PinboardEnv)
	if err != nil {
		return &skipError{fmt.Sprintf("pinboard did not start on %s: %v", url, err)}
	}
	defer reg.stop(10 * time.Second)
	data, err := r.ps.startPinboard(dataNode, r.cfg.PinboardBin, url, r.cfg.PinboardEnv)
	if err != nil {
		return err
	}
	defer data.stop(10 * time.Second)
	// The data-plane fleet registers with the registry node too: no
	// worker ever calls the data node.
	df, err := r.ps.startFleet("fleet-split", r.cfg.PinbenchBin, reg.url, r.sz.fleetWorkers, 4, "/bench", 2*time.Minute)
	if err != nil {
		return err
	}
	defer df.stop(30 * time.Second)
	if err := waitPlacements(ctx, data, "/bench/"+HotID(0)+"/json", 90*time.Second); err != nil {
		return err
	}
	tgt := map[string]*target{
		dataNode:     {name: dataNode, addrs: []string{data.addr}, pid: data.pid()},
		registryNode: {name: registryNode, addrs: []string{reg.addr}, pid: reg.pid()},
		nginx:        r.tgt[nginx],
		direct:       r.tgt[direct],
	}
	// Every hot id placed (through the data node) and read once through
	// each node, so the windows see only cached placements.
	for _, name := range []string{dataNode, registryNode} {
		if err := r.placeHot(tgt[name]); err != nil {
			return err
		}
	}
	ws, err := r.fl.workers()
	if err != nil {
		return err
	}
	n := r.sz.stormWorkers
	r.logf("    registering %d workers with the registry node…", n)
	start := time.Now()
	sf, err := r.ps.startFleet("fleet-storm-split", r.cfg.PinbenchBin, reg.url, n, 64, "/storm", 5*time.Minute)
	if err != nil {
		return err
	}
	defer sf.stop(60 * time.Second)
	r.res.fact("stormSplit.registerS", time.Since(start).Seconds())
	r.logf("    %d workers registered in %.1fs", n, time.Since(start).Seconds())
	sleepCtx(ctx, 9500*time.Millisecond) // as in storm: past the registrations' aftermath
	sr := &stormRun{scn: "storm-split", sf: sf, n: n, rate: r.stormRate(), order: splitTargets, tgt: tgt, ws: ws}
	r.res.fact("stormSplit.rate", sr.rate)
	return r.stormRounds(ctx, sr)
}
