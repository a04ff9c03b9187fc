package rawio

import (
	"net"
	"time"
)

// Linger is the lingering close of the connections a server accepts
// (ListenerLinger), nginx's lingering_close: a connection closed while the
// client's bytes wait unread in its receive queue — a request body the
// server answered without reading (a worker's early 403, a 404, a 413) —
// is not closed at once. Closed so, the kernel answers the client with a
// reset: the client's next write of its body fails, and an HTTP client
// writing its body while it waits for the answer (Go's, Python's) reports
// that write error instead of the answer it was sent; a reset may also
// cut answer bytes still in flight. Instead the connection's write side is
// shut (the client reads the answer and then the end of the stream) and
// the client's further bytes are read and dropped until it closes, it
// stays silent for Wait, or Total passed; then the connection closes.
//
// At most max connections linger at once (each holds a descriptor and a
// goroutine for up to Total); past that, and once Stop was called, a close
// is immediate as before.
type Linger struct {
	// Wait is the longest wait for the client's next bytes (nginx's
	// lingering_timeout).
	Wait time.Duration
	// Total bounds one connection's linger (nginx's lingering_time).
	Total time.Duration

	slots   chan struct{}
	stopped chan struct{}
}

// NewLinger returns a Linger for at most max connections at once.
func NewLinger(max int, wait, total time.Duration) *Linger {
	return &Linger{Wait: wait, Total: total, slots: make(chan struct{}, max), stopped: make(chan struct{})}
}

// Stop makes every later close immediate: a server shutting down closes
// its connections, idle ones included, to end their reads.
func (l *Linger) Stop() {
	select {
	case <-l.stopped:
	default:
		close(l.stopped)
	}
}

// Lingering is the number of connections lingering now: answers on their
// way to clients still sending, which a graceful shutdown's grace waits
// for like any request in flight.
func (l *Linger) Lingering() int { return len(l.slots) }

// ListenerLinger is Listener whose connections close with l.
func ListenerLinger(ln net.Listener, l *Linger) net.Listener { return listener{ln, l} }

// NoLinger makes c's Close immediate: for a connection handed over to
// code that closes it to interrupt a read or write of its own (a hijacked
// relay, shutdown cutting it), which a lingering close would leave
// running. The linger is kept aside for Relinger. Other connections are
// left as they are.
func NoLinger(c net.Conn) {
	if rc, ok := c.(*Conn); ok {
		if l := rc.linger.Swap(nil); l != nil {
			rc.parked.Store(l)
		}
	}
}

// Relinger gives c back the lingering close NoLinger took, for a relay
// that ended cleanly and closes c with nothing of its own left to
// interrupt: closed at once with the client's bytes unread, the kernel
// would answer with a reset in place of the end of the stream — which
// ends a close-delimited body — and may drop the last bytes still in
// flight.
func Relinger(c net.Conn) {
	if rc, ok := c.(*Conn); ok {
		if l := rc.parked.Swap(nil); l != nil {
			rc.linger.Store(l)
		}
	}
}

// Abort makes c's next Close a reset (SO_LINGER 0) instead of a clean
// close, and drops a lingering close: for a connection whose close is
// what ends a message (a close-delimited body, RFC 9112 §6.3) when the
// message was cut short. A clean close would tell the peer it got all of
// it; a reset is the one error the connection can indicate (RFC 9112
// §8). Connections without a TCP socket are left as they are.
func Abort(c net.Conn) {
	tc := TCP(c)
	if tc == nil {
		return
	}
	NoLinger(c)
	_ = tc.SetLinger(0)
}

// MoreInput tells c's Close that the client may still be sending (the
// server stopped reading a request body it answered without): c lingers
// even if no byte happens to wait unread at the moment it closes.
func MoreInput(c net.Conn) {
	if rc, ok := c.(*Conn); ok {
		rc.moreInput.Store(true)
	}
}

// InputDone takes back MoreInput: the request body a stop was to cut
// short had been read to its end after all, so nothing more is due from
// the client, and c's Close lingers again only for bytes that wait unread.
func InputDone(c net.Conn) {
	if rc, ok := c.(*Conn); ok {
		rc.moreInput.Store(false)
	}
}

// Close implements net.Conn: at once, or lingering (Linger) when the
// connection has one and the client's bytes wait unread or may follow
// (MoreInput).
func (c *Conn) Close() error {
	l := c.linger.Swap(nil)
	if l == nil || !c.moreInput.Load() && peekTCP(c.TCPConn) != peekData {
		return c.TCPConn.Close()
	}
	select {
	case <-l.stopped:
		return c.TCPConn.Close()
	default:
	}
	select {
	case l.slots <- struct{}{}:
	default:
		return c.TCPConn.Close()
	}
	if err := c.TCPConn.CloseWrite(); err != nil {
		<-l.slots
		return c.TCPConn.Close()
	}
	go l.drain(c.TCPConn)
	return nil
}

// drain reads and drops what the client still sends, then closes tc.
func (l *Linger) drain(tc *net.TCPConn) {
	defer func() { <-l.slots }()
	defer tc.Close()
	end := time.Now().Add(l.Total)
	buf := make([]byte, 4096)
	for {
		d := time.Now().Add(l.Wait)
		if d.After(end) {
			d = end
		}
		if tc.SetReadDeadline(d) != nil {
			return
		}
		if _, err := tc.Read(buf); err != nil {
			return
		}
	}
}
