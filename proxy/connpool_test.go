package proxy

import (
	"net"
	"runtime"
	"testing"
	"time"
)

// Two connections coming back while two requests wait for one serve both
// at once, not one of them after ConnWait with a 503 "owner busy"
// (R-DP-3). One P makes the order certain: both puts run before either
// waiter does. (Waiters parked in their select each take a put's wake
// directly; passWake covers two waiters caught between popIdle and the
// select, a window too narrow to hit on purpose.)
func TestPoolWakesEveryWaiter_RDP3(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // the worker side: accept, hold, close with the listener
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	o := (&UpstreamOptions{MaxConns: 2, ConnWait: 3 * time.Second}).withDefaults()
	pool := newConnPool(ln.Addr().String(), func(addr string) (net.Conn, error) { return net.Dial("tcp", addr) }, o)
	defer pool.closeIdle(time.Now(), true)
	now := time.Now()
	a, _, err := pool.get(now)
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := pool.get(now)
	if err != nil {
		t.Fatal(err)
	}

	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	type got struct {
		pc  *pconn
		err error
		d   time.Duration
	}
	done := make(chan got, 2)
	for range 2 {
		go func() {
			start := time.Now()
			pc, _, err := pool.get(time.Now())
			done <- got{pc, err, time.Since(start)}
		}()
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		pool.mu.Lock()
		n := pool.waiters
		pool.mu.Unlock()
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("unexpected waiters after 5s; got %d; want 2", n)
		}
	}
	time.Sleep(20 * time.Millisecond) // both parked in their select
	pool.put(a, time.Now())
	pool.put(b, time.Now())
	for range 2 {
		g := <-done
		if g.err != nil || g.d > time.Second {
			t.Fatalf("unexpected wait for a connection put back; got %v after %v; want one at once", g.err, g.d)
		}
		pool.discard(g.pc)
	}
}
