package rawio

import (
	"errors"
	"io"
	"net"
	"syscall"
)

// ready is AwaitEdge's first look: true once a read would not wait —
// data, the end of the stream or an error to report.
func (x *rawConn) ready(fd uintptr) bool {
	if peekFD(fd, &x.one[0]) != peekNothing {
		return true
	}
	return x.parkable()
}

// ErrWouldBlock is TryRead's answer when nothing is there to read.
var ErrWouldBlock = errors.New("rawio: read would block")

// TryRead is one read(2) into p that never waits: ErrWouldBlock when
// nothing was there, io.EOF at the end of the stream, and a passed read
// deadline's error as a Read would. With AwaitEdge it lets a relay take a
// buffer only once a read found something, and pay one system call per
// message instead of the three of a wait that looks again once woken (a
// peek that finds nothing, a peek once woken, the read). Connections
// without raw access (TLS) read as usual, waiting.
func TryRead(c net.Conn, p []byte) (int, error) {
	rc, ok := c.(*Conn)
	if !ok || rc.x == nil || len(p) == 0 {
		return c.Read(p)
	}
	x := rc.x
	op := &x.r
	op.p, op.n, op.err, op.eof = p, 0, nil, false
	err := x.wait(x.try)
	if err == nil {
		err = op.err
	}
	n, eof := op.n, op.eof
	op.p = nil
	switch {
	case err == syscall.EAGAIN:
		return 0, ErrWouldBlock
	case err != nil:
		return n, &net.OpError{Op: "read", Net: "tcp", Err: err}
	case eof:
		return 0, io.EOF
	}
	return n, nil
}

// tryRead is TryRead's RawConn callback: one read, EAGAIN reported.
func (x *rawConn) tryRead(fd uintptr) bool {
	if x.readOnce(fd) {
		x.r.err = syscall.EAGAIN
	}
	return true
}

// AwaitEdge blocks until c turns readable, trusting the poller once it
// parked. It consumes nothing: it looks at c (one peek) and returns if a
// read would not wait; otherwise it parks until the runtime's poller
// reports c readable (data, the end of the stream or an error), the read
// deadline passes or c is closed, and returns without looking again. The poller may report bytes a read took
// before the peek (its edge delivered late), so AwaitEdge may return with
// nothing to read: callers read with TryRead, which says ErrWouldBlock,
// and wait again. A relay saves a system call per message over a wait
// that peeks once more when woken, and holds no buffer while it waits:
// thousands of idle streams pin no buffers. Read deadlines apply as to a
// read, and a deadline that passes returns its error. Connections without
// raw access (TLS) return nil at once; their caller reads as usual.
//
// It cannot skip the first look: the poller's readiness is reset before
// the callback runs (internal/poll's prepareRead), so an edge for bytes
// that arrived before the wait began is forgotten, and only a look finds
// them.
func AwaitEdge(c net.Conn) error {
	rc, ok := c.(*Conn)
	if !ok || rc.x == nil {
		return nil
	}
	if err := rc.x.wait(rc.x.edge); err != nil {
		return &net.OpError{Op: "read", Net: "tcp", Err: err}
	}
	return nil
}

// awaitEdge is AwaitEdge's RawConn callback: a peek on its first call,
// true once the poller woke it.
func (x *rawConn) awaitEdge(fd uintptr) bool {
	if x.edged {
		return true
	}
	x.edged = true
	return x.ready(fd)
}
