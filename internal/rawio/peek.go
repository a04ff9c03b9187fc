package rawio

import (
	"net"
	"syscall"
	"unsafe"
)

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
