// Package relay is the floor under the hot-ids benchmark: the least a
// reverse proxy written in Go spends per request on the bench machine,
// with the HTTP work taken out.
//
// Why it exists: pinboard spends more CPU per proxied request than nginx
// (BENCHMARKS.md, "Analysis"), and the question that decides what to do
// about it is where that CPU goes — to the shape of a Go server (a
// goroutine per connection, parked and woken through Go's poller) or to
// the work each request gets (fasthttp's parse and serialise, resolving
// the owner, the policy, the attestation). A relay answers it by measure:
// it moves each request's bytes to a backend and the answer's bytes back
// and does nothing else, in one of two shapes —
//
//   - [Goroutine]: a goroutine per client connection, reading and writing
//     through internal/rawio as pinboard does (pinboard's shape and raw
//     I/O, none of its HTTP work; not rawio.SendRead, so it makes about
//     0.7 reads more per request than pinboard);
//   - [Epoll]: one event loop per CPU on an edge-triggered epoll set with
//     SO_REUSEPORT listeners, nginx's shape, in Go.
//
// It is a measuring instrument, not a proxy: requests without a body
// only (a request head that names one closes the connection), answers
// framed by Content-Length only (anything else closes it), one backend
// connection per client connection (nginx's upstream keepalive under
// steady load amounts to the same), no header rewritten, no timeouts; the
// Epoll shape closes a client that half-closes its connection at once,
// answered or not. Whatever it refuses, the load generator sees as an
// error.
// pinbench runs it beside nginx and pinboard in the hot-ids scenario.
package relay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"

	"github.com/valyala/fasthttp"
)

// Mode is a relay's shape.
type Mode string

// The relay shapes.
const (
	Goroutine Mode = "goroutine"
	Epoll     Mode = "epoll"
)

// Options configure Serve.
type Options struct {
	Mode Mode
	// Listen is the host:port to accept on (port 0: any free port).
	Listen string
	// Upstreams are backend host:ports, one per client connection in
	// turn.
	Upstreams []string
	// Loops is the event loops of Epoll (default: GOMAXPROCS).
	Loops int
	// Ready, if set, is called with the listening address once the relay
	// accepts.
	Ready func(addr string)
}

// bufSize bounds a request head and an answer: the hot-ids scenario's
// are a few hundred bytes.
const bufSize = 16 << 10

// Serve relays until ctx ends, then closes every connection it holds.
func Serve(ctx context.Context, o Options) error {
	if len(o.Upstreams) == 0 {
		return errors.New("relay: no upstream")
	}
	if o.Loops <= 0 {
		o.Loops = runtime.GOMAXPROCS(0)
	}
	switch o.Mode {
	case Goroutine:
		return serveGoroutines(ctx, o)
	case Epoll:
		return serveEpoll(ctx, o)
	default:
		return fmt.Errorf("relay: unknown mode %q (want %s or %s)", o.Mode, Goroutine, Epoll)
	}
}

var (
	errBodied   = errors.New("relay: a request with a body (relays carry none)")
	errFraming  = errors.New("relay: an answer not framed by Content-Length")
	errTooLarge = errors.New("relay: a head or answer larger than the relay's buffer")
)

// headEnd returns the length of the head at the start of b (through its
// blank line), or -1 while it is incomplete.
func headEnd(b []byte) int {
	i := bytes.Index(b, crlf2)
	if i < 0 {
		return -1
	}
	return i + 4
}

var crlf2 = []byte("\r\n\r\n")

// requestHead checks a complete request head: one naming a body is
// refused.
func requestHead(head []byte) error {
	if n, ok := field(head, "content-length"); ok && !bytes.Equal(n, []byte("0")) {
		return errBodied
	}
	if _, ok := field(head, "transfer-encoding"); ok {
		return errBodied
	}
	return nil
}

// answerLen returns the length of the answer at the start of b (head and
// Content-Length body), or -1 while it is incomplete.
func answerLen(b []byte) (int, error) {
	he := headEnd(b)
	if he < 0 {
		if len(b) >= bufSize {
			return 0, errTooLarge
		}
		return -1, nil
	}
	head := b[:he]
	if _, ok := field(head, "transfer-encoding"); ok {
		return 0, errFraming
	}
	v, ok := field(head, "content-length")
	if !ok || len(v) > 9 {
		return 0, errFraming
	}
	n, err := fasthttp.ParseUint(v) // digits only, none empty
	if err != nil {
		return 0, errFraming
	}
	if he+n > bufSize {
		return 0, errTooLarge
	}
	if len(b) < he+n {
		return -1, nil
	}
	return he + n, nil
}

// field returns the value of the first field called name in head (any
// case), trimmed of spaces and tabs.
func field(head []byte, name string) ([]byte, bool) {
	for {
		i := bytes.Index(head, []byte("\r\n"))
		if i < 0 {
			return nil, false
		}
		head = head[i+2:]
		if len(head) > len(name) && head[len(name)] == ':' && bytes.EqualFold(head[:len(name)], []byte(name)) {
			v := head[len(name)+1:]
			if j := bytes.IndexByte(v, '\r'); j >= 0 {
				v = v[:j]
			}
			return bytes.Trim(v, " \t"), true
		}
	}
}
