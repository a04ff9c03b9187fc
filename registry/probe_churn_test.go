package registry

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime"
	"testing"
	"time"
)

// Workers come and go for weeks, each deploy often at a new host: the
// prober's client keeps a per-host pool (fasthttp.HostClient) for every
// host it probed, and the per-host pools must go once their connections
// idle out, with their goroutines and descriptors. Here 40 workers, each
// on its own loopback address, are probed and leave; within the idle time
// and fasthttp's cleaner interval everything is back to the baseline.
func TestProbeChurnLeavesNothing_RREG1(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the probe pools to idle out (about 10 s)")
	}
	countFDs := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Skipf("cannot count file descriptors: %v", err)
		}
		return len(ents)
	}
	runtime.GC()
	fds, gs := countFDs(), runtime.NumGoroutine()

	p := NewProber(time.Second)
	const n = 40
	for i := range n {
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.%d.%d:0", 1+i/200, 2+i%200))
		if err != nil {
			t.Skipf("cannot listen on another loopback address: %v", err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"value":"v"}`))
		})}
		go func() { _ = srv.Serve(ln) }()
		if res, err := p.Probe("http://"+ln.Addr().String(), "s", "c", "v"); res != ProbeOK {
			t.Fatalf("unexpected probe of worker %d; got %v (%v); want ok", i, res, err)
		}
		_ = srv.Close() // the worker leaves
	}
	settle := func(want int, f func() int) int {
		deadline := time.Now().Add(20 * time.Second)
		for {
			got := f()
			if got <= want || time.Now().After(deadline) {
				return got
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if got := settle(fds, countFDs); got > fds {
		t.Fatalf("unexpected descriptors after %d workers left; got %d; want %d", n, got, fds)
	}
	if got := settle(gs, runtime.NumGoroutine); got > gs {
		t.Fatalf("unexpected goroutines after %d workers left; got %d; want %d", n, got, gs)
	}
}
