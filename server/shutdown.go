package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/valyala/fasthttp"
)

// CloseWait bounds the end of a shutdown: the WebSocket closing handshakes
// and the last bytes of ended streams. A shutdown takes at most the grace
// plus CloseWait (and 0.1 s for the relays cut at its end to let go of
// their worker connections, proxy.CloseStreamsContext), which is what an
// orchestrator's kill timeout must exceed with some slack (deploy/,
// checked by cmd/pinboard's deploy tests).
const CloseWait = 2 * time.Second

// Shutdown stops the node in three steps:
//
//  1. Readiness turns 503, the registry answers 503 "not the serving
//     fleet" (Retry-After: workers go to another node), the listener
//     closes, idle keep-alive connections close.
//  2. In-flight requests — including uploads, downloads, WebSocket
//     handshakes, and answers closing lingering to a client still
//     sending (rawio.Linger) — get up to grace to finish. The step ends
//     early once nothing but event streams and WebSockets is left: those
//     never end by themselves. Past it, connections close at once.
//  3. Event streams end (cleanly between events), other streams still
//     running are cut, each WebSocket gets a Close frame 1001 "going away"
//     toward the client and the worker; up to 2s more for the closing
//     handshakes, then whatever is left is closed.
//
// Then the registry pool and the admin listener stop; requests still
// running then, registry ones included, are cut: their connections
// close, and nothing more is served on them. errc, if not nil, is
// awaited up to 5s once the connections are done (before the registry
// pool stops): a channel that receives when a server of the caller's own
// stopped serving. A program that runs Serve passes nil; Serve's result
// is Serve's to return (a channel it sends to would be drained here, not
// by the program).
//
// Serve does all of this when its context ends. Called on a node Serve
// runs, Shutdown is that shutdown: Serve returns nil once it began, and
// the node has stopped when Shutdown returns (net/http's Shutdown).
// Called on a node never served, it releases what New started.
//
// Shutdown does not close Options.Store: close it after Shutdown returns
// (not when Serve does, which is earlier here).
//
// A node shuts down once: Shutdown called again, or while Serve's
// shutdown runs, waits for that shutdown to finish and returns an error
// wrapping net.ErrClosed (as Serve does on a node shut down).
func (pb *Pinboard) Shutdown(grace time.Duration, errc <-chan error) error {
	return pb.shutdown(grace, errc, nil)
}

// shutdown is Shutdown; ln, if not nil, is the public listener, closed
// here as well as by fasthttp's Shutdown (see onceCloseListener).
//
// Only the first call shuts down. Run twice — a program that defers
// Shutdown after Serve's context ended it, or calls it as that context
// ends — the second stopped the registry pool again and failed with
// ants' "this pool has been closed", having stopped the server, the
// linger and the streams a second time, concurrently with the first.
// A later call waits for the first (the node has stopped when it
// returns); Serve's own (ln set) closes its listener first, which the
// first may not have (see onceCloseListener), and returns nil.
func (pb *Pinboard) shutdown(grace time.Duration, errc <-chan error, ln io.Closer) error {
	if !pb.shutStarted.CompareAndSwap(false, true) {
		if ln != nil {
			_ = ln.Close()
		}
		<-pb.shutDone
		if ln != nil {
			return nil
		}
		return fmt.Errorf("cannot shut down: pinboard was shut down already: %w", net.ErrClosed)
	}
	defer close(pb.shutDone)
	pb.stopping.Store(true)
	pb.closeResumed()
	pb.registry.Stop()
	start := time.Now()
	sctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- pb.srv.ShutdownWithContext(sctx) }()
	if ln != nil {
		_ = ln.Close()
	}

	var err error
	finished, timedOut := pb.drain(grace, done, &err)
	if timedOut {
		// Said before anything is cut: without it, a deploy's log read
		// as a clean stop however many requests it cut.
		pb.log.Warn("shutdown: grace ran out; cutting requests still in flight",
			"graceMs", grace.Milliseconds(), "inFlight", pb.inFlight())
	}
	// Past the grace, connections close at once: what still runs is cut.
	// Not before: a request answered during the grace without its body
	// read (a worker's early 403 or 413 to an upload) closes its
	// connection lingering, or the client's next write met a reset and
	// it reported that instead of the answer. An idle connection fasthttp
	// closes meanwhile is no longer served when a request arrives just
	// then (fasthttp drops a request on a connection its Shutdown
	// claimed), so its lingering serves nothing.
	pb.linger.Stop()
	pb.log.Info("shutdown: closing streams", "afterMs", time.Since(start).Milliseconds(),
		"eventStreams", pb.proxy.OpenEventStreams(), "streams", pb.proxy.OpenStreams(), "webSockets", pb.proxy.OpenWebSockets())
	cctx, ccancel := context.WithTimeout(context.Background(), CloseWait)
	pb.proxy.CloseStreamsContext(cctx)
	if !finished {
		select {
		case err = <-done:
		case <-cctx.Done():
			cancel()
			err = <-done
		}
	}
	ccancel()
	// Canceled: requests were still in flight when the budget ran out;
	// they end with the process.
	cut := errors.Is(err, context.Canceled)
	if cut {
		err = nil
		// Closed, not left to fasthttp: its Shutdown, canceled, serves
		// them on — the late answer, then further requests, keep-alive —
		// after Shutdown returned (an embedding program goes on, R-SRV-4).
		// Their handlers end with what they wait for, unable to write.
		pb.closeConns()
	}
	if errc != nil {
		select {
		case <-errc:
		case <-time.After(5 * time.Second):
		}
	}
	if cut {
		// Registry requests among them (a body still arriving, a store
		// call) are cut as the data plane's are: waiting for them took
		// the shutdown past its budget, then failed it (exit 1).
		if cerr := pb.registry.Close(registryCutWait); cerr != nil {
			pb.log.Warn("shutdown: registry requests still running are cut", "err", cerr)
		}
	} else if cerr := pb.registry.Close(5 * time.Second); cerr != nil && err == nil {
		err = fmt.Errorf("cannot stop the registry pool: %w", cerr)
	}
	pb.closeAdmin()
	return err
}

// trackConn is the server's ConnState hook: it keeps the connections the
// server serves, from their acceptance (or resume) to their close or
// hijack (a relay's then, closed by the proxy's shutdown). Called on every
// request's state change too: those cost a switch.
//
// A connection is counted, not just kept: a relay's hijack handler runs
// on a goroutine of its own before the server's worker reports
// StateHijacked, so a short event stream can end and its connection be
// resumed (StateNew) before that report; the late StateHijacked then
// ends the first serving, not the one ServeConn now runs.
func (pb *Pinboard) trackConn(c net.Conn, state fasthttp.ConnState) {
	switch state {
	case fasthttp.StateNew:
		pb.connsMu.Lock()
		pb.conns[c]++
		pb.connsMu.Unlock()
	case fasthttp.StateClosed, fasthttp.StateHijacked:
		pb.connsMu.Lock()
		if n := pb.conns[c]; n > 1 {
			pb.conns[c] = n - 1
		} else {
			delete(pb.conns, c)
		}
		pb.connsMu.Unlock()
	}
}

// closeConns closes the connections the server still serves: the
// requests on them are cut.
func (pb *Pinboard) closeConns() {
	pb.connsMu.Lock()
	defer pb.connsMu.Unlock()
	for c := range pb.conns {
		_ = c.Close()
	}
}

// registryCutWait is how long the registry pool gets to stop when
// requests outlived the shutdown's budget: its idle workers' exit, not
// the requests still running.
const registryCutWait = 100 * time.Millisecond

// drain is step 2 of Shutdown: it returns when the server finished (true,
// its result in *err) and no download relayed off it nor lingering close
// is left, when grace ran out, or when only event streams are left on
// open connections. It reports whether the server finished, and whether
// the grace ran out with requests other than event streams in flight.
func (pb *Pinboard) drain(grace time.Duration, done <-chan error, err *error) (finished, timedOut bool) {
	timer := time.NewTimer(grace)
	defer timer.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case *err = <-done:
			finished, done = true, nil
		case <-timer.C:
			return finished, pb.inFlight() > 0
		case <-tick.C:
		}
		// A body relayed off the server to an HTTP/1.0 client is a
		// request in flight on a connection the server no longer counts;
		// so is an answer on a connection closing lingering, its client
		// still sending: the process ending would reset it.
		if pb.proxy.RelayedDownloads() > 0 || pb.linger.Lingering() > 0 {
			continue
		}
		// Each event stream the server still writes holds one connection
		// (relayed ones left it); a connection doing anything else is an
		// in-flight request.
		if finished || int64(pb.srv.GetOpenConnectionsCount()) <= pb.proxy.OpenEventStreams()-pb.proxy.RelayedEventStreams() {
			return finished, false
		}
	}
}

// inFlight is how many requests a shutdown would cut now: connections the
// server still serves other than its event streams, downloads relayed off
// it, and answers closing lingering to a client still sending.
func (pb *Pinboard) inFlight() int64 {
	n := int64(pb.srv.GetOpenConnectionsCount()) - (pb.proxy.OpenEventStreams() - pb.proxy.RelayedEventStreams())
	return max(n, 0) + pb.proxy.RelayedDownloads() + int64(pb.linger.Lingering())
}
