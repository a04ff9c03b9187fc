package bench

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/internal/rawio"
)

// SSEStream is one open Server-Sent Events response whose events carry
// the sender's clock ("data: <unix ns> <seq>", bench/fleet's format).
// Not safe for concurrent use.
type SSEStream struct {
	c    net.Conn
	resp fasthttp.Response
	br   *bufio.Reader
	data []byte // the current event's data, reused
}

var errNotEventStream = errors.New("response is not text/event-stream")

// OpenSSE sends GET path and reads the response header.
func OpenSSE(addr, path string, headers []string, timeout time.Duration) (*SSEStream, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, &RequestError{"dial", err}
	}
	c = rawio.Wrap(c)
	_ = c.SetDeadline(time.Now().Add(timeout))
	req := AppendGET(nil, addr, []byte(path), append([]string{"Accept: text/event-stream"}, headers...)...)
	if _, err := c.Write(req); err != nil {
		c.Close()
		return nil, &RequestError{"write", err}
	}
	s := &SSEStream{c: c}
	s.resp.StreamBody = true
	if err := s.resp.Read(bufio.NewReaderSize(c, 4096)); err != nil {
		c.Close()
		return nil, &RequestError{"read", err}
	}
	if st := s.resp.StatusCode(); st != fasthttp.StatusOK {
		c.Close()
		return nil, &RequestError{"http_" + strconv.Itoa(st), errStatus}
	}
	if !bytes.HasPrefix(s.resp.Header.ContentType(), []byte("text/event-stream")) {
		c.Close()
		return nil, &RequestError{"check", errNotEventStream}
	}
	_ = c.SetDeadline(time.Time{})
	s.br = bufio.NewReaderSize(s.resp.BodyStream(), 512)
	return s, nil
}

// SetDeadline bounds the next reads.
func (s *SSEStream) SetDeadline(t time.Time) { _ = s.c.SetDeadline(t) }

// Next reads the next event and returns its stamp and sequence number.
// io.EOF means the stream ended cleanly. It allocates nothing: thousands
// of streams read at once, and garbage-collector pauses would show up in
// the delays measured.
func (s *SSEStream) Next() (stamp int64, seq int, err error) {
	s.data = s.data[:0]
	have := false
	for {
		line, err := s.br.ReadSlice('\n')
		if err != nil {
			if err == io.EOF && len(line) == 0 && !have {
				return 0, 0, io.EOF
			}
			return 0, 0, &RequestError{"read", err}
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			if have {
				break
			}
			continue
		}
		if rest, ok := bytes.CutPrefix(line, []byte("data: ")); ok {
			s.data, have = append(s.data[:0], rest...), true
		}
	}
	a, b, ok := bytes.Cut(s.data, []byte(" "))
	st, ok1 := parseUint(a)
	sq, ok2 := parseUint(b)
	if !ok || !ok1 || !ok2 {
		return 0, 0, &RequestError{"check", errBadEvent}
	}
	return int64(st), int(sq), nil
}

var errBadEvent = errors.New("malformed event: want \"data: <unix ns> <seq>\"")

// parseUint parses decimal digits without allocating.
func parseUint(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 19 {
		return 0, false
	}
	var n uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
	}
	return n, true
}

// Close ends the stream.
func (s *SSEStream) Close() error {
	err := s.c.Close()
	_ = s.resp.CloseBodyStream()
	return err
}
