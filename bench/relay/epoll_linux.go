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
	started := false
	defer func() {
		if !started { // once started, each loop closes its own
			for _, fd := range lis {
				syscall.Close(fd)
			}
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
	// A loop that fails stops the others: a listener left open behind a
	// loop that no longer accepts would hold its share of new connections
	// in its backlog.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, len(lis))
	var wg sync.WaitGroup
	started = true
	for i, fd := range lis {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if errs[i] = runLoop(ctx, fd, ups, i); errs[i] != nil {
				cancel()
			}
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
	// inFull: the last read of the client stopped because in was full,
	// not because the socket was drained; no edge will come for what is
	// left, so it is read once send makes room.
	inFull bool
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

// runLoop serves lfd's connections until ctx ends or the loop fails, and
// closes lfd.
func runLoop(ctx context.Context, lfd int, upstreams []netip.AddrPort, turn int) error {
	defer syscall.Close(lfd)
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
		// New connections are taken after the batch: one accepted in it
		// could get the number of a descriptor closed earlier in it, and
		// a later event of the batch for the old one would hit the new.
		accept := false
		for _, ev := range events[:n] {
			fd := int(ev.Fd)
			if fd == lfd {
				accept = true
				continue
			}
			if fd >= len(l.conns) || l.conns[fd] == nil {
				continue // closed earlier in this batch
			}
			c := l.conns[fd]
			// With the peer's FIN pending, a short read does not mean
			// drained: read on to the end (nginx's rule too).
			hup := ev.Events&(syscall.EPOLLRDHUP|syscall.EPOLLHUP) != 0
			var err error
			switch {
			case ev.Events&syscall.EPOLLERR != 0:
				err = errClosed
			case fd == c.cfd:
				err = l.fromClient(c, hup)
			default:
				err = l.fromBackend(c, hup)
			}
			if err != nil {
				l.close(c)
			}
		}
		if accept {
			if err := l.accept(); err != nil {
				return err
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

// accept takes every pending connection. An error other than "none
// left" ends the loop: the listener is level-triggered, and a loop that
// went on (out of descriptors, say) would spin on it.
func (l *loop) accept() error {
	for {
		cfd, _, err := syscall.Accept4(l.lfd, syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC)
		switch err {
		case nil:
		case syscall.EAGAIN:
			return nil
		case syscall.EINTR, syscall.ECONNABORTED:
			continue
		default:
			return fmt.Errorf("relay: accept: %w", err)
		}
		c, err := l.open(cfd)
		if err != nil {
			syscall.Close(cfd)
			return fmt.Errorf("relay: a backend connection: %w", err)
		}
		if l.fromClient(c, false) != nil { // bytes may have come with the handshake
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
// read or EAGAIN, to the end with hup) and sends a complete request on.
func (l *loop) fromClient(c *econn, hup bool) error {
	var err error
	if c.n, c.inFull, err = drain(c.cfd, c.in, c.n, hup); err != nil {
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
	if c.inFull { // room now for what the client sent beyond the buffer
		return l.fromClient(c, false)
	}
	return nil
}

// fromBackend reads the answer and, once it is whole, writes it to the
// client and sends the next request if one is waiting.
func (l *loop) fromBackend(c *econn, hup bool) error {
	var err error
	if c.o, _, err = drain(c.ufd, c.out, c.o, hup); err != nil {
		return err // a full out holds no whole answer: answerLen refused it
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
// back short (the socket is drained: nginx's rule; not with hup, when the
// peer's FIN is pending and only the end of the stream tells), EAGAIN or
// buf is full, and returns the bytes now held and whether buf filled.
func drain(fd int, buf []byte, n int, hup bool) (int, bool, error) {
	for n < len(buf) {
		m, errno := rawRead(fd, buf[n:])
		if errno == syscall.EAGAIN {
			return n, false, nil
		}
		if errno != 0 || m == 0 {
			return n, false, errClosed
		}
		short := m < len(buf)-n
		n += m
		if short && !hup {
			return n, false, nil
		}
	}
	return n, true, nil
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
