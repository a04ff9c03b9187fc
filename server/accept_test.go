package server

import (
	"errors"
	"log/slog"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
)

// scriptedListener answers Accept with its errors, one per call, then
// with conn, then with net.ErrClosed.
type scriptedListener struct {
	net.Listener
	errs []error
	conn net.Conn
}

func (l *scriptedListener) Accept() (net.Conn, error) {
	if len(l.errs) > 0 {
		err := l.errs[0]
		l.errs = l.errs[1:]
		return nil, err
	}
	if c := l.conn; c != nil {
		l.conn = nil
		return c, nil
	}
	return nil, net.ErrClosed
}

func (l *scriptedListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// An accept error about the one connection it took — refused by a
// security module (EPERM), a protocol error (EPROTO), aborted by its peer
// — is skipped and the next connection accepted: returned, it ended
// fasthttp's Serve and the node with every stream on it (R-SRV-1). The
// listener's own end (closed) still ends Accept.
func TestAcceptSkipsOneConnectionErrors_RSRV1(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	opErr := func(e syscall.Errno) error {
		return &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", e)}
	}
	l := newPatientListener(&scriptedListener{errs: []error{opErr(syscall.EPERM), opErr(syscall.EPROTO), opErr(syscall.ECONNABORTED)}, conn: a},
		slog.New(slog.DiscardHandler))
	c, err := l.Accept()
	if err != nil || c != a {
		t.Fatalf("unexpected accept after errors about single connections; got %v, %v; want the next connection", c, err)
	}
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("unexpected accept on a closed listener; got %v; want net.ErrClosed", err)
	}
}

// churnListener answers Accept with a descriptor shortage and a
// connection in turn, n times each: a node at its limit whose ending
// connections each let one more in.
type churnListener struct {
	net.Listener
	n    int
	conn net.Conn
	odd  bool
}

func (l *churnListener) Accept() (net.Conn, error) {
	if l.n == 0 {
		return nil, net.ErrClosed
	}
	if l.odd = !l.odd; l.odd {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	l.n--
	return l.conn, nil
}

func (l *churnListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// One descriptor shortage is logged once, however many connections end
// and let one more in while it lasts: before, every accept reset the
// warning, and a client churning connections at the limit wrote a line
// per connection (docs/OPERATIONS.md, "Listeners"; R-SRV-1).
func TestAcceptShortageLoggedOnce_RSRV1(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	var logs strings.Builder
	l := newPatientListener(&churnListener{n: 20, conn: a}, slog.New(slog.NewTextHandler(&logs, nil)))
	for range 20 {
		if c, err := l.Accept(); err != nil || c != a {
			t.Fatalf("unexpected accept; got %v, %v; want the connection after the shortage", c, err)
		}
	}
	if n := strings.Count(logs.String(), "cannot accept connections: out of resources"); n != 1 {
		t.Fatalf("unexpected warnings over one shortage of 20 accepts; got %d; want 1:\n%s", n, logs.String())
	}
}
