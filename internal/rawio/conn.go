package rawio

import (
	"io"
	"net"
	"sync/atomic"
	"time"
)

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
// time, is re-armed about once a second (docs/bench/HISTORY.md).
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
