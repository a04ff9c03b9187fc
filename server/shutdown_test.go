package server

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
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
		// A grace far longer than the wait below: a Serve that served on,
		// or one that waited out the grace with nothing to wait for, both
		// fail it, and a loaded machine cannot (no bound on a duration).
		served := make(chan error, 1)
		go func() { served <- pb.Serve(ctx, ln, time.Hour) }()
		select {
		case err := <-served:
			if err != nil {
				t.Fatalf("unexpected Serve error: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("unexpected Serve still running 20s after a shutdown that came before it (grace 1h)")
		}
		if c, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
			c.Close()
			t.Fatalf("unexpected listener still accepting after Serve returned")
		}
	}
}

// An HTTP/1.0 client's download of an unsized body is relayed off the
// server on the hijacked connection, which fasthttp no longer counts: the
// shutdown's grace must still wait for it like for any request in flight
// ("Operating it": SIGTERM lets in-flight requests finish within the
// grace), not cut it as soon as the server has no connection left; and
// nothing of it outlives Serve (R-DP-2).
func TestShutdownWaitsForHTTP10Download_RDP2(t *testing.T) {
	release, stopped := make(chan struct{}), make(chan struct{})
	defer close(stopped)
	// A grace of an hour: the download must end by itself within it however
	// loaded the machine is (with 1s, a slow one cut it before "last"), and
	// stop fails after 10s a shutdown that waits for anything else.
	pb, public, stop := workerNodeStop(t, Options{}, time.Hour, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "first,")
		w.(http.Flusher).Flush()
		select {
		case <-release:
			_, _ = io.WriteString(w, "last")
		case <-stopped:
		}
	}))
	c, err := net.Dial("tcp", strings.TrimPrefix(public, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprint(c, "GET /counters/alice/download HTTP/1.0\r\nHost: pb\r\n\r\n")
	br := bufio.NewReader(c)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("cannot read the response header: %v", err)
		}
		if line == "\r\n" {
			break
		}
	}
	first := make([]byte, len("first,"))
	if _, err := io.ReadFull(br, first); err != nil {
		t.Fatalf("cannot read the body's start: %v", err)
	}
	stopErr := make(chan error, 1)
	go func() { stopErr <- stop() }()
	// The download goes on during the grace and ends by itself.
	time.Sleep(200 * time.Millisecond)
	select {
	case err := <-stopErr:
		t.Fatalf("unexpected shutdown done with a download in flight; got %v", err)
	default:
	}
	close(release)
	rest, err := io.ReadAll(br)
	if err != nil || string(rest) != "last" {
		t.Fatalf("unexpected rest of the download; got %q, %v; want %q then the close", rest, err, "last")
	}
	if err := <-stopErr; err != nil {
		t.Fatalf("unexpected shutdown error: %v", err)
	}
	if d, o := pb.Proxy().RelayedDownloads(), pb.Proxy().OpenStreams(); d != 0 || o != 0 {
		t.Fatalf("unexpected relays left after shutdown; got %d downloads, %d streams; want 0, 0", d, o)
	}
}
