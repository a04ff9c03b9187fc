package server

import (
	"errors"
	"log/slog"
	"net"
	"sync/atomic"
	"syscall"
	"time"
)

// patientListener waits through a shortage of file descriptors or kernel
// memory instead of failing Accept: fasthttp's Serve returns on any accept
// error but a timeout, and pinboard stopped with it — a client opening
// connections up to the descriptor limit took the node down, with every
// stream and WebSocket on it. Accept retries after 5 ms, doubling up to
// 1 s as net/http does; connections meanwhile wait in the kernel's
// backlog, and the closed descriptors of ending ones make room. An error
// about the one connection Accept took (oneConnection) is skipped.
//
// The warning is logged once a shortage: while the node stays at its
// limit, every connection that ends lets one more in and the next Accept
// meets the shortage again; logged each time, a client churning
// connections wrote a line per connection. Another is logged only after
// shortageQuiet without one.
type patientListener struct {
	net.Listener
	log *slog.Logger
	// lastShort is when Accept last met a shortage (unix ns; 0: never).
	lastShort *atomic.Int64
}

// shortageQuiet is how long Accept must go without a shortage before the
// next one is logged again.
const shortageQuiet = 10 * time.Second

func newPatientListener(ln net.Listener, log *slog.Logger) patientListener {
	return patientListener{Listener: ln, log: log, lastShort: new(atomic.Int64)}
}

func (l patientListener) Accept() (net.Conn, error) {
	var wait time.Duration
	for {
		c, err := l.Listener.Accept()
		if err == nil {
			return c, nil
		}
		if oneConnection(err) {
			// That connection is gone; the next one is not.
			l.log.Debug("accept failed for one connection", "addr", l.Addr().String(), "err", err)
			continue
		}
		if !resourceShortage(err) {
			return c, err
		}
		if wait == 0 {
			wait = 5 * time.Millisecond
			now := time.Now().UnixNano()
			if last := l.lastShort.Swap(now); last == 0 || now-last > int64(shortageQuiet) {
				l.log.Warn("cannot accept connections: out of resources; retrying", "addr", l.Addr().String(), "err", err)
			}
		} else {
			wait = min(2*wait, time.Second)
			l.lastShort.Store(time.Now().UnixNano())
		}
		time.Sleep(wait)
	}
}

// resourceShortage reports whether an accept error is the process or the
// system running out of something that ending connections give back.
func resourceShortage(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}

// oneConnection reports whether an accept error is about the one pending
// connection it took, not the listener: a security module or firewall
// refusing it (EPERM), a protocol error on it (EPROTO), or its peer
// resetting it before it was taken (ECONNABORTED; Go retries that one
// itself today). Returned, fasthttp's Serve ended and the node with it.
func oneConnection(err error) bool {
	return errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EPROTO) || errors.Is(err, syscall.ECONNABORTED)
}
