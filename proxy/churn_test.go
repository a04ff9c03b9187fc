package proxy

import (
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"testing"
	"time"
)

// openFDs is the number of file descriptors this process holds.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("cannot count file descriptors: %v", err)
	}
	return len(ents)
}

// settle waits up to 5 s for f to report at most want, and returns what
// it reported last.
func settle(want int, f func() int) int {
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := f()
		if n <= want || time.Now().After(deadline) {
			return n
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Workers come and go for weeks, each deploy often at a new advertise
// URL: a pool per URL that never saw a request again must go, with its
// idle connections, its dial state and its descriptors. Here 200 URLs
// (path prefixes on one listener, as workers behind one host:port) each
// get a pool with a pooled idle connection; the sweep past the pool
// memory must leave no pool, no descriptor and no goroutine behind.
func TestUpstreamChurnLeavesNothing_RDP3(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c); _ = c.Close() }()
		}
	}()
	runtime.GC()
	fds, gs := openFDs(t), runtime.NumGoroutine()

	us := newUpstreams(UpstreamOptions{})
	now := time.Now()
	const n = 200
	for i := range n {
		u, err := us.get(fmt.Sprintf("http://%s/w%d", ln.Addr(), i))
		if err != nil {
			t.Fatal(err)
		}
		u.touch(now)
		pc, _, err := u.pool.get(now)
		if err != nil {
			t.Fatalf("cannot dial worker %d: %v", i, err)
		}
		u.pool.put(pc, now)
	}
	if got := openFDs(t); got < fds+n {
		t.Fatalf("unexpected descriptors with %d pooled connections; got %d; want at least %d", n, got, fds+n)
	}
	// Within the pool memory: idle connections close, pools stay (a
	// worker re-registering at its URL keeps its pool).
	us.sweep(now.Add(time.Minute), 10*time.Minute)
	us.mu.RLock()
	pools := len(us.m)
	us.mu.RUnlock()
	if pools != n {
		t.Fatalf("unexpected pools a minute on; got %d; want %d", pools, n)
	}
	us.sweep(now.Add(11*time.Minute), 10*time.Minute)
	us.mu.RLock()
	pools = len(us.m)
	us.mu.RUnlock()
	if pools != 0 {
		t.Fatalf("unexpected pools past the pool memory; got %d; want 0", pools)
	}
	if got := settle(fds, func() int { return openFDs(t) }); got > fds {
		t.Fatalf("unexpected descriptors after every pool went; got %d; want %d", got, fds)
	}
	if got := settle(gs, runtime.NumGoroutine); got > gs {
		t.Fatalf("unexpected goroutines after every pool went; got %d; want %d", got, gs)
	}
}
