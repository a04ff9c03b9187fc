package fleet

import (
	"bufio"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/bench"
)

const sseHeader = "HTTP/1.1 200 OK\r\n" +
	"Content-Type: text/event-stream\r\n" +
	"Cache-Control: no-cache\r\n" +
	"X-Accel-Buffering: no\r\n" +
	"Transfer-Encoding: chunked\r\n" +
	"Connection: close\r\n\r\n"

// serveSSE streams n events (0: until the client leaves), one every
// `every` milliseconds after a random phase, so thousands of streams do
// not fire in step. Each event is
//
//	data: <send time, unix ns> <seq>
//
// written as one chunk with one write, stamped right before the write: the
// client's receive time minus the stamp is the delivery delay.
//
// The stream is written on the hijacked connection rather than through a
// fasthttp body stream, so every event is exactly one write(2) — no pipe
// and copy goroutine between the timer and the socket.
func (f *Fleet) serveSSE(ctx *fasthttp.RequestCtx) {
	args := ctx.QueryArgs()
	n, _ := args.GetUint("n")
	every, err := args.GetUint("every")
	if err != nil || every <= 0 {
		every = 1000
	}
	f.hijack(ctx, func(c net.Conn, _ *bufio.Reader) {
		interval := time.Duration(every) * time.Millisecond
		if _, err := io.WriteString(c, sseHeader); err != nil {
			return
		}
		t := time.NewTimer(rand.N(interval))
		defer t.Stop()
		buf := make([]byte, 0, 64)
		for i := 0; n <= 0 || i < n; i++ {
			select {
			case <-t.C:
			case <-f.closed:
				return
			}
			buf = appendSSEChunk(buf[:0], time.Now().UnixNano(), i)
			if _, err := c.Write(buf); err != nil {
				return
			}
			t.Reset(interval)
		}
		_, _ = io.WriteString(c, "0\r\n\r\n")
	})
}

// appendSSEChunk appends one event as an HTTP/1.1 chunk.
func appendSSEChunk(dst []byte, stamp int64, seq int) []byte {
	var ev [48]byte
	e := append(ev[:0], "data: "...)
	e = strconv.AppendInt(e, stamp, 10)
	e = append(e, ' ')
	e = strconv.AppendInt(e, int64(seq), 10)
	e = append(e, "\n\n"...)
	dst = strconv.AppendInt(dst, int64(len(e)), 16)
	dst = append(dst, "\r\n"...)
	dst = append(dst, e...)
	return append(dst, "\r\n"...)
}

// serveWebSocket echoes every message back (RFC 6455), answering pings
// and the closing handshake.
func (f *Fleet) serveWebSocket(ctx *fasthttp.RequestCtx) {
	h := &ctx.Request.Header
	key := h.Peek("Sec-WebSocket-Key")
	if !h.ConnectionUpgrade() || string(h.Peek(fasthttp.HeaderUpgrade)) != "websocket" || len(key) == 0 {
		reply(ctx, fasthttp.StatusBadRequest, []byte(`{"detail":"websocket upgrade expected"}`))
		return
	}
	accept := bench.WSAccept(key)
	f.hijack(ctx, func(c net.Conn, br *bufio.Reader) {
		if _, err := io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: "+accept+"\r\n\r\n"); err != nil {
			return
		}
		var in, out []byte
		for {
			op, _, p, err := bench.ReadWSFrame(br, in)
			in = p[:0]
			if err != nil {
				return
			}
			switch op {
			case bench.WSClose:
				_, _ = c.Write(bench.AppendWSFrame(out[:0], bench.WSClose, p, false, [4]byte{}))
				return
			case bench.WSPing:
				out = bench.AppendWSFrame(out[:0], bench.WSPong, p, false, [4]byte{})
			case bench.WSPong:
				continue
			default:
				out = bench.AppendWSFrame(out[:0], op, p, false, [4]byte{})
			}
			if _, err := c.Write(out); err != nil {
				return
			}
		}
	})
}

// hijack takes the connection over for a stream; Close ends it.
func (f *Fleet) hijack(ctx *fasthttp.RequestCtx, run func(c net.Conn, br *bufio.Reader)) {
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(c net.Conn) {
		f.hijacked.Store(c, struct{}{})
		defer f.hijacked.Delete(c)
		defer c.Close()
		select {
		case <-f.closed:
			return
		default:
		}
		run(c, bufio.NewReaderSize(c, 4096))
	})
}

// serveUpload consumes the request body and reports its size.
func (f *Fleet) serveUpload(ctx *fasthttp.RequestCtx) {
	var n int64
	if ctx.Request.IsBodyStream() {
		buf := make([]byte, 64<<10)
		var err error
		n, err = io.CopyBuffer(sink{}, ctx.RequestBodyStream(), buf)
		if err != nil {
			reply(ctx, fasthttp.StatusBadRequest, []byte(`{"detail":"body read failed"}`))
			ctx.SetConnectionClose()
			return
		}
	} else {
		n = int64(len(ctx.Request.Body()))
	}
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.Response.Header.SetContentType("application/json")
	// One buffer: AppendBodyString after SetBodyRaw drops the raw body
	// (fasthttp's bodyBuffer), and the answer was "}" alone.
	ctx.Response.SetBodyRaw(append(strconv.AppendInt([]byte(`{"bytes":`), n, 10), '}'))
}

// serveDownload sends size bytes with a Content-Length.
func (f *Fleet) serveDownload(ctx *fasthttp.RequestCtx) {
	size, err := ctx.QueryArgs().GetUint("size")
	if err != nil || size < 0 {
		size = 1 << 20
	}
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.Response.Header.SetContentType("application/octet-stream")
	ctx.Response.SetBodyStream(&pattern{left: int64(size)}, size)
}

// pattern yields a fixed number of bytes without allocating per read.
type pattern struct{ left int64 }

var patternBlock = func() []byte {
	b := make([]byte, 64<<10)
	for i := range b {
		b[i] = byte(i)
	}
	return b
}()

func (p *pattern) Read(b []byte) (int, error) {
	if p.left <= 0 {
		return 0, io.EOF
	}
	n := copy(b, patternBlock)
	if int64(n) > p.left {
		n = int(p.left)
	}
	p.left -= int64(n)
	return n, nil
}

// sink is io.Discard without ReaderFrom (so copies use the big buffer).
type sink struct{}

func (sink) Write(p []byte) (int, error) { return len(p), nil }
