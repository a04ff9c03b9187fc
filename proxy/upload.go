package proxy

import (
	"bufio"
	"errors"
	"io"
	"strconv"
	"sync"
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
type upload struct {
	done chan struct{}
	err  error
}

var errUploadShort = errors.New("client request body ended early")

var uploadBufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// startUpload writes body to bw in its own goroutine: cl bytes as they
// are, or chunked when cl < 0. The caller already wrote the header. bw
// goes to release when the upload ends.
func startUpload(body io.Reader, bw *bufio.Writer, cl int, release func(*bufio.Writer)) *upload {
	u := &upload{done: make(chan struct{})}
	go func() {
		defer close(u.done)
		defer release(bw)
		bp := uploadBufPool.Get().(*[]byte)
		defer uploadBufPool.Put(bp)
		if cl >= 0 {
			u.err = copyFixed(bw, body, int64(cl), *bp)
		} else {
			u.err = copyChunked(bw, body, *bp)
		}
		if u.err == nil {
			u.err = bw.Flush()
		}
	}()
	return u
}

// wait blocks until the upload ended and reports whether it succeeded.
func (u *upload) wait() bool {
	<-u.done
	return u.err == nil
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

func copyFixed(bw *bufio.Writer, r io.Reader, n int64, buf []byte) error {
	for n > 0 {
		chunk := buf
		if int64(len(chunk)) > n {
			chunk = chunk[:n]
		}
		m, err := r.Read(chunk)
		if m > 0 {
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

func copyChunked(bw *bufio.Writer, r io.Reader, buf []byte) error {
	var size [20]byte
	for {
		m, err := r.Read(buf)
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
