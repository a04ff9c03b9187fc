package bench

import (
	"bufio"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/internal/rawio"
)

// A minimal RFC 6455 codec: enough for an echo server and a load client
// (unfragmented frames, no extensions). Written here rather than taken
// from a WebSocket library to keep the harness's dependencies to fasthttp.

// WebSocket opcodes (RFC 6455 §5.2).
const (
	WSText   = 0x1
	WSBinary = 0x2
	WSClose  = 0x8
	WSPing   = 0x9
	WSPong   = 0xA
)

const wsGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

// maxWSPayload bounds a frame this codec accepts.
const maxWSPayload = 16 << 20

var errWSFrameTooLarge = errors.New("websocket frame too large")

// WSAccept is Sec-WebSocket-Accept for a Sec-WebSocket-Key (§4.2.2).
func WSAccept(key []byte) string {
	h := sha1.New()
	h.Write(key)
	h.Write([]byte(wsGUID))
	return base64.StdEncoding.EncodeToString(h.Sum(nil))
}

// AppendWSFrame appends one final frame. Clients mask (§5.3): pass
// masked=true and a mask key; servers send unmasked frames.
func AppendWSFrame(dst []byte, op byte, payload []byte, masked bool, mask [4]byte) []byte {
	dst = append(dst, 0x80|op)
	var mbit byte
	if masked {
		mbit = 0x80
	}
	switch n := len(payload); {
	case n < 126:
		dst = append(dst, mbit|byte(n))
	case n <= 0xffff:
		dst = append(dst, mbit|126, byte(n>>8), byte(n))
	default:
		dst = append(dst, mbit|127)
		dst = binary.BigEndian.AppendUint64(dst, uint64(n))
	}
	if !masked {
		return append(dst, payload...)
	}
	dst = append(dst, mask[:]...)
	start := len(dst)
	dst = append(dst, payload...)
	for i := range payload {
		dst[start+i] ^= mask[i&3]
	}
	return dst
}

// ReadWSFrame reads one frame into buf (grown as needed) and unmasks it.
// fin reports the FIN bit; the payload aliases the returned buffer.
func ReadWSFrame(br *bufio.Reader, buf []byte) (op byte, fin bool, payload []byte, err error) {
	var h [2]byte
	if _, err = io.ReadFull(br, h[:]); err != nil {
		return 0, false, buf, err
	}
	fin, op = h[0]&0x80 != 0, h[0]&0x0f
	masked := h[1]&0x80 != 0
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var ext [2]byte
		if _, err = io.ReadFull(br, ext[:]); err != nil {
			return 0, false, buf, err
		}
		n = uint64(binary.BigEndian.Uint16(ext[:]))
	case 127:
		var ext [8]byte
		if _, err = io.ReadFull(br, ext[:]); err != nil {
			return 0, false, buf, err
		}
		n = binary.BigEndian.Uint64(ext[:])
	}
	if n > maxWSPayload {
		return 0, false, buf, errWSFrameTooLarge
	}
	var mask [4]byte
	if masked {
		if _, err = io.ReadFull(br, mask[:]); err != nil {
			return 0, false, buf, err
		}
	}
	if uint64(cap(buf)) < n {
		buf = make([]byte, n)
	}
	payload = buf[:n]
	if _, err = io.ReadFull(br, payload); err != nil {
		return 0, false, buf, err
	}
	if masked {
		for i := range payload {
			payload[i] ^= mask[i&3]
		}
	}
	return op, fin, payload, nil
}

// WSTarget is a WebSocket echo load: each Doer opens one connection (the
// handshake is not timed) and every Do sends one masked binary message of
// Size bytes and waits for its echo.
type WSTarget struct {
	Addr string
	// Path returns the request target and extra header lines for the
	// connection of worker w.
	Path    func(w int) (path string, headers []string)
	Size    int
	Timeout time.Duration
}

// NewDoer implements the Loop's doer factory.
func (t *WSTarget) NewDoer(w int) (Doer, error) {
	timeout := t.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	path, headers := t.Path(w)
	c, br, err := WSDial(t.Addr, path, headers, timeout)
	if err != nil {
		return nil, err
	}
	d := &wsDoer{c: c, br: br, timeout: timeout, msg: make([]byte, t.Size)}
	for i := range d.msg {
		d.msg[i] = byte(i)
	}
	return d, nil
}

// WSDial opens a WebSocket connection: the handshake must answer 101.
func WSDial(addr, path string, headers []string, timeout time.Duration) (net.Conn, *bufio.Reader, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, nil, &RequestError{"dial", err}
	}
	c = rawio.Wrap(c)
	_ = c.SetDeadline(time.Now().Add(timeout))
	req := fmt.Sprintf("GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n", path, addr)
	for _, h := range headers {
		req += h + "\r\n"
	}
	if _, err := io.WriteString(c, req+"\r\n"); err != nil {
		c.Close()
		return nil, nil, &RequestError{"write", err}
	}
	br := bufio.NewReaderSize(c, 16<<10)
	var rh fasthttp.ResponseHeader
	if err := rh.Read(br); err != nil {
		c.Close()
		return nil, nil, &RequestError{"read", err}
	}
	if rh.StatusCode() != fasthttp.StatusSwitchingProtocols {
		c.Close()
		return nil, nil, &RequestError{fmt.Sprintf("http_%d", rh.StatusCode()), errStatus}
	}
	if string(rh.Peek("Sec-WebSocket-Accept")) != WSAccept([]byte("dGhlIHNhbXBsZSBub25jZQ==")) {
		c.Close()
		return nil, nil, &RequestError{"check", errors.New("wrong Sec-WebSocket-Accept")}
	}
	_ = c.SetDeadline(time.Time{})
	return c, br, nil
}

type wsDoer struct {
	c       net.Conn
	br      *bufio.Reader
	timeout time.Duration
	msg     []byte
	out     []byte
	in      []byte
}

var errWSEcho = errors.New("websocket echo differs from the message")

func (d *wsDoer) Do(seq uint64) error {
	if d.c == nil {
		return &RequestError{"closed", net.ErrClosed}
	}
	binary.LittleEndian.PutUint64(d.msg, seq)
	mask := [4]byte{byte(seq), byte(seq >> 8), 0x5a, 0xa5}
	d.out = AppendWSFrame(d.out[:0], WSBinary, d.msg, true, mask)
	_ = d.c.SetDeadline(time.Now().Add(d.timeout))
	if _, err := d.c.Write(d.out); err != nil {
		d.Close()
		return &RequestError{"write", err}
	}
	op, _, p, err := ReadWSFrame(d.br, d.in)
	d.in = p[:0]
	if err != nil {
		d.Close()
		return &RequestError{"read", err}
	}
	if op != WSBinary || len(p) != len(d.msg) || binary.LittleEndian.Uint64(p) != seq {
		return &RequestError{"check", errWSEcho}
	}
	return nil
}

func (d *wsDoer) Close() error {
	if d.c == nil {
		return nil
	}
	// A polite close frame; the echo server answers and hangs up.
	_, _ = d.c.Write(AppendWSFrame(nil, WSClose, []byte{0x03, 0xe8}, true, [4]byte{1, 2, 3, 4}))
	err := d.c.Close()
	d.c = nil
	return err
}
