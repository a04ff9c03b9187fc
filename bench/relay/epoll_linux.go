package relay

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"syscall"
	"unsafe"
)

// serveEpoll is the Epoll shape: o.Loops event loops, each on a thread of
// its own with its own SO_REUSEPORT listener and edge-triggered epoll set
// (nginx's workers, in Go). A read that comes back short is taken to have
// drained the socket, and the loop waits for the next edge rather than
// reading again to see EAGAIN, as nginx does.
func serveEpoll(ctx context.Context, o Options) error {
	lis := make([]int, 0, o.Loops)
	defer func() {
		for _, fd := range lis {
			syscall.Close(fd)
		}
	}()
	ap, err := netip.ParseAddrPort(o.Listen)
	if err != nil {
		return fmt.Errorf("relay: listen address %q: %w", o.Listen, err)
	}
	for i := 0; i < o.Loops; i++ {
		fd, port, err := listenReusePort(ap)
		if err != nil {
			return err
		}
		lis = append(lis, fd)
		ap = netip.AddrPortFrom(ap.Addr(), port) // the rest bind the first's port
	}
	ups := make([]netip.AddrPort, 0, len(o.Upstreams))
	for _, u := range o.Upstreams {
		up, err := netip.ParseAddrPort(u)
		if err != nil || !up.Addr().Is4() {
			return fmt.Errorf("relay: upstream %q: want an IPv4 host:port", u)
		}
		ups = append(ups, up)
	}
	if o.Ready != nil {
		o.Ready(ap.String())
	}
	errs := make([]error, len(lis))
	var wg sync.WaitGroup
	for i, fd := range lis {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = runLoop(ctx, fd, ups, i)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func listenReusePort(ap netip.AddrPort) (int, uint16, error) {
	if !ap.Addr().Is4() {
		return -1, 0, fmt.Errorf("relay: listen address %s: want IPv4", ap)
	}
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, 0, fmt.Errorf("relay: socket: %w", err)
	}
	const soReusePort = 0xf
	for _, opt := range []int{syscall.SO_REUSEADDR, soReusePort} {
		if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, opt, 1); err != nil {
			syscall.Close(fd)
			return -1, 0, fmt.Errorf("relay: setsockopt: %w", err)
		}
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}); err != nil {
		syscall.Close(fd)
		return -1, 0, fmt.Errorf("relay: bind %s: %w", ap, err)
	}
	if err := syscall.Listen(fd, 4096); err != nil {
		syscall.Close(fd)
		return -1, 0, fmt.Errorf("relay: listen %s: %w", ap, err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		syscall.Close(fd)
		return -1, 0, fmt.Errorf("relay: getsockname: %w", err)
	}
	return fd, uint16(sa.(*syscall.SockaddrInet4).Port), nil
}

// econn is one client connection and its backend connection.
type econn struct {
	cfd, ufd int
	in, out  []byte
	n, o     int  // bytes held in in and out
	busy     bool // a request went to the backend; its answer is due
}

// loop is one event loop's state.
type loop struct {
	ep    int
	lfd   int
	ups   []syscall.Sockaddr
	turn  int
	conns []*econn // by descriptor, either side
}

const epollET = 1 << 31 // EPOLLET, negative as an int32 in package syscall

func runLoop(ctx context.Context, lfd int, upstreams []netip.AddrPort, turn int) error {
	// The loop owns a thread, as an nginx worker owns a process.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	ep, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return fmt.Errorf("relay: epoll_create1: %w", err)
	}
	defer syscall.Close(ep)
	// Each loop its own addresses: syscall.Connect writes into one.
	ups := make([]syscall.Sockaddr, len(upstreams))
	for i, up := range upstreams {
		ups[i] = &syscall.SockaddrInet4{Port: int(up.Port()), Addr: up.Addr().As4()}
	}
	l := &loop{ep: ep, lfd: lfd, ups: ups, turn: turn}
	defer l.closeAll()
	if err := l.add(lfd, syscall.EPOLLIN); err != nil {
		return err
	}
	events := make([]syscall.EpollEvent, 256)
	for ctx.Err() == nil {
		// A bounded wait, so that the loop sees ctx end.
		n, err := syscall.EpollWait(ep, events, 50)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("relay: epoll_wait: %w", err)
		}
		for _, ev := range events[:n] {
			fd := int(ev.Fd)
			if fd == lfd {
				l.accept()
				continue
			}
			if fd >= len(l.conns) || l.conns[fd] == nil {
				continue // closed earlier in this batch
			}
			c := l.conns[fd]
			var err error
			switch {
			case ev.Events&(syscall.EPOLLERR|syscall.EPOLLHUP) != 0:
				err = errClosed
			case fd == c.cfd:
				err = l.fromClient(c)
			default:
				err = l.fromBackend(c)
			}
			if err != nil {
				l.close(c)
			}
		}
	}
	return nil
}

var errClosed = errors.New("relay: closed")

func (l *loop) add(fd int, events uint32) error {
	ev := syscall.EpollEvent{Events: events, Fd: int32(fd)}
	if err := syscall.EpollCtl(l.ep, syscall.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return fmt.Errorf("relay: epoll_ctl: %w", err)
	}
	return nil
}

func (l *loop) accept() {
	for {
		cfd, _, err := syscall.Accept4(l.lfd, syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC)
		if err != nil {
			return // EAGAIN: accepted all there were
		}
		c, err := l.open(cfd)
		if err != nil {
			syscall.Close(cfd)
			continue
		}
		if l.fromClient(c) != nil { // bytes may have come with the handshake
			l.close(c)
		}
	}
}

// open connects cfd's backend connection (a blocking connect over
// loopback, then non-blocking) and watches both.
func (l *loop) open(cfd int) (*econn, error) {
	ufd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	l.turn++
	if err := syscall.Connect(ufd, l.ups[l.turn%len(l.ups)]); err != nil {
		syscall.Close(ufd)
		return nil, err
	}
	if err := syscall.SetNonblock(ufd, true); err != nil {
		syscall.Close(ufd)
		return nil, err
	}
	for _, fd := range []int{cfd, ufd} {
		_ = syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
	}
	c := &econn{cfd: cfd, ufd: ufd, in: make([]byte, bufSize), out: make([]byte, bufSize)}
	for _, fd := range []int{cfd, ufd} {
		for fd >= len(l.conns) {
			l.conns = append(l.conns, nil)
		}
		l.conns[fd] = c
		if err := l.add(fd, syscall.EPOLLIN|syscall.EPOLLRDHUP|epollET); err != nil {
			l.conns[cfd], l.conns[ufd] = nil, nil
			syscall.Close(ufd)
			return nil, err
		}
	}
	return c, nil
}

func (l *loop) close(c *econn) {
	l.conns[c.cfd], l.conns[c.ufd] = nil, nil
	syscall.Close(c.cfd) // closing drops them from the epoll set
	syscall.Close(c.ufd)
}

func (l *loop) closeAll() {
	for _, c := range l.conns {
		if c != nil {
			l.close(c)
		}
	}
}

// fromClient reads what the client sent (edge-triggered: until a short
// read or EAGAIN) and sends a complete request on.
func (l *loop) fromClient(c *econn) error {
	var err error
	if c.n, err = drain(c.cfd, c.in, c.n); err != nil {
		return err
	}
	return l.send(c)
}

// send writes the next complete request to the backend, unless one is
// already there.
func (l *loop) send(c *econn) error {
	if c.busy {
		return nil
	}
	he := headEnd(c.in[:c.n])
	if he < 0 {
		if c.n == len(c.in) {
			return errTooLarge
		}
		return nil
	}
	if err := requestHead(c.in[:he]); err != nil {
		return err
	}
	if w, errno := rawWrite(c.ufd, c.in[:he]); errno != 0 || w != he {
		return errClosed // a backend that cannot take a small head at once
	}
	c.n = copy(c.in, c.in[he:c.n])
	c.busy = true
	return nil
}

// fromBackend reads the answer and, once it is whole, writes it to the
// client and sends the next request if one is waiting.
func (l *loop) fromBackend(c *econn) error {
	var err error
	if c.o, err = drain(c.ufd, c.out, c.o); err != nil {
		return err
	}
	if c.o == 0 {
		return nil
	}
	if !c.busy {
		return errors.New("relay: an answer nobody asked for")
	}
	n, err := answerLen(c.out[:c.o])
	if err != nil || n < 0 {
		return err
	}
	if n != c.o {
		return errors.New("relay: bytes after the answer")
	}
	if w, errno := rawWrite(c.cfd, c.out[:n]); errno != 0 || w != n {
		return errClosed // a client that cannot take a small answer at once
	}
	c.o, c.busy = 0, false
	return l.send(c)
}

// drain reads fd into buf after its first n bytes until a read comes
// back short (the socket is drained: nginx's rule), EAGAIN or buf is
// full, and returns the bytes now held.
func drain(fd int, buf []byte, n int) (int, error) {
	for n < len(buf) {
		m, errno := rawRead(fd, buf[n:])
		if errno == syscall.EAGAIN {
			break
		}
		if errno != 0 || m == 0 {
			return n, errClosed
		}
		short := m < len(buf)-n
		n += m
		if short {
			break
		}
	}
	return n, nil
}

// rawRead and rawWrite are read(2) and write(2) on non-blocking sockets:
// they never block, so the loop's thread need not tell the runtime it
// enters a system call.
func rawRead(fd int, b []byte) (int, syscall.Errno) {
	r, _, e := syscall.RawSyscall(syscall.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	return int(r), e
}

func rawWrite(fd int, b []byte) (int, syscall.Errno) {
	r, _, e := syscall.RawSyscall(syscall.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	return int(r), e
}
