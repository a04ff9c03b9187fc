// Package rawio gives TCP connections raw read(2) and write(2): the
// calling goroutine keeps its P instead of entering the scheduler's
// syscall state (see Conn); and a server's connections a lingering close
// (see Linger).
package rawio

import (
	"errors"
	"io"
	"math"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
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
// fifth with raw calls (BENCHMARKS.md).
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

// Listener wraps a TCP listener so that the connections it accepts are
// raw (Wrap). Measured on the bench machine at a constant 4,000 req/s
// through pinboard, wrapping the data-plane listener took sysmon's
// nanosleep calls from 0.8 to 0.04 per request, context switches from
// about 2.8 to 1.5 and pinboard's CPU per request down about 20%.
func Listener(ln net.Listener) net.Listener { return listener{ln, nil} }

type listener struct {
	net.Listener
	linger *Linger // nil: connections close at once
}

// Accept implements net.Listener.
func (l listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return c, err
	}
	c = Wrap(c)
	if rc, ok := c.(*Conn); ok && l.linger != nil {
		rc.linger.Store(l.linger)
	}
	return c, nil
}

// Conn is a *net.TCPConn whose Read and Write are raw system calls. Every
// other method (deadlines, CloseWrite, addresses) is the TCPConn's.
// Deadlines apply to raw reads and writes as to the originals.
type Conn struct {
	*net.TCPConn
	r io.Reader
	w io.Writer
	// x is the raw side of r and w, nil without raw access: its read
	// deadline is kept lazily (SetReadDeadline).
	x *rawConn
	// wdl is the write deadline last set (unix ns; 0: none), for
	// KeepWriteDeadline.
	wdl atomic.Int64
	// linger closes c lingering (Linger); nil: at once. parked holds it
	// while NoLinger has taken it (Relinger).
	linger atomic.Pointer[Linger]
	parked atomic.Pointer[Linger]
	// moreInput: the client may still be sending (MoreInput).
	moreInput atomic.Bool
}

// SetWriteDeadline implements net.Conn, remembering t for
// KeepWriteDeadline.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	c.wdl.Store(unixNano(t))
	return c.TCPConn.SetWriteDeadline(t)
}

// SetDeadline implements net.Conn, remembering t for KeepWriteDeadline;
// its read half is kept lazily like SetReadDeadline's.
func (c *Conn) SetDeadline(t time.Time) error {
	if c.x == nil {
		c.wdl.Store(unixNano(t))
		return c.TCPConn.SetDeadline(t)
	}
	if err := c.SetWriteDeadline(t); err != nil {
		return err
	}
	return c.SetReadDeadline(t)
}

// SetReadDeadline implements net.Conn with the same meaning, kept lazily:
// the deadline reaches the runtime's poller (a timer operation) only when
// a read is about to wait for data, or at once if it is earlier than the
// one armed while a read is waiting. Reads honour it exactly: one that
// starts after it passed fails as net.Conn's would, and one woken by an
// earlier deadline armed before it continues.
//
// Why: fasthttp's connection loop sets a read deadline three times per
// request (idle, header, body), each a runtime timer operation: 1 % of
// the CPU of server.BenchmarkNodeHotPath (node, clients and stand-in
// worker together) on the bench machine, none once kept lazily. A
// keep-alive client's requests usually arrive whole, so only the idle
// wait for the next one ever waits, and its deadline, about the same each
// time, is re-armed about once a second (BENCHMARKS.md).
func (c *Conn) SetReadDeadline(t time.Time) error {
	if c.x == nil {
		return c.TCPConn.SetReadDeadline(t)
	}
	return c.x.rd.store(c.x.tc, t)
}

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// KeepWriteDeadline keeps c's write deadline about d ahead of now, so that
// a peer that stops reading is cut about d after the last write that was
// due: on a *Conn it is set only once it drifted by more than
// min(1s, d/10) — a busy connection pays a runtime timer operation about
// once a second instead of once per response. Other connections get it
// set on every call. d ≤ 0 or a nil c does nothing.
func KeepWriteDeadline(c net.Conn, now time.Time, d time.Duration) {
	if d <= 0 || c == nil {
		return
	}
	if rc, ok := c.(*Conn); ok {
		rc.KeepWriteDeadline(now, d)
		return
	}
	_ = c.SetWriteDeadline(now.Add(d))
}

// KeepWriteDeadline is the package function for a *Conn, whose caller
// knows it has one.
func (c *Conn) KeepWriteDeadline(now time.Time, d time.Duration) {
	if d <= 0 {
		return
	}
	var last time.Time
	if at := c.wdl.Load(); at != 0 {
		last = time.Unix(0, at)
	}
	if DeadlineDue(last, now, d) {
		_ = c.SetWriteDeadline(now.Add(d))
	}
}

// DeadlineDue reports whether a deadline kept about d ahead of now, last
// set to last (zero: none), is due for renewal: once it has drifted by more
// than a slack of min(1s, d/10). Such a deadline fires between d minus the
// slack and d after the last renewal that was due, and costs a runtime
// timer operation about once a second on a busy connection instead of
// once per request or chunk. The one rule for every lazily kept deadline
// (KeepWriteDeadline, the proxy's lazyDeadline).
func DeadlineDue(last, now time.Time, d time.Duration) bool {
	return last.Before(now.Add(d - min(time.Second, d/10)))
}

// Wrap returns c as a *Conn when it is a *net.TCPConn, and c otherwise
// (TLS, pipes).
func Wrap(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	r, w := newRawConn(tc)
	rc := &Conn{TCPConn: tc, r: r, w: w}
	if rr, ok := r.(rawReader); ok {
		rc.x = rr.rawConn
	}
	return rc
}

// TCP returns the *net.TCPConn of c, also behind Wrap, or nil.
func TCP(c net.Conn) *net.TCPConn {
	switch c := c.(type) {
	case *net.TCPConn:
		return c
	case *Conn:
		return c.TCPConn
	}
	return nil
}

// Read implements net.Conn.
func (c *Conn) Read(p []byte) (int, error) { return c.r.Read(p) }

// Write implements net.Conn.
func (c *Conn) Write(p []byte) (int, error) { return c.w.Write(p) }

// WriteTo implements io.WriterTo through Read. The embedded TCPConn's
// would be promoted, and io.Copy from c would read the socket itself:
// past a read deadline kept lazily and not armed yet, and without the raw
// reads.
func (c *Conn) WriteTo(w io.Writer) (int64, error) {
	return io.Copy(w, struct{ io.Reader }{c})
}

// Readable reports whether a read on c would return at once — the peer
// closed c or reset it, or sent data — without waiting and without
// consuming anything: one recv(2) with MSG_PEEK and MSG_DONTWAIT. For a
// pooled connection idle between requests each means it cannot carry
// another: bytes no request asked for would be read as the next one's
// answer (nginx closes an idle upstream connection that turns readable).
// A connection that passes may still be closed an instant later; one that
// fails surely is unusable. Connections without a socket (TLS, pipes)
// report false.
func Readable(c net.Conn) bool {
	st := peek(c)
	return st != peekNothing && st != peekNone
}

// NotQuiet reports whether a pooled connection idle between requests
// cannot carry another: Readable, or, for a TLS connection (which has no
// socket to peek at, and whose peer may send records nobody asked for
// on an idle connection: session tickets), its peer closed or reset the
// socket under it (tlsPeerGone). A TLS connection whose peer sent unasked
// bytes is not caught.
func NotQuiet(c net.Conn) bool {
	return Readable(c) || tlsPeerGone(c)
}

// tlsPeerGone reports whether c exposes its transport (as *tls.Conn's
// NetConn does), a TCP socket that is no longer established: the peer
// sent its FIN (CLOSE_WAIT) or a reset. One getsockopt(TCP_INFO); a peek
// would see a close_notify record as data. Other connections report
// false.
func tlsPeerGone(c net.Conn) bool {
	nc, ok := c.(interface{ NetConn() net.Conn })
	if !ok {
		return false
	}
	return notEstablished(TCP(nc.NetConn()))
}

// notEstablished reports whether tc (nil: none) is a TCP socket that is no
// longer established: its peer sent its FIN (CLOSE_WAIT) or a reset
// (CLOSE). One getsockopt(TCP_INFO).
func notEstablished(tc *net.TCPConn) bool {
	if tc == nil {
		return false
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return false
	}
	var info syscall.TCPInfo
	state, ok := uint8(0), false
	_ = raw.Control(func(fd uintptr) {
		n := uint32(unsafe.Sizeof(info))
		_, _, e := syscall.RawSyscall6(syscall.SYS_GETSOCKOPT, fd, syscall.IPPROTO_TCP, syscall.TCP_INFO,
			uintptr(unsafe.Pointer(&info)), uintptr(unsafe.Pointer(&n)), 0)
		state, ok = info.State, e == 0 && n >= 1
	})
	return ok && state != tcpEstablished
}

// tcpEstablished is Linux's TCP_ESTABLISHED (include/net/tcp_states.h).
const tcpEstablished = 1

// PeerClosed reports whether the peer has closed c or reset it, by the
// same one peek as Readable; data waiting is not a close. Connections
// without a socket report false.
func PeerClosed(c net.Conn) bool {
	st := peek(c)
	return st == peekClosed || st == peekError
}

// PeerGone is PeerClosed, except that data waiting does not hide a close
// behind it: with bytes unread, the socket's state says whether the peer
// sent its FIN or a reset after them (notEstablished). For a connection
// whose waiting bytes are not the caller's to read — a client's pipelined
// request or junk while its answer streams — whose peer would otherwise
// read as "still there" at every check once it sent one byte more and
// left. Connections without a socket report false.
func PeerGone(c net.Conn) bool {
	switch peek(c) {
	case peekClosed, peekError:
		return true
	case peekData:
		return notEstablished(TCP(c))
	}
	return false
}

// peekState is what one MSG_PEEK found.
type peekState uint8

const (
	peekNone    peekState = iota // no socket to peek at
	peekNothing                  // EAGAIN: nothing yet
	peekData                     // bytes waiting
	peekClosed                   // FIN
	peekError                    // ECONNRESET and the like
)

// peek looks at c's receive queue. Control, not Read: no poller state and
// no deadline check (a pooled connection's last read deadline may have
// passed while it was idle). A *Conn uses its RawConn and bound callback:
// no SyscallConn per call.
func peek(c net.Conn) peekState {
	if rc, ok := c.(*Conn); ok {
		if r, ok := rc.r.(rawReader); ok {
			x := r.rawConn
			if x.rc.Control(x.peekFn) != nil {
				return peekNone
			}
			return x.peeked
		}
	}
	return peekTCP(TCP(c))
}

// peekTCP is peek on a TCP connection (nil: none) into a byte of its own,
// without a *Conn's shared peek state: safe beside a read.
func peekTCP(tc *net.TCPConn) peekState {
	if tc == nil {
		return peekNone
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return peekNone
	}
	var b [1]byte
	st := peekNone
	_ = raw.Control(func(fd uintptr) { st = peekFD(fd, &b[0]) })
	return st
}

// peekFD is one recv(2) of a byte into b with MSG_PEEK and MSG_DONTWAIT.
func peekFD(fd uintptr, b *byte) peekState {
	for {
		n, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(b)), 1,
			syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
		switch {
		case e == syscall.EINTR:
			continue
		case e == syscall.EAGAIN:
			return peekNothing
		case e != 0:
			return peekError
		case n == 0:
			return peekClosed
		}
		return peekData
	}
}

// noDeadline stands for "none" in readDeadline, so that every deadline
// compares as a point in time.
const noDeadline = math.MaxInt64

// readDeadline is a raw connection's read deadline, kept lazily
// (Conn.SetReadDeadline). want is the deadline the caller set; set is the
// one armed in the poller. Both are unix nanoseconds, noDeadline for none.
type readDeadline struct {
	want atomic.Int64
	set  atomic.Int64
	// reading is true while a read or AwaitEdge runs: a deadline
	// earlier than the armed one must then be armed at once, since the
	// read may be parked on the armed one.
	reading atomic.Bool
	mu      sync.Mutex // serialises arming: set follows the latest want
}

// store records t as wanted, and arms it when a read runs and it is
// earlier than the armed one. The order — want stored, then reading
// loaded; reading stored, then want loaded in settle — makes sure that a
// read parked or about to park sees an earlier deadline one way or the
// other.
func (d *readDeadline) store(tc *net.TCPConn, t time.Time) error {
	w := int64(noDeadline)
	if !t.IsZero() {
		w = t.UnixNano()
	}
	d.want.Store(w)
	if d.reading.Load() && w < d.set.Load() {
		return d.arm(tc)
	}
	return nil
}

// arm gives the poller the wanted deadline.
func (d *readDeadline) arm(tc *net.TCPConn) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	w := d.want.Load()
	if w == d.set.Load() {
		return nil
	}
	t := time.Time{}
	if w != noDeadline {
		t = time.Unix(0, w)
	}
	if err := tc.SetReadDeadline(t); err != nil {
		return err
	}
	d.set.Store(w)
	return nil
}

// due reports, when a read is about to park, whether the wanted deadline
// must be armed first: an earlier one than the armed one always, a later
// one only once it drifted by more than a slack of min(1s, a tenth of the
// time left) — parked on the earlier one, the read is woken early and
// wait parks it again on the right one.
func (d *readDeadline) due() bool {
	w, s := d.want.Load(), d.set.Load()
	switch {
	case w == s:
		return false
	case w < s, s == noDeadline || w == noDeadline:
		return true
	}
	return w-s > min(int64(time.Second), (w-time.Now().UnixNano())/10)
}

// errTimeout is what a read whose deadline passed returns, as net.Conn's.
var errTimeout error = os.ErrDeadlineExceeded

// wait runs fn as a RawConn read callback under the wanted deadline.
//
// Relays park here for hours, thousands at once, and the collector shrinks
// a parked goroutine's stack only while it uses under a quarter of it: the
// deepest the stack ever went decides whether an idle stream's goroutine
// keeps 2 KiB or 4 (BenchmarkIdleSSEStreamMemory). So the rare cases are
// in waitSlow, and a deadline is armed here, not in the callback, where
// the runtime's timer code would run under RawConn.Read's frames.
func (x *rawConn) wait(fn func(fd uintptr) bool) error {
	d := &x.rd
	d.reading.Store(true)
	var err error
	x.edged = false // each wait of AwaitEdge looks first
	if d.want.Load() < d.set.Load() {
		err = x.waitSlow(fn, nil)
	} else if err = x.rc.Read(fn); err != nil || x.rearm {
		err = x.waitSlow(fn, err)
	}
	d.reading.Store(false)
	return err
}

// waitSlow is wait when the wanted deadline is earlier than the armed one
// (first nil), when a callback asked for the deadline to be armed
// (rearm), or once a read under the armed one ended with first.
//
//go:noinline
func (x *rawConn) waitSlow(fn func(fd uintptr) bool, first error) error {
	d := &x.rd
	err := first
	for {
		if x.rearm {
			x.rearm = false
			if err := d.arm(x.tc); err != nil {
				return err
			}
			err = nil
		} else if err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				return err
			}
			// Woken by an armed deadline earlier than the wanted one:
			// wait on, under the wanted one, unless it passed as well.
			w := d.want.Load()
			if w <= d.set.Load() || w <= time.Now().UnixNano() {
				return err
			}
			if err := d.arm(x.tc); err != nil {
				return err
			}
			err = nil
		}
		// A deadline earlier than the armed one that already passed
		// fails the read before it starts, as the poller would.
		if w := d.want.Load(); w < d.set.Load() && w <= time.Now().UnixNano() {
			return errTimeout
		}
		x.edged = false
		if err = x.rc.Read(fn); err == nil && !x.rearm {
			return nil
		}
	}
}
