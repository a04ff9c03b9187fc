package server

import (
	"errors"
	"log/slog"
	"net"
	"os"
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
	l := patientListener{Listener: &scriptedListener{errs: []error{opErr(syscall.EPERM), opErr(syscall.EPROTO), opErr(syscall.ECONNABORTED)}, conn: a},
		log: slog.New(slog.DiscardHandler)}
	c, err := l.Accept()
	if err != nil || c != a {
		t.Fatalf("unexpected accept after errors about single connections; got %v, %v; want the next connection", c, err)
	}
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("unexpected accept on a closed listener; got %v; want net.ErrClosed", err)
	}
}
