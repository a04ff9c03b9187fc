package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/internal/ascii"
	"github.com/pinboard-go/pinboard/internal/rawio"
)

type bodyMode uint8

const (
	bodyFixed   bodyMode = iota // Content-Length
	bodyChunked                 // Transfer-Encoding: chunked
	bodyEOF                     // read until the worker closes
)

var (
	errBadChunk    = errors.New("malformed chunked body from worker")
	errStreamEnded = errors.New("stream ended by shutdown")
	// errTrailersTooLarge: a chunked body's trailer section went past the
	// response header cap (see skipTrailers).
	errTrailersTooLarge = errors.New("trailers from worker too large")
)

// upstreamBody streams one worker response body to the client without
// buffering it (R-DP-2). The fasthttp server reads it after the handler
// returned and calls CloseWithError when the response is written (or the
// client went away); only then does the worker connection go back to its
// pool. Chunked bodies are decoded here and re-chunked by the server, which
// flushes after every read: each Server-Sent Event leaves as it arrives.
//
// It implements only CloseWithError, not Close: fasthttp calls both when
// both exist (../shared/notes/FASTHTTP.md).
type upstreamBody struct {
	pool      *connPool
	pc        *pconn
	up        *upload // the request body still going up, or nil
	tracker   *streams
	mode      bodyMode
	remaining int64 // bodyFixed: bytes left; bodyChunked: bytes left in chunk
	done      bool  // the whole body was read
	broken    bool  // the connection cannot be reused
	keep      bool  // the worker allows reuse (no Connection: close)
	sse       bool  // text/event-stream: shutdown may end it cleanly
	relayed   bool  // relayed off the server (events.go), not read by it
	// untilClose: relayed to an HTTP/1.0 client, ended by the close
	// (relayUntilClose), which must then say whether the body is whole.
	untilClose bool
	// err is the error that broke the body, which every later Read
	// reports: fasthttp's chunked writer writes the bytes a Read returned
	// with an error and reads on (writeBodyChunked), and a read past a
	// chunk not ended by CRLF parsed what followed as more of the body,
	// up to a clean end the worker never framed.
	err     error
	stopped atomic.Bool
	// crlfDue: a chunk's data was all read, its CRLF not yet
	// (readChunked).
	crlfDue bool
	// tail is the last three bytes of an event stream read so far (the
	// low byte last), to tell whether they end an event (eventEnd).
	tail uint32

	client net.Conn      // the client's connection: stall deadline on writes to it
	stall  time.Duration // see UpstreamOptions.StallTimeout; 0: none

	// guard is a relay's hijack, which shutdown may abandon (cutRelays).
	guard *hijackGuard
	// owner is the session the body comes from: an event stream whose
	// session ended is ended (streams.endRevoked).
	owner *directory.Owner
}

var bodyPool = sync.Pool{New: func() any { return new(upstreamBody) }}

func acquireBody(pool *connPool, pc *pconn, tr *streams, owner *directory.Owner, mode bodyMode, size int64, keep, sse bool, up *upload, client net.Conn) *upstreamBody {
	b := bodyPool.Get().(*upstreamBody)
	b.pool, b.pc, b.tracker, b.owner, b.mode, b.keep, b.sse, b.up = pool, pc, tr, owner, mode, keep, sse, up
	b.client, b.stall = client, pool.stall
	b.remaining, b.done, b.broken, b.relayed, b.untilClose, b.guard, b.err, b.crlfDue = 0, false, false, false, false, nil, nil, false
	b.stopped.Store(false)
	b.tail = blankLine
	if mode == bodyFixed {
		b.remaining = size
		b.done = size == 0
	}
	pc.watch(client, &b.stopped)
	tr.add(b)
	return b
}

// Read implements io.Reader. What it returns is written next, the end of
// the body included (a last chunk): either renews the write deadline.
func (b *upstreamBody) Read(p []byte) (int, error) {
	n, err := b.read(p)
	if n > 0 || err == io.EOF {
		b.renew()
	}
	return n, err
}

func (b *upstreamBody) read(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	if b.err != nil {
		return 0, b.err
	}
	if b.stopped.Load() {
		return 0, b.stopErr()
	}
	var n int
	var err error
	switch b.mode {
	case bodyFixed:
		n, err = b.readFixed(p)
	case bodyChunked:
		n, err = b.readChunked(p)
	default:
		n, err = b.pc.br.Read(p)
		if err == io.EOF {
			b.done, b.broken = true, true
			return n, io.EOF
		}
	}
	if b.sse {
		b.noteTail(p[:n])
	}
	if err != nil && err != io.EOF {
		b.broken = true
		if b.stopped.Load() {
			if n > 0 && b.cleanStop() {
				return n, nil // the next Read ends the stream
			}
			err = b.stopErr()
		}
		if err != io.EOF {
			b.err = err
			b.tracker.brokeOff(err)
		}
	}
	return n, err
}

// renew pushes back the deadline of the write the server makes next with
// what Read returned (rawio.KeepWriteDeadline: about once a second on a
// busy stream): a client that stops reading a stream with bytes pending is
// cut about the stall timeout later, and its worker connection freed. An
// idle stream makes no write and is never cut. The deadline stays on the
// connection for its next response, which renews it the same way.
func (b *upstreamBody) renew() {
	if b.client != nil {
		rawio.KeepWriteDeadline(b.client, time.Now(), b.stall)
	}
}

// writeClient writes p to the client of a relayed stream, with the stall
// deadline (a client that stopped reading is cut).
func (b *upstreamBody) writeClient(p []byte) error {
	b.renew()
	_, err := b.client.Write(p)
	return err
}

// idle reports whether the next Read must wait for the worker: nothing
// of the stream is buffered on this side. Streamed bodies only (pc.src).
func (b *upstreamBody) idle() bool {
	return b.pc.br.Buffered() == 0 && len(b.pc.src.pending) == 0
}

// cleanStop reports whether a stream stopped by shutdown, or because its
// session ended, can end as if the worker had ended it: only an event
// stream, and only once what went out ends an event (eventEnd), so the
// client sees whole events and a proper end (it reconnects through
// another node). Any other body stopped early must look truncated — a
// clean end would pass a partial download off as complete. A worker's
// chunk or read ends no event by itself: a generator yielding an event
// line by line sends a chunk per line.
//
// A chunked stream ends cleanly only between chunks as well. A sized
// event stream (the worker's Content-Length) goes out chunked to an
// HTTP/1.1 client, which never sees that length; to an HTTP/1.0 client
// it carries its Content-Length and ends by the close (untilClose):
// ended short of it, it is cut.
func (b *upstreamBody) cleanStop() bool {
	if !b.sse || !b.eventEnd() {
		return false
	}
	switch b.mode {
	case bodyEOF:
		return true
	case bodyChunked:
		return b.remaining == 0
	default:
		return !b.untilClose
	}
}

// blankLine stands for what came before an event stream's first byte:
// its start is between events.
const blankLine = 0x0a0a

// noteTail keeps the last three bytes of p in b.tail.
func (b *upstreamBody) noteTail(p []byte) {
	for _, c := range p[max(0, len(p)-3):] {
		b.tail = (b.tail<<8 | uint32(c)) & 0xffffff
	}
}

// eventEnd reports whether the event stream read so far ends an event:
// a blank line (LF LF, CR CR, or CRLF after a line end) last.
// Unsure cases (a lone CR that a LF may yet join) count as mid-event:
// cut, the client retries; a clean end would be wrong the other way.
func (b *upstreamBody) eventEnd() bool {
	last2 := b.tail & 0xffff
	return last2 == 0x0a0a || last2 == 0x0d0d || b.tail == 0x0a0d0a || b.tail == 0x0d0d0a
}

func (b *upstreamBody) stopErr() error {
	b.broken = true
	if b.cleanStop() {
		b.done = true
		return io.EOF
	}
	return errStreamEnded
}

func (b *upstreamBody) readFixed(p []byte) (int, error) {
	if int64(len(p)) > b.remaining {
		p = p[:b.remaining]
	}
	n, err := b.pc.br.Read(p)
	b.remaining -= int64(n)
	if b.remaining == 0 {
		b.done = true
		return n, io.EOF
	}
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

func (b *upstreamBody) readChunked(p []byte) (int, error) {
	if b.crlfDue {
		if err := b.crlf(); err != nil {
			return 0, err
		}
		b.crlfDue = false
	}
	if b.remaining == 0 {
		size, err := b.chunkHeader()
		if err != nil {
			return 0, err
		}
		if size == 0 {
			if err := b.skipTrailers(); err != nil {
				return 0, err
			}
			b.done = true
			return 0, io.EOF
		}
		b.remaining = size
	}
	if int64(len(p)) > b.remaining {
		p = p[:b.remaining]
	}
	n, err := b.pc.br.Read(p)
	b.remaining -= int64(n)
	if err == io.EOF {
		return n, io.ErrUnexpectedEOF
	}
	if err != nil {
		return n, err
	}
	if b.remaining == 0 {
		if b.pc.br.Buffered() < 2 {
			// The chunk's data is all here and its CRLF not yet: what
			// was read goes out now, the CRLF is read with the next
			// chunk. Waited for here, an event stream's last event
			// waited for the worker's next write (a server that writes
			// the CRLF apart, held back by Nagle) (R-DP-2).
			b.crlfDue = true
			return n, nil
		}
		if err := b.crlf(); err != nil {
			return n, err
		}
	}
	return n, nil
}

// cutShort reports the end of the worker's input inside the chunk framing
// (a size line, a chunk's CRLF, the trailer section) as what it is: the
// body cut short. A bare io.EOF there read as the body's end, and the
// client got a last chunk the worker never sent (R-DP-2).
func cutShort(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// chunkHeader reads "<hex>[BWS;ext]\r\n" (RFC 9112 §7.1, §7.1.1): the
// line ends in CRLF and holds no other CR (erratum 7633: no bare LF), and
// nothing but an extension follows the size. It stopped at the first CR,
// space or tab after the digits, so "5\rX\n" and "5 junk\r\n" framed a
// chunk that net/http and fasthttp refuse as malformed.
func (b *upstreamBody) chunkHeader() (int64, error) {
	line, err := b.pc.br.ReadSlice('\n')
	if err != nil {
		return 0, cutShort(err)
	}
	if len(line) < 2 || bytes.IndexByte(line, '\r') != len(line)-2 {
		return 0, errBadChunk
	}
	line = line[:len(line)-2]
	var size int64
	digits := 0
	for ; digits < len(line) && ascii.IsHex(line[digits]); digits++ {
		if digits == 15 {
			return 0, errBadChunk
		}
		size = size<<4 | int64(unhex(line[digits]))
	}
	rest := bytes.TrimLeft(line[digits:], " \t")
	if digits == 0 || len(rest) > 0 && rest[0] != ';' {
		return 0, errBadChunk
	}
	return size, nil
}

func (b *upstreamBody) crlf() error {
	c1, err := b.pc.br.ReadByte()
	if err != nil {
		return cutShort(err)
	}
	c2, err := b.pc.br.ReadByte()
	if err != nil {
		return cutShort(err)
	}
	if c1 != '\r' || c2 != '\n' {
		return errBadChunk
	}
	return nil
}

// skipTrailers discards trailer fields up to the empty line. Trailers are
// not forwarded: the server re-chunks the body without them. A trailer
// section may be as large as a response header (the pool's BufferSize),
// no larger: nothing of it goes to the client, so neither the stall
// timeout nor the client check would ever end one that never ends.
func (b *upstreamBody) skipTrailers() error {
	long := false // inside a line longer than the buffer
	left := b.pool.bufSize
	for {
		line, err := b.pc.br.ReadSlice('\n')
		if left -= len(line); left < 0 {
			return errTrailersTooLarge
		}
		if err == bufio.ErrBufferFull {
			long = true
			continue
		}
		if err != nil {
			return cutShort(err)
		}
		if !long && (len(line) == 1 || len(line) == 2 && line[0] == '\r') {
			return nil // "\r\n" or a bare "\n"; not a two-byte line like "X\n"
		}
		long = false
	}
}

// CloseWithError implements fasthttp.ReadCloserWithError: the server is
// done with the body. A fully read body on a keep-alive connection returns
// it to the pool; anything else closes it, interrupting a worker stream the
// client abandoned.
func (b *upstreamBody) CloseWithError(err error) error {
	b.tracker.remove(b)
	b.pc.unwatch()
	reuse := err == nil && b.done && !b.broken && b.keep
	if up := b.up; up != nil {
		// The server recycles the request stream once this returns: the
		// upload must be over. An unfinished one ends with the connection.
		if !reuse || !up.settled() {
			reuse = false
			b.pool.discard(b.pc)
			up.stop()
		} else if !up.wait() {
			reuse = false
			b.pool.discard(b.pc)
		}
	} else if !reuse {
		b.pool.discard(b.pc)
	}
	if reuse {
		if b.pool.endStream(b.pc) {
			b.pool.put(b.pc, time.Now())
		} else {
			b.pool.discard(b.pc)
		}
	}
	b.pool, b.pc, b.up, b.tracker, b.client, b.guard, b.err, b.owner = nil, nil, nil, nil, nil, nil, nil, nil
	bodyPool.Put(b)
	return nil
}

// stop ends a stream at shutdown: the blocked read returns at once; an
// event stream between events ends cleanly, anything else is cut.
func (b *upstreamBody) stop(now time.Time) {
	b.stopped.Store(true)
	if pc := b.pc; pc != nil {
		_ = pc.c.SetReadDeadline(now)
	}
}

// streams tracks open upstream bodies so shutdown can end them: fasthttp's
// Shutdown waits for open responses and an idle SSE stream never ends.
// Bodies relayed off the server (events.go: event streams, and unsized
// bodies to HTTP/1.0 clients) are counted apart: fasthttp no longer sees
// their connections, so shutdown waits for them here.
type streams struct {
	mu  sync.Mutex
	m   map[*upstreamBody]struct{}
	n   atomic.Int64
	sse atomic.Int64
	// relays counts bodies relayed off the server, from relayStart until
	// their connection is closed or back with the server; relayedEvents
	// the event streams among them.
	relays        int
	relayedEvents int
	idle          idleSignal
	// closing is set by stopAll, for good: a stream that starts later (a
	// worker slow to answer) is stopped as it starts, instead of running
	// on untracked once the server has gone (WebSockets: hijacks.closing).
	closing bool
	// metrics counts the streams that broke off on the worker's side
	// (brokeOff); set once by New.
	metrics Metrics
}

func newStreams() *streams {
	return &streams{m: make(map[*upstreamBody]struct{}), metrics: nopMetrics{}}
}

// brokeOff counts a streamed body that broke off on the worker's side
// with err (pinboard_proxy_upstream_errors_total): "invalid" when its
// framing was refused (a malformed chunk, trailers past the cap), "read"
// when its connection failed under it — the kinds the same failures get
// under a small body read whole (answerUpstreamError), which is answered
// 502 where a stream already under way can only be cut. Before, a worker
// that crashed mid-download or mid-event-stream showed in no metric. A
// client that left (errClientGone), a shutdown (errStreamEnded) and a
// connection this side closed (net.ErrClosed: the upload beside the
// answer ended by its client) are no failure of the worker's.
func (s *streams) brokeOff(err error) {
	switch {
	case err == errStreamEnded, errors.Is(err, errClientGone), errors.Is(err, net.ErrClosed):
	case invalidAnswer(err):
		s.metrics.UpstreamError("invalid")
	default:
		s.metrics.UpstreamError("read")
	}
}

func (s *streams) add(b *upstreamBody) {
	s.mu.Lock()
	s.m[b] = struct{}{}
	if s.closing {
		b.stop(time.Now())
	}
	s.mu.Unlock()
	s.n.Add(1)
	if b.sse {
		s.sse.Add(1)
	}
}

func (s *streams) remove(b *upstreamBody) {
	s.mu.Lock()
	delete(s.m, b)
	s.mu.Unlock()
	// The event streams first, as add counts them last: a scrape in
	// between never shows more event streams than streams.
	if b.sse {
		s.sse.Add(-1)
	}
	s.n.Add(-1)
}

// relayStart counts b (tracked already) as relayed off the server, g
// being its hijack.
func (s *streams) relayStart(b *upstreamBody, g *hijackGuard) {
	s.mu.Lock()
	b.relayed, b.guard = true, g
	s.relays++
	if b.sse {
		s.relayedEvents++
	}
	s.mu.Unlock()
}

// relayEnd ends a relay's count once its client connection is dealt with;
// sse is its body's.
func (s *streams) relayEnd(sse bool) {
	s.mu.Lock()
	s.relays--
	if sse {
		s.relayedEvents--
	}
	s.idle.check(s.relays)
	s.mu.Unlock()
}

// Relays returns the number of event streams relayed off the server.
func (s *streams) Relays() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return int64(s.relayedEvents)
}

// Downloads returns the number of other bodies relayed off the server:
// unsized responses to HTTP/1.0 clients, requests still in flight.
func (s *streams) Downloads() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return int64(s.relays - s.relayedEvents)
}

// waitRelays waits until no relay is left or ctx ends, and reports
// whether none is left.
func (s *streams) waitRelays(ctx context.Context) bool {
	return s.idle.await(ctx, &s.mu, func() int { return s.relays })
}

// cutRelays ends every relay left: the client connection of one still
// writing is closed, so its write fails and the relay ends, closing the
// worker connection; one whose hijack has not run (fasthttp still
// flushing answers held back before it, or never going to) is abandoned,
// which closes the worker connection at once instead of after hijackWait.
func (s *streams) cutRelays() {
	var pending []*hijackGuard
	s.mu.Lock()
	for b := range s.m {
		if b.relayed {
			if b.untilClose {
				// Cut: a clean close would end the body as if whole.
				rawio.Abort(b.client)
			}
			_ = b.client.Close()
			pending = append(pending, b.guard)
		}
	}
	s.mu.Unlock()
	// Outside mu: the orphan's end of the relay takes it. A guard whose
	// hijack ran does nothing.
	for _, g := range pending {
		g.abandon()
	}
}

// Open returns the number of streaming responses in flight.
func (s *streams) Open() int64 { return s.n.Load() }

// OpenEvents returns the number of event streams (text/event-stream) among
// them.
func (s *streams) OpenEvents() int64 { return s.sse.Load() }

// endRevoked ends the event streams whose session the store ended —
// deregistered, superseded, or dropped a lease after its lease ran out
// (a crashed, frozen or cut-off worker) — as shutdown ends them: cleanly
// between two events. EventSource then reconnects and reaches the id's
// owner now. An event stream idles by design, so nothing else would end
// one from a frozen worker (its kernel still holds the connection), and
// one from a worker the fleet has moved on from would go on beside the
// id's new owner. Other streams run on: a download from a live worker
// that re-registered is sound, and a stalled one ends by the stall
// timeout. It returns how many it ended.
func (s *streams) endRevoked(now time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for b := range s.m {
		if b.sse && b.owner != nil && b.owner.Revoked() && !b.stopped.Load() {
			b.stop(now)
			n++
		}
	}
	return n
}

func (s *streams) stopAll(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closing = true
	for b := range s.m {
		b.stop(now)
	}
}

// clientCheckEvery is how long a streamed body's read from the worker
// waits before it checks the client is still there (a var for tests).
var clientCheckEvery = 5 * time.Second
