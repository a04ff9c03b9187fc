package proxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/pinboard-go/pinboard/internal/rawio"
)

// upload copies a streamed request body to the worker while the handler
// reads the worker's response: full duplex (R-DP-2). A worker that echoes
// as it reads (or answers before the body ends) would otherwise deadlock
// against a proxy that sends the whole body before reading anything once
// the socket buffers fill.
//
// fasthttp allows a response stream to keep reading the request stream
// while the server writes the response; the server drains and recycles the
// request stream only after our response body is closed, and the body's
// CloseWithError waits for the upload to end first.
//
// Deadlines: the wait for the worker's response header starts when the
// body is out, not when the request header is (a 1 GiB upload may take
// longer than any header timeout): the upload arms it on success. When
// the upload fails — the client went away or sent a short body — the
// worker connection is closed at once: the worker would wait for the rest
// for ever, and the handler's read of the answer ends with it; so does a
// worker that stopped reading (the stall timeout). A write that failed
// because the worker closed or reset the connection leaves it to the
// handler, whose read ends by itself and may first find the worker's early
// answer (workerClosed). When the
// handler must end an upload still waiting for the client (the worker
// answered early), stop interrupts the client read. While it runs, the
// client's reads and the writes to the worker may each stall for at most
// the pool's StallTimeout (renew).
type upload struct {
	done chan struct{}
	err  error
	// clientErr: err came from the client's side (a read or a short body),
	// not from stop interrupting the client's read.
	clientErr bool

	client net.Conn // the client's connection, for stop
	worker *pconn

	mu sync.Mutex
	// waiting: the wait for the answer started (armWait), by the upload
	// as it ended or by headerDone for an answer that came first; the
	// other arms nothing.
	waiting  bool
	stopping bool // stop interrupted the client's read: renew no deadline
	// bodyIn: the client's whole body was read (markBodyIn); only writes
	// to the worker may be left. stop leaves the client's connection
	// alone then.
	bodyIn bool
	// unsettled: a settled wait ran out; later ones do not wait again.
	unsettled bool

	// The wait for the answer: the pool's header timeout, the client
	// checked every check (startWait).
	headerTimeout, check time.Duration

	stall    time.Duration // see UpstreamOptions.StallTimeout; 0: none
	stallDue lazyDeadline  // the stall deadlines last set
}

// renew pushes the stall deadlines back — on the client's read and on the
// write to the worker — when due (lazyDeadline): they fire about the
// stall timeout after the last progress.
func (u *upload) renew() {
	if u.stall <= 0 {
		return
	}
	d, ok := u.stallDue.due(time.Now(), u.stall)
	if !ok {
		return
	}
	u.mu.Lock()
	if !u.stopping && u.client != nil {
		_ = u.client.SetReadDeadline(d)
	}
	u.mu.Unlock()
	_ = u.worker.c.SetWriteDeadline(d)
}

var errUploadShort = errors.New("client request body ended early")

// workerClosed reports whether a write to the worker failed because the
// worker closed its connection (a FIN, then our write: EPIPE; or its
// reset). Its answer may be on the connection, unread: a worker that
// answers early (401, 413) and closes with the body unread resets the
// connection, and its answer arrives just before the reset. Closed here,
// the handler's read of that answer failed, and the client got 502 in
// place of the worker's answer. The handler's read needs no close to end:
// on such a connection it returns the answer, then the end or the reset.
func workerClosed(err error) bool {
	return errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)
}

// errReader remembers the error of the reader it wraps, and renews the
// upload's stall deadlines before each read and after one that brought
// bytes: the write of those bytes to the worker gets the whole stall
// timeout from when they came. Renewed before the read only, a client
// read that took most of the timeout left the write what remained of it,
// and a worker slow to read was cut that much sooner.
type errReader struct {
	r   io.Reader
	u   *upload
	err error
}

func (e *errReader) Read(p []byte) (int, error) {
	e.u.renew()
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF {
		e.err = err
	}
	if n > 0 {
		e.u.renew()
	}
	return n, err
}

var uploadBufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// startUpload writes body to bw in its own goroutine: cl bytes as they
// are, or chunked when cl < 0. The caller already wrote the header. bw
// goes to release when the upload ends. check is clientCheckEvery, read
// by the caller.
func startUpload(body io.Reader, bw *bufio.Writer, cl int, release func(*bufio.Writer),
	client net.Conn, worker *pconn, headerTimeout, stall, check time.Duration) *upload {
	u := &upload{done: make(chan struct{}), client: client, worker: worker, stall: stall, headerTimeout: headerTimeout, check: check}
	go func() {
		defer close(u.done)
		defer release(bw)
		bp := uploadBufPool.Get().(*[]byte)
		defer uploadBufPool.Put(bp)
		er := &errReader{r: body, u: u}
		if cl >= 0 {
			u.err = copyFixed(bw, er, int64(cl), *bp, u.markBodyIn)
		} else {
			u.err = copyChunked(bw, er, *bp, u.markBodyIn)
		}
		if u.err == nil {
			u.markBodyIn() // an empty body read nothing
			u.err = bw.Flush()
		}
		// A client read that stop interrupted is no failure of the
		// client's: the handler stopped the upload for the worker's
		// failure (it closed the connection mid-upload), which must not
		// be answered as the client's (TestWorkerClosedMidUploadIs502_RDP4_RDP2).
		u.mu.Lock()
		stopped := u.stopping
		u.mu.Unlock()
		u.clientErr = (er.err != nil && !stopped) || errors.Is(u.err, errUploadShort)
		if u.err != nil {
			if u.clientErr || !workerClosed(u.err) {
				_ = worker.c.Close()
			}
			return
		}
		if stall > 0 {
			// The connection goes back to the pool: no stale write
			// deadline may fire on a later request's write.
			_ = worker.c.SetWriteDeadline(time.Time{})
		}
		// The wait for the answer starts now, and checks on the client
		// as awaitHeader's does (keepWaiting): a client that left once
		// its body was out held the worker connection for the whole
		// header timeout.
		u.armWait()
	}()
	return u
}

// headerDone tells the upload the handler has read the response header
// (or given up): from here the handler owns the connection's deadline,
// whose value is unknown to pc's bookkeeping. A header that came before
// the body was all out (an early answer) found no wait started: it starts
// now, so that the rest of an answer read whole (readSized) has the header
// timeout and the client checks, as any other has. Before, that read had
// no deadline: a worker that froze after its header held the request, and
// its client unanswered, for as long as it stayed frozen. A streamed
// answer clears the deadline again (relay).
func (u *upload) headerDone() {
	u.armWait()
	u.worker.deadline = deadlineUnknown
}

// armWait starts the wait for the answer on the worker connection — the
// header timeout, the client checked every check (keepWaiting) — unless
// it already started.
func (u *upload) armWait() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.waiting {
		return
	}
	u.waiting = true
	t := time.Now()
	_ = u.worker.c.SetReadDeadline(t.Add(u.worker.startWait(t, u.headerTimeout, u.check)))
}

// wait blocks until the upload ended and reports whether it succeeded.
func (u *upload) wait() bool {
	<-u.done
	return u.err == nil
}

// stop ends an upload that may still wait for the client, then waits for
// it: the client's read is interrupted (its connection cannot carry
// another request after a body cut short, and the server closes it).
//
// An upload that read the client's whole body is not waiting for the
// client: a worker that read it all and answered at once is often read
// before the upload's goroutine got past its last write. Interrupted
// then, the client's keep-alive connection kept a read deadline in the
// past (a server without a read or idle timeout, as in tests, closed it
// unanswered at the client's next request) and lingered at its close
// for bytes that were never due; and so it does when the interruption
// met the body's last read already under way, which is undone here.
func (u *upload) stop() {
	interrupted := false
	if !u.finished() && u.client != nil {
		u.mu.Lock()
		if !u.bodyIn {
			// The rest of the body may still come: closed, the
			// connection lingers so that the client gets the answer,
			// not a reset.
			rawio.MoreInput(u.client)
			u.stopping = true
			_ = u.client.SetReadDeadline(time.Now())
			interrupted = true
		}
		u.mu.Unlock()
	}
	<-u.done
	if interrupted && u.bodyIn {
		rawio.InputDone(u.client)
		_ = u.client.SetReadDeadline(time.Time{})
	}
}

// markBodyIn notes that the client's whole body was read, before its last
// bytes are written: a write larger than bw's free space goes to the
// worker at once, which may then answer before the write returns.
func (u *upload) markBodyIn() {
	u.mu.Lock()
	u.bodyIn = true
	u.mu.Unlock()
}

// settleWait bounds how long a handler that read the worker's answer
// waits for an upload whose body is all in to end (settled). Its last
// write goes to a worker that, having answered, most often read the body
// whole: the write ends within microseconds, but the answer may be read
// first. A worker that answered without reading it all may leave that
// write blocked until its socket buffer drains or the stall timeout: the
// wait is short, and what follows it works either way, only less well.
const settleWait = 50 * time.Millisecond

// settled reports whether the upload ended, giving one that read the
// client's whole body up to settleWait to finish its last write to the
// worker. Before, an answer read in that window (uvicorn answers as soon
// as it has the body) found the upload unfinished: the worker connection
// closed instead of going back to the pool, and an event stream
// answering the upload stayed on the server's path for its whole life.
// Only that window waits, so its timer costs nothing in steady state; a
// wait that ran out is not repeated (an event stream asks when relayed and
// again when its body closes).
func (u *upload) settled() bool {
	if u.finished() {
		return true
	}
	u.mu.Lock()
	wait := u.bodyIn && !u.unsettled
	u.mu.Unlock()
	if !wait {
		return false
	}
	t := time.NewTimer(settleWait)
	defer t.Stop()
	select {
	case <-u.done:
		return true
	case <-t.C:
		u.mu.Lock()
		u.unsettled = true
		u.mu.Unlock()
		return false
	}
}

// finished reports whether the upload already ended.
func (u *upload) finished() bool {
	select {
	case <-u.done:
		return true
	default:
		return false
	}
}

// copyFixed copies the n bytes of a sized body from r to bw; in runs once
// the last of them are read, before they are written.
func copyFixed(bw *bufio.Writer, r io.Reader, n int64, buf []byte, in func()) error {
	for n > 0 {
		chunk := buf
		if int64(len(chunk)) > n {
			chunk = chunk[:n]
		}
		m, err := r.Read(chunk)
		if m > 0 {
			if int64(m) == n {
				in()
			}
			if _, werr := bw.Write(chunk[:m]); werr != nil {
				return werr
			}
			n -= int64(m)
			// Flush what arrived: a worker reading incrementally sees the
			// body as the client sends it.
			if bw.Buffered() >= len(buf) || m < len(chunk) {
				if werr := bw.Flush(); werr != nil {
					return werr
				}
			}
		}
		if err == io.EOF {
			if n > 0 {
				return errUploadShort
			}
			return nil
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// copyChunked copies an unsized body from r to bw in chunked framing; in
// runs once r reported its end, before the last bytes are written.
func copyChunked(bw *bufio.Writer, r io.Reader, buf []byte, in func()) error {
	var size [20]byte
	for {
		m, err := r.Read(buf)
		if err == io.EOF {
			in()
		}
		if m > 0 {
			bw.Write(strconv.AppendInt(size[:0], int64(m), 16))
			bw.WriteString("\r\n")
			bw.Write(buf[:m])
			if _, werr := bw.WriteString("\r\n"); werr != nil {
				return werr
			}
			if werr := bw.Flush(); werr != nil {
				return werr
			}
		}
		if err == io.EOF {
			_, werr := bw.WriteString("0\r\n\r\n")
			return werr
		}
		if err != nil {
			return err
		}
	}
}
