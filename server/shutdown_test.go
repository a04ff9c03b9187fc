package server

import (
	"context"
	"net"
	"testing"
	"time"
)

// A shutdown that starts before fasthttp registered the listener (a
// SIGTERM right after start, or a context already done) must still close
// it and return at once: fasthttp's Shutdown does nothing for a server
// without listeners yet, and Serve then served on.
func TestShutdownBeforeServeStarted(t *testing.T) {
	for i := 0; i < 5; i++ {
		pb, _ := testPinboard(t, "")
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		start := time.Now()
		if err := pb.Serve(ctx, ln, time.Second); err != nil {
			t.Fatalf("unexpected Serve error: %v", err)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Fatalf("unexpected shutdown time; got %v; want under 3s (1s grace)", d)
		}
		if c, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
			c.Close()
			t.Fatalf("unexpected listener still accepting after Serve returned")
		}
	}
}
