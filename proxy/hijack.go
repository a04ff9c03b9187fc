package proxy

import (
	"errors"
	"net"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/internal/rawio"
)

// hijackWait bounds the wait for fasthttp to run a hijack handler once
// the handler returned: it flushes answers held back for pipelining
// first (a var for tests).
var hijackWait = handshakeTimeout

// errHijackSkipped ends what a hijack that fasthttp never ran was to own.
var errHijackSkipped = errors.New("the server never handed over the client connection")

// hijackGuard takes the client connection over once the handler returns,
// the server writing no response of its own (hijack): run gets the
// hijacked connection (valid with ctx until run returns). fasthttp skips
// the hijack handler when it cannot flush an answer held back before this
// one (pipelined requests, a client gone), and nothing would then release
// what the hijack was to own (a worker connection, a tracked stream): run
// or orphaned — after hijackWait, or when shutdown abandons the hijack,
// whichever comes first — owns it; the other does nothing (run closes the
// connection it got). Safe for concurrent use.
type hijackGuard struct {
	owned    atomic.Bool
	orphaned func()
	timer    atomic.Pointer[time.Timer]
}

// hijack registers run as ctx's hijack handler, and starts the orphan
// timer. Set orphaned before.
func (g *hijackGuard) hijack(ctx *fasthttp.RequestCtx, run func(hc net.Conn)) {
	t := time.AfterFunc(hijackWait, g.abandon)
	g.timer.Store(t)
	if g.owned.Load() {
		// Shutdown abandoned the hijack before the timer was stored
		// (cutRelays): nothing stops it then, and it would hold the guard,
		// and what orphaned refers to, for hijackWait.
		t.Stop()
	}
	// A relay closes the client connection to end its own reads (at
	// shutdown too), which a lingering close would leave running.
	rawio.NoLinger(ctx.Conn())
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(hc net.Conn) {
		if !g.owned.CompareAndSwap(false, true) {
			_ = hc.Close()
			return
		}
		g.timer.Load().Stop()
		run(hc)
	})
}

// abandon hands what the hijack was to own to orphaned now, unless run
// (or orphaned) has it already: shutdown does not wait hijackWait for a
// hijack that may never run.
func (g *hijackGuard) abandon() {
	if !g.owned.CompareAndSwap(false, true) {
		return
	}
	if t := g.timer.Load(); t != nil {
		t.Stop()
	}
	g.orphaned()
}

// bufferedBytes returns what hc (a hijacked connection) has buffered past
// the request, without waiting for more: a read deadline already passed
// ends the reads once the buffer is empty. Nil when nothing is.
func bufferedBytes(hc net.Conn) []byte {
	if hc.SetReadDeadline(time.Unix(1, 0)) != nil {
		return nil
	}
	defer hc.SetReadDeadline(time.Time{})
	var one [1]byte
	if n, _ := hc.Read(one[:]); n == 0 {
		return nil
	}
	out := append(make([]byte, 0, 4096), one[0])
	buf := make([]byte, 4096)
	for {
		n, err := hc.Read(buf)
		out = append(out, buf[:n]...)
		if err != nil || n == 0 {
			return out
		}
	}
}
