package proxy

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/internal/rawio"
)

// errPoolExhausted: every connection to the worker is busy and none freed
// up within ConnWait. The proxy answers 503 with Retry-After.
var errPoolExhausted = errors.New("worker connection pool exhausted")

// pconn is one pooled keep-alive connection with its own read buffer, so
// a request through a warm connection allocates nothing. Write buffers are
// pooled per connPool and held only while a request goes out (see
// connPool.writer): a connection relaying a long stream (SSE) or idle in
// the pool does not pin one.
type pconn struct {
	c        net.Conn
	pool     *connPool
	br       *bufio.Reader
	src      *carryReader // set while br is a small stream buffer
	w        io.Writer    // where pooled write buffers flush to: (*pconnOut)(pc)
	lastUsed time.Time
	// A request's last bytes go out with the wait for its answer
	// (pconn.Read, rawio.SendRead): writeRequest's final flush leaves
	// them in out (capture), in outW's buffer, which is held until then.
	// checkQuiet: pc came from the idle list, and must be found quiet
	// before its first byte goes out (see popIdle). sendErr is why the
	// request did not go out whole: a write's error, or
	// rawio.ErrNotQuiet when pc must not carry it.
	out        []byte
	outW       *bufio.Writer
	capture    bool
	checkQuiet bool
	sendErr    error
	// respHop holds the hop-by-hop names of the answer read last
	// (readResponseHeader), for relay to strip without a second pass.
	respHop uint16
	// deadline is the read deadline last set on c.
	deadline lazyDeadline
	// reused is true once the connection carried a response; a read error
	// before any response byte on a reused connection usually means the
	// worker closed it while idle (retryable when the request can be
	// replayed).
	reused bool
	// answered: a byte of the current request's answer was read (an
	// interim response counts). A connection that failed after one is no
	// idle connection the worker closed: the worker had the request.
	answered bool
	// waitStart is when awaitHeader began a wait for the worker's answer
	// that checks on the client (zero: none); waitFor is its length, the
	// header timeout (see keepWaiting).
	waitStart time.Time
	waitFor   time.Duration
	// waitOwner is the session the request awaited went to (nil: none to
	// watch): a wait ends once the store ended it (keepWaiting).
	waitOwner *directory.Owner
}

// lazyDeadline keeps a connection deadline about d ahead of now without
// setting it on every call (rawio.DeadlineDue says when it is due). at is
// the deadline last set (zero: none).
type lazyDeadline struct{ at time.Time }

// due reports the deadline to set now, if one is due.
func (l *lazyDeadline) due(now time.Time, d time.Duration) (time.Time, bool) {
	if !rawio.DeadlineDue(l.at, now, d) {
		return time.Time{}, false
	}
	l.at = now.Add(d)
	return l.at, true
}

// armHeaderDeadline makes sure a read on pc gives up no later than d
// after now (and no earlier than d minus a small slack): the wait for a
// worker's response header is bounded, renewed about once a second on a
// busy connection instead of twice per request.
func (pc *pconn) armHeaderDeadline(now time.Time, d time.Duration) {
	if at, ok := pc.deadline.due(now, d); ok {
		_ = pc.c.SetReadDeadline(at)
	}
}

// deadlineUnknown marks a deadline set outside pc's bookkeeping (by an
// upload): the next arm renews it and the next clear clears it.
var deadlineUnknown = lazyDeadline{time.Unix(0, 1)}

// clearDeadline removes the read deadline before a streamed body, which
// may idle far longer than a header may take (SSE).
func (pc *pconn) clearDeadline() {
	if !pc.deadline.at.IsZero() {
		pc.deadline = lazyDeadline{}
		_ = pc.c.SetReadDeadline(time.Time{})
	}
}

// connPool is a LIFO pool of connections to one worker address, bounded by
// maxConns (idle + in use). fasthttp.HostClient has such a pool, but its
// connection type is unexported, which rules out the pooled streaming body
// that owns a connection until the server finishes writing a response.
//
// All methods are safe for concurrent use.
type connPool struct {
	dial        func(addr string) (net.Conn, error)
	addr        string
	bufSize     int
	idleTimeout time.Duration
	connWait    time.Duration
	// headerTimeout bounds the wait for a response header.
	headerTimeout time.Duration
	// stall bounds a streamed body's lack of progress (0: none); see
	// UpstreamOptions.StallTimeout.
	stall time.Duration

	tokens chan struct{} // one per open connection
	// writers holds *bufio.Writer of bufSize for requests going out.
	writers sync.Pool
	// readers holds the header-size *bufio.Reader a streaming connection
	// gave back (see streamReader).
	readers sync.Pool
	// idleReady wakes a waiter after put: the idle connection is taken
	// through popIdle, so a wake-up that loses the race just waits again.
	idleReady chan struct{}

	mu      sync.Mutex
	idle    []*pconn
	waiters int
	closed  bool
	// gone mirrors closed for readers without the lock (proxy.state).
	gone atomic.Bool
}

func newConnPool(addr string, dial func(string) (net.Conn, error), o UpstreamOptions) *connPool {
	return &connPool{
		dial:          dial,
		addr:          addr,
		bufSize:       o.BufferSize,
		idleTimeout:   o.IdleTimeout,
		connWait:      o.ConnWait,
		headerTimeout: o.ResponseHeaderTimeout,
		stall:         o.StallTimeout,
		tokens:        make(chan struct{}, o.MaxConns),
		idleReady:     make(chan struct{}, 1),
	}
}

// get returns an idle connection younger than idleTimeout, or dials a new
// one when the pool has room, or waits up to connWait for either. late
// reports that it did not take pc straight off the idle list but dialed
// it or waited for it (up to DialTimeout, ConnWait): the caller's reading
// of the clock from before get is stale (roundTrip).
func (p *connPool) get(now time.Time) (pc *pconn, late bool, err error) {
	if pc := p.popIdle(now); pc != nil {
		return pc, false, nil
	}
	select {
	case p.tokens <- struct{}{}:
		pc, err = p.dialNew()
	default:
		pc, err = p.wait(now)
	}
	return pc, true, err
}

// popIdle returns the most recently used idle connection younger than
// idleTimeout, or nil. It must be found quiet before it carries a request
// (checkQuiet, rawio.NotQuiet: one peek, or behind TLS the socket's TCP
// state) just before the request's first byte goes out (pconnOut.Write,
// or rawio.SendRead with the last bytes): a connection the worker closed
// while idle is replaced before it is used — a request that must not run
// twice is never replayed after an error — and one carrying bytes no
// request asked for (the late tail of an answer) would hand them to the
// next request as its answer. The caller discards one that is not
// (rawio.ErrNotQuiet) and takes the next.
//
// Behind TLS nothing can be peeked at: the worker's extra bytes may sit in
// the TLS layer already, a record of their own that the last answer's
// reads never reached (a read returns one record). unaskedTLS reads for
// them here, once, without waiting.
func (p *connPool) popIdle(now time.Time) *pconn {
	for {
		var stale []*pconn
		p.mu.Lock()
		var pc *pconn
		for n := len(p.idle); n > 0; n = len(p.idle) {
			c := p.idle[n-1]
			p.idle[n-1] = nil
			p.idle = p.idle[:n-1]
			if now.Sub(c.lastUsed) < p.idleTimeout {
				pc = c
				break
			}
			stale = append(stale, c)
		}
		p.mu.Unlock()
		for _, c := range stale {
			p.discard(c)
		}
		if pc != nil && pc.unaskedTLS() {
			p.discard(pc)
			continue
		}
		if pc != nil {
			pc.checkQuiet, pc.sendErr = true, nil
		}
		return pc
	}
}

// aLongTimeAgo is a read deadline that has passed: a read under it takes
// what is already there and never waits.
var aLongTimeAgo = time.Unix(1, 0)

// tlsProbeWait bounds unaskedTLS's read of bytes the socket holds: one
// record or more, already there, so it returns at once unless they are
// only post-handshake messages (session tickets), which a TLS read
// consumes and then waits for data (rare on an idle connection: the
// tickets come right after the handshake, before the first answer).
const tlsProbeWait = 10 * time.Millisecond

// unaskedTLS reports whether pc, an idle connection behind TLS, cannot
// carry another request: its worker sent application data nobody asked
// for — bytes after the answer it framed, in a TLS record of their own,
// which the answer's reads never reached (a TLS read returns one record)
// and which no peek at the socket can tell from a session ticket — or
// closed or reset it. A read tells: first one that cannot wait, for what
// the TLS layer holds already (a read whose deadline passed makes no
// system call), then, when the socket holds bytes, one that may wait
// tlsProbeWait for them to be read and decrypted. Application data, or an
// error other than the deadline, means the connection is done for;
// post-handshake messages are consumed by the read and are no data. A
// record still on its way is not seen (the socket's peek has the same
// limit). Other connections report false: rawio.NotQuiet peeks at them.
//
// Before, such a record was read as the answer to the next request on
// the connection, another client's (TestTLSWorkerExtraRecordNeverAnswersNextRequest_RDP1_RDP3).
// The read deadline it leaves is unknown to pc's bookkeeping: the next
// arm renews it, the next clear clears it.
func (pc *pconn) unaskedTLS() bool {
	tc, ok := pc.c.(*tls.Conn)
	if !ok {
		return false
	}
	pc.deadline = deadlineUnknown
	if tlsReadUnasked(tc, aLongTimeAgo) {
		return true
	}
	if tcp, ok := tc.NetConn().(*net.TCPConn); !ok || !rawio.Readable(tcp) {
		return false
	}
	return tlsReadUnasked(tc, time.Now().Add(tlsProbeWait))
}

// tlsReadUnasked reads from tc under deadline and reports whether it
// found application data, or an error other than the deadline's.
func tlsReadUnasked(tc *tls.Conn, deadline time.Time) bool {
	if tc.SetReadDeadline(deadline) != nil {
		return true
	}
	var b [1]byte
	n, err := tc.Read(b[:])
	return n > 0 || !isTimeout(err)
}

func (p *connPool) wait(now time.Time) (*pconn, error) {
	p.mu.Lock()
	p.waiters++
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.waiters--
		p.mu.Unlock()
	}()
	t := time.NewTimer(p.connWait)
	defer t.Stop()
	for {
		if pc := p.popIdle(now); pc != nil {
			p.passWake()
			return pc, nil
		}
		select {
		case <-p.idleReady:
		case p.tokens <- struct{}{}:
			return p.dialNew()
		case <-t.C:
			return nil, errPoolExhausted
		}
	}
}

// passWake hands the wake-up on when connections are left idle and others
// wait: idleReady holds one pending wake, so of two puts made while two
// waiters were between popIdle and their select, the second found it
// taken, and the waiter left over would sleep beside an idle connection
// until ConnWait ran out (its client: 503 "owner busy").
func (p *connPool) passWake() {
	p.mu.Lock()
	more := len(p.idle) > 0 && p.waiters > 1 // this one counts until it returns
	p.mu.Unlock()
	if more {
		select {
		case p.idleReady <- struct{}{}:
		default:
		}
	}
}

func (p *connPool) dialNew() (*pconn, error) {
	c, err := p.dial(p.addr)
	if err != nil {
		<-p.tokens
		return nil, err
	}
	// Raw read(2)/write(2) toward the worker: the goroutine keeps its P
	// through the calls (package rawio says why).
	c = rawio.Wrap(c)
	pc := &pconn{c: c, pool: p}
	pc.br = p.headerReader(pc)
	pc.w = (*pconnOut)(pc)
	return pc, nil
}

// Read implements io.Reader for pc's header buffer. The first read after
// writeRequest left the request's last bytes in out sends them in the
// same wait (rawio.SendRead), quiet check included: the read(2) that
// finds nothing right after a request went out (the answer is almost
// never there yet) is not made, and the peek, the write and the read are
// one RawConn call instead of three. A send that failed is recorded in
// sendErr: the read's error then says nothing about the worker's answer
// (fasthttp reports any error on a header's first byte as io.EOF).
func (pc *pconn) Read(p []byte) (n int, err error) {
	if pc.out == nil {
		n, err = pc.c.Read(p)
	} else {
		out, quiet := pc.out, pc.checkQuiet
		pc.out, pc.checkQuiet = nil, false
		var sent bool
		n, sent, err = rawio.SendRead(pc.c, out, p, quiet)
		pc.pool.putWriter(pc.outW)
		pc.outW = nil
		if !sent {
			pc.sendErr = err
		}
	}
	if n > 0 {
		pc.answered = true
	}
	return n, err
}

// pconnOut is where pc's pooled write buffers flush to: the connection,
// found quiet first when pc was idle (checkQuiet); while capture is set
// (writeRequest's final flush), the bytes are left in out for the read
// of the answer to send (pconn.Read).
type pconnOut pconn

func (o *pconnOut) Write(p []byte) (int, error) {
	pc := (*pconn)(o)
	if pc.capture {
		pc.capture = false
		pc.out = p
		return len(p), nil
	}
	if pc.checkQuiet {
		pc.checkQuiet = false
		if rawio.NotQuiet(pc.c) {
			pc.sendErr = rawio.ErrNotQuiet
			return 0, rawio.ErrNotQuiet
		}
	}
	return pc.c.Write(p)
}

// streamBufSize is the read buffer of a connection relaying a streamed
// body: chunk-size lines and event data pass through it, never a header.
const streamBufSize = 4 << 10

// headerReader returns a read buffer big enough for a worker's response
// header (bufSize), recycled from streams that gave theirs back.
func (p *connPool) headerReader(pc *pconn) *bufio.Reader {
	if br, ok := p.readers.Get().(*bufio.Reader); ok {
		br.Reset(pc)
		return br
	}
	return bufio.NewReaderSize(pc, p.bufSize)
}

// streamReader swaps pc's header-size read buffer for a small one while
// it relays a streamed body: an idle stream (SSE) then pins 4 KiB instead
// of bufSize (16 KiB by default, all of it resident once the allocator
// reuses memory). Bytes already buffered carry over. endStream undoes it.
func (p *connPool) streamReader(pc *pconn) {
	big := pc.br
	src := &carryReader{c: pc.c}
	if n := big.Buffered(); n > 0 {
		b, _ := big.Peek(n)
		src.pending = append(make([]byte, 0, n), b...)
	}
	big.Reset(nil)
	p.readers.Put(big)
	pc.br = bufio.NewReaderSize(src, streamBufSize)
	pc.src = src
}

// endStream gives a connection whose stream ended cleanly its header-size
// buffer back. It reports false when bytes beyond the body arrived (the
// connection must not be reused).
func (p *connPool) endStream(pc *pconn) bool {
	if pc.src == nil {
		return true
	}
	if pc.br.Buffered() > 0 || len(pc.src.pending) > 0 {
		return false
	}
	pc.src = nil
	pc.br = p.headerReader(pc)
	return true
}

// carryReader reads pending (bytes a header buffer had already read past
// the header) and then the connection.
//
// While client is set (a body being relayed to it, see watch), a read
// that waits clientCheckEvery without a byte checks the client is still
// there: a client that left is noticed only by the next write to it,
// and an idle stream (SSE) makes none until its next event, which may be
// hours away; meanwhile the worker connection is held. The check is
// below the bufio.Reader, so a timeout never splits a chunk-size line.
type carryReader struct {
	c       net.Conn
	pending []byte

	client  net.Conn
	stopped *atomic.Bool // the body's: a deadline shutdown set is not ours
	check   lazyDeadline // the read deadline last set for the check

	// try makes Read one read that never waits (fill); held is the
	// error fill met, for the next Read to report.
	try  bool
	held error
}

var errClientGone = errors.New("client went away during a streamed response")

// errOwnerEnded: the store ended the owner's session — deregistered,
// voided, superseded, or swept a lease after its lease ran out (a frozen
// or cut-off worker) — while pinboard waited for its answer, which is not
// coming from the id's owner any more (keepWaiting).
var errOwnerEnded = errors.New("the owner's session ended while it had the request")

func (r *carryReader) Read(p []byte) (int, error) {
	if len(r.pending) > 0 {
		n := copy(p, r.pending)
		r.pending = r.pending[n:]
		if len(r.pending) == 0 {
			// Resliced to nothing, it would still pin its array (up to
			// BufferSize) for as long as the stream idles.
			r.pending = nil
		}
		return n, nil
	}
	if r.held != nil {
		err := r.held
		r.held = nil
		return 0, err
	}
	if r.try {
		return rawio.TryRead(r.c, p)
	}
	if r.client == nil {
		return r.c.Read(p)
	}
	for {
		if r.armCheck() {
			return 0, errStreamEnded
		}
		n, err := r.c.Read(p)
		if n > 0 {
			return n, err
		}
		if again, gone := r.recheck(err); !again {
			if gone != nil {
				return 0, gone
			}
			return n, err
		}
	}
}

// fill waits until the worker sent something and reads it into br: one
// look and one read (rawio.AwaitEdge, then a read that never waits), no
// buffer of the relay's held while it waits. A wake for bytes read before
// the wait finds nothing and waits again. While a client is watched, a
// wait of clientCheckEvery without a byte checks it is still there
// (recheck): errClientGone when it left. Any other error is kept for br's
// next Read to report, in its place in the body's framing, and fill
// returns nil, as it does once bytes are in br, or when shutdown stopped
// the body (its Read reports the stop).
//
// A connection without raw access (a worker behind TLS) returns from the
// wait at once and waits in the read instead, up to the check's deadline:
// the check runs there the same way.
func (r *carryReader) fill(br *bufio.Reader) error {
	if len(r.pending) > 0 {
		return nil
	}
	for {
		if r.client != nil && r.armCheck() {
			return nil
		}
		err := rawio.AwaitEdge(r.c)
		if err == nil {
			r.try = true
			_, err = br.Peek(1)
			r.try = false
			if err == nil {
				return nil
			}
			if errors.Is(err, rawio.ErrWouldBlock) {
				continue
			}
		}
		if r.client != nil {
			again, gone := r.recheck(err)
			if again {
				continue
			}
			if gone != nil {
				return gone
			}
		}
		r.held = err
		return nil
	}
}

// armCheck sets the client check's read deadline when due and reports
// whether shutdown stopped the body: stop sets its flag, then its
// deadline (now), so read after ours went in, the flag is seen or stop's
// deadline wins.
func (r *carryReader) armCheck() bool {
	if at, ok := r.check.due(time.Now(), clientCheckEvery); ok {
		_ = r.c.SetReadDeadline(at)
	}
	return r.stopped.Load()
}

// recheck looks at what a wait for the worker ended with: again when it
// was the check's deadline and the client is still there, errClientGone
// when the client left; anything else is the caller's to report.
func (r *carryReader) recheck(err error) (again bool, gone error) {
	if !errors.Is(err, os.ErrDeadlineExceeded) || r.stopped.Load() {
		return false, nil
	}
	if rawio.PeerGone(r.client) {
		return false, errClientGone
	}
	return true, nil
}

// watch makes reads through pc's stream buffer check on client (see
// carryReader) until unwatch; stopped is the body's shutdown flag.
func (pc *pconn) watch(client net.Conn, stopped *atomic.Bool) {
	if pc.src != nil && client != nil {
		pc.src.client, pc.src.stopped, pc.src.check = client, stopped, lazyDeadline{}
	}
}

// unwatch ends watch. A check deadline may be left on the connection:
// the next request's arm or clear resets it.
func (pc *pconn) unwatch() {
	if pc.src != nil && pc.src.client != nil {
		pc.src.client, pc.src.stopped = nil, nil
		pc.deadline = deadlineUnknown
	}
}

// writer returns a pooled write buffer onto pc; give it back with
// putWriter once the request (and any streamed body) is out.
func (p *connPool) writer(pc *pconn) *bufio.Writer {
	if bw, ok := p.writers.Get().(*bufio.Writer); ok {
		bw.Reset(pc.w)
		return bw
	}
	return bufio.NewWriterSize(pc.w, p.bufSize)
}

func (p *connPool) putWriter(bw *bufio.Writer) {
	bw.Reset(nil)
	p.writers.Put(bw)
}

// put returns a healthy connection whose last response was fully read.
func (p *connPool) put(pc *pconn, now time.Time) {
	if pc.br.Buffered() > 0 {
		// Bytes past the end of the answer (a worker that sent more than
		// it framed): the next request on this connection would read
		// them as its response.
		p.discard(pc)
		return
	}
	pc.lastUsed = now
	pc.reused = true
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.discard(pc)
		return
	}
	p.idle = append(p.idle, pc)
	waiting := p.waiters > 0
	p.mu.Unlock()
	if waiting {
		select {
		case p.idleReady <- struct{}{}:
		default:
		}
	}
}

// discard closes a connection that must not be reused.
func (p *connPool) discard(pc *pconn) {
	_ = pc.c.Close()
	<-p.tokens
}

// open reports the number of open connections (idle and in use).
func (p *connPool) open() int { return len(p.tokens) }

// closeIdle closes idle connections older than the idle timeout, or all of
// them when all is set (the pool is going away).
func (p *connPool) closeIdle(now time.Time, all bool) {
	p.mu.Lock()
	if all {
		p.closed = true
		p.gone.Store(true)
	}
	keep := p.idle[:0]
	var drop []*pconn
	for _, pc := range p.idle {
		if all || now.Sub(pc.lastUsed) >= p.idleTimeout {
			drop = append(drop, pc)
		} else {
			keep = append(keep, pc)
		}
	}
	for i := len(keep); i < len(p.idle); i++ {
		p.idle[i] = nil
	}
	p.idle = keep
	p.mu.Unlock()
	for _, pc := range drop {
		p.discard(pc)
	}
}
