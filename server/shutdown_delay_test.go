package server

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// With a shutdown delay, the end of Serve's context turns readiness 503
// at once and nothing else: new connections are accepted and served,
// the registry answers, until the delay is over; then the shutdown runs
// as without one and the port refuses connections (R-SRV-2,
// docs/OPERATIONS.md, PINBOARD_SHUTDOWN_DELAY_MS).
func TestShutdownDelayKeepsServingWhileUnready_RSRV2(t *testing.T) {
	const delay = 1500 * time.Millisecond
	pb, _ := testPinboardWith(t, "", func(o *Options) { o.ShutdownDelay = delay })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- pb.Serve(ctx, ln, time.Second) }()
	get := func(path string) (int, string, error) {
		// A connection of its own each time: new connections are what
		// the delay keeps accepting.
		c := &fasthttp.Client{MaxIdleConnDuration: time.Nanosecond}
		status, body, err := c.GetTimeout(nil, "http://"+addr+path, 2*time.Second)
		return status, string(body), err
	}
	if status, body, err := get("/readyz?exclude=quarantine"); err != nil || status != 200 {
		t.Fatalf("unexpected readiness before the signal; got %d %s %v", status, body, err)
	}
	cancel()
	stopped := time.Now()
	// Readiness turns 503 at once; everything else still serves.
	deadline := stopped.Add(time.Second)
	for {
		status, body, err := get("/readyz?exclude=quarantine")
		if err != nil {
			t.Fatalf("unexpected connection failure %v after the signal, within the delay: %v", time.Since(stopped), err)
		}
		if status == 503 && body == `{"ok":false,"shuttingDown":true}` {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("unexpected readiness 1s into the delay; got %d %s; want 503 shuttingDown", status, body)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if status, body, err := get("/livez"); err != nil || status != 200 {
		t.Fatalf("unexpected liveness within the delay; got %d %s %v; want 200", status, body, err)
	}
	if status, body, err := get("/registry/health"); err != nil || status == 503 {
		t.Fatalf("unexpected registry within the delay; got %d %s %v; want it still serving", status, body, err)
	}
	if d := time.Since(stopped); d >= delay {
		t.Skipf("machine too slow: the checks took %v, the whole delay (%v)", d, delay)
	}
	select {
	case err := <-done:
		t.Fatalf("Serve returned %v after %v, before the delay (%v) was over", err, time.Since(stopped), delay)
	default:
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("unexpected shutdown error: %v", err)
		}
	case <-time.After(delay + 10*time.Second):
		t.Fatal("unexpected hang in shutdown")
	}
	if d := time.Since(stopped); d < delay {
		t.Fatalf("unexpected Serve return %v after the signal; want the delay (%v) first", d, delay)
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Fatal("unexpected connection accepted after the shutdown")
	}
}
