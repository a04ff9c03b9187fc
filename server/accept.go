package server

import (
	"errors"
	"log/slog"
	"net"
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
type patientListener struct {
	net.Listener
	log *slog.Logger
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
			l.log.Warn("cannot accept connections: out of resources; retrying", "addr", l.Addr().String(), "err", err)
		} else {
			wait = min(2*wait, time.Second)
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
