package relay

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"github.com/pinboard-go/pinboard/internal/rawio"
)

// serveGoroutines is the Goroutine shape: pinboard's (a goroutine per
// connection, raw reads and writes through internal/rawio, Go's poller
// for readiness) without its HTTP work — and without rawio.SendRead,
// which pinboard uses to send a request inside the wait for its answer.
func serveGoroutines(ctx context.Context, o Options) error {
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return err
	}
	ln = rawio.Listener(ln)
	if o.Ready != nil {
		o.Ready(ln.Addr().String())
	}
	var (
		mu   sync.Mutex
		open = map[net.Conn]struct{}{} // nil once shutting down
		wg   sync.WaitGroup
		turn atomic.Uint64
	)
	// hold tracks c for shutdown, or reports that it is under way.
	hold := func(c net.Conn) bool {
		mu.Lock()
		defer mu.Unlock()
		if open != nil {
			open[c] = struct{}{}
		}
		return open != nil
	}
	release := func(c net.Conn) {
		mu.Lock()
		delete(open, c)
		mu.Unlock()
	}
	shutdown := func() {
		ln.Close()
		mu.Lock()
		for c := range open {
			c.Close()
		}
		open = nil
		mu.Unlock()
	}
	stop := context.AfterFunc(ctx, shutdown)
	defer stop()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				wg.Wait()
				return nil
			}
			// Not asked to stop: the listener failed. The open relays
			// close too, or waiting for them would wait on their clients.
			shutdown()
			wg.Wait()
			return fmt.Errorf("relay: accept: %w", err)
		}
		up := o.Upstreams[turn.Add(1)%uint64(len(o.Upstreams))]
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			if !hold(c) {
				return
			}
			defer release(c)
			u, err := net.Dial("tcp", up)
			if err != nil {
				return
			}
			u = rawio.Wrap(u)
			if !hold(u) {
				u.Close()
				return
			}
			defer release(u)
			defer u.Close()
			_ = relayConn(c, u)
		}()
	}
}

// relayConn carries requests from c to u and their answers back, one at
// a time, until either side closes or breaks the relay's rules.
func relayConn(c, u net.Conn) error {
	in := make([]byte, bufSize)
	out := make([]byte, bufSize)
	n := 0
	for {
		he := headEnd(in[:n])
		for he < 0 {
			if n == len(in) {
				return errTooLarge
			}
			m, err := c.Read(in[n:])
			if err != nil {
				return err
			}
			n += m
			he = headEnd(in[:n])
		}
		if err := requestHead(in[:he]); err != nil {
			return err
		}
		if _, err := u.Write(in[:he]); err != nil {
			return err
		}
		n = copy(in, in[he:n])
		o := 0
		for {
			m, err := u.Read(out[o:])
			if err != nil {
				return err
			}
			o += m
			l, err := answerLen(out[:o])
			if err != nil {
				return err
			}
			if l < 0 {
				continue
			}
			if l != o {
				return errors.New("relay: bytes after the answer")
			}
			break
		}
		if _, err := c.Write(out[:o]); err != nil {
			return err
		}
	}
}
