package rawio

import (
	"net"
	"syscall"
	"time"
)

// SetUserTimeout sets TCP_USER_TIMEOUT (RFC 5482, tcp(7)) on c's socket,
// also behind Wrap or TLS: the kernel drops the connection once data it
// sent has gone unacknowledged, or the peer's receive window has stayed
// shut, for d. A peer that answers keep-alive probes and reads what it is
// sent is never cut, however long it idles. d <= 0 leaves the kernel's
// default (retransmissions for some 15 minutes, a shut window probed for
// ever). Connections without a TCP socket are left as they are.
//
// Why: a write deadline bounds only a write that blocks, and a stream's
// small writes (events, WebSocket messages) fit in the socket's send
// buffer, autotuned up to megabytes, long before one does: a peer that
// stopped reading, or vanished without a FIN, held its stream, and the
// worker connection behind it, for that long.
func SetUserTimeout(c net.Conn, d time.Duration) {
	if d <= 0 {
		return
	}
	if nc, ok := c.(interface{ NetConn() net.Conn }); ok { // *tls.Conn
		c = nc.NetConn()
	}
	tc := TCP(c)
	if tc == nil {
		return
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return
	}
	ms := int(min(d.Milliseconds(), 1<<31-1))
	_ = raw.Control(func(fd uintptr) {
		_ = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, tcpUserTimeout, max(ms, 1))
	})
}

// tcpUserTimeout is Linux's TCP_USER_TIMEOUT (include/uapi/linux/tcp.h),
// which package syscall does not define.
const tcpUserTimeout = 18

// UserTimeoutListener is ln whose accepted connections carry
// SetUserTimeout(d); d <= 0 returns ln.
func UserTimeoutListener(ln net.Listener, d time.Duration) net.Listener {
	if d <= 0 {
		return ln
	}
	return userTimeoutListener{ln, d}
}

type userTimeoutListener struct {
	net.Listener
	d time.Duration
}

// Accept implements net.Listener.
func (l userTimeoutListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		SetUserTimeout(c, l.d)
	}
	return c, err
}
