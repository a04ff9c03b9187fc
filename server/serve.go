package server

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/pinboard-go/pinboard/internal/rawio"
)

// Serve serves ln until ctx ends, then, after Options.ShutdownDelay,
// shuts down gracefully (see Shutdown). Background loops (directory sweeps, pool sweeps) run while it
// serves, and have ended when it returns: a sweep still running on the
// store then would meet a caller that closes the store once Serve
// returned (cmd/pinboard does).
//
// A Pinboard serves once: after its shutdown (Serve's or Shutdown's) its
// pools are closed and its readiness is 503 for good, and Serve closes ln
// and returns an error wrapping net.ErrClosed at once (net/http's
// ErrServerClosed). Build another with New.
func (pb *Pinboard) Serve(ctx context.Context, ln net.Listener, grace time.Duration) error {
	if pb.stopping.Load() {
		_ = ln.Close()
		return fmt.Errorf("cannot serve: pinboard was shut down (build another with New): %w", net.ErrClosed)
	}
	bg, stopBG := context.WithCancel(context.Background())
	var loops sync.WaitGroup
	loops.Go(func() { pb.proxy.Run(bg) })
	loops.Go(func() { pb.sweep(bg) })
	defer func() {
		stopBG()
		loops.Wait()
	}()

	// Raw read(2)/write(2) on client connections: loopback-fast writes
	// otherwise park the goroutine's P in syscall state and cost context
	// switches per request (internal/rawio, docs/bench/HISTORY.md). Closed with
	// unread input, they linger (pb.linger). A client that stops reading
	// a stream, or vanishes without a FIN, is cut by the kernel after the
	// stall timeout (rawio.SetUserTimeout): small events never fill the
	// send buffer for a write deadline to see it.
	cln := &onceCloseListener{Listener: newPatientListener(rawio.UserTimeoutListener(rawio.ListenerLinger(ln, pb.linger), pb.stall), pb.log)}
	errc := make(chan error, 1)
	go func() { errc <- pb.srv.Serve(cln) }()
	select {
	case err := <-errc:
		return pb.serveEnded(err)
	case <-ctx.Done():
	}
	if ended, err := pb.delayShutdown(errc); ended {
		return pb.serveEnded(err)
	}
	return pb.shutdown(grace, errc, cln)
}

// serveEnded is Serve's result when the listener stopped serving before
// Serve's context ended: nil when Shutdown, called on its own, closed it
// — that Shutdown does the rest, the admin listener last (net/http's
// ErrServerClosed, without the error); otherwise the listener's error,
// the admin listener closed.
func (pb *Pinboard) serveEnded(err error) error {
	if pb.stopping.Load() {
		return nil
	}
	pb.closeAdmin()
	if err == nil {
		// fasthttp's Serve returns nil for a listener closed under it.
		err = net.ErrClosed
	}
	return fmt.Errorf("cannot serve: %w", err)
}

// delayShutdown is Options.ShutdownDelay: readiness turns 503 at once,
// and the node goes on serving — data plane, registry and new
// connections alike — until the delay is over, for load balancers to
// see it and route elsewhere. A listener that stops meanwhile ends the
// wait: ended, with its result.
func (pb *Pinboard) delayShutdown(errc <-chan error) (ended bool, err error) {
	d := pb.opts.ShutdownDelay
	if d <= 0 {
		return false, nil
	}
	pb.unready.Store(true)
	pb.log.Info("shutdown: readiness 503; serving on until the delay is over", "delayMs", d.Milliseconds())
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case err := <-errc:
		return true, err
	case <-t.C:
		return false, nil
	}
}

// The lingering close of client connections (rawio.Linger): nginx's
// lingering_timeout and lingering_time are 5 s and 30 s; a client still
// sending gets less here, and at most lingerMax connections linger at
// once (each a descriptor and a goroutine), so that clients cannot pile
// them up.
const (
	lingerMax   = 1024
	lingerWait  = 2 * time.Second
	lingerTotal = 10 * time.Second
)

// onceCloseListener closes its listener once; later calls return nil
// (fasthttp's Shutdown returns its Close error, which would fail a clean
// shutdown). Serve closes the listener itself at shutdown: fasthttp's
// Shutdown closes only the listeners its Serve already registered, and
// does nothing at all before the first one, so a shutdown that started
// right after Serve was called left the listener open and served on.
type onceCloseListener struct {
	net.Listener
	once sync.Once
}

func (l *onceCloseListener) Close() error {
	var err error
	l.once.Do(func() { err = l.Listener.Close() })
	return err
}

// sweep runs the store's housekeeping a few times per lease.
func (pb *Pinboard) sweep(ctx context.Context) {
	every := pb.opts.LeaseTTL / 8
	if every > time.Second {
		every = time.Second
	}
	if every < 50*time.Millisecond {
		every = 50 * time.Millisecond
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c, cancel := context.WithTimeout(ctx, 5*time.Second)
			if err := pb.store.Sweep(c, pb.now()); err != nil {
				pb.log.Warn("directory sweep failed", "err", err)
			}
			cancel()
		}
	}
}
