package e2e

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// A minimal RFC 6455 client: enough to prove WebSocket upgrades pass through
// pinboard (R-DP-2). Client frames are masked (§5.3); server frames must not
// be (§5.1). Not safe for concurrent use.

const (
	wsOpContinuation = 0x0
	wsOpText         = 0x1
	wsOpBinary       = 0x2
	wsOpClose        = 0x8
	wsOpPing         = 0x9
	wsOpPong         = 0xA

	wsGUID       = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11" // §1.3
	wsMaxMessage = 16 << 20
)

type wsConn struct {
	conn net.Conn
	br   *bufio.Reader
}

// wsHandshakeError is a non-101 answer to the opening handshake.
type wsHandshakeError struct {
	Status int
	Header http.Header
	Body   string
}

func (e *wsHandshakeError) Error() string {
	return fmt.Sprintf("websocket handshake refused: %d %s", e.Status, strings.TrimSpace(e.Body))
}

// wsDial performs the opening handshake (§4.1) on ws://host/path. ctx bounds
// the handshake; its deadline (if any) also bounds every later read and write.
func wsDial(ctx context.Context, rawURL string, header http.Header) (*wsConn, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "ws" {
		return nil, fmt.Errorf("cannot use websocket URL %q: want ws://host/path", rawURL)
	}
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return nil, fmt.Errorf("cannot dial %s: %w", u.Host, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	nonce := make([]byte, 16)
	rand.Read(nonce)
	key := base64.StdEncoding.EncodeToString(nonce)

	var b strings.Builder
	fmt.Fprintf(&b, "GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n", u.RequestURI(), u.Host)
	fmt.Fprintf(&b, "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n", key)
	for k, vs := range header {
		for _, v := range vs {
			fmt.Fprintf(&b, "%s: %s\r\n", k, v)
		}
	}
	b.WriteString("\r\n")
	if _, err := io.WriteString(conn, b.String()); err != nil {
		conn.Close()
		return nil, fmt.Errorf("cannot send websocket handshake: %w", err)
	}
	br := bufio.NewReader(conn)
	res, err := http.ReadResponse(br, &http.Request{Method: http.MethodGet})
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("cannot read websocket handshake response: %w", err)
	}
	if res.StatusCode != http.StatusSwitchingProtocols {
		body, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
		conn.Close()
		return nil, &wsHandshakeError{Status: res.StatusCode, Header: res.Header, Body: string(body)}
	}
	sum := sha1.Sum([]byte(key + wsGUID))
	if want := base64.StdEncoding.EncodeToString(sum[:]); res.Header.Get("Sec-WebSocket-Accept") != want {
		conn.Close()
		return nil, fmt.Errorf("unexpected Sec-WebSocket-Accept; got %q; want %q", res.Header.Get("Sec-WebSocket-Accept"), want)
	}
	if !strings.EqualFold(res.Header.Get("Upgrade"), "websocket") {
		conn.Close()
		return nil, fmt.Errorf("unexpected Upgrade header; got %q; want websocket", res.Header.Get("Upgrade"))
	}
	return &wsConn{conn: conn, br: br}, nil
}

// WriteMessage sends one unfragmented, masked frame.
func (c *wsConn) WriteMessage(op byte, payload []byte) error {
	hdr := make([]byte, 0, 14)
	hdr = append(hdr, 0x80|op)
	switch n := len(payload); {
	case n < 126:
		hdr = append(hdr, 0x80|byte(n))
	case n <= 0xFFFF:
		hdr = append(hdr, 0x80|126)
		hdr = binary.BigEndian.AppendUint16(hdr, uint16(n))
	default:
		hdr = append(hdr, 0x80|127)
		hdr = binary.BigEndian.AppendUint64(hdr, uint64(n))
	}
	var mask [4]byte
	rand.Read(mask[:])
	hdr = append(hdr, mask[:]...)
	frame := make([]byte, len(hdr)+len(payload))
	copy(frame, hdr)
	for i, p := range payload {
		frame[len(hdr)+i] = p ^ mask[i%4]
	}
	_, err := c.conn.Write(frame)
	return err
}

// readFrame reads one frame: fin, opcode, unmasked payload.
func (c *wsConn) readFrame() (bool, byte, []byte, error) {
	var h [2]byte
	if _, err := io.ReadFull(c.br, h[:]); err != nil {
		return false, 0, nil, err
	}
	fin, op := h[0]&0x80 != 0, h[0]&0x0F
	if h[1]&0x80 != 0 {
		return false, 0, nil, errors.New("server frame is masked (RFC 6455 §5.1)")
	}
	n := uint64(h[1] & 0x7F)
	switch n {
	case 126:
		var ext [2]byte
		if _, err := io.ReadFull(c.br, ext[:]); err != nil {
			return false, 0, nil, err
		}
		n = uint64(binary.BigEndian.Uint16(ext[:]))
	case 127:
		var ext [8]byte
		if _, err := io.ReadFull(c.br, ext[:]); err != nil {
			return false, 0, nil, err
		}
		n = binary.BigEndian.Uint64(ext[:])
	}
	if n > wsMaxMessage {
		return false, 0, nil, fmt.Errorf("frame of %d bytes exceeds %d", n, wsMaxMessage)
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(c.br, payload); err != nil {
		return false, 0, nil, err
	}
	return fin, op, payload, nil
}

// ReadMessage returns the next text, binary or close message, reassembling
// fragments and answering pings.
func (c *wsConn) ReadMessage() (byte, []byte, error) {
	var msgOp byte
	var msg []byte
	for {
		fin, op, payload, err := c.readFrame()
		if err != nil {
			return 0, nil, err
		}
		switch op {
		case wsOpPing:
			if err := c.WriteMessage(wsOpPong, payload); err != nil {
				return 0, nil, err
			}
			continue
		case wsOpPong:
			continue
		case wsOpClose:
			return op, payload, nil
		case wsOpContinuation:
			if msg == nil {
				return 0, nil, errors.New("continuation frame without a message")
			}
		default:
			msgOp, msg = op, []byte{}
		}
		msg = append(msg, payload...)
		if fin {
			return msgOp, msg, nil
		}
	}
}

// Close sends a close frame with code and waits (up to d) for the peer's
// close frame (§5.5.1), then closes the TCP connection. It returns the
// peer's close code, or 0 if none arrived.
func (c *wsConn) Close(code uint16, d time.Duration) uint16 {
	defer c.conn.Close()
	c.conn.SetDeadline(time.Now().Add(d))
	if err := c.WriteMessage(wsOpClose, binary.BigEndian.AppendUint16(nil, code)); err != nil {
		return 0
	}
	for {
		op, payload, err := c.ReadMessage()
		if err != nil {
			return 0
		}
		if op == wsOpClose {
			if len(payload) >= 2 {
				return binary.BigEndian.Uint16(payload)
			}
			return 1005 // §7.4.1: no status code present
		}
	}
}
