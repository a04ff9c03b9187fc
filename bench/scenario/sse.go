package scenario

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pinboard-go/pinboard/bench"
	"github.com/pinboard-go/pinboard/bench/fleet"
)

// sse is Server-Sent Events fan-out.
//
// Delay: thousands of concurrent streams, one event per second each at a
// random phase, every event stamped by the worker right before its
// write(2); the generator records receive time minus stamp. The delay a
// proxy adds is its distribution minus the direct one. The "delay" phase
// holds the events sent once every stream was open (steady fan-out); the
// "delay-all" phase every event, those sent while the generator still
// opened streams 200 handshakes at a time included — a few per cent of
// events, delayed by a machine the handshakes saturate, and through every
// target they were the whole p99 (5–6 ms direct, 17–24 ms through either
// proxy, against 1.3 and 1.6–3.4 ms once all streams were open).
//
// Idle: as many idle streams as the machine's open-files limit allows
// (a proxy needs two descriptors per stream), and the proxy's RSS growth
// while they are open.
func (r *runner) sse(ctx context.Context) error {
	ws, err := r.fl.workers()
	if err != nil {
		return err
	}
	r.res.fact("sse.delay.afterOpen", 1) // the "delay" phases hold events sent once every stream was open
	for round := 1; round <= r.cfg.Rounds; round++ {
		for _, name := range orderFor(allTargets, round) {
			if err := ctx.Err(); err != nil {
				return err
			}
			// Warm-up: the same number of streams, one event each, not
			// recorded (pools, goroutine stacks and heap grown first).
			if err := r.sseDelay(ctx, round, r.tgt[name], ws, 1, false); err != nil {
				return err
			}
			r.waitQuiet(ctx)
			if err := r.sseDelay(ctx, round, r.tgt[name], ws, r.sz.sseEvents, true); err != nil {
				return err
			}
		}
	}
	n := r.sz.sseIdle
	if lim := int(r.res.Machine.FDLimit); lim > 0 && (lim-500)/2 < n {
		n = (lim - 500) / 2
		r.res.fact("sse.idle.fdLimited", true)
	}
	r.res.fact("sse.idle.streams", n)
	// nginx's memory is its processes' proportional set sizes summed
	// (bench.ProcTree); results without this fact summed their RSS.
	r.res.fact("memory.treePSS", 1)
	for _, name := range []string{pinboard, nginx} {
		if err := r.sseIdle(ctx, r.tgt[name], ws, n); err != nil {
			return err
		}
	}
	return nil
}

// openStreams opens n streams to t, at most 200 handshakes at a time.
func openStreams(rt *route, n int, query string) ([]*bench.SSEStream, int) {
	streams := make([]*bench.SSEStream, n)
	var failed atomic.Int64
	sem := make(chan struct{}, 200)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			path := string(rt.appendPath(nil, i, "/bench", HotID(i%1000), "sse")) + query
			s, err := bench.OpenSSE(rt.addr(i), path, rt.headers(i), 30*time.Second)
			if err != nil {
				failed.Add(1)
				return
			}
			streams[i] = s
		}()
	}
	wg.Wait()
	return streams, int(failed.Load())
}

func (r *runner) sseDelay(ctx context.Context, round int, t *target, ws []fleet.WorkerInfo, events int, record bool) error {
	rt := newRoute(t, ws)
	label := fmt.Sprintf("sse/%s delay r%d", t.name, round)
	every := "1000"
	if !record {
		label = fmt.Sprintf("sse/%s warm-up r%d", t.name, round)
		every = "10"
	}
	pb0, _ := r.proxyCPU(t)
	start := time.Now()
	live := &bench.Live{}
	p := bench.StartProgress(r.log, r.tty, label, time.Duration(events+1)*time.Second, live)
	res := &bench.LoopResult{Mode: "stream", Workers: r.sz.sseStreams, Latency: bench.NewHist(), Service: bench.NewHist(),
		Slack: bench.NewHist(), Errors: map[string]uint64{}}
	query := "?n=" + strconv.Itoa(events) + "&every=" + every
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 200)
	opened := 0
	// Each stream keeps its events' send stamps and delays until every
	// stream is open: the goal's figure is of events sent after that
	// (steady fan-out), apart from the ones sent while hundreds of
	// handshakes at a time still saturated the machine (all events, kept
	// as the "delay-all" phase). Recording waits for the end: one
	// histogram per stream would be thousands of 37 KiB allocations, and
	// the garbage collector's pauses would land in the very tail measured.
	var lastOpen atomic.Int64 // unix ns of the last stream's open
	stamps := make([][]int64, r.sz.sseStreams)
	delays := make([][]int64, r.sz.sseStreams)
	for i := 0; i < r.sz.sseStreams; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each stream is read from the moment it opens: events must not
			// wait in socket buffers for the others to connect.
			sem <- struct{}{}
			path := string(rt.appendPath(nil, i, "/bench", HotID(i%1000), "sse")) + query
			s, err := bench.OpenSSE(rt.addr(i), path, rt.headers(i), 30*time.Second)
			<-sem
			if err != nil {
				mu.Lock()
				res.Errors["open"]++
				mu.Unlock()
				return
			}
			defer s.Close()
			for now := time.Now().UnixNano(); ; {
				last := lastOpen.Load()
				if now <= last || lastOpen.CompareAndSwap(last, now) {
					break
				}
			}
			got, bad := 0, 0
			st, dl := make([]int64, 0, events), make([]int64, 0, events)
			s.SetDeadline(time.Now().Add(time.Duration(events+10) * time.Second))
			for {
				stamp, _, err := s.Next()
				if err != nil {
					if got < events {
						bad++
					}
					break
				}
				st, dl = append(st, stamp), append(dl, time.Now().UnixNano()-stamp)
				got++
				live.Done.Add(1)
			}
			stamps[i], delays[i] = st, dl
			mu.Lock()
			opened++
			res.OK += uint64(got)
			if bad > 0 {
				res.Errors["stream"]++
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	p.Stop()
	res.Elapsed = time.Since(start)
	res.Sent = uint64(r.sz.sseStreams * events)
	if !record {
		return nil
	}
	pb1, _ := r.proxyCPU(t)
	all := *res
	all.Latency, all.Service = bench.NewHist(), bench.NewHist()
	steady, opens := 0, lastOpen.Load()
	for i := range stamps {
		for j, st := range stamps[i] {
			all.Latency.Record(delays[i][j])
			if st >= opens {
				res.Latency.Record(delays[i][j])
				steady++
			}
		}
	}
	all.Service.Merge(all.Latency)
	res.Service.Merge(res.Latency)
	as := bench.Summarize(&all)
	res.OK = uint64(steady)
	s := bench.Summarize(res)
	run := &Record{Scenario: "sse", Target: t.name, Phase: "delay", Round: round, Summary: s}
	allRun := &Record{Scenario: "sse", Target: t.name, Phase: "delay-all", Round: round, Summary: as}
	if as.OK > 0 {
		// Per event sent, streams' opening included.
		run.ProxyCPUus = float64(pb1.CPU-pb0.CPU) / 1e3 / float64(as.OK)
		allRun.ProxyCPUus = run.ProxyCPUus
	}
	r.res.add(run)
	r.res.add(allRun)
	r.logf("    %-8s %d streams, %d events (%d once all were open): delay p50 %s p99 %s p99.9 %s max %s; all events p99 %s; errors %v",
		t.name, opened, as.OK, s.OK, bench.FmtUs(s.Latency.P50), bench.FmtUs(s.Latency.P99), bench.FmtUs(s.Latency.P999), bench.FmtUs(s.Latency.Max),
		bench.FmtUs(as.Latency.P99), s.Errors)
	if uint64(events*r.sz.sseStreams) != as.OK && ctx.Err() == nil {
		r.res.fact("sse.delay."+t.name+".missing", uint64(events*r.sz.sseStreams)-as.OK)
	}
	return nil
}

// sseIdle opens n idle streams through t and reads the proxy's RSS.
func (r *runner) sseIdle(ctx context.Context, t *target, ws []fleet.WorkerInfo, n int) error {
	rt := newRoute(t, ws)
	before, err := r.proxyCPU(t)
	if err != nil {
		return err
	}
	r.logf("    %-8s opening %d idle streams…", t.name, n)
	start := time.Now()
	streams, failed := openStreams(rt, n, "?n=1&every=3600000")
	opened := time.Since(start)
	time.Sleep(2 * time.Second) // let the allocator settle
	after, err := r.proxyCPU(t)
	if err != nil {
		return err
	}
	fds := fdCount(t.pid)
	for _, s := range streams {
		if s != nil {
			s.Close()
		}
	}
	var closed int
	_ = r.fl.call("POST", "/streams/close", &closed)
	growth := after.RSS - before.RSS
	k := "sse.idle." + t.name
	r.res.fact(k+".rssBeforeMiB", float64(before.RSS)/(1<<20))
	r.res.fact(k+".rssAfterMiB", float64(after.RSS)/(1<<20))
	r.res.fact(k+".rssGrowthMiB", float64(growth)/(1<<20))
	r.res.fact(k+".failed", failed)
	r.res.fact(k+".openS", opened.Seconds())
	r.res.fact(k+".fds", fds)
	if open := n - failed; open > 0 {
		r.res.fact(k+".kibPerStream", float64(growth)/1024/float64(open))
	}
	r.logf("    %-8s %d idle streams (%d failed) in %.1fs: RSS %.0f → %.0f MiB (+%.0f MiB), %d fds",
		t.name, n-failed, failed, opened.Seconds(), float64(before.RSS)/(1<<20), float64(after.RSS)/(1<<20), float64(growth)/(1<<20), fds)
	// Wait for the proxy to let go of the streams before the next phase.
	deadline := time.Now().Add(20 * time.Second)
	for fdCount(t.pid) > 1000 && time.Now().Before(deadline) {
		sleepCtx(ctx, 200*time.Millisecond)
	}
	return nil
}

// fdCount is the number of open descriptors of pid and its children.
func fdCount(pid int) int {
	n := 0
	for _, p := range append([]int{pid}, bench.Children(pid)...) {
		ents, _ := os.ReadDir("/proc/" + strconv.Itoa(p) + "/fd")
		n += len(ents)
	}
	return n
}
