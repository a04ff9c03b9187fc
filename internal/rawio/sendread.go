package rawio

import (
	"errors"
	"net"
)

// ErrNotQuiet is SendRead's answer, with nothing sent, when the
// connection was not quiet before the send: the peer had sent bytes, or
// closed or reset it (see Readable).
var ErrNotQuiet = errors.New("rawio: connection not quiet before the send")

// SendRead writes send whole, then reads into p what the peer answers, as
// Read would (same deadline, same errors). sent reports whether all of
// send went out; when it is false, err is the write's error, or
// ErrNotQuiet, and nothing was read. With quiet, c must be quiet before
// the send (NotQuiet: one peek, as Readable): a pooled connection whose
// peer closed it while idle, or sent bytes nobody asked for, gets
// ErrNotQuiet and carries nothing.
//
// Why: a request's answer is almost never there right after the request
// went out, so a peek, a Write and then a Read pay a read(2) that finds
// nothing (EAGAIN) before the goroutine parks. Here the peek and the
// write run inside the read's wait, after the poller's readiness for c
// was reset (internal/poll's prepareRead): the peek found c empty, so
// every byte there arrives after the reset and its edge is kept, and the
// wait parks without that look; the read after the wake-up finds the
// answer. Without quiet nothing says c was empty before the reset, and
// the wait looks first, as Read's. A send that does not fit in the socket's
// buffer at once goes on as a Write (waiting for room, under the write
// deadline) and the read as a Read. Connections without raw access (TLS)
// write and then read.
func SendRead(c net.Conn, send, p []byte, quiet bool) (n int, sent bool, err error) {
	rc, ok := c.(*Conn)
	if !ok || rc.x == nil || len(p) == 0 {
		if quiet && NotQuiet(c) {
			return 0, false, ErrNotQuiet
		}
		if _, err := c.Write(send); err != nil {
			return 0, false, err
		}
		n, err = c.Read(p)
		return n, true, err
	}
	x := rc.x
	s, w := &x.send, &x.w // the send is the write op's: nothing else writes c meanwhile
	s.quiet, s.notQuiet, s.done = quiet, false, false
	w.p, w.n, w.err = send, 0, nil
	op := &x.r
	op.p, op.n, op.err, op.eof = p, 0, nil, false
	err = x.wait(x.sendFn)
	done, rest, werr := s.done, w.p[w.n:], w.err
	w.p, w.err = nil, nil
	if !done {
		op.p = nil
		switch {
		case s.notQuiet:
			return 0, false, ErrNotQuiet
		case werr != nil:
			return 0, false, &net.OpError{Op: "write", Net: "tcp", Err: werr}
		case err != nil:
			// The wait ended before the send: the read deadline had
			// passed, or c was closed.
			return 0, false, &net.OpError{Op: "write", Net: "tcp", Err: err}
		}
		// Out of room in the send buffer: the rest waits as a Write does.
		if _, err := rc.w.Write(rest); err != nil {
			return 0, false, err
		}
		n, err = rc.r.Read(p)
		return n, true, err
	}
	n, err = x.readDone(err)
	return n, true, err
}

// sendOp is SendRead's state beside the write op that carries its bytes:
// whether c must be found quiet first, whether it was not, and done once
// all of the send went out.
type sendOp struct {
	quiet, notQuiet, done bool
}

// sendRead is SendRead's RawConn callback. Its first call (the poller's
// readiness was just reset) checks c is quiet if asked, writes the send
// and, when c was found quiet, parks without a look; every later call is
// a read, as Read's.
func (x *rawConn) sendRead(fd uintptr) bool {
	s := &x.send
	if s.done {
		return x.read(fd)
	}
	if s.quiet && x.w.n == 0 && peekFD(fd, &x.one[0]) != peekNothing {
		s.notQuiet = true
		return true
	}
	if !x.write(fd) || x.w.err != nil {
		return true // out of room (SendRead writes the rest as a Write), or failed
	}
	s.done = true
	if !s.quiet {
		// Bytes may have come before the wait began; only a look finds
		// them (see AwaitEdge).
		return x.read(fd)
	}
	return x.parkable()
}
