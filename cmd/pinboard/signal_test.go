package main

import (
	"bytes"
	"log/slog"
	"os"
	"syscall"
	"testing"
	"time"
)

// The first SIGTERM or SIGINT starts the graceful shutdown; the same
// signal delivered again right after it (GNU timeout signals its child,
// then its process group) changes nothing; a second signal later exits at
// once with status 1 (R-SRV-2, docs/OPERATIONS.md).
func TestSecondSignalAfterEchoWindow_RSRV2(t *testing.T) {
	// The window takes GNU timeout's echo (microseconds later, more on a
	// loaded machine) and leaves an operator's second Ctrl-C working.
	if signalEcho < 100*time.Millisecond || signalEcho > time.Second {
		t.Fatalf("unexpected echo window %v; want 100 ms to 1 s", signalEcho)
	}
	// watchSignals reads the clock once per signal: the first one at 0,
	// then these offsets, in order.
	start := time.Unix(1_800_000_000, 0)
	offsets := []time.Duration{0, time.Millisecond, time.Millisecond, signalEcho - time.Millisecond, signalEcho}
	reads := make(chan time.Time, len(offsets))
	for _, d := range offsets {
		reads <- start.Add(d)
	}
	now := func() time.Time {
		select {
		case t := <-reads:
			return t
		default:
			return start.Add(time.Hour)
		}
	}
	sigs := make(chan os.Signal, len(offsets))
	cancelled, exited, done := make(chan struct{}), make(chan int, 1), make(chan struct{})
	var logs bytes.Buffer
	go func() {
		defer close(done)
		watchSignals(sigs, now, func() { close(cancelled) }, func(code int) { exited <- code },
			slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	}()
	for range offsets {
		sigs <- syscall.SIGTERM
	}
	select {
	case code := <-exited:
		if code != 1 {
			t.Fatalf("unexpected exit status after a second signal; got %d; want 1", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no exit after a second signal")
	}
	<-done
	<-cancelled
	if n := len(reads); n != 0 {
		t.Fatalf("exited with %d signals unread; want the exit on the one %v after the first, none before\n%s", n, signalEcho, logs.String())
	}
}
