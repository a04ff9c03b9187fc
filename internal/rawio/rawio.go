// Package rawio gives TCP connections raw read(2) and write(2): the
// calling goroutine keeps its P instead of entering the scheduler's
// syscall state (see Conn); and a server's connections a lingering close
// (see Linger).
package rawio

import (
	"io"
	"net"
	"syscall"
	"unsafe"
)

// rawConn reads and writes a connection with read(2) and write(2) as raw
// system calls: the goroutine keeps its P for the call instead of
// entering the scheduler's syscall state. The socket is non-blocking, so a
// call never waits: a read with nothing to read or a write with a full
// send buffer returns EAGAIN at once, and the runtime's poller parks the
// goroutine just as net.Conn does (deadlines apply the same way, through
// syscall.RawConn).
//
// Why: on loopback a write runs the receiver's whole TCP input path and
// wake-up inside the call, often past the 20 µs after which the runtime's
// sysmon takes the P of a goroutine in a system call, hands it to another
// thread and wakes that thread; sysmon then stays at its fastest tick. On
// a busy node that costs context switches on every request: measured on
// the bench machine with pinboard's worker connections, futex and
// nanosleep calls per request fell by half and context switches by a
// fifth with raw calls (docs/bench/HISTORY.md).
//
// Reads and writes may run concurrently (a streamed upload writes while
// the response is read); each direction is used by one goroutine at a time.
type rawConn struct {
	rc syscall.RawConn
	tc *net.TCPConn
	r  rawOp
	w  rawOp
	rd readDeadline
	// edge and edged serve AwaitEdge: the bound callback and whether it
	// has run once in the current wait. try serves TryRead. peekFn and
	// peeked serve Readable and PeerClosed. one is the byte MSG_PEEK
	// copies into (it is never read). A connection's reader calls them
	// (the relay or the pool), one at a time.
	edge  func(fd uintptr) bool
	edged bool
	// rearm is set by a callback that found nothing while the read
	// deadline must be armed before the read parks (parkable).
	rearm bool
	try   func(fd uintptr) bool
	// send and sendFn serve SendRead, whose bytes go out through the
	// write op w (write) before its read.
	send   sendOp
	sendFn func(fd uintptr) bool
	peekFn func(fd uintptr)
	peeked peekState
	one    [1]byte
}

// rawOp is one direction's state. fn is bound once, so no call allocates
// a closure.
type rawOp struct {
	fn  func(fd uintptr) bool
	p   []byte
	n   int
	err error
	eof bool
}

// rawReader and rawWriter are the two directions of a rawConn.
type (
	rawReader struct{ *rawConn }
	rawWriter struct{ *rawConn }
)

// newRawConn returns a raw reader and writer for tc, or tc itself for
// both when it has no raw access.
func newRawConn(tc *net.TCPConn) (io.Reader, io.Writer) {
	rc, err := tc.SyscallConn()
	if err != nil {
		return tc, tc
	}
	x := &rawConn{rc: rc, tc: tc}
	x.rd.set.Store(noDeadline)
	x.rd.want.Store(noDeadline)
	x.r.fn = x.read
	x.w.fn = x.write
	x.edge = x.awaitEdge
	x.try = x.tryRead
	x.sendFn = x.sendRead
	x.peekFn = func(fd uintptr) { x.peeked = peekFD(fd, &x.one[0]) }
	return rawReader{x}, rawWriter{x}
}

// Read implements io.Reader: what one read(2) returns once data is there.
func (r rawReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	op := &r.r
	op.p, op.n, op.err, op.eof = p, 0, nil, false
	return r.readDone(r.wait(op.fn))
}

// readDone ends a read whose wait returned err: what the pending op read,
// as net.Conn's Read reports it.
func (x *rawConn) readDone(err error) (int, error) {
	op := &x.r
	if err == nil {
		err = op.err
	}
	n, eof := op.n, op.eof
	op.p = nil
	switch {
	case err != nil:
		return n, &net.OpError{Op: "read", Net: "tcp", Err: err}
	case eof:
		return 0, io.EOF
	}
	return n, nil
}

// read is the RawConn read callback; false waits for data.
func (x *rawConn) read(fd uintptr) bool {
	if x.readOnce(fd) {
		return x.parkable()
	}
	return true
}

// readOnce is one read(2) into the pending op; true when it found nothing
// (EAGAIN).
func (x *rawConn) readOnce(fd uintptr) bool {
	op := &x.r
	for {
		m, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&op.p[0])), uintptr(len(op.p)))
		switch {
		case e == syscall.EINTR:
			continue
		case e == syscall.EAGAIN:
			return true
		case e != 0:
			op.err = e
		case m == 0:
			op.eof = true
		default:
			op.n = int(m)
		}
		return false
	}
}

// parkable runs in a read callback that found nothing: false lets the
// poller park the read; true ends the callback's RawConn.Read first, to
// arm the read deadline in wait (rearm) and look again — arming takes the
// runtime's timer code, which is not run this deep in the stack (see
// wait).
func (x *rawConn) parkable() bool {
	if x.rd.due() {
		x.rearm = true
		return true
	}
	return false
}

// Write implements io.Writer: all of p, waiting for room as needed.
func (w rawWriter) Write(p []byte) (int, error) {
	op := &w.w
	op.p, op.n, op.err = p, 0, nil
	err := w.rc.Write(op.fn)
	if err == nil {
		err = op.err
	}
	n := op.n
	op.p = nil
	if err != nil {
		return n, &net.OpError{Op: "write", Net: "tcp", Err: err}
	}
	return n, nil
}

// write is the RawConn write callback; false waits for room.
func (x *rawConn) write(fd uintptr) bool {
	op := &x.w
	for op.n < len(op.p) {
		m, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&op.p[op.n])), uintptr(len(op.p)-op.n))
		switch {
		case e == syscall.EINTR:
			continue
		case e == syscall.EAGAIN:
			return false
		case e != 0:
			op.err = e
			return true
		}
		op.n += int(m)
	}
	return true
}
