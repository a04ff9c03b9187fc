package server

import (
	"errors"
	"net"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/internal/rawio"
)

// resume serves the client's further requests on a connection an event
// stream was relayed on (proxy.Options.Resume), or closes it once the
// node is stopping. The connection first waits for the next request here,
// under the idle timeout as any keep-alive connection: to fasthttp's
// ServeConn it is a new connection, whose first byte gets the header
// timeout — and, when that passes, an unsolicited 408 the client read as
// the answer to the request it sent after a pause.
func (pb *Pinboard) resume(c net.Conn) error {
	if !pb.awaitRequest(c) {
		return c.Close()
	}
	// ServeConn reports no StateNew: tracked here (its end is reported).
	pb.trackConn(c, fasthttp.StateNew)
	err := pb.srv.ServeConn(c)
	if errors.Is(err, fasthttp.ErrConcurrencyLimit) || errors.Is(err, fasthttp.ErrPerIPConnLimit) {
		// Refused before it was served: no StateClosed comes for it, and
		// the set kept it (and its connection) for the node's life.
		pb.trackConn(c, fasthttp.StateClosed)
	}
	return err
}

// awaitRequest waits up to the idle timeout for the client's next request
// on c, a connection handed back by an event relay. It reports false when
// the client closed c or sent nothing in time, and when the node is
// stopping (shutdown closes c meanwhile, closeResumed).
func (pb *Pinboard) awaitRequest(c net.Conn) bool {
	if _, ok := c.(*rawio.Conn); !ok {
		// Serve's listener gives only *rawio.Conn; no raw wait otherwise.
		return !pb.stopping.Load()
	}
	pb.resumedMu.Lock()
	if pb.stopping.Load() {
		pb.resumedMu.Unlock()
		return false
	}
	pb.resumed[c] = struct{}{}
	pb.resumedMu.Unlock()
	defer func() {
		pb.resumedMu.Lock()
		delete(pb.resumed, c)
		pb.resumedMu.Unlock()
	}()
	if c.SetReadDeadline(time.Now().Add(pb.opts.IdleTimeout)) != nil {
		return false
	}
	for {
		// AwaitEdge may return with nothing to read (see its contract):
		// look, and wait again.
		if rawio.AwaitEdge(c) != nil || rawio.PeerClosed(c) {
			return false
		}
		if rawio.Readable(c) {
			return !pb.stopping.Load()
		}
	}
}

// openConnections is pinboard_http_open_connections: fasthttp's count of
// the public listener's connections, and the connections waiting in
// awaitRequest for their next request, which fasthttp no longer counts
// (hijacked) and does not count yet (ServeConn): idle keep-alive
// connections like any other. Without them a client whose event stream
// ended cleanly went uncounted until its next request.
func (pb *Pinboard) openConnections() int64 {
	pb.resumedMu.Lock()
	n := len(pb.resumed)
	pb.resumedMu.Unlock()
	return int64(max(pb.srv.GetOpenConnectionsCount(), 0)) + int64(n)
}

// closeResumed closes the connections waiting in awaitRequest: a node
// stopping serves no further request on them.
func (pb *Pinboard) closeResumed() {
	pb.resumedMu.Lock()
	defer pb.resumedMu.Unlock()
	for c := range pb.resumed {
		_ = c.Close()
	}
}
