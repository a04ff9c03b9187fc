package scenario

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/pinboard-go/pinboard/bench"
)

// large streams one big body up and one down through each target (1 GiB;
// 256 MiB in quick mode), sampling the proxy's RSS every 10 ms: a
// streaming proxy's memory must not grow with the body.
func (r *runner) large(ctx context.Context) error {
	ws, err := r.fl.workers()
	if err != nil {
		return err
	}
	size := r.sz.large
	for round := 1; round <= max(1, r.cfg.Rounds-1); round++ {
		for _, name := range orderFor(allTargets, round) {
			for _, up := range []bool{true, false} {
				if err := ctx.Err(); err != nil {
					return err
				}
				t := r.tgt[name]
				rt := newRoute(t, ws)
				action := "upload"
				if !up {
					action = "download?size=" + strconv.FormatInt(size, 10)
				}
				path := string(rt.appendPath(nil, 0, "/bench", HotID(0), action))
				r.waitQuiet(ctx)
				lr := r.transfer(t, rt.addr(0), path, rt.headers(0), up, size)
				lr.Round = round
				r.res.mu.Lock()
				r.res.Large = append(r.res.Large, lr)
				r.res.mu.Unlock()
			}
		}
	}
	return nil
}

func (r *runner) transfer(t *target, addr, path string, headers []string, up bool, size int64) LargeRun {
	dir := "download"
	if up {
		dir = "upload"
	}
	lr := LargeRun{Target: t.name, Direction: dir}
	before, _ := r.proxyCPU(t)
	lr.RSSBeforeMiB = float64(before.RSS) / (1 << 20)
	peak := before.RSS
	stop := make(chan struct{})
	var wg sync.WaitGroup
	if t.pid != 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tk := time.NewTicker(10 * time.Millisecond)
			defer tk.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tk.C:
					if st, err := r.proxyCPU(t); err == nil && st.RSS > peak {
						peak = st.RSS
					}
				}
			}
		}()
	}
	label := fmt.Sprintf("large/%s %s", t.name, dir)
	p := bench.StartProgress(r.log, r.tty, label, 0, nil)
	start := time.Now()
	n, err := bench.Transfer(addr, path, headers, up, size, 10*time.Minute)
	lr.Seconds = time.Since(start).Seconds()
	p.Stop()
	close(stop)
	wg.Wait()
	after, _ := r.proxyCPU(t)
	lr.Bytes = n
	if err != nil {
		lr.Error = err.Error()
	}
	if lr.Seconds > 0 {
		lr.MiBps = float64(n) / (1 << 20) / lr.Seconds
	}
	if t.pid != 0 {
		lr.RSSGrowthMiB = float64(peak-before.RSS) / (1 << 20)
		lr.ProxyCPUs = (after.CPU - before.CPU).Seconds()
	}
	r.logf("    %-8s %-8s %5.0f MiB in %5.2fs = %6.0f MiB/s  RSS +%.1f MiB  proxy CPU %.2fs %s",
		t.name, dir, float64(n)/(1<<20), lr.Seconds, lr.MiBps, lr.RSSGrowthMiB, lr.ProxyCPUs, lr.Error)
	return lr
}
