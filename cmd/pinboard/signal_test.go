package main

import (
	"bytes"
	"log/slog"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// The first SIGTERM or SIGINT starts the graceful shutdown; the same
// signal delivered again right after it (GNU timeout signals its child,
// then its process group) changes nothing; a second signal later exits at
// once with status 1 (R-SRV-2, docs/OPERATIONS.md).
func TestSecondSignalAfterEchoWindow_RSRV2(t *testing.T) {
	sigs := make(chan os.Signal)
	var clock atomic.Int64 // ns since start
	start := time.Unix(1_800_000_000, 0)
	now := func() time.Time { return start.Add(time.Duration(clock.Load())) }
	cancelled, exited := make(chan struct{}), make(chan int, 1)
	done := make(chan struct{})
	var logs bytes.Buffer
	go func() {
		defer close(done)
		watchSignals(sigs, now, func() { close(cancelled) }, func(code int) { exited <- code },
			slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	}()
	// The window takes GNU timeout's echo (microseconds later, more on a
	// loaded machine) and leaves an operator's second Ctrl-C working.
	if signalEcho < 100*time.Millisecond || signalEcho > time.Second {
		t.Fatalf("unexpected echo window %v; want 100 ms to 1 s", signalEcho)
	}
	send := func(s os.Signal) {
		t.Helper()
		select {
		case sigs <- s:
		case code := <-exited:
			t.Fatalf("unexpected exit %d on a signal within %v of the first; want the graceful shutdown to go on", code, signalEcho)
		case <-time.After(10 * time.Second):
			t.Fatal("watchSignals stopped taking signals")
		}
	}
	send(syscall.SIGTERM)
	<-cancelled
	for _, at := range []time.Duration{time.Millisecond, signalEcho - time.Millisecond} {
		clock.Store(int64(at))
		send(syscall.SIGTERM) // the echo
		send(syscall.SIGTERM) // unbuffered: taken once the echo was handled
		select {
		case code := <-exited:
			t.Fatalf("unexpected exit %d on a signal %v after the first; want the graceful shutdown to go on", code, at)
		default:
		}
	}
	clock.Store(int64(signalEcho))
	send(syscall.SIGINT)
	select {
	case code := <-exited:
		if code != 1 {
			t.Fatalf("unexpected exit status after a second signal; got %d; want 1", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no exit after a second signal %v after the first\n%s", signalEcho, logs.String())
	}
	<-done
}
