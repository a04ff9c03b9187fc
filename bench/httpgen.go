package bench

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/internal/rawio"
)

// HTTPTarget is where a load run sends HTTP/1.1 requests and what they
// look like. Each Doer owns one keep-alive connection, writes the raw
// request bytes Request appends and parses the response with fasthttp's
// response reader: no client pool, no per-request allocation, so the
// generator costs as little CPU as it can (it shares the machine with the
// system under test).
type HTTPTarget struct {
	// Addr is host:port.
	Addr string
	// Request appends the whole raw request for seq (header and any body)
	// to dst. It runs on the Doer's goroutine.
	Request func(dst []byte, seq uint64) []byte
	// Timeout bounds one request; default 10s.
	Timeout time.Duration
	// MaxBody caps a buffered response body; default 1 MiB.
	MaxBody int
	// Check, when set, inspects each response; a non-nil error counts as
	// a failed request.
	Check func(resp *fasthttp.Response) error
}

// RequestError is a failed request, by kind: "dial", "write", "read",
// "timeout", "http_<status>", "check".
type RequestError struct {
	kind string
	err  error
}

func (e *RequestError) Error() string { return e.kind + ": " + e.err.Error() }
func (e *RequestError) Unwrap() error { return e.err }

// Kind implements Kinded.
func (e *RequestError) Kind() string { return e.kind }

var errStatus = errors.New("unexpected status")

// NewDoer returns a Doer on a connection of its own (dialled lazily, and
// again after an error or a Connection: close).
func (t *HTTPTarget) NewDoer(int) (Doer, error) {
	timeout := t.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	maxBody := t.MaxBody
	if maxBody <= 0 {
		maxBody = 1 << 20
	}
	return &httpDoer{t: t, timeout: timeout, maxBody: maxBody}, nil
}

type httpDoer struct {
	t       *HTTPTarget
	timeout time.Duration
	maxBody int
	c       net.Conn
	br      *bufio.Reader
	bw      *bufio.Writer
	req     []byte
	resp    fasthttp.Response
	kinds   [600]string // "http_<status>", built once per status
}

func (d *httpDoer) Do(seq uint64) error {
	if d.c == nil {
		c, err := net.DialTimeout("tcp", d.t.Addr, d.timeout)
		if err != nil {
			return &RequestError{"dial", err}
		}
		c = rawio.Wrap(c) // the generator's CPU is CPU the proxy does not get
		d.c = c
		if d.br == nil {
			d.br = bufio.NewReaderSize(c, 16<<10)
			d.bw = bufio.NewWriterSize(c, 16<<10)
		} else {
			d.br.Reset(c)
			d.bw.Reset(c)
		}
	}
	d.req = d.t.Request(d.req[:0], seq)
	_ = d.c.SetDeadline(time.Now().Add(d.timeout))
	if _, err := d.bw.Write(d.req); err != nil {
		return d.fail("write", err)
	}
	if err := d.bw.Flush(); err != nil {
		return d.fail("write", err)
	}
	d.resp.Reset()
	if err := d.resp.ReadLimitBody(d.br, d.maxBody); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return d.fail("timeout", err)
		}
		return d.fail("read", err)
	}
	if d.resp.ConnectionClose() {
		d.drop()
	}
	if s := d.resp.StatusCode(); s < 200 || s > 299 {
		return &RequestError{d.statusKind(s), errStatus}
	}
	if d.t.Check != nil {
		if err := d.t.Check(&d.resp); err != nil {
			return &RequestError{"check", err}
		}
	}
	return nil
}

func (d *httpDoer) statusKind(s int) string {
	if s < 0 || s >= len(d.kinds) {
		return "http_other"
	}
	if d.kinds[s] == "" {
		d.kinds[s] = "http_" + strconv.Itoa(s)
	}
	return d.kinds[s]
}

func (d *httpDoer) fail(kind string, err error) error {
	d.drop()
	return &RequestError{kind, err}
}

func (d *httpDoer) drop() {
	if d.c != nil {
		_ = d.c.Close()
		d.c = nil
	}
}

func (d *httpDoer) Close() error {
	d.drop()
	return nil
}

// AppendGET appends a bodiless GET request for path with extra header
// lines (each "Name: value", without CRLF).
func AppendGET(dst []byte, host string, path []byte, headers ...string) []byte {
	dst = append(dst, "GET "...)
	dst = append(dst, path...)
	dst = append(dst, " HTTP/1.1\r\nHost: "...)
	dst = append(dst, host...)
	dst = append(dst, "\r\n"...)
	for _, h := range headers {
		dst = append(dst, h...)
		dst = append(dst, "\r\n"...)
	}
	return append(dst, "\r\n"...)
}

// Transfer moves one large body through a fresh connection: an upload of
// size bytes (POST with Content-Length) when up, else a download of
// whatever the response carries. It returns the bytes moved in the body.
//
// A transfer cut short is an error, not a figure: a download must bring
// size bytes (when size is above 0), and an upload's answer must be the
// fleet's {"bytes":N} with N the size sent — a proxy that ended a body
// early with a clean end of message would otherwise pass as fast.
func Transfer(addr, path string, headers []string, up bool, size int64, timeout time.Duration) (int64, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return 0, fmt.Errorf("cannot dial %s: %w", addr, err)
	}
	c = rawio.Wrap(c)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	bw := bufio.NewWriterSize(c, 64<<10)
	method := "GET "
	if up {
		method = "POST "
	}
	fmt.Fprintf(bw, "%s%s HTTP/1.1\r\nHost: %s\r\n", method, path, addr)
	for _, h := range headers {
		fmt.Fprintf(bw, "%s\r\n", h)
	}
	if up {
		fmt.Fprintf(bw, "Content-Type: application/octet-stream\r\nContent-Length: %d\r\n", size)
	}
	bw.WriteString("Connection: close\r\n\r\n")
	upErr := make(chan error, 1)
	if up {
		// The body goes up from its own goroutine: a proxy may answer (or
		// stream an echo) before it has read everything.
		go func() {
			buf := make([]byte, 64<<10)
			for i := range buf {
				buf[i] = byte(i)
			}
			var n int64
			for n < size {
				chunk := buf
				if rest := size - n; rest < int64(len(chunk)) {
					chunk = chunk[:rest]
				}
				m, err := bw.Write(chunk)
				n += int64(m)
				if err != nil {
					upErr <- err
					return
				}
			}
			upErr <- bw.Flush()
		}()
	} else {
		if err := bw.Flush(); err != nil {
			return 0, fmt.Errorf("cannot send the request: %w", err)
		}
	}
	br := bufio.NewReaderSize(c, 64<<10)
	var resp fasthttp.Response
	// A download's body streams; an upload's answer is small and read
	// whole (its count of the bytes received).
	resp.StreamBody = !up
	limit := 0
	if up {
		limit = 4 << 10
	}
	if err := resp.ReadLimitBody(br, limit); err != nil {
		return 0, fmt.Errorf("cannot read the response: %w", err)
	}
	if s := resp.StatusCode(); s != fasthttp.StatusOK {
		return 0, fmt.Errorf("unexpected status %d", s)
	}
	if up {
		answer := resp.Body()
		if err := <-upErr; err != nil {
			return 0, fmt.Errorf("cannot send the body: %w", err)
		}
		var got struct {
			Bytes *int64 `json:"bytes"`
		}
		if err := json.Unmarshal(answer, &got); err != nil || got.Bytes == nil {
			return 0, fmt.Errorf("unexpected answer to an upload; got %q; want {\"bytes\":%d}", answer, size)
		}
		if *got.Bytes != size {
			return *got.Bytes, fmt.Errorf("upload cut short: the worker received %d bytes; want %d", *got.Bytes, size)
		}
		return size, nil
	}
	moved, err := io.CopyBuffer(discard{}, resp.BodyStream(), make([]byte, 64<<10))
	_ = resp.CloseBodyStream()
	if err != nil {
		return moved, fmt.Errorf("cannot read the response body: %w", err)
	}
	if size > 0 && moved != size {
		return moved, fmt.Errorf("download cut short: received %d bytes; want %d", moved, size)
	}
	return moved, nil
}

// discard is io.Discard without ReaderFrom, so copies use the caller's
// large buffer (fewer reads for a 1 GiB body).
type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
